#pragma once
// Software costs of a collective library, as data: what a real NCCL / oneCCL / MPI spends on
// top of the wire. The emulator's collective algorithms (emulator/collectives/) ask this model
// which schedule to run and how long each call and each message costs the sender before the
// network sees it. `ideal` (every cost zero, shift pairwise) is the exact network-only model.
//
//   LibraryModel nccl{.name = "nccl", .call_overhead = SimTime::from_ns(20'000), ...};
//   const std::string& a = choose_all_to_all(nccl, /*wire_bytes_per_peer=*/1 << 20);  // "shift"
//   SimTime sw = message_software_time(nccl, 1 << 20);   // before each send is posted

#include <cstdint>
#include <string>
#include <string_view>

#include "core/sim_time.hpp"

namespace cocodiff {

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
  /// The algorithms it runs, by their registered names (emulator/collectives/registry.hpp):
  /// all-to-all above all_to_all_small_max_bytes per peer, and at or below it; all-gather,
  /// all-reduce and barrier at every size.
  std::string all_to_all_large = "shift";
  std::string all_to_all_small = "shift";
  std::int64_t all_to_all_small_max_bytes = -1;
  std::string all_gather = "ring";
  std::string all_reduce = "ring";
  std::string barrier = "dissemination";
  /// A ring kernel's work on the caller's own block (all-gather: copying it into place;
  /// reduce-scatter and all-reduce: its own chunk), done in line with its messages: its wire
  /// bytes at this rate, charged once per call before the first message (0: free). NCCL's ring
  /// kernels copy the own block in the pipeline that sends; an all-to-all's own block is a
  /// concurrent copy beside its sends and costs nothing here.
  double local_copy_bytes_per_s = 0;

  /// True when an all-to-all of at most `wire_bytes_per_peer` bytes to any one peer runs the
  /// small-message algorithm.
  bool small_all_to_all(std::int64_t wire_bytes_per_peer) const {
    return wire_bytes_per_peer <= all_to_all_small_max_bytes;
  }
  /// True when the library adds nothing to the network's time (today's exact model).
  bool is_free() const;
};

/// Software time a sender spends on one message of `wire_bytes` before it enters the network.
SimTime message_software_time(const LibraryModel& lib, std::int64_t wire_bytes);

/// Time a ring kernel spends on `wire_bytes` of the caller's own block (local_copy_bytes_per_s;
/// zero when it is 0).
SimTime local_copy_time(const LibraryModel& lib, std::int64_t wire_bytes);

/// The name of the all-to-all algorithm the library runs for at most `wire_bytes_per_peer`
/// bytes to any one peer (one that cannot run on the group runs its fallback).
const std::string& choose_all_to_all(const LibraryModel& lib, std::int64_t wire_bytes_per_peer);

}  // namespace cocodiff
