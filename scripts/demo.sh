#!/usr/bin/env bash
# Sets up (idempotent), builds Release and runs the main job: `strata demo` on its small built-in
# defaults (correctness check + speed table against PyTorch + PNG plot in ./out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/build.sh release
exec build/release/strata demo "$@"
