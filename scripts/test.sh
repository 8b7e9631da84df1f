#!/usr/bin/env bash
# Sets up (idempotent), builds Release and Debug+ASan+UBSan, and runs every test:
#   C++ core + LibTorch tests (Release), the core tests again under ASan+UBSan, pytest against the
#   build tree, the libFuzzer targets for a few seconds each (scripts/fuzz.sh), and pytest again
#   against the package installed by pip into a fresh venv (test_pip.sh).
# This is the README's second command and what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="$(bash scripts/setup.sh | tail -n 1)"
bash scripts/setup_encoder.sh >/dev/null  # the pretrained encoder (PyPI) its tests need
JOBS="${STRATA_BUILD_JOBS:-$(nproc)}"
bash scripts/build.sh release
bash scripts/build.sh asan
echo "== C++ tests (Release: core + LibTorch) =="
(cd build/release && ctest --output-on-failure -j "$JOBS" --timeout 900)
echo "== C++ core tests under ASan + UBSan =="
(cd build/asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
   ctest --output-on-failure -j "$JOBS" --timeout 1800)
echo "== Fuzzing: every reader of user input, 8 s per target (scripts/fuzz.sh; longer runs: scripts/fuzz.sh 600) =="
bash scripts/fuzz.sh 8
echo "== Python tests =="
STRATA_LIB="$PWD/build/release/torch/libstrata_torch.so" PYTHONPATH="$PWD/python" \
  "$VENV/bin/python" -m pytest -q tests/python
echo "== Python package: pip install into a fresh venv, pytest against the installed package =="
bash scripts/test_pip.sh "$VENV"
