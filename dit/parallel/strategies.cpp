#include "dit/parallel/strategies.hpp"

#include <algorithm>
#include <sstream>

#include "core/errors.hpp"
#include "dit/parallel/pipefusion.hpp"
#include "dit/parallel/sp_attention.hpp"
#include "dit/parallel/usp.hpp"
#include "dit/parallel/v_major.hpp"
#include "dit/pipeline.hpp"

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

// The canonical name of a composition: its exchange, then v_first, pipeline, v_major.
std::string canonical(const Parsed& p) {
  std::string n = p.flat ? "flat" : "tapa";
  if (p.features.v_first) n += "+v_first";
  if (p.features.chunks > 1) n += "+pipeline";
  if (p.features.v_major) n += "+v_major";
  return n;
}

// Letters, digits, '_', '-', and '+' where `joins` (the built-ins' compositions).
bool well_formed(const std::string& name, bool joins) {
  std::string allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
  if (joins) allowed += '+';
  return !name.empty() && name.find_first_not_of(allowed) == std::string::npos;
}

// A Ulysses composition's entry: SpAttention with its features under the name it is run by.
StrategyEntry composition(const std::string& name, const SpFeatures& features) {
  StrategyEntry e;
  e.factory = [name, features](Communicator& comm, const ModelConfig& cfg,
                               const StrategyOptions& options) {
    SpFeatures f = features;
    if (f.chunks > 1) f.chunks = options.pipeline_chunks;
    return std::unique_ptr<AttentionStrategy>(
        std::make_unique<SpAttention>(name, comm, cfg, f, options));
  };
  e.layout = {StrategyLayout::Kind::kUlysses, /*cfg_parallel=*/true, /*single_rank=*/false};
  if (features.v_major) {
    e.lossy = [](const StrategyOptions& o) { return o.v_major_threshold > 0; };
    e.memory = [](const StrategyMemoryQuery& q) {
      return std::vector<StrategyMemoryPart>{{"v_major caches", VMajorCache::tile_bytes(q)}};
    };
  }
  return e;
}

// The strategy table: every built-in strategy, added as a program adds its own.
void add_builtins(StrategyRegistry& r) {
  StrategyEntry serial;
  serial.factory = [](Communicator& comm, const ModelConfig&,
                      const StrategyOptions&) -> std::unique_ptr<AttentionStrategy> {
    if (comm.size() != 1)
      throw ConfigError("strategy \"serial\" runs on one rank, not " + std::to_string(comm.size()));
    return std::make_unique<SerialAttention>();
  };
  serial.layout = {StrategyLayout::Kind::kOne, /*cfg_parallel=*/true, /*single_rank=*/true};
  r.add("serial", std::move(serial));
  // The Ulysses compositions: the named ones, then every composition by its canonical name.
  for (const char* name : {"flat", "tapa", "v_first", "pipeline", "v_major", "cocodiff"}) {
    StrategyEntry e = composition(name, parse(name).features);
    if (std::string(name) == kDefaultStrategy) {
      e.search = ulysses_search;
      e.layout.single_rank = true;  // one rank runs its exchanges as copies
    }
    if (std::string(name) == "cocodiff") e.probe = v_major_probe();
    r.add(name, std::move(e));
  }
  for (const bool flat : {true, false})
    for (int f = 1; f < 8; ++f) {
      Parsed c;
      c.flat = flat;
      c.features.tapa = !flat;
      c.features.v_first = (f & 1) != 0;
      c.features.chunks = (f & 2) != 0 ? 2 : 1;  // as parse() gives them
      c.features.v_major = (f & 4) != 0;
      const std::string n = canonical(c);
      r.add(n, composition(n, c.features));
    }
  // Its stages run blocks, not a layer's attention: generate() runs it (dit/parallel/pipefusion).
  StrategyEntry pipefusion;
  pipefusion.factory = [](Communicator&, const ModelConfig&,
                          const StrategyOptions&) -> std::unique_ptr<AttentionStrategy> {
    throw ConfigError(
        "strategy \"pipefusion\" splits the model's blocks into pipeline stages: it runs "
        "whole sampling loops (generate), not one forward pass");
  };
  pipefusion.memory = [](const StrategyMemoryQuery& q) {
    return std::vector<StrategyMemoryPart>{{"pipefusion caches", pipefusion_tile_bytes(q)}};
  };
  pipefusion.search = pipefusion_search;
  pipefusion.layout = {StrategyLayout::Kind::kStages, /*cfg_parallel=*/true, /*single_rank=*/true,
                       /*techniques=*/false};  // its loop runs no step cache, compresses nothing
  pipefusion.sampler = generate_pipefusion;
  r.add("pipefusion", std::move(pipefusion));
  StrategyEntry usp;
  usp.factory = [](Communicator& comm, const ModelConfig& cfg, const StrategyOptions& options) {
    return std::unique_ptr<AttentionStrategy>(std::make_unique<UlyssesRing>(comm, cfg, options));
  };
  usp.search = usp_search;
  // Its ring spans the whole cluster: CFG-parallel halves would cut it.
  usp.layout = {StrategyLayout::Kind::kRing, /*cfg_parallel=*/false, /*single_rank=*/false};
  r.add("usp", std::move(usp));
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

const StrategyRegistry& StrategyRegistry::builtins() {
  static const StrategyRegistry table = [] {
    StrategyRegistry r;
    r.builtin_ = true;
    add_builtins(r);
    return r;
  }();
  return table;
}

void StrategyRegistry::add(const std::string& name, StrategyEntry entry) {
  if (!well_formed(name, builtin_))
    throw ConfigError("strategy name \"" + name +
                      "\": expected letters, digits, '_' or '-' (no '+', which joins features)");
  // The built-ins hold every feature's name too (flat, tapa, v_first, pipeline, v_major).
  if (!builtin_ && builtins().contains(name))
    throw ConfigError("strategy name \"" + name + "\" is a built-in strategy or feature");
  if (!entry.factory) throw ConfigError("strategy \"" + name + "\": the factory is empty");
  if (!entries_.emplace(name, std::move(entry)).second)
    throw ConfigError("strategy \"" + name + "\" is already registered");
  order_.push_back(name);
}

void StrategyRegistry::add(const std::string& name, StrategyFactory factory, bool lossy,
                           StrategyMemory memory) {
  StrategyEntry e;
  e.factory = std::move(factory);
  if (lossy) e.lossy = [](const StrategyOptions&) { return true; };
  e.memory = std::move(memory);
  add(name, std::move(e));
}

const StrategyEntry* StrategyRegistry::find(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end() && builtin_ && name.find('+') != std::string::npos) {
    const Parsed p = parse(name);
    if (p.ok) it = entries_.find(canonical(p));
  }
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> StrategyRegistry::names() const {
  std::vector<std::string> out;
  for (const std::string& n : order_)
    if (n.find('+') == std::string::npos) out.push_back(n);
  return out;
}

std::unique_ptr<AttentionStrategy> StrategyRegistry::make(const std::string& name,
                                                          Communicator& comm,
                                                          const ModelConfig& cfg,
                                                          const StrategyOptions& options) const {
  const StrategyEntry* e = find(name);
  if (e == nullptr) throw ConfigError("strategy \"" + name + "\" is not registered");
  std::unique_ptr<AttentionStrategy> s = e->factory(comm, cfg, options);
  if (!s) throw ConfigError("strategy \"" + name + "\": the factory returned no strategy");
  return s;
}

bool StrategyRegistry::lossy(const std::string& name, const StrategyOptions& options) const {
  const StrategyEntry* e = find(name);
  return e != nullptr && e->lossy && e->lossy(options);
}

std::vector<StrategyMemoryPart> StrategyRegistry::memory(const std::string& name,
                                                         const StrategyMemoryQuery& query) const {
  const StrategyEntry* e = find(name);
  if (e == nullptr || !e->memory) return {};
  return e->memory(query);
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
  for (const std::string& n : order_)
    if (const StrategySearch& s = entries_.at(n).search; s) out.push_back({n, s});
  return out;
}

namespace {

// The registry that runs `name`: the program's when it has it, else the built-ins'.
const StrategyRegistry& owner(const std::string& name, const StrategyRegistry* user) {
  return user != nullptr && user->contains(name) ? *user : StrategyRegistry::builtins();
}

}  // namespace

std::vector<LossyProbe> StrategyRegistry::probes() const {
  std::vector<LossyProbe> out;
  for (const std::string& n : order_)
    if (const LossyProbe& p = entries_.at(n).probe; !p.key.empty()) out.push_back(p);
  return out;
}

std::string StrategyRegistry::first_of(StrategyLayout::Kind kind) const {
  for (const std::string& n : order_)
    if (entries_.at(n).layout.kind == kind) return n;
  return {};
}

const StrategyEntry* attention_strategy_entry(const std::string& name,
                                              const StrategyRegistry* user) {
  return owner(name, user).find(name);
}

const StrategyLayout& attention_strategy_layout(const std::string& name,
                                                const StrategyRegistry* user) {
  static const StrategyLayout own;
  const StrategyEntry* e = attention_strategy_entry(name, user);
  return e != nullptr ? e->layout : own;
}

std::string strategy_of_layout(StrategyLayout::Kind kind, const StrategyRegistry* user) {
  std::string n = StrategyRegistry::builtins().first_of(kind);
  return n.empty() && user != nullptr ? user->first_of(kind) : n;
}

std::vector<LossyProbe> strategy_lossy_probes(const StrategyRegistry* user) {
  std::vector<LossyProbe> out = StrategyRegistry::builtins().probes();
  if (user != nullptr)
    for (LossyProbe& p : user->probes()) out.push_back(std::move(p));
  return out;
}

std::vector<NamedSearch> strategy_searches(const StrategyRegistry* user) {
  std::vector<NamedSearch> out = StrategyRegistry::builtins().searches();
  if (user != nullptr)
    for (NamedSearch& s : user->searches()) out.push_back(std::move(s));
  return out;
}

std::vector<StrategyMemoryPart> attention_strategy_memory(const std::string& name,
                                                          const StrategyMemoryQuery& query,
                                                          const StrategyRegistry* user) {
  return owner(name, user).memory(name, query);
}

std::vector<std::string> attention_strategy_names(const StrategyRegistry* user) {
  std::vector<std::string> out = StrategyRegistry::builtins().names();
  if (user != nullptr)
    for (const std::string& n : user->names()) out.push_back(n);
  return out;
}

std::string attention_strategy_error(const std::string& name, const StrategyRegistry* user) {
  if (owner(name, user).contains(name)) return {};
  const Parsed p = parse(name);
  std::string list;
  for (const std::string& n : attention_strategy_names(user))
    list += (list.empty() ? "" : " | ") + n;
  return "unknown attention strategy \"" + name +
         "\": " + (p.ok ? std::string("not registered") : p.error) + " (expected " + list +
         ", or features joined by '+': flat|tapa, v_first, pipeline, v_major)";
}

bool attention_strategy_is_lossy(const std::string& name, const StrategyOptions& options,
                                 const StrategyRegistry* user) {
  return owner(name, user).lossy(name, options);
}

std::unique_ptr<AttentionStrategy> make_attention_strategy(const std::string& name,
                                                           Communicator& comm,
                                                           const ModelConfig& cfg,
                                                           const StrategyOptions& options,
                                                           const StrategyRegistry* user) {
  const StrategyRegistry& r = owner(name, user);
  if (!r.contains(name)) throw ConfigError(attention_strategy_error(name, user));
  return r.make(name, comm, cfg, options);
}

}  // namespace cocodiff::dit
