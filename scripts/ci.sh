#!/usr/bin/env bash
# CI stages that run after the main test suite (bash scripts/test.sh: Release build, whole CTest
# suite, ~40 min of the 90 on a 2-core machine), each timed and held to a budget (below):
#   lint  scripts/lint.sh on build/ (configured by scripts/test.sh): clang-format check of every
#         source, clang-tidy (bugprone-*, performance-*) on core, net_models, emulator,
#         mpi_backend and apps.
#   fuzz  libFuzzer targets of tests/fuzz, built in the asan stage's build (clang-14, ASan +
#         UBSan, coverage-instrumented); each target runs over its
#         checked-in corpus for COCODIFF_FUZZ_RUNS inputs or COCODIFF_FUZZ_SECONDS, whichever
#         comes first (the config target runs each small config for one phantom step).
#   tsan  TSan build (gcc) of the emulator and network-model tests, which run the engine with
#         1, 2 and 4 worker threads; tile fibers migrate between the workers, and the emulator
#         announces every switch to TSan (emulator/detail/scheduler.hpp, fiber_launch.hpp).
#   pgo   scripts/build_pgo.sh in its quick mode (an instrumented build of the libraries a run
#         spends its time in, the commands from ccache's copy of build/; its training runs
#         without the 128-node ones; the build from their profile) into build-pgo/, then the
#         same runs with it and
#         with build/'s program: real math (the quickstart's picture, flat and cocodiff) and
#         phantom (usp, cocodiff on 8 Aurora nodes) give the same output and timeline hashes.
#   asan  ASan + UBSan build (clang-14, -O1) without benchmarks and MPI, then every CTest test but the
#         strategy-equivalence and whole-run suites (Strategies, Run, Compare, FlatUlysses,
#         Pipeline, Weights, the trained video model's, smoke_*, e2e_*; the corpus replays, which
#         the fuzz stage runs under the same sanitizers): those repeat the same kernels over
#         real-math runs,
#         take ~70% of the Release suite's time and would take ~5x that under ASan; they run in
#         Release (scripts/test.sh). Under ASan run the parsers and every error path (config,
#         cluster, safetensors, CLI), the emulator, network models and layers.
# Usage: bash scripts/ci.sh [lint] [fuzz] [tsan] [pgo] [asan]   (no argument: all five, in that order)
# Env:   COCODIFF_FUZZ_RUNS (default 20000) inputs per fuzz target, COCODIFF_FUZZ_SECONDS
#        (default 180) wall-time cap per target; COCODIFF_CI_BUDGET_S, COCODIFF_CI_BUDGET_<STAGE>_S
#        (below); build dirs are build-asan/ (asan and fuzz), build-tsan/.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fuzz_runs=${COCODIFF_FUZZ_RUNS:-20000}
fuzz_seconds=${COCODIFF_FUZZ_SECONDS:-180}

# Sanitizer builds: no -march=native (GCC's false -Wmaybe-uninitialized in Eigen's AVX-512 paths),
# no benchmarks, no MPI (OpenMPI's own leaks and races are not ours to chase).
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOCODIFF_NATIVE=OFF -DCOCODIFF_BUILD_BENCH=OFF
  -DCOCODIFF_WITH_MPI=OFF)

# Every libFuzzer target in tests/fuzz: the fuzz stage builds them with ASan + UBSan and runs each
# over its checked-in corpus first (what ctest's fuzz_replay_* tests replay in the Release build),
# then on new inputs; the asan stage leaves them and their replays to it.
fuzz_targets=(fuzz_config fuzz_safetensors fuzz_safetensors_index fuzz_png fuzz_calibrate_csv
  fuzz_nccl_tests fuzz_steps_csv fuzz_interference_json)

# One clang-14 ASan + UBSan build (build-asan/) serves the asan and the fuzz stages: its objects
# carry libFuzzer's coverage instrumentation (COCODIFF_FUZZ: -fsanitize=fuzzer-no-link), which the
# asan stage's tests run with and the fuzz targets need, so the libraries are compiled once (a
# separate fuzz build was ~700 s of CI's 90 minutes).
configure_asan() {
  cmake -S . -B build-asan "${common[@]}" -DCMAKE_CXX_COMPILER=clang++-14 \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DCOCODIFF_SANITIZE=address,undefined \
    -DCOCODIFF_FUZZ=ON
}

stage_asan() {
  # clang-14 at -O1 (the level ASan's documentation recommends): g++ -O2 with ASan + UBSan took
  # 3.5x as long to compile (23 s against 6.5 s for net_models/cluster.cpp) and its build alone
  # outran the stage's budget; gcc's sanitizers still run in the tsan stage.
  configure_asan
  cmake --build build-asan -j "$jobs" --target cocodiff emulator_test net_models_test dit_test \
    apps_test e2e_forward_test safetensors_limits_test
  # halt_on_error makes every UBSan report fatal. The emulator declares each fiber's stack to
  # ASan when the fiber gains control (emulator/detail/stack_pool.hpp), which is enough for
  # exceptions thrown on fiber stacks; detect_stack_use_after_return stays off because the fake
  # stacks it needs would have to be saved and restored across every switch inside Boost.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout 600 \
    -E "$asan_excluded"
}

# What the asan stage leaves to the Release suite: the whole-run suites above and the slowest
# real-math runs of other suites (each 40-115 s under ASan at -j 2: every strategy or family
# through whole trained-model runs, the presets' full calibrations), which repeat the kernels
# and paths the rest already runs under the sanitizers.
asan_excluded='^(Strategies|Run|Compare|FlatUlysses|Pipeline|Weights)\.|^Video\.TheTrained|^(smoke|e2e|install|fuzz_replay|fidelity)_|^mpi_'
asan_excluded+='|^Calibrate\.ShippedSharedMemoryPresets|^Tune\.LossyBounds|^StepCache\.Every|^Residual\.EveryUlysses'
asan_excluded+='|^PipeFusion\.(StaleKv|UlyssesInside|SameTimeline)'
stage_lint() {
  [ -f build/compile_commands.json ] || cmake -S . -B build -G Ninja
  bash scripts/lint.sh build
}

stage_tsan() {
  # -Wno-tsan: GCC warns that TSan does not model the atomic_thread_fence inside Boost.Fiber's
  # headers (intrusive_ptr_release); that is a limit of TSan, not a bug we can fix in our code.
  # halt_on_error: any report fails the stage.
  cmake -S . -B build-tsan "${common[@]}" -DCOCODIFF_SANITIZE=thread -DCMAKE_CXX_FLAGS=-Wno-tsan
  cmake --build build-tsan -j "$jobs" --target emulator_test net_models_test
  local opts="halt_on_error=1:second_deadlock_stack=1"
  TSAN_OPTIONS="$opts" build-tsan/tests/emulator/emulator_test --gtest_brief=1
  TSAN_OPTIONS="$opts" build-tsan/tests/net_models/net_models_test --gtest_brief=1
}

stage_fuzz() {
  configure_asan
  cmake --build build-asan -j "$jobs" --target "${fuzz_targets[@]}"
  local t
  for t in "${fuzz_targets[@]#fuzz_}"; do
    # New inputs go to a scratch corpus (listed first); the checked-in seeds are only read.
    local work="build-asan/fuzz/corpus-$t"
    mkdir -p "$work"
    local dict=()
    [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "build-asan/tests/fuzz/fuzz_$t" "${dict[@]}" -runs="$fuzz_runs" \
      -max_total_time="$fuzz_seconds" -timeout=30 -rss_limit_mb=4096 -malloc_limit_mb=1024 \
      -artifact_prefix="build-asan/fuzz/crash-$t-" -print_final_stats=1 \
      "$work" "tests/fuzz/corpus/$t" 2>&1 | tee "build-asan/fuzz/fuzz-$t.log" |
      grep -E '^(#[0-9]+ +(INITED|DONE)|stat::number_of_executed_units|==[0-9]+==|SUMMARY|artifact)'
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
      echo "fuzz_$t found a problem; log: build-asan/fuzz/fuzz-$t.log" >&2
      return 1
    fi
  done
}

stage_pgo() {
  COCODIFF_PGO_QUICK=1 bash scripts/build_pgo.sh build-pgo
  # The training wrote a profile of the program's objects, and the program was built from it.
  compgen -G 'build-pgo/pgo-profile/*cocodiff_emulator*.gcda' >/dev/null ||
    { echo "pgo: no profile of the emulator in build-pgo/pgo-profile" >&2; return 1; }
  build-pgo/apps/cocodiff --version | grep -q '^build: profile-guided' ||
    { echo "pgo: build-pgo/apps/cocodiff is not the profile-guided build" >&2; return 1; }
  [ -x build/apps/cocodiff ] || cmake --build build -j "$jobs" --target cocodiff
  local phantom=(configs/flux1-tiny-24tiles.toml --set run.math=skip --set model.preset=flux1-dev
    --set run.resolution=2048 --set ulysses.uneven_heads=true --set cluster.preset=aurora
    --set cluster.nodes=8 --set run.steps=3)
  local name args b
  for name in quickstart-flat quickstart-cocodiff usp cocodiff; do
    case $name in
      quickstart-*) args=(configs/quickstart.toml --set run.steps=4 --set "run.strategy=${name#*-}") ;;
      *) args=("${phantom[@]}" --set "run.strategy=$name") ;;
    esac
    for b in build build-pgo; do
      rm -rf "build-pgo/check/$name-$b"
      "$b/apps/cocodiff" run "${args[@]}" --out "build-pgo/check/$name-$b" >/dev/null
      grep -E '"(output|timeline)_sha256"' "build-pgo/check/$name-$b/report.json" \
        >"build-pgo/check/$name-$b.hashes"
    done
    if ! cmp -s "build-pgo/check/$name-build.hashes" "build-pgo/check/$name-build-pgo.hashes"; then
      echo "pgo: $name: the profile-guided program's hashes differ from the Release program's:" >&2
      diff "build-pgo/check/$name-build.hashes" "build-pgo/check/$name-build-pgo.hashes" >&2
      return 1
    fi
    echo "pgo: $name: same hashes ($(tr -d ' \n' <"build-pgo/check/$name-build.hashes"))"
  done
}

# Not a CI stage: sleeps past its 1 s budget, so that tests/ci can check that a stage out of time
# fails CI.
stage_stall() { sleep 60; }

if [ "${1:-}" = "__stage" ]; then  # one stage in its own shell, so that set -e applies inside
  "stage_$2"
  exit 0
fi

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(lint fuzz tsan pgo asan)  # the bounded stages first
# CI has 90 minutes in all on a 2-core machine. Each stage has its own budget (seconds; sized
# from measured times with room for the suite to grow by a third) and is also held to what is
# left of COCODIFF_CI_BUDGET_S, counted from the start of .ci/run (COCODIFF_CI_ELAPSED_S). A stage
# that does not finish inside its time FAILS CI, like one that fails: CI never passes without
# having run every stage it was asked for.
declare -A stage_budget=([lint]=${COCODIFF_CI_BUDGET_LINT_S:-600} [fuzz]=${COCODIFF_CI_BUDGET_FUZZ_S:-900}
  [tsan]=${COCODIFF_CI_BUDGET_TSAN_S:-900} [pgo]=${COCODIFF_CI_BUDGET_PGO_S:-1200} [asan]=${COCODIFF_CI_BUDGET_ASAN_S:-1500} [stall]=1)
budget=${COCODIFF_CI_BUDGET_S:-5100}
summary=()
failed=0
for s in "${stages[@]}"; do
  case "$s" in lint | asan | tsan | fuzz | pgo | stall) ;; *) echo "ci.sh: unknown stage '$s' (lint | fuzz | tsan | pgo | asan)" >&2; exit 2 ;; esac
done
for s in "${stages[@]}"; do
  echo "=== ci stage $s: start $(date -u +%H:%M:%S)"
  t0=$SECONDS
  rc=0
  left=$((budget - (SECONDS + ${COCODIFF_CI_ELAPSED_S:-0})))
  limit=${stage_budget[$s]}
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 0 ]; then
    rc=124
  else
    timeout --kill-after=30 "$limit" bash "$0" __stage "$s" || rc=$?
  fi
  dt=$((SECONDS - t0))
  result=ok
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    result="FAILED: did not finish in ${limit}s (stage budget ${stage_budget[$s]}s, CI budget ${budget}s)"
    failed=1
  elif [ $rc -ne 0 ]; then
    result="FAILED (exit $rc)"
    failed=1
  fi
  line=$(printf '%-5s %3dm%02ds  %s' "$s" $((dt / 60)) $((dt % 60)) "$result")
  echo "=== ci stage $line"
  summary+=("$line")
done
echo "=== ci summary"
printf '  %s\n' "${summary[@]}"
exit $failed
