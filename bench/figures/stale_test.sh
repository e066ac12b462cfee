#!/usr/bin/env bash
# The stale-figure check must fail when a README's figure or the kept data no longer matches:
# a copy of the READMEs and the data with one figure changed in each, checked by `figures`.
# Usage: stale_test.sh FIGURES SOURCE_DIR WORK_DIR
set -euo pipefail
figures=$1 src=$2 work=$3
copy() {  # a fresh copy of what `figures --check --source` reads
  rm -rf "$work/src"
  mkdir -p "$work/src/bench/fidelity" "$work/src/bench/figures" "$work/src/bench/study"
  cp "$src/README.md" "$work/src/"
  cp "$src/bench/README.md" "$work/src/bench/"
  cp "$src/bench/fidelity/README.md" "$work/src/bench/fidelity/"
  cp -r "$src/bench/figures/data" "$work/src/bench/figures/"
  cp -r "$src/bench/study/results" "$work/src/bench/study/"
  cp -r "$src/bench/results" "$work/src/bench/"
}
expect_stale() {  # what, then the text the failure must show
  local rc=0
  "$figures" --check --source "$work/src" --out "$work/out" >"$work/log" 2>&1 || rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "$2" "$work/log"; then
    echo "stale_test: $1 was not caught (exit $rc):" >&2
    cat "$work/log" >&2
    exit 1
  fi
  echo "stale_test: $1 caught"
}
copy
"$figures" --check --source "$work/src" --out "$work/out" >"$work/log" 2>&1 ||
  { echo "stale_test: the unchanged copy does not pass:" >&2; cat "$work/log" >&2; exit 1; }
# A quoted figure edited by hand.
sed -i 's/cocodiff \*\*\([0-9.]*\)x\*\* mean/cocodiff **9.99x** mean/' "$work/src/README.md"
expect_stale "a README figure edited by hand" "block 'headline' does not match"
# Data that the presets and the engine no longer give (the one-node all-to-all at 1 KB).
copy
python3 - "$work/src/bench/figures/data/aurora_a2a.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["rows"][0]["flat_us"] *= 1.5
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
"$figures" --render --source "$work/src" --out "$work/out" >/dev/null
expect_stale "data the presets no longer give" "aurora all-to-all at"
# A paper-scale figure the commands no longer give (usp's virtual time), with the block rendered
# from it: only the rerun of the paper-scale commands can catch it.
copy
python3 - "$work/src/bench/figures/data/paper_scale.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["rows"][0]["virtual_time_s"] *= 0.75
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
"$figures" --render --source "$work/src" --out "$work/out" >/dev/null
expect_stale "a paper-scale figure the commands no longer give" "paper-scale usp: virtual time"
