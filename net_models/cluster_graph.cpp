#include "net_models/cluster_graph.hpp"

#include <algorithm>
#include <array>
#include <compare>
#include <functional>
#include <queue>
#include <tuple>

#include "core/errors.hpp"

namespace cocodiff {

namespace {

std::string rank_vertex_name(const Topology& topo, int rank) {
  std::string s;
  for (int k = topo.num_levels() - 1; k >= 0; --k) {
    const TopologyLevel& l = topo.level(k);
    if (!s.empty()) s += '.';
    s += (l.name == "node" ? std::string("n") : l.name) + std::to_string(topo.coord(rank, k));
  }
  return s;
}

}  // namespace

ClusterGraph::ClusterGraph(Topology topo) : topo_(std::move(topo)) {
  const int p = topo_.num_ranks();
  vertices_.reserve(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r)
    vertices_.push_back({rank_vertex_name(topo_, r), VertexKind::kRank, topo_.node(r)});
  out_.resize(static_cast<size_t>(p));
}

int ClusterGraph::add_vertex(std::string name, VertexKind kind, int node) {
  vertices_.push_back({std::move(name), kind, node});
  out_.emplace_back();
  return num_vertices() - 1;
}

int ClusterGraph::add_link_class(std::string name, std::string tier) {
  classes_.push_back({std::move(name), std::move(tier)});
  return num_link_classes() - 1;
}

int ClusterGraph::add_link(int from, int to, SimTime latency, double bandwidth_bytes_per_s,
                           int link_class) {
  COCO_CHECK(from >= 0 && from < num_vertices() && to >= 0 && to < num_vertices() && from != to,
             "link endpoints");
  COCO_CHECK(bandwidth_bytes_per_s > 0, "link bandwidth must be positive");
  COCO_CHECK(link_class >= 0 && link_class < num_link_classes(), "link class");
  COCO_CHECK(latency >= SimTime{}, "negative latency");
  links_.push_back({from, to, latency, bandwidth_bytes_per_s, link_class});
  const int id = num_links() - 1;
  out_[static_cast<size_t>(from)].push_back(id);
  return id;
}

int ClusterGraph::add_duplex(int a, int b, SimTime latency, double bandwidth_bytes_per_s,
                             int link_class) {
  const int id = add_link(a, b, latency, bandwidth_bytes_per_s, link_class);
  add_link(b, a, latency, bandwidth_bytes_per_s, link_class);
  return id;
}

int ClusterGraph::tier_rank(const std::string& tier) const {
  for (int k = 0; k < topo_.num_tiers(); ++k)
    if (topo_.tier_name(k) == tier) return k;
  return topo_.num_tiers();  // a tier the topology does not name: outside every level
}

int ClusterGraph::link_tier(int l) const { return tier_rank(link_class(link(l).link_class).tier); }

namespace {

// The cost of a path: the time a kRouteProbeBytes message spends on each tier's links (latency
// plus size / bandwidth, link by link), outermost tier first, compared lexicographically. So a
// route never uses a link of an outer tier when links of the pair's own tiers reach the peer (no
// GPU-to-GPU route through a NIC's PCIe attach while NVLink exists), and among routes on the
// same tiers the faster one wins, bandwidth included (not fewest hops, then latency). A sum of
// per-link vectors, so extending two paths by the same link keeps their order (Dijkstra holds).
constexpr int kMaxRouteTiers = 7;
struct PathCost {
  std::array<std::int64_t, kMaxRouteTiers + 1> ns_by_tier{};  // [0]: outermost tier
  auto operator<=>(const PathCost&) const = default;
};

}  // namespace

std::vector<int> ClusterGraph::route_tree(int src_vertex) const {
  // Dijkstra on PathCost. Equal costs keep the first parent found, and links are scanned in id
  // order, so the tree is deterministic.
  const size_t n = vertices_.size();
  const int outermost = std::min(topo_.num_tiers(), kMaxRouteTiers);
  std::vector<int> class_tier;  // link_tier by class: names are compared once per class
  class_tier.reserve(classes_.size());
  for (const LinkClass& c : classes_) class_tier.push_back(std::min(tier_rank(c.tier), outermost));
  std::vector<PathCost> link_cost(links_.size());
  for (size_t l = 0; l < links_.size(); ++l) {
    const GraphLink& e = links_[l];
    const int t = class_tier[static_cast<size_t>(e.link_class)];
    // +1: a link costs something even with no latency and unlimited bandwidth.
    link_cost[l].ns_by_tier[static_cast<size_t>(outermost - t)] =
        1 + e.latency.ns() +
        (e.limited() ? static_cast<std::int64_t>(kRouteProbeBytes / e.bandwidth_bytes_per_s * 1e9)
                     : 0);
  }
  PathCost unreached;
  unreached.ns_by_tier.fill(std::numeric_limits<std::int64_t>::max());
  std::vector<PathCost> best(n, unreached);
  std::vector<int> parent(n, -1);
  std::vector<bool> done(n, false);
  using Item = std::pair<PathCost, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  best[static_cast<size_t>(src_vertex)] = PathCost{};
  heap.emplace(PathCost{}, src_vertex);
  while (!heap.empty()) {
    const auto [cost, v] = heap.top();
    heap.pop();
    if (done[static_cast<size_t>(v)]) continue;
    done[static_cast<size_t>(v)] = true;
    for (int l : out_[static_cast<size_t>(v)]) {
      const GraphLink& e = links_[static_cast<size_t>(l)];
      const PathCost& w = link_cost[static_cast<size_t>(l)];
      PathCost c = cost;
      for (size_t k = 0; k < c.ns_by_tier.size(); ++k) c.ns_by_tier[k] += w.ns_by_tier[k];
      PathCost& b = best[static_cast<size_t>(e.to)];
      if (!done[static_cast<size_t>(e.to)] && c < b) {
        b = c;
        parent[static_cast<size_t>(e.to)] = l;
        heap.emplace(c, e.to);
      }
    }
  }
  return parent;
}

std::optional<int> ClusterGraph::link_outside_tier(int src, int dst,
                                                   std::span<const int> route) const {
  const int tier = topo_.tier(src, dst);
  for (int l : route)
    if (link_tier(l) > tier) return l;
  return std::nullopt;
}

std::vector<int> ClusterGraph::route(int src, int dst) const {
  std::vector<int> r;
  if (src == dst) return r;
  std::vector<int> tree = route_tree(rank_vertex(src));
  for (int v = rank_vertex(dst); v != rank_vertex(src);) {
    const int l = tree[static_cast<size_t>(v)];
    if (l < 0) return {};
    r.push_back(l);
    v = links_[static_cast<size_t>(l)].from;
  }
  std::reverse(r.begin(), r.end());
  return r;
}

RouteSummary ClusterGraph::summarize(std::span<const int> route) const {
  RouteSummary s;
  for (int l : route) {
    const GraphLink& e = links_[static_cast<size_t>(l)];
    s.latency += e.latency;
    s.bottleneck_bytes_per_s = std::min(s.bottleneck_bytes_per_s, e.bandwidth_bytes_per_s);
    ++s.hops;
  }
  return s;
}

std::string ClusterGraph::describe_route(int src, std::span<const int> route) const {
  std::string s = vertex(rank_vertex(src)).name;
  for (int l : route) {
    const GraphLink& e = link(l);
    s += " -" + link_class(e.link_class).name + "-> " + vertex(e.to).name;
  }
  return s;
}

std::optional<std::pair<int, int>> ClusterGraph::find_unreachable_pair() const {
  // Every rank reaches rank 0 and rank 0 reaches every rank <=> all pairs are connected.
  std::vector<int> from0 = route_tree(0);
  for (int r = 1; r < num_ranks(); ++r)
    if (from0[static_cast<size_t>(r)] < 0) return std::make_pair(0, r);
  // Reverse reachability to rank 0, by a search over incoming links.
  std::vector<std::vector<int>> in(vertices_.size());
  for (int l = 0; l < num_links(); ++l)
    in[static_cast<size_t>(links_[static_cast<size_t>(l)].to)].push_back(l);
  std::vector<bool> seen(vertices_.size(), false);
  std::vector<int> stack = {0};
  seen[0] = true;
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    for (int l : in[static_cast<size_t>(v)]) {
      const int u = links_[static_cast<size_t>(l)].from;
      if (!seen[static_cast<size_t>(u)]) {
        seen[static_cast<size_t>(u)] = true;
        stack.push_back(u);
      }
    }
  }
  for (int r = 1; r < num_ranks(); ++r)
    if (!seen[static_cast<size_t>(r)]) return std::make_pair(r, 0);
  return std::nullopt;
}

RouteTable::RouteTable(std::shared_ptr<const ClusterGraph> graph)
    : graph_(std::move(graph)),
      entries_(static_cast<size_t>(graph_->num_ranks())),
      last_(static_cast<size_t>(graph_->num_ranks())),
      trees_(static_cast<size_t>(graph_->num_ranks())) {}

const RouteTable::Entry& RouteTable::entry(int src, int dst) {
  const int p = graph_->num_ranks();
  COCO_CHECK(src >= 0 && src < p && dst >= 0 && dst < p,
             "rank out of range: " + std::to_string(src) + " -> " + std::to_string(dst));
  Last& last = last_[static_cast<size_t>(src)];
  if (last.dst == dst) return last.entry;
  std::vector<Entry>& row = entries_[static_cast<size_t>(src)];
  if (row.empty()) row.resize(static_cast<size_t>(p));
  Entry& e = row[static_cast<size_t>(dst)];
  if (e.summary != kUnknown) {
    last = {dst, e};
    return last.entry;
  }
  const std::vector<int>& tree = this->tree(src);
  const size_t begin = pool_.size();
  for (int v = graph_->rank_vertex(dst); v != graph_->rank_vertex(src);) {
    const int l = tree[static_cast<size_t>(v)];
    COCO_CHECK(l >= 0, "no route from rank " + std::to_string(src) + " to rank " +
                           std::to_string(dst) + " (the loader checks connectivity)");
    pool_.push_back(l);
    v = graph_->link(l).from;
  }
  std::reverse(pool_.begin() + static_cast<std::ptrdiff_t>(begin), pool_.end());
  e.offset = static_cast<std::uint32_t>(begin);
  e.length = static_cast<std::uint32_t>(pool_.size() - begin);
  const RouteSummary sum = graph_->summarize(links({e.offset, e.length}));
  auto [it, fresh] = summary_index_.try_emplace(
      std::make_tuple(sum.latency.ns(), sum.bottleneck_bytes_per_s, sum.hops),
      static_cast<std::uint32_t>(summaries_.size()));
  if (fresh) summaries_.push_back(sum);
  e.summary = it->second;
  last = {dst, e};
  return last.entry;
}

const std::vector<int>& RouteTable::tree(int src) {
  COCO_CHECK(src >= 0 && src < graph_->num_ranks(), "rank out of range: " + std::to_string(src));
  std::vector<int>& tree = trees_[static_cast<size_t>(src)];
  if (tree.empty()) tree = graph_->route_tree(graph_->rank_vertex(src));
  return tree;
}

std::span<const int> RouteTable::route(int src, int dst) {
  const Entry& e = entry(src, dst);
  return links({e.offset, e.length});
}

RouteSummary RouteTable::summary(int src, int dst) { return summaries_[entry(src, dst).summary]; }

std::span<const int> RouteTable::route(int src, int dst, RouteSummary& summary) {
  const Entry& e = entry(src, dst);
  summary = summaries_[e.summary];
  return links({e.offset, e.length});
}

RouteTable::Ref RouteTable::route_ref(int src, int dst) {
  const Entry& e = entry(src, dst);
  return {e.offset, e.length};
}

}  // namespace cocodiff
