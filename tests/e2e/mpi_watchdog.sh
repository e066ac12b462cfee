#!/usr/bin/env bash
# Under mpirun with the progress watchdog on (mpi.progress_timeout_s = 3), a rank that stops
# (--inject-fault kind=hang on rank 2) ends the job with exit code 2 within the timeout plus 5 s
# of the stop, with a message naming rank 2; the stopped rank, ended by mpirun, says nothing
# else than that it was (when mpirun lets its line through); no outputs are written.
# With MODE "auto" the watchdog is the default one, its bound derived from the run (the floor
# and the multiple of the longest step lowered to 2 s and 3, mpi.progress_floor_s and
# mpi.progress_multiple, to keep the test short): the job must still end, within 35 s of the
# stop, with the same message.
# Usage: mpi_watchdog.sh COCODIFF MPIEXEC CONFIG(4 ranks) [fixed|auto]
set -uo pipefail
bin=$1 mpiexec=$2 config=$3 mode=${4:-fixed}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$mode" = auto ]; then
  timeout=30 watchdog=(--set mpi.progress_floor_s=2 --set mpi.progress_multiple=3)
  note='mpi.progress_timeout_s = "auto"'
else
  timeout=3 watchdog=(--progress-timeout 3) note='mpi.progress_timeout_s = 3)'
fi
start=$(date +%s.%N)
timeout 90 "$mpiexec" --allow-run-as-root --oversubscribe -np 4 "$bin" run "$config" \
  --backend mpi --inject-fault rank=2,step=1,kind=hang "${watchdog[@]}" \
  --out "$work/out" -q > "$work/log" 2>&1 &
job=$!
hang_at=""
while kill -0 "$job" 2> /dev/null; do  # the moment rank 2 stops
  if [ -z "$hang_at" ] && grep -q "rank 2: injected hang at step 1" "$work/log"; then
    hang_at=$(date +%s.%N)
  fi
  sleep 0.1
done
wait "$job"
code=$?
end=$(date +%s.%N)
cat "$work/log"
fail=0
[ "$code" -eq 2 ] || { echo "FAIL: exit code $code, expected 2 (124 = hang)"; fail=1; }
[ -n "$hang_at" ] || { echo "FAIL: rank 2 never reported its injected hang"; hang_at=$start; fail=1; }
after_hang=$(echo "$end - $hang_at" | bc)
total=$(echo "$end - $start" | bc)
grep -q "no progress for [0-9.]* s waiting in .*stopped rank(s): 2 " "$work/log" ||
  { echo "FAIL: no watchdog message naming rank 2"; fail=1; }
grep -q -F "$note" "$work/log" || { echo "FAIL: the message does not say '$note'"; fail=1; }
# Every rank that reports blames the stopped rank: none calls it mismatched communication.
! grep -q "mismatched communication" "$work/log" ||
  { echo "FAIL: a rank blamed mismatched communication"; fail=1; }
# The stopped rank's own notice ("ended by the launcher (SIGTERM ...") is not required: mpirun
# sends SIGKILL 1 s after SIGTERM and, as its MPI_ABORT note says, may drop the output of ranks it
# is killing, so on a loaded machine the line can be lost (tests/apps/signal_test.cpp checks the
# notice itself). Whatever rank 2 says after its hang must be that notice.
if grep "cocodiff: rank 2: " "$work/log" | grep -v "injected hang at step 1" |
  grep -qv "cocodiff: rank 2: ended by the launcher (SIGTERM"; then
  echo "FAIL: the stopped rank said something other than the launcher's notice"; fail=1
fi
[ "$(echo "$after_hang <= $timeout + 5" | bc)" -eq 1 ] ||
  { echo "FAIL: the job ended ${after_hang} s after the hang (limit $timeout + 5 s)"; fail=1; }
[ "$(echo "$total <= 60" | bc)" -eq 1 ] || { echo "FAIL: the job took ${total} s"; fail=1; }
[ ! -e "$work/out" ] || { echo "FAIL: outputs were written"; fail=1; }
echo "job ended ${after_hang} s after rank 2 stopped (${total} s in all) with exit code $code"
[ "$fail" -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit "$fail"
