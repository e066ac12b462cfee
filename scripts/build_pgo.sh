#!/usr/bin/env bash
# Builds the cocodiff program with profile-guided optimisation (GCC): an instrumented build
# (<dir>-gen/) runs a training set of emulated runs, then <dir>/ is compiled from the profile
# they wrote. The program gives the same outputs and timelines as the plain Release build and
# takes about 7% less CPU on large phantom runs (bench/HISTORY.md, "Profile-guided build").
# The training set: every strategy in phantom mode on 8 and on 128 Aurora nodes (FLUX.1-dev,
# 2048^2) and on 4 HGX H100 nodes, and the quickstart's real-math picture, one worker each.
# Usage: bash scripts/build_pgo.sh [dir]      (default build-pgo; then cmake --install <dir>)
# Env:   COCODIFF_PGO_QUICK=1 leaves out the 128-node runs (CI: it checks that the build gives the
#        same hashes, not how fast it is; those runs are half the training's time) and profiles
#        only the libraries a run spends its time in (core, collectives, network models,
#        emulator, dit: COCODIFF_PGO_TARGETS); the commands and the rest, half the compile time,
#        are compiled as the Release build compiles them, from ccache's copy of that build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dir=${1:-build-pgo}
gen="$dir-gen"
mkdir -p "$dir"
profile="$(cd "$dir" && pwd)/pgo-profile"
rm -rf "$profile" "$gen/pgo-train"
jobs=$(nproc)
opts=()
! command -v ccache >/dev/null || opts+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
[ "${COCODIFF_PGO_QUICK:-0}" != 1 ] ||
  opts+=("-DCOCODIFF_PGO_TARGETS=cocodiff_core;cocodiff_collectives;cocodiff_net_models;cocodiff_emulator;cocodiff_dit")
cmake -S . -B "$gen" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOCODIFF_PGO=generate \
  -DCOCODIFF_PGO_DIR="$profile" -DCOCODIFF_BUILD_TESTS=OFF -DCOCODIFF_BUILD_BENCH=OFF \
  -DCOCODIFF_PGO_TARGETS= "${opts[@]}" >/dev/null
cmake --build "$gen" -j "$jobs" --target cocodiff

train() {  # name, then cocodiff run arguments
  local name=$1
  shift
  echo "build_pgo: training run $name"
  "$gen/apps/cocodiff" run "$@" --set emulator.workers=1 --out "$gen/pgo-train/$name" >/dev/null
}
phantom=(configs/flux1-tiny-24tiles.toml --set run.math=skip --set model.preset=flux1-dev
  --set run.resolution=2048 --set ulysses.uneven_heads=true --set emulator.trace=false)
for s in flat tapa v_first cocodiff usp; do
  train "$s-aurora-8" "${phantom[@]}" --set run.strategy=$s --set cluster.preset=aurora \
    --set cluster.nodes=8 --set run.steps=3
  [ "${COCODIFF_PGO_QUICK:-0}" = 1 ] ||
    train "$s-aurora-128" "${phantom[@]}" --set run.strategy=$s --set cluster.preset=aurora \
      --set cluster.nodes=128 --set run.steps=1
  train "$s-hgx-4" "${phantom[@]}" --set run.strategy=$s --set cluster.preset=hgx-h100 \
    --set cluster.nodes=4 --set run.steps=2
done
train quickstart configs/quickstart.toml --set run.steps=4
train quickstart-cocodiff configs/quickstart.toml --set run.steps=4 --set run.strategy=cocodiff

cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOCODIFF_PGO=use \
  -DCOCODIFF_PGO_DIR="$profile" -DCOCODIFF_PGO_TARGETS= "${opts[@]}" >/dev/null
cmake --build "$dir" -j "$jobs" --target cocodiff
echo "build_pgo: $dir/apps/cocodiff"
