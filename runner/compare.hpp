#pragma once
// `cocodiff compare`'s runs as a library: the entries of a compare (every strategy, then each
// data-dependent technique on each) and their plans run side by side, each on its own engine.
// `tune` runs its points on the same job pool (run_side_by_side).
//
//   const CompareEntries en = compare_entries({"flat", "tapa"}, "fp8,teacache=0.25");
//   std::vector<RunPlan> plans = ...;                 // one resolved plan an entry, in en.order
//   std::vector<RunRecord> recs = run_plans_side_by_side(plans, en.order);

#include <functional>
#include <string>
#include <vector>

#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

/// The entries of a compare: the default strategy first (flat, dit::kDefaultStrategy: the
/// reference, run on demand), the listed strategies, then each technique on each listed strategy
/// that takes techniques ("STRATEGY+TECHNIQUE", with its keys).
struct CompareEntries {
  std::vector<std::string> order, strategy, technique;
  std::vector<std::vector<std::string>> extra;  // each entry's run keys ("k=v") for its technique
};

/// A technique of --techniques as run keys: "fp8", "residual" (compress.all_to_all), "teacache"
/// or "first_block" (step_cache.policy), the last two with "=THRESHOLD" optionally. Anything else
/// is a ConfigError naming --techniques.
std::vector<std::string> technique_sets(const std::string& technique);
/// The entries of `names` (strategies, `user`'s looked up first) and `techniques`
/// (comma-separated, may be empty).
CompareEntries compare_entries(const std::vector<std::string>& names, const std::string& techniques,
                               const dit::StrategyRegistry* user = nullptr);
/// Runs `work` on `jobs` threads (this one among them) and waits for all. When the system gives
/// fewer threads than asked (a limit on threads or memory), those it gave do the work.
void run_side_by_side(int jobs, const std::function<void()>& work);
/// Runs the plans side by side, as many at once as the hardware threads hold their workers
/// (each plan's workers set to its share unless emulator.workers was given), a line on stderr
/// as each ends; the first failure in entry order is rethrown.
std::vector<RunRecord> run_plans_side_by_side(std::vector<RunPlan>& plans,
                                              const std::vector<std::string>& order);

}  // namespace cocodiff::apps
