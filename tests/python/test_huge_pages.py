"""The kernels' large outputs are advised into transparent huge pages (binding_util.h's
with_huge_pages): on Linux with THP in "madvise" mode, the 2 MB-aligned interior of an output of
4 MB or more lies in a mapping the kernel marks THPeligible; STRATA_HUGE_PAGES=0 leaves it out (in a
fresh interpreter: the setting is read once). Values are the same either way (the other tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import strata
from conftest import rand_qkv

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE = 2 << 20


def thp_mode() -> str:
    """"always", "madvise" or "never" (the bracketed word), "" without THP."""
    try:
        text = THP.read_text()
    except OSError:
        return ""
    return text[text.index("[") + 1:text.index("]")] if "[" in text else ""


pytestmark = pytest.mark.skipif(thp_mode() != "madvise",
                                reason=f"needs Linux THP in madvise mode (here: {thp_mode() or 'none'})")


def thp_eligible(addr: int) -> bool:
    """Whether the mapping of this process that holds addr is THPeligible (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "THPeligible:":
                return line.split()[1] == "1"
    raise AssertionError(f"no mapping holds {addr:#x}")


def interior(t: torch.Tensor) -> int:
    """The first 2 MB-aligned address inside t's storage (t must span more than 4 MB)."""
    a = t.untyped_storage().data_ptr()
    assert t.untyped_storage().nbytes() >= 2 * HUGE
    return (a + HUGE - 1) // HUGE * HUGE


def large_qkv():
    """q, k, v of 16 x 8 heads x 256 tokens x 64 (8 MB each), bhsd."""
    return rand_qkv(16, 256, 256, 8, 8, 64, 64, torch.float32, layout="bhsd")


def test_attention_output_and_gradients_are_advised():
    q, k, v = large_qkv()
    out, lse = strata.attention_forward(q, k, v, layout="bhsd")
    assert thp_eligible(interior(out))
    dq, dk, dv = strata.attention_backward(q, k, v, out, lse, torch.ones_like(out), layout="bhsd")
    for g in (dq, dk, dv):
        assert thp_eligible(interior(g))


def test_mlr_and_monarch_outputs_are_advised():
    q, k, v = large_qkv()
    assert thp_eligible(interior(strata.mlr_attention(q, k, v, ranks=[32, 32], layout="bhsd")))
    assert thp_eligible(interior(strata.monarch_attention(q, k, v, layout="bhsd")))


def test_turned_off_by_the_environment():
    code = ("import torch, strata, test_huge_pages as t\n"
            "q, k, v = t.large_qkv()\n"
            "out, _ = strata.attention_forward(q, k, v, layout='bhsd')\n"
            "print(t.thp_eligible(t.interior(out)))\n")
    env = dict(os.environ, STRATA_HUGE_PAGES="0")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
