#pragma once
// Private helpers of the MPI backend: error conversion, int-range checks, scratch buffers and
// the host/topology placement check (a pure function, so tests can feed it made-up hosts).

#include <mpi.h>

#include <cstdint>
#include <functional>
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

  // The progress watchdog (WorldOptions: a fixed progress_timeout_s, or progress_auto; with
  // neither, waits are plain MPI_Wait).
  double progress_timeout_s = 0;
  bool progress_auto = false;
  double progress_floor_s = 30;
  double progress_multiple = 10;
  int world_rank = 0, world_size = 1;
  MPI_Comm watchdog = MPI_COMM_NULL;  // a dup of the world for the "still there?" exchange
  // What the derived bound is made of: when the current phase (setup until the first step,
  // then each step) started, whether the steps have begun, and the longest step so far.
  double phase_start_s = 0;
  bool in_steps = false;
  double longest_step_s = 0;
  // Progress: waits this rank completed (sent in its answers), the probe sequence number, and
  // every rank's count at this rank's last probe that every rank answered (empty: none yet).
  std::int64_t completed_waits = 0;
  std::int64_t probe_seq = 0;
  std::vector<std::int64_t> last_counts;
  // Buffers of watchdog sends still in flight (a payload may not change until its send is done).
  struct PendingSend {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<std::int64_t[]> payload;
  };
  std::vector<PendingSend> pending_sends;
  Shared() = default;
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  ~Shared();

  bool watchdog_on() const { return progress_auto || progress_timeout_s > 0; }
  /// How long a wait that starts at `wait_start_s` (MPI_Wtime) may see no progress.
  double bound_s(double wait_start_s) const;
  /// Marks the start of a step of the run (the derived bound follows the longest step).
  void step_started();

  /// MPI_Wait, or with the watchdog on, MPI_Test until done or until no progress for the bound:
  /// then asks every other rank whether it is still making MPI calls. A rank that does not
  /// answer has stopped: CommError naming `what`, the peer `peer_world` (-1: none) and the
  /// silent ranks. When every rank answers, the wait goes on while any of them completed waits
  /// since this rank's previous such probe; when none did, they all wait on each other
  /// (mismatched communication): CommError. Answers other ranks' questions while it waits.
  int wait(MPI_Request* request, MPI_Status* status, const std::function<std::string()>& what,
           int peer_world);
  /// Answers pending "still there?" questions of other ranks (a no-op with the watchdog off).
  void answer_pings();

 private:
  /// Asks every rank; returns when progress was seen, throws CommError otherwise.
  void probe(const std::string& what, int peer_world, double waited_s, double bound);
  /// Sends two int64s (fire and forget; the buffer is kept until the send completes).
  void send_pair(std::int64_t a, std::int64_t b, int dest, int tag);
  /// Why the watchdog ended the wait: " (mpi.progress_timeout_s = 3)" or the derived bound.
  std::string bound_note(double bound) const;
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
