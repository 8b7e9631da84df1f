#!/usr/bin/env bash
# The Python package as users install it: a virtual environment OUTSIDE the clone
# ($STRATA_HOME/pip-venv, created once and reused), `python -m build --wheel --no-isolation` and
# `pip install --no-build-isolation .` from the clone, then tests/python against the INSTALLED
# package, run from a folder outside the clone with no STRATA_LIB / PYTHONPATH (test_package.py
# checks that strata and its library came from site-packages and that the wheel holds the library).
# Part of scripts/test.sh. Usage: scripts/test_pip.sh [VENV]  (VENV: scripts/setup.sh's, for torch)
#
# torch: the environment is fresh but does not download torch (~4 GB with its CUDA libraries)
# again: a .pth file puts the site-packages of scripts/setup.sh's venv (torch, numpy, pytest)
# after its own, so pip sees torch installed and strata goes into the new venv's site-packages.
# Build: no isolation (the library must be built against that torch); the build folder is
# build/pip in the clone and the compiler goes through ccache ($STRATA_HOME/ccache, base dir the
# clone), so after scripts/build.sh release the pip build compiles nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
CLONE="$PWD"
STRATA_HOME="${STRATA_HOME:-$HOME/.cache/strata}"
VENV="${1:-$STRATA_HOME/venv}"
PKG_VENV="$STRATA_HOME/pip-venv"
SKBUILD_PIN="scikit-build-core>=0.10"
log() { printf '[test_pip] %s\n' "$*" >&2; }
die() { printf '[test_pip] ERROR: %s\n' "$*" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || die "no venv with torch at $VENV: run scripts/setup.sh first"

site_packages() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x "$PKG_VENV/bin/python" ]; then
  log "creating $PKG_VENV (torch from $VENV through a .pth file)"
  "$VENV/bin/python" -m venv "$PKG_VENV" || die "could not create a venv at $PKG_VENV"
fi
PY="$PKG_VENV/bin/python"
site_packages "$VENV/bin/python" > "$(site_packages "$PY")/strata-dev-venv.pth"
if ! "$PY" -c 'import scikit_build_core, build' 2>/dev/null; then
  log "installing $SKBUILD_PIN and build into $PKG_VENV (PyPI)"
  "$PY" -m pip install -q "$SKBUILD_PIN" build || die "pip install $SKBUILD_PIN build failed (PyPI unreachable?)"
fi

export CCACHE_DIR="${CCACHE_DIR:-$STRATA_HOME/ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$CLONE}"
export CMAKE_BUILD_PARALLEL_LEVEL="${STRATA_BUILD_JOBS:-$(nproc)}"
# The compiler CMake picks in scripts/build.sh (c++, unless CXX says otherwise): scikit-build-core
# would set CXX to Python's own (sysconfig: g++ here), and ccache hashes the compiler's name.
export CXX="${CXX:-c++}"
# -Werror as in the developers' build (the package defaults to off for users' compilers); the same
# flags also let ccache reuse build/release's objects.
WERROR=(-C cmake.define.STRATA_WERROR=ON)
DIST="$(mktemp -d)"; RUN="$(mktemp -d)"
trap 'rm -rf "$DIST" "$RUN"' EXIT
t0=$SECONDS
log "python -m build --wheel --no-isolation"
"$PY" -m build --wheel --no-isolation --outdir "$DIST" "${WERROR[@]}" . > "$DIST/build.log" 2>&1 \
  || { tail -n 60 "$DIST/build.log" >&2; die "building the wheel failed (log above)"; }
WHEEL="$(ls "$DIST"/strata_attention-*.whl)"
log "wheel: $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB) in $((SECONDS - t0)) s"
t1=$SECONDS
# --no-index: its requirement (torch) must be met by what is installed, never by a download.
log "pip install --no-build-isolation --no-index ."
"$PY" -m pip install -q --no-build-isolation --no-index "${WERROR[@]}" . || die "pip install of the clone failed"
log "installed in $((SECONDS - t1)) s"
(cd "$RUN" && env -u STRATA_LIB -u PYTHONPATH "$PY" -c 'import strata; print(strata.info())')
(cd "$RUN" && env -u STRATA_LIB -u PYTHONPATH "$PY" -m pytest -q -p no:cacheprovider "$CLONE/tests/python" \
   --strata-installed --strata-wheel="$WHEEL")
