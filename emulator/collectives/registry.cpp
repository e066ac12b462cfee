#include "emulator/collectives/registry.hpp"

#include <bit>
#include <deque>
#include <mutex>

#include "core/errors.hpp"

namespace cocodiff::emu::collectives {

namespace {

bool power_of_two(int p) { return std::has_single_bit(static_cast<unsigned>(p)); }

using Make = std::function<std::unique_ptr<Schedule>(const GroupShape&)>;

Algorithm entry(CollectiveKind kind, std::string name, std::string summary, Make make,
                std::string fallback = {}) {
  Algorithm a;
  a.kind = kind;
  a.name = std::move(name);
  a.summary = std::move(summary);
  a.make = std::move(make);
  a.fallback = std::move(fallback);
  return a;
}

/// The built-in algorithms, registered as any other: one entry per schedule file.
std::vector<Algorithm> builtins() {
  using K = CollectiveKind;
  std::vector<Algorithm> list;
  list.push_back(entry(K::kAllToAll, "shift", "p-1 rounds, round k: send to r+k, receive from r-k",
                       [](const GroupShape& g) { return make_pairwise_shift(g.size); }));
  list.back().aliases = {"pairwise"};
  list.push_back(entry(
      K::kAllToAll, "xor", "p-1 rounds, round k: exchange with r XOR k (p a power of two)",
      [](const GroupShape& g) -> std::unique_ptr<Schedule> {
        return power_of_two(g.size) ? make_pairwise_xor(g.size) : nullptr;
      },
      "shift"));
  list.push_back(entry(K::kAllToAll, "concurrent",
                       "every message posted at once (grouped send/recv)",
                       [](const GroupShape& g) { return make_concurrent(g.size); }));
  list.push_back(entry(
      K::kAllToAll, "bruck", "ceil(log2 p) rounds forwarding blocks, equal counts",
      [](const GroupShape& g) { return make_bruck(g.size); }, "shift"));
  list.back().equal_counts_only = true;
  list.push_back(entry(K::kAllGather, "ring", "p-1 rounds passing one block to the right",
                       [](const GroupShape& g) { return make_ring_all_gather(g.size); }));
  list.push_back(entry(
      K::kAllGather, "hierarchical", "one ring per topology level the group spans, innermost first",
      [](const GroupShape& g) -> std::unique_ptr<Schedule> {
        if (static_cast<int>(g.coords.size()) != g.size) return nullptr;
        return make_hierarchical_all_gather(g.coords);
      },
      "ring"));
  list.push_back(entry(K::kAllReduce, "ring", "ring reduce-scatter, then ring all-gather",
                       [](const GroupShape& g) { return make_ring_all_reduce(g.size); }));
  list.push_back(entry(K::kBarrier, "dissemination", "ceil(log2 p) rounds of empty messages",
                       [](const GroupShape& g) { return make_dissemination_barrier(g.size); }));
  return list;
}

struct Registry {
  std::mutex mu;
  std::deque<Algorithm> list;  // deque: references stay valid as algorithms are added
};

AlgorithmId find_locked(const Registry& r, CollectiveKind kind, std::string_view name) {
  for (std::size_t i = 0; i < r.list.size(); ++i) {
    const Algorithm& a = r.list[i];
    if (a.kind != kind) continue;
    if (a.name == name) return static_cast<AlgorithmId>(i);
    for (const std::string& alias : a.aliases)
      if (alias == name) return static_cast<AlgorithmId>(i);
  }
  return -1;
}

AlgorithmId add_locked(Registry& r, Algorithm a) {
  const std::string kind(collective_kind_name(a.kind));
  if (a.name.empty() || !a.make)
    throw ConfigError(kind + " algorithm \"" + a.name + "\": needs a name and a schedule");
  std::vector<std::string> names = a.aliases;
  names.push_back(a.name);
  for (const std::string& n : names)
    if (find_locked(r, a.kind, n) >= 0)
      throw ConfigError(
          std::string(kind).append(" algorithm \"").append(n).append("\" is registered already"));
  if (!a.fallback.empty() && find_locked(r, a.kind, a.fallback) < 0)
    throw ConfigError(kind + " algorithm \"" + a.name + "\": its fallback \"" + a.fallback +
                      "\" is not registered");
  r.list.push_back(std::move(a));
  return static_cast<AlgorithmId>(r.list.size() - 1);
}

/// The registry, holding the built-ins from its first use on.
Registry& registry() {
  static Registry r;
  static const bool ready = [] {
    std::lock_guard<std::mutex> lock(r.mu);
    for (Algorithm& a : builtins()) add_locked(r, std::move(a));
    return true;
  }();
  (void)ready;
  return r;
}

}  // namespace

std::string_view collective_kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

AlgorithmId register_algorithm(Algorithm a) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return add_locked(r, std::move(a));
}

AlgorithmId find_algorithm(CollectiveKind kind, std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return find_locked(r, kind, name);
}

const Algorithm& algorithm(AlgorithmId id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  COCO_CHECK(id >= 0 && static_cast<std::size_t>(id) < r.list.size(), "unknown algorithm id");
  return r.list[static_cast<std::size_t>(id)];
}

std::vector<std::string> algorithm_names(CollectiveKind kind, bool with_aliases) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const Algorithm& a : r.list) {
    if (a.kind != kind) continue;
    out.push_back(a.name);
    if (with_aliases) out.insert(out.end(), a.aliases.begin(), a.aliases.end());
  }
  return out;
}

std::string algorithm_list(CollectiveKind kind, std::string_view sep) {
  std::string out;
  for (const std::string& n : algorithm_names(kind)) {
    if (!out.empty()) out += sep;
    out += n;
  }
  return out;
}

std::unique_ptr<const Schedule> make_schedule(AlgorithmId id, const GroupShape& group) {
  for (;;) {
    const Algorithm& a = algorithm(id);
    if (std::unique_ptr<Schedule> s = a.make(group)) return s;
    COCO_CHECK(!a.fallback.empty(), "an algorithm without a fallback made no schedule");
    id = find_algorithm(a.kind, a.fallback);
  }
}

AlgorithmId variable_counts_algorithm(AlgorithmId id) {
  const Algorithm& a = algorithm(id);
  return a.equal_counts_only ? find_algorithm(a.kind, a.fallback) : id;
}

}  // namespace cocodiff::emu::collectives
