#pragma once
// Fits a cluster's communication figures to measured collective times: per link tier the
// latency and bandwidth, and the collective library's per-call and per-message software costs
// and protocol (eager up to a threshold, with its own per-byte copy cost; rendezvous above it,
// with a handshake cost), by least squares on log time over every point. Each prediction is
// the emulator's own time for the point (calibrate/collective_bench.hpp, what netbench prints) on
// the cluster with the trial figures, so the fitted file reproduces the fit's predictions.
//
//   std::vector<LinkKnob> knobs = link_knobs(cluster, cluster_table);
//   CollectiveFit f = fit_collectives(cluster, knobs, points, {.rounds = "library"});
//   f.values;        // cluster keys and their fitted (or kept) values
//   f.predicted_us;  // per point
//
// Points that give their nodes run on a cluster of exactly that many nodes of ranks / nodes
// ranks each (the node resized where the cluster's nodes have one level: topology.sizes,
// nic.rank_nic and direct links cut to it), so that what depends on a node's ranks (a host's
// slowdown, a shared NIC) is as measured; other points run on the first ranks of the cluster.
// Where the device has a host ([device.host]), its cost to issue a collective is fitted too
// (points timed back to back overlap it with the call before).
//
// A tier's latency and bandwidth scale every link class of that tier by one factor each, so a
// route's latency and bottleneck move together and the preset's ratios between its link classes
// stay; a switch's per-pair bandwidth (links.NAME.pair_bandwidth_gbytes_per_s, where the
// cluster gives one) has a factor of its own, since it is what tells a lone flow from several
// sharing a rank's link. Which figures the points determine is found from the Jacobian
// (least_squares.hpp): a figure whose effect the points cannot tell from that of figures before it
// (bandwidths, the call cost, latencies, the message cost, the protocol's costs, in that order)
// keeps the cluster's value and is reported as kept. The protocol threshold is chosen among the
// measured message sizes by the same criterion (the lowest sum of squares; a split must lower it by
// a fifth to be taken, so that noise does not buy one).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "calibrate/measurements.hpp"
#include "net_models/cluster.hpp"

namespace cocodiff::calibrate {

/// One link class of the cluster and the cluster keys (relative to [cluster]) that set it.
struct LinkKnob {
  int link_class = 0;
  std::string name;           // "nvlink", "nic", "nic-attach", "fabric"
  std::string tier;           // its tier
  std::string latency_key;    // "links.nvlink.latency_ns"; empty: none (a switch's pair links)
  std::string bandwidth_key;  // "links.nvlink.bandwidth_gbytes_per_s"; empty: unlimited
  std::int64_t latency_ns = 0;
  double bandwidth_gbytes_per_s = 0;  // as the key holds it (before any link count)
  bool pair = false;  // a switch's per-pair links (links.NAME.pair_bandwidth_gbytes_per_s)
};

/// The link classes of `c` with the values of their keys in `cluster` (the cluster's complete
/// table: the preset with every override). ConfigError when a class cannot be mapped to keys.
std::vector<LinkKnob> link_knobs(const Cluster& c, const toml::table& cluster);

/// The cluster a fit starts from: its complete table (cluster_file.hpp), a name for it in
/// errors, where presets live, and the nodes the points need at least.
struct FitCluster {
  toml::table table;
  std::string source;
  std::filesystem::path preset_dir;
  int min_nodes = 1;
};

struct CollectiveFitOptions {
  std::string rounds = "library";  // EngineOptions::all_to_all_algorithm
  int warmup = 0, iters = 1;       // each point's calls (apps::BenchCall)
  bool fit_protocol = true;        // search the eager/rendezvous threshold
  /// The loss on each point's log error r: r^2 (least squares), or soft L1 with a knee at 10%
  /// (2 k^2 (sqrt(1 + (r/k)^2) - 1), k = 0.1): like r^2 below the knee, growing as |r| past
  /// it, so that a few points far off (a noisy machine) do not pull the figures.
  bool soft_l1 = false;
  /// Figures held at the cluster's values, by their keys relative to [cluster]
  /// ("library.call_overhead_us", "links.nvlink.bandwidth_gbytes_per_s"): what other
  /// measurements have fixed (a device-side floor from CUDA-graph runs, say). InputError for a
  /// key that is none of the figures this fit could move.
  std::vector<std::string> keep;
};

/// One figure of the fit, as the cluster file will hold it.
struct FittedValue {
  std::string key;   // relative to [cluster]: "library.call_overhead_us"
  std::string what;  // "intra-node latency (scales links.nvlink.latency_ns)"
  double initial = 0, value = 0;
  bool integer = false;  // written as an integer (latency_ns, eager_max_bytes)
  bool fitted = false;   // false: kept (the points do not determine it, or held by keep)
  bool held = false;     // held at its value by CollectiveFitOptions::keep
  /// The region of the sweep that determines it: the points where this figure moves the
  /// predicted time most of all the fitted figures (its change by 10%, or by 10% of its value
  /// for a cost), "N points, B1-B2 bytes"; "no point" where it moves none most. Empty for a
  /// held figure and the protocol's.
  std::string determined_by;
};

struct CollectiveFit {
  std::vector<FittedValue> values;
  std::vector<double> predicted_us;  // per point, under the fitted figures
  double rms_log = 0;
  std::int64_t eager_max_bytes = -1;  // the protocol threshold chosen (-1: none eager)
  bool protocol_fitted = false;
  std::string protocol_note;  // how the threshold was chosen
  int simulations = 0;
};

/// Which world ranks take part in `p` on cluster c: `nodes` nodes, ranks / nodes local ranks of
/// each (the first ones); without nodes, the first `ranks` ranks. InputError naming p.where when
/// the cluster cannot hold it.
std::vector<int> point_members(const Cluster& c, const CollectivePoint& p);

/// Fits `points` (every one with ranks the cluster holds) on the cluster fc holds, whose link
/// classes are `knobs`. Throws InputError naming a point the emulator cannot time.
CollectiveFit fit_collectives(const FitCluster& fc, const std::vector<LinkKnob>& knobs,
                              const std::vector<CollectivePoint>& points,
                              const CollectiveFitOptions& options);

/// The emulator's time in us of each point on the cluster fc holds (equal points share a run),
/// timed as `options` say. InputError naming a point that cannot be timed.
std::vector<double> predict_collectives(const FitCluster& fc,
                                        const std::vector<CollectivePoint>& points,
                                        const CollectiveFitOptions& options);

}  // namespace cocodiff::calibrate
