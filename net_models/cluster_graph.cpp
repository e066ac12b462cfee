#include "net_models/cluster_graph.hpp"

#include <algorithm>
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

std::vector<int> ClusterGraph::route_tree(int src_vertex) const {
  // Dijkstra on (hops, latency): fewest hops keeps traffic on direct links (a Xe link rather
  // than a detour through the NIC); latency only breaks ties. Equal costs keep the first
  // parent found, and links are scanned in id order, so the tree is deterministic.
  using Cost = std::pair<int, std::int64_t>;
  const size_t n = vertices_.size();
  std::vector<Cost> best(n, {std::numeric_limits<int>::max(), 0});
  std::vector<int> parent(n, -1);
  std::vector<bool> done(n, false);
  using Item = std::tuple<int, std::int64_t, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  best[static_cast<size_t>(src_vertex)] = {0, 0};
  heap.emplace(0, 0, src_vertex);
  while (!heap.empty()) {
    auto [hops, lat, v] = heap.top();
    heap.pop();
    if (done[static_cast<size_t>(v)]) continue;
    done[static_cast<size_t>(v)] = true;
    for (int l : out_[static_cast<size_t>(v)]) {
      const GraphLink& e = links_[static_cast<size_t>(l)];
      const Cost c{hops + 1, lat + e.latency.ns()};
      Cost& b = best[static_cast<size_t>(e.to)];
      if (!done[static_cast<size_t>(e.to)] && c < b) {
        b = c;
        parent[static_cast<size_t>(e.to)] = l;
        heap.emplace(c.first, c.second, e.to);
      }
    }
  }
  return parent;
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
      trees_(static_cast<size_t>(graph_->num_ranks())) {}

const RouteTable::Entry& RouteTable::entry(int src, int dst) {
  const int p = graph_->num_ranks();
  COCO_CHECK(src >= 0 && src < p && dst >= 0 && dst < p,
             "rank out of range: " + std::to_string(src) + " -> " + std::to_string(dst));
  std::vector<Entry>& row = entries_[static_cast<size_t>(src)];
  if (row.empty()) row.resize(static_cast<size_t>(p));
  Entry& e = row[static_cast<size_t>(dst)];
  if (e.known) return e;
  std::vector<int>& tree = trees_[static_cast<size_t>(src)];
  if (tree.empty()) tree = graph_->route_tree(graph_->rank_vertex(src));
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
  e.summary = graph_->summarize(links({e.offset, e.length}));
  e.known = true;
  return e;
}

std::span<const int> RouteTable::route(int src, int dst) {
  const Entry& e = entry(src, dst);
  return links({e.offset, e.length});
}

RouteSummary RouteTable::summary(int src, int dst) { return entry(src, dst).summary; }

RouteTable::Ref RouteTable::route_ref(int src, int dst) {
  const Entry& e = entry(src, dst);
  return {e.offset, e.length};
}

}  // namespace cocodiff
