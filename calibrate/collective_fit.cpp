#include "calibrate/collective_fit.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

#include "calibrate/cluster_file.hpp"
#include "calibrate/collective_bench.hpp"
#include "calibrate/least_squares.hpp"
#include "core/errors.hpp"
#include "emulator/engine.hpp"

namespace cocodiff::calibrate {

namespace {

using apps::BenchCall;
using apps::BenchOp;

// Bounds of what a cluster file accepts (net_models/cluster.cpp).
constexpr double kMinGbps = 1e-3, kMaxGbps = 1e6;
constexpr double kMaxLatencyNs = 1e9;  // 1 s per link: far beyond any real link
constexpr double kMaxCostUs = 1e6;     // 1 s of software time per call or message
// A tier's latency and bandwidth move at most this far (in log) from the cluster's: a factor
// of 1000 either way.
const double kMaxLogScale = std::log(1e3);
// Weight of the prior that keeps each tier's log factors near 0 (the cluster's figures), times
// sqrt(points): it decides only where the points do not (a bandwidth no point is limited by
// would otherwise run off to a bound); where they do, it moves a factor by about 1e-4 of itself.
constexpr double kPriorWeight = 1e-3;

const toml::node* node_at(const toml::table& t, std::string_view dotted) {
  const toml::node* n = &t;
  while (n != nullptr) {
    const size_t dot = dotted.find('.');
    const toml::table* tt = n->as_table();
    if (tt == nullptr) return nullptr;
    n = tt->get(dotted.substr(0, dot));
    if (dot == std::string_view::npos) return n;
    dotted.remove_prefix(dot + 1);
  }
  return nullptr;
}

double number_at(const toml::table& t, const std::string& key) {
  const toml::node* n = node_at(t, key);
  if (n == nullptr) throw ConfigError("calibrate: the cluster has no key '" + key + "'");
  if (const auto* v = n->as_floating_point()) return v->get();
  if (const auto* v = n->as_integer()) return static_cast<double>(v->get());
  throw ConfigError("calibrate: cluster key '" + key + "' is not a number");
}

// The graph of `g` with each link class's latency set to lat_ns[class] (when >= 0) and its
// bandwidth multiplied by bw_scale[class].
std::shared_ptr<const ClusterGraph> with_links(const ClusterGraph& g,
                                               const std::vector<std::int64_t>& lat_ns,
                                               const std::vector<double>& bw_scale) {
  auto out = std::make_shared<ClusterGraph>(g.topology());
  for (int v = g.num_ranks(); v < g.num_vertices(); ++v)
    out->add_vertex(g.vertex(v).name, g.vertex(v).kind, g.vertex(v).node);
  for (int k = 0; k < g.num_link_classes(); ++k)
    out->add_link_class(g.link_class(k).name, g.link_class(k).tier);
  for (int l = 0; l < g.num_links(); ++l) {
    const GraphLink& link = g.link(l);
    const auto k = static_cast<size_t>(link.link_class);
    const SimTime lat = lat_ns[k] >= 0 ? SimTime::from_ns(lat_ns[k]) : link.latency;
    const double bw =
        link.limited() ? link.bandwidth_bytes_per_s * bw_scale[k] : link.bandwidth_bytes_per_s;
    out->add_link(link.from, link.to, lat, bw, link.link_class);
  }
  return out;
}

struct SimKey {
  BenchOp op;
  int ranks, nodes;
  std::int64_t bytes;
  auto operator<=>(const SimKey&) const = default;
};

// The points of one rank and node count and the cluster they run on: where the points give
// their nodes and the cluster's nodes have one level, a cluster of exactly that many nodes of
// ranks / nodes ranks (so that what depends on a node's ranks, a host's slowdown or a shared
// NIC, is as measured); otherwise the first ranks of the whole cluster.
struct Group {
  Cluster cluster;
  std::vector<int> class_of;  // the whole cluster's link class -> this cluster's (by name)
  std::vector<BenchCall> calls;
  std::vector<std::string> where;  // a point of each call, for errors
};

struct SimPlan {
  std::vector<Group> groups;
  std::vector<std::pair<size_t, size_t>> of_point;  // (group, call)
};

// The complete table of a cluster whose nodes hold `per_node` ranks of a one-level topology.
toml::table resized(const toml::table& t, int nodes, int per_node) {
  toml::table out = t;
  set_key(out, "nodes", toml::value<std::int64_t>(nodes));
  toml::array sizes;
  sizes.push_back(per_node);
  set_key(out, "topology.sizes", sizes);
  if (const toml::array* nic = out["nic"]["rank_nic"].as_array(); nic != nullptr) {
    toml::array first;
    for (size_t i = 0; i < nic->size() && static_cast<int>(i) < per_node; ++i)
      first.push_back(*nic->get(i));
    set_key(out, "nic.rank_nic", first);
  }
  if (toml::table* links = out["links"].as_table(); links != nullptr) {
    for (auto& [name, link] : *links) {
      toml::array* pairs =
          link.as_table() != nullptr ? (*link.as_table())["pairs"].as_array() : nullptr;
      if (pairs == nullptr) continue;
      toml::array kept;
      for (const toml::node& pair : *pairs) {
        const std::string ab = pair.value_or(std::string());
        const size_t dash = ab.find('-');
        if (dash == std::string::npos) {
          kept.push_back(pair);
          continue;
        }
        const int a = std::atoi(ab.substr(0, dash).c_str()),
                  b = std::atoi(ab.substr(dash + 1).c_str());
        if (a < per_node && b < per_node) kept.push_back(pair);
      }
      *pairs = std::move(kept);
    }
  }
  return out;
}

SimPlan plan_sims(const FitCluster& fc, const Cluster& whole,
                  const std::vector<CollectivePoint>& points, const CollectiveFitOptions& options) {
  SimPlan plan;
  std::map<std::pair<int, int>, size_t> group_of;
  std::map<SimKey, std::pair<size_t, size_t>> seen;
  const bool one_level = whole.topology.num_levels() == 2;
  for (const CollectivePoint& p : points) {
    const std::vector<int> members = point_members(whole, p);  // checks the point fits
    const bool own = p.nodes > 0 && one_level;
    auto [g, fresh_group] =
        group_of.emplace(std::pair{p.ranks, own ? p.nodes : 0}, plan.groups.size());
    if (fresh_group) {
      Group grp;
      grp.cluster = own ? load_cluster_table(resized(fc.table, p.nodes, p.ranks / p.nodes),
                                             fc.source, fc.preset_dir, p.nodes)
                        : load_cluster_table(fc.table, fc.source, fc.preset_dir, fc.min_nodes);
      for (int k = 0; k < whole.graph->num_link_classes(); ++k) {
        int mine = -1;
        for (int j = 0; j < grp.cluster.graph->num_link_classes(); ++j)
          if (grp.cluster.graph->link_class(j).name == whole.graph->link_class(k).name) mine = j;
        grp.class_of.push_back(mine);
      }
      plan.groups.push_back(std::move(grp));
    }
    Group& grp = plan.groups[g->second];
    auto [it, fresh] = seen.emplace(SimKey{p.op, p.ranks, p.nodes, p.bytes},
                                    std::pair{g->second, grp.calls.size()});
    if (fresh) {
      BenchCall call;
      call.op = p.op;
      if (!own && static_cast<int>(members.size()) < whole.topology.num_ranks())
        call.members = members;
      // One element is one byte (EngineOptions::wire_bytes_per_element = 1).
      call.count =
          apps::bench_op_has_blocks(p.op)
              ? std::max<std::int64_t>(1, std::llround(static_cast<double>(p.bytes) / p.ranks))
              : p.bytes;
      call.warmup = options.warmup;
      call.iters = options.iters;
      grp.calls.push_back(std::move(call));
      grp.where.push_back(p.where);
    }
    plan.of_point.push_back(it->second);
  }
  return plan;
}

// Trial figures: each link class's latency (ns; -1 keeps the graph's) and bandwidth factor (by
// the whole cluster's classes), the library, and the host's cost per collective call (< 0:
// the cluster's).
struct Trial {
  std::vector<std::int64_t> lat_ns;
  std::vector<double> bw_scale;
  LibraryModel library;
  double collective_issue_us = -1;
};

// Each point's time in us under trial t: out[group][call].
// A line on stderr every few seconds while the fit simulates: a fit of many points runs for
// minutes, and a terminal or a log should show that it is working and how far it has come.
void fit_progress(int simulations) {
  using Clock = std::chrono::steady_clock;
  static const Clock::time_point start = Clock::now();
  static Clock::time_point last = start;
  const Clock::time_point now = Clock::now();
  if (std::chrono::duration<double>(now - last).count() < 5.0) return;
  last = now;
  std::fprintf(stderr,
               "cocodiff calibrate: %d simulations of the points run, %.0f s (the fit runs until "
               "its figures stop moving)\n",
               simulations, std::chrono::duration<double>(now - start).count());
  std::fflush(stderr);
}

std::vector<std::vector<double>> run_plan(const SimPlan& plan, const Trial& t,
                                          const std::string& rounds, int& simulations) {
  fit_progress(simulations);
  std::vector<std::vector<double>> out;
  for (const Group& g : plan.groups) {
    const Cluster& c = g.cluster;
    emu::EngineOptions eo;
    eo.workers = 1;
    eo.wire_bytes_per_element = 1;  // measurements count bytes
    eo.all_to_all_algorithm = rounds;
    eo.library = t.library;
    eo.trace = false;
    const size_t n = static_cast<size_t>(c.graph->num_link_classes());
    std::vector<std::int64_t> lat(n, -1);
    std::vector<double> bw(n, 1.0);
    bool same = true;
    for (size_t k = 0; k < g.class_of.size(); ++k) {
      if (g.class_of[k] < 0) continue;
      lat[static_cast<size_t>(g.class_of[k])] = t.lat_ns[k];
      bw[static_cast<size_t>(g.class_of[k])] = t.bw_scale[k];
      same = same && t.lat_ns[k] < 0 && t.bw_scale[k] == 1.0;
    }
    std::shared_ptr<const ClusterGraph> graph = same ? c.graph : with_links(*c.graph, lat, bw);
    std::shared_ptr<const DeviceModel> device = c.device;
    if (t.collective_issue_us >= 0) {
      RooflineParams d = c.device_params;
      d.host.collective_issue = SimTime::from_seconds(t.collective_issue_us * 1e-6);
      device = std::make_shared<RooflineDevice>(d);
    }
    emu::Engine engine(c.topology, make_network_model(c.network_kind, graph), device, eo);
    std::vector<SimTime> t_all;
    try {
      t_all = apps::time_collectives(engine, g.calls);
    } catch (const UserError&) {
      // Find the point: each alone.
      for (size_t i = 0; i < g.calls.size(); ++i) {
        try {
          apps::time_collectives(engine, {g.calls[i]});
        } catch (const UserError& e) {
          throw InputError(g.where[i] + ": the emulator cannot time this point: " + e.what());
        }
      }
      throw;
    }
    simulations += static_cast<int>(g.calls.size());
    std::vector<double> us(t_all.size());
    for (size_t i = 0; i < t_all.size(); ++i) us[i] = t_all[i].us();
    out.push_back(std::move(us));
  }
  return out;
}

// Copy rates are fitted as ns per KiB (linear in the time they add), 0 meaning free.
double rate_of_ns_per_kib(double x) { return x > 0 ? 1024 / (x * 1e-9) : 0; }
double ns_per_kib_of_rate(double bytes_per_s) { return 1024 / (bytes_per_s * 1e-9); }
// The GB/s a cluster file holds: below 0.001 ns per KiB (1e6 GB/s, the most a file may say)
// the copy is free.
double gbytes_per_s_written(double x) { return x > 1.1e-3 ? 1024 / x : 0; }

// A fit parameter and how it maps onto the trial.
struct Knob {
  enum class Kind {
    kBandwidth,
    kLatency,
    kCall,
    kHostIssue,
    kMessage,
    kRendezvous,
    kEagerCopy,
    kLocalCopy
  } kind;
  std::string tier;                 // bandwidth and latency
  std::vector<size_t> knobs;        // indices into the LinkKnob list (bandwidth and latency)
  std::vector<double> base_lat_ns;  // latency: each knob's latency at scale 1
};

}  // namespace

std::vector<LinkKnob> link_knobs(const Cluster& c, const toml::table& cluster) {
  std::vector<LinkKnob> out;
  const toml::table* links = cluster["links"].as_table();
  for (int k = 0; k < c.graph->num_link_classes(); ++k) {
    const LinkClass& lc = c.graph->link_class(k);
    LinkKnob kn;
    kn.link_class = k;
    kn.name = lc.name;
    kn.tier = lc.tier;
    // A switch's per-pair links ("nvlink.pair"): their bandwidth key is the switch's, and they
    // have no latency of their own.
    const size_t suffix = kPairLinkSuffix.size();
    const std::string pair_of = lc.name.size() > suffix && lc.name.ends_with(kPairLinkSuffix)
                                    ? lc.name.substr(0, lc.name.size() - suffix)
                                    : std::string();
    if (!pair_of.empty() && links != nullptr && links->contains(pair_of)) {
      kn.pair = true;
      kn.bandwidth_key = "links." + pair_of + ".pair_bandwidth_gbytes_per_s";
      kn.bandwidth_gbytes_per_s = number_at(cluster, kn.bandwidth_key);
      out.push_back(std::move(kn));
      continue;
    }
    const bool user = links != nullptr && links->contains(lc.name);
    if (user && (lc.name == "nic" || lc.name == "nic-attach" || lc.name == "fabric") &&
        cluster.contains("nic"))
      throw ConfigError("calibrate: the cluster has a [links." + lc.name +
                        "] beside its [nic] section: rename that link class");
    if (user) {
      kn.latency_key = "links." + lc.name + ".latency_ns";
      kn.bandwidth_key = "links." + lc.name + ".bandwidth_gbytes_per_s";
    } else if (lc.name == "nic-attach") {
      kn.latency_key = "nic.attach_latency_ns";
      kn.bandwidth_key = "nic.attach_bandwidth_gbytes_per_s";
    } else if (lc.name == "nic") {
      kn.latency_key = "nic.latency_ns";
      kn.bandwidth_key = "nic.bandwidth_gbytes_per_s";
    } else if (lc.name == "fabric") {
      kn.latency_key = "fabric.latency_ns";
    } else {
      throw ConfigError("calibrate: link class '" + lc.name + "' has no keys in the cluster");
    }
    kn.latency_ns = static_cast<std::int64_t>(number_at(cluster, kn.latency_key));
    if (!kn.bandwidth_key.empty()) kn.bandwidth_gbytes_per_s = number_at(cluster, kn.bandwidth_key);
    out.push_back(std::move(kn));
  }
  return out;
}

std::vector<int> point_members(const Cluster& c, const CollectivePoint& p) {
  const Topology& topo = c.topology;
  const int rpn = topo.ranks_per_node();
  if (p.op == BenchOp::kSendRecv && p.ranks < 2)
    throw InputError(p.where + ": expected at least 2 ranks for sendrecv, found " +
                     std::to_string(p.ranks));
  std::vector<int> m;
  if (p.nodes == 0) {
    if (p.ranks > topo.num_ranks())
      throw InputError(p.where + ": " + std::to_string(p.ranks) + " ranks, but cluster '" + c.name +
                       "' has " + std::to_string(topo.num_ranks()) +
                       " (set cluster.nodes higher, or give the points' nodes)");
    for (int r = 0; r < p.ranks; ++r) m.push_back(r);
    return m;
  }
  if (p.ranks % p.nodes != 0)
    throw InputError(p.where +
                     ": expected ranks divisible by nodes (as many on each node), found " +
                     std::to_string(p.ranks) + " ranks on " + std::to_string(p.nodes) + " nodes");
  const int per_node = p.ranks / p.nodes;
  if (per_node > rpn)
    throw InputError(p.where + ": " + std::to_string(per_node) + " ranks per node, but cluster '" +
                     c.name + "' has " + std::to_string(rpn) + " per node (its topology.sizes)");
  if (p.nodes > topo.num_nodes())
    throw InputError(p.where + ": " + std::to_string(p.nodes) + " nodes, but cluster '" + c.name +
                     "' has " + std::to_string(topo.num_nodes()) + " (set cluster.nodes higher)");
  for (int n = 0; n < p.nodes; ++n)
    for (int j = 0; j < per_node; ++j) m.push_back(n * rpn + j);
  return m;
}

std::vector<double> predict_collectives(const FitCluster& fc,
                                        const std::vector<CollectivePoint>& points,
                                        const CollectiveFitOptions& options) {
  const Cluster whole = load_cluster_table(fc.table, fc.source, fc.preset_dir, fc.min_nodes);
  const SimPlan plan = plan_sims(fc, whole, points, options);
  Trial t;
  t.lat_ns.assign(static_cast<size_t>(whole.graph->num_link_classes()), -1);
  t.bw_scale.assign(t.lat_ns.size(), 1.0);
  t.library = whole.library;
  int sims = 0;
  const std::vector<std::vector<double>> us = run_plan(plan, t, options.rounds, sims);
  std::vector<double> out(points.size());
  for (size_t i = 0; i < points.size(); ++i)
    out[i] = us[plan.of_point[i].first][plan.of_point[i].second];
  return out;
}

namespace {

// The link classes (as the whole cluster's) that the points' messages cross.
std::set<int> crossed_classes(const SimPlan& plan) {
  std::set<int> classes;
  for (const Group& g : plan.groups) {
    const ClusterGraph& graph = *g.cluster.graph;
    std::vector<int> whole_class(static_cast<size_t>(graph.num_link_classes()), -1);
    for (size_t k = 0; k < g.class_of.size(); ++k)
      if (g.class_of[k] >= 0) whole_class[static_cast<size_t>(g.class_of[k])] = static_cast<int>(k);
    for (const BenchCall& call : g.calls) {
      std::vector<int> m = call.members;
      if (m.empty())
        for (int r = 0; r < g.cluster.topology.num_ranks(); ++r) m.push_back(r);
      const bool all_pairs = m.size() <= 64;
      for (size_t i = 0; i < m.size(); ++i)
        for (size_t j = 0; j < m.size(); ++j) {
          if (i == j || (!all_pairs && i != 0 && j != (i + 1) % m.size())) continue;
          for (int l : graph.route(m[i], m[j])) {
            const int k = whole_class[static_cast<size_t>(graph.link(l).link_class)];
            if (k >= 0) classes.insert(k);
          }
        }
    }
  }
  return classes;
}

// The tiers of those classes, outermost first.
std::map<int, std::string, std::greater<>> tiers_of(const Cluster& c,
                                                    const std::set<int>& classes) {
  std::map<int, std::string, std::greater<>> tiers;
  for (int k : classes) {
    const std::string& tier = c.graph->link_class(k).tier;
    tiers.emplace(c.graph->tier_rank(tier), tier);
  }
  return tiers;
}

// The cluster keys a knob sets.
std::vector<std::string> knob_keys(const Knob& k, const std::vector<LinkKnob>& knobs) {
  std::vector<std::string> keys;
  switch (k.kind) {
    case Knob::Kind::kBandwidth:
      for (size_t i : k.knobs) keys.push_back(knobs[i].bandwidth_key);
      break;
    case Knob::Kind::kLatency:
      for (size_t i : k.knobs) keys.push_back(knobs[i].latency_key);
      break;
    case Knob::Kind::kCall:
      return std::vector<std::string>{"library.call_overhead_us"};
    case Knob::Kind::kHostIssue:
      return std::vector<std::string>{"device.host.collective_issue_us"};
    case Knob::Kind::kMessage:
      return std::vector<std::string>{"library.message_overhead_us"};
    case Knob::Kind::kLocalCopy:
      return std::vector<std::string>{"library.local_copy_gbytes_per_s"};
    case Knob::Kind::kRendezvous:
    case Knob::Kind::kEagerCopy:
      break;
  }
  return keys;
}

// The parameters, in the order determined_columns prefers them; a figure options.keep names
// is held at its value and listed as held.
struct KnobSet {
  const Cluster& c;
  const std::vector<LinkKnob>& knobs;
  std::set<std::string> keep, fittable;
  std::vector<Knob> ks;
  std::vector<LsqParam> ps;
  std::vector<FittedValue> held;

  // Adds k with parameter p, or lists its figures as held where keep names one of them.
  void add(Knob k, LsqParam p) {
    const std::vector<std::string> keys = knob_keys(k, knobs);
    fittable.insert(keys.begin(), keys.end());
    bool kept = false;
    for (const std::string& key : keys) kept = kept || keep.count(key) != 0;
    if (kept) {
      for (size_t n = 0; n < keys.size(); ++n) {
        double v = p.x;  // the us figures start at the cluster's value
        if (k.kind == Knob::Kind::kBandwidth) v = knobs[k.knobs[n]].bandwidth_gbytes_per_s;
        if (k.kind == Knob::Kind::kLatency) v = static_cast<double>(knobs[k.knobs[n]].latency_ns);
        if (k.kind == Knob::Kind::kLocalCopy) v = c.library.local_copy_bytes_per_s / 1e9;
        held.push_back({keys[n], p.name, v, v, k.kind == Knob::Kind::kLatency, false, true,
                        "no point (held at its value by --keep)"});
      }
      return;
    }
    ks.push_back(std::move(k));
    ps.push_back(std::move(p));
  }
};

using TierMap = std::map<int, std::string, std::greater<>>;

// The knobs of a tier's links that the points cross.
std::vector<size_t> tier_knobs(const std::vector<LinkKnob>& knobs, const std::set<int>& classes,
                               const std::string& tier) {
  std::vector<size_t> v;
  for (size_t i = 0; i < knobs.size(); ++i)
    if (knobs[i].tier == tier && classes.count(knobs[i].link_class) != 0) v.push_back(i);
  return v;
}

// Per tier, one factor for its links' bandwidth and one for its switches' per-pair bandwidth.
void add_bandwidth_knobs(KnobSet& s, const TierMap& tiers, const std::set<int>& classes) {
  const std::vector<LinkKnob>& knobs = s.knobs;
  for (const auto& [rank, tier] : tiers)
    for (const bool pair : {false, true}) {
      std::vector<size_t> limited;
      double lo = -1e300, hi = 1e300;
      for (size_t i : tier_knobs(knobs, classes, tier)) {
        if (knobs[i].bandwidth_key.empty() || knobs[i].pair != pair) continue;
        limited.push_back(i);
        lo = std::max({lo, std::log(kMinGbps / knobs[i].bandwidth_gbytes_per_s), -kMaxLogScale});
        hi = std::min({hi, std::log(kMaxGbps / knobs[i].bandwidth_gbytes_per_s), kMaxLogScale});
      }
      if (limited.empty() || !(lo < 0 && hi > 0)) continue;
      s.add({Knob::Kind::kBandwidth, tier, limited, {}},
            {tier + (pair ? " per-pair bandwidth" : " bandwidth"), 0, lo, hi, 2e-3});
    }
}

// Per tier, one factor on its links' latencies.
void add_latency_knobs(KnobSet& s, const TierMap& tiers, const std::set<int>& classes) {
  const std::vector<LinkKnob>& knobs = s.knobs;
  for (const auto& [rank, tier] : tiers) {
    std::vector<size_t> v = tier_knobs(knobs, classes, tier);
    std::erase_if(v, [&](size_t i) { return knobs[i].latency_key.empty(); });
    if (v.empty()) continue;
    Knob k{Knob::Kind::kLatency, tier, v, {}};
    bool any = false;
    for (size_t i : v) any = any || knobs[i].latency_ns > 0;
    double max_base = 0;
    for (size_t i : v) {
      // A tier of zero latencies starts from 100 ns per link, so that a factor can move it.
      k.base_lat_ns.push_back(any ? static_cast<double>(knobs[i].latency_ns) : 100.0);
      max_base = std::max(max_base, k.base_lat_ns.back());
    }
    if (!(max_base > 0)) continue;
    const double start = any ? 0.0 : std::log(1e-4);
    s.add(std::move(k), {tier + " latency", start, std::min(start, -kMaxLogScale),
                         std::min(kMaxLogScale, std::log(kMaxLatencyNs / max_base)), 0.05});
  }
}

// InputError where --keep names a figure that no knob sets.
void check_keep(const KnobSet& s) {
  for (const std::string& key : s.keep)
    if (s.fittable.count(key) == 0) {
      std::string msg = "--keep " + key + ": not a figure these points fit (they fit: ";
      bool first = true;
      for (const std::string& f : s.fittable) {
        if (!first) msg += ", ";
        msg += f;
        first = false;
      }
      msg += ")";
      throw InputError(msg);
    }
}

// The parameters the points fit: bandwidths, call costs, latencies, message and copy costs.
KnobSet build_knobs(const Cluster& c, const std::vector<LinkKnob>& knobs, const SimPlan& plan,
                    const std::vector<CollectivePoint>& points,
                    const CollectiveFitOptions& options) {
  const std::set<int> classes = crossed_classes(plan);
  const TierMap tiers = tiers_of(c, classes);
  KnobSet s{c, knobs, {options.keep.begin(), options.keep.end()}, {}, {}, {}, {}};
  add_bandwidth_knobs(s, tiers, classes);
  const LibraryModel& lib0 = c.library;
  auto us_param = [](const std::string& name, double start_us) {
    return LsqParam{name, start_us, 0, kMaxCostUs, std::max(0.01 * start_us, 0.1)};
  };
  s.add({Knob::Kind::kCall, "", {}, {}}, us_param("call_overhead_us", lib0.call_overhead.us()));
  // Where the device has a host, its cost to issue a collective call: overlapped by the call
  // before it when calls run back to back, so the points can tell it from the library's.
  if (c.device->has_host())
    s.add({Knob::Kind::kHostIssue, "", {}, {}},
          us_param("host collective_issue_us", c.device_params.host.collective_issue.us()));
  add_latency_knobs(s, tiers, classes);
  s.add({Knob::Kind::kMessage, "", {}, {}},
        us_param("message_overhead_us", lib0.message_overhead.us()));
  // A ring kernel's time on the caller's own block, where the library gives it a rate and the
  // points time a ring (all-gather, reduce-scatter, all-reduce): in ns per KiB, 0 free.
  const bool rings = std::any_of(points.begin(), points.end(), [](const CollectivePoint& p) {
    return p.ranks > 1 && (p.op == BenchOp::kAllGather || p.op == BenchOp::kReduceScatter ||
                           p.op == BenchOp::kAllReduce);
  });
  if (rings && lib0.local_copy_bytes_per_s > 0) {
    const double start = ns_per_kib_of_rate(lib0.local_copy_bytes_per_s);
    s.add({Knob::Kind::kLocalCopy, "", {}, {}},
          {"local_copy_ns_per_kib", start, 0, 1e6, std::max(0.01 * start, 1e-3)});
  }
  check_keep(s);
  return s;
}

// A trial from parameter values (protocol: threshold, or -2 for the cluster's own protocol).
Trial make_trial(const Cluster& c, const std::vector<LinkKnob>& knobs, const std::vector<Knob>& ks,
                 const std::vector<double>& x, std::int64_t threshold) {
  Trial t;
  t.lat_ns.assign(static_cast<size_t>(c.graph->num_link_classes()), -1);
  t.bw_scale.assign(t.lat_ns.size(), 1.0);
  t.library = c.library;
  for (size_t j = 0; j < ks.size(); ++j) {
    const Knob& k = ks[j];
    switch (k.kind) {
      case Knob::Kind::kBandwidth:
        for (size_t i : k.knobs)
          t.bw_scale[static_cast<size_t>(knobs[i].link_class)] = std::exp(x[j]);
        break;
      case Knob::Kind::kLatency:
        for (size_t n = 0; n < k.knobs.size(); ++n)
          t.lat_ns[static_cast<size_t>(knobs[k.knobs[n]].link_class)] =
              std::llround(k.base_lat_ns[n] * std::exp(x[j]));
        break;
      case Knob::Kind::kCall:
        t.library.call_overhead = SimTime::from_seconds(x[j] * 1e-6);
        break;
      case Knob::Kind::kHostIssue:
        t.collective_issue_us = x[j];
        break;
      case Knob::Kind::kMessage:
        t.library.message_overhead = SimTime::from_seconds(x[j] * 1e-6);
        break;
      case Knob::Kind::kRendezvous:
        t.library.rendezvous_overhead = SimTime::from_seconds(x[j] * 1e-6);
        break;
      case Knob::Kind::kEagerCopy:  // x: ns per KiB; 0: no staging copy
        t.library.eager_copy_bytes_per_s = rate_of_ns_per_kib(x[j]);
        break;
      case Knob::Kind::kLocalCopy:  // x: ns per KiB; 0: free
        t.library.local_copy_bytes_per_s = rate_of_ns_per_kib(x[j]);
        break;
    }
  }
  if (threshold >= -1) {
    t.library.eager_max_bytes = threshold;
    t.library.eager_overhead = SimTime{};
  }
  return t;
}

// What the fit's phases share: the points, their simulations and the knobs (which the protocol
// search extends); the residuals it makes refer to this, so it stays in place.
struct Fitter {
  const Cluster& c;
  const SimPlan& plan;
  const std::vector<LinkKnob>& knobs;
  const std::vector<CollectivePoint>& points;
  const CollectiveFitOptions& options;
  CollectiveFit& fit;
  std::vector<Knob> ks;
  std::vector<double> measured_log;
  double prior_weight = 0;
  LsqOptions full;

  // The trial of parameter values x under protocol threshold (see make_trial).
  Trial trial(const std::vector<double>& x, std::int64_t threshold) const {
    return make_trial(c, knobs, ks, x, threshold);
  }

  // Each point's log error under the trial (soft-L1 where asked), then the tiers' priors.
  ResidualFn residuals_for(std::int64_t threshold) {
    return [this, threshold](const std::vector<double>& x) {
      const std::vector<std::vector<double>> us =
          run_plan(plan, trial(x, threshold), options.rounds, fit.simulations);
      std::vector<double> r(points.size());
      for (size_t i = 0; i < points.size(); ++i) {
        r[i] = std::log(std::max(us[plan.of_point[i].first][plan.of_point[i].second], 1e-3)) -
               measured_log[i];
        if (options.soft_l1) {  // a residual whose square is the loss
          constexpr double k = 0.1;
          r[i] = std::copysign(std::sqrt(2 * k * k * (std::sqrt(1 + (r[i] / k) * (r[i] / k)) - 1)),
                               r[i]);
        }
      }
      for (size_t j = 0; j < ks.size(); ++j)
        if (ks[j].kind == Knob::Kind::kBandwidth || ks[j].kind == Knob::Kind::kLatency)
          r.push_back(prior_weight * x[j]);
      return r;
    };
  }
};

// The best fit so far: its result, protocol threshold (-2: the cluster's own) and parameters.
struct BestFit {
  LsqResult result;
  std::int64_t threshold = -2;
  std::vector<LsqParam> ps;
};

// The fit under the cluster's own protocol, from the cluster's figures and, with a host, from
// the host-issue basin too; the better one.
BestFit fit_own_protocol(Fitter& f, const std::vector<LsqParam>& ps) {
  BestFit best{least_squares(f.residuals_for(-2), ps, f.full), -2, ps};
  // With a host, a call costs max(host issue, device time) back to back: two basins, the
  // device's call cost or the host's issue carrying the small sizes. Start from the other too
  // (host issue the smallest sizes' median time, the library's call cost near zero) and keep
  // the better.
  for (size_t j = 0; j < f.ks.size(); ++j) {
    if (f.ks[j].kind != Knob::Kind::kHostIssue) continue;
    std::vector<double> small;
    for (const CollectivePoint& p : f.points)
      if (p.bytes <= (64 << 10)) small.push_back(p.time_us);
    if (small.empty()) break;
    std::nth_element(small.begin(), small.begin() + static_cast<std::ptrdiff_t>(small.size() / 2),
                     small.end());
    std::vector<LsqParam> other = ps;
    other[j].x = std::min(small[small.size() / 2], kMaxCostUs);
    for (size_t i = 0; i < f.ks.size(); ++i)
      if (f.ks[i].kind == Knob::Kind::kCall) other[i].x = 0.5;
    LsqResult r = least_squares(f.residuals_for(-2), other, f.full);
    if (r.sse < best.result.sse) {
      best.result = std::move(r);
      best.ps = other;
    }
  }
  for (size_t j = 0; j < ps.size(); ++j) best.ps[j].x = best.result.x[j];
  f.fit.protocol_note = "the cluster's own protocol (eager_max_bytes " +
                        std::to_string(f.c.library.eager_max_bytes) + ")";
  return best;
}

// The eager/rendezvous split at the best of `sizes` (a short fit at each), refined by a full fit.
BestFit search_split(Fitter& f, const std::set<std::int64_t>& sizes, std::vector<LsqParam> pp) {
  LsqOptions quick = f.full;
  quick.max_iterations = 6;
  BestFit split{{}, -1, {}};
  for (std::int64_t t : sizes) {
    // A step that moves the largest eager message's copy by about 100 ns.
    pp.back().step = 100.0 / (static_cast<double>(t) / 1024.0);
    pp.back().x = 0;
    pp[pp.size() - 2].x = 0;
    LsqResult r = least_squares(f.residuals_for(t), pp, quick);
    if (split.threshold < 0 || r.sse < split.result.sse) {
      split.result = std::move(r);
      split.threshold = t;
      split.ps = pp;
    }
  }
  for (size_t j = 0; j < split.ps.size(); ++j) split.ps[j].x = split.result.x[j];
  split.result = least_squares(f.residuals_for(split.threshold), split.ps, f.full);
  return split;
}

// Then an eager/rendezvous split at each measured message size but the largest, taken where it
// fits markedly better than the cluster's own protocol.
void fit_protocol_split(Fitter& f, BestFit& best, size_t base_params) {
  const double base_sse = best.result.sse;
  std::set<std::int64_t> sizes;
  for (const CollectivePoint& p : f.points)
    if (p.ranks > 1 || p.op == BenchOp::kSendRecv)
      sizes.insert(apps::bench_message_bytes(p.op, p.ranks, p.bytes));
  if (!f.options.fit_protocol || sizes.size() < 4) return;
  // A threshold with at least two measured sizes on each side, so that neither protocol's
  // costs rest on one size.
  sizes.erase(sizes.begin());
  sizes.erase(std::prev(sizes.end()));
  sizes.erase(std::prev(sizes.end()));
  std::vector<LsqParam> pp = best.ps;
  f.ks.push_back({Knob::Kind::kRendezvous, "", {}, {}});
  pp.push_back({"rendezvous_overhead_us", 0, 0, kMaxCostUs, 0.1});
  f.ks.push_back({Knob::Kind::kEagerCopy, "", {}, {}});
  pp.push_back({"eager_copy_ns_per_kib", 0, 0, 1e6, 0});
  BestFit split = search_split(f, sizes, std::move(pp));
  // Taken when it lowers the sum of squares by a fifth and by more than 1% rms per point.
  const double floor = 1e-4 * static_cast<double>(f.points.size());
  if (split.result.sse < 0.8 * base_sse && base_sse - split.result.sse > floor) {
    best = std::move(split);
    f.fit.protocol_fitted = true;
    f.fit.protocol_note = "eager up to " + std::to_string(best.threshold) +
                          " bytes per message (of " + std::to_string(sizes.size()) +
                          " measured sizes tried; the split lowers the sum of squares from " +
                          std::to_string(base_sse) + " to " + std::to_string(best.result.sse) + ")";
  } else {
    f.fit.protocol_note +=
        "; no eager/rendezvous split at a measured size lowered the sum of "
        "squares by a fifth (best: " +
        std::to_string(split.threshold) + " bytes, " + std::to_string(split.result.sse) +
        " against " + std::to_string(base_sse) + ")";
    f.ks.resize(base_params);
  }
}

// Which region of the sweep determines each figure: at the fitted values, the points whose
// predicted time it moves most (each figure changed by 10%: a factor on a bandwidth or a
// latency, 10% of its value for a cost, at least its step).
std::vector<std::string> sweep_regions(Fitter& f, const BestFit& best) {
  const std::vector<Knob>& ks = f.ks;
  const std::vector<CollectivePoint>& points = f.points;
  std::vector<std::string> regions(ks.size());
  const ResidualFn res = f.residuals_for(best.threshold);
  const std::vector<double> r0 = res(best.result.x);
  const std::vector<std::vector<double>> jac =
      jacobian(res, best.ps, best.result.x, r0, f.fit.simulations);
  std::vector<std::vector<size_t>> owned(ks.size());
  for (size_t i = 0; i < points.size(); ++i) {
    size_t top = ks.size();
    double top_s = 0;
    for (size_t j = 0; j < ks.size(); ++j) {
      const bool log_scale =
          ks[j].kind == Knob::Kind::kBandwidth || ks[j].kind == Knob::Kind::kLatency;
      const double delta =
          log_scale ? 0.1 : std::max(0.1 * std::abs(best.result.x[j]), best.ps[j].step);
      const double sens = std::abs(jac[i][j]) * delta;
      if (sens > top_s) {
        top_s = sens;
        top = j;
      }
    }
    if (top < ks.size() && top_s > 1e-4) owned[top].push_back(i);  // moves it by 0.01% or more
  }
  for (size_t j = 0; j < ks.size(); ++j) {
    if (owned[j].empty()) {
      regions[j] = "no point: no region of the sweep moves it most";
      continue;
    }
    std::int64_t lo = points[owned[j].front()].bytes, hi = lo;
    for (size_t i : owned[j]) {
      lo = std::min(lo, points[i].bytes);
      hi = std::max(hi, points[i].bytes);
    }
    regions[j] = std::to_string(owned[j].size()) +
                 (owned[j].size() == 1 ? " point, " : " points, ") + std::to_string(lo) +
                 (lo == hi ? "" : "-" + std::to_string(hi)) + " bytes";
  }
  return regions;
}

// The figures, as the cluster file will hold them, into f.fit.values.
void fitted_values(Fitter& f, const BestFit& best, const std::vector<std::string>& regions) {
  const std::vector<LinkKnob>& knobs = f.knobs;
  const LibraryModel& lib0 = f.c.library;
  const std::vector<double>& x = best.result.x;
  for (size_t j = 0; j < f.ks.size(); ++j) {
    const Knob& k = f.ks[j];
    const bool free = best.result.free[j];
    // The value the fit ran with (a figure held in the last fit may have moved in an earlier
    // one it started from); fitted when some fit moved it.
    auto value = [&](std::string key, std::string what, double initial, double v, bool integer) {
      const bool moved = free || std::abs(v - initial) > 1e-9 * std::max(1.0, std::abs(initial));
      f.fit.values.push_back(
          {std::move(key), std::move(what), initial, v, integer, moved, false, regions[j]});
    };
    switch (k.kind) {
      case Knob::Kind::kBandwidth:
        for (size_t i : k.knobs)
          value(knobs[i].bandwidth_key,
                k.tier + (knobs[i].pair ? " per-pair bandwidth (GB/s)" : " bandwidth (GB/s)"),
                knobs[i].bandwidth_gbytes_per_s, knobs[i].bandwidth_gbytes_per_s * std::exp(x[j]),
                false);
        break;
      case Knob::Kind::kLatency:
        for (size_t n = 0; n < k.knobs.size(); ++n)
          value(knobs[k.knobs[n]].latency_key, k.tier + " latency (ns)",
                static_cast<double>(knobs[k.knobs[n]].latency_ns),
                static_cast<double>(std::llround(k.base_lat_ns[n] * std::exp(x[j]))), true);
        break;
      case Knob::Kind::kCall:
        value("library.call_overhead_us", "per-call cost (us)", lib0.call_overhead.us(), x[j],
              false);
        break;
      case Knob::Kind::kHostIssue:
        value("device.host.collective_issue_us", "host's cost to issue a collective (us)",
              f.c.device_params.host.collective_issue.us(), x[j], false);
        break;
      case Knob::Kind::kMessage:
        value("library.message_overhead_us", "per-message cost (us)", lib0.message_overhead.us(),
              x[j], false);
        break;
      case Knob::Kind::kRendezvous:
        value("library.rendezvous_overhead_us", "rendezvous handshake per message (us)",
              lib0.rendezvous_overhead.us(), x[j], false);
        break;
      case Knob::Kind::kEagerCopy:
        value("library.eager_copy_gbytes_per_s", "eager copy rate (GB/s; 0: none)",
              lib0.eager_copy_bytes_per_s / 1e9, gbytes_per_s_written(x[j]), false);
        break;
      case Knob::Kind::kLocalCopy:
        value("library.local_copy_gbytes_per_s", "ring kernel's own-block rate (GB/s; 0: free)",
              lib0.local_copy_bytes_per_s / 1e9, gbytes_per_s_written(x[j]), false);
        break;
    }
  }
}

// The held figures and the fitted protocol's after the fitted ones; each point's prediction
// and the rms of the log errors under the fitted figures.
void finish_fit(Fitter& f, const BestFit& best, const std::vector<FittedValue>& held) {
  CollectiveFit& fit = f.fit;
  const LibraryModel& lib0 = f.c.library;
  fit.values.insert(fit.values.end(), held.begin(), held.end());
  if (fit.protocol_fitted) {
    fit.values.push_back({"library.eager_max_bytes", "protocol threshold (bytes per message)",
                          static_cast<double>(lib0.eager_max_bytes),
                          static_cast<double>(best.threshold), true, true, false,
                          "the split of the measured sizes that lowers the sum of squares most"});
    fit.values.push_back({"library.eager_overhead_us", "eager extra per message (us)",
                          lib0.eager_overhead.us(), 0, false, true, false,
                          "no point (none under the fitted protocol)"});
  }
  const std::vector<std::vector<double>> us =
      run_plan(f.plan, f.trial(best.result.x, best.threshold), f.options.rounds, fit.simulations);
  fit.predicted_us.resize(f.points.size());
  double sq = 0;
  for (size_t i = 0; i < f.points.size(); ++i) {
    fit.predicted_us[i] = us[f.plan.of_point[i].first][f.plan.of_point[i].second];
    const double e = std::log(std::max(fit.predicted_us[i], 1e-3)) - f.measured_log[i];
    sq += e * e;
  }
  fit.rms_log = std::sqrt(sq / static_cast<double>(f.points.size()));
}

}  // namespace

CollectiveFit fit_collectives(const FitCluster& fc, const std::vector<LinkKnob>& knobs,
                              const std::vector<CollectivePoint>& points,
                              const CollectiveFitOptions& options) {
  const Cluster c = load_cluster_table(fc.table, fc.source, fc.preset_dir, fc.min_nodes);
  const SimPlan plan = plan_sims(fc, c, points, options);
  CollectiveFit fit;
  KnobSet s = build_knobs(c, knobs, plan, points, options);
  const size_t base_params = s.ps.size();
  Fitter f{c, plan, knobs, points, options, fit, std::move(s.ks), {}, 0, {}};
  f.prior_weight = kPriorWeight * std::sqrt(static_cast<double>(points.size()));
  f.full.data_rows = points.size();
  f.measured_log.resize(points.size());
  for (size_t i = 0; i < points.size(); ++i) f.measured_log[i] = std::log(points[i].time_us);

  BestFit best = fit_own_protocol(f, s.ps);
  fit_protocol_split(f, best, base_params);
  const std::vector<std::string> regions = sweep_regions(f, best);
  fit.eager_max_bytes = f.trial(best.result.x, best.threshold).library.eager_max_bytes;
  fitted_values(f, best, regions);
  finish_fit(f, best, s.held);
  return fit;
}

}  // namespace cocodiff::calibrate
