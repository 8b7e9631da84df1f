"""tools/gpu_ops_check.py, the prepared check for a lent GPU, kept working without one: on the CPU it
runs every case (the CPU kernels against the float64 reference) and must find all within bounds;
asked for CUDA where there is none it says so and exits 3 (a GPU session must not spend device
time on a script that broke here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_ops_check.py"


def run(tmp_path, *args):
    # From tmp_path: in the clone's root the source folder torch/ would shadow the torch package.
    return subprocess.run([sys.executable, str(TOOL), str(tmp_path / "out.json"), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


def test_every_case_within_bounds_on_the_cpu(tmp_path):
    r = run(tmp_path, "--device", "cpu", "--mlr-regions-half")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "out.json").read_text())
    assert res["device"] == "cpu" and res["ok"] and res["mlr_regions_half"]
    cases = res["cases"]
    assert len(cases) >= 40 and all(c["ok"] for c in cases)
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    # every op family is in it
    for family in ("attention", "mlr", "monarch", "structured_linear"):
        assert any(c["case"].startswith(family) for c in cases), family


def test_cuda_without_a_device_exits_3(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a machine with a GPU runs the real check (python tools/gpu_ops_check.py OUT.json)")
    r = run(tmp_path, "--device", "cuda")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no CUDA device" in r.stderr
