#include "net_models/hierarchical_a2a.hpp"

#include <algorithm>
#include <cstring>

#include "core/errors.hpp"

namespace cocodiff {

namespace {

// One digit of a block layout: coordinate `level` of the block's source or destination rank.
struct Digit {
  bool source;
  int level;
};
using Layout = std::vector<Digit>;  // outermost first

Layout layout_before(int k, int levels) {
  Layout l;
  for (int j = k; j < levels; ++j) l.push_back({false, j});
  for (int j = k - 1; j >= 0; --j) l.push_back({true, j});
  return l;
}

Layout layout_received(int k, int levels) {
  Layout l = {{true, k}};
  for (int j = k + 1; j < levels; ++j) l.push_back({false, j});
  for (int j = k - 1; j >= 0; --j) l.push_back({true, j});
  return l;
}

}  // namespace

std::vector<std::int64_t> hierarchical_a2a_permutation(const Topology& topo, int phase) {
  const int levels = topo.num_levels();
  COCO_CHECK(phase >= 0 && phase <= levels, "phase out of range");
  Layout in;
  if (phase == 0) {
    for (int j = levels - 1; j >= 0; --j) in.push_back({false, j});  // rank order
  } else {
    in = layout_received(phase - 1, levels);
  }
  const Layout out = layout_before(phase, levels);
  const auto radix = [&](const Digit& d) {
    return static_cast<std::int64_t>(topo.level(d.level).size);
  };
  const std::int64_t p = topo.num_ranks();
  std::vector<std::int64_t> perm(static_cast<size_t>(p));
  std::vector<std::int64_t> src(static_cast<size_t>(levels)), dst(static_cast<size_t>(levels));
  for (std::int64_t i = 0; i < p; ++i) {
    std::int64_t rest = i;  // decode i in the output layout, innermost digit first
    for (auto it = out.rbegin(); it != out.rend(); ++it) {
      (it->source ? src : dst)[static_cast<size_t>(it->level)] = rest % radix(*it);
      rest /= radix(*it);
    }
    std::int64_t j = 0;  // encode the same block in the input layout
    for (const Digit& d : in)
      j = j * radix(d) + (d.source ? src : dst)[static_cast<size_t>(d.level)];
    perm[static_cast<size_t>(i)] = j;
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
