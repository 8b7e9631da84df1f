#!/usr/bin/env bash
# scripts/gpu_paper.sh on a machine without a GPU, up to its device check (issue 13 item 5): with
# STRATA_BIN (no build) it runs every experiment's smoke size through the torch-op path on the
# CPU, then finds no CUDA device, writes gpu_paper.json {"status": "no-device", "reason": ...}
# naming train.device and exits 3. Also: train.device=cuda is a clear error naming the key, a
# malformed device is a config error, and a bad STEPS is refused before any work.
# Usage: gpu_paper_cpu.sh STRATA SOURCE_DIR
set -euo pipefail
STRATA="$1"; SRC="$2"
T=$(mktemp -d /tmp/strata_gpu_paper_XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
PY="${STRATA_PYTHON:-${STRATA_HOME:-$HOME/.cache/strata}/venv/bin/python}"

# The script stops at the device check with status 3 and says why in its JSON.
set +e
PYTHON="$PY" STRATA_BIN="$STRATA" WORK="$T/work" bash "$SRC/scripts/gpu_paper.sh" "$T/out" 2>"$T/log.txt"
rc=$?
set -e
[ "$rc" = 3 ] || { cat "$T/log.txt" >&2; fail "expected exit status 3 (no CUDA device), got $rc"; }
"$PY" - "$T/out/gpu_paper.json" <<'PY' || fail "gpu_paper.json is not the no-device record"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["status"] == "no-device", j
assert "train.device" in j["reason"], j
assert j["cpu_torch_ops_smoke"] == ["icr", "charlm", "etth1"], j
PY
# Each smoke ran every run of its experiment (through the torch-op path: the log says so).
for e in icr charlm etth1; do
  "$PY" - "$T/work/smoke-$e/summary.json" "$SRC/configs/experiments/$e.toml" <<'PY' || fail "smoke '$e' incomplete"
import json, sys, tomllib
s = json.load(open(sys.argv[1])); want = len(tomllib.load(open(sys.argv[2], "rb"))["run"])
assert len(s["runs"]) >= want, (len(s["runs"]), want)
PY
  grep -q "torch-op path" "$T/out/smoke-$e.log" || fail "smoke '$e' did not run through the torch-op path"
done

# train.device errors name the key.
if "$STRATA" train "$SRC/configs/icr.toml" --size smoke --set train.device=cuda --out "$T/c" --no-progress 2>"$T/e.txt"; then
  fail "train.device=cuda trained on a machine without CUDA"
fi
grep -q "key 'train.device'" "$T/e.txt" || { cat "$T/e.txt" >&2; fail "the no-CUDA error does not name train.device"; }
if "$STRATA" train "$SRC/configs/icr.toml" --size smoke --set train.device=gpu0 --out "$T/d" --no-progress 2>"$T/e.txt"; then
  fail "train.device=gpu0 was accepted"
fi
grep -q "key 'train.device': expected" "$T/e.txt" || { cat "$T/e.txt" >&2; fail "a malformed device is not a config error"; }
if STEPS=0 STRATA_BIN="$STRATA" WORK="$T/work2" bash "$SRC/scripts/gpu_paper.sh" "$T/out2" 2>"$T/e.txt"; then
  fail "STEPS=0 was accepted"
fi
grep -q "STEPS: expected an integer >= 1" "$T/e.txt" || { cat "$T/e.txt" >&2; fail "STEPS=0: unclear error"; }
[ ! -e "$T/work2/smoke-icr" ] || fail "STEPS=0 ran work before refusing"
if DEVICE=tpu STRATA_BIN="$STRATA" WORK="$T/work3" bash "$SRC/scripts/gpu_paper.sh" "$T/out3" 2>"$T/e.txt"; then
  fail "DEVICE=tpu was accepted"
fi
grep -q "DEVICE: expected cpu, cuda or cuda:N" "$T/e.txt" || { cat "$T/e.txt" >&2; fail "DEVICE=tpu: unclear error"; }

# Stage 4 on the CPU at the smoke size (the paper size takes minutes here): one step of two ETTh1
# runs, so the way it passes --set and --only (one flag per value) is exercised without a GPU.
PYTHON="$PY" DEVICE=cpu SIZE=smoke STEPS=1 EXPERIMENTS=etth1 ETTH1_ONLY="patch mha H=96;patch swa w=8 H=96" \
  STRATA_BIN="$STRATA" WORK="$T/work4" bash "$SRC/scripts/gpu_paper.sh" "$T/out4" 2>"$T/log4.txt" \
  || { cat "$T/log4.txt" >&2; fail "stage 4 on the CPU failed"; }
"$PY" - "$T/out4/gpu_paper.json" <<'PY' || fail "gpu_paper.json of the CPU stage 4 is not the expected record"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["status"] == "ran" and j["device"] == "cpu" and j["size"] == "smoke" and j["steps_per_run"] == 1, j
runs = j["experiments"]["etth1"]
assert [r["label"] for r in runs] == ["patch mha H=96", "patch swa w=8 H=96"], runs
assert all(r["steps"] == 1 and r["test"]["mae"] > 0 for r in runs), runs
PY
echo "gpu_paper.sh up to the device check, and stage 4 on the CPU: OK"
