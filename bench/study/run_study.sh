#!/usr/bin/env bash
# The strategy study: `cocodiff compare` on Aurora for FLUX.1-dev and SD3.5 Large (phantom math,
# full-size shapes) at 1024^2 and 2048^2 on 1, 2, 4, 8 nodes, and a small FLUX.1-family model
# with real math at two V-Major thresholds. Results: bench/study/results/*/compare.json, and
# bench/study/results/summary.md (python3 summarize.py).
#   bench/study/run_study.sh [path/to/cocodiff]
# Phantom runs use 2 denoising steps (v_major.warmup_steps = 1: one full step, one selective
# step) to bound the wall time; virtual time per step is what the speedups are about.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-$root/build/apps/cocodiff}"
out="$here/results"
mkdir -p "$out"
strategies="flat,tapa,v_first,pipeline,cocodiff"
for model in flux1-dev sd35-large; do
  for res in 1024 2048; do
    for nodes in 1 2 4 8; do
      name="${model}_${res}_${nodes}n"
      [ -f "$out/$name/compare.json" ] && continue
      echo "== $name" >&2
      "$bin" compare "$root/configs/flux1-tiny-24tiles.toml" --strategies "$strategies" \
        --set model.preset="$model" --set run.math=skip --set run.resolution="$res" \
        --set cluster.nodes="$nodes" --set run.steps=2 --set v_major.warmup_steps=1 \
        --set ulysses.uneven_heads=true --out "$out/$name" > "$out/$name.txt"
    done
  done
done
# Real math, small model: quality of V-Major at four thresholds (12 steps, 2 warm-up).
for thr in 0.05 0.2 0.5 1.0; do
  name="flux1-tiny_real_thr${thr}"
  [ -f "$out/$name/compare.json" ] && continue
  echo "== $name" >&2
  "$bin" compare "$root/configs/flux1-tiny-24tiles.toml" --strategies "$strategies" \
    --set run.steps=12 --set v_major.threshold="$thr" --set v_major.block_tokens=16 \
    --out "$out/$name" > "$out/$name.txt"
done
# Real math, the trained quickstart model: each data-dependent acceleration on each strategy, with
# its bytes and quality, PipeFusion's (4 stages of 6-tile Ulysses, stale K/V after one warm-up
# step) beside them, and the fastest entry that keeps a 33 dB preview.
name="quickstart_techniques"
if [ ! -f "$out/$name/compare.json" ]; then
  echo "== $name" >&2
  "$bin" compare "$root/configs/quickstart.toml" --strategies flat,tapa,cocodiff,pipefusion \
    --techniques fp8,residual,teacache,teacache=0.25,first_block=0.12 --lossy 33 \
    --out "$out/$name" > "$out/$name.txt"
fi
# The same on video: the trained wan-fmnist model (configs/video.toml: 8 frames of 24 x 24, 20
# steps of true CFG, 24 tiles), flat Ulysses over the 24 tiles (6 heads: an uneven split).
name="wan-fmnist_video_techniques"
if [ ! -f "$out/$name/compare.json" ]; then
  echo "== $name" >&2
  "$bin" compare "$root/configs/video.toml" --strategies flat,tapa,cocodiff \
    --set parallel.ulysses_degree=24 --set parallel.ring_degree=1 --set ulysses.uneven_heads=true \
    --techniques fp8,residual,teacache,first_block --lossy 33 --out "$out/$name" > "$out/$name.txt"
fi
python3 "$here/summarize.py" "$out" > "$out/summary.md"
cat "$out/summary.md"
