#pragma once
// core::Communicator over MPI (OpenMPI 4.1, C API): one process per tile, real bytes on the real
// network, `now()` in wall time. One MpiRuntime per process owns MPI_Init/MPI_Finalize; it hands
// out the world communicator after checking the run's topology against the job.
//
//   int main(int argc, char** argv) {
//     cocodiff::mpi::MpiRuntime runtime(argc, argv);
//     return runtime.run_guarded([&] {  // an exception on any rank aborts the whole job
//       std::unique_ptr<cocodiff::Communicator> world = runtime.world(topology);
//       auto node = world->split(world->topology().node(world->rank()), world->rank());
//       node->all_to_all(send, recv, n, "v");
//       return 0;
//     });
//   }
//
// Phantom buffers (empty span, non-zero count) still move their bytes, so that wall time means
// what it would with real tensors: an empty send side sends zeros from a shared scratch buffer,
// an empty receive side receives into a per-request scratch buffer that is then dropped. A rank
// with a real receive buffer whose peer sends phantom data receives zeros (the emulator leaves
// such a buffer untouched); runs mix the two only by mistake.
//
// Threading: MPI is initialised with MPI_THREAD_FUNNELED; every call on the communicators must
// come from the thread that built the runtime. OpenMPI progresses non-blocking collectives only
// inside MPI calls, so code that overlaps compute with a request should call test() now and then.

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/communicator.hpp"

namespace cocodiff::mpi {

namespace detail {
struct Shared;
}

/// How MpiRuntime::world() checks the topology against the job.
struct WorldOptions {
  /// Require that MPI's shared-memory hosts and the topology's nodes coincide. Turn off only to
  /// run a multi-node topology on fewer hosts (testing the MPI path on one machine).
  bool check_hosts = true;
  /// Progress watchdog: a wait (request or barrier) that does not complete within this many
  /// seconds asks every rank whether it still makes MPI calls and ends the job, naming the
  /// ranks that did not answer (CommError, exit code 2). 0: off (plain MPI_Wait) unless
  /// progress_auto.
  double progress_timeout_s = 0;
  /// The watchdog with a bound derived from the run instead: the largest of progress_floor_s
  /// (four times that before the first step, MpiComm::step_started), progress_multiple x the
  /// longest step so far, and progress_multiple x this rank's time in the current step (or in
  /// setup) before the wait began.
  bool progress_auto = false;
  double progress_floor_s = 30;
  double progress_multiple = 10;
};

/// MPI for the life of the object: MPI_Init_thread(FUNNELED) in the constructor, MPI_Finalize
/// in the destructor. At most one per process (MPI cannot be initialised twice).
class MpiRuntime {
 public:
  /// Initialises MPI; throws CommError if MPI is already initialised or lacks FUNNELED support.
  MpiRuntime(int& argc, char**& argv);
  /// Finalises MPI; if an exception is propagating past the runtime, aborts the job instead.
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  /// This process's rank in MPI_COMM_WORLD.
  int world_rank() const { return world_rank_; }
  /// Number of processes in MPI_COMM_WORLD.
  int world_size() const { return world_size_; }
  /// Wall time since the runtime started (the zero of every communicator's now()).
  SimTime elapsed() const;

  /// Collective over MPI_COMM_WORLD: a communicator of all ranks whose coordinates come from
  /// `topo` (copied). Throws CommError, on every rank alike, if the world size differs from
  /// topo.num_ranks() or (with check_hosts) if hosts and topology nodes disagree.
  std::unique_ptr<Communicator> world(const Topology& topo, WorldOptions options = {}) const;

  /// Throws CommError (on every rank alike, with no communication) when the world size differs
  /// from topo.num_ranks(); world() checks it too.
  void check_size(const Topology& topo) const;

  /// Runs body and returns its exit code; on any exception prints "rank R: what" to stderr and
  /// aborts the whole job (MPI_Abort, exit code 2 for a UserError, 1 otherwise). Never hangs.
  int run_guarded(const std::function<int()>& body) const;
  /// Called just before this rank aborts the job (after its message is printed): the program
  /// silences its own "ended by the launcher" notice, since this rank is the cause.
  void set_before_abort(std::function<void()> hook) { before_abort_ = std::move(hook); }
  /// Prints "cocodiff: rank R: message" to stderr and kills every rank of the job.
  [[noreturn]] void abort(std::string_view message, int exit_code) const;

  /// Collective over MPI_COMM_WORLD after work every rank does alike (resolving a config):
  /// the lowest world rank whose work failed, or -1 when none did. The job then reports one
  /// error instead of one per rank: that rank aborts with its message, the others with
  /// abort_quietly().
  int lowest_failed_rank(bool failed) const;
  /// Waits (at most a few seconds) for another rank's abort to end the job, then aborts it
  /// without a message of its own.
  [[noreturn]] void abort_quietly(int exit_code) const;

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
  double start_wtime_s_ = 0;
  int uncaught_at_start_ = 0;
  std::function<void()> before_abort_;
};

/// Exit code for an exception that ends a run: 2 for a UserError (bad input), 1 otherwise.
int exit_code_for(const std::exception& e);

/// What one process did through all communicators of its world, for the run report.
struct Accounting {
  /// fp32 payload bytes this rank sent, per topology tier (all-to-all, all-gather and
  /// point-to-point; an all-reduce's traffic depends on MPI's algorithm and is not counted).
  std::vector<std::int64_t> sent_bytes_by_tier;
  /// Wall time this rank spent blocked in wait() and barrier().
  double comm_wait_s = 0;
};

/// One group of ranks over one MPI communicator (owned; freed in the destructor).
class MpiComm final : public Communicator {
 public:
  /// Takes ownership of `comm` (a dup or split, never MPI_COMM_WORLD itself).
  MpiComm(std::shared_ptr<detail::Shared> shared, MPI_Comm comm);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const Topology& topology() const override;
  int world_rank(int group_rank) const override;
  /// Collective MPI_Comm_split; any int is a valid color (colors are renumbered densely).
  std::unique_ptr<Communicator> split(int color, int key) override;
  void barrier() override;
  /// No-op: real time passes by itself.
  void compute(const OpCost&) override {}
  /// Wall time since the MpiRuntime started (MPI_Wtime; clocks of different hosts may differ).
  SimTime now() const override;
  /// The underlying MPI communicator, for interop; still owned by this object.
  MPI_Comm handle() const { return comm_; }
  /// This process's traffic and waiting so far, over every communicator split from its world.
  Accounting accounting() const;
  /// Marks the start of a step of the run on this process (no communication): the progress
  /// watchdog's derived bound (WorldOptions::progress_auto) follows the longest step so far.
  void step_started() const;

 protected:
  Request do_iall_to_all(std::span<const float> send, std::span<float> recv, std::int64_t count,
                         std::string_view label) override;
  Request do_iall_to_allv(std::span<const float> send, std::span<float> recv,
                          const AllToAllvLayout& layout, std::string_view label) override;
  Request do_iall_gather(std::span<const float> send, std::span<float> recv, std::int64_t count,
                         std::string_view label) override;
  Request do_iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                         std::string_view label) override;
  Request do_isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                   std::string_view label) override;
  Request do_irecv(std::span<float> data, std::int64_t count, int source, int tag,
                   std::string_view label) override;

 private:
  /// "op 'label' on rank R (world rank W)", the prefix of every error this group throws.
  std::string where(std::string_view op, std::string_view label) const;
  /// Counts `elements_each` sent to every other member.
  void count_to_all(std::int64_t elements_each) const;

  std::shared_ptr<detail::Shared> shared_;
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> members_;  // world rank of each group rank
};

}  // namespace cocodiff::mpi
