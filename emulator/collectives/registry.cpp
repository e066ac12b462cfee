#include "emulator/collectives/registry.hpp"

#include <deque>
#include <mutex>

#include "core/errors.hpp"

namespace cocodiff::emu::collectives {

// The built-in algorithms' entries, each defined in its schedule's file: a new algorithm is its
// file and one line in each of these two lists.
Algorithm builtin_shift();
Algorithm builtin_xor();
Algorithm builtin_concurrent();
Algorithm builtin_bruck();
Algorithm builtin_ring_all_gather();
Algorithm builtin_hierarchical_all_gather();
Algorithm builtin_ring_all_reduce();
Algorithm builtin_dissemination_barrier();

namespace {

/// The built-in algorithms, registered as any other.
std::vector<Algorithm> builtins() {
  return {builtin_shift(),           builtin_xor(),
          builtin_concurrent(),      builtin_bruck(),
          builtin_ring_all_gather(), builtin_hierarchical_all_gather(),
          builtin_ring_all_reduce(), builtin_dissemination_barrier()};
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
