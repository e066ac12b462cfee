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

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/topology.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"
#include "dit/parallel/search.hpp"

namespace cocodiff::dit {

/// What a strategy's per-tile state is sized from: the run's resolved shape (StrategyMemory).
struct StrategyMemoryQuery {
  const ModelConfig* model = nullptr;
  const StrategyOptions* options = nullptr;
  const Topology* topology = nullptr;
  std::int64_t tokens = 0;    // image tokens of one image (all frames)
  double sp_ranks = 1;        // ranks of one sequence-parallel group
  int batch = 1;              // sequences per transformer pass
  int ulysses_degree = 1;     // parallel.ulysses_degree as resolved
  int pipefusion_degree = 1;  // parallel.pipefusion_degree as resolved
};
/// A named part of what one tile of a strategy keeps from one step to the next (caches), in
/// bytes, beyond the layers' activations the estimate counts for every strategy.
struct StrategyMemoryPart {
  std::string name;  // "v_major caches"
  double bytes = 0;
};
/// A strategy's per-tile memory for a run of real math (phantom runs keep no tensors).
using StrategyMemory =
    std::function<std::vector<StrategyMemoryPart>(const StrategyMemoryQuery& query)>;

/// Makes one rank's strategy over its communicator (borrowed; outlives the strategy).
using StrategyFactory = std::function<std::unique_ptr<AttentionStrategy>(
    Communicator& comm, const ModelConfig& cfg, const StrategyOptions& options)>;

/// Whether a strategy changes the output under `options` (V-Major: with a threshold above 0).
using StrategyLossy = std::function<bool(const StrategyOptions& options)>;

/// How a strategy lays the ranks of one sequence-parallel group out: what a run plan, a report
/// and a comparison read of it, so that none of them names a strategy.
struct StrategyLayout {
  enum class Kind : std::uint8_t {
    kOwn,      // a program's strategy: it lays its ranks out itself (no Ulysses split checked)
    kUlysses,  // one Ulysses group of every rank: the heads split over all of them
    kRing,     // a ring over whole outer topology levels, Ulysses inside (parallel.ring_degree)
    kStages,   // pipeline stages over the blocks, each a Ulysses group (parallel.pipefusion_degree)
    kOne,      // one rank, nothing exchanged
  };
  Kind kind = Kind::kOwn;
  bool cfg_parallel = false;  // runs on each half of the ranks under parallel.cfg_degree = 2
  bool single_rank = true;    // runs on a group of one rank
  bool techniques = true;     // takes a step cache and compressed exchanges (compare --techniques)
};

/// The strategy runs without a configured option: run.strategy's default, and the reference
/// that `cocodiff compare` measures every other strategy against.
inline constexpr const char* kDefaultStrategy = "flat";

struct RunSettings;
struct RunOutput;
class Weights;
/// A strategy that runs whole sampling loops instead of one layer's attention (PipeFusion's
/// stages run blocks): generate() hands it the run.
using StrategySampler = std::function<RunOutput(Communicator& comm, const ModelConfig& cfg,
                                                const Weights& w, const RunSettings& settings)>;

/// What a strategy registers: how each rank makes it, whether it changes the output, what one
/// tile of it keeps, the points it offers `cocodiff tune`, how it lays out its ranks, and its
/// own sampling loop if it has one.
struct StrategyEntry {
  StrategyFactory factory;
  StrategyLossy lossy;      // empty: exact
  StrategyMemory memory;    // empty: nothing beyond the layers' activations
  StrategySearch search;    // empty: tune does not search it
  LossyProbe probe;         // what tune --lossy measures of it (empty key: nothing)
  StrategyLayout layout;    // a program's own unless it says otherwise
  StrategySampler sampler;  // empty: generate() runs its sampling loop around the strategy
};

/// Strategies by name. The built-in ones are one registry (builtins(), the strategy table in
/// strategies.cpp), filled through add() as a program fills its own; a program's is a value,
/// not a global: hand it to RunSettings::strategies (or apps::resolve_run_plan) so
/// `run.strategy` finds its strategies, looked up before the built-ins.
class StrategyRegistry {
 public:
  /// Adds `name` (letters, digits, '_', '-'). ConfigError when the name is malformed, is a
  /// built-in strategy or feature, or was already added, or the factory is empty.
  void add(const std::string& name, StrategyEntry entry);
  /// The same with an exact-or-lossy flag: `lossy` (the strategy changes the output) and
  /// `memory` (what a tile of it keeps: the memory estimate's parts).
  void add(const std::string& name, StrategyFactory factory, bool lossy = false,
           StrategyMemory memory = {});
  /// The entry `name` names here (null when none). In the built-ins, a composition of features
  /// joined by '+' in any order names its canonical entry ("v_first+tapa" -> "tapa+v_first").
  const StrategyEntry* find(const std::string& name) const;
  /// True when `name` names an entry here.
  bool contains(const std::string& name) const { return find(name) != nullptr; }
  /// The added names, in the order added (the built-ins' compositions with '+' left out).
  std::vector<std::string> names() const;
  /// The strategy `name` for this rank; ConfigError when it was not added.
  std::unique_ptr<AttentionStrategy> make(const std::string& name, Communicator& comm,
                                          const ModelConfig& cfg,
                                          const StrategyOptions& options) const;
  /// Whether `name` changes the output under `options` (false when it was not added).
  bool lossy(const std::string& name, const StrategyOptions& options = {}) const;
  /// The memory parts `name` declared for `query` (none when it declared none).
  std::vector<StrategyMemoryPart> memory(const std::string& name,
                                         const StrategyMemoryQuery& query) const;
  /// Adds the search space `cocodiff tune` explores for strategy `name` (added before; one
  /// search each). ConfigError when `name` was not added or has a search already.
  void add_search(const std::string& name, StrategySearch search);
  /// The added searches, in the order their strategies were added.
  std::vector<NamedSearch> searches() const;
  /// The lossy probes of the added strategies, in the order added.
  std::vector<LossyProbe> probes() const;
  /// The first added strategy of layout `kind` (empty when none): the one a degree key turns the
  /// default strategy into (parallel.ring_degree: kRing, parallel.pipefusion_degree: kStages).
  std::string first_of(StrategyLayout::Kind kind) const;

  /// The built-in strategies: serial, the Ulysses compositions (flat, tapa, v_first, pipeline,
  /// v_major, cocodiff, and every composition of features with '+'), pipefusion and usp.
  static const StrategyRegistry& builtins();

 private:
  bool builtin_ = false;  // the built-ins' table: names may join features with '+'
  std::map<std::string, StrategyEntry> entries_;
  std::vector<std::string> order_;
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

/// What one tile of strategy `name` keeps beyond the layers' activations, as its own code
/// declares it: V-Major's caches for a composition with v_major, PipeFusion's key-value caches,
/// a user strategy's declared parts; none for the others.
std::vector<StrategyMemoryPart> attention_strategy_memory(const std::string& name,
                                                          const StrategyMemoryQuery& query,
                                                          const StrategyRegistry* user = nullptr);

/// The entry of strategy `name`: `user`'s when it has one, else the built-ins' (null when
/// neither has).
const StrategyEntry* attention_strategy_entry(const std::string& name,
                                              const StrategyRegistry* user = nullptr);

/// How strategy `name` lays out its ranks (a program's own layout when it names none).
const StrategyLayout& attention_strategy_layout(const std::string& name,
                                                const StrategyRegistry* user = nullptr);

/// The strategy of layout `kind` a degree key turns the default into: the built-ins' first of
/// that kind, else `user`'s (empty when none).
std::string strategy_of_layout(StrategyLayout::Kind kind, const StrategyRegistry* user = nullptr);

/// The search spaces of `cocodiff tune`: the built-in strategies' (Ulysses compositions,
/// PipeFusion, usp, in that order), then `user`'s.
std::vector<NamedSearch> strategy_searches(const StrategyRegistry* user = nullptr);

/// What `cocodiff tune --lossy` measures: the built-in strategies' probes (V-Major's thresholds
/// on cocodiff), then `user`'s.
std::vector<LossyProbe> strategy_lossy_probes(const StrategyRegistry* user = nullptr);

/// Collective over `comm` (borrowed; must outlive the strategy). ConfigError for an unknown
/// name or impossible settings. `user`'s strategies are looked up first.
std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg,
                                                           const StrategyOptions& options = {},
                                                           const StrategyRegistry* user = nullptr);

}  // namespace cocodiff::dit
