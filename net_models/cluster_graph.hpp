#pragma once
// The physical cluster as a directed graph: vertices are ranks (tiles or GPUs), NICs and
// switches; each link carries one direction of traffic with its own latency and bandwidth. A
// route is the list of links a transfer between two ranks crosses. Routes keep to the tiers of
// the two ranks and are bandwidth-aware: of all paths, the one on which a kRouteProbeBytes
// message spends the least time (latency plus size / bandwidth, link by link) on links of the
// outermost tier, then of the next tier inward, and so on; then the lowest link ids.
//
//   ClusterGraph g(Topology({{"gpu", 2, "intra-node"}, {"node", 1, "inter-node"}}));
//   int sw = g.add_vertex("nvswitch", VertexKind::kSwitch, 0);
//   int nvlink = g.add_link_class("nvlink", "intra-node");
//   g.add_duplex(g.rank_vertex(0), sw, SimTime::from_ns(500), 450e9, nvlink);
//   g.add_duplex(g.rank_vertex(1), sw, SimTime::from_ns(500), 450e9, nvlink);
//   RouteTable routes(std::make_shared<const ClusterGraph>(std::move(g)));
//   routes.route(0, 1);   // {gpu0 -> nvswitch, nvswitch -> gpu1}

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/sim_time.hpp"
#include "core/topology.hpp"

namespace cocodiff {

enum class VertexKind : std::uint8_t { kRank, kNic, kSwitch };

struct GraphVertex {
  std::string name;  // "n0.gpu3.tile1", "n0.nic2", "core"
  VertexKind kind = VertexKind::kRank;
  int node = -1;  // -1: not inside one node (the fabric core)
};

/// The message size routes are chosen for, among routes on the same tiers: 1 MiB, about one
/// rank's share of an attention all-to-all at the models' usual sizes.
inline constexpr double kRouteProbeBytes = 1 << 20;

/// A bandwidth that never limits (a non-blocking switch core).
inline constexpr double kUnlimitedBytesPerS = std::numeric_limits<double>::infinity();

/// One direction of one physical connection.
struct GraphLink {
  int from = 0, to = 0;
  SimTime latency;
  double bandwidth_bytes_per_s = kUnlimitedBytesPerS;
  int link_class = 0;
  bool limited() const { return bandwidth_bytes_per_s < kUnlimitedBytesPerS; }
};

/// A named kind of link ("mdfi", "xe-link", "nic") and the tier it serves, for reports.
struct LinkClass {
  std::string name;
  std::string tier;
};

/// Latency and bottleneck of a route: what a lone flow on it sees.
struct RouteSummary {
  SimTime latency;
  double bottleneck_bytes_per_s = kUnlimitedBytesPerS;
  int hops = 0;
};

class ClusterGraph {
 public:
  /// Creates one rank vertex per rank of `topo`, named from its coordinates; rank r is vertex r.
  explicit ClusterGraph(Topology topo);

  const Topology& topology() const { return topo_; }
  int num_ranks() const { return topo_.num_ranks(); }
  int num_vertices() const { return static_cast<int>(vertices_.size()); }
  int num_links() const { return static_cast<int>(links_.size()); }
  int num_link_classes() const { return static_cast<int>(classes_.size()); }
  int rank_vertex(int rank) const { return rank; }
  const GraphVertex& vertex(int v) const { return vertices_.at(static_cast<size_t>(v)); }
  const GraphLink& link(int l) const { return links_.at(static_cast<size_t>(l)); }
  const LinkClass& link_class(int c) const { return classes_.at(static_cast<size_t>(c)); }

  /// Adds a NIC or switch vertex; returns its index.
  int add_vertex(std::string name, VertexKind kind, int node);
  /// Registers a link class; returns its index.
  int add_link_class(std::string name, std::string tier);
  /// Adds one directed link (bandwidth > 0, or kUnlimitedBytesPerS); returns its id.
  int add_link(int from, int to, SimTime latency, double bandwidth_bytes_per_s, int link_class);
  /// Adds from->to and to->from with the same figures; returns the id of from->to (the other
  /// direction is that id + 1).
  int add_duplex(int a, int b, SimTime latency, double bandwidth_bytes_per_s, int link_class);

  /// Shortest-path tree from `src_vertex`: for every vertex the link that reaches it (-1 for
  /// the source and for unreachable vertices). O(E log V).
  std::vector<int> route_tree(int src_vertex) const;
  /// Links from rank src to rank dst in travel order (empty when src == dst or unreachable).
  std::vector<int> route(int src, int dst) const;
  /// Position of a tier name among the topology's tiers, innermost 0 (the node tier last); a
  /// name the topology does not have ranks outside them all.
  int tier_rank(const std::string& tier) const;
  /// tier_rank of link l's class.
  int link_tier(int l) const;
  /// The first link of `route` (from src to dst) whose tier is outside the tier joining src and
  /// dst (an intra-node transfer through a NIC), if any: `topo` warns about such routes.
  std::optional<int> link_outside_tier(int src, int dst, std::span<const int> route) const;
  RouteSummary summarize(std::span<const int> route) const;
  /// "n0.gpu0.tile0 -mdfi-> n0.gpu0.tile1 -xe-link-> n0.gpu1.tile1".
  std::string describe_route(int src, std::span<const int> route) const;
  /// A pair of ranks with no route between them, if any (checked by the preset loader).
  std::optional<std::pair<int, int>> find_unreachable_pair() const;
  /// Outgoing links of a vertex, in increasing id order.
  std::span<const int> out_links(int v) const { return out_.at(static_cast<size_t>(v)); }

 private:
  Topology topo_;
  std::vector<GraphVertex> vertices_;
  std::vector<GraphLink> links_;
  std::vector<LinkClass> classes_;
  std::vector<std::vector<int>> out_;
};

/// Routes between ranks, computed on first use and cached. Each network model owns one, so
/// the shared graph stays immutable and several engines may run at once.
class RouteTable {
 public:
  explicit RouteTable(std::shared_ptr<const ClusterGraph> graph);

  /// Links from src to dst; the span stays valid until the next call. COCO_CHECK: reachable.
  std::span<const int> route(int src, int dst);
  /// Latency and bottleneck of the route from src to dst.
  RouteSummary summary(int src, int dst);
  /// Both at once (one table lookup); the span stays valid until the next call.
  std::span<const int> route(int src, int dst, RouteSummary& summary);

  /// A stable handle to a cached route (spans into the cache move when it grows).
  struct Ref {
    std::uint32_t offset = 0;
    std::uint32_t length = 0;
  };
  Ref route_ref(int src, int dst);
  std::span<const int> links(Ref r) const {
    return std::span<const int>(pool_).subspan(r.offset, r.length);
  }
  /// src's shortest-path tree (ClusterGraph::route_tree), built on first use and kept.
  const std::vector<int>& tree(int src);
  const ClusterGraph& graph() const { return *graph_; }
  const std::shared_ptr<const ClusterGraph>& graph_ptr() const { return graph_; }

 private:
  // 12 bytes a pair: a 1,536-rank table is 28 MB, touched once per flow, so its size is what
  // the lookups cost. Summaries repeat (one per kind of route) and are stored once.
  static constexpr std::uint32_t kUnknown = 0xFFFFFFFFu;
  struct Entry {
    std::uint32_t offset = 0;
    std::uint32_t length = 0;
    std::uint32_t summary = kUnknown;  // index into summaries_
  };
  const Entry& entry(int src, int dst);

  std::shared_ptr<const ClusterGraph> graph_;
  std::vector<std::vector<Entry>> entries_;  // [src][dst], rows allocated on first use
  // Each source's last lookup, copied: a ring or a run of messages to one peer looks the same
  // route up again and again, and this small array stays in cache where the table does not.
  struct Last {
    int dst = -1;
    Entry entry;
  };
  std::vector<Last> last_;               // [src]
  std::vector<RouteSummary> summaries_;  // distinct summaries
  std::map<std::tuple<std::int64_t, double, int>, std::uint32_t> summary_index_;
  std::vector<std::vector<int>> trees_;  // [src] shortest-path tree, on first use
  std::vector<int> pool_;                // every cached route, back to back
};

}  // namespace cocodiff
