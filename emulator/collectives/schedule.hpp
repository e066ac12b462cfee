#pragma once
// Collectives as schedules: for member `me` of a group of p, the rounds of the algorithm and in
// each what is received and sent (peer, segments of which buffer). A schedule knows nothing of
// fibers, engines or networks; a runner executes it: message by message on a fiber
// (run_on_fiber, the reference) or at the collective level in the engine (the fast path). One
// file per algorithm, its registry entry beside it (registry.cpp lists them); the library model
// names the ones a run uses (LibraryModel), and the engine looks them up once
// (Kernel::algorithms).
//
//   std::unique_ptr<Schedule> s = make_bruck(/*p=*/8);
//   const Sizes sizes = Sizes::uniform(/*count=*/4);
//   for (int i = 0; i < s->rounds(); ++i)
//     for (int k = 0; k < s->sends(me, i); ++k) {
//       const Message m = s->send(sizes, me, i, k);  // to m.peer, m.count elements
//     }
//
// A round of member `me`: post every receive of the round, then every send (each after the
// library's software time for its size), then wait for them in that order. A message sent in
// round i is received in round i, and the k-th send of `me` to `peer` in a round is the
// receive of `peer` that names `me` at the same k.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/topology.hpp"

namespace cocodiff::emu::collectives {

/// What one member knows of a call's sizes: an equal count per block, or per-peer counts and
/// displacements (all-to-allv; ring pass block sizes in send_counts).
struct Sizes {
  std::int64_t count = 0;
  const std::int64_t* send_counts = nullptr;  // null: `count` for every peer
  const std::int64_t* send_displs = nullptr;
  const std::int64_t* recv_counts = nullptr;
  const std::int64_t* recv_displs = nullptr;

  static Sizes uniform(std::int64_t count) { return Sizes{count}; }
  std::int64_t send_count(int peer) const { return send_counts ? send_counts[peer] : count; }
  std::int64_t send_displ(int peer) const { return send_displs ? send_displs[peer] : peer * count; }
  std::int64_t recv_count(int peer) const { return recv_counts ? recv_counts[peer] : count; }
  std::int64_t recv_displ(int peer) const { return recv_displs ? recv_displs[peer] : peer * count; }
};

/// The buffers a member names: the caller's send and receive buffers, a scratch buffer the
/// runner allocates (Schedule::scratch elements) when data moves, and a ring pass's blocks
/// (RingPass::data: block `offset` of every part, where the caller keeps it).
enum class Buffer : std::uint8_t { kSend, kRecv, kScratch, kBlock };

/// `count` elements of a buffer from `offset`.
struct Segment {
  Buffer buffer = Buffer::kSend;
  std::int64_t offset = 0, count = 0;
};

/// One message of a round as one end names it.
struct Message {
  int peer = 0;            // group rank of the other end
  int step = 0;            // tells messages of one pair in one call apart (their tag)
  std::int64_t count = 0;  // elements
  /// Where the elements are (sending) or go (receiving), when they are one segment.
  Segment at;
  /// Several segments, in the order they travel: Schedule::segments lists them.
  bool gathered = false;
};

class Schedule {
 public:
  explicit Schedule(int p) : p_(p) {}
  virtual ~Schedule() = default;
  Schedule(const Schedule&) = delete;
  Schedule& operator=(const Schedule&) = delete;

  /// Members of the group.
  int size() const { return p_; }
  /// Rounds of every member (0 when there is nothing to move).
  virtual int rounds() const = 0;
  /// Messages member `me` receives and sends in `round`.
  virtual int recvs(int me, int round) const;
  virtual int sends(int me, int round) const;
  /// The k-th receive and send of member `me` in `round`.
  virtual Message recv(const Sizes& s, int me, int round, int k) const = 0;
  virtual Message send(const Sizes& s, int me, int round, int k) const = 0;
  /// The segments of a gathered message (the sender's when `sending`), in travel order.
  virtual void segments(const Sizes& s, int me, int round, int k, bool sending,
                        std::vector<Segment>& out) const;
  /// A member's own block, copied from `from` to `to` before its first round (none: nullopt).
  struct Copy {
    Segment from, to;
  };
  virtual std::optional<Copy> own(const Sizes& s, int me) const;
  /// True when a member has at most one message in flight each way at any time (a round
  /// receives once and sends once): a message of it can be timed alone.
  virtual bool one_each_way() const { return true; }
  /// True when the receives of `round` are combined into their segment (ReduceOp) instead of
  /// overwriting it.
  virtual bool reduces(int round) const;
  /// Scratch elements a member needs when data moves.
  virtual std::int64_t scratch(const Sizes& s) const;
  /// Elements of member `me`'s own block that the kernel copies or reduces in line with its
  /// messages (LibraryModel::local_copy_bytes_per_s): a ring's, not an all-to-all's.
  virtual std::int64_t local_elements(const Sizes& /*s*/, int /*me*/) const { return 0; }
  /// True when every round a member sends to the same one peer and receives from the same one
  /// (a ring): its routes can be asked once for the whole call.
  virtual bool same_peers() const { return false; }
  /// When the caller computes beside the rounds (a ring pass: RingPass::work, one charge per
  /// round while its messages travel, and one after the last), the block member `me` computes
  /// on in `round` (0 ... rounds()).
  virtual int work_block(int /*me*/, int round) const { return round; }

 private:
  int p_;
};

// The algorithms, one file each.

/// All-to-all, p-1 rounds; round k: send to r+k, receive from r-k (pairwise_shift.cpp).
std::unique_ptr<Schedule> make_pairwise_shift(int p);
/// All-to-all, p-1 rounds; round k: exchange with r XOR k; p a power of two (pairwise_xor.cpp).
std::unique_ptr<Schedule> make_pairwise_xor(int p);
/// All-to-all, one round: every receive, then every send (concurrent.cpp).
std::unique_ptr<Schedule> make_concurrent(int p);
/// All-to-all of equal counts, ceil(log2 p) rounds (bruck.cpp).
std::unique_ptr<Schedule> make_bruck(int p);
/// All-gather, p-1 rounds passing one block to the right (ring_all_gather.cpp).
std::unique_ptr<Schedule> make_ring_all_gather(int p);
/// All-gather in one ring per topology level the group spans, innermost first; `coords` holds
/// each member's topology coordinates. Null when the members are not a full grid of the levels
/// they span (hierarchical_all_gather.cpp).
std::unique_ptr<Schedule> make_hierarchical_all_gather(std::span<const std::vector<int>> coords);
/// Reduce-scatter of `count` elements in p chunks, p-1 rounds (ring_reduce_scatter.cpp).
std::unique_ptr<Schedule> make_ring_reduce_scatter(int p);
/// All-reduce: the ring reduce-scatter, then a ring all-gather of the chunks (ring_all_reduce.cpp).
std::unique_ptr<Schedule> make_ring_all_reduce(int p);
/// Barrier: ceil(log2 p) rounds of empty messages (dissemination_barrier.cpp).
std::unique_ptr<Schedule> make_dissemination_barrier(int p);
/// Ring pass (Communicator::ring_pass): p-1 rounds passing the held block to the right while
/// computing on it; block sizes in Sizes::send_counts (ring_pass.cpp).
std::unique_ptr<Schedule> make_ring_pass(int p);

/// Chunk c of `count` elements cut into p chunks: its first element and its size.
inline std::int64_t chunk_begin(std::int64_t count, int p, int c) { return count * c / p; }
inline std::int64_t chunk_size(std::int64_t count, int p, int c) {
  return chunk_begin(count, p, c + 1) - chunk_begin(count, p, c);
}
/// A message of several segments (Schedule::segments).
inline Message gathered(int peer, int step, std::int64_t count) {
  Message m;
  m.peer = peer;
  m.step = step;
  m.count = count;
  m.gathered = true;
  return m;
}
/// a mod p in [0, p).
inline int wrap(int a, int p) {
  a %= p;
  return a < 0 ? a + p : a;
}

}  // namespace cocodiff::emu::collectives
