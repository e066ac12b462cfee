#pragma once
// `cocodiff tune`: the fastest way to run a config's model, resolution and steps on its cluster,
// searched over the attention strategy and its features, the Ulysses x ring split, CFG-parallel,
// text sharding, and the number of nodes and of GPUs used per node. Every point is a phantom
// run of the emulator (run.math = "skip", replay on), made exactly as `cocodiff run` makes it;
// independent points run side by side.
//
//   TuneOptions o;
//   o.config = "configs/quickstart.toml";
//   o.sets = {"model.preset=flux1-dev", "run.resolution=2048"};
//   o.nodes = {1, 2, 4, 8};
//   TuneResult r = tune(o);                 // ConfigError / UserError: nothing to search
//   std::cout << tune_table(o, r);
//   std::string cmd = run_command(o, r.points[r.ranking[0]]);   // reproduces the best
//
// Hosts: where the cluster holds device.host.range (how much faster and slower than its host the
// machines measured issued their host-bound steps), the kHostRangePoints best points and the
// front are timed again with device.host.scale at both ends (TunePoint::host_range_s), and
// TuneResult::best_at_low / best_at_high say which of them is best with each host.
//
// Pruning: a point's time is at least its busiest tile's compute, and that is at least the
// compute of the same image on one tile divided by the point's tiles (each op split over tiles
// costs each tile at least its share of the whole op's time, and the strategies only add work).
// A point whose bound already exceeds the best time per image of a point with no more GPUs is
// on no front and wins neither objective: it is not run (counted as pruned). Each shape's
// baseline (flat Ulysses) always runs to the end, so every point has its speedup over flat;
// every point that runs checks the bound against its own compute, and one that breaks it turns
// pruning off and puts the pruned points back.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cocodiff::dit {
class StrategyRegistry;  // dit/parallel/strategies.hpp
struct LossyProbe;       // dit/parallel/search.hpp
}  // namespace cocodiff::dit

namespace cocodiff::apps {

/// The most runs tune has side by side, whatever --jobs asks (each run is CPU-bound).
inline constexpr int kMaxTuneJobs = 256;

struct TuneOptions {
  std::filesystem::path config;
  std::vector<std::string> sets;  // --set, before the search's own keys
  std::vector<int> nodes = {1, 2, 4, 8};
  std::vector<int> gpus_per_node;       // empty: 1 .. the cluster's GPUs per node
  std::string objective = "latency";    // "latency" (s per image) | "gpu-seconds" (per image)
  std::optional<double> lossy_psnr_db;  // admits lossy settings (V-Major's thresholds) that keep
                                        // this PSNR
  /// Where --lossy's thresholds are measured (real math, against the exact run): the trained
  /// model's run (empty: configs/quickstart.toml), with these keys set.
  std::filesystem::path quality_config;
  std::vector<std::string> quality_sets;
  double budget_s = 0;  // wall-clock limit of the search (0: none)
  int jobs = 0;         // runs side by side (0: the hardware threads; at most kMaxTuneJobs)
  bool prune = true;    // false: run every point (exhaustive)
  /// Where the cluster has device.host.range: time the best configurations (kHostRangePoints
  /// of the ranking, and the front) again with the hosts of the fastest and the slowest
  /// machines measured (device.host.scale at the range's ends).
  bool host_range = true;
  std::function<void(const std::string&)> log;  // progress lines (none when empty)
  /// A program's own strategies (cocodiff::Extensions): every point's plan finds them, and
  /// those with a search (StrategyRegistry::add_search) add their points to the built-ins'.
  std::shared_ptr<const dit::StrategyRegistry> strategies;
};

/// How many of the best configurations `tune` times again at the ends of the host range.
inline constexpr size_t kHostRangePoints = 10;

/// A lossy strategy's setting measured on the trained model (real math, its LossyProbe: V-Major's
/// threshold): the PSNR of its output against the exact run, and the share of its exchange
/// (V blocks) it sent on its tiers.
struct TuneQuality {
  std::shared_ptr<const dit::LossyProbe> probe;  // what was measured, and its words
  double threshold = 0;                          // the setting's value
  double psnr_db = 0;                            // preview image PSNR against the exact run
  double latent_psnr_db = 0;                     // final latent PSNR against the exact run
  double active_fraction = 0;  // blocks sent / blocks, after the warm-up steps, its tiers
  bool admitted = false;       // lossy (not bitwise exact) and psnr_db >= the --lossy bound
};

struct TunePoint {
  // The configuration.
  int nodes = 1, gpus_per_node = 1, gpus = 1, ranks = 1;
  std::string strategy;                // run.strategy
  int ulysses = 1, ring = 1, cfg = 1;  // parallel degrees
  int chunks = 0;                      // pipeline chunks (0: no pipelining)
  bool shard_text = false, uneven_heads = false;
  // What the strategy's search (dit/parallel/search.hpp) says of its point: the text after its
  // name in tables ("usp 4x2, tapa"), which wave runs it, whether it is its shape's baseline,
  // and its own tune.json integers (PipeFusion: pipefusion_degree).
  std::string detail;
  int wave = 2;
  bool baseline = false;
  std::vector<std::pair<std::string, std::int64_t>> report;
  std::optional<TuneQuality> lossy;       // lossy: the setting and what was measured at it
  std::vector<std::string> sets;          // the --set keys that make this point (after common ones)
  std::vector<std::string> cluster_sets;  // cluster.nodes and the GPUs per node
  // The outcome.
  // kPruned: not run, its compute alone exceeds the best found; kStopped: stopped once its
  // clock passed a configuration with no more GPUs; kNotTried: the budget ended first.
  enum class Status { kQueued, kRun, kPruned, kStopped, kNotTried, kFailed };
  Status status = Status::kQueued;
  double bound_s = 0;  // lower bound on time per image: compute alone (see the header)
  double time_s = 0;   // virtual time per image
  double compute_s = 0, exposed_s = 0;  // critical tile
  double host_wait_s = 0;    // critical tile's device waiting for its host (0 without a host)
  double max_compute_s = 0;  // busiest tile's compute
  std::vector<std::pair<std::string, double>> bytes_by_tier;
  double wall_s = 0;
  std::string error;  // kFailed: why
  /// Time per image with the fastest and the slowest hosts of the cluster's device.host.range
  /// (TuneOptions::host_range; the best configurations only).
  std::optional<std::pair<double, double>> host_range_s;
  double gpu_seconds() const { return time_s * gpus; }
  /// "tapa+v_first, pipeline 4, text sharded, uneven heads" (the features, for tables).
  std::string describe() const;
  /// "8 x 6" (nodes x GPUs per node).
  std::string shape() const;
  /// Whether this is its shape's baseline (flat Ulysses, no CFG split, no features): always
  /// timed to the end, never pruned or stopped, so that every point has its vs_flat.
  bool is_baseline() const;
};

struct TuneResult {
  std::string model, cluster;
  int height = 0, width = 0, steps = 0;
  double serial_compute_s = 0;  // one tile's compute for the whole image: the bound's base
  std::vector<TunePoint> points;
  std::vector<TuneQuality> quality;  // --lossy: thresholds measured on the trained model
  std::string quality_source;        // the config they were measured with
  int infeasible = 0;                // points the config cannot run (ConfigError), not counted
  std::vector<std::string> infeasible_reasons;  // one per distinct reason
  double wall_s = 0;
  bool budget_hit = false;      // the budget stopped the search
  bool bound_broken = false;    // a run's compute fell below its bound: pruning turned off
  std::vector<size_t> ranking;  // run points, best first by the objective
  std::vector<size_t> pareto;   // run points on the front of time vs GPUs, GPUs ascending
  /// device.host.scale at the ends of the cluster's device.host.range (0: no range timed), and
  /// the best by the objective among the points timed there (TunePoint::host_range_s).
  double host_low = 0, host_high = 0;
  std::optional<size_t> best_at_low, best_at_high;
  int count(TunePoint::Status s) const;
  /// The flat point (no features, text replicated) of p's nodes and GPUs, if it ran.
  const TunePoint* flat_of(const TunePoint& p) const;
};

/// Searches (blocking). ConfigError (exit 2) for a config that cannot be read, when no point
/// fits the cluster, when --lossy admits no threshold, or when the budget ends before one run.
TuneResult tune(const TuneOptions& options);

/// The `cocodiff run` command line that reproduces point p's time (arguments shell-quoted).
std::string run_command(const TuneOptions& options, const TunePoint& p);

/// The ranked table (the first `rows` entries), then the Pareto front, the counts and what was
/// not tried, as printed by `cocodiff tune`.
std::string tune_table(const TuneOptions& options, const TuneResult& result, size_t rows = 15);

/// tune.json: the options, every point (configuration, outcome, command), the ranking, the
/// front and the quality table.
nlohmann::ordered_json tune_json(const TuneOptions& options, const TuneResult& result);

/// Draws the front (and every point run) as a PNG, time per image against GPUs, with gnuplot,
/// written atomically. Returns why no PNG was written, or an empty string.
std::string write_pareto_png(const TuneResult& result, const std::filesystem::path& png);

}  // namespace cocodiff::apps
