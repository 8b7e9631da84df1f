"""Where strata's parallel regions run (strata.thread_pool / set_thread_pool): torch's own threads by
default, strata's own pool on request; results do not depend on it; bad names are clear errors; the
environment variable STRATA_THREAD_POOL sets the default (checked in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import strata
from conftest import rand_qkv


@pytest.fixture
def restore_pool():
    saved = strata.thread_pool()
    yield
    strata.set_thread_pool(saved)


def test_default_is_torchs_threads():
    if "STRATA_THREAD_POOL" in os.environ:
        pytest.skip("STRATA_THREAD_POOL is set")
    assert strata.thread_pool() == "torch"
    assert strata.info()["thread_pool"] == "torch"


def test_switch_and_results_do_not_depend_on_it(restore_pool):
    q, k, v = rand_qkv(2, 97, 97, 4, 2, 24, 24, torch.float32, seed=3)
    outs = []
    for pool in ("own", "torch", "own"):
        strata.set_thread_pool(pool)
        assert strata.thread_pool() == pool
        assert strata.info()["thread_pool"] == pool
        outs.append(strata.attention(q, k, v, causal=True))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])


def test_bad_names(restore_pool):
    before = strata.thread_pool()
    with pytest.raises(ValueError, match=r"strata.set_thread_pool: argument 'name': expected \"torch\" or \"own\""):
        strata.set_thread_pool("openmp")
    with pytest.raises(TypeError, match="argument 'name'"):
        strata.set_thread_pool(1)
    with pytest.raises(RuntimeError, match="'name'"):  # the op itself checks too
        torch.ops.strata.thread_pool("openmp")
    assert strata.thread_pool() == before


def _in_fresh_interpreter(code: str, pool: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, STRATA_THREAD_POOL=pool)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_environment_variable_sets_the_default():
    proc = _in_fresh_interpreter("import strata; print(strata.thread_pool())", "torch")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "torch"


def test_bad_environment_variable_fails_the_kernel_calls_clearly():
    code = (
        "import torch, strata\n"
        "q = torch.randn(1, 64, 2, 16)\n"
        "try:\n"
        "    strata.attention(q, q, q)\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
        "strata.set_thread_pool('torch')\n"
        "print('OK', strata.attention(q, q, q).shape)\n"
    )
    proc = _in_fresh_interpreter(code, "openmp")
    assert proc.returncode == 0, proc.stderr
    assert "ERR" in proc.stdout and "STRATA_THREAD_POOL" in proc.stdout and "openmp" in proc.stdout, proc.stdout
    assert "OK torch.Size([1, 64, 2, 16])" in proc.stdout, proc.stdout


def test_forked_child_gets_one_openmp_thread_and_strata_own_pool():
    # The parent runs a strata region on torch's threads; libgomp's team does not survive fork, so
    # without the library's fork handler the child's first parallel torch op (a large exp) hangs.
    code = (
        "import os, signal, sys, torch, strata\n"
        "torch.set_num_threads(2)\n"
        "q = torch.randn(1, 256, 4, 32)\n"
        "want = strata.attention(q, q, q, causal=True)\n"
        "x = torch.randn(4_000_000)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.alarm(60)\n"
        "    ok = torch.equal(x.exp(), torch.exp(x)) and torch.equal(strata.attention(q, q, q, causal=True), want)\n"
        "    print('child', torch.get_num_threads(), strata.thread_pool(), ok, flush=True)\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('status', status, flush=True)\n"
        "print('parent', torch.get_num_threads(), strata.thread_pool(), torch.equal(strata.attention(q, q, q, causal=True), want))\n"
    )
    proc = _in_fresh_interpreter(code, "torch")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert "child 1 own True" in lines, proc.stdout
    assert "status 0" in lines, proc.stdout
    assert "parent 2 torch True" in lines, proc.stdout
