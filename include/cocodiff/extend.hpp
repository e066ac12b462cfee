#pragma once
// Extending cocodiff from a program of one's own: an attention strategy, an all-to-all
// algorithm, a model family, each then named by a RunSpec (or a config) like a built-in one.
//
//   class MyAttention final : public cocodiff::AttentionStrategy { ... };   // attend() etc.
//
//   cocodiff::Extensions ext;
//   ext.add_strategy("mine", [](cocodiff::Communicator& comm, const cocodiff::ModelConfig&,
//                               const cocodiff::StrategyOptions&) {
//     return std::make_unique<MyAttention>(comm);
//   });
//   spec.strategy = "mine";
//   cocodiff::Plan plan = cocodiff::make_plan(spec, &ext);
//
// Strategies belong to an Extensions value, handed to each plan (several programs or engines in
// one process never see each other's). All-to-all algorithms and model families are added to
// the process's one list of each (the one every config reads), before any plan names them.
//
// What a strategy sees (dit/attention_strategy.hpp, installed beside this header): per layer,
// attend(ex, src, shape) gets the QkvSource of its token streams (project Q/K/V of heads
// [h0, h1) -> [rows(s), (h1-h0) * head_dim]; prepare = per-head norm + RoPE) and returns, per
// stream, [rows(s), heads * head_dim] of its local tokens. Tensors are row-major float
// (core/tensor.hpp, Eigen); collectives go through the rank's Communicator
// (core/communicator.hpp: all_to_all, all_gather, send/recv, ... all blocking on the rank's
// fiber). dit/layers.hpp has the layers a strategy composes (attention, concat_tokens,
// split_tokens, shard_tokens). A strategy with a sampling loop of its own (StrategyEntry::
// sampler, as PipeFusion's stages have) gets each rank's whole run and returns its RunOutput;
// dit/pipeline.hpp's generate() is the loop every other strategy runs in.

#include <functional>
#include <memory>
#include <string>

#include "core/communicator.hpp"
#include "core/tensor.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/layers.hpp"
#include "dit/model.hpp"
#include "dit/model_config.hpp"
#include "dit/model_family.hpp"
#include "dit/parallel/strategies.hpp"
#include "dit/pipeline.hpp"
#include "emulator/collectives/registry.hpp"
#include "emulator/collectives/schedule.hpp"

namespace cocodiff {

// The types an extension implements or receives, under the facade's namespace.
using dit::AttentionShape;
using dit::AttentionStrategy;
using dit::Exec;
using dit::LossyProbe;
using dit::ModelConfig;
using dit::ModelFamily;
using dit::QkvSource;
using dit::RunOutput;
using dit::RunSettings;
using dit::SearchEmit;
using dit::SearchPoint;
using dit::SearchShape;
using dit::StrategyEntry;
using dit::StrategyFactory;
using dit::StrategyLayout;
using dit::StrategyMemory;
using dit::StrategyMemoryPart;
using dit::StrategyMemoryQuery;
using dit::StrategyOptions;
using dit::StrategySampler;
using dit::StrategySearch;
using dit::Weights;
using emu::collectives::AlgorithmId;
using emu::collectives::GroupShape;
using emu::collectives::Schedule;

/// Makes the schedule of an all-to-all for `group` (null: it cannot run there, and the
/// algorithm's fallback runs instead).
using ScheduleFactory = std::function<std::unique_ptr<Schedule>(const GroupShape& group)>;

/// What a program adds to the plans it makes: its own attention strategies.
class Extensions {
 public:
  Extensions();

  /// Adds strategy `name` (letters, digits, '_', '-'): `factory` makes each rank's instance
  /// over that rank's communicator (borrowed; it outlives the strategy). `lossy`: the strategy
  /// changes the output (reports say so). ConfigError when the name is malformed, built in or
  /// added already. `memory`: what one tile of it keeps beyond the layers' activations (caches),
  /// which the memory estimate and emulator.memory_limit count; empty: nothing.
  void add_strategy(const std::string& name, StrategyFactory factory, bool lossy = false,
                    StrategyMemory memory = {});
  /// The same with everything a built-in strategy registers (dit/parallel/strategies.hpp's
  /// StrategyEntry): its factory, when it is lossy, its memory, its search space for `tune`,
  /// what `tune --lossy` measures of it (LossyProbe), how it lays out its ranks (StrategyLayout:
  /// one Ulysses group of every rank runs CFG-parallel and checks its heads as flat does) and
  /// its own sampling loop, if it runs whole runs rather than one layer's attention.
  void add_strategy(const std::string& name, StrategyEntry entry);

  /// Adds the search space `cocodiff tune` explores for strategy `name` (added before): on each
  /// cluster shape, `search` emits its points (dit/parallel/search.hpp), searched with the
  /// built-ins' when TuneOptions::strategies holds these strategies. ConfigError when `name`
  /// was not added or has a search already.
  void add_search(const std::string& name, StrategySearch search);

  /// The strategies added so far (shared with every plan made from them).
  std::shared_ptr<const dit::StrategyRegistry> strategies() const { return strategies_; }

 private:
  std::shared_ptr<dit::StrategyRegistry> strategies_;
};

/// Adds all-to-all algorithm `name` to the process's list: RunSpec::all_to_all (the config's
/// emulator.all_to_all) may name it from then on. `fallback`: a registered all-to-all that runs
/// where `make` returns null (empty: it never does); `equal_counts_only`: all-to-allv runs
/// `fallback`. ConfigError when the name is taken or the fallback unknown. Not thread-safe
/// against runs in progress: register before making plans.
AlgorithmId register_all_to_all(const std::string& name, const std::string& summary,
                                ScheduleFactory make, const std::string& fallback = {},
                                bool equal_counts_only = false);

/// Adds a model family to the process's list: a model config whose `family` is `f.name` builds
/// its model with `f.make` (dit/model_family.hpp). ConfigError when the name is taken.
void register_model_family(ModelFamily f);

}  // namespace cocodiff
