#pragma once
// A hierarchical all-to-all for benchmarking the links of each tier: one phase per topology
// level (innermost first), each phase an all-to-all among the ranks that differ only at that
// level, all such groups at once. Every block is forwarded along one coordinate per phase, so
// after the last phase each rank holds what a flat all-to-all would give it, in the same order.
// (The network benchmark's reference. Its block orders are TAPA's, dit/parallel/tapa.hpp: both
// take them from core/hierarchy.hpp.)
//
//   HierarchicalAllToAll tapa(world);          // collective: splits one group per level
//   tapa.run(send, recv, count);               // same result as world.all_to_all(send, recv,
//   count)
//
// Block layouts, as digits outermost first (s_j / d_j: coordinate j of a block's source or
// destination rank; L levels). A rank's buffer before phase k is
//   [d_k, d_k+1, ..., d_L-1, s_k-1, ..., s_0],
// so the blocks for group member v (d_k = v) are contiguous. Receiving puts the sender's
// coordinate s_k outermost: [s_k, d_k+1, ..., d_L-1, s_k-1, ..., s_0]; the re-pack before
// phase k+1 moves it behind the d digits. After the last phase the layout is
// [s_L-1, ..., s_0]: plain rank order.

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/communicator.hpp"
#include "core/topology.hpp"

namespace cocodiff {

/// The block permutation applied before phase `phase` (0..L): out block i = in block perm[i].
/// Phase 0 takes the caller's send buffer (rank order); phase k takes what phase k-1 received;
/// phase L gives the caller's receive buffer.
std::vector<std::int64_t> hierarchical_a2a_permutation(const Topology& topo, int phase);

class HierarchicalAllToAll {
 public:
  /// Collective over the world communicator (size == topology ranks). Levels of size 1 are
  /// skipped: they move nothing.
  explicit HierarchicalAllToAll(Communicator& world);
  /// Blocking; like world.all_to_all(send, recv, count). Empty spans move sizes only (phantom).
  void run(std::span<const float> send, std::span<float> recv, std::int64_t count,
           std::string_view label = {});
  /// Topology levels that get a phase, innermost first.
  const std::vector<int>& levels() const { return levels_; }

 private:
  Communicator& world_;
  std::vector<int> levels_;
  std::vector<std::unique_ptr<Communicator>> groups_;
  std::vector<std::vector<std::int64_t>> perms_;  // before phase 0..L-1, and after the last
  std::vector<float> packed_, received_;
};

}  // namespace cocodiff
