#!/usr/bin/env bash
# Regenerates every emulated figure the READMEs quote from the shipped presets: builds cocodiff,
# the study and the figures program in build/, runs bench/study/run_study.sh (the `cocodiff
# compare` tables, about 10 minutes) and the study on each cluster preset (Aurora, HGX H100;
# about 5-15 minutes each on a 2-core machine) and the paper-scale image (two runs of a second),
# keeps their JSON in bench/figures/data/ and rewrites the marked blocks of README.md, bench/README.md and bench/fidelity/README.md.
# CTest's readme_figures then checks them. Extra arguments go to the program (e.g. --jobs 4).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target cocodiff study figures
# bench/study/run_study.sh keeps what it finds: start it afresh.
find bench/study/results -mindepth 1 -delete 2>/dev/null || true
bash bench/study/run_study.sh build/apps/cocodiff >/dev/null
build/bench/figures/figures --write --out build/figures-out "$@"
