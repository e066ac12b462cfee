#include "tune/tune.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "dit/model_family.hpp"
#include "dit/parallel/strategies.hpp"
#include "emulator/timeline_plot.hpp"
#include "runner/compare.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string list_of(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// Thrown by a run's step hook to stop it at the start of a step: the search's budget is spent,
// or the run's clock has passed a configuration with no more GPUs (it cannot win).
constexpr const char* kBudgetSpent = "tune: stopped: the budget is spent";
constexpr const char* kDominated = "tune: stopped: slower than a configuration with no more GPUs";
class Stop : public Error {
 public:
  explicit Stop(const char* why) : Error(why) {}
};

// Why a run stopped: kBudgetSpent, kDominated, or empty for any other error.
std::string stop_reason(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    const std::string what = x.what();  // a rank's error names the rank first
    for (const char* why : {kBudgetSpent, kDominated})
      if (what.find(why) != std::string::npos) return why;
  }
  return {};
}

// What the config resolves to before the search changes anything: the model, the image, the
// cluster's levels and its NIC of each local rank.
struct Base {
  RunPlan plan;
  std::vector<int> inner;              // sizes of the levels below the GPU level
  int preset_gpus = 1;                 // GPUs per node of the cluster
  int tiles_per_gpu = 1;               // ranks per GPU
  std::vector<std::int64_t> rank_nic;  // the cluster's NIC per local rank (may be empty)
  bool cfg_capable = false;            // the model has an unconditional pass
  bool has_text = false;
  bool raw_shard_text = false;  // the config itself sets parallel.shard_text = true
};

Base resolve_base(const TuneOptions& o) {
  std::vector<std::string> sets = o.sets;
  for (const char* s : {"run.math=skip", "run.strategy=flat", "ulysses.uneven_heads=true",
                        "parallel.cfg_degree=1", "parallel.shard_text=false"})
    sets.emplace_back(s);
  Base b;
  b.plan = resolve_run_plan(o.config, sets, o.strategies);
  const Topology& t = b.plan.cluster.topology;
  const int levels = t.num_levels();  // the last one is the node
  if (levels >= 2) {
    b.preset_gpus = t.level(levels - 2).size;
    for (int k = 0; k + 2 < levels; ++k) {
      b.inner.push_back(t.level(k).size);
      b.tiles_per_gpu *= t.level(k).size;
    }
  }
  // The NIC of each local rank, as the config resolves it (validate --dump's values).
  const Config eff = Config::parse(b.plan.cfg.dump_effective(), "effective config");
  if (eff.has("cluster.nic.rank_nic")) b.rank_nic = eff.get_int_list("cluster.nic.rank_nic", {});
  const dit::ModelConfig& m = b.plan.model;
  const double scale = b.plan.settings.cfg_scale >= 0 ? b.plan.settings.cfg_scale : m.cfg_scale;
  b.cfg_capable = m.cfg_mode != dit::CfgMode::kNone && scale != 1.0;
  b.has_text = dit::model_family(m.family).text_conditioned &&
               dit::model_family(m.family).joint_text && m.text_tokens > 0;
  Config raw = Config::load(o.config);
  for (const std::string& s : o.sets) raw.set(s);
  b.raw_shard_text = raw.get_bool("parallel.shard_text", false);
  return b;
}

// The keys every point of a cluster shape shares: node count and GPUs per node.
std::vector<std::string> cluster_sets(const Base& b, int nodes, int gpus) {
  std::vector<std::string> s = {"cluster.nodes=" + std::to_string(nodes)};
  if (gpus != b.preset_gpus) {
    std::vector<std::int64_t> sizes(b.inner.begin(), b.inner.end());
    sizes.push_back(gpus);
    s.push_back("cluster.topology.sizes=" + list_of(sizes));
    if (!b.rank_nic.empty()) {
      const size_t n = static_cast<size_t>(b.tiles_per_gpu) * static_cast<size_t>(gpus);
      s.push_back("cluster.nic.rank_nic=" +
                  list_of(std::vector<std::int64_t>(b.rank_nic.begin(),
                                                    b.rank_nic.begin() + static_cast<long>(n))));
    }
  }
  return s;
}

// The sets every run of the search starts from, after the user's.
std::vector<std::string> common_sets() {
  return {"run.math=skip", "emulator.replay=true", "emulator.trace=false"};
}

/// The sets that run point `p`: its strategy and degrees, the strategy's own keys, then the
/// features every strategy shares (uneven heads, text sharding).
void add_point_sets(const Base& b, TunePoint& p, std::vector<std::string> own) {
  p.sets = {"run.strategy=" + p.strategy, "parallel.ulysses_degree=" + std::to_string(p.ulysses),
            "parallel.ring_degree=" + std::to_string(p.ring)};
  if (p.cfg > 1) p.sets.push_back("parallel.cfg_degree=" + std::to_string(p.cfg));
  for (std::string& s : own) p.sets.push_back(std::move(s));
  if (p.uneven_heads) p.sets.push_back("ulysses.uneven_heads=true");
  if (p.shard_text || b.raw_shard_text)
    p.sets.push_back(std::string("parallel.shard_text=") + (p.shard_text ? "true" : "false"));
}

// Every point of one shape (nodes x GPUs per node): what each strategy's search offers
// (dit/parallel/search.hpp), in the order of the strategy table.
std::vector<TunePoint> shape_points(const Base& b, const std::vector<TuneQuality>& lossy, int nodes,
                                    int gpus) {
  dit::SearchShape shape;
  shape.model = &b.plan.model;
  shape.settings = &b.plan.settings;
  shape.ranks = nodes * gpus * b.tiles_per_gpu;
  shape.nodes = nodes;
  shape.levels = b.inner;
  shape.levels.push_back(gpus);
  shape.levels.push_back(nodes);
  shape.cfg_capable = b.cfg_capable;
  shape.has_text = b.has_text;
  for (const TuneQuality& q : lossy)
    shape.lossy.push_back({q.probe->key, q.threshold, q.active_fraction});
  const std::vector<std::string> cluster = cluster_sets(b, nodes, gpus);
  std::vector<TunePoint> out;
  for (const dit::NamedSearch& search : dit::strategy_searches(b.plan.settings.strategies.get()))
    search.search(shape, [&](dit::SearchPoint sp) {
      TunePoint p;
      p.nodes = nodes;
      p.gpus_per_node = gpus;
      p.gpus = nodes * gpus;
      p.ranks = shape.ranks;
      p.cluster_sets = cluster;
      p.strategy = std::move(sp.strategy);
      p.ulysses = sp.ulysses;
      p.ring = sp.ring;
      p.cfg = sp.cfg;
      p.chunks = sp.chunks;
      p.shard_text = sp.shard_text;
      p.uneven_heads = sp.uneven_heads;
      p.detail = std::move(sp.detail);
      p.wave = sp.wave;
      p.baseline = sp.baseline;
      p.report = std::move(sp.report);
      if (sp.lossy >= 0) p.lossy = lossy.at(static_cast<size_t>(sp.lossy));
      add_point_sets(b, p, std::move(sp.sets));
      out.push_back(std::move(p));
    });
  return out;
}

// One probe's levels on the trained model (configs/quickstart.toml, real math): PSNR against
// the run at its exact value and the share of the exchange each level sent.
void measure_probe(const TuneOptions& o, double bound_db, const std::filesystem::path& cfg,
                   const std::string& source, const dit::LossyProbe& probe,
                   std::vector<TuneQuality>& out) {
  auto plan_for = [&](double value) {
    std::vector<std::string> sets = o.quality_sets;
    for (const std::string& s :
         {std::string("run.math=real"), "run.strategy=" + probe.strategy,
          std::string("emulator.trace=false"), probe.key + "=" + fmt("%g", value)})
      sets.push_back(s);
    return resolve_run_plan(cfg, sets, o.strategies);
  };
  if (o.log)
    o.log("tune: measuring " + probe.name + " " + probe.setting + "s on the trained model (" +
          source + ")");
  const auto shared = std::make_shared<const dit::LossyProbe>(probe);
  const RunRecord exact = run_emulated(plan_for(probe.exact));
  const std::string exact_label = "exact (" + probe.setting + " " + fmt("%g", probe.exact) + ")";
  for (double t : probe.levels) {
    const RunRecord r = run_emulated(plan_for(t));
    const nlohmann::ordered_json q = quality_json(exact, r, exact_label);
    TuneQuality tq;
    tq.probe = shared;
    tq.threshold = t;
    auto db = [](const nlohmann::ordered_json& v) {
      return v.is_string() ? INFINITY : v.get<double>();
    };
    tq.psnr_db = db(q["preview_psnr_db"]);
    tq.latent_psnr_db = db(q["latent_psnr_db"]);
    tq.active_fraction = probe.sent_fraction ? probe.sent_fraction(r.strategy_stats) : 1.0;
    // A level that changes nothing on the trained model (bitwise its exact output) sends
    // everything there: it is not a lossy choice.
    tq.admitted = std::isfinite(tq.psnr_db) && tq.psnr_db >= bound_db;
    if (o.log)
      o.log("tune:   " + probe.setting + " " + fmt("%g", t) + ": preview PSNR " +
            fmt("%.2f", tq.psnr_db) + " dB, " + probe.sent + " sent " +
            fmt("%.3f", tq.active_fraction) + (tq.admitted ? " (admitted)" : ""));
    out.push_back(tq);
  }
}

// Every lossy strategy's probe (dit/parallel/search.hpp: V-Major's thresholds) on the trained
// model.
std::vector<TuneQuality> measure_quality(const TuneOptions& o, double bound_db,
                                         std::string& source) {
  const std::filesystem::path cfg =
      o.quality_config.empty() ? config_dir() / "quickstart.toml" : o.quality_config;
  source = cfg.string();
  for (const std::string& s : o.quality_sets) source += " --set " + s;
  std::vector<TuneQuality> out;
  for (const dit::LossyProbe& probe : dit::strategy_lossy_probes(o.strategies.get()))
    measure_probe(o, bound_db, cfg, source, probe, out);
  return out;
}

// The sets of a run of point p (user's, common, shape's, point's).
std::vector<std::string> sets_of(const TuneOptions& o, const TunePoint& p) {
  std::vector<std::string> s = o.sets;
  for (const std::string& c : common_sets()) s.push_back(c);
  s.insert(s.end(), p.cluster_sets.begin(), p.cluster_sets.end());
  s.insert(s.end(), p.sets.begin(), p.sets.end());
  return s;
}

// Runs a plan to its report; `check` (its clock) may stop it at the start of a step by throwing.
RunRecord run_checked(RunPlan plan, std::function<void(SimTime)> check) {
  plan.progress = false;
  plan.on_step_clock = [check = std::move(check)](int, int, SimTime now) { check(now); };
  return run_emulated(plan);
}

// The hosts of the machines measured differ (device.host.range): the best configurations
// (kHostRangePoints of the ranking, and the front) run again with the fastest and the slowest
// host, `jobs` side by side. A run the budget leaves out leaves its point without a range.
template <class OverBudget>
void time_host_range(const TuneOptions& o, const Base& base, TuneResult& r, int jobs,
                     const OverBudget& over_budget) {
  const HostParams& host = base.plan.cluster.device_params.host;
  if (!host.has_range() || !host.any() || r.ranking.empty()) return;
  // The scales are the config's own host (device.host.scale) taken to the range's ends.
  r.host_low = std::clamp(host.scale * host.range_low, 0.1, 10.0);
  r.host_high = std::clamp(host.scale * host.range_high, 0.1, 10.0);
  std::vector<size_t> redo(
      r.ranking.begin(),
      r.ranking.begin() + static_cast<long>(std::min(kHostRangePoints, r.ranking.size())));
  for (size_t i : r.pareto)
    if (std::find(redo.begin(), redo.end(), i) == redo.end()) redo.push_back(i);
  std::vector<double> times(2 * redo.size(), NAN);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next++) < times.size();) {
      if (over_budget()) continue;
      std::vector<std::string> sets = sets_of(o, r.points[redo[k / 2]]);
      sets.push_back("cluster.device.host.scale=" +
                     fmt("%.17g", k % 2 == 0 ? r.host_low : r.host_high));
      try {
        const RunRecord rec =
            run_checked(resolve_run_plan(o.config, sets, o.strategies), [](SimTime) {});
        times[k] = rec.report["virtual_time_s"].get<double>() /
                   std::max(1, rec.report.value("batch_size", 1));
      } catch (const std::exception&) {
        // Left without a range: the point ran at the cluster's own host.
      }
    }
  };
  run_side_by_side(std::min<int>(jobs, static_cast<int>(times.size())), work);
  const bool latency = o.objective == "latency";
  double best_low = INFINITY, best_high = INFINITY;
  for (size_t k = 0; k < redo.size(); ++k) {
    const double lo = times[2 * k], hi = times[2 * k + 1];
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    TunePoint& p = r.points[redo[k]];
    p.host_range_s = std::make_pair(lo, hi);
    const double weight = latency ? 1.0 : p.gpus;
    if (lo * weight < best_low) best_low = lo * weight, r.best_at_low = redo[k];
    if (hi * weight < best_high) best_high = hi * weight, r.best_at_high = redo[k];
  }
}

// "0.1150-0.1722", or "-" for a point not timed with the other hosts.
std::string host_span(const TunePoint& p) {
  if (!p.host_range_s) return "-";
  return fmt("%.4f", p.host_range_s->first) + "-" + fmt("%.4f", p.host_range_s->second);
}

// Whether the best configuration is the same with the fastest and the slowest hosts measured.
std::string host_range_note(const TuneResult& r) {
  auto name = [&](const std::optional<size_t>& i) {
    return i ? r.points[*i].shape() + " " + r.points[*i].describe() : std::string("none");
  };
  size_t timed = 0;
  for (const TunePoint& p : r.points) timed += p.host_range_s.has_value();
  std::string s =
      "Hosts: the machines measured differ (device.host.range); timed with the fastest "
      "and the slowest of their hosts (device.host.scale " +
      fmt("%.2f", r.host_low) + " and " + fmt("%.2f", r.host_high) + "), ";
  if (!r.best_at_low || !r.best_at_high) return s + "no configuration finished within the budget.";
  s += std::to_string(timed) + " configurations (the ten best and the front) rank ";
  const size_t first = r.ranking.front();
  if (*r.best_at_low == first && *r.best_at_high == first)
    return s + name(r.best_at_low) + " first with both: the recommendation holds on any of them.";
  return s + name(r.best_at_low) + " first with the fastest host and " + name(r.best_at_high) +
         " with the slowest: which is best depends on the machine's host.";
}

std::string status_name(TunePoint::Status s) {
  switch (s) {
    case TunePoint::Status::kQueued:
      return "queued";
    case TunePoint::Status::kRun:
      return "run";
    case TunePoint::Status::kPruned:
      return "pruned";
    case TunePoint::Status::kStopped:
      return "stopped";
    case TunePoint::Status::kNotTried:
      return "not_tried";
    case TunePoint::Status::kFailed:
      return "failed";
  }
  return "?";
}

nlohmann::ordered_json finite_or_inf(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json("inf");
}

std::string quote(const std::string& a) {
  if (a.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.=/+:,") ==
      std::string::npos)
    return a;
  std::string q = "'";
  for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The search's end: none without a budget.
struct Deadline {
  std::optional<Clock::time_point> at;
  bool operator()() const { return at && Clock::now() >= *at; }
};

// Refuses options out of range, before anything is resolved.
void check_options(const TuneOptions& o) {
  if (o.objective != "latency" && o.objective != "gpu-seconds")
    throw ConfigError("--objective: expected latency or gpu-seconds, found \"" + o.objective +
                      "\"");
  if (o.nodes.empty()) throw ConfigError("--nodes: expected at least one node count");
  for (int n : o.nodes)
    if (n < 1 || n > 1 << 16)
      throw ConfigError("--nodes: expected node counts from 1 to 65536, found " +
                        std::to_string(n));
  if (o.budget_s < 0) throw ConfigError("--budget-s: expected seconds >= 0");
  if (o.lossy_psnr_db && !(*o.lossy_psnr_db > 0))
    throw ConfigError("--lossy: expected a PSNR bound in dB above 0, found " +
                      fmt("%g", *o.lossy_psnr_db));
}

// The GPU counts per node to search: --gpus-per-node, or 1 to the node's GPUs.
std::vector<int> gpu_counts(const TuneOptions& o, const Base& base, const std::string& cluster) {
  std::vector<int> gpus = o.gpus_per_node;
  if (gpus.empty())
    for (int g = 1; g <= base.preset_gpus; ++g) gpus.push_back(g);
  for (int g : gpus)
    if (g < 1 || g > base.preset_gpus)
      throw ConfigError("--gpus-per-node: expected counts from 1 to the " +
                        std::to_string(base.preset_gpus) + " GPUs of a " + cluster +
                        " node, found " + std::to_string(g));
  return gpus;
}

// The probe of the settings measured: its words name them in tables (the first's; placeholders
// when none was measured).
const dit::LossyProbe& measured_probe(const std::vector<TuneQuality>& qs) {
  static const dit::LossyProbe none = [] {
    dit::LossyProbe p;
    p.setting = "setting";
    p.sent = "the exchange";
    return p;
  }();
  return qs.empty() ? none : *qs.front().probe;
}

// "V-Major threshold": what a measured setting is called.
std::string setting_words(const dit::LossyProbe& p) { return p.name + " " + p.setting; }

// The settings measured, as one phrase: "V-Major threshold" (or several joined by "or").
std::string settings_phrase(const std::vector<TuneQuality>& qs) {
  std::vector<std::string> seen;
  for (const TuneQuality& q : qs)
    if (std::find(seen.begin(), seen.end(), setting_words(*q.probe)) == seen.end())
      seen.push_back(setting_words(*q.probe));
  std::string s;
  for (const std::string& w : seen) s += (s.empty() ? "" : " or ") + w;
  return s.empty() ? std::string("lossy setting") : s;
}

// Lossy: which settings of the lossy strategies (V-Major's thresholds) keep the asked PSNR on
// the trained model.
std::vector<TuneQuality> admitted_qualities(const TuneOptions& o, TuneResult& r) {
  std::vector<TuneQuality> admitted;
  if (!o.lossy_psnr_db) return admitted;
  r.quality = measure_quality(o, *o.lossy_psnr_db, r.quality_source);
  for (const TuneQuality& q : r.quality)
    if (q.admitted) admitted.push_back(q);
  if (admitted.empty()) {
    std::string seen;
    for (const TuneQuality& q : r.quality)
      seen += (seen.empty() ? "" : ", ") + fmt("%g", q.threshold) + ": " +
              (std::isfinite(q.psnr_db) ? fmt("%.2f dB", q.psnr_db) : std::string("exact"));
    throw ConfigError(
        "--lossy " + fmt("%g", *o.lossy_psnr_db) + ": no " + settings_phrase(r.quality) +
        " keeps that PSNR on the trained model and changes its output (preview "
        "PSNR by " +
        measured_probe(r.quality).setting + ": " + seen + "; measured with " + r.quality_source +
        "); ask for a lower bound, or search exact strategies without --lossy");
  }
  return admitted;
}

// Every point of every shape that the config can run; the others are counted by reason.
void enumerate_points(const TuneOptions& o, const Base& base,
                      const std::vector<TuneQuality>& admitted, const std::vector<int>& gpus,
                      TuneResult& r) {
  std::map<std::string, int> reasons;
  for (int n : o.nodes)
    for (int g : gpus)
      for (TunePoint& p : shape_points(base, admitted, n, g)) {
        try {
          resolve_run_plan(o.config, sets_of(o, p), o.strategies);
          r.points.push_back(std::move(p));
        } catch (const UserError& e) {
          ++r.infeasible;
          ++reasons[e.what()];
        }
      }
  for (const auto& [why, n] : reasons)
    r.infeasible_reasons.push_back(why + (n > 1 ? " (" + std::to_string(n) + " points)" : ""));
  if (r.points.empty()) {
    std::string why =
        r.infeasible_reasons.empty() ? "no configuration to search" : r.infeasible_reasons.front();
    throw ConfigError("tune: no point fits the cluster (" + std::to_string(r.infeasible) +
                      " configurations of " + r.model + " on " + r.cluster + " refused: " + why +
                      ")");
  }
}

// The bound's base: the whole image on one tile (serial).
TunePoint serial_point(const Base& base) {
  TunePoint serial;
  serial.cluster_sets = {"cluster.nodes=1"};
  if (base.plan.cluster.topology.num_levels() >= 2) {
    std::vector<std::int64_t> ones(base.inner.size() + 1, 1);
    serial.cluster_sets.push_back("cluster.topology.sizes=" + list_of(ones));
    if (!base.rank_nic.empty())
      serial.cluster_sets.push_back("cluster.nic.rank_nic=" + list_of({base.rank_nic[0]}));
  }
  serial.sets = {"run.strategy=serial", "parallel.ulysses_degree=1", "parallel.ring_degree=1",
                 "parallel.cfg_degree=1", "parallel.shard_text=false"};
  return serial;
}

// Times the serial point and gives every point its bound: serial compute over its ranks.
void time_bound(const TuneOptions& o, const Base& base, TuneResult& r, Clock::time_point t0,
                const Deadline& over_budget) {
  const TunePoint serial = serial_point(base);
  if (o.log)
    o.log("tune: " + std::to_string(r.points.size()) + " configurations of " + r.model + " on " +
          r.cluster + " (" + fmt("%.1f", since(t0)) +
          " s); timing the image on one tile for the pruning bound");
  try {
    const RunRecord rec =
        run_checked(resolve_run_plan(o.config, sets_of(o, serial), o.strategies), [&](SimTime) {
          if (over_budget()) throw Stop(kBudgetSpent);
        });
    r.serial_compute_s =
        rec.report["breakdown"]["compute_s"].get<double>() / std::max(1, base.plan.batch_size);
  } catch (...) {
    if (stop_reason(std::current_exception()) == kBudgetSpent)
      throw ConfigError("--budget-s " + fmt("%g", o.budget_s) +
                        ": too small for one run (the image on one tile, the search's first run, "
                        "was not done after " +
                        fmt("%.1f", since(t0)) + " s); nothing was written");
    throw;
  }
  for (TunePoint& p : r.points) p.bound_s = r.serial_compute_s / p.ranks;
}

// Order: the fewest GPUs first (a point is pruned or stopped by the points with no more GPUs,
// which have then run), within a GPU count the likely fast first (the wave each strategy's
// search gives its points: a low bar early prunes and stops more); then enumeration order.
std::vector<size_t> search_order(const TuneResult& r) {
  std::vector<size_t> order(r.points.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const TunePoint &pa = r.points[a], &pb = r.points[b];
    if (pa.gpus != pb.gpus) return pa.gpus < pb.gpus;
    return pa.wave < pb.wave;
  });
  return order;
}

// The objective of a point that ran in time_s per image.
double objective_of(bool latency, const TunePoint& p, double time_s) {
  return latency ? time_s : time_s * p.gpus;
}

// The search's shared state: its workers take points in order under `mu`, run them side by
// side, and record what each did.
struct Search {
  Search(const TuneOptions& opts, TuneResult& result, Clock::time_point start, Deadline end)
      : o(opts),
        r(result),
        t0(start),
        over_budget(end),
        latency(opts.objective == "latency"),
        order(search_order(result)),
        prune(opts.prune) {}

  const TuneOptions& o;
  TuneResult& r;
  Clock::time_point t0;
  Deadline over_budget;
  bool latency;
  std::vector<size_t> order;
  std::mutex mu;
  size_t next = 0;
  double best = INFINITY;              // the best objective run so far
  std::map<int, double> best_by_gpus;  // the best time per image run so far, by GPU count
  bool prune;
  std::vector<size_t> pruned;
  int done = 0, stopped = 0;
  Clock::time_point last_log = Clock::now();
  std::string best_label;

  // What a worker does next: stop, pass over a point it marked, or run a point.
  enum class Take { kEnd, kSkip, kRun };

  // The time a point must beat to be on the front: the best of the points with no more GPUs.
  double bar_for(int gpus) const {
    double bar = INFINITY;
    for (const auto& [g, t] : best_by_gpus) {
      if (g > gpus) break;
      bar = std::min(bar, t);
    }
    return bar;
  }

  // Takes the next point in order into i; one over the budget or pruned is marked, not run.
  Take take(size_t& i) {
    std::lock_guard<std::mutex> lk(mu);
    if (next >= order.size()) return Take::kEnd;
    i = order[next++];
    TunePoint& p = r.points[i];
    if (over_budget()) {
      p.status = TunePoint::Status::kNotTried;
      r.budget_hit = true;
      return Take::kSkip;
    }
    // Pruned: a point whose bound is beaten by a point with no more GPUs is on no front
    // and wins neither objective. A shape's baseline always runs.
    if (prune && !p.is_baseline() && p.bound_s > bar_for(p.gpus)) {
      p.status = TunePoint::Status::kPruned;
      pruned.push_back(i);
      return Take::kSkip;
    }
    return Take::kRun;
  }

  // Runs a point to its record, or to the error that ended it.
  std::exception_ptr run_point(const TunePoint& p, std::optional<RunRecord>& rec) {
    try {
      RunPlan plan = resolve_run_plan(o.config, sets_of(o, p), o.strategies);
      const double images = std::max(1, plan.batch_size);
      const int gpus = p.gpus;
      const bool baseline = p.is_baseline();
      // A run stops at a step start once over the budget, or once a tile's clock has passed
      // the best time of a configuration with no more GPUs: its time can only grow, so it
      // is dominated and wins neither objective.
      rec = run_checked(std::move(plan), [&, images, gpus, baseline](SimTime now) {
        if (over_budget()) throw Stop(kBudgetSpent);
        if (!o.prune || baseline) return;
        std::lock_guard<std::mutex> lk(mu);
        if (prune && now.seconds() > bar_for(gpus) * images) throw Stop(kDominated);
      });
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  // Records why a run ended early: the budget, dominated, or failed with its error.
  void record_error(TunePoint& p, const std::exception_ptr& err) {
    const std::string why = stop_reason(err);
    if (why == kBudgetSpent) {
      p.status = TunePoint::Status::kNotTried;
      r.budget_hit = true;
    } else if (why == kDominated) {
      p.status = TunePoint::Status::kStopped;
      ++stopped;
    } else {
      p.status = TunePoint::Status::kFailed;
      try {
        std::rethrow_exception(err);
      } catch (const std::exception& e) {
        p.error = e.what();
      }
    }
  }

  // Records a run's times and bytes per image from its report.
  static void record_times(TunePoint& p, const RunRecord& rec) {
    const nlohmann::ordered_json& rep = rec.report;
    const double images = std::max(1, rep.value("batch_size", 1));
    p.status = TunePoint::Status::kRun;
    p.time_s = rep["virtual_time_s"].get<double>() / images;
    p.compute_s = rep["breakdown"]["compute_s"].get<double>() / images;
    p.exposed_s = rep["breakdown"]["exposed_comm_s"].get<double>() / images;
    p.host_wait_s = rep["breakdown"].value("host_wait_s", 0.0) / images;
    for (const SimTime& c : rec.emulated->rank_compute)
      p.max_compute_s = std::max(p.max_compute_s, c.seconds() / images);
    for (const auto& [tier, bytes] : rep["bytes_by_tier"].items())
      p.bytes_by_tier.emplace_back(tier, bytes.get<double>() / images);
  }

  // The bound must hold on every point run; one that breaks it ends pruning and stopping, and
  // the points pruned or stopped so far go back in the queue.
  void check_bound(const TunePoint& p) {
    if (!(p.max_compute_s < p.bound_s * (1 - 1e-9) && !r.bound_broken)) return;
    r.bound_broken = true;
    prune = false;
    for (size_t j = 0; j < r.points.size(); ++j)
      if (r.points[j].status == TunePoint::Status::kPruned ||
          r.points[j].status == TunePoint::Status::kStopped) {
        r.points[j].status = TunePoint::Status::kQueued;
        order.push_back(j);
      }
    pruned.clear();
    stopped = 0;
    if (o.log)
      o.log("tune: warning: " + p.shape() + " " + p.describe() + " computed " +
            fmt("%.6f", p.max_compute_s) + " s, below its bound " + fmt("%.6f", p.bound_s) +
            " s: pruning is off");
  }

  // Records a point that ran: its times, the bound's check, the bests and the progress line.
  void record_run(TunePoint& p, const RunRecord& rec) {
    record_times(p, rec);
    ++done;
    check_bound(p);
    double& bg = best_by_gpus.try_emplace(p.gpus, INFINITY).first->second;
    bg = std::min(bg, p.time_s);
    const double obj = objective_of(latency, p, p.time_s);
    if (obj < best) {
      best = obj;
      best_label = p.shape() + " " + p.describe();
    }
    if (o.log && (since(last_log) >= 5.0 || next >= order.size())) {
      last_log = Clock::now();
      o.log("tune: " + std::to_string(next) + "/" + std::to_string(order.size()) +
            " considered: " + std::to_string(done) + " run, " + std::to_string(pruned.size()) +
            " pruned, " + std::to_string(stopped) + " stopped; best " + fmt("%.4f", best) +
            (latency ? " s " : " GPU-s ") + best_label + " (" + fmt("%.0f", since(t0)) + " s)");
    }
  }

  // One worker: takes points until none is left, runs each and records it.
  void work() {
    for (;;) {
      size_t i = 0;
      const Take t = take(i);
      if (t == Take::kEnd) return;
      if (t == Take::kSkip) continue;
      TunePoint& p = r.points[i];
      const Clock::time_point ts = Clock::now();
      std::optional<RunRecord> rec;
      const std::exception_ptr err = run_point(p, rec);
      std::lock_guard<std::mutex> lk(mu);
      p.wall_s = since(ts);
      if (err)
        record_error(p, err);
      else
        record_run(p, *rec);
    }
  }
};

// Refuses a search in which no point ran: the budget was too small, or every run failed.
void check_some_ran(const TuneOptions& o, const TuneResult& r) {
  if (r.count(TunePoint::Status::kRun) != 0) return;
  if (r.budget_hit)
    throw ConfigError("--budget-s " + fmt("%g", o.budget_s) +
                      ": too small for one run (no configuration finished within it); nothing "
                      "was written");
  std::string why;
  for (const TunePoint& p : r.points)
    if (p.status == TunePoint::Status::kFailed) {
      why = p.error;
      break;
    }
  throw ConfigError("tune: no configuration ran (" + why + ")");
}

// Ranking by the objective (ties: fewer GPUs, then enumeration order), and the front.
void rank_and_front(bool latency, TuneResult& r) {
  for (size_t i = 0; i < r.points.size(); ++i)
    if (r.points[i].status == TunePoint::Status::kRun) r.ranking.push_back(i);
  std::stable_sort(r.ranking.begin(), r.ranking.end(), [&](size_t a, size_t b) {
    const TunePoint &pa = r.points[a], &pb = r.points[b];
    const double oa = objective_of(latency, pa, pa.time_s);
    const double ob = objective_of(latency, pb, pb.time_s);
    if (oa != ob) return oa < ob;
    return pa.gpus < pb.gpus;
  });
  std::vector<size_t> by_gpus = r.ranking;
  std::stable_sort(by_gpus.begin(), by_gpus.end(), [&](size_t a, size_t b) {
    const TunePoint &pa = r.points[a], &pb = r.points[b];
    if (pa.gpus != pb.gpus) return pa.gpus < pb.gpus;
    return pa.time_s < pb.time_s;
  });
  double front_time = INFINITY;
  for (size_t i : by_gpus)
    if (r.points[i].time_s < front_time) {
      front_time = r.points[i].time_s;
      r.pareto.push_back(i);
    }
}

}  // namespace

std::string TunePoint::describe() const {
  std::string s = strategy + detail;
  if (chunks > 0) s += ", " + std::to_string(chunks) + " chunks";
  if (cfg > 1) s += ", cfg 2";
  if (shard_text) s += ", text sharded";
  if (uneven_heads) s += ", uneven heads";
  if (lossy) s += ", " + lossy->probe->name + " " + fmt("%g", lossy->threshold);
  return s;
}

std::string TunePoint::shape() const {
  return std::to_string(nodes) + " x " + std::to_string(gpus_per_node);
}

int TuneResult::count(TunePoint::Status s) const {
  return static_cast<int>(std::count_if(points.begin(), points.end(),
                                        [&](const TunePoint& p) { return p.status == s; }));
}

bool TunePoint::is_baseline() const { return baseline; }

const TunePoint* TuneResult::flat_of(const TunePoint& p) const {
  for (const TunePoint& q : points)
    if (q.status == TunePoint::Status::kRun && q.nodes == p.nodes &&
        q.gpus_per_node == p.gpus_per_node && q.is_baseline())
      return &q;
  return nullptr;
}

TuneResult tune(const TuneOptions& o) {
  const Clock::time_point t0 = Clock::now();
  check_options(o);
  Deadline over_budget;
  if (o.budget_s > 0)
    over_budget.at =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.budget_s));

  const Base base = resolve_base(o);
  TuneResult r;
  r.model = base.plan.model.name;
  r.cluster = base.plan.cluster.name;
  r.height = base.plan.settings.pixel_height();
  r.width = base.plan.settings.pixel_width();
  r.steps = base.plan.settings.steps;
  const std::vector<int> gpus = gpu_counts(o, base, r.cluster);
  const std::vector<TuneQuality> admitted = admitted_qualities(o, r);
  enumerate_points(o, base, admitted, gpus, r);
  time_bound(o, base, r, t0, over_budget);

  Search s(o, r, t0, over_budget);
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  // No more runs side by side than there are points, nor than kMaxTuneJobs: any --jobs works.
  const int jobs =
      std::clamp(o.jobs > 0 ? o.jobs : cores, 1,
                 std::max(1, std::min<int>(kMaxTuneJobs, static_cast<int>(s.order.size()))));
  run_side_by_side(jobs, [&s] { s.work(); });
  check_some_ran(o, r);
  rank_and_front(s.latency, r);
  if (o.host_range) time_host_range(o, base, r, jobs, over_budget);
  r.wall_s = since(t0);
  return r;
}

std::string run_command(const TuneOptions& o, const TunePoint& p) {
  std::string c = "cocodiff run " + quote(o.config.string());
  for (const std::string& s : o.sets) c += " --set " + quote(s);
  c += " --set run.math=skip --set emulator.trace=false";  // as the search ran it
  for (const std::string& s : p.cluster_sets) c += " --set " + quote(s);
  for (const std::string& s : p.sets) c += " --set " + quote(s);
  return c;
}

namespace {

// A table line's buffer: wide enough for a row of every tier.
constexpr size_t kLineSize = 640;

// The table's column headings: the host range's where it was timed, then one per tier of the
// best point.
void table_heading(std::ostringstream& os, const TuneResult& r, bool hosts) {
  char line[kLineSize];
  std::vector<std::string> tiers;
  if (!r.ranking.empty())
    for (const auto& [tier, bytes] : r.points[r.ranking[0]].bytes_by_tier) tiers.push_back(tier);
  std::snprintf(line, sizeof line, "%4s %-7s %-5s %-46s %10s", "rank", "nodes", "gpus",
                "configuration", "s/image");
  os << line;
  if (hosts) {
    std::snprintf(line, sizeof line, " %15s", "hosts_s");
    os << line;
  }
  std::snprintf(line, sizeof line, " %8s %10s %10s", "vs_flat", "GPU-s/img", "exposed_s");
  os << line;
  for (const std::string& t : tiers) {
    std::snprintf(line, sizeof line, " %13s", (t + "_GB").c_str());
    os << line;
  }
  os << "\n";
}

// The ranked rows, `rows` at most, and the legend under them.
void table_rows(std::ostringstream& os, const TuneResult& r, size_t rows, bool hosts) {
  char line[kLineSize];
  for (size_t k = 0; k < std::min(rows, r.ranking.size()); ++k) {
    const TunePoint& p = r.points[r.ranking[k]];
    const TunePoint* flat = r.flat_of(p);
    const std::string vs = flat ? fmt("%.2fx", flat->time_s / p.time_s) : "-";
    std::snprintf(line, sizeof line, "%4zu %-7s %-5d %-46s %10.4f", k + 1, p.shape().c_str(),
                  p.gpus, p.describe().c_str(), p.time_s);
    os << line;
    if (hosts) {
      std::snprintf(line, sizeof line, " %15s", host_span(p).c_str());
      os << line;
    }
    std::snprintf(line, sizeof line, " %8s %10.3f %10.4f", vs.c_str(), p.gpu_seconds(),
                  p.exposed_s);
    os << line;
    for (const auto& [tier, bytes] : p.bytes_by_tier) {
      std::snprintf(line, sizeof line, " %13.2f", bytes / 1e9);
      os << line;
    }
    os << "\n";
  }
  os << "(nodes x GPUs per node; vs_flat: speedup over flat Ulysses on the same GPUs; bytes by "
        "tier per image";
  if (hosts)
    os << "; hosts_s: s/image with the fastest and the slowest host of the machines measured, "
          "the best configurations only";
  os << ")\n";
}

// The Pareto front, the recommended points with their commands, and the host range's note.
void table_front(std::ostringstream& os, const TuneOptions& o, const TuneResult& r, bool hosts) {
  char line[kLineSize];
  os << "\nPareto front, time per image against GPUs:\n";
  for (size_t i : r.pareto) {
    const TunePoint& p = r.points[i];
    std::snprintf(line, sizeof line, "  %4d GPUs (%s): %.4f s  %s\n", p.gpus, p.shape().c_str(),
                  p.time_s, p.describe().c_str());
    os << line;
  }
  os << "\nRecommended:\n";
  const size_t rec = std::min<size_t>(3, r.ranking.size());
  for (size_t k = 0; k < rec; ++k) {
    const TunePoint& p = r.points[r.ranking[k]];
    os << "  " << k + 1 << ". " << p.shape() << " " << p.describe() << ": " << fmt("%.4f", p.time_s)
       << " s per image";
    if (p.host_range_s) os << " (" << host_span(p) << " s with the hosts measured)";
    os << "\n     " << run_command(o, p) << "\n";
    if (p.lossy)
      os << "     lossy: " << setting_words(*p.lossy->probe) << " " << fmt("%g", p.lossy->threshold)
         << ", admitted under --lossy " << fmt("%g", *o.lossy_psnr_db) << " dB (see below)\n";
  }
  if (hosts) os << "\n" << host_range_note(r) << "\n";
}

// The lossy thresholds measured, under --lossy.
void table_lossy(std::ostringstream& os, const TuneOptions& o, const TuneResult& r) {
  if (o.lossy_psnr_db) {
    const dit::LossyProbe& measured = measured_probe(r.quality);
    os << "\nLossy entries (--lossy " << fmt("%g", *o.lossy_psnr_db)
       << " dB): " << settings_phrase(r.quality)
       << "s measured with real math on the trained model (" << r.quality_source
       << ") against its exact run. A full-size model's phantom run computes no values, so it "
          "cannot measure quality: a lossy entry sends the share of "
       << measured.sent << " the trained model sent at its " << measured.setting
       << ", and its quality bound is the trained model's.\n";
    for (const TuneQuality& q : r.quality) {
      os << "  " << q.probe->setting << " " << fmt("%g", q.threshold) << ": preview PSNR "
         << (std::isfinite(q.psnr_db) ? fmt("%.2f dB", q.psnr_db) : std::string("inf (exact)"))
         << ", " << q.probe->sent << " sent " << fmt("%.1f%%", 100 * q.active_fraction)
         << (q.admitted ? " (admitted)" : " (not admitted)") << "\n";
    }
  }
}

// The closing counts by outcome, the refused and what the budget left out.
void table_counts(std::ostringstream& os, const TuneOptions& o, const TuneResult& r) {
  const int run = r.count(TunePoint::Status::kRun), pruned = r.count(TunePoint::Status::kPruned),
            not_tried = r.count(TunePoint::Status::kNotTried),
            stopped = r.count(TunePoint::Status::kStopped),
            failed = r.count(TunePoint::Status::kFailed);
  os << "\n"
     << r.points.size() << " configurations: " << run << " run, " << pruned
     << " pruned (compute alone, at least " << fmt("%.3f", r.serial_compute_s)
     << " s on one tile / tiles, exceeds the best time of a configuration with no more GPUs; "
        "flat Ulysses always runs, as every shape's baseline), "
     << stopped
     << " stopped (their clock passed the best time of a configuration with no more GPUs), "
     << not_tried << " not tried, " << failed << " failed; " << fmt("%.1f", r.wall_s)
     << " s wall\n";
  if (r.infeasible > 0)
    os << r.infeasible << " more configurations do not fit the config (e.g. "
       << r.infeasible_reasons.front() << ")\n";
  if (r.bound_broken) os << "warning: a run computed less than its bound; pruning was turned off\n";
  if (not_tried > 0) {
    // What the budget left out, by shape.
    std::map<std::string, int> left;
    for (const TunePoint& p : r.points)
      if (p.status == TunePoint::Status::kNotTried) ++left[p.shape()];
    os << "--budget-s " << fmt("%g", o.budget_s) << " ended the search; not tried:";
    for (const auto& [shape, n] : left) os << " " << shape << " (" << n << ")";
    os << "\n";
  }
}

// The search's options, result totals and notes: tune.json's head.
nlohmann::ordered_json json_head(const TuneOptions& o, const TuneResult& r) {
  nlohmann::ordered_json j;
  j["config"] = o.config.string();
  j["sets"] = o.sets;
  j["model"] = r.model;
  j["cluster"] = r.cluster;
  j["height"] = r.height;
  j["width"] = r.width;
  j["steps"] = r.steps;
  j["objective"] = o.objective;
  j["nodes"] = o.nodes;
  j["lossy_psnr_db"] = o.lossy_psnr_db ? nlohmann::ordered_json(*o.lossy_psnr_db) : nullptr;
  j["budget_s"] = o.budget_s;
  j["wall_s"] = r.wall_s;
  j["budget_hit"] = r.budget_hit;
  j["serial_compute_s"] = r.serial_compute_s;
  j["bound_note"] =
      "bound_s = serial_compute_s / tiles: a point's time is at least its busiest tile's compute, "
      "which is at least that share of the whole image's compute on one tile";
  j["bound_broken"] = r.bound_broken;
  j["stop_note"] =
      "stopped: a run whose tile clock passed, at a step start, the best time per image of a "
      "configuration with no more GPUs is stopped there (dominated: on neither objective's best "
      "nor the front); the front is that of the configurations run to the end";
  j["counts"] = {{"configurations", r.points.size()},
                 {"run", r.count(TunePoint::Status::kRun)},
                 {"pruned", r.count(TunePoint::Status::kPruned)},
                 {"stopped", r.count(TunePoint::Status::kStopped)},
                 {"not_tried", r.count(TunePoint::Status::kNotTried)},
                 {"failed", r.count(TunePoint::Status::kFailed)},
                 {"infeasible", r.infeasible}};
  j["infeasible_reasons"] = r.infeasible_reasons;
  return j;
}

// The lossy thresholds measured, under --lossy, into j["quality"].
void json_quality(nlohmann::ordered_json& j, const TuneResult& r) {
  nlohmann::ordered_json q = nlohmann::ordered_json::array();
  for (const TuneQuality& t : r.quality)
    q.push_back({{t.probe->setting, t.threshold},
                 {"preview_psnr_db", finite_or_inf(t.psnr_db)},
                 {"latent_psnr_db", finite_or_inf(t.latent_psnr_db)},
                 {t.probe->sent_key, t.active_fraction},
                 {"admitted", t.admitted}});
  const dit::LossyProbe& measured = measured_probe(r.quality);
  j["quality"] = {
      {"measured_with", r.quality_source},
      {"note",
       "measured with real math on the trained model against its exact run; a full-size "
       "model's phantom run computes no values and cannot measure quality. A lossy point "
       "sends the share of " +
           measured.sent + " the trained model sent at its " + measured.setting + " (" +
           measured.phantom_key + "), counted over every step"},
      {measured.setting + "s", q}};
}

// One point of tune.json: its configuration, outcome, times where it ran, and its command.
nlohmann::ordered_json point_json(const TuneOptions& o, const TuneResult& r, const TunePoint& p) {
  nlohmann::ordered_json e;
  e["nodes"] = p.nodes;
  e["gpus_per_node"] = p.gpus_per_node;
  e["gpus"] = p.gpus;
  e["ranks"] = p.ranks;
  e["strategy"] = p.strategy;
  e["configuration"] = p.describe();
  e["ulysses_degree"] = p.ulysses;
  e["ring_degree"] = p.ring;
  e["cfg_degree"] = p.cfg;
  e["pipeline_chunks"] = p.chunks;
  for (const auto& [key, value] : p.report) e[key] = value;
  e["shard_text"] = p.shard_text;
  e["uneven_heads"] = p.uneven_heads;
  if (p.lossy) {
    std::string key = p.lossy->probe->key;  // "v_major.threshold" -> "v_major_threshold"
    std::replace(key.begin(), key.end(), '.', '_');
    e["lossy"] = {{key, p.lossy->threshold},
                  {"preview_psnr_db", p.lossy->psnr_db},
                  {"psnr_bound_db", *o.lossy_psnr_db},
                  {"measured_with", r.quality_source},
                  {p.lossy->probe->sent_key, p.lossy->active_fraction}};
  }
  e["status"] = status_name(p.status);
  e["bound_s"] = p.bound_s;
  if (p.status == TunePoint::Status::kRun) {
    e["time_per_image_s"] = p.time_s;
    const TunePoint* flat = r.flat_of(p);
    e["speedup_vs_flat"] = flat ? nlohmann::ordered_json(flat->time_s / p.time_s) : nullptr;
    e["gpu_seconds_per_image"] = p.gpu_seconds();
    e["compute_s"] = p.compute_s;
    e["exposed_comm_s"] = p.exposed_s;
    e["host_wait_s"] = p.host_wait_s;
    nlohmann::ordered_json b = nlohmann::ordered_json::object();
    for (const auto& [tier, bytes] : p.bytes_by_tier) b[tier] = bytes;
    e["bytes_by_tier"] = b;
  }
  if (p.host_range_s)
    e["time_per_image_s_host_range"] = {p.host_range_s->first, p.host_range_s->second};
  if (p.status == TunePoint::Status::kRun || p.status == TunePoint::Status::kStopped)
    e["wall_s"] = p.wall_s;
  if (p.status == TunePoint::Status::kFailed) e["error"] = p.error;
  e["command"] = run_command(o, p);
  return e;
}

// The host range's scales and the best point with each end, into j["host_range"].
void json_host_range(nlohmann::ordered_json& j, const TuneResult& r) {
  auto label = [&](const std::optional<size_t>& i) {
    return i ? nlohmann::ordered_json(r.points[*i].shape() + " " + r.points[*i].describe())
             : nlohmann::ordered_json(nullptr);
  };
  j["host_range"] = {
      {"scales", {r.host_low, r.host_high}},
      {"note",
       "device.host.scale at the ends of the cluster's device.host.range: the fastest and the "
       "slowest host of the machines measured; the best configurations (time_per_image_s_host_"
       "range) were timed with both"},
      {"best_with_fastest_host", label(r.best_at_low)},
      {"best_with_slowest_host", label(r.best_at_high)}};
}

}  // namespace

std::string tune_table(const TuneOptions& o, const TuneResult& r, size_t rows) {
  std::ostringstream os;
  const bool latency = o.objective == "latency";
  os << "tune: " << r.model << " " << r.width << "x" << r.height << ", " << r.steps << " steps, on "
     << r.cluster << " (objective: " << (latency ? "time per image" : "GPU-seconds per image")
     << ")\n";
  const bool hosts = r.host_high > 0;  // the host range was timed
  table_heading(os, r, hosts);
  table_rows(os, r, rows, hosts);
  table_front(os, o, r, hosts);
  table_lossy(os, o, r);
  table_counts(os, o, r);
  return os.str();
}

nlohmann::ordered_json tune_json(const TuneOptions& o, const TuneResult& r) {
  nlohmann::ordered_json j = json_head(o, r);
  if (o.lossy_psnr_db) json_quality(j, r);
  nlohmann::ordered_json ranking = nlohmann::ordered_json::array();
  for (size_t i : r.ranking) ranking.push_back(point_json(o, r, r.points[i]));
  j["ranking"] = ranking;
  nlohmann::ordered_json front = nlohmann::ordered_json::array();
  for (size_t i : r.pareto)
    front.push_back({{"gpus", r.points[i].gpus},
                     {"time_per_image_s", r.points[i].time_s},
                     {"nodes", r.points[i].nodes},
                     {"gpus_per_node", r.points[i].gpus_per_node},
                     {"configuration", r.points[i].describe()},
                     {"command", run_command(o, r.points[i])}});
  j["pareto"] = front;
  if (r.host_high > 0) json_host_range(j, r);
  nlohmann::ordered_json others = nlohmann::ordered_json::array();
  for (const TunePoint& p : r.points)
    if (p.status != TunePoint::Status::kRun) others.push_back(point_json(o, r, p));
  j["not_run"] = others;
  return j;
}

std::string write_pareto_png(const TuneResult& r, const std::filesystem::path& png) {
  std::ostringstream gp;
  // Every name a user can set (model, cluster) goes in as a string literal that is only data.
  gp << "set title "
     << emu::gnuplot_string(r.model + " " + std::to_string(r.width) + "x" +
                            std::to_string(r.height) + ", " + std::to_string(r.steps) +
                            " steps on " + r.cluster + ": time per image against GPUs")
     << "\n";
  gp << "set xlabel 'GPUs'\nset ylabel 'virtual time per image (s)'\n";
  gp << "set logscale xy\nset grid\nset key top right\n";
  // Axes that fit the points (a log axis's decades would squeeze them into a band), and each
  // point of the front named by its shape and configuration.
  double t_lo = INFINITY, t_hi = 0;
  int g_lo = 1 << 30, g_hi = 0;
  for (size_t i : r.ranking) {
    t_lo = std::min(t_lo, r.points[i].time_s);
    t_hi = std::max(t_hi, r.points[i].time_s);
    g_lo = std::min(g_lo, r.points[i].gpus);
    g_hi = std::max(g_hi, r.points[i].gpus);
  }
  if (t_hi > 0) {
    gp << "set yrange [" << t_lo / 1.25 << ":" << t_hi * 1.25 << "]\nset xrange [" << g_lo / 1.4
       << ":" << g_hi * 3 << "]\n";  // room on the right for the last labels
    // Tics at 1, 2 and 5 of each decade the times span, and at each power of two of GPUs.
    std::string yt, xt;
    for (double d = std::pow(10.0, std::floor(std::log10(t_lo / 1.25))); d <= t_hi * 1.25; d *= 10)
      for (const double m : {1.0, 2.0, 5.0})
        if (m * d >= t_lo / 1.25 && m * d <= t_hi * 1.25)
          yt += (yt.empty() ? "" : ", ") + fmt("%g", m * d);
    for (int g = 1; g <= g_hi * 2; g *= 2) xt += (xt.empty() ? "" : ", ") + std::to_string(g);
    if (!yt.empty()) gp << "set ytics (" << yt << ")\n";
    gp << "set xtics (" << xt << ")\n";
  }
  gp << "$labels << EOD\n";
  for (size_t i : r.pareto)
    gp << r.points[i].gpus << " " << r.points[i].time_s << " \""
       << r.points[i].shape() + ": " + r.points[i].describe() << "\"\n";
  gp << "EOD\n";
  gp << "$all << EOD\n";
  for (size_t i : r.ranking) gp << r.points[i].gpus << " " << r.points[i].time_s << "\n";
  gp << "EOD\n$front << EOD\n";
  for (size_t i : r.pareto) gp << r.points[i].gpus << " " << r.points[i].time_s << "\n";
  gp << "EOD\n$hosts << EOD\n";
  bool hosts = false;
  for (size_t i : r.ranking)
    if (const TunePoint& p = r.points[i]; p.host_range_s) {
      gp << p.gpus << " " << p.time_s << " " << p.host_range_s->first << " "
         << p.host_range_s->second << "\n";
      hosts = true;
    }
  gp << (hosts ? "" : "1 1 1 1\n") << "EOD\n";
  // The hosts' bars first, so that the points are drawn over them.
  gp << "plot ";
  if (hosts)
    gp << "$hosts using 1:2:3:4 with yerrorbars pt -1 lw 1 lc rgb '#2266aa' title 'fastest to "
          "slowest host measured', ";
  gp << "$all using 1:2 with points pt 7 ps 0.5 lc rgb '#8899aa' title 'configurations run', "
        "$front using 1:2 with linespoints pt 7 ps 1.2 lw 2 lc rgb '#cc2222' title 'Pareto "
        "front', $labels using 1:2:3 with labels left offset 0.8,0.7 font ',8' tc rgb '#881111' "
        "notitle\n";
  return emu::render_gnuplot_png("pngcairo size 1000,640 noenhanced font 'sans,10'", gp.str(), {},
                                 png);
}

}  // namespace cocodiff::apps
