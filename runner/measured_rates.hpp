#pragma once
// Rates that depend on the tensors, measured by a real-math run and handed to phantom runs.
//
// A phantom run (math = "skip") has no values, so it cannot say which steps a step cache skips
// or how many V-Major blocks change. A real run writes what it measured to rates.json beside
// report.json; a phantom run names that file as `run.measured_rates` and takes:
// - step_cache.skipped: the steps to skip (the policy and threshold must be the file's). A run
//   of another step count skips the steps at the same places of the schedule: step j of M is
//   skipped when step round(j (N - 1) / (M - 1)) of the measured N was.
// - v_major.active_fraction: the share of V blocks selective exchanges sent, in place of
//   `v_major.phantom_active_fraction`'s assumed constant (unless that key is set).
//
//   {"format": "cocodiff measured rates 1", "model": "flux-tiny", "steps": 8, "tokens": 256,
//    "step_cache": {"policy": "first_block", "threshold": 0.08, "skipped": [3, 5, 6]},
//    "v_major": {"threshold": 0.02, "active_fraction": 0.94}}
//
// A rate measured on a small model stands in for a large one's only as far as the two models'
// activations change alike from step to step (same sampler, step count and schedule): the file
// records the model it came from, and the report names it.

#include <string>

#include "dit/attention_strategy.hpp"
#include "dit/step_cache.hpp"
#include "nlohmann/json.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

inline constexpr const char* kMeasuredRatesFormat = "cocodiff measured rates 1";

/// What a real run of `plan` measured (rates.json); null for a phantom run or a run that
/// measured nothing (no step cache, no V-Major selective exchange).
nlohmann::ordered_json measured_rates_json(const RunPlan& plan, const dit::StepCacheStats& cache,
                                           const dit::StrategyStats& stats);

/// Reads `run.measured_rates` into the plan's settings (phantom runs only; ConfigError naming the
/// key or the file otherwise). Called by resolve_run_plan after the strategy and step cache keys.
void read_measured_rates(Config& cfg, RunPlan& plan);

/// report.json's "step_cache" section (null without a step cache).
nlohmann::ordered_json step_cache_json(const dit::StepCacheStats& s);

}  // namespace cocodiff::apps
