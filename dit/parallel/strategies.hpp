#pragma once
// Attention strategies by name (the run config's `run.strategy`).
//
//   std::unique_ptr<AttentionStrategy> s = make_attention_strategy("flat", comm, model_cfg);

#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model_config.hpp"

namespace cocodiff::dit {

/// Names make_attention_strategy accepts.
std::vector<std::string> attention_strategy_names();

/// "serial" (one rank only) or "flat" (Ulysses over all of `comm`). `comm` is borrowed and
/// must outlive the strategy. ConfigError for an unknown name or an impossible degree.
std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg);

}  // namespace cocodiff::dit
