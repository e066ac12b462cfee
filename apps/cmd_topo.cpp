// `cocodiff topo CONFIG [--set k=v ...] [--route A:B ...]`: prints a cluster as the emulator
// sees it: levels and tiers, link classes, the route one transfer takes on each tier, and the
// device model. CONFIG is a run config with a [cluster] section, a cluster preset file, or a
// preset name (aurora, hgx-h100, ...).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "core/errors.hpp"
#include "net_models/cluster.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

struct TopoOptions {
  std::string config;
  std::vector<std::string> sets;
  std::vector<std::string> routes;
};

std::string gbps(double bytes_per_s) {
  if (bytes_per_s == kUnlimitedBytesPerS) return "unlimited";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB/s", bytes_per_s / 1e9);
  return buf;
}

std::string us(SimTime t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f us", t.us());
  return buf;
}

std::pair<int, int> parse_route(const std::string& s, int ranks) {
  const size_t colon = s.find(':');
  try {
    if (colon != std::string::npos) {
      size_t used_a = 0, used_b = 0;
      const int a = std::stoi(s.substr(0, colon), &used_a);
      const int b = std::stoi(s.substr(colon + 1), &used_b);
      if (used_a == colon && used_b == s.size() - colon - 1 && a >= 0 && b >= 0 && a < ranks &&
          b < ranks)
        return {a, b};
    }
  } catch (const std::exception&) {
  }
  throw UserError("--route " + s + ": expected SRC:DST with ranks in [0, " +
                  std::to_string(ranks - 1) + "]");
}

void print_route(RouteTable& routes, int a, int b) {
  const RouteSummary s = routes.summary(a, b);
  std::printf("  %4d -> %-4d %d hop%s  %10s  %11s  %s\n", a, b, s.hops, s.hops == 1 ? " " : "s",
              us(s.latency).c_str(), gbps(s.bottleneck_bytes_per_s).c_str(),
              routes.graph().describe_route(a, routes.route(a, b)).c_str());
}

// Warns (stderr) for each tier whose routes leave that tier's links: an intra-node transfer
// through a NIC, say. Every node is alike, so the pairs from node 0 to nodes 0 and 1 stand for
// all of them.
void warn_routes_leaving_their_tier(RouteTable& routes) {
  const ClusterGraph& g = routes.graph();
  const Topology& topo = g.topology();
  const int rpn = topo.ranks_per_node();
  const int last = std::min(topo.num_ranks(), 2 * rpn);
  std::vector<int> leaving(static_cast<size_t>(topo.num_tiers()), 0);
  std::vector<int> pairs(leaving.size(), 0);
  std::vector<std::pair<int, int>> example(leaving.size(), {-1, -1});
  for (int a = 0; a < rpn; ++a)
    for (int b = 0; b < last; ++b) {
      if (a == b) continue;
      const size_t t = static_cast<size_t>(topo.tier(a, b));
      ++pairs[t];
      if (!g.link_outside_tier(a, b, routes.route(a, b))) continue;
      if (leaving[t]++ == 0) example[t] = {a, b};
    }
  for (size_t t = 0; t < leaving.size(); ++t) {
    if (leaving[t] == 0) continue;
    auto [a, b] = example[t];
    const std::span<const int> r = routes.route(a, b);
    const int l = *g.link_outside_tier(a, b, r);
    std::fprintf(stderr,
                 "warning: %d of %d %s routes from node 0 leave the %s links (through %s, tier "
                 "%s), e.g. %s; add %s links to the cluster file if the machine has them\n",
                 leaving[t], pairs[t], topo.tier_name(static_cast<int>(t)).c_str(),
                 topo.tier_name(static_cast<int>(t)).c_str(),
                 g.link_class(g.link(l).link_class).name.c_str(),
                 g.link_class(g.link(l).link_class).tier.c_str(), g.describe_route(a, r).c_str(),
                 topo.tier_name(static_cast<int>(t)).c_str());
  }
}

/// The --route pairs, checked before anything is printed.
std::vector<std::pair<int, int>> asked_routes(const TopoOptions& o, const Topology& topo) {
  std::vector<std::pair<int, int>> asked;
  for (const std::string& s : o.routes) {
    asked.push_back(parse_route(s, topo.num_ranks()));
    if (asked.back().first == asked.back().second)
      throw UserError("--route " + s + ": a rank to itself has no route");
  }
  return asked;
}

/// The cluster's name, source, levels and tiers, network and graph.
void print_cluster(const Cluster& c) {
  const Topology& topo = c.topology;
  const ClusterGraph& g = *c.graph;
  std::printf("cluster %s: %s\n", c.name.c_str(), c.description.c_str());
  std::printf("  source   %s\n", c.source.c_str());
  std::printf("  ranks    %d =", topo.num_ranks());
  for (int k = 0; k < topo.num_levels(); ++k)
    std::printf("%s %s x%d [%s]", k ? " *" : "", topo.level(k).name.c_str(), topo.level(k).size,
                topo.tier_name(k).c_str());
  std::printf("\n  network  %s\n", c.network->name().c_str());
  int nics = 0, switches = 0;
  for (int v = 0; v < g.num_vertices(); ++v) {
    nics += g.vertex(v).kind == VertexKind::kNic;
    switches += g.vertex(v).kind == VertexKind::kSwitch;
  }
  std::printf("  graph    %d ranks, %d NICs, %d switch vertices, %d directed links\n\n",
              g.num_ranks(), nics, switches, g.num_links());
}

/// Link classes: count, bandwidth and latency (every link of a class is alike).
void print_link_classes(const ClusterGraph& g) {
  std::printf("link classes (per direction)\n");
  std::printf("  %-14s %-12s %7s %12s %10s\n", "class", "tier", "links", "bandwidth", "latency");
  for (int cls = 0; cls < g.num_link_classes(); ++cls) {
    int count = 0, first = -1;
    for (int l = 0; l < g.num_links(); ++l)
      if (g.link(l).link_class == cls && count++ == 0) first = l;
    if (first < 0) continue;
    std::printf("  %-14s %-12s %7d %12s %10s\n", g.link_class(cls).name.c_str(),
                g.link_class(cls).tier.c_str(), count,
                gbps(g.link(first).bandwidth_bytes_per_s).c_str(),
                us(g.link(first).latency).c_str());
  }
}

/// Per tier, the routes from rank 0 to its nearest and farthest peer.
void print_tier_routes(RouteTable& routes, const Topology& topo) {
  // Per tier, from rank 0: the nearest and the farthest peer (by hops, then latency), and what
  // one transfer alone sees (latency, bottleneck bandwidth).
  std::printf("\ntiers: one transfer alone from rank 0 (nearest and farthest peer per tier)\n");
  for (int k = 0; k < topo.num_tiers(); ++k) {
    int nearest = -1, farthest = -1;
    auto key = [&](int d) {
      const RouteSummary s = routes.summary(0, d);
      return std::make_pair(s.hops, s.latency);
    };
    for (int d = 1; d < topo.num_ranks(); ++d) {
      if (topo.tier(0, d) != k) continue;
      if (nearest < 0 || key(d) < key(nearest)) nearest = d;
      if (farthest < 0 || key(d) > key(farthest)) farthest = d;
    }
    if (nearest < 0) {
      std::printf("  %-12s (one member: no traffic)\n", topo.tier_name(k).c_str());
      continue;
    }
    std::printf("  %s\n", topo.tier_name(k).c_str());
    print_route(routes, 0, nearest);
    if (farthest != nearest) print_route(routes, 0, farthest);
  }
}

/// The device's roofline: peaks, launch overhead and each op kind's efficiencies.
void print_device(const RooflineParams& d) {
  std::printf("\ndevice %s (roofline)\n", d.name.c_str());
  std::printf("  peak %.1f TFLOP/s, HBM %.1f GB/s, launch overhead %s\n", d.peak_flops_per_s / 1e12,
              d.hbm_bytes_per_s / 1e9, us(d.launch_overhead).c_str());
  std::printf("  %-18s", "efficiency");
  for (int k = 0; k < kNumOpKinds; ++k)
    std::printf(" %12s", std::string(op_kind_name(static_cast<OpKind>(k))).c_str());
  std::printf("\n  %-18s", "compute");
  for (double e : d.compute_efficiency) std::printf(" %12.2f", e);
  std::printf("\n  %-18s", "memory");
  for (double e : d.memory_efficiency) std::printf(" %12.2f", e);
  std::printf("\n");
}

void run_topo(const TopoOptions& o) {
  Config cfg = load_cluster_config(o.config, config_dir() / "clusters");
  for (const std::string& s : o.sets) cfg.set(s);
  Cluster c = load_cluster(cfg, config_dir() / "clusters");
  // Bad --route arguments fail before anything is printed.
  const std::vector<std::pair<int, int>> asked = asked_routes(o, c.topology);
  print_cluster(c);
  print_link_classes(*c.graph);
  RouteTable routes(c.graph);
  print_tier_routes(routes, c.topology);
  if (!asked.empty()) {
    std::printf("\nroutes\n");
    for (auto [a, b] : asked) print_route(routes, a, b);
  }
  warn_routes_leaving_their_tier(routes);
  print_device(c.device_params);
}

}  // namespace

void add_topo_command(CLI::App& app) {
  auto o = std::make_shared<TopoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "topo", "Print a cluster: tiers, link classes, routes per tier, device model");
  cmd->add_option("config", o->config,
                  "run config with a [cluster] section, a cluster preset file, or a preset name")
      ->required();
  cmd->add_option("--set", o->sets, "override a key, e.g. --set cluster.nodes=4");
  cmd->add_option("--route", o->routes, "also print the route from SRC to DST, e.g. 0:13");
  cmd->callback([o] { run_topo(*o); });
}

}  // namespace cocodiff::apps
