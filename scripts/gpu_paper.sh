#!/usr/bin/env bash
# The `paper` size of the three experiments on a CUDA GPU, bounded (issue 13 item 5): one prepared
# script for a lent device machine (no network there: see --fetch-debs). It
#   1. builds the `strata` CLI against python3's torch (skipped when STRATA_BIN names a binary);
#   2. runs each experiment's smoke size on the CPU through the torch-op path (STRATA_TORCH_OPS=1:
#      the ATen ops the GPU runs for the attentions whose strata kernel is CPU-only), so a broken
#      GPU path shows before any device time is spent on it;
#   3. checks the device: one step of the ICR smoke config with train.device=DEVICE; with no CUDA
#      device it writes OUT/gpu_paper.json {"status": "no-device", ...} and exits 3;
#   4. runs every run of each experiment at --size paper on DEVICE for STEPS steps (evaluation and
#      one checkpoint at the end; ETTh1: the runs in ETTH1_ONLY), then writes OUT/gpu_paper.json:
#      per run the label, model, steps, training tokens/s, wall seconds, loss, val and test
#      metrics, with the GPU's name, torch's version and the commit; and OUT/<exp>_summary.json.
#
# Usage:  scripts/gpu_paper.sh [OUT]            (default OUT: $OUT if set, else out/gpu_paper)
#         scripts/gpu_paper.sh --fetch-debs     (here, with apt: the build's Debian packages into
#                                                .gpu-debs/, to carry to a machine without them)
# Env:    PYTHON (python3: the one whose torch the build uses); STEPS (20) per run; EXPERIMENTS ("icr charlm etth1"); STRATA_BIN (a built strata: no
#         build); WORK (scratch, default /tmp/strata-gpu); ETTH1_ONLY (labels separated by ';'; default:
#         the patch runs at horizons 96 and 720, the point runs at 96: a point run's flatten head
#         at D = 512 is ~1e8 parameters per horizon step of 96); JOBS (build jobs, default nproc);
#         DEVICE (cuda: the train.device of stages 3-4; cuda:N, or cpu to test stage 4 without a GPU);
#         SIZE (paper: the size stage 4 runs; smoke for that test, in seconds).
# Exit:   0 all ran; 3 no CUDA device (stages 1-2 done); other: the failing stage's status.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEBS=(libgtest-dev libgmock-dev googletest libcli11-dev libfmt-dev libfmt9 nlohmann-json3-dev
      libtomlplusplus-dev libtomlplusplus3 libutf8proc-dev libutf8proc2 pkgconf pkgconf-bin libpkgconf3 pkg-config)

log() { printf '[gpu_paper] %s\n' "$*" >&2; }
die() { printf '[gpu_paper] ERROR: %s\n' "$*" >&2; exit "${2:-1}"; }

if [ "${1:-}" = "--fetch-debs" ]; then
  mkdir -p .gpu-debs && (cd .gpu-debs && apt-get download "${DEBS[@]}") || die "apt-get download failed"
  grep -qx '/.gpu-debs/' .git/info/exclude 2>/dev/null || echo '/.gpu-debs/' >> .git/info/exclude
  log "the .debs are in .gpu-debs/ (ignored by git): carry it with the working tree"
  exit 0
fi

OUT="${1:-${OUT:-out/gpu_paper}}"
STEPS="${STEPS:-20}"
EXPERIMENTS="${EXPERIMENTS:-icr charlm etth1}"
WORK="${WORK:-/tmp/strata-gpu}"
ETTH1_ONLY="${ETTH1_ONLY:-patch mha H=96;patch mha H=720;patch mlr 48|16 H=96;patch mlr 48|16 H=720;patch mlr 40|16|4|4 H=96;patch mlr 40|16|4|4 H=720;patch swa w=8 H=96;patch swa w=8 H=720;point mha H=96;point mlr 48|16 H=96;point mlr 40|16|4|4 H=96;point swa w=64 H=96}"
DEVICE="${DEVICE:-cuda}"
SIZE="${SIZE:-paper}"
case "$STEPS" in ''|*[!0-9]*|0) die "STEPS: expected an integer >= 1, got '$STEPS'" ;; esac
case "$DEVICE" in cpu|cuda|cuda:[0-9]*) ;; *) die "DEVICE: expected cpu, cuda or cuda:N, got '$DEVICE'" ;; esac
case "$SIZE" in smoke|cpu|paper) ;; *) die "SIZE: expected smoke, cpu or paper, got '$SIZE'" ;; esac
mkdir -p "$OUT" "$WORK" || die "cannot create OUT '$OUT' or WORK '$WORK'"
PY="$(command -v "${PYTHON:-python3}" || true)"
[ -n "$PY" ] || die "${PYTHON:-python3} is missing (the build takes LibTorch from its torch; PYTHON names another)"
# Python runs from / : in the repo root, the source folder torch/ would shadow the torch package.
py() { (cd / && "$PY" "$@"); }

# ---- 1. build -------------------------------------------------------------------------------
if [ -n "${STRATA_BIN:-}" ]; then
  BIN="$STRATA_BIN"
  [ -x "$BIN" ] || die "STRATA_BIN: expected an executable strata, got '$BIN'"
else
  if [ -d .gpu-debs ] && ! pkg-config --exists tomlplusplus 2>/dev/null; then
    PREFIX="$WORK/prefix"
    log "unpacking .gpu-debs into $PREFIX"
    for f in .gpu-debs/*.deb; do dpkg -x "$f" "$PREFIX" || die "dpkg -x $f failed"; done
    export PATH="$PREFIX/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
    export PKG_CONFIG_LIBDIR="$PREFIX/usr/lib/x86_64-linux-gnu/pkgconfig:$PREFIX/usr/share/pkgconfig"
    EXTRA_PREFIX="$PREFIX/usr"
  fi
  TORCH_PREFIX=$(py -c 'import torch; print(torch.utils.cmake_prefix_path)') || die "$PY has no torch"
  BUILD="$WORK/build"
  log "building strata in $BUILD (torch at $TORCH_PREFIX)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WITH_TORCH=ON \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX${EXTRA_PREFIX:+;$EXTRA_PREFIX}" -DPython3_EXECUTABLE="$PY" > "$OUT/build.log" 2>&1 \
    && cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target strata >> "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log" >&2; die "the build failed (log: $OUT/build.log)"; }
  BIN="$BUILD/strata"  # (the CLI lands in the build root)
fi
"$BIN" info > "$OUT/info.txt" 2>&1 || die "'$BIN info' failed"

# ---- 2. the torch-op path on the CPU, smoke size ----------------------------------------------
for e in $EXPERIMENTS; do
  log "smoke '$e' on the CPU through the torch-op path"
  rm -rf "$WORK/smoke-$e"
  STRATA_TORCH_OPS=1 "$BIN" experiment "$e" --size smoke --out "$WORK/smoke-$e" --no-plot --no-progress \
    > "$OUT/smoke-$e.log" 2>&1 || { tail -20 "$OUT/smoke-$e.log" >&2; die "the torch-op smoke of '$e' failed"; }
done

# ---- 3. the device check -------------------------------------------------------------------------
rm -rf "$WORK/device-check"
if ! "$BIN" train configs/icr.toml --size smoke --set "train.device=$DEVICE" --set train.steps=1 \
     --out "$WORK/device-check" --no-progress > "$OUT/device-check.log" 2>&1; then
  reason=$(grep -m1 -o "key 'train.device'.*" "$OUT/device-check.log" || tail -1 "$OUT/device-check.log")
  py - "$(cd "$OUT" && pwd)/gpu_paper.json" "$reason" "$EXPERIMENTS" <<'EOF'
import json, sys
json.dump({"status": "no-device", "reason": sys.argv[2], "cpu_torch_ops_smoke": sys.argv[3].split()},
          open(sys.argv[1], "w"), indent=2)
EOF
  log "no CUDA device: $reason (wrote $OUT/gpu_paper.json)"
  exit 3
fi

# ---- 4. the paper size on CUDA, STEPS steps per run ---------------------------------------------
status=0
for e in $EXPERIMENTS; do
  only=()
  [ "$e" = "etth1" ] && IFS=';' read -r -a only <<< "$ETTH1_ONLY"
  log "$SIZE size of '$e' on $DEVICE, $STEPS steps per run${only:+ (${#only[@]} runs)}"
  # One --set / --only per value: the CLI takes one value per flag (a list after one flag is refused).
  args=(experiment "$e" --size "$SIZE" --out "$WORK/paper-$e" --no-plot --no-progress)
  for kv in "train.device=$DEVICE" "train.steps=$STEPS" "train.warmup=$(( STEPS / 2 ))" "train.eval_every=$STEPS" \
            "train.checkpoint_every=$STEPS" train.keep_checkpoints=1 train.eval_batches=8; do args+=(--set "$kv"); done
  for label in "${only[@]}"; do args+=(--only "$label"); done
  if ! "$BIN" "${args[@]}" > "$OUT/paper-$e.log" 2>&1; then
    tail -20 "$OUT/paper-$e.log" >&2
    log "the $SIZE size of '$e' failed (log: $OUT/paper-$e.log)"
    status=1
  fi
  [ -f "$WORK/paper-$e/summary.json" ] && cp "$WORK/paper-$e/summary.json" "$OUT/${e}_summary.json"
done

SIZE="$SIZE" py - "$(cd "$OUT" && pwd)" "$STEPS" "$EXPERIMENTS" "$DEVICE" <<'EOF'
import json, os, sys
out, steps, exps, device = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
try:
    import torch
    tv = torch.__version__
    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "none (cpu)"
except Exception as e:  # the record still names what it could
    gpu, tv = f"unknown ({e})", "unknown"
res = {"status": "ran", "size": os.environ.get("SIZE", "paper"), "device": device, "gpu": gpu, "torch": tv, "steps_per_run": steps, "experiments": {}}
for e in exps:
    p = os.path.join(out, f"{e}_summary.json")
    if not os.path.exists(p):
        res["experiments"][e] = {"status": "failed (no summary.json)"}
        continue
    s = json.load(open(p))
    res["experiments"][e] = [{k: r.get(k) for k in ("label", "model", "steps", "tokens_per_second", "wall_s",
                                                    "train_flops", "val", "test", "commit")} for r in s["runs"]]
json.dump(res, open(os.path.join(out, "gpu_paper.json"), "w"), indent=2)
EOF
log "wrote $OUT/gpu_paper.json"
exit $status
