#include "runner/measured_rates.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"

namespace cocodiff::apps {

namespace {

constexpr const char* kKey = "run.measured_rates";

// The share of V blocks the selective exchanges sent, over every tier; -1: none ran.
double v_major_active_fraction(const dit::StrategyStats& s) {
  double blocks = 0, active = 0;
  for (const auto& [tier, t] : s.v_major) {
    blocks += static_cast<double>(t.selective_blocks);
    active += static_cast<double>(t.selective_active_blocks);
  }
  return blocks > 0 ? active / blocks : -1.0;
}

// The measured skips mapped onto a run of `steps` steps (the same places of the schedule).
std::vector<int> map_skips(const std::vector<int>& skipped, int measured_steps, int steps) {
  if (measured_steps == steps || measured_steps < 2 || steps < 2) return skipped;
  std::vector<int> out;
  for (int j = 1; j < steps; ++j) {  // the first step always runs
    const int i = static_cast<int>(std::lround(static_cast<double>(j) * (measured_steps - 1) /
                                               static_cast<double>(steps - 1)));
    if (std::find(skipped.begin(), skipped.end(), i) != skipped.end()) out.push_back(j);
  }
  return out;
}

}  // namespace

nlohmann::ordered_json step_cache_json(const dit::StepCacheStats& s) {
  if (s.policy == "none") return nullptr;
  nlohmann::ordered_json change = nlohmann::ordered_json::array();
  for (const double c : s.change)
    change.push_back(c >= 0 ? nlohmann::ordered_json(c) : nlohmann::ordered_json(nullptr));
  const double total = std::max(1, s.blocks_total);
  return {
      {"policy", s.policy},
      {"threshold", s.threshold},
      {"steps", s.steps},
      {"skipped_steps", s.skipped},
      {"skipped_fraction",
       s.steps > 0 ? static_cast<double>(s.skipped.size()) / static_cast<double>(s.steps) : 0.0},
      {"blocks_run", s.blocks_run},
      {"blocks_total", s.blocks_total},
      {"blocks_skipped_fraction", 1.0 - static_cast<double>(s.blocks_run) / total},
      {"change", change},
      {"skips_from", s.phantom ? "run.measured_rates (phantom mode: no data to measure)"
                               : "measured on this run"},
      {"note", s.policy == "first_block"
                   ? "change: mean |r - r_ref| / mean |r_ref| of the first block's residual "
                     "against the last step that ran every block (null: not measured)"
                   : "change: TeaCache's accumulated rescaled relative L1 change of the first "
                     "block's modulated input (null: a step that runs by rule)"},
  };
}

nlohmann::ordered_json measured_rates_json(const RunPlan& plan, const dit::StepCacheStats& cache,
                                           const dit::StrategyStats& stats) {
  if (plan.settings.phantom) return nullptr;
  const double active = v_major_active_fraction(stats);
  const bool cached = plan.settings.step_cache.active();
  if (!cached && active < 0) return nullptr;
  nlohmann::ordered_json j = {
      {"format", kMeasuredRatesFormat},
      {"model", plan.model.name},
      {"strategy", plan.settings.strategy},
      {"steps", plan.settings.steps},
      {"tokens", plan.tokens()},
      {"seed", plan.settings.seed},
  };
  if (cached)
    j["step_cache"] = {
        {"policy", cache.policy}, {"threshold", cache.threshold}, {"skipped", cache.skipped}};
  if (active >= 0)
    j["v_major"] = {{"threshold", plan.settings.strategy_options.v_major_threshold},
                    {"block_tokens", plan.settings.strategy_options.v_major_block_tokens},
                    {"active_fraction", active}};
  return j;
}

void read_measured_rates(Config& cfg, RunPlan& plan) {
  dit::StepCacheOptions& sc = plan.settings.step_cache;
  if (!cfg.has(kKey)) {
    if (plan.settings.phantom && sc.active() && sc.phantom_skipped.empty() &&
        !cfg.has("step_cache.phantom_skipped"))
      throw ConfigError(cfg.where("step_cache.policy"), "step_cache.policy",
                        "run.measured_rates (a real run's rates.json) or "
                        "step_cache.phantom_skipped: a phantom run has no values to decide "
                        "which steps to skip",
                        "\"" + sc.policy + "\" in a phantom run without measured rates");
    return;
  }
  const std::string name = cfg.require_string(kKey);
  if (name.empty()) throw ConfigError(cfg.where(kKey), kKey, "a file path", "an empty string");
  if (!plan.settings.phantom)
    throw ConfigError(cfg.where(kKey), kKey,
                      "no measured rates in a real-math run (it measures its own; the key is "
                      "for run.math = \"skip\")",
                      "\"" + name + "\"");
  const std::filesystem::path file =
      cfg.require_path(kKey, config_dir(), "a rates.json written by a real run");
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(cfg.where(kKey), kKey, "a rates.json written by a real run",
                      file.string() + ": not JSON (" + e.what() + ")");
  }
  auto bad = [&](const std::string& what) {
    return ConfigError(cfg.where(kKey), kKey, "a rates.json written by a real run",
                       file.string() + ": " + what);
  };
  if (!j.is_object() || j.value("format", std::string()) != kMeasuredRatesFormat)
    throw bad("no \"format\": \"" + std::string(kMeasuredRatesFormat) + "\"");
  try {
    if (sc.active()) {
      if (!j.contains("step_cache"))
        throw bad("no step_cache rates (the run that wrote it had no step cache)");
      const nlohmann::json& c = j.at("step_cache");
      const std::string policy = c.at("policy").get<std::string>();
      const double threshold = c.at("threshold").get<double>();
      if (policy != sc.policy || threshold != sc.threshold)
        throw bad("step_cache measured with policy \"" + policy + "\" at threshold " +
                  std::to_string(threshold) + ", this run asks for \"" + sc.policy + "\" at " +
                  std::to_string(sc.threshold));
      const int measured_steps = j.at("steps").get<int>();
      if (!cfg.has("step_cache.phantom_skipped"))
        sc.phantom_skipped =
            map_skips(c.at("skipped").get<std::vector<int>>(), measured_steps, plan.settings.steps);
    }
    if (j.contains("v_major") && !cfg.has("v_major.phantom_active_fraction")) {
      const double f = j.at("v_major").at("active_fraction").get<double>();
      if (!(f >= 0 && f <= 1)) throw bad("v_major.active_fraction " + std::to_string(f));
      plan.settings.strategy_options.v_major_phantom_active_fraction = f;
    }
    plan.measured_rates_from =
        RunPlan::RatesSource{file.string(), j.value("model", std::string()), j.value("steps", 0),
                             j.value("tokens", std::int64_t{0})};
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed (") + e.what() + ")");
  }
}

}  // namespace cocodiff::apps
