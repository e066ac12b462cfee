#!/usr/bin/env bash
# Under mpirun, bad input that every rank detects alike (a rank count that does not match the
# topology, an out-of-range --set value, hosts that do not match the topology's nodes) ends the job with exit code 2 and one message, from
# one rank, not one per rank; no rank prints an interrupt notice, and no outputs are written.
# Usage: mpi_bad_input.sh COCODIFF MPIEXEC CONFIG(4 ranks)
set -uo pipefail
bin=$1 mpiexec=$2 config=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0
check() {  # name np expected-message [extra args...]
  local name=$1 np=$2 want=$3
  shift 3
  local start=$SECONDS
  timeout 60 "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$bin" run "$config" \
    --backend mpi --out "$work/out" -q "$@" > "$work/log" 2>&1
  local code=$? elapsed=$((SECONDS - start)) ok=1
  cat "$work/log"
  [ "$code" -eq 2 ] || { echo "FAIL $name: exit code $code, expected 2 (124 = hang)"; ok=0; }
  local n
  n=$(grep -c -F -e "$want" "$work/log")
  [ "$n" -eq 1 ] || { echo "FAIL $name: '$want' printed $n times, expected once"; ok=0; }
  ! grep -q "interrupted by\|ended by the launcher" "$work/log" ||
    { echo "FAIL $name: an interrupt notice"; ok=0; }
  [ ! -e "$work/out" ] || { echo "FAIL $name: outputs were written"; ok=0; }
  [ "$elapsed" -le 20 ] || { echo "FAIL $name: the job took ${elapsed} s"; ok=0; }
  echo "$name: exit code $code after ${elapsed} s"
  if [ "$ok" -eq 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
check rank_count 3 "the MPI job has 3 ranks but the topology (2 tile x 2 gpu x 1 node) has 4"
check bad_set 4 "--set run.steps: key 'run.steps': expected an integer in [1, 100000], found 0" \
  --set run.steps=0
check memory_limit 4 "more than emulator.memory_limit = 1.00 MiB (--set emulator.memory_limit)" \
  --set emulator.memory_limit=1MiB
# Two nodes of the topology on this one host: the placement check fails on every rank, and one
# says so, naming the key that skips it.
check host_placement 8 "or --set mpi.check_hosts=false to run the topology on these hosts" \
  --set cluster.nodes=2
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
