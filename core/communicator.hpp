#pragma once
// The one network interface the DiT code sees; the emulator and MPI backends implement it.
// Buffers are fp32 spans. An empty span with a non-zero count moves sizes only (phantom mode):
// the transfer takes its time and is counted, but no bytes are copied.
//
//   std::vector<float> send(comm.size() * n), recv(comm.size() * n);
//   Request v = comm.iall_to_all(send, recv, n, "v");  // returns at once
//   comm.compute({OpKind::kGemm, flops, bytes, "qk_proj"});  // overlaps with v in flight
//   v.wait();                                            // clock = max(clock, v's completion)
//   auto sub = comm.split(comm.coords(comm.rank())[2], comm.rank());  // one group per node
// A backend may offer more beside it: the emulator's exact replay of repeated regions and calls
// (core/replay.hpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/op_cost.hpp"
#include "core/sim_time.hpp"
#include "core/topology.hpp"

namespace cocodiff {

/// Backend side of a Request.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
  /// When the operation completed, if the backend knows it better than the caller's clock at
  /// the moment it saw the completion (the emulator knows the exact virtual time).
  virtual std::optional<SimTime> completed_at() const { return std::nullopt; }
};

/// Handle to a non-blocking operation. A default-constructed Request is already complete.
class Request {
 public:
  Request() = default;
  explicit Request(std::shared_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}
  /// Blocks until the operation completes (the emulator advances the caller's clock to it).
  void wait();
  /// True once complete at the caller's current time; never blocks for long.
  bool test();
  /// After wait() or a test() that returned true: when the operation completed (emulator: its
  /// exact virtual completion time, possibly before the caller looked), or `seen` when the
  /// backend cannot tell (MPI: real time has no record of it).
  SimTime completed_at(SimTime seen) const;

 private:
  std::shared_ptr<RequestImpl> impl_;
};

/// Waits for every request in turn.
void wait_all(std::span<Request> requests);

enum class ReduceOp : std::uint8_t { kSum, kMax };

/// A ring pass with compute beside every round: ring attention's exchange of key/value chunks.
/// `parts` buffers travel together (keys and values: 2); block j of each belongs to member j.
struct RingPass {
  int parts = 1;
  /// Elements of block j (of every part), the same on every rank: size() entries.
  std::vector<std::int64_t> counts;
  /// Where block `block` of part `part` lives on this rank (at least counts[block] elements).
  /// The caller's own block (rank()) holds its data; the pass fills every other one. Empty
  /// (no function, or empty spans): sizes only, as in phantom mode.
  std::function<std::span<float>(int part, int block)> data;
  /// One charge per round (size() of them): round i computes on block (rank() - i) mod size()
  /// while the next block travels. Labels must outlive the call.
  std::vector<OpCost> work;
  /// One label per part, naming its messages (kept alive by the caller).
  std::vector<std::string_view> labels;
};

/// Counts and displacements (in elements) of a variable all-to-all, one entry per group rank.
struct AllToAllvLayout {
  std::vector<std::int64_t> send_counts, send_displs, recv_counts, recv_displs;
  /// Packed layout: displacements are prefix sums of the counts.
  static AllToAllvLayout packed(std::vector<std::int64_t> send_counts,
                                std::vector<std::int64_t> recv_counts);
  std::int64_t send_total() const;
  std::int64_t recv_total() const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// The whole cluster's topology (all world ranks).
  virtual const Topology& topology() const = 0;
  /// World rank of a member of this group.
  virtual int world_rank(int group_rank) const = 0;
  /// Topology coordinates (innermost first) of a member of this group.
  std::vector<int> coords(int group_rank) const {
    return topology().coords(world_rank(group_rank));
  }

  /// Collective: a new group of the ranks that passed the same color, ordered by (key, rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  /// Equal-count all-to-all: block j (count elements) of send goes to rank j, block i of recv
  /// comes from rank i. Non-blocking; buffers must stay alive until the request completes, and
  /// so must an all-to-allv layout's arrays (as MPI_Ialltoallv's counts and displacements).
  Request iall_to_all(std::span<const float> send, std::span<float> recv, std::int64_t count,
                      std::string_view label = {});
  Request iall_to_allv(std::span<const float> send, std::span<float> recv,
                       const AllToAllvLayout& layout, std::string_view label = {});
  /// Every rank's `count` elements, in rank order, land in recv (size() * count).
  Request iall_gather(std::span<const float> send, std::span<float> recv, std::int64_t count,
                      std::string_view label = {});
  /// In-place reduction of `count` elements across the group.
  Request iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                      std::string_view label = {});
  Request isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                std::string_view label = {});
  Request irecv(std::span<float> data, std::int64_t count, int source, int tag,
                std::string_view label = {});

  void all_to_all(std::span<const float> send, std::span<float> recv, std::int64_t count,
                  std::string_view label = {}) {
    iall_to_all(send, recv, count, label).wait();
  }
  void all_to_allv(std::span<const float> send, std::span<float> recv,
                   const AllToAllvLayout& layout, std::string_view label = {}) {
    iall_to_allv(send, recv, layout, label).wait();
  }
  void all_gather(std::span<const float> send, std::span<float> recv, std::int64_t count,
                  std::string_view label = {}) {
    iall_gather(send, recv, count, label).wait();
  }
  void all_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                  std::string_view label = {}) {
    iall_reduce(data, count, op, label).wait();
  }
  void send(std::span<const float> data, std::int64_t count, int dest, int tag) {
    isend(data, count, dest, tag).wait();
  }
  void recv(std::span<float> data, std::int64_t count, int source, int tag) {
    irecv(data, count, source, tag).wait();
  }
  /// Collective: passes every member's blocks once around the ring (rank r sends to r + 1 and
  /// receives from r - 1), computing beside the messages. Round i = 0..size()-1: post the
  /// receives of block (r - i - 1) mod size() and the sends of block (r - i) mod size(), one
  /// message per part with tag parts * i + part (receives first, parts in order), charge
  /// `work[i]`, then wait for the round's messages in the order they were posted. The last
  /// round only computes. On return every block of every part holds its owner's data.
  void ring_pass(const RingPass& pass);

  /// Blocks until every member has arrived. It blocks the caller's host too (as MPI_Barrier
  /// and torch.distributed.barrier do): in the emulator, where the device has a host
  /// ([device.host]), nothing is issued after it before the tile's clock.
  virtual void barrier() = 0;

  /// Charges the caller's device for one operation (emulator); a no-op on real hardware.
  virtual void compute(const OpCost& cost) = 0;
  /// Whether this rank's host issues transformer blocks as their reference implementation does
  /// (DeviceModel::host_reference): the models then charge one KernelClass::kHostBlock op a
  /// block. False on real hardware and by default.
  virtual bool host_reference() const { return false; }
  /// The caller's clock: virtual time on the emulator, wall time since start on MPI.
  virtual SimTime now() const = 0;

  /// Runs `work` and returns once it has run: arithmetic on buffers the caller owns that
  /// neither charges nor communicates (charge it with compute()). The emulator may hand it to
  /// one of its math threads and run other tiles meanwhile (EngineOptions::workers); it gives
  /// the same result either way. Here and on MPI: run on the calling thread.
  virtual void run_math(const std::function<void()>& work) { work(); }

 protected:
  virtual Request do_iall_to_all(std::span<const float> send, std::span<float> recv,
                                 std::int64_t count, std::string_view label) = 0;
  virtual Request do_iall_to_allv(std::span<const float> send, std::span<float> recv,
                                  const AllToAllvLayout& layout, std::string_view label) = 0;
  virtual Request do_iall_gather(std::span<const float> send, std::span<float> recv,
                                 std::int64_t count, std::string_view label) = 0;
  virtual Request do_iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                                 std::string_view label) = 0;
  virtual Request do_isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                           std::string_view label) = 0;
  virtual Request do_irecv(std::span<float> data, std::int64_t count, int source, int tag,
                           std::string_view label) = 0;
  /// The pass as the point-to-point messages and charges ring_pass() describes; a backend may
  /// schedule the same messages another way (the emulator's collective level).
  virtual void do_ring_pass(const RingPass& pass);

 private:
  void check_buffer(std::size_t have, std::int64_t need, const char* what, const char* op) const;
  void check_peer(int peer, const char* op) const;
};

}  // namespace cocodiff
