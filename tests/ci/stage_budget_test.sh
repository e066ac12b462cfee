#!/usr/bin/env bash
# A CI stage that cannot run or does not finish inside its budget makes scripts/ci.sh exit 1 and
# says FAILED; it is never reported as passed.
# Usage: stage_budget_test.sh SOURCE_DIR
set -uo pipefail
src=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

# No time left in the CI budget: both stages fail at once, without running.
out=$(COCODIFF_CI_ELAPSED_S=100000 bash "$src/scripts/ci.sh" asan tsan 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc with no CI time left, expected 1: $out"
for s in asan tsan; do
  echo "$out" | grep -Eq "^=== ci stage $s +0m0[0-9]s  FAILED: did not finish in" ||
    fail "stage $s not reported as failed: $out"
done

# A stage stopped by its own budget (the test stage "stall" sleeps past its 1 s) fails too.
t0=$SECONDS
out=$(bash "$src/scripts/ci.sh" stall 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "exit $rc for a stage over its budget, expected 1: $out"
echo "$out" | grep -Eq "^=== ci stage stall +0m0[0-9]s  FAILED: did not finish in 1s \\(stage budget 1s" || fail "no FAILED line: $out"
[ $((SECONDS - t0)) -lt 10 ] || fail "the stage was not stopped at its budget"

# An unknown stage is a usage error.
bash "$src/scripts/ci.sh" nope > /dev/null 2>&1
[ $? -eq 2 ] || fail "unknown stage: expected exit 2"
echo "ok"
