#!/usr/bin/env bash
# Installs everything strata needs, idempotently, OUTSIDE the clone so CI on the same machine
# reuses it:  Debian packages (apt) + the KJV text at $STRATA_HOME/data/kjv.txt (from Debian's
# bible-kjv, for the char-LM experiments) + a Python venv at $STRATA_HOME/venv with a pinned torch.
# Prints the venv path on the last line. Safe to run again: skips what is already there.
set -euo pipefail

STRATA_HOME="${STRATA_HOME:-$HOME/.cache/strata}"
VENV="$STRATA_HOME/venv"
TORCH_VERSION="${STRATA_TORCH_VERSION:-2.11.0}"   # the H200 machines carry torch 2.11 (CUDA 13.0)
PY="${PYTHON:-python3}"

APT_PKGS=(g++ cmake ninja-build ccache pkg-config git
          libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
          libcli11-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev libutf8proc-dev libhwy-dev
          clang libclang-rt-dev bible-kjv)  # clang + its runtimes: the libFuzzer targets (scripts/fuzz.sh)
# The Hugging Face / timm integrations (python/strata/integrations, pyproject's [hf] extra) are tested
# at these versions; torchvision is torch's own companion (timm imports it): 0.26 goes with torch 2.11.
TORCHVISION_VERSION="${STRATA_TORCHVISION_VERSION:-0.26.0}"
HF_PINS=("transformers==5.25.0" "timm==1.0.31" "torchvision==$TORCHVISION_VERSION")
PIP_PKGS=("torch==$TORCH_VERSION" "numpy" "pytest" "matplotlib" "${HF_PINS[@]}")

log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# --- Debian packages -------------------------------------------------------------------------
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "apt-get not found; install by hand: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq >/dev/null 2>&1 || die "apt-get update failed: Debian's package registry cannot be reached"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]} (registry unreachable or package missing)"
else
  log "Debian packages present"
fi

# --- KJV text (data/char_corpus.h checks its sha256) --------------------------------------------
KJV="$STRATA_HOME/data/kjv.txt"
if [ ! -s "$KJV" ]; then
  command -v bible >/dev/null || die "the 'bible' program (Debian package bible-kjv) is missing: apt-get install bible-kjv"
  log "writing $KJV from bible-kjv"
  mkdir -p "$STRATA_HOME/data"
  # COLUMNS unset: -f formats to that width when it is set; one verse per line is what is checksummed.
  env -u COLUMNS bible -f 'gen1:1-rev22:21' > "$KJV.tmp" || die "bible -f 'gen1:1-rev22:21' failed"
  mv "$KJV.tmp" "$KJV"
else
  log "KJV text present ($KJV)"
fi

# --- Python venv with torch (LibTorch for C++ comes from torch.utils.cmake_prefix_path) --------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv at $VENV"
  mkdir -p "$STRATA_HOME"
  "$PY" -m venv "$VENV" || die "could not create a venv with $PY (is python3-venv installed?)"
fi
need_pip=0
"$VENV/bin/python" - "$TORCH_VERSION" "${HF_PINS[@]}" 2>/dev/null <<'PYEOF' || need_pip=1
import sys, importlib.metadata as md
want = sys.argv[1]
have = md.version("torch").split("+")[0]
assert have == want, f"torch {have} != {want}"
for p in ("numpy", "pytest", "matplotlib"):
    md.version(p)
for pin in sys.argv[2:]:  # name==version, exactly
    name, version = pin.split("==")
    assert md.version(name).split("+")[0] == version, f"{name} != {version}"
PYEOF
if [ $need_pip = 1 ]; then
  log "installing PyPI packages into $VENV: ${PIP_PKGS[*]} (torch is large: several minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install -q "${PIP_PKGS[@]}" \
    || die "pip install failed for: ${PIP_PKGS[*]} (PyPI unreachable, or torch==$TORCH_VERSION not served)"
else
  log "PyPI packages present (torch $TORCH_VERSION)"
fi
echo "$VENV"
