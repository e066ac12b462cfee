#!/usr/bin/env bash
# Sets up (Debian packages), builds the cocodiff program and runs the quickstart: a picture
# (an ankle boot) from the trained flux1-fmnist model with real math on 2 emulated Aurora nodes
# (24 tiles). Outputs: out/quickstart/image.png, preview.png, report.json, trace.json,
# timeline.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target cocodiff
build/apps/cocodiff run configs/quickstart.toml --out out/quickstart "$@"
