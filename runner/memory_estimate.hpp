#pragma once
// How much memory a run will take, computed from its plan before anything heavy is allocated,
// and the check against `emulator.memory_limit` that turns an expected OOM kill into a clear
// ResourceError (exit 2). The estimate is an upper-ish bound, calibrated against measured peak
// RSS (bench/README.md, "Memory estimate").
//
//   RunPlan plan = resolve_run_plan("configs/quickstart.toml", {});
//   MemoryEstimate m = estimate_memory(plan, "emulator");
//   std::cout << m.summary() << "\n";      // "memory     ~1.2 GiB estimated (weights ...)"
//   check_memory_limit(plan, m);            // throws ResourceError above plan.memory_limit_bytes

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runner/run_plan.hpp"

namespace cocodiff::apps {

/// One part of the estimate, in bytes.
struct MemoryPart {
  std::string name;  // "weights", "activations", a strategy's ("v_major caches"), ...
  std::int64_t bytes = 0;
};

struct MemoryEstimate {
  std::vector<MemoryPart> parts;  // in a fixed order; zero parts included
  std::string scope;              // "this process" (emulator) or "N MPI processes on this host"
  /// Sum of the parts, in bytes.
  std::int64_t total_bytes() const;
  /// The largest part.
  const MemoryPart& biggest() const;
  /// One line: total and the non-zero parts, in human units.
  std::string summary() const;
};

/// The estimated peak resident memory of `plan` on `backend` ("emulator" or "mpi"): weights
/// (fp32, one shared copy on the emulator, one per MPI process), per-tile activations, what the
/// strategy keeps (dit::attention_strategy_memory: V-Major's caches, ...), the token positions
/// of RoPE models (phantom runs too), phantom bookkeeping, fiber stacks, trace buffers and the
/// program itself.
MemoryEstimate estimate_memory(const RunPlan& plan, const std::string& backend);

/// Throws ResourceError naming the estimate, its biggest part and emulator.memory_limit when
/// the estimate exceeds plan.memory_limit_bytes; does nothing when there is no limit.
void check_memory_limit(const RunPlan& plan, const MemoryEstimate& estimate);

/// MemAvailable of /proc/meminfo in bytes; nullopt when it cannot be read.
std::optional<std::int64_t> available_memory_bytes();

/// This process's peak resident memory since it started (VmHWM of /proc/self/status: unlike
/// getrusage's ru_maxrss it leaves out what a parent held before the exec); nullopt if unreadable.
std::optional<std::int64_t> peak_resident_bytes();

/// "1.50 GiB", "512.0 MiB", "12 B": binary units, three significant digits.
std::string human_bytes(std::int64_t bytes);

}  // namespace cocodiff::apps
