#pragma once
// Attention strategies by name (the run config's `run.strategy`).
//
//   std::unique_ptr<AttentionStrategy> s = make_attention_strategy("cocodiff", comm, model_cfg,
//   opt);
//
// Names: serial (one rank), flat (Ulysses, one all-to-all per tensor), tapa (TAPA phases),
// v_first (tapa + V-First), pipeline (tapa + chunked Q/K preparation), v_major (tapa + V-Major),
// cocodiff (tapa + v_first + pipeline + v_major), usp (Ulysses x Ring). Compositions join
// features with '+': "flat+v_first", "tapa+v_first+pipeline", ... (features: flat | tapa,
// v_first, pipeline, v_major).

#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"

namespace cocodiff::dit {

/// The named strategies make_attention_strategy accepts (compositions with '+' come on top).
std::vector<std::string> attention_strategy_names();

/// Empty when `name` is a valid strategy or composition, else what is wrong with it.
std::string attention_strategy_error(const std::string& name);

/// True for strategies that change the output (v_major with a threshold above 0).
bool attention_strategy_is_lossy(const std::string& name, const StrategyOptions& options);

/// Collective over `comm` (borrowed; must outlive the strategy). ConfigError for an unknown
/// name or impossible settings.
std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg,
                                                           const StrategyOptions& options = {});

}  // namespace cocodiff::dit
