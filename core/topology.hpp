#pragma once
// Where each rank sits in the cluster: a hierarchy of levels, innermost first.
// Aurora: {tile x2 over "die-to-die", gpu x6 over "intra-node", node xN over "inter-node"};
// HGX: {gpu x8 over "intra-node", node xN over "inter-node"}. Rank r's coordinate at level k is
// (r / (size_0 * ... * size_{k-1})) % size_k, so ranks of one GPU, then of one node, are adjacent.
//
//   Topology t({{"tile", 2, "die-to-die"}, {"gpu", 6, "intra-node"}, {"node", 2, "inter-node"}});
//   t.tier(0, 13);   // 2: ranks 0 and 13 differ at the node level -> "inter-node"

#include <string>
#include <vector>

namespace cocodiff {

/// One level of the hierarchy: `size` members joined by links of tier `tier_name`.
struct TopologyLevel {
  std::string name;       // "tile", "gpu", "node"
  int size = 1;           // members per parent
  std::string tier_name;  // the tier of a link between two members of this level
};

class Topology {
 public:
  Topology() = default;
  /// Levels innermost first; every size must be >= 1 (throws ConfigError otherwise).
  explicit Topology(std::vector<TopologyLevel> levels);

  int num_ranks() const { return num_ranks_; }
  int num_levels() const { return static_cast<int>(levels_.size()); }
  const TopologyLevel& level(int k) const { return levels_.at(static_cast<size_t>(k)); }
  const std::vector<TopologyLevel>& levels() const { return levels_; }

  /// Coordinate of `rank` at level k.
  int coord(int rank, int k) const;
  /// All coordinates of `rank`, innermost first.
  std::vector<int> coords(int rank) const;
  /// Rank with the given coordinates (innermost first).
  int rank_of(const std::vector<int>& coords) const;
  /// Outermost level at which a and b differ (the tier their traffic uses); -1 when a == b.
  int tier(int a, int b) const;
  int num_tiers() const { return num_levels(); }
  const std::string& tier_name(int tier) const { return level(tier).tier_name; }

  /// Named coordinates; a level that does not exist reads 0.
  int node(int rank) const;
  int gpu(int rank) const;
  int tile(int rank) const;
  int num_nodes() const;
  /// Ranks per node (product of all levels below "node").
  int ranks_per_node() const;

  std::string describe_rank(int rank) const;

 private:
  int level_index(const std::string& name) const;
  std::vector<TopologyLevel> levels_;
  std::vector<int> strides_;
  int num_ranks_ = 1;
};

}  // namespace cocodiff
