#!/usr/bin/env bash
# The training commands end to end at the smoke size: train, a kill (SIGKILL mid-run) and --resume,
# eval, generate, plot; and the clear errors of bad input. Usage: train_cli.sh STRATA SOURCE_DIR
set -euo pipefail
STRATA="$1"; SRC="$2"
OUT=$(mktemp -d /tmp/strata_train_cli_XXXXXX)
trap 'rm -rf "$OUT"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_error() {  # expect_error NEEDLE CMD...: exit status 1 and NEEDLE in stderr
  local needle="$1"; shift
  if "$@" >"$OUT/o.txt" 2>"$OUT/e.txt"; then fail "expected an error from: $*"; fi
  grep -qF -- "$needle" "$OUT/e.txt" || { cat "$OUT/e.txt" >&2; fail "expected '$needle' in the error of: $*"; }
}

# A full smoke run, then the same run killed with SIGKILL while it trains and resumed.
"$STRATA" train "$SRC/configs/charlm.toml" --size smoke --set train.steps=12 --set train.threads=1 \
  --out "$OUT/a" --no-progress >/dev/null
"$STRATA" train "$SRC/configs/charlm.toml" --size smoke --set train.steps=12 --set train.threads=1 \
  --out "$OUT/b" --no-progress >/dev/null 2>&1 &
PID=$!
for _ in $(seq 1 2400); do  # kill it once it has written its first checkpoint (<= 120 s: a loaded CI machine)
  [ -f "$OUT/b/checkpoints/latest.json" ] && break
  sleep 0.05
done
kill -9 "$PID" 2>/dev/null || true
wait "$PID" 2>/dev/null || true
[ -f "$OUT/b/checkpoints/latest.json" ] || fail "no checkpoint before the kill"
"$STRATA" train "$SRC/configs/charlm.toml" --size smoke --set train.steps=12 --set train.threads=1 \
  --out "$OUT/b" --resume --no-progress >/dev/null
cut -d, -f1-6 "$OUT/a/train.csv" > "$OUT/a.csv"
cut -d, -f1-6 "$OUT/b/train.csv" > "$OUT/b.csv"
cmp -s "$OUT/a.csv" "$OUT/b.csv" || { diff "$OUT/a.csv" "$OUT/b.csv" >&2; fail "resumed losses differ"; }

"$STRATA" eval "$OUT/a" --json "$OUT/eval.json" >/dev/null
grep -q '"val_bpc"' "$OUT/eval.json" || fail "eval wrote no val_bpc"
"$STRATA" generate "$OUT/a" --prompt "ROMEO:" --tokens 20 --temperature 0.8 --top-k 10 --seed 1 >"$OUT/gen.txt" 2>"$OUT/gen.err"
grep -q "^ROMEO:" "$OUT/gen.txt" || fail "generate did not echo the prompt"
grep -q "tokens/s" "$OUT/gen.err" || fail "generate printed no tokens/s"
if "${STRATA_PYTHON:-${STRATA_HOME:-$HOME/.cache/strata}/venv/bin/python}" -c 'import matplotlib' 2>/dev/null; then
  "$STRATA" plot "$OUT/a" "$OUT/b" --out "$OUT/plot.png" >/dev/null
  [ -s "$OUT/plot.png" ] || fail "plot wrote no PNG"
fi

# Bad input: clear errors naming what is wrong.
expect_error "key 'train.stepz'" "$STRATA" train "$SRC/configs/charlm.toml" --size smoke --set train.stepz=3 --out "$OUT/c"
expect_error "already has a checkpoint" "$STRATA" train "$SRC/configs/charlm.toml" --size smoke --out "$OUT/a" --no-progress
expect_error "size 'huge'" "$STRATA" train "$SRC/configs/charlm.toml" --size huge --out "$OUT/c"
expect_error "attention spec" "$STRATA" train "$SRC/configs/charlm.toml" --size smoke --set model.attention=flash --out "$OUT/d" --no-progress
expect_error "no such file or folder" "$STRATA" eval "$OUT/nothing"
mkdir -p "$OUT/empty"
expect_error "no checkpoint" "$STRATA" eval "$OUT/empty"
# --resume on a folder without checkpoints names the file a run folder would hold (issue 48 item 5)
expect_error "$OUT/empty/checkpoints/latest.json" "$STRATA" train "$SRC/configs/charlm.toml" --size smoke \
  --out "$OUT/empty" --resume --no-progress

# A folder or an empty file as the config is an error in a second, not a default run (issue 48
# item 2): the folder's error names the path and what it is; the empty file's names the key 'task'.
expect_error "'$SRC/configs': expected a file, got a folder" "$STRATA" train "$SRC/configs" --out "$OUT/e" --no-progress
: > "$OUT/empty.toml"
expect_error "key 'task': missing" "$STRATA" train "$OUT/empty.toml" --out "$OUT/e" --no-progress
[ ! -e "$OUT/e/train.csv" ] || fail "a config without a task started a run"
# A character device or pipe stays readable (/dev/stdin, <(cmd)): /dev/null reads as the empty file.
expect_error "key 'task': missing" "$STRATA" train /dev/null --out "$OUT/e" --no-progress

# Two trainers on one run folder (issue 48 item 3): the second, started while the first trains, is
# an error naming the first's pid, and neither a fresh run nor --resume touches the first's files.
"$STRATA" train "$SRC/configs/charlm.toml" --size smoke --set train.steps=100000 --set train.threads=1 \
  --out "$OUT/f" --no-progress >/dev/null 2>&1 &
PID=$!
for _ in $(seq 1 2400); do
  [ -f "$OUT/f/checkpoints/latest.json" ] && break
  sleep 0.05
done
[ -f "$OUT/f/checkpoints/latest.json" ] || { kill -9 "$PID"; fail "the first trainer wrote no checkpoint"; }
expect_error "in use by another run (pid $PID" "$STRATA" train "$SRC/configs/charlm.toml" --size smoke \
  --set train.steps=100000 --set train.threads=1 --out "$OUT/f" --resume --no-progress
expect_error "in use by another run (pid $PID" "$STRATA" train "$SRC/configs/charlm.toml" --size smoke \
  --set train.steps=100000 --set train.threads=1 --out "$OUT/f" --no-progress
kill -9 "$PID" 2>/dev/null || true
wait "$PID" 2>/dev/null || true
# The steps of train.csv are one increasing run; the kernel dropped the lock with the killed
# process, so --resume continues the folder.
tail -n +2 "$OUT/f/train.csv" | cut -d, -f1 | awk 'NR > 1 && $1 != prev + 1 { bad = 1 } { prev = $1 } END { exit bad }' \
  || fail "train.csv of the locked folder has steps out of order"
"$STRATA" train "$SRC/configs/charlm.toml" --size smoke --set train.steps=100000 --set train.threads=1 \
  --out "$OUT/f" --resume --no-progress --stop-after 1 >/dev/null || fail "--resume after the holder died failed"
echo "train_cli: ok"
