#!/usr/bin/env bash
# scripts/gpu_check.sh: the one prepared check of the Triton kernels on a lent GPU (issue 46;
# ../shared/design/gpu.md). Nothing is built or fetched there: it needs the working tree and the
# library built here, carried (build/release/torch/libstrata_torch.so, 5 MB; the device image's
# python3 has the same torch 2.11 / triton 3.6).
#
#   1. the environment: nvidia-smi, python3, torch, triton, strata.info()["gpu"] (must say triton:
#      the Triton kernels registered for CUDA tensors), into OUT/env.json;
#   2. tests/python/gpu on CUDA (float32, float16, bfloat16 against the float64 reference; the
#      registered op path; the sm_80 / sm_90 compile check is left to the CPU runs), in parallel
#      processes when pytest-xdist is there; log and junit XML in OUT;
#   3. the bench (python -m strata.gpu.bench_monarch): Triton forward and forward + backward
#      against SDPA (flash) and the torch-ops path at N = 256, 1024, 4096, 16384, T = 1 and 2,
#      bf16, 12 heads, d = 64, and the errors against float64 beside SDPA bf16's, OUT/bench_monarch.json;
#   4. OUT/gpu_check.json: each stage's exit status and seconds, the device, the commit.
# Each stage is bounded (timeout), the whole well under 10 minutes: TESTS_S (300) and BENCH_S (240).
#
# Usage:  OUT=/some/dir scripts/gpu_check.sh      (default OUT: $OUT, else out/gpu_check)
# Env:    PYTHON (python3), STRATA_LIB (build/release/torch/libstrata_torch.so), JOBS (pytest -n, 8),
#         NS (bench's N list, "256,1024,4096,16384"), STEPS ("1,2"), QUICK=1 (short bench repeats).
# Exit:   0 every stage passed; 3 no CUDA device (nothing run); 4 strata does not import or the
#         Triton path is not registered; else 10 + the number of failed stages.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${OUT:-out/gpu_check}"
mkdir -p "$OUT" || { echo "[gpu_check] cannot create OUT '$OUT'" >&2; exit 1; }
OUT="$(cd "$OUT" && pwd)"
PY="$(command -v "${PYTHON:-python3}" || true)"
[ -n "$PY" ] || { echo "[gpu_check] ${PYTHON:-python3} not found" >&2; exit 1; }
export STRATA_LIB="${STRATA_LIB:-$ROOT/build/release/torch/libstrata_torch.so}"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
TESTS_S="${TESTS_S:-300}"
BENCH_S="${BENCH_S:-240}"
JOBS="${JOBS:-8}"
NS="${NS:-256,1024,4096,16384}"
STEPS="${STEPS:-1,2}"
log() { printf '[gpu_check %s] %s\n' "$(date +%T)" "$*" >&2; }
T0=$(date +%s)

# ---- 1. environment ---------------------------------------------------------------------------
(nvidia-smi || true) > "$OUT/nvidia-smi.txt" 2>&1
"$PY" - "$OUT/env.json" <<'EOF'
import json, subprocess, sys
env = {}
try:
    import torch
    env.update(torch=torch.__version__, cuda=torch.version.cuda, device_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=p.name, capability=list(torch.cuda.get_device_capability()), sms=p.multi_processor_count,
                   memory_gib=round(p.total_memory / 2**30, 1))
    import triton
    env["triton"] = triton.__version__
    import strata
    env["strata"] = strata.__version__
    env["gpu_paths"] = strata.info()["gpu"]
except Exception as e:  # recorded; the shell decides
    env["error"] = f"{type(e).__name__}: {e}"
try:
    env["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
except Exception:
    pass
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env, indent=1))
EOF
summary() {  # summary STATUS
  "$PY" - "$OUT" "$1" "$(( $(date +%s) - T0 ))" "${TEST_RC:-}" "${TEST_S:-}" "${BENCH_RC:-}" "${BENCH_S_USED:-}" <<'EOF'
import json, sys
out, status, wall, trc, ts, brc, bs = sys.argv[1:8]
env = json.load(open(f"{out}/env.json"))
res = dict(status=status, wall_s=int(wall), device=env.get("device"), commit=env.get("commit"),
           gpu_paths=env.get("gpu_paths"),
           tests=dict(rc=int(trc), seconds=int(ts)) if trc else None,
           bench=dict(rc=int(brc), seconds=int(bs)) if brc else None)
json.dump(res, open(f"{out}/gpu_check.json", "w"), indent=1)
print(json.dumps(res))
EOF
}
if ! "$PY" -c 'import json,sys; e=json.load(open(sys.argv[1])); sys.exit(0 if e.get("device_available") else 1)' "$OUT/env.json"; then
  log "no CUDA device: nothing to check here (the CPU runs: python -m pytest -q tests/python/gpu)"
  summary no-device; exit 3
fi
if ! "$PY" -c 'import json,sys; e=json.load(open(sys.argv[1])); sys.exit(0 if str(e.get("gpu_paths",{}).get("monarch","")).startswith("triton") else 1)' "$OUT/env.json"; then
  log "strata did not import, or the Triton path is not registered: see $OUT/env.json"
  summary not-registered; exit 4
fi

# ---- 2. the tests on CUDA -----------------------------------------------------------------------
XDIST=()
"$PY" -c 'import xdist' 2>/dev/null && XDIST=(-n "$JOBS")
log "tests/python/gpu on CUDA (${XDIST[*]:-one process}, at most ${TESTS_S} s)"
S=$(date +%s)
timeout "$TESTS_S" "$PY" -m pytest -q tests/python/gpu -k "not every_launcher" "${XDIST[@]}" \
  --junitxml="$OUT/pytest.xml" -p no:cacheprovider > "$OUT/pytest.log" 2>&1
TEST_RC=$?
TEST_S=$(( $(date +%s) - S ))
tail -5 "$OUT/pytest.log" >&2

# ---- 3. the bench --------------------------------------------------------------------------------
log "bench (at most ${BENCH_S} s)"
S=$(date +%s)
QUICK_ARG=()
[ "${QUICK:-0}" = "1" ] && QUICK_ARG=(--quick)
timeout "$BENCH_S" "$PY" -m strata.gpu.bench_monarch "$OUT/bench_monarch.json" --ns "$NS" --steps "$STEPS" \
  "${QUICK_ARG[@]}" > "$OUT/bench.log" 2>&1
BENCH_RC=$?
BENCH_S_USED=$(( $(date +%s) - S ))

# ---- 4. summary ------------------------------------------------------------------------------------
FAILED=$(( (TEST_RC != 0) + (BENCH_RC != 0) ))
summary "$([ "$FAILED" = 0 ] && echo ok || echo failed)" >&2
tail -30 "$OUT/bench.log"
[ "$FAILED" = 0 ] && exit 0 || exit $(( 10 + FAILED ))
