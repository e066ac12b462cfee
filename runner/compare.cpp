// `cocodiff compare`'s entries and the job pool its runs and `tune`'s points share.

#include "runner/compare.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

#include "core/errors.hpp"
#include "dit/parallel/strategies.hpp"

namespace cocodiff::apps {

std::vector<std::string> technique_sets(const std::string& t) {
  const size_t eq = t.find('=');
  const std::string name = t.substr(0, eq);
  if (name == "fp8" || name == "residual") {
    if (eq != std::string::npos)
      throw ConfigError("--techniques: " + t + ": " + name + " takes no value");
    return {"compress.all_to_all=" + name};
  }
  if (name == "teacache" || name == "first_block") {
    std::vector<std::string> sets = {"step_cache.policy=" + name};
    if (eq != std::string::npos) sets.push_back("step_cache.threshold=" + t.substr(eq + 1));
    return sets;
  }
  throw ConfigError(
      "--techniques: expected fp8, residual, teacache[=THRESHOLD] or "
      "first_block[=THRESHOLD], found \"" +
      t + "\"");
}

CompareEntries compare_entries(const std::vector<std::string>& names, const std::string& techniques,
                               const dit::StrategyRegistry* user) {
  CompareEntries en;
  std::vector<std::string>& strategy = en.strategy;
  strategy = names;
  const std::string reference = dit::kDefaultStrategy;
  if (std::find(names.begin(), names.end(), reference) != names.end())
    strategy.erase(std::find(strategy.begin(), strategy.end(), reference));
  strategy.insert(strategy.begin(), reference);
  en.order = strategy;
  en.technique.assign(strategy.size(), "");
  en.extra.assign(strategy.size(), {});
  std::stringstream ts(techniques);
  for (std::string t; std::getline(ts, t, ',');) {
    if (t.empty()) continue;
    const std::vector<std::string> sets = technique_sets(t);
    for (const std::string& n : names) {
      // A strategy may take none (PipeFusion's loop runs no step cache, compresses nothing).
      if (!dit::attention_strategy_layout(n, user).techniques) continue;
      std::string label = n;
      label.append("+").append(t);
      en.order.push_back(std::move(label));
      strategy.push_back(n);
      en.technique.push_back(t);
      en.extra.push_back(sets);
    }
  }
  return en;
}

void run_side_by_side(int jobs, const std::function<void()>& work) {
  std::vector<std::thread> threads;
  try {
    for (int j = 1; j < jobs; ++j) threads.emplace_back(work);
  } catch (const std::system_error&) {
    // Fewer threads: the work is shared among those that started.
  }
  work();
  for (std::thread& t : threads) t.join();
}

std::vector<RunRecord> run_plans_side_by_side(std::vector<RunPlan>& plans,
                                              const std::vector<std::string>& order) {
  // The strategies' runs are independent: they run side by side, each on its own engine,
  // as many at once as the hardware threads hold their workers. Unless emulator.workers is
  // given, runs side by side come first (they share nothing) and each run takes its share of
  // the threads for its arithmetic.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (!plans[0].workers_set) {
    const int side_by_side = static_cast<int>(std::min(plans.size(), static_cast<size_t>(cores)));
    for (RunPlan& p : plans) p.engine.workers = std::max(1, cores / side_by_side);
  }
  const size_t jobs = std::min(
      plans.size(), static_cast<size_t>(std::max(1, cores / std::max(1, plans[0].engine.workers))));
  std::vector<std::optional<RunRecord>> results(plans.size());
  std::vector<std::exception_ptr> errors(plans.size());
  std::atomic<size_t> next{0};
  std::mutex io;
  size_t finished = 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "running %zu entries, %zu at a time\n", plans.size(), jobs);
  auto work = [&] {
    for (size_t i; (i = next++) < plans.size();) {
      const auto ts = std::chrono::steady_clock::now();
      try {
        results[i] = run_emulated(plans[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      const double total =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> lk(io);
      ++finished;
      if (results[i])
        std::fprintf(stderr, "[%zu/%zu] %-24s done in %.1f s (virtual %.6f s; %.1f s elapsed)\n",
                     finished, plans.size(), order[i].c_str(), el,
                     results[i]->report["virtual_time_s"].get<double>(), total);
      else
        std::fprintf(stderr, "[%zu/%zu] %-24s failed\n", finished, plans.size(), order[i].c_str());
    }
  };
  run_side_by_side(static_cast<int>(jobs), work);
  // The first failure in strategy order is the one reported.
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<RunRecord> recs;
  for (size_t i = 0; i < plans.size(); ++i) recs.push_back(std::move(*results[i]));
  return recs;
}

}  // namespace cocodiff::apps
