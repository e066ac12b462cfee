#include "net_models/collective_model.hpp"

#include <bit>

#include "core/errors.hpp"

namespace cocodiff {

std::string_view all_to_all_algorithm_name(AllToAllAlgorithm a) {
  switch (a) {
    case AllToAllAlgorithm::kShift:
      return "shift";
    case AllToAllAlgorithm::kXor:
      return "xor";
    case AllToAllAlgorithm::kConcurrent:
      return "concurrent";
    case AllToAllAlgorithm::kBruck:
      return "bruck";
  }
  return "?";
}

bool parse_all_to_all_algorithm(std::string_view name, AllToAllAlgorithm& out) {
  for (AllToAllAlgorithm a : {AllToAllAlgorithm::kShift, AllToAllAlgorithm::kXor,
                              AllToAllAlgorithm::kConcurrent, AllToAllAlgorithm::kBruck}) {
    if (all_to_all_algorithm_name(a) == name) {
      out = a;
      return true;
    }
  }
  return false;
}

std::string_view all_gather_algorithm_name(AllGatherAlgorithm a) {
  return a == AllGatherAlgorithm::kRing ? "ring" : "hierarchical";
}

bool parse_all_gather_algorithm(std::string_view name, AllGatherAlgorithm& out) {
  for (AllGatherAlgorithm a : {AllGatherAlgorithm::kRing, AllGatherAlgorithm::kHierarchical}) {
    if (all_gather_algorithm_name(a) == name) {
      out = a;
      return true;
    }
  }
  return false;
}

bool LibraryModel::is_free() const {
  const SimTime zero;
  return call_overhead == zero && message_overhead == zero && eager_overhead == zero &&
         rendezvous_overhead == zero && chunk_overhead == zero && eager_copy_bytes_per_s == 0 &&
         local_copy_bytes_per_s == 0;
}

SimTime local_copy_time(const LibraryModel& lib, std::int64_t wire_bytes) {
  if (lib.local_copy_bytes_per_s <= 0 || wire_bytes <= 0) return SimTime{};
  return SimTime::from_seconds(static_cast<double>(wire_bytes) / lib.local_copy_bytes_per_s);
}

SimTime message_software_time(const LibraryModel& lib, std::int64_t wire_bytes) {
  SimTime t = lib.message_overhead;
  if (wire_bytes <= lib.eager_max_bytes) {
    t += lib.eager_overhead;
    if (lib.eager_copy_bytes_per_s > 0 && wire_bytes > 0)
      t += SimTime::from_seconds(static_cast<double>(wire_bytes) / lib.eager_copy_bytes_per_s);
  } else {
    t += lib.rendezvous_overhead;
  }
  if (lib.chunk_bytes > 0 && wire_bytes > lib.chunk_bytes) {
    const std::int64_t chunks = (wire_bytes + lib.chunk_bytes - 1) / lib.chunk_bytes;
    t += SimTime::from_ns(lib.chunk_overhead.ns() * (chunks - 1));
  }
  return t;
}

AllToAllAlgorithm choose_all_to_all(const LibraryModel& lib, int ranks,
                                    std::int64_t wire_bytes_per_peer) {
  AllToAllAlgorithm a = wire_bytes_per_peer <= lib.all_to_all_small_max_bytes
                            ? lib.all_to_all_small
                            : lib.all_to_all_large;
  if (a == AllToAllAlgorithm::kXor && !std::has_single_bit(static_cast<unsigned>(ranks)))
    a = AllToAllAlgorithm::kShift;
  return a;
}

int pairwise_send_peer(AllToAllAlgorithm a, int ranks, int r, int k) {
  COCO_CHECK(k >= 1 && k < ranks && r >= 0 && r < ranks, "pairwise round out of range");
  if (a == AllToAllAlgorithm::kXor) return r ^ k;
  return (r + k) % ranks;
}

int pairwise_recv_peer(AllToAllAlgorithm a, int ranks, int r, int k) {
  COCO_CHECK(k >= 1 && k < ranks && r >= 0 && r < ranks, "pairwise round out of range");
  if (a == AllToAllAlgorithm::kXor) return r ^ k;
  return (r - k + ranks) % ranks;
}

SimTime all_to_all_time_contention_free(const LibraryModel& lib, int ranks,
                                        std::int64_t wire_bytes_per_peer, SimTime alpha,
                                        double bytes_per_s) {
  if (ranks <= 1) return lib.call_overhead;
  const SimTime sw = message_software_time(lib, wire_bytes_per_peer);
  const SimTime wire =
      alpha + SimTime::from_seconds(static_cast<double>(wire_bytes_per_peer) / bytes_per_s);
  const std::int64_t rounds = ranks - 1;
  const AllToAllAlgorithm a = choose_all_to_all(lib, ranks, wire_bytes_per_peer);
  if (a == AllToAllAlgorithm::kConcurrent)
    return lib.call_overhead + SimTime::from_ns(sw.ns() * rounds) + wire;
  if (a == AllToAllAlgorithm::kBruck) {
    SimTime t = lib.call_overhead;
    for (int bit = 1; bit < ranks; bit *= 2) {
      std::int64_t blocks = 0;  // distances 1..p-1 with this bit set
      for (int j = 1; j < ranks; ++j) blocks += (j & bit) != 0 ? 1 : 0;
      const std::int64_t bytes = blocks * wire_bytes_per_peer;
      t += message_software_time(lib, bytes) + alpha +
           SimTime::from_seconds(static_cast<double>(bytes) / bytes_per_s);
    }
    return t;
  }
  return lib.call_overhead + SimTime::from_ns((sw + wire).ns() * rounds);
}

}  // namespace cocodiff
