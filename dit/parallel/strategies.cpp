#include "dit/parallel/strategies.hpp"

#include "core/errors.hpp"
#include "dit/parallel/ulysses.hpp"

namespace cocodiff::dit {

std::vector<std::string> attention_strategy_names() { return {"serial", "flat"}; }

std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg) {
  if (name == "flat") return std::make_unique<FlatUlysses>(comm, cfg.heads);
  if (name == "serial") {
    if (comm.size() != 1)
      throw ConfigError("strategy \"serial\" runs on one rank, not " + std::to_string(comm.size()));
    return std::make_unique<SerialAttention>();
  }
  std::string list;
  for (const std::string& n : attention_strategy_names()) list += (list.empty() ? "" : " | ") + n;
  throw ConfigError("unknown attention strategy \"" + name + "\" (expected " + list + ")");
}

}  // namespace cocodiff::dit
