#!/usr/bin/env bash
# Under mpirun, an injected fault on one rank ends the whole job within seconds with that rank's
# message and exit code 3; the faulting rank writes report.json (status "failed") and nothing else.
# Usage: mpi_fault.sh COCODIFF MPIEXEC CONFIG
set -uo pipefail
bin=$1 mpiexec=$2 config=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
timeout 60 "$mpiexec" --allow-run-as-root --oversubscribe -np 4 "$bin" run "$config" \
  --backend mpi --inject-fault rank=2,step=1 --out "$work/out" -q > "$work/log" 2>&1
code=$?
elapsed=$(( $(date +%s) - start ))
cat "$work/log"
fail=0
[ "$code" -eq 3 ] || { echo "FAIL: exit code $code, expected 3 (124 = hang)"; fail=1; }
grep -q "rank 2: injected fault at step 1" "$work/log" || { echo "FAIL: no rank message"; fail=1; }
[ "$elapsed" -le 30 ] || { echo "FAIL: the job took ${elapsed} s to end"; fail=1; }
grep -q '"status": "failed"' "$work/out/report.json" || { echo "FAIL: no failed report"; fail=1; }
grep -q '"rank": 2' "$work/out/report.json" || { echo "FAIL: the report names no rank 2"; fail=1; }
[ ! -e "$work/out/image.png" ] || { echo "FAIL: an image was written"; fail=1; }
echo "job ended after ${elapsed} s with exit code $code"
[ "$fail" -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit "$fail"
