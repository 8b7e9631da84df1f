#!/usr/bin/env bash
# Configures and builds strata in build/<config> (release | asan). Needs scripts/setup.sh first.
# Usage: scripts/build.sh [release|asan] [extra cmake args...]   (STRATA_BUILD_DIR overrides build/<config>,
# STRATA_BUILD_TARGETS limits what is built)
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${1:-release}"; shift || true
VENV="${STRATA_HOME:-$HOME/.cache/strata}/venv"
[ -x "$VENV/bin/python" ] || { echo "[build] ERROR: no venv at $VENV: run scripts/setup.sh first" >&2; exit 1; }
TORCH_PREFIX=$("$VENV/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
case "$CONFIG" in
  release) ARGS=(-DCMAKE_BUILD_TYPE=Release -DSTRATA_WITH_TORCH=ON) ;;
  # Debug + ASan + UBSan, at -O1 (what the sanitizer docs recommend: -O0 makes the kernel sweep
  # 30x slower for no extra coverage). Core only: LibTorch is not built with ASan.
  asan)    ARGS=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" -DSTRATA_SANITIZE=ON -DSTRATA_WITH_TORCH=OFF) ;;
  *) echo "[build] ERROR: argument 1: expected release or asan, got '$CONFIG'" >&2; exit 1 ;;
esac
export CCACHE_DIR="${CCACHE_DIR:-${STRATA_HOME:-$HOME/.cache/strata}/ccache}"
# Paths under the clone hashed relative to it: a fresh clone elsewhere (CI) reuses the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
BUILD_DIR="${STRATA_BUILD_DIR:-build/$CONFIG}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DPython3_EXECUTABLE="$VENV/bin/python" "${ARGS[@]}" "$@" >/dev/null
# STRATA_BUILD_TARGETS="a b": only those targets and what they need (the demo builds only `strata`).
TARGETS=(); for t in ${STRATA_BUILD_TARGETS:-}; do TARGETS+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "${STRATA_BUILD_JOBS:-$(nproc)}" "${TARGETS[@]}"
