#pragma once
// Software costs of a collective library, as data: what a real NCCL / oneCCL / MPI spends on
// top of the wire. The emulator's collective algorithms (emulator/collectives/) ask this model
// which schedule to run and how long each call and each message costs the sender before the
// network sees it; a fast path that skips the algorithms charges the same numbers through
// all_to_all_time_contention_free(). `ideal` (every cost zero, shift pairwise) is the exact
// network-only model.
//
//   LibraryModel nccl{.name = "nccl", .call_overhead = SimTime::from_ns(20'000), ...};
//   AllToAllAlgorithm a = choose_all_to_all(nccl, /*ranks=*/16, /*wire_bytes_per_peer=*/1 << 20);
//   for (int k = 1; k < 16; ++k) send_to(pairwise_send_peer(a, 16, rank, k));
//   SimTime sw = message_software_time(nccl, 1 << 20);   // before each send is posted

#include <cstdint>
#include <string>
#include <string_view>

#include "core/sim_time.hpp"

namespace cocodiff {

/// How an all-to-all orders its messages.
enum class AllToAllAlgorithm : std::uint8_t {
  kShift,       // p-1 synchronised rounds, round k: send to r+k, receive from r-k
  kXor,         // p-1 synchronised rounds, round k: exchange with r XOR k (p a power of two)
  kConcurrent,  // every message posted at once (grouped send/recv)
  kBruck,       // ceil(log2 p) rounds, round k: send every block whose distance has bit k to
                // r + 2^k (MPICH's short-message algorithm); equal counts only
};

/// "shift" | "xor" | "concurrent" | "bruck".
std::string_view all_to_all_algorithm_name(AllToAllAlgorithm a);
/// Parses a name of all_to_all_algorithm_name(); false when unknown.
bool parse_all_to_all_algorithm(std::string_view name, AllToAllAlgorithm& out);

/// How an all-gather moves its blocks.
enum class AllGatherAlgorithm : std::uint8_t {
  kRing,          // p-1 rounds passing one block to the right neighbour
  kHierarchical,  // one ring per topology level the group spans, innermost first, each
                  // passing everything gathered so far (NCCL's intra/inter split, TAPA's phases)
};

/// "ring" | "hierarchical".
std::string_view all_gather_algorithm_name(AllGatherAlgorithm a);
/// Parses a name of all_gather_algorithm_name(); false when unknown.
bool parse_all_gather_algorithm(std::string_view name, AllGatherAlgorithm& out);

/// One library's software costs. Every time is charged on the sending rank, serially: a rank
/// posts its messages one after another, each after its own software time.
struct LibraryModel {
  std::string name = "ideal";
  /// Charged once per collective call before its first message (launch, proxy wake-up).
  SimTime call_overhead;
  /// Charged before every message (per peer per round), eager or rendezvous.
  SimTime message_overhead;
  /// Messages of at most this many wire bytes go eager; larger ones rendezvous. -1: none eager.
  std::int64_t eager_max_bytes = -1;
  /// Extra per eager message, and the staging copy's rate (0: no staging copy).
  SimTime eager_overhead;
  double eager_copy_bytes_per_s = 0;
  /// Extra per rendezvous message (the ready-to-send / clear-to-send handshake).
  SimTime rendezvous_overhead;
  /// Pipelining: a message is cut into chunks of this many bytes (0: not cut), each chunk after
  /// the first costing chunk_overhead more.
  std::int64_t chunk_bytes = 0;
  SimTime chunk_overhead;
  /// All-to-all schedule for messages above all_to_all_small_max_bytes, and at or below it.
  AllToAllAlgorithm all_to_all_large = AllToAllAlgorithm::kShift;
  AllToAllAlgorithm all_to_all_small = AllToAllAlgorithm::kShift;
  std::int64_t all_to_all_small_max_bytes = -1;
  /// All-gather schedule.
  AllGatherAlgorithm all_gather = AllGatherAlgorithm::kRing;
  /// A ring kernel's work on the caller's own block (all-gather: copying it into place;
  /// reduce-scatter and all-reduce: its own chunk), done in line with its messages: its wire
  /// bytes at this rate, charged once per call before the first message (0: free). NCCL's ring
  /// kernels copy the own block in the pipeline that sends; an all-to-all's own block is a
  /// concurrent copy beside its sends and costs nothing here.
  double local_copy_bytes_per_s = 0;

  /// True when the library adds nothing to the network's time (today's exact model).
  bool is_free() const;
};

/// Software time a sender spends on one message of `wire_bytes` before it enters the network.
SimTime message_software_time(const LibraryModel& lib, std::int64_t wire_bytes);

/// Time a ring kernel spends on `wire_bytes` of the caller's own block (local_copy_bytes_per_s;
/// zero when it is 0).
SimTime local_copy_time(const LibraryModel& lib, std::int64_t wire_bytes);

/// The all-to-all schedule the library runs for `ranks` ranks and at most `wire_bytes_per_peer`
/// bytes to any one peer. XOR pairing needs a power-of-two rank count; otherwise shift.
AllToAllAlgorithm choose_all_to_all(const LibraryModel& lib, int ranks,
                                    std::int64_t wire_bytes_per_peer);

/// The peer rank r sends to in round k (1 <= k < ranks) of a pairwise schedule.
int pairwise_send_peer(AllToAllAlgorithm a, int ranks, int r, int k);
/// The peer rank r receives from in round k of a pairwise schedule.
int pairwise_recv_peer(AllToAllAlgorithm a, int ranks, int r, int k);

/// Time of an all-to-all of `wire_bytes_per_peer` among `ranks` ranks that all start together,
/// on a network where every message takes `alpha + bytes / bytes_per_s` whatever else runs.
/// Pairwise: call + (p-1) (sw + alpha + m/B); concurrent: call + (p-1) sw + alpha + m/B;
/// Bruck: call + sum over rounds k of (sw + alpha + n_k m/B), n_k the blocks whose distance
/// 1..p-1 has bit k set.
SimTime all_to_all_time_contention_free(const LibraryModel& lib, int ranks,
                                        std::int64_t wire_bytes_per_peer, SimTime alpha,
                                        double bytes_per_s);

}  // namespace cocodiff
