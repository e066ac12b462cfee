#include "dit/parallel/strategies.hpp"

#include <sstream>

#include "core/errors.hpp"
#include "dit/parallel/sp_attention.hpp"
#include "dit/parallel/usp.hpp"

namespace cocodiff::dit {

namespace {

struct Parsed {
  bool ok = false;
  std::string error;
  SpFeatures features;
  bool flat = false;
};

Parsed parse(const std::string& name) {
  Parsed p;
  std::vector<std::string> tokens;
  if (name == "v_first") {
    tokens = {"tapa", "v_first"};
  } else if (name == "pipeline") {
    tokens = {"tapa", "pipeline"};
  } else if (name == "v_major") {
    tokens = {"tapa", "v_major"};
  } else if (name == "cocodiff") {
    tokens = {"tapa", "v_first", "pipeline", "v_major"};
  } else {
    std::stringstream ss(name);
    std::string t;
    while (std::getline(ss, t, '+')) tokens.push_back(t);
  }
  bool exchange = false;
  for (const std::string& t : tokens) {
    if (t == "flat" || t == "tapa") {
      if (exchange) {
        p.error = "a composition names one exchange (flat or tapa)";
        return p;
      }
      exchange = true;
      p.flat = t == "flat";
      p.features.tapa = t == "tapa";
    } else if (t == "v_first") {
      p.features.v_first = true;
    } else if (t == "pipeline") {
      p.features.chunks = 2;  // replaced by the options' chunk count
    } else if (t == "v_major") {
      p.features.v_major = true;
    } else {
      p.error = "unknown feature \"" + t + "\"";
      return p;
    }
  }
  if (!exchange) {
    p.error = "a composition needs an exchange (flat or tapa)";
    return p;
  }
  p.ok = true;
  return p;
}

}  // namespace

std::vector<std::string> attention_strategy_names() {
  return {"serial", "flat", "tapa", "v_first", "pipeline", "v_major", "cocodiff", "usp"};
}

std::string attention_strategy_error(const std::string& name) {
  if (name == "serial" || name == "usp") return {};
  const Parsed p = parse(name);
  if (p.ok) return {};
  std::string list;
  for (const std::string& n : attention_strategy_names()) list += (list.empty() ? "" : " | ") + n;
  return "unknown attention strategy \"" + name + "\": " + p.error + " (expected " + list +
         ", or features joined by '+': flat|tapa, v_first, pipeline, v_major)";
}

bool attention_strategy_is_lossy(const std::string& name, const StrategyOptions& options) {
  if (name == "serial" || name == "usp") return false;
  const Parsed p = parse(name);
  return p.ok && p.features.v_major && options.v_major_threshold > 0;
}

std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg,
                                                           const StrategyOptions& options) {
  if (name == "serial") {
    if (comm.size() != 1)
      throw ConfigError("strategy \"serial\" runs on one rank, not " + std::to_string(comm.size()));
    return std::make_unique<SerialAttention>();
  }
  if (name == "usp") return std::make_unique<UlyssesRing>(comm, cfg, options);
  Parsed p = parse(name);
  if (!p.ok) throw ConfigError(attention_strategy_error(name));
  if (p.features.chunks > 1) p.features.chunks = options.pipeline_chunks;
  return std::make_unique<SpAttention>(name, comm, cfg, p.features, options);
}

}  // namespace cocodiff::dit
