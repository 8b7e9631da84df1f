"""Fork after strata has run an op: torch DataLoader(num_workers > 0) and
multiprocessing's default 'fork' start on Linux. The child inherits strata's thread pool object but
not its worker threads; before the fix its first op (and its exit, which joins the workers) hung.

Each case runs in a fresh interpreter with STRATA_NUM_THREADS=4, so the pool has worker threads on
any machine, and under a timeout, so a regression fails instead of hanging the suite. The child's
result must equal the parent's bit for bit (same inputs, same thread count, and the kernels'
results do not depend on the thread count), and the parent must still compute it after the fork.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Shared by both scripts: one attention call large enough to be split over the pool
# (4 heads x 4 query tiles of 64 = 16 units of work).
_PRELUDE = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    import strata

    def op(seed):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 256, 4, 32, generator=g) for _ in range(3))
        return strata.attention(q, k, v, causal=True)

    want = op(0)  # the parent runs an op first: its pool and workers exist at the fork
    """
)

_OS_FORK = _PRELUDE + textwrap.dedent(
    """
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hang in the op or at exit kills the child with SIGALRM
        ok = torch.equal(op(0), want) and torch.equal(op(0), want)
        sys.exit(0 if ok else 3)  # a normal interpreter exit: the C++ static destructors run
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sys.exit(f"child killed by signal {os.WTERMSIG(status)} (14 = SIGALRM: hung)")
    if os.WEXITSTATUS(status) != 0:
        sys.exit(f"child exited with {os.WEXITSTATUS(status)} (3: wrong result)")
    assert torch.equal(op(0), want), "the parent's result changed after the fork"
    print("ok")
    """
)

_MP_FORK = _PRELUDE + textwrap.dedent(
    """
    import multiprocessing as mp

    def work(seed):
        return op(seed)

    if __name__ == "__main__":
        with mp.get_context("fork").Pool(2) as workers:
            got = workers.map_async(work, [0, 1, 0]).get(timeout=60)
        assert torch.equal(got[0], want) and torch.equal(got[2], want), "a worker's result differs"
        assert torch.equal(got[1], op(1)), "a worker's result differs"
        print("ok")
    """
)


def _run(script: str) -> None:
    env = dict(os.environ, STRATA_NUM_THREADS="4")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=150
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the script hung (a forked child or its parent never finished)")
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_forked_child_runs_ops_and_exits():
    _run(_OS_FORK)


def test_multiprocessing_fork_workers_run_ops():
    _run(_MP_FORK)
