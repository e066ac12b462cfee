#pragma once
// Private helpers of the MPI backend: error conversion, int-range checks, scratch buffers and
// the host/topology placement check (a pure function, so tests can feed it made-up hosts).

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/topology.hpp"

namespace cocodiff::mpi::detail {

/// State shared by the world communicator and every group split from it.
struct Shared {
  Topology topology;
  double start_wtime_s = 0;
  int tag_ub = 32767;  // MPI_TAG_UB of MPI_COMM_WORLD (the standard guarantees at least this)
  /// Zeros that phantom sends read from; grows on demand, never shrinks. In-flight requests
  /// keep the buffer they used alive, so growing never frees memory MPI still reads.
  std::shared_ptr<const std::vector<float>> zeros;

  /// A zero buffer of at least n floats.
  std::shared_ptr<const std::vector<float>> zeros_of(std::int64_t n);

  // What this process did through every communicator of its world (MPI_THREAD_FUNNELED: one
  // thread, no locking): payload bytes it sent per tier of the topology, and wall time it spent
  // blocked waiting for communication (in wait() and barrier()).
  std::vector<std::int64_t> sent_bytes_by_tier;  // one entry per tier, from world()
  double comm_wait_s = 0;
  /// Counts `elements` fp32 values sent from world rank `from` to world rank `to`.
  void count_sent(int from, int to, std::int64_t elements);
};

/// Throws CommError("<where>: <MPI error string> (MPI error class N)") unless rc is MPI_SUCCESS.
void check_mpi(int rc, std::string_view where);

/// `value` as an int for MPI; throws CommError naming `what` when it does not fit.
int to_mpi_int(std::int64_t value, std::string_view what, std::string_view where);

/// Empty when the placement is consistent; otherwise a message naming a rank and where it runs.
/// host_id[r] identifies world rank r's host (ranks with equal ids share a host); host_name[r]
/// is its name for messages. Consistent means: equal host <=> equal topology node.
std::string placement_error(const Topology& topo, std::span<const int> host_id,
                            std::span<const std::string> host_name);

}  // namespace cocodiff::mpi::detail
