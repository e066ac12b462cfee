#include "core/topology.hpp"

#include "core/errors.hpp"

namespace cocodiff {

Topology::Topology(std::vector<TopologyLevel> levels) : levels_(std::move(levels)) {
  if (levels_.empty()) throw ConfigError("a topology needs at least one level");
  num_ranks_ = 1;
  for (const TopologyLevel& l : levels_) {
    if (l.size < 1)
      throw ConfigError("topology level '" + l.name + "' has size " + std::to_string(l.size) +
                        "; expected at least 1");
    strides_.push_back(num_ranks_);
    num_ranks_ *= l.size;
  }
}

int Topology::coord(int rank, int k) const {
  COCO_CHECK(rank >= 0 && rank < num_ranks_, "rank " + std::to_string(rank) + " out of range");
  return (rank / strides_[static_cast<size_t>(k)]) % levels_[static_cast<size_t>(k)].size;
}

std::vector<int> Topology::coords(int rank) const {
  std::vector<int> c(levels_.size());
  for (int k = 0; k < num_levels(); ++k) c[static_cast<size_t>(k)] = coord(rank, k);
  return c;
}

int Topology::rank_of(const std::vector<int>& coords) const {
  COCO_CHECK(coords.size() == levels_.size(), "coordinate count");
  int r = 0;
  for (size_t k = 0; k < coords.size(); ++k) r += coords[k] * strides_[k];
  return r;
}

int Topology::tier(int a, int b) const {
  for (int k = num_levels() - 1; k >= 0; --k)
    if (coord(a, k) != coord(b, k)) return k;
  return -1;
}

int Topology::level_index(const std::string& name) const {
  for (size_t k = 0; k < levels_.size(); ++k)
    if (levels_[k].name == name) return static_cast<int>(k);
  return -1;
}

int Topology::node(int rank) const {
  int k = level_index("node");
  return k < 0 ? 0 : coord(rank, k);
}
int Topology::gpu(int rank) const {
  int k = level_index("gpu");
  return k < 0 ? 0 : coord(rank, k);
}
int Topology::tile(int rank) const {
  int k = level_index("tile");
  return k < 0 ? 0 : coord(rank, k);
}
int Topology::num_nodes() const {
  int k = level_index("node");
  return k < 0 ? 1 : levels_[static_cast<size_t>(k)].size;
}
int Topology::ranks_per_node() const { return num_ranks_ / num_nodes(); }

std::string Topology::describe_rank(int rank) const {
  std::string s = "rank " + std::to_string(rank) + " (";
  for (int k = num_levels() - 1; k >= 0; --k) {
    s += level(k).name + " " + std::to_string(coord(rank, k));
    if (k > 0) s += ", ";
  }
  return s + ")";
}

}  // namespace cocodiff
