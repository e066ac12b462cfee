#!/usr/bin/env bash
# Sets up (Debian packages), builds (Release) and runs the whole test suite with CTest.
# Usage: bash scripts/test.sh            (build dir: build/)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
# ccache (installed by setup.sh): a rebuild, and the profile-guided build of CI's pgo stage
# (scripts/build_pgo.sh), take what this build compiled the same way from its cache.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
