#!/usr/bin/env bash
# The shape-keyed kernel grids, the whole-model forwards and the host profile of bench/fidelity/models
# on one GPU.
# Usage: bash bench/fidelity/models/run.sh OUT [grid|forwards|forwards-a|forwards-b|host|all|smoke]
#   grid        microbench.py, full grids (gemm.csv, attention.csv, memory.csv, env_grid.json;
#               budget 420 s; 187 s on one H200, stopped at 8 minutes)
#   forwards    forwards.py, every family (forwards.csv, env_forwards.json; budget 480 s; 147 s on
#               one H200, stopped at 9 minutes)
#   forwards-a  DiT-XL/2, SD3.5 Medium, FLUX.1-dev, SD3.5 Large (forwards_a.csv, env_forwards_a.json)
#   forwards-b  Qwen-Image, FLUX.2-dev (forwards_b.csv, env_forwards_b.json); after either half,
#               forwards.csv is rebuilt from the halves present
#   graph       forwards.py --mode graph, every family: each forward captured into a CUDA graph and
#               replayed (forwards.csv, env_graph.json; budget 420 s)
#   compile     forwards.py --mode compile: torch.compile (inductor, default mode) at batch 1, 512^2 and
#               1024^2 (DiT: 256^2 and 512^2; Wan: 832x480, 33 frames) (forwards.csv,
#               env_compile.json; budget 480 s; each case compiles for its shape, 23-78 s)
#   host        host_profile.py, every family (host_ops.csv, host_blocks.csv, host_issue.csv,
#               env_host.json; budget 300 s, stopped at 6 minutes; time not yet measured)
#   all         grid, then forwards (about 6 minutes on one H200, at most 17 with both deadlines;
#               where one command is limited to 10 minutes, run the two apart); not host
#   smoke       the three scripts with --quick into OUT/smoke/ (tiny grids, tiny models; grid and
#               forwards 40 s on one H200, host not yet measured)
# The diffusers source tree is DIFFUSERS_SRC (default: .cache/diffusers-src of this repository,
# holding diffusers/ and COMMIT); PYTHON picks the interpreter (default python3).
set -euo pipefail
modes=" grid forwards forwards-a forwards-b graph compile host all smoke "
if [ $# -lt 1 ] || [ $# -gt 2 ] || [[ $modes != *" ${2:-all} "* ]]; then
  echo "usage: bash bench/fidelity/models/run.sh OUT [MODE]; MODE is one of:$modes(default all)" >&2
  exit 2
fi
out=$1
mode=${2:-all}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
src=${DIFFUSERS_SRC:-$repo/.cache/diffusers-src}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,POWER; } > "$out/nvidia_smi.txt" 2>&1 || true

# part NAME DEADLINE_S SCRIPT ARGS...: runs SCRIPT into OUT/.part_NAME, then moves its CSVs to OUT
# (forwards.csv of a half renamed forwards_a.csv / forwards_b.csv) and env.json to OUT/env_NAME.json
part() {
  local name=$1 dl=$2 script=$3
  shift 3
  local dir="$out/.part_$name" rc=0
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "=== $name (stopped after ${dl}s): $script $*"
  timeout -k 10 "$dl" "$py" "$here/$script" "$dir" "$@" > "$out/log_$name.txt" 2>&1 || rc=$?
  [ $rc -ne 0 ] && echo "$name: exit code $rc (124: stopped by the deadline)" | tee -a "$out/log_$name.txt"
  for f in "$dir"/*.csv; do
    [ -e "$f" ] || continue
    b=$(basename "$f")
    case $name in
      forwards_a | forwards_b) [ "$b" = forwards.csv ] && b="forwards_${name#forwards_}.csv" ;;
    esac
    mv "$f" "$out/$b"
  done
  [ -e "$dir/env.json" ] && mv "$dir/env.json" "$out/env_$name.json"
  rm -rf "$dir"
  tail -5 "$out/log_$name.txt"
}

merge_halves() {
  local parts=()
  for h in a b; do [ -e "$out/forwards_$h.csv" ] && parts+=("$out/forwards_$h.csv"); done
  [ ${#parts[@]} -gt 0 ] && awk 'FNR == 1 && NR != 1 { next } { print }' "${parts[@]}" > "$out/forwards.csv"
  return 0
}

half_a=dit-xl-2,sd35-medium,flux1-dev,sd35-large
half_b=qwen-image,flux2-dev
case $mode in
  grid) part grid 480 microbench.py --budget-s 420 ;;
  forwards) part forwards 540 forwards.py --diffusers "$src" --budget-s 480 ;;
  forwards-a) part forwards_a 540 forwards.py --diffusers "$src" --budget-s 480 --families "$half_a"; merge_halves ;;
  forwards-b) part forwards_b 540 forwards.py --diffusers "$src" --budget-s 480 --families "$half_b"; merge_halves ;;
  graph) part graph 480 forwards.py --diffusers "$src" --budget-s 420 --mode graph ;;
  compile)
    part compile 560 forwards.py --diffusers "$src" --budget-s 480 --mode compile \
      --cases 1024x1024:1,256x256:1,512x512:1,832x480:1:33 ;;
  host) part host 360 host_profile.py --diffusers "$src" --budget-s 300 ;;
  all)
    part grid 480 microbench.py --budget-s 420
    part forwards 540 forwards.py --diffusers "$src" --budget-s 480
    ;;
  smoke)
    out="$out/smoke"
    mkdir -p "$out"
    part grid 60 microbench.py --quick --budget-s 45
    part forwards 90 forwards.py --diffusers "$src" --quick --budget-s 70
    part host 90 host_profile.py --diffusers "$src" --quick --budget-s 70
    part graph 60 forwards.py --diffusers "$src" --quick --budget-s 45 --mode graph
    part compile 150 forwards.py --diffusers "$src" --quick --budget-s 120 --mode compile \
      --families dit-xl-2,flux1-dev,wan2.1-t2v-1.3b
    ;;
esac
ls -l "$out"
