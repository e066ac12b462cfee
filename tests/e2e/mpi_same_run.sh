#!/usr/bin/env bash
# Under mpirun, ranks started with different runs (mpirun's MPMD form: -np 2 ... : -np 2 ...)
# stop at start-up with exit code 2 and one message, from rank 0, naming the ranks and the keys
# that differ; no outputs are written and no rank starts the run.
# Usage: mpi_same_run.sh COCODIFF MPIEXEC CONFIG(4 ranks)
set -uo pipefail
bin=$1 mpiexec=$2 config=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
check() {  # name expected-message "first half's --set" "second half's --set"
  local name=$1 want=$2 a=$3 b=$4
  local start=$SECONDS
  timeout 60 "$mpiexec" --allow-run-as-root --oversubscribe \
    -np 2 "$bin" run "$config" --backend mpi --out "$work/out" -q --set "$a" : \
    -np 2 "$bin" run "$config" --backend mpi --out "$work/out" -q --set "$b" > "$work/log" 2>&1
  local code=$? elapsed=$((SECONDS - start)) ok=1
  cat "$work/log"
  [ "$code" -eq 2 ] || { echo "FAIL $name: exit code $code, expected 2 (124 = hang)"; ok=0; }
  local n
  n=$(grep -c -F -e "$want" "$work/log")
  [ "$n" -eq 1 ] || { echo "FAIL $name: '$want' printed $n times, expected once"; ok=0; }
  grep -q "^cocodiff: rank 0: the ranks do not run the same run" "$work/log" ||
    { echo "FAIL $name: rank 0 did not report it"; ok=0; }
  ! grep -q "interrupted by\|ended by the launcher\|no progress" "$work/log" ||
    { echo "FAIL $name: an interrupt or watchdog notice"; ok=0; }
  [ ! -e "$work/out" ] || { echo "FAIL $name: outputs were written"; ok=0; }
  [ "$elapsed" -le 30 ] || { echo "FAIL $name: the job took ${elapsed} s"; ok=0; }
  echo "$name: exit code $code after ${elapsed} s"
  if [ "$ok" -eq 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
check strategy 'ranks 2, 3 differ from ranks 0, 1 in run.strategy ('\''flat'\'' vs '\''tapa'\'')' \
  run.strategy=flat run.strategy=tapa
check seed 'ranks 2, 3 differ from ranks 0, 1 in run.seed (7 vs 8)' run.seed=7 run.seed=8
check steps 'ranks 2, 3 differ from ranks 0, 1 in run.steps (2 vs 3)' run.steps=2 run.steps=3
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
