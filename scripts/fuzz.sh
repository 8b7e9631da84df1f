#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, ASan + UBSan) of every reader of user input: the TOML run
# config, a checkpoint's metadata JSON and safetensors file, the ETT CSV, the char corpus, the
# WordPiece vocabulary and text, the attention spec grammars (tests/fuzz/, one target each).
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (default 600 s each, every target)
# First every committed seed and regression input runs once (tests/fuzz/corpus/<t>, regressions/<t>);
# then each target fuzzes for the budget from a working corpus kept outside the clone
# ($STRATA_FUZZ_DIR/<t>, default $STRATA_HOME/fuzz/<t>, grown across runs). A finding (crash,
# sanitizer report, uncaught non-strata exception, failed property, hang > 10 s, > 2 GB) makes the
# script exit 1 after the other targets; the input is saved to the findings/ folder there and the
# command that replays it is printed: fix it and commit the input as tests/fuzz/regressions/<t>/.
# scripts/test.sh runs this with 8 s per target.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-600}"; shift || true
[[ "$SECONDS_EACH" =~ ^[0-9]+$ && "$SECONDS_EACH" -ge 1 ]] \
  || { echo "[fuzz] ERROR: argument 1 (seconds per target): expected an integer >= 1, got '$SECONDS_EACH'" >&2; exit 2; }
ALL=(train_config checkpoint_meta safetensors ett_csv char_corpus wordpiece specs)
TARGETS=("$@"); [ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "[fuzz] ERROR: target '$t': expected one of: ${ALL[*]}" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "[fuzz] ERROR: clang++ not found: run scripts/setup.sh (Debian packages clang, libclang-rt-dev)" >&2; exit 2; }

HOME_DIR="${STRATA_HOME:-$HOME/.cache/strata}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME_DIR/ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
BUILD="${STRATA_FUZZ_BUILD_DIR:-build/fuzz}"
LAUNCHER=(); command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S tests/fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD" -j "${STRATA_BUILD_JOBS:-$(nproc)}" >/dev/null

WORK="${STRATA_FUZZ_DIR:-$HOME_DIR/fuzz}"
FINDINGS="$WORK/findings"; mkdir -p "$FINDINGS"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
for t in "${TARGETS[@]}"; do
  bin="$BUILD/${t}_fuzz" seeds="tests/fuzz/corpus/$t" regress="tests/fuzz/regressions/$t" work="$WORK/$t"
  mkdir -p "$work"
  dirs=("$seeds"); [ -d "$regress" ] && dirs+=("$regress")
  log="$WORK/$t.log"
  # The committed inputs once each (a regression comes back as a failure here, before any fuzzing).
  if ! "$bin" -runs=0 "${dirs[@]}" >"$log" 2>&1; then
    echo "[fuzz] $t: FAILED on a committed input (log: $log)"; tail -n 30 "$log" >&2; status=1; continue
  fi
  if "$bin" "$work" "${dirs[@]}" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$FINDINGS/${t}-" >"$log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "[fuzz] $t: ${SECONDS_EACH} s, $execs executions, corpus $(ls "$work" | wc -l) inputs, no finding"
  else
    status=1
    echo "[fuzz] $t: FINDING (log: $log)"; grep -E "ERROR|SUMMARY|Test unit written|fuzz property|terminate" "$log" | head -n 8 >&2
    unit=$(grep -o "Test unit written to [^ ]*" "$log" | tail -n 1 | sed 's/Test unit written to //')
    [ -n "$unit" ] && echo "[fuzz] replay: $bin $unit" >&2
  fi
done
exit $status
