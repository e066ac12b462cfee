#include "dit/parallel/strategies.hpp"

#include <algorithm>
#include <sstream>

#include "core/errors.hpp"
#include "dit/parallel/pipefusion.hpp"
#include "dit/parallel/sp_attention.hpp"
#include "dit/parallel/usp.hpp"
#include "dit/parallel/v_major.hpp"

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

std::vector<std::string> attention_strategy_features(const std::string& name) {
  const Parsed p = parse(name);
  if (!p.ok) return {};
  std::vector<std::string> f = {p.flat ? "flat" : "tapa"};
  if (p.features.v_first) f.emplace_back("v_first");
  if (p.features.chunks > 1) f.emplace_back("pipeline");
  if (p.features.v_major) f.emplace_back("v_major");
  return f;
}

void StrategyRegistry::add(const std::string& name, StrategyFactory factory, bool lossy,
                           StrategyMemory memory) {
  const bool well_formed =
      !name.empty() && name.find_first_not_of(
                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "0123456789_-") == std::string::npos;
  if (!well_formed)
    throw ConfigError("strategy name \"" + name +
                      "\": expected letters, digits, '_' or '-' (no '+', which joins features)");
  const std::vector<std::string> builtin = attention_strategy_names();
  const bool feature = name == "flat" || name == "tapa" || name == "v_first" ||
                       name == "pipeline" || name == "v_major";
  if (feature || std::find(builtin.begin(), builtin.end(), name) != builtin.end())
    throw ConfigError("strategy name \"" + name + "\" is a built-in strategy or feature");
  if (!factory) throw ConfigError("strategy \"" + name + "\": the factory is empty");
  if (!entries_.emplace(name, Entry{std::move(factory), lossy, std::move(memory), {}}).second)
    throw ConfigError("strategy \"" + name + "\" is already registered");
}

std::vector<std::string> StrategyRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

std::unique_ptr<AttentionStrategy> StrategyRegistry::make(const std::string& name,
                                                          Communicator& comm,
                                                          const ModelConfig& cfg,
                                                          const StrategyOptions& options) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw ConfigError("strategy \"" + name + "\" is not registered");
  std::unique_ptr<AttentionStrategy> s = it->second.factory(comm, cfg, options);
  if (!s) throw ConfigError("strategy \"" + name + "\": the factory returned no strategy");
  return s;
}

bool StrategyRegistry::lossy(const std::string& name) const {
  const auto it = entries_.find(name);
  return it != entries_.end() && it->second.lossy;
}

std::vector<StrategyMemoryPart> StrategyRegistry::memory(const std::string& name,
                                                         const StrategyMemoryQuery& query) const {
  const auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.memory) return {};
  return it->second.memory(query);
}

void StrategyRegistry::add_search(const std::string& name, StrategySearch search) {
  const auto it = entries_.find(name);
  if (it == entries_.end())
    throw ConfigError("strategy \"" + name + "\": add the strategy before its search");
  if (!search) throw ConfigError("strategy \"" + name + "\": the search is empty");
  if (it->second.search) throw ConfigError("strategy \"" + name + "\" has a search already");
  it->second.search = std::move(search);
}

std::vector<NamedSearch> StrategyRegistry::searches() const {
  std::vector<NamedSearch> out;
  for (const auto& [name, entry] : entries_)
    if (entry.search) out.push_back({name, entry.search});
  return out;
}

std::vector<NamedSearch> strategy_searches(const StrategyRegistry* user) {
  std::vector<NamedSearch> out = {
      {"ulysses", ulysses_search}, {"pipefusion", pipefusion_search}, {"usp", usp_search}};
  if (user != nullptr)
    for (NamedSearch& s : user->searches()) out.push_back(std::move(s));
  return out;
}

std::vector<StrategyMemoryPart> attention_strategy_memory(const std::string& name,
                                                          const StrategyMemoryQuery& query,
                                                          const StrategyRegistry* user) {
  if (user != nullptr && user->contains(name)) return user->memory(name, query);
  if (name == "pipefusion") return {{"pipefusion caches", pipefusion_tile_bytes(query)}};
  const Parsed p = parse(name);
  if (p.ok && p.features.v_major) return {{"v_major caches", VMajorCache::tile_bytes(query)}};
  return {};
}

std::vector<std::string> attention_strategy_names(const StrategyRegistry* user) {
  std::vector<std::string> out = {"serial",  "flat",     "tapa", "v_first",   "pipeline",
                                  "v_major", "cocodiff", "usp",  "pipefusion"};
  if (user != nullptr)
    for (const std::string& n : user->names()) out.push_back(n);
  return out;
}

std::string attention_strategy_error(const std::string& name, const StrategyRegistry* user) {
  if (name == "serial" || name == "usp" || name == "pipefusion") return {};
  if (user != nullptr && user->contains(name)) return {};
  const Parsed p = parse(name);
  if (p.ok) return {};
  std::string list;
  for (const std::string& n : attention_strategy_names(user))
    list += (list.empty() ? "" : " | ") + n;
  return "unknown attention strategy \"" + name + "\": " + p.error + " (expected " + list +
         ", or features joined by '+': flat|tapa, v_first, pipeline, v_major)";
}

bool attention_strategy_is_lossy(const std::string& name, const StrategyOptions& options,
                                 const StrategyRegistry* user) {
  if (user != nullptr && user->contains(name)) return user->lossy(name);
  if (name == "serial" || name == "usp") return false;
  const Parsed p = parse(name);
  return p.ok && p.features.v_major && options.v_major_threshold > 0;
}

std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg,
                                                           const StrategyOptions& options,
                                                           const StrategyRegistry* user) {
  if (user != nullptr && user->contains(name)) return user->make(name, comm, cfg, options);
  if (name == "serial") {
    if (comm.size() != 1)
      throw ConfigError("strategy \"serial\" runs on one rank, not " + std::to_string(comm.size()));
    return std::make_unique<SerialAttention>();
  }
  if (name == "usp") return std::make_unique<UlyssesRing>(comm, cfg, options);
  // Its stages run blocks, not a layer's attention: generate() runs it (dit/parallel/pipefusion).
  if (name == "pipefusion")
    throw ConfigError(
        "strategy \"pipefusion\" splits the model's blocks into pipeline stages: it runs "
        "whole sampling loops (generate), not one forward pass");
  Parsed p = parse(name);
  if (!p.ok) throw ConfigError(attention_strategy_error(name));
  if (p.features.chunks > 1) p.features.chunks = options.pipeline_chunks;
  return std::make_unique<SpAttention>(name, comm, cfg, p.features, options);
}

}  // namespace cocodiff::dit
