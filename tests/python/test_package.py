"""The package itself: strata.__version__ is the project version (top-level CMakeLists.txt, the one
place it is written), strata.info() reports the loaded library; with --strata-installed (what
scripts/test_pip.sh passes) strata must be the pip-installed package, library included, not the
source tree; with --strata-wheel=PATH that wheel must carry the library in the package."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch

import strata

REPO = Path(__file__).resolve().parents[2]


def project_version() -> str:
    """The version in `project(strata VERSION x.y.z ...)` of the top-level CMakeLists.txt."""
    m = re.search(r"project\(strata VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    assert m, "no project(strata VERSION ...) in CMakeLists.txt"
    return m.group(1)


def test_version_is_the_project_version():
    assert strata.__version__ == project_version()
    assert strata.info()["version"] == strata.__version__


def test_info_reports_the_loaded_library_and_where_it_runs():
    info = strata.info()
    assert set(info) == {"version", "library", "isa", "threads", "cpu_features", "torch", "torch_built_with",
                         "torch_threads", "thread_pool", "bf16_auto", "bf16_dot_rates", "gpu"}
    assert Path(info["library"]) == strata.library_path and strata.library_path.is_file()
    assert info["isa"] in ("scalar", "avx2", "avx512")
    assert isinstance(info["threads"], int) and info["threads"] >= 1
    assert info["torch"] == torch.__version__
    assert info["thread_pool"] in ("torch", "own")
    dot, fma = info["bf16_dot_rates"]
    if "avx512_bf16" in info["cpu_features"]:
        assert dot > 0 and fma > 0
        want = "amx_bf16" if "amx_bf16" in info["cpu_features"] and info["isa"] == "avx512" else (
            "avx512_bf16" if info["isa"] == "avx512" and dot >= 1.25 * fma else "fp32")
        assert info["bf16_auto"] == want, (info["bf16_auto"], dot, fma)
    else:
        assert (dot, fma) == (0.0, 0.0) and info["bf16_auto"] == "fp32"
    assert info["torch_built_with"].split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]
    # per op family, the path CUDA tensors take: Triton only for the families that have kernels
    assert set(info["gpu"]) == {"monarch", "attention", "mlr", "structured_linear"}
    assert all(p.startswith(("triton (", "torch-ops (")) for p in info["gpu"].values()), info["gpu"]
    if not torch.cuda.is_available():
        assert all(p.startswith("torch-ops (") for p in info["gpu"].values()), info["gpu"]


def test_isa_follows_strata_isa(tmp_path):
    """info()['isa'] is what the kernels dispatch to: STRATA_ISA=scalar lowers it (a fresh process:
    the ISA is chosen once per process)."""
    import subprocess
    import sys
    env = dict(os.environ, STRATA_ISA="scalar")
    out = subprocess.run([sys.executable, "-c", "import strata; print(strata.info()['isa'])"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "scalar"


def _site_packages() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths["purelib"]).resolve(), Path(paths["platlib"]).resolve()]


def test_installed_package_is_what_runs(request):
    """strata and its library come from site-packages, not from the clone, and the distribution's
    version is the project's."""
    if not request.config.getoption("--strata-installed"):
        pytest.skip("not asked to test the installed package (--strata-installed)")
    for var in ("STRATA_LIB", "PYTHONPATH"):
        assert var not in os.environ, f"{var} is set: the installed package must need no environment variable"
    library = Path(strata.info()["library"]).resolve()
    assert any(library.parent == site / "strata" for site in _site_packages()), library
    assert not Path(strata.__file__).resolve().is_relative_to(REPO), strata.__file__
    assert not Path.cwd().resolve().is_relative_to(REPO), "run from a folder outside the clone"
    assert importlib.metadata.version("strata-attention") == project_version()


def test_wheel_carries_the_library(request):
    wheel = request.config.getoption("--strata-wheel")
    if wheel is None:
        pytest.skip("no wheel given (--strata-wheel)")
    name = Path(wheel).name
    assert name.startswith(f"strata_attention-{project_version()}-py3-none-"), name
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())
    assert "strata/libstrata_torch.so" in files and "strata/__init__.py" in files, sorted(files)
    assert "strata/libstrata_encoder.so" in files, sorted(files)  # strata.SentenceEncoder (STRATA_BUILD_ENCODER)
