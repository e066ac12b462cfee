#!/usr/bin/env bash
# clang-format (check only) on every project source, and clang-tidy (bugprone-*, performance-*,
# see .clang-tidy) on the modules whose translation units are light enough to analyse in CI:
# core, net_models, emulator, mpi_backend, the runner, tune and calibrate libraries, apps. Needs a configured build dir (compile commands).
# Usage: bash scripts/lint.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
files=$(git ls-files '*.cpp' '*.hpp')
echo "lint: clang-format on $(echo "$files" | wc -l) files"
echo "$files" | xargs clang-format --dry-run -Werror
tidy_files=$(git ls-files 'core/*.cpp' 'net_models/*.cpp' 'emulator/*.cpp' 'mpi_backend/*.cpp' 'runner/*.cpp' 'tune/*.cpp' \
  'calibrate/*.cpp' 'apps/*.cpp')
echo "lint: clang-tidy on $(echo "$tidy_files" | wc -l) files"
if ! out=$(echo "$tidy_files" | xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet \
  --extra-arg=-Wno-unknown-warning-option 2>&1); then
  echo "$out" | grep -v "warnings generated\|Suppressed\|header-filter\|treated as error"
  exit 1
fi
echo "lint: clean"
