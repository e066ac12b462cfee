#include "net_models/hierarchical_a2a.hpp"

#include <algorithm>
#include <cstring>

#include "core/errors.hpp"
#include "core/hierarchy.hpp"

namespace cocodiff {

std::vector<std::int64_t> hierarchical_a2a_permutation(const Topology& topo, int phase) {
  const int levels = topo.num_levels();
  COCO_CHECK(phase >= 0 && phase <= levels, "phase out of range");
  // The world's blocks one holder keeps (core/hierarchy.hpp); every digit is named by both
  // orders, so the holder's own digits never show.
  const MemberDigits digits = topology_digits(topo);
  const std::vector<int> holder(static_cast<size_t>(levels), 0);
  const std::vector<std::pair<int, int>> in = enumerate_blocks(
      digits, holder,
      phase == 0 ? order_by_destination(levels) : order_received(phase - 1, levels));
  const std::vector<std::pair<int, int>> out =
      enumerate_blocks(digits, holder, order_before(phase, levels));
  std::vector<std::pair<std::pair<int, int>, std::int64_t>> at;  // block -> place in `in`
  at.reserve(in.size());
  for (size_t j = 0; j < in.size(); ++j) at.push_back({in[j], static_cast<std::int64_t>(j)});
  std::sort(at.begin(), at.end());
  std::vector<std::int64_t> perm;
  perm.reserve(out.size());
  for (const std::pair<int, int>& b : out) {
    const auto it = std::lower_bound(at.begin(), at.end(), std::make_pair(b, std::int64_t{-1}));
    COCO_CHECK(it != at.end() && it->first == b, "hierarchical all-to-all block order");
    perm.push_back(it->second);
  }
  return perm;
}

HierarchicalAllToAll::HierarchicalAllToAll(Communicator& world) : world_(world) {
  const Topology& topo = world.topology();
  if (world.size() != topo.num_ranks())
    throw CommError("hierarchical all-to-all needs the world group (" +
                    std::to_string(topo.num_ranks()) + " ranks), got a group of " +
                    std::to_string(world.size()));
  const int me = world.world_rank(world.rank());
  for (int k = 0; k < topo.num_levels(); ++k) {
    if (topo.level(k).size > 1) {
      // One group per combination of the other coordinates; group rank = coordinate k.
      std::vector<int> c = topo.coords(me);
      const int key = c[static_cast<size_t>(k)];
      c[static_cast<size_t>(k)] = 0;
      groups_.push_back(world.split(topo.rank_of(c), key));
      levels_.push_back(k);
    }
  }
  for (int k = 0; k <= topo.num_levels(); ++k)
    perms_.push_back(hierarchical_a2a_permutation(topo, k));
}

void HierarchicalAllToAll::run(std::span<const float> send, std::span<float> recv,
                               std::int64_t count, std::string_view label) {
  const Topology& topo = world_.topology();
  const std::int64_t p = topo.num_ranks();
  const bool phantom = send.empty() || recv.empty();
  const size_t n = static_cast<size_t>(p * count);
  COCO_CHECK(phantom || (send.size() >= n && recv.size() >= n), "buffer sizes");
  const auto pack = [&](std::span<const float> from, std::span<float> to, int phase) {
    const std::vector<std::int64_t>& perm = perms_[static_cast<size_t>(phase)];
    for (std::int64_t i = 0; i < p; ++i)
      std::memcpy(to.data() + i * count, from.data() + perm[static_cast<size_t>(i)] * count,
                  static_cast<size_t>(count) * sizeof(float));
  };
  if (!phantom) {
    packed_.resize(n);
    received_.resize(n);
  }
  std::span<const float> current = send;  // the layout perms_[k] expects
  size_t g = 0;
  for (int k = 0; k < topo.num_levels(); ++k) {
    if (!phantom) pack(current, packed_, k);
    if (topo.level(k).size == 1) {
      if (!phantom) packed_.swap(received_);  // a group of one: the exchange is the identity
    } else {
      const std::int64_t per_member = p / topo.level(k).size * count;
      if (phantom)
        groups_[g]->all_to_all({}, {}, per_member, label);
      else
        groups_[g]->all_to_all(packed_, received_, per_member, label);
      ++g;
    }
    if (!phantom) current = received_;
  }
  if (!phantom) pack(received_, recv, topo.num_levels());
}

}  // namespace cocodiff
