#!/usr/bin/env bash
# Fits every measured collective sweep with `cocodiff calibrate` and keeps each fit's per-point
# table in bench/fidelity/results/calibrate/NAME.txt (the cluster files it writes are left in a
# temporary directory: configs/clusters/h100-shm.toml is the one shipped): the device side (CUDA-graph sweep, host off the
# critical path), then the eager sweeps per transport and per op (NCCL picks its algorithm per
# op, so each op gets its own figures), on 2 and 4 GPUs of both machines that measured them.
# Usage: bash bench/fidelity/calibrate_collectives.sh [COCODIFF] (default build/apps/cocodiff)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/apps/cocodiff}
m=configs/measurements
out=bench/fidelity/results/calibrate
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fit() {  # name files... -- args...
  local name=$1
  shift
  local files=()
  while [ "$1" != "--" ]; do files+=("$1"); shift; done
  shift
  "$bin" calibrate "${files[@]}" --cluster "${cluster:-hgx-h100}" --set cluster.nodes=1 "$@" \
    --out "$tmp/$name.toml" > "$out/$name.txt" 2>&1 || { cat "$out/$name.txt"; exit 1; }
  sed -i -e "s#$PWD/##g" -e "s#$tmp/#FIT_DIR/#g" "$out/$name.txt"
  echo "== $name"
  grep -E "^#   [a-z_]+ [0-9]+ ranks" "$out/$name.txt"
}
fit graph_nvlink $m/h100x2/collectives_graph_nvlink.csv -- \
  --set cluster.device.host.collective_issue_us=0 --set cluster.library.local_copy_gbytes_per_s=1000 -w 0 -n 1
# the same on 2 and 4 GPUs (the 4-GPU graph sweep came from a later machine, h100x4-third)
fit graph_nvlink_2_4 $m/h100x2/collectives_graph_nvlink.csv $m/h100x4-third/collectives_graph_nvlink.csv -- \
  --set cluster.device.host.collective_issue_us=0 --set cluster.library.local_copy_gbytes_per_s=1000 -w 0 -n 1
for tr in nvlink shm socket; do
  files=()
  for d in h100x4 h100x4-repeat h100x4-third h100x2; do
    [ -f $m/$d/collectives_$tr.csv ] && files+=($m/$d/collectives_$tr.csv)
  done
  for op in all_to_all all_gather reduce_scatter sendrecv; do
    # the switch's per-pair bandwidth fitted apart from its links' (a lone transfer against
    # several sharing a GPU's link); it starts below the link's so that either can bind. Over
    # NVLink, a ring kernel's time on its own block (all-gather, reduce-scatter) is fitted from
    # 1 TB/s: the 2- and 4-GPU rings differ by it (configs/clusters/README.md); over shared
    # memory and sockets the sweeps show none
    local_copy=0
    [ $tr = nvlink ] && local_copy=1000
    fit "${tr}_$op" "${files[@]}" -- --ops $op --loss soft_l1 \
      --set cluster.links.nvlink.pair_bandwidth_gbytes_per_s=300 \
      --set cluster.library.local_copy_gbytes_per_s=$local_copy
  done
done
# Held out: a fit's figures as they are (every figure kept, nothing refitted) on other sweeps
held_out() {  # name fit_name op file
  local name=$1 fit_name=$2 op=$3 file=$4
  local keep=(links.nvlink.bandwidth_gbytes_per_s links.nvlink.pair_bandwidth_gbytes_per_s
              links.nvlink.latency_ns library.call_overhead_us library.message_overhead_us
              device.host.collective_issue_us)
  # the ring's own-block rate, where the fit had one (NVLink)
  case $op/$fit_name in all_gather/*nvlink* | reduce_scatter/*nvlink*) keep+=(library.local_copy_gbytes_per_s) ;; esac
  local args=()
  for k in "${keep[@]}"; do args+=(--keep "$k"); done
  "$bin" calibrate "$file" --cluster "$tmp/$fit_name.toml" --ops $op --no-protocol "${args[@]}" \
    --out "$tmp/$name.toml" > "$out/$name.txt" 2>&1 || { cat "$out/$name.txt"; exit 1; }
  sed -i -e "s#$PWD/##g" -e "s#$tmp/#FIT_DIR/#g" "$out/$name.txt"
  echo "== $name"
  grep -E "^#   [a-z_]+ [0-9]+ ranks" "$out/$name.txt"
}
# H200: each op fitted on the first 2-GPU host's sweeps (hgx-h200 as the base), then held against
# a second host's (h200x2-second) with the fit's figures as they are
for tr in nvlink shm; do
  for op in all_to_all all_gather reduce_scatter sendrecv; do
    local_copy=0
    [ $tr = nvlink ] && local_copy=1000
    cluster=hgx-h200 fit "h200_${tr}_$op" $m/h200x2/collectives_$tr.csv -- --ops $op --loss soft_l1 \
      --set cluster.links.nvlink.pair_bandwidth_gbytes_per_s=300 \
      --set cluster.library.local_copy_gbytes_per_s=$local_copy
    held_out "held_out_h200_${tr}_$op" "h200_${tr}_$op" $op $m/h200x2-second/collectives_$tr.csv
    # a 4-GPU H200 host's sweeps (2 and 4 ranks; 4 is a rank count the H200 fits have not seen),
    # predicted with the 2-GPU fit's figures as they are, then fitted on their own
    held_out "held_out_h200x4_${tr}_$op" "h200_${tr}_$op" $op $m/h200x4/collectives_$tr.csv
    cluster=hgx-h200 fit "h200x4_${tr}_$op" $m/h200x4/collectives_$tr.csv -- --ops $op --loss soft_l1 \
      --set cluster.links.nvlink.pair_bandwidth_gbytes_per_s=300 \
      --set cluster.library.local_copy_gbytes_per_s=$local_copy
  done
done
# H200 over sockets (2 and 4 ranks of the 4-GPU host's second lease)
for op in all_to_all all_gather reduce_scatter sendrecv; do
  cluster=hgx-h200 fit "h200x4_socket_$op" $m/h200x4-repeat/collectives_socket.csv -- --ops $op --loss soft_l1 \
    --set cluster.links.nvlink.pair_bandwidth_gbytes_per_s=300 --set cluster.library.local_copy_gbytes_per_s=0
done
# Held out: a further 4-GPU host's sweeps on 3 GPUs (a rank count no fit has seen), 4 and 2,
# predicted with each NVLink fit's figures as they are (every figure kept, nothing refitted)
for op in all_to_all all_gather reduce_scatter sendrecv; do
  held_out held_out_threes_nvlink_$op nvlink_$op $op $m/h100x4-threes/collectives_nvlink.csv
done
