#!/usr/bin/env bash
# Runs a strata bench command RUNS times beside a busy process (a shell loop on one core) and
# counts the runs that marked a row wrong: how the Monarch smoke's rare wrong T = 1 forward rows
# were seen (1 in 25-40 runs on an Intel Xeon with AVX-512). Prints each bad run's wrong rows and
# the bench's own detail lines (bench monarch: the two checks apart).
# Usage: bench/stress_under_load.sh RUNS STRATA_BINARY ARGS...
#   e.g. bench/stress_under_load.sh 40 build/release/strata bench monarch --smoke
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 RUNS STRATA_BINARY ARGS..." >&2; exit 2; }
runs=$1; shift
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "$0: argument RUNS: expected an integer >= 1, got '$runs'" >&2; exit 2; }
bash -c 'while :; do :; done' &
busy=$!
trap 'kill $busy 2>/dev/null' EXIT
bad=0
for i in $(seq 1 "$runs"); do
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || grep -qE ' NO |the check apart' <<<"$out"; then
    bad=$((bad + 1))
    echo "run $i (exit $rc):"
    grep -E ' NO |the check apart|error' <<<"$out"
  fi
done
echo "$bad of $runs runs had a wrong row or failed (CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-))"
[ $bad -eq 0 ]
