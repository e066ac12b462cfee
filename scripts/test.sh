#!/usr/bin/env bash
# Sets up (Debian packages), builds (Release) and runs the whole test suite with CTest.
# Usage: bash scripts/test.sh            (build dir: build/)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
