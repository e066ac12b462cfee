#!/usr/bin/env bash
# Runs one config on the emulator and under mpirun and checks that both report the same
# output_sha256 (the final latent's bytes).
# Usage: compare_backends.sh COCODIFF MPIEXEC NP CONFIG [--set k=v ...]
set -euo pipefail
bin=$1 mpiexec=$2 np=$3 config=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sha() { grep -o '"output_sha256": "[0-9a-f]*"' "$1/report.json" | grep -o '[0-9a-f]\{64\}'; }
"$bin" run "$config" "$@" --set emulator.trace=false --out "$work/emu" -q
timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" \
  "$bin" run "$config" "$@" --backend mpi --out "$work/mpi" > "$work/mpi.log"
# The MPI run's header describes MPI, not the emulator's workers and trace.
grep -q "^backend    MPI: one process per rank ($np)" "$work/mpi.log" ||
  { echo "FAIL: the MPI header does not describe MPI"; cat "$work/mpi.log"; exit 1; }
if grep -q "worker thread" "$work/mpi.log"; then
  echo "FAIL: the MPI header names emulator workers"; exit 1
fi
emu=$(sha "$work/emu")
mpi=$(sha "$work/mpi")
echo "emulator output_sha256 $emu"
echo "mpi      output_sha256 $mpi"
if [ -z "$emu" ] || [ "$emu" != "$mpi" ]; then
  echo "FAIL: the backends disagree"
  exit 1
fi
# A step cache skips the same steps on both backends.
skips() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("step_cache", {}).get("skipped_steps"))' "$1/report.json"; }
if [ "$(skips "$work/emu")" != "$(skips "$work/mpi")" ]; then
  echo "FAIL: the step cache skipped $(skips "$work/emu") on the emulator, $(skips "$work/mpi") on MPI"
  exit 1
fi
# The MPI report has the emulator's fields, measured.
for key in bytes_by_tier breakdown exposed_comm_s wire_bytes_per_element phases_wall_s; do
  grep -q "\"$key\"" "$work/mpi/report.json" || { echo "FAIL: the MPI report has no $key"; exit 1; }
done
# Bytes by tier in one unit on both backends (the run's wire bytes an element), and the same
# total: the tiers may differ where the emulated algorithm routes through other peers than MPI.
python3 - "$work/emu/report.json" "$work/mpi/report.json" <<'PY' || exit 1
import json, sys
e, m = (json.load(open(p)) for p in sys.argv[1:3])
if e["wire_bytes_per_element"] != m["wire_bytes_per_element"]:
    sys.exit("FAIL: bytes_by_tier in %s bytes an element on the emulator, %s on MPI"
             % (e["wire_bytes_per_element"], m["wire_bytes_per_element"]))
te, tm = sum(e["bytes_by_tier"].values()), sum(m["bytes_by_tier"].values())
if abs(te - tm) > 1e-3 * max(te, tm):
    sys.exit("FAIL: %d bytes on the emulator's tiers, %d on MPI's" % (te, tm))
print("bytes by tier: emulator %d, MPI %d, %s bytes an element" % (te, tm, e["wire_bytes_per_element"]))
PY
echo "1 passed, 0 failed"
