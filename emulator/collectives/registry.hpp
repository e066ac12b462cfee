#pragma once
// The one list of collective algorithms: every name a cluster file, `--set`, `netbench` or
// `calibrate` accepts, with the schedule it makes. The built-ins are registered exactly as a
// user's own are (registry.cpp's list of entries, each defined in its schedule's file): a new
// built-in algorithm is its schedule's file and its line in that list, a program's one
// register_algorithm() call, and every list of names the program prints or checks is read
// from here.
//
//   Algorithm a;
//   a.kind = CollectiveKind::kAllToAll;
//   a.name = "reverse";
//   a.summary = "p-1 rounds, round k: send to r-k";
//   a.make = [](const GroupShape& g) { return make_reverse(g.size); };
//   register_algorithm(std::move(a));     // `emulator.all_to_all = "reverse"` now runs it
//   AlgorithmId id = find_algorithm(CollectiveKind::kAllToAll, "reverse");
//   std::unique_ptr<Schedule> s = make_schedule(id, group);   // its fallback where it cannot run
//
// Registration happens before engines run (it takes a lock; lookups by name too, and they are
// made once per engine, not per call).

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

/// What a collective does (the key its algorithms are listed under).
enum class CollectiveKind : std::uint8_t { kAllToAll, kAllGather, kAllReduce, kBarrier };

/// "all_to_all" | "all_gather" | "all_reduce" | "barrier".
std::string_view collective_kind_name(CollectiveKind k);

/// The members a schedule is made for: how many, and each one's topology coordinates (group
/// rank order; empty when the caller has none, as in a unit test of a flat group).
struct GroupShape {
  int size = 0;
  std::span<const std::vector<int>> coords;
};

/// One algorithm of one collective.
struct Algorithm {
  CollectiveKind kind = CollectiveKind::kAllToAll;
  std::string name;                  // as configs spell it
  std::vector<std::string> aliases;  // other spellings accepted ("pairwise" for "shift")
  std::string summary;               // one line, for --help and the docs
  /// The schedule for `group`; null when the algorithm cannot run on it (XOR pairing on a
  /// group that is not a power of two), and then `fallback` runs.
  std::function<std::unique_ptr<Schedule>(const GroupShape& group)> make;
  std::string fallback;  // an algorithm of the same kind; empty: `make` never returns null
  /// Needs every block the same size: an all-to-allv runs `fallback` instead (Bruck forwards
  /// blocks through ranks that do not know their sizes).
  bool equal_counts_only = false;
};

/// An entry of `kind` called `name` with its one-line summary and schedule (and the fallback
/// where `make` may return null): how each built-in's file writes its own.
inline Algorithm algorithm_entry(CollectiveKind kind, std::string name, std::string summary,
                                 std::function<std::unique_ptr<Schedule>(const GroupShape&)> make,
                                 std::string fallback = {}) {
  Algorithm a;
  a.kind = kind;
  a.name = std::move(name);
  a.summary = std::move(summary);
  a.make = std::move(make);
  a.fallback = std::move(fallback);
  return a;
}

/// An algorithm's place in the registry: stable for the process.
using AlgorithmId = int;

/// Adds `a`; throws ConfigError when its name or an alias is taken for its kind, when `make`
/// is empty, or when its fallback is not registered. Returns its id.
AlgorithmId register_algorithm(Algorithm a);

/// The algorithm of `kind` called `name` (or one of its aliases); -1 when there is none.
AlgorithmId find_algorithm(CollectiveKind kind, std::string_view name);

/// The algorithm registered as `id` (0 <= id < registered count).
const Algorithm& algorithm(AlgorithmId id);

/// The names of `kind`'s algorithms in registration order, each followed by its aliases when
/// `with_aliases` (every spelling a flag accepts).
std::vector<std::string> algorithm_names(CollectiveKind kind, bool with_aliases = false);

/// The names joined by `sep`: the "expected" text of a config error ("shift | xor | ...").
std::string algorithm_list(CollectiveKind kind, std::string_view sep = " | ");

/// `id`'s schedule for `group`, its fallback's (and so on) when it cannot run there.
std::unique_ptr<const Schedule> make_schedule(AlgorithmId id, const GroupShape& group);

/// The algorithm an all-to-allv runs in place of `id`: `id` itself, or its fallback when it
/// needs equal counts.
AlgorithmId variable_counts_algorithm(AlgorithmId id);

}  // namespace cocodiff::emu::collectives
