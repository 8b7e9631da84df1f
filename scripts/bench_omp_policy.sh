#!/usr/bin/env bash
# How torch SDPA's times depend on OMP_WAIT_POLICY, so that the CLI's default (apps/strata/main.cpp
# re-executes itself with OMP_WAIT_POLICY=PASSIVE unless the variable is set) can be shown to be
# fair to the peer. libgomp reads the variable once, when it is loaded, so every measurement runs
# in its own process:
#   1. SDPA alone: a Python process per policy times torch's scaled_dot_product_attention on the
#      rows of `strata bench attention --quick` (same shapes, dtypes, passes, threads; one
#      warm-up, then REPS calls; median / min / max), strata not loaded at all;
#   2. the bench itself: `strata bench attention --quick` per policy (ours and SDPA in one
#      process, ABBA rounds), so the change of the reported speedup is visible too.
# Prints one table: per row, SDPA alone PASSIVE vs ACTIVE, and the bench's SDPA / ours times and
# speedups under both. Timing: run it on a quiet machine (nothing else on the cores).
#
# Usage: scripts/bench_omp_policy.sh [OUT_DIR]     (default out/omp_policy; about 5 minutes on 2 cores)
# Environment: STRATA_BIN (default build/release/strata), STRATA_NUM_THREADS (default: all CPUs),
#              REPS (SDPA-alone calls per row, default 7), STRATA_HOME (venv at $STRATA_HOME/venv),
#              BENCH_ARGS (extra arguments for the bench, e.g. "--seq 1024 --reps 1" to try the script).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-out/omp_policy}"
BIN="${STRATA_BIN:-build/release/strata}"
PY="${STRATA_HOME:-$HOME/.cache/strata}/venv/bin/python"
THREADS="${STRATA_NUM_THREADS:-$(nproc)}"
REPS="${REPS:-7}"
[ -x "$BIN" ] || { echo "bench_omp_policy.sh: no strata binary at '$BIN' (build first or set STRATA_BIN)" >&2; exit 2; }
[ -x "$PY" ] || { echo "bench_omp_policy.sh: no Python at '$PY' (run scripts/setup.sh or set STRATA_HOME)" >&2; exit 2; }
mkdir -p "$OUT"

# SDPA alone: the quick sweep's rows (bench_attention.cpp: 16384 tokens, 8 heads, d = 64).
sdpa_alone() {
  "$PY" - "$THREADS" "$REPS" <<'PY'
import json, statistics, sys, time
import torch
threads, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
rows = [(n, c, False, torch.float32) for c in (False, True) for n in (1024, 4096)]
rows += [(1024, False, True, torch.float32), (4096, False, True, torch.float32)]
rows += [(4096, c, False, torch.bfloat16) for c in (False, True)]
out = []
for n, causal, backward, dtype in rows:
    torch.manual_seed(20240611)
    shape = (max(1, 16384 // n), 8, n, 64)
    q, k, v, g = (torch.randn(shape).to(dtype) for _ in range(4))
    if backward:
        q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    def call():
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if backward:
            torch.autograd.grad(o, (q, k, v), g)
    call()
    secs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        secs.append(time.perf_counter() - t0)
    case = ("fwd+bwd" if backward else "fwd") + (" causal" if causal else "")
    out.append({"case": case, "seq": n, "dtype": str(dtype).replace("torch.", ""),
                "median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs)})
print(json.dumps(out))
PY
}

for policy in PASSIVE ACTIVE; do
  echo "== OMP_WAIT_POLICY=$policy: SDPA alone ($THREADS threads, $REPS calls per row)" >&2
  OMP_WAIT_POLICY=$policy sdpa_alone > "$OUT/sdpa_alone_$policy.json"
  echo "== OMP_WAIT_POLICY=$policy: strata bench attention --quick" >&2
  # shellcheck disable=SC2086  # BENCH_ARGS: words on purpose
  OMP_WAIT_POLICY=$policy "$BIN" bench attention --quick --threads "$THREADS" ${BENCH_ARGS:-} \
    --json "$OUT/bench_$policy.json" > "$OUT/bench_$policy.log"
done

"$PY" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
alone = {p: json.load(open(f"{out}/sdpa_alone_{p}.json")) for p in ("PASSIVE", "ACTIVE")}
bench = {p: json.load(open(f"{out}/bench_{p}.json")) for p in ("PASSIVE", "ACTIVE")}
def key(case, seq, dtype):
    return (case, seq, dtype)
b = {p: {key(r["case"], r["shape"]["seq"], r["dtype"]): r for r in bench[p]["rows"]} for p in bench}
print(f"machine: {bench['PASSIVE'].get('cpu_model', '?')}; threads {bench['PASSIVE'].get('threads', '?')}; "
      f"torch {bench['PASSIVE'].get('torch_version', '?')}")
print()
print("| case | dtype | N | SDPA alone PASSIVE ms | SDPA alone ACTIVE ms | ACTIVE / PASSIVE | "
      "bench SDPA ms P / A | bench ours ms P / A | bench speedup P / A (min-max) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for ra, rb in zip(alone["PASSIVE"], alone["ACTIVE"]):
    k = key(ra["case"], ra["seq"], ra["dtype"])
    bp, ba = b["PASSIVE"].get(k), b["ACTIVE"].get(k)
    def sp(r):
        return f"{r['speedup_vs_peer']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
    bench_cols = (f"{bp['peer_median_s'] * 1e3:.1f} / {ba['peer_median_s'] * 1e3:.1f} | "
                  f"{bp['median_s'] * 1e3:.1f} / {ba['median_s'] * 1e3:.1f} | {sp(bp)} / {sp(ba)}"
                  if bp and ba else "- | - | -")
    print(f"| {ra['case']} | {ra['dtype']} | {ra['seq']} | {ra['median_s'] * 1e3:.1f} "
          f"({ra['min_s'] * 1e3:.1f}-{ra['max_s'] * 1e3:.1f}) | {rb['median_s'] * 1e3:.1f} "
          f"({rb['min_s'] * 1e3:.1f}-{rb['max_s'] * 1e3:.1f}) | {rb['median_s'] / ra['median_s']:.3f} | {bench_cols} |")
print()
print(f"(files: {out}/sdpa_alone_*.json, {out}/bench_*.json and .log)")
PY
