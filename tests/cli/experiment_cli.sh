#!/usr/bin/env bash
# `strata experiment NAME --size smoke` end to end (models/experiment.h): a run stopped half-way
# (--stop-after, as if killed) and a real kill -9 are continued by the same command; every run of
# the experiment ends up in summary.json with val (and test) metrics; the plot / table is written;
# a second invocation skips every run and leaves the run folders untouched; the run resumed
# through the experiment reproduces an uninterrupted run's losses; bad input is a clear error.
# Usage: experiment_cli.sh STRATA SOURCE_DIR NAME
set -euo pipefail
STRATA="$1"; SRC="$2"; NAME="$3"
OUT=$(mktemp -d /tmp/strata_experiment_cli_XXXXXX)
trap 'rm -rf "$OUT"' EXIT
PY="${STRATA_PYTHON:-${STRATA_HOME:-$HOME/.cache/strata}/venv/bin/python}"
fail() { echo "FAIL ($NAME): $*" >&2; exit 1; }
expect_error() {  # expect_error NEEDLE CMD...: exit status 1 and NEEDLE in stderr
  local needle="$1"; shift
  if "$@" >"$OUT/o.txt" 2>"$OUT/e.txt"; then fail "expected an error from: $*"; fi
  grep -qF -- "$needle" "$OUT/e.txt" || { cat "$OUT/e.txt" >&2; fail "expected '$needle' in the error of: $*"; }
}
R="$OUT/r"
EXP=("$STRATA" experiment "$NAME" --size smoke --out "$R" --no-progress)
NO_PLOT=()
"$PY" -c 'import matplotlib' 2>/dev/null || NO_PLOT=(--no-plot)

# 1. The first run stops after two steps (its checkpoint at step 2 of 3), as if killed: a checkpoint, no summary.
"${EXP[@]}" --stop-after 2 2>"$OUT/log1.txt" >/dev/null || { cat "$OUT/log1.txt" >&2; fail "--stop-after run failed"; }
label_of() {  # label_of I: the label of the experiment's I-th run (0-based)
  "$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["run"][int(sys.argv[2])]["label"])' \
    "$SRC/configs/experiments/$NAME.toml" "$1"
}
FIRST=$(label_of 0)
FIRST_DIR="$R/$(echo "$FIRST" | sed 's/|/-/g; s/[^A-Za-z0-9._=+-]/_/g')"
[ -f "$FIRST_DIR/checkpoints/latest.json" ] || fail "no checkpoint in '$FIRST_DIR' after --stop-after 2"
[ ! -f "$FIRST_DIR/summary.json" ] || fail "'$FIRST_DIR' finished despite --stop-after 2"
grep -q "as if killed" "$OUT/log1.txt" || fail "no 'as if killed' line"

# 2. A real kill -9 while a later run trains (the second run's first checkpoint).
SECOND_LABEL=$(label_of 1)
SECOND_DIR="$R/$(echo "$SECOND_LABEL" | sed 's/|/-/g; s/[^A-Za-z0-9._=+-]/_/g')"
"${EXP[@]}" "${NO_PLOT[@]}" >/dev/null 2>"$OUT/log2.txt" &
PID=$!
for _ in $(seq 1 600); do
  [ -f "$SECOND_DIR/checkpoints/latest.json" ] && break
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.02
done
kill -9 "$PID" 2>/dev/null || true
wait "$PID" 2>/dev/null || true
grep -q "$FIRST: resuming in" "$OUT/log2.txt" || { cat "$OUT/log2.txt" >&2; fail "the stopped run was not resumed"; }

# 3. The same command continues and finishes everything.
"${EXP[@]}" "${NO_PLOT[@]}" >"$OUT/out3.json" 2>"$OUT/log3.txt" || { cat "$OUT/log3.txt" >&2; fail "the continued run failed"; }
"$PY" - "$R/summary.json" "$SRC/configs/experiments/$NAME.toml" <<'PY' || fail "summary.json check"
import json, math, sys, tomllib
s = json.load(open(sys.argv[1]))
e = tomllib.load(open(sys.argv[2], "rb"))
labels = [r["label"] for r in e["run"]]
got = [r["label"] for r in s["runs"]]
missing = [l for l in labels if l not in got]
assert not missing, f"summary.json lacks {missing}"
assert len(got) == len(set(got)), "duplicate records"
if "repeat" in e:
    best = s["best"]["method"]
    mine = [r["label"] for r in e["run"] if r.get("method", r["label"]) == best]
    want = [f"{l} seed={k}" for k in e["repeat"]["seeds"] for l in mine]
    assert all(w in got for w in want), f"repeat runs missing: {[w for w in want if w not in got]}"
    assert len(got) == len(labels) + len(want), (len(got), len(labels), len(want))
    means = s["best"]["means"]
    assert means[best] == min(means.values()), "best is not the lowest val mean"
for r in s["runs"]:
    for k in ("label", "config", "sets", "seed", "steps", "train_flops", "wall_s", "tokens_per_second", "val",
              "commit", "cpu", "date"):
        assert k in r, f"run {r['label']} has no {k}"
    assert r["train_flops"] > 0 and r["wall_s"] > 0 and r["tokens_per_second"] > 0, r["label"]
    assert all(math.isfinite(v) for v in r["val"].values()), r["label"]
    if s["kind"] != "charlm":
        assert r["test"] and all(math.isfinite(v) for v in r["test"].values()), f"run {r['label']} has no test metrics"
print(f"summary.json: {len(got)} runs")
PY
if [ ${#NO_PLOT[@]} -eq 0 ]; then
  case "$NAME" in
    icr) ls "$R"/icr_d*.png >/dev/null 2>&1 || fail "no icr_d*.png" ;;
    charlm) [ -s "$R/charlm.png" ] || fail "no charlm.png" ;;
  esac
fi
[ "$NAME" != etth1 ] || grep -q "PatchTST/42" "$R/table.md" || fail "no table.md with the published rows"

# 4. A second invocation skips everything and touches no run folder.
find "$R" -type f -exec touch -d '1 minute ago' {} +
"${EXP[@]}" "${NO_PLOT[@]}" >"$OUT/out4.json" 2>"$OUT/log4.txt" || { cat "$OUT/log4.txt" >&2; fail "the second invocation failed"; }
grep -q '"ran":0' "$OUT/out4.json" || { cat "$OUT/out4.json" >&2; fail "the second invocation ran something"; }
CHANGED=$(find "$R" -type f ! -name '*.png' ! -name 'table.md' -newer "$FIRST_DIR/config.toml" | head -3)
[ -z "$CHANGED" ] || fail "the second invocation changed: $CHANGED"

# 5. The run resumed after --stop-after equals the same run uninterrupted (losses, bit for bit).
"$STRATA" experiment "$NAME" --size smoke --out "$OUT/u" --only "$FIRST" --no-progress --no-plot >/dev/null 2>&1 \
  || fail "--only '$FIRST' failed"
cut -d, -f1-6 "$FIRST_DIR/train.csv" > "$OUT/a.csv"
cut -d, -f1-6 "$OUT/u/$(basename "$FIRST_DIR")/train.csv" > "$OUT/b.csv"
cmp -s "$OUT/a.csv" "$OUT/b.csv" || { diff "$OUT/a.csv" "$OUT/b.csv" >&2; fail "the resumed run's losses differ"; }

# Bad input: clear errors naming what is wrong.
expect_error "option '--only': no run labelled \"nope\"" "${EXP[@]}" --only nope
expect_error "size 'huge'" "$STRATA" experiment "$NAME" --size huge --out "$OUT/h"
expect_error "holds experiment '$NAME' at size 'smoke'" "$STRATA" experiment "$NAME" --size cpu --out "$R"
expect_error "no experiment 'nothing'" "$STRATA" experiment nothing
echo "experiment_cli $NAME: ok"
