#!/usr/bin/env bash
# A/B of two builds on the quick benches (a change must make nothing else slower): attention
# --quick and its N = 256 fp32 rows in the order new, old, old, new; mlr and monarch --quick once
# each; then `bench memory` of the new build; then bench/ab_compare.py's summary rows.
# Usage: bench/ab_quick.sh OLD_CHECKOUT NEW_CHECKOUT OUT_DIR   (each checkout built: build/release/strata)
# Every bench holds /tmp/cpu.lock (flock), so other work that takes the lock cannot overlap a timing.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 OLD_CHECKOUT NEW_CHECKOUT OUT_DIR" >&2; exit 2; }
OLD=$1 NEW=$2 O=$3
for d in "$OLD" "$NEW"; do
  [ -x "$d/build/release/strata" ] || { echo "$0: no $d/build/release/strata: build that checkout first" >&2; exit 1; }
done
mkdir -p "$O"
run() {  # tag checkout bench args...
  local tag=$1 dir=$2 b=$3; shift 3
  echo "[ab] $b $tag ($dir)"
  flock /tmp/cpu.lock "$dir/build/release/strata" bench "$b" "$@" --json "$O/${b}_${tag}.json" > "$O/${b}_${tag}.log" 2>&1
}
N256=(--seq 256 --head-dim 64 --dtype float32 --reps 5)
run new1 "$NEW" attention --quick
run n256new1 "$NEW" attention "${N256[@]}"
run old1 "$OLD" attention --quick
run n256old1 "$OLD" attention "${N256[@]}"
run old2 "$OLD" attention --quick
run n256old2 "$OLD" attention "${N256[@]}"
run new2 "$NEW" attention --quick
run n256new2 "$NEW" attention "${N256[@]}"
run new1 "$NEW" mlr --quick
run old1 "$OLD" mlr --quick
run old1 "$OLD" monarch --quick
run new1 "$NEW" monarch --quick
run new "$NEW" memory
C="python3 $(dirname "$0")/ab_compare.py"
$C --old "$O"/attention_old{1,2}.json --new "$O"/attention_new{1,2}.json --label "attention --quick" | tail -1
$C --old "$O"/attention_n256old{1,2}.json --new "$O"/attention_n256new{1,2}.json --label "attention N = 256, fp32" | tail -1
$C --old "$O"/mlr_old1.json --new "$O"/mlr_new1.json --label "mlr --quick" | tail -1
$C --old "$O"/monarch_old1.json --new "$O"/monarch_new1.json --label "monarch --quick" | tail -1
