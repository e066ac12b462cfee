#pragma once
// Attention strategies by name (the run config's `run.strategy`).
//
//   std::unique_ptr<AttentionStrategy> s = make_attention_strategy("cocodiff", comm, model_cfg,
//   opt);
//
// Names: serial (one rank), flat (Ulysses, one all-to-all per tensor), tapa (TAPA phases),
// v_first (tapa + V-First), pipeline (tapa + chunked Q/K preparation), v_major (tapa + V-Major),
// cocodiff (tapa + v_first + pipeline + v_major), usp (Ulysses x Ring), pipefusion (patch
// pipeline over the blocks, dit/parallel/pipefusion.hpp: generate() runs it). Compositions join
// features with '+': "flat+v_first", "tapa+v_first+pipeline", ... (features: flat | tapa,
// v_first, pipeline, v_major).

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"

namespace cocodiff::dit {

/// Makes one rank's strategy over its communicator (borrowed; outlives the strategy).
using StrategyFactory = std::function<std::unique_ptr<AttentionStrategy>(
    Communicator& comm, const ModelConfig& cfg, const StrategyOptions& options)>;

/// Strategies a program registers by name on top of the built-in ones; a value, not a global:
/// hand it to RunSettings::strategies (or apps::resolve_run_plan) so `run.strategy` finds them.
class StrategyRegistry {
 public:
  /// Adds `name` (letters, digits, '_', '-'). ConfigError when the name is malformed, is a
  /// built-in strategy or feature, or was already added. `lossy`: the strategy changes the output.
  void add(const std::string& name, StrategyFactory factory, bool lossy = false);
  /// True when `name` was added here.
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  /// The added names, sorted.
  std::vector<std::string> names() const;
  /// The strategy `name` for this rank; ConfigError when it was not added.
  std::unique_ptr<AttentionStrategy> make(const std::string& name, Communicator& comm,
                                          const ModelConfig& cfg,
                                          const StrategyOptions& options) const;
  /// Whether `name` was added as lossy (false when it was not added).
  bool lossy(const std::string& name) const;

 private:
  struct Entry {
    StrategyFactory factory;
    bool lossy = false;
  };
  std::map<std::string, Entry> entries_;
};

/// The named strategies make_attention_strategy accepts (compositions with '+' come on top),
/// then those of `user`, if given.
std::vector<std::string> attention_strategy_names(const StrategyRegistry* user = nullptr);

/// Empty when `name` is a valid strategy or composition (or one of `user`'s), else what is
/// wrong with it.
std::string attention_strategy_error(const std::string& name,
                                     const StrategyRegistry* user = nullptr);

/// The mechanisms a built-in Ulysses strategy or composition combines, in the order flat|tapa,
/// v_first, pipeline, v_major ("cocodiff" -> tapa, v_first, pipeline, v_major); empty for one
/// that is not such a combination (serial, usp, a user's, an invalid name).
std::vector<std::string> attention_strategy_features(const std::string& name);

/// True for strategies that change the output (v_major with a threshold above 0, or a user
/// strategy registered as lossy).
bool attention_strategy_is_lossy(const std::string& name, const StrategyOptions& options,
                                 const StrategyRegistry* user = nullptr);

/// Collective over `comm` (borrowed; must outlive the strategy). ConfigError for an unknown
/// name or impossible settings. `user`'s strategies are looked up first.
std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg,
                                                           const StrategyOptions& options = {},
                                                           const StrategyRegistry* user = nullptr);

}  // namespace cocodiff::dit
