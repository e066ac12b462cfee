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
# A figure edited by hand inside each block of bench/README.md's section B (the first number of
# its table's first row gets a 9 in front of it), all in one copy: the check must name each block.
blocks=(paper-scale emulator-phantom emulator-replay emulator-collective emulator-grid
  emulator-large emulator-workers emulator-math net-models-flows mpi-vs-emulator
  vmajor-quality runtime v-similarity inpaint-default inpaint-sweep inpaint-lower memory-estimate
  memory-estimate-tiles)
copy
python3 - "$work/src/bench/README.md" "${blocks[@]}" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
for block in sys.argv[2:]:
    i = text.index(f"<!-- figures:{block} -->")
    j = text.index(f"<!-- /figures:{block} -->", i)
    sep = re.compile(r"^\|---.*$", re.M).search(text, i, j)
    row = re.compile(r"\| ([0-9][0-9.,]*)[ |]").search(text, sep.end(), j) if sep else None
    if row is None:
        sys.exit(f"no table row with a number in block {block}")
    text = text[:row.start(1)] + "9" + text[row.start(1):]
open(path, "w").write(text)
PY
rc=0
check || rc=$?
for block in "${blocks[@]}"; do
  if [ "$rc" -ne 1 ] || ! grep -q "block '$block' does not match" "$work/log"; then
    echo "tables_stale_test: a hand edit in block $block was not caught (exit $rc):" >&2
    cat "$work/log" >&2
    exit 1
  fi
  echo "tables_stale_test: a hand edit in block $block caught"
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
# Changed stored results of the trained-model and memory tables: each must name its block.
changed() {  # file, block, then a Python statement on the loaded JSON `d`
  copy
  python3 - "$work/src/bench/results/$1" "$3" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
  expect_stale "a changed bench/results/$1" "$2"
}
changed v_similarity.json v-similarity 'd["rows"][0]["mean_relative_change"] *= 1.5'
changed inpaint_quality.json inpaint-default 'd["rows"][0]["psnr_gt_db"]["median"] += 1'
changed inpaint_quality.json inpaint-sweep 'd["rows"][-1]["mse_exact"]["median"] *= 2'
changed inpaint_quality_lower.json inpaint-lower 'd["rows"][-1]["ssim_exact"]["median"] /= 2'
changed memory_estimate.json memory-estimate \
  'next(r for r in d["rows"] if r["group"] == "configs")["peak_rss_bytes"] *= 2'
changed memory_estimate.json memory-estimate-tiles \
  'next(r for r in d["rows"] if r["group"] == "tiles")["memory_estimate_bytes"] *= 2'
