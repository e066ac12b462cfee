#!/usr/bin/env bash
# The multi-GPU measurement suite behind configs/measurements/h100-multi/: one torchrun launch
# per NCCL transport (NVLink, shared memory, sockets) over every GPU of the host, each writing
# its CSVs and nccl-tests-format logs into OUT, then OUT.tar.gz.
# Usage: bash bench/fidelity/gpu_suite.sh OUT [full|repeat|pair|quad|concurrency|breakdown|blocking|callforms|profile|threes|threesteps|threesteps1024|interference|hostbeside|chunks|sizes|profile1|pace|clocks|host1|hostx|hostrs|hostcopy]
#   full    collectives (4 ops, 2..all GPUs, 1 KiB-1 GiB), kernel device and host times,
#           interference, whole steps on 1..all GPUs (about 9 minutes on 4 H100s)
#   repeat  on another machine: host times, whole steps (NVLink and shared memory) and the
#           socket sweeps (about 4 minutes on 4 H100s)
#   pair    a machine of two GPUs in one call of under 10 minutes: what full measures over
#           NVLink and shared memory (no sockets), then the collectives again captured in CUDA
#           graphs (device time per call, the host's issue cost off the critical path)
#   quad    a machine of four GPUs in one call of under 10 minutes: collectives, interference,
#           host times and whole steps over NVLink, collectives and steps over shared memory,
#           then the collectives in CUDA graphs (the kernel tables of a two-GPU run stand: a
#           kernel runs on one GPU); OUT.tar.gz is rewritten after each launch
#   concurrency  the one-GPU step and single kernels on one GPU while the others idle, then on
#           every GPU at once without communication (about 2 minutes)
#   breakdown  flat steps on 2..all GPUs over NVLink split into their blocking exchanges and
#           the rest (CUDA events per rank), then whole steps of every strategy in the same
#           launch, then the breakdown again over shared memory (about 6 minutes on 4 H100s)
#   blocking  an all-to-all between compute kernels, waited for, against the same call back
#           to back, 1-64 MiB per rank on 2..all GPUs over NVLink and shared memory
#   callforms  a flat 2048^2 step's image all-to-all between GEMMs, blocking or async+wait, on
#           fixed buffers or a fresh copy each call (NVLink, with `blocking`; shared memory)
#   profile  whole 2048^2 steps of every strategy on 2..all GPUs with the GPU's kernels recorded
#           (compute and NCCL kernel time a step), over shared memory and NVLink, then the same
#           steps unprofiled
#   threes  the collectives on 3 GPUs of the host (a rank count no fit has seen), then on 4 and 2
#           over NVLink; on 3 over shared memory; then the 3-GPU all-to-all and all-gather with
#           blocks that are not 16-byte aligned, into OUT/unaligned (about 2 minutes on 4 H100s)
#   threesteps  whole 1024^2 and 2048^2 steps of every strategy on 3 GPUs (each rank n / 3
#           image tokens, rounded down), over NVLink and shared memory; threesteps1024 the
#           1024^2 ones again on another host, with its 4- and 2-GPU steps over NVLink
#   hostbeside  the host's time to issue small ops while an all-to-all of 1 KiB-256 MiB (or a GEMM
#           chain) runs on another stream, against idle, then whole 1024^2 steps of every
#           strategy, on 2..all GPUs over NVLink and then shared memory (about 2 minutes each)
#   interference  a GEMM, an attention and a Q/K norm+RoPE beside an all-to-all on every GPU of
#           the host, over shared memory and NVLink (about 1 minute a transport)
#   chunks  on GPU 0 alone: a rank's Q preparation (RMSNorm, RoPE, all-to-all layout) whole and
#           in 2 and 4 head groups, and the received groups' concatenation, at the shapes of 2, 3
#           and 4 ranks at 1024^2 and 2048^2 (device time; about 1 minute)
#   profile1  the flat 1024^2 and 2048^2 steps on GPU 0 alone with every kernel recorded (compute
#           kernels' device time and the step's), then the same steps unprofiled (about 1 minute)
#   pace    on GPU 0 alone: a 4,608-token block's kernels as the tables time them, with the L2 cache
#           flushed before each call, and replayed for 1.5 s on end; then flat 1-GPU 1024^2 and 2048^2 steps;
#           the GPU's clocks and power sampled every 50 ms throughout (about 2 minutes)
#   clocks  on GPU 0 alone, the GPU's clocks and power sampled every 50 ms throughout: flat 1-GPU
#           steps at 512^2-2048^2, 32 each (steps_spans_nvlink.json: when each ran), then the 1024^2
#           and 2048^2 steps with every kernel recorded (about 3 minutes)
#   host1   on GPU 0 alone: each op's host issue time, then flat 1-GPU steps at 256^2, 512^2 (the
#           host issues slower than the GPU runs: host-bound on one rank), 768^2 and 1024^2, twice
#           in two launches (steps_nvlink.csv, steps_nvlink2.csv); then every strategy's step on GPU
#           0 exchanging over a group of one rank (steps1x_nvlink.csv; about 2 minutes)
#   hostx   on GPU 0 alone: each op's host issue time and the exchange's host path part by part
#           over a group of one rank (hostx_nvlink1.json), flat 1-GPU steps at 256^2 and 512^2, then
#           every strategy's step exchanging over a group of one rank and the parts again
#           (steps1x_nvlink.csv, hostx_nvlink2.json; about 2 minutes)
#   hostrs  on GPU 0 alone: flat 1-GPU steps at 256^2 and 512^2, then every strategy's step
#           exchanging over a group of one rank with PyTorch's default stream bookkeeping of
#           NCCL's tensors, with TORCH_NCCL_AVOID_RECORD_STREAMS=1, with the default again and
#           without again (steps1x_nvlink.csv, steps1x_nvlink_avoid.csv, steps1x_nvlink_again.csv,
#           steps1x_nvlink_avoid2.csv; about 90 s)
#   hostcopy  on GPU 0 alone: flat 1-GPU steps at 256^2 and 512^2, then every strategy's step
#           exchanging over a group of one rank (NCCL), the same with each exchange a copy on the
#           compute stream (--exchange-copy: the same tensors, no collective), NCCL again and the
#           copies again (steps1x_nvlink.csv, steps1c_nvlink.csv, steps1x_nvlink_again.csv,
#           steps1c_nvlink_again.csv; about 90 s)
#   sizes   whole steps of every strategy at 1536^2 and 3072^2, sizes no fit has seen, on 1..all
#           GPUs over NVLink, then on 2..all over shared memory (about 4 minutes on 2 H200s)
#   models  every shipped family on GPU 0 (bench/fidelity/models/run.sh OUT all, then OUT host): the
#           kernel grids by shape a device model is fitted from, whole forwards of every family's
#           reference (diffusers' classes; the validation set), and the host profile of each
#           (about 8 minutes on one H200: in three calls of under 10 minutes, run.sh OUT grid,
#           forwards and host apart)
set -euo pipefail
modes=" models full repeat pair quad concurrency breakdown blocking callforms profile threes threesteps threesteps1024 interference hostbeside chunks sizes profile1 pace clocks host1 hostx hostrs hostcopy "
if [ $# -lt 1 ] || [ $# -gt 2 ] || [[ $modes != *" ${2:-full} "* ]]; then
  echo "usage: bash bench/fidelity/gpu_suite.sh OUT [MODE]; MODE is one of:$modes(default full)" >&2
  exit 2
fi
out=$1
mode=${2:-full}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
if [ "$mode" = models ]; then  # one GPU, no NCCL: the models' own suite
  bash "$here/models/run.sh" "$out" all
  exec bash "$here/models/run.sh" "$out" host
fi
gpus=$(nvidia-smi -L | wc -l)
# NVLink multicast stays off (shared hosts); loopback for the bootstrap and gloo.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1 NCCL_DEBUG=INFO
nvidia-smi > "$out/nvidia_smi.txt" 2>&1 || true
nvidia-smi topo -m >> "$out/nvidia_smi.txt" 2>&1 || true

launch() {  # transport deadline_s args...
  local tr=$1 dl=$2
  shift 2
  local envs=()
  case $tr in
    shm) envs=(NCCL_P2P_DISABLE=1) ;;
    socket) envs=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1) ;;
  esac
  echo "=== $tr (deadline ${dl}s): $*"
  timeout -k 10 $((dl + 60)) env "${envs[@]}" torchrun --standalone --nproc_per_node="$gpus" "$here/measure_multi.py" "$out" \
    --transport "$tr" --deadline-s "$dl" "$@" > "$out/log_$tr.txt" 2>&1 || echo "launch $tr failed: $?"
  # which transport NCCL really took, and the script's own lines
  grep -E " via |NCCL version" "$out/log_$tr.txt" | sed -E 's/^[^ ]+ //' | sort | uniq -c | head -40 \
    > "$out/nccl_transport_$tr.txt" || true
  grep -vE "NCCL (INFO|WARN)" "$out/log_$tr.txt" | tail -60 || true
}

# GPU 0's clocks, power and throttle reasons every 50 ms from now on (the sampler's pid in
# $sampler, empty where nvidia-smi cannot sample), with the wall clock it started at.
sample_gpu0() {
  sampler=
  for reasons in clocks_event_reasons.active clocks_throttle_reasons.active ""; do
    q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu${reasons:+,$reasons}
    nvidia-smi -i 0 --query-gpu="$q" --format=csv,nounits -lms 50 > "$out/smi_samples.csv" 2>&1 &
    sampler=$!
    sleep 1
    kill -0 "$sampler" 2> /dev/null && break
    sampler=
  done
  echo "sampler ${sampler:-none}; clock at start $(date -u '+%Y-%m-%dT%H:%M:%S.%N') UTC, epoch $(date +%s.%N)" | tee "$out/smi_clock.txt"
}

if [ "$mode" = full ]; then
  launch nvlink 280 --parts collectives,interference,host,kernels,steps
  launch shm 160 --parts collectives,interference,steps --worlds 2,4
  launch socket 70 --parts collectives --max-bytes 268435456
elif [ "$mode" = pair ]; then
  launch nvlink 230 --parts collectives,interference,host,kernels,steps
  launch shm 100 --parts collectives,steps
  launch nvlink 90 --parts graphcoll
elif [ "$mode" = quad ]; then
  pack() { tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"; }
  launch nvlink 230 --parts collectives,interference,host,steps
  pack
  launch shm 130 --parts collectives,steps --worlds 2,4
  pack
  launch nvlink 80 --parts graphcoll --worlds "$gpus"
elif [ "$mode" = concurrency ]; then
  launch nvlink 200 --parts concurrency
elif [ "$mode" = callforms ]; then
  launch nvlink 120 --parts callforms,blocking
  launch shm 100 --parts callforms
elif [ "$mode" = profile ]; then
  worlds=$(printf '2\n%s\n' "$gpus" | sort -nu | paste -sd,)
  launch shm 170 --parts profile,steps --worlds "$worlds" --resolutions 2048 --steps 3
  launch nvlink 170 --parts profile,steps --worlds "$worlds" --resolutions 2048 --steps 3
elif [ "$mode" = threes ]; then
  launch nvlink 270 --parts collectives --worlds 3,4,2
  launch shm 150 --parts collectives --worlds 3 --ops all_to_all,all_gather,reduce_scatter
  # the 3-GPU sweeps again with blocks on no particular boundary (nccl-tests' sizes / 3)
  mkdir -p "$out/unaligned"
  unaligned_dl=120
  for tr in nvlink shm; do
    envs=()
    [ $tr = shm ] && envs=(NCCL_P2P_DISABLE=1)
    timeout -k 10 $((unaligned_dl + 60)) env "${envs[@]}" torchrun --standalone --nproc_per_node="$gpus" "$here/measure_multi.py" \
      "$out/unaligned" --transport $tr --deadline-s "$unaligned_dl" --parts collectives --worlds 3 \
      --ops all_to_all,all_gather --unaligned > "$out/unaligned/log_$tr.txt" 2>&1 || echo "unaligned $tr failed"
  done
elif [ "$mode" = threesteps ]; then
  launch nvlink 250 --parts steps --worlds 3
  launch shm 250 --parts steps --worlds 3
elif [ "$mode" = threesteps1024 ]; then
  launch nvlink 200 --parts steps --worlds 3,4,2 --resolutions 1024
  launch shm 150 --parts steps --worlds 3 --resolutions 1024
elif [ "$mode" = hostbeside ]; then
  launch nvlink 200 --parts hostbeside,steps --worlds "$(printf '2\n%s\n' "$gpus" | sort -nu | paste -sd,)" --resolutions 1024
  launch shm 200 --parts hostbeside,steps --worlds "$(printf '2\n%s\n' "$gpus" | sort -nu | paste -sd,)" --resolutions 1024
elif [ "$mode" = interference ]; then
  launch shm 120 --parts interference
  launch nvlink 120 --parts interference
elif [ "$mode" = profile1 ]; then
  gpus=1
  launch nvlink 200 --parts profile,steps --worlds 1 --resolutions 1024,2048 --steps 3
elif [ "$mode" = pace ]; then
  gpus=1
  sample_gpu0
  launch nvlink 150 --parts pace --worlds 1
  mv "$out/log_nvlink.txt" "$out/log_pace.txt"
  launch nvlink 120 --parts steps --worlds 1 --resolutions 1024,2048 --steps 8
  [ -n "$sampler" ] && kill "$sampler" 2> /dev/null || true
elif [ "$mode" = clocks ]; then
  gpus=1
  sample_gpu0
  launch nvlink 200 --parts steps --worlds 1 --resolutions 512,768,1024,1536,2048 --steps 30
  mv "$out/log_nvlink.txt" "$out/log_steps.txt"
  launch nvlink 200 --parts profile --worlds 1 --resolutions 1024,2048 --steps 8
  [ -n "$sampler" ] && kill "$sampler" 2> /dev/null || true
elif [ "$mode" = host1 ]; then
  gpus=1
  launch nvlink 200 --parts host,steps --worlds 1 --resolutions 256,512,768,1024 --steps 8
  mv "$out/log_nvlink.txt" "$out/log_nvlink1.txt"
  mv "$out/steps_nvlink.csv" "$out/steps_nvlink1.csv" 2> /dev/null || true
  launch nvlink 120 --parts steps --worlds 1 --resolutions 256,512,768,1024 --steps 8
  mv "$out/steps_nvlink.csv" "$out/steps_nvlink2.csv" 2> /dev/null || true
  mv "$out/steps_nvlink1.csv" "$out/steps_nvlink.csv" 2> /dev/null || true
  mv "$out/log_nvlink.txt" "$out/log_nvlink2.txt"
  launch nvlink 120 --parts steps --worlds 1 --resolutions 256,512,1024 --steps 8 --one-rank-exchange
elif [ "$mode" = hostx ]; then
  gpus=1
  launch nvlink 150 --parts host,hostx --worlds 1
  mv "$out/hostx_nvlink.json" "$out/hostx_nvlink1.json" 2> /dev/null || true
  mv "$out/log_nvlink.txt" "$out/log_nvlink1.txt"
  launch nvlink 120 --parts steps --worlds 1 --resolutions 256,512 --steps 8
  mv "$out/log_nvlink.txt" "$out/log_nvlink2.txt"
  launch nvlink 150 --parts hostx,steps --worlds 1 --resolutions 256,512 --steps 8 --one-rank-exchange
  mv "$out/hostx_nvlink.json" "$out/hostx_nvlink2.json" 2> /dev/null || true
elif [ "$mode" = hostrs ]; then
  gpus=1
  launch nvlink 120 --parts host,steps --worlds 1 --resolutions 256,512 --steps 8
  mv "$out/log_nvlink.txt" "$out/log_nvlink1.txt"
  for v in default avoid again avoid2; do
    if [ "${v#avoid}" != "$v" ]; then
      TORCH_NCCL_AVOID_RECORD_STREAMS=1 launch nvlink 120 --parts steps --worlds 1 --resolutions 256,512 --steps 8 --one-rank-exchange
    else
      launch nvlink 120 --parts steps --worlds 1 --resolutions 256,512 --steps 8 --one-rank-exchange
    fi
    for f in steps1x_nvlink.csv log_nvlink.txt env_nvlink.json; do
      mv "$out/$f" "$out/${f%.*}_$v.${f##*.}" 2> /dev/null || true
    done
  done
  for f in steps1x_nvlink.csv log_nvlink.txt env_nvlink.json; do
    mv "$out/${f%.*}_default.${f##*.}" "$out/$f" 2> /dev/null || true
  done
elif [ "$mode" = hostcopy ]; then
  gpus=1
  launch nvlink 120 --parts host,steps --worlds 1 --resolutions 256,512 --steps 8
  mv "$out/log_nvlink.txt" "$out/log_nvlink1.txt"
  for v in nccl copy nccl_again copy_again; do
    launch nvlink 120 --parts steps --worlds 1 --resolutions 256,512 --steps 8 --one-rank-exchange \
      $([ "${v#copy}" != "$v" ] && echo --exchange-copy)
    mv "$out/log_nvlink.txt" "$out/log_nvlink_$v.txt"
    k=1x
    [ "${v#copy}" != "$v" ] && k=1c
    a=
    [ "${v%_again}" != "$v" ] && a=_again
    mv "$out/steps${k}_nvlink.csv" "$out/steps${k}_nvlink$a.tmp" 2> /dev/null || true
  done
  for f in "$out"/steps1?_nvlink*.tmp; do
    [ -e "$f" ] && mv "$f" "${f%.tmp}.csv"  # none where every launch failed
  done
elif [ "$mode" = sizes ]; then
  launch nvlink 280 --parts steps --resolutions 1536,3072
  launch shm 200 --parts steps --resolutions 1536,3072 --worlds "$(printf '2\n%s\n' "$gpus" | sort -nu | paste -sd,)"
elif [ "$mode" = chunks ]; then
  launch nvlink 150 --parts chunks
elif [ "$mode" = blocking ]; then
  launch nvlink 120 --parts blocking
  launch shm 120 --parts blocking
elif [ "$mode" = breakdown ]; then
  launch nvlink 380 --parts breakdown,steps --worlds "$(printf '1\n2\n%s\n' "$gpus" | sort -nu | paste -sd,)"
  launch shm 150 --parts breakdown --worlds "$(printf '2\n%s\n' "$gpus" | sort -nu | paste -sd,)"
elif [ "$mode" = repeat ]; then
  launch nvlink 200 --parts host,steps
  launch shm 120 --parts steps --worlds 2,4
  launch socket 120 --parts collectives --max-bytes 268435456
fi
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
ls -la "$out"
