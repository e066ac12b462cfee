#!/usr/bin/env bash
# bench/README.md's tables of stored results must fail `figures --check --blocks-only` when a
# figure in one is edited by hand or the stored JSON it is rendered from changes: a copy of the
# READMEs and data with one figure changed at a time. Runs nothing but `figures` (a second).
# Usage: tables_stale_test.sh FIGURES SOURCE_DIR WORK_DIR
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
check() { "$figures" --check --blocks-only --source "$work/src" --out "$work/out" >"$work/log" 2>&1; }
expect_stale() {  # what, then the block the failure must name
  local rc=0
  check || rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "block '$2' does not match" "$work/log"; then
    echo "tables_stale_test: $1 was not caught (exit $rc):" >&2
    cat "$work/log" >&2
    exit 1
  fi
  echo "tables_stale_test: $1 caught"
}
copy
check || { echo "tables_stale_test: the unchanged copy does not pass:" >&2; cat "$work/log" >&2; exit 1; }
# A figure edited by hand inside each block of bench/README.md's section B: the first table row's
# first number gets a 9 in front of it.
for block in paper-scale emulator-phantom emulator-replay emulator-collective emulator-grid \
    emulator-large; do
  copy
  python3 - "$work/src/bench/README.md" "$block" <<'PY'
import re, sys
path, block = sys.argv[1], sys.argv[2]
text = open(path).read()
open_m, close_m = f"<!-- figures:{block} -->", f"<!-- /figures:{block} -->"
i = text.index(open_m)
j = text.index(close_m, i)
body = text[i:j]
sep = re.search(r"^\|---.*$", body, re.M)
row = re.compile(r"\| ([0-9][0-9.,]*)[ |]").search(body, sep.end()) if sep else None
if row is None:
    sys.exit(f"no table row with a number in block {block}")
start = i + row.start(1)
text = text[:start] + "9" + text[start:]
open(path, "w").write(text)
PY
  expect_stale "a hand edit in block $block" "$block"
done
# Stored results that no longer give the block (the usp row's replay-on CPU seconds).
copy
python3 - "$work/src/bench/results/emulator_replay.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["rows"][0]["median_cpu_s_replay_on"] *= 1.5
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
expect_stale "a changed bench/results/emulator_replay.json" "emulator-replay"
# A changed paper-scale result (its virtual time).
copy
python3 - "$work/src/bench/figures/data/paper_scale.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["rows"][0]["virtual_time_s"] *= 0.75
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
expect_stale "a changed paper_scale.json" "paper-scale"
