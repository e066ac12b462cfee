// `cocodiff calibrate FILE... --cluster CLUSTER [--set KEY=VALUE]... --out FIT.toml`: fits a
// cluster to measured times and writes the fitted cluster as a complete cluster file, which a
// run names directly (`cluster.preset = "FIT.toml"`, or `cocodiff netbench FIT.toml`).
//
// Collectives (nccl-tests output as printed, netbench output, or CSV op,ranks,nodes,bytes,
// time_us,transport: calibrate/measurements.hpp) fit per link tier the latency and
// bandwidth, and the collective library's per-call and per-message costs and its eager /
// rendezvous protocol (calibrate/collective_fit.hpp), each point predicted by the
// emulator as `cocodiff netbench` times it. Kernels (CSV op,kind,flops,bytes,time_us) fit the
// device's roofline and become measured tables (calibrate/kernel_fit.hpp). Ops as eager
// PyTorch runs them (measure_multi.py's kernels.csv, host_*.csv) and its interference JSON
// give the device's kernel tables, its host's issue costs and the overlap factors
// (calibrate/eager_fit.hpp). Its breakdown JSON gives the spread of the ranks' device
// speeds (calibrate/spread_fit.hpp), and its steps CSVs the kernels' step factor
// (calibrate/device_step_fit.hpp) and the host's step factor and sync slowdown
// (calibrate/host_sync_fit.hpp), fitted by timing flat FLUX.1-dev steps of the fitted
// cluster. The file written is the cluster (its preset with every --set)
// with the fitted values in place (calibrate/cluster_file.hpp); every point is then predicted
// again from that file, and measured / predicted / error is printed per point, with a summary per
// op and transport and a warning when the fit misses.

#include <unistd.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "calibrate/cluster_file.hpp"
#include "calibrate/collective_fit.hpp"
#include "calibrate/device_step_fit.hpp"
#include "calibrate/eager_fit.hpp"
#include "calibrate/grid_scale_fit.hpp"
#include "calibrate/host_sync_fit.hpp"
#include "calibrate/kernel_fit.hpp"
#include "calibrate/least_squares.hpp"
#include "calibrate/measurements.hpp"
#include "calibrate/spread_fit.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "net_models/kernel_grid.hpp"
#include "runner/run_exec.hpp"
#include "runner/run_plan.hpp"

namespace cocodiff::apps {

namespace {

using calibrate::CollectivePoint;
using calibrate::KernelPoint;

struct CalibrateOptions {
  std::vector<std::string> files;
  std::string cluster;
  std::vector<std::string> sets;
  std::string out;
  std::int64_t max_bytes = calibrate::kMaxBytes;
  std::string transport;
  std::vector<std::string> ops;  // empty: every op
  std::string rounds = "library";
  int warmup = -1, iters = -1;  // -1: 1 and 2 when the cluster has a host, else 0 and 1
  bool no_protocol = false;
  std::vector<std::string> keep;
  std::string loss = "linear";
  double accept_error = 1.0;  // --accept-error: the largest rms error of log time written
  std::vector<std::string> grid_reference;  // eager ops measured on the grids' GPU
};

// A fitted bandwidth may exceed the cluster's own figure (the datasheet's, as its preset says)
// by this much: beyond it the fit has explained the points with a link faster than the hardware.
constexpr double kBandwidthOverDatasheet = 1.10;

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// v to the 6 significant digits the file shows (the file is what runs and the check read).
double round6(double v) { return std::strtod(fmt(v).c_str(), nullptr); }

// The nodes the points that say how many they ran on need (the others run on the first ranks
// of the cluster as configured).
int nodes_needed(const std::vector<CollectivePoint>& pts) {
  int n = 1;
  for (const CollectivePoint& p : pts) n = std::max(n, p.nodes);
  return n;
}

// Errors above these are worth a warning: the issue's targets for collectives.
constexpr double kLargeBytes = 1 << 20;
constexpr double kLargeTolerance = 0.10, kSmallTolerance = 0.25;

// Per point, then per op and transport: measured against the fitted file's prediction.
std::string report_collectives(const std::vector<CollectivePoint>& pts,
                               const std::vector<double>& pred, std::ostringstream& file_notes) {
  std::printf("%-14s %5s %5s %13s %-9s %13s %13s %8s  %s\n", "op", "ranks", "nodes", "bytes",
              "transport", "measured_us", "predicted_us", "error", "where");
  // |error| of each group's points at >= 1 MiB per rank and below.
  struct Group {
    std::vector<double> large, small;
  };
  std::map<std::string, Group> groups;
  double sq = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    const CollectivePoint& p = pts[i];
    const double err = (pred[i] - p.time_us) / p.time_us;
    const double e = std::log(pred[i] / p.time_us);
    sq += e * e;
    std::printf("%-14s %5d %5d %13lld %-9s %13.2f %13.2f %7.1f%%  %s%s\n",
                std::string(bench_op_name(p.op)).c_str(), p.ranks, p.nodes,
                static_cast<long long>(p.bytes), p.transport.empty() ? "-" : p.transport.c_str(),
                p.time_us, pred[i], 100 * err, p.where.c_str(),
                p.variant == "in-place" ? " (in-place)" : "");
    Group& g = groups[std::string(bench_op_name(p.op)) + " " + std::to_string(p.ranks) + " ranks " +
                      (p.transport.empty() ? "" : p.transport)];
    (static_cast<double>(p.bytes) >= kLargeBytes ? g.large : g.small).push_back(std::abs(err));
  }
  const double rms = std::sqrt(sq / static_cast<double>(pts.size()));
  // "n points, median m%, max x%" of a group's errors.
  auto stats = [](std::vector<double> v) {
    char buf[96];
    if (v.empty()) return std::string("  0 points");
    std::snprintf(buf, sizeof buf, "%3zu points, median %5.1f%%, max %6.1f%%", v.size(),
                  100 * calibrate::median(v), 100 * *std::max_element(v.begin(), v.end()));
    return std::string(buf);
  };
  std::printf("# by op: |error| at >= 1 MiB per rank (target 10%%) and below (target 25%%)\n");
  std::string warnings;
  for (const auto& [name, g] : groups) {
    const std::string large = stats(g.large), small = stats(g.small);
    std::printf("#   %-28s >= 1 MiB: %s   < 1 MiB: %s\n", name.c_str(), large.c_str(),
                small.c_str());
    file_notes << "#   " << name << ": >= 1 MiB " << large << "; < 1 MiB " << small << "\n";
    const double max_large =
        g.large.empty() ? 0 : *std::max_element(g.large.begin(), g.large.end());
    const double max_small =
        g.small.empty() ? 0 : *std::max_element(g.small.begin(), g.small.end());
    if (max_large > kLargeTolerance || max_small > kSmallTolerance)
      warnings += "  " + name + ": up to " +
                  std::to_string(std::lround(100 * std::max(max_large, max_small))) + "% off\n";
  }
  std::printf("# rms error of log time: %.4f\n", rms);
  file_notes << "#   rms error of log time " << fmt(std::round(rms * 1e4) / 1e4) << "\n";
  std::fflush(stdout);  // the table first, then the warning, where both go to one file
  if (rms > 0.1 || !warnings.empty())
    std::fprintf(stderr,
                 "cocodiff calibrate: warning: the fit misses the measurements (rms error of log "
                 "time %.3f; the targets are 10%% at >= 1 MiB per rank and 25%% below):\n%s"
                 "  the model cannot follow these points with one set of figures; fit fewer "
                 "ops, one transport, or a narrower size range (--max-bytes) to see which\n",
                 rms, warnings.c_str());
  return warnings;
}

// [device.kernels.LABEL] of the written cluster: t's points, to the digits the file shows.
void set_kernel_table(toml::table& table, const std::string& label,
                      const calibrate::KernelTableFit& t, const std::string& source) {
  toml::table kt;
  toml::array fl, us;
  for (double v : t.flops) fl.push_back(round6(v));
  for (double v : t.time_us) us.push_back(round6(v));
  kt.insert("flops", std::move(fl));
  kt.insert("time_us", std::move(us));
  kt.insert("source", source);
  calibrate::set_key(table, "device.kernels." + label, kt);
}

/// The files the eager ops came from, in the order given, joined by ", ".
std::string eager_sources(const calibrate::Measurements& m, const std::vector<std::string>& files) {
  std::set<std::string> eager_files;
  for (const calibrate::EagerOpPoint& p : m.eager_ops)
    eager_files.insert(p.where.substr(0, p.where.rfind(':')));
  std::string sources;
  for (const std::string& file : files)
    if (eager_files.count(file) > 0) sources += (sources.empty() ? "" : ", ") + file;
  return sources;
}

/// The eager ops' table: per label, its device table's points and FLOPs range and its host cost.
void print_eager_labels(const calibrate::EagerFit& f, const calibrate::Measurements& m) {
  std::printf(
      "# eager ops: %zu points; device tables (CUDA-graph device time by the FLOPs "
      "cocodiff charges) and host issue costs per label\n",
      m.eager_ops.size());
  std::printf("%-18s %7s %12s %12s %12s  %s\n", "label", "points", "flops_min", "flops_max",
              "host_us", "device time from");
  std::set<std::string> labels;
  for (const auto& [label, t] : f.tables) labels.insert(label);
  for (const auto& [label, c] : f.host_ops) labels.insert(label);
  for (const std::string& label : labels) {
    const auto t = f.tables.find(label);
    const auto h = f.host_ops.find(label);
    if (t != f.tables.end())
      std::printf("%-18s %7zu %12.4g %12.4g ", label.c_str(), t->second.flops.size(),
                  t->second.flops.front(), t->second.flops.back());
    else
      std::printf("%-18s %7s %12s %12s ", label.c_str(), "-", "-", "-");
    if (h != f.host_ops.end())
      std::printf("%12.3f", h->second);
    else
      std::printf("%12s", "-");
    std::printf("  %s\n", t != f.tables.end() ? f.table_from.at(label).c_str() : "");
  }
}

/// [device.kernels.*]: the eager ops' device tables, each naming its source.
void set_eager_tables(const calibrate::EagerFit& f, const std::string& sources,
                      const std::string& date, toml::table& table, std::ostringstream& notes) {
  for (const auto& [label, t] : f.tables) {
    std::string source = f.table_from.at(label);
    source.append(" of ").append(sources).append(" (device time; cocodiff calibrate ");
    source.append(date).append(")");
    set_kernel_table(table, label, t, source);
  }
  if (!f.tables.empty())
    notes << "# Kernels: " << f.tables.size()
          << " [device.kernels.*] tables from the eager ops' CUDA-graph device times.\n";
}

/// [device.host]: the host's issue costs, printed and set; the ops no issue time was measured for.
void write_host_costs(const calibrate::EagerFit& f, toml::table& table, std::ostringstream& notes) {
  if (!f.host_ops.empty()) {
    std::printf("# host: op_issue_us = %s (the median of the labels above)",
                fmt(f.op_issue_us).c_str());
    calibrate::set_key(table, "device.host.op_issue_us",
                       toml::value<double>(round6(f.op_issue_us)));
    for (const auto& [label, c] : f.host_ops)
      calibrate::set_key(table, "device.host.ops." + label, toml::value<double>(round6(c)));
    if (f.collective_issue_us > 0) {
      std::printf(", collective_issue_us = %s", fmt(f.collective_issue_us).c_str());
      calibrate::set_key(table, "device.host.collective_issue_us",
                         toml::value<double>(round6(f.collective_issue_us)));
    }
    std::printf("\n");
    notes << "# Host: [device.host] op_issue_us, collective_issue_us and ops from the eager ops' "
             "host issue times (median over the points of each op).\n";
  }
  if (!f.missing.empty()) {
    std::string list;
    for (const std::string& op : f.missing) list += (list.empty() ? "" : ", ") + op;
    std::printf("# host: no issue time measured for %s; the labels they cost keep the cluster's\n",
                list.c_str());
  }
}

/// device.overlap_kind_weight.*: each kind's weight, printed, and set unless --keep holds it.
void write_kind_weights(const calibrate::EagerFit& f, toml::table& table, std::ostringstream& notes,
                        const std::set<std::string>& kept) {
  for (const auto& [kind, w] : f.kind_weights) {
    const std::string key = "device.overlap_kind_weight." + kind;
    if (kept.count(key) != 0) {
      std::printf("# interference (%s): %s = %s measured, held at the cluster's (--keep)\n",
                  f.kind_weight_from.at(kind).c_str(), key.c_str(), fmt(w).c_str());
      notes << "# Interference by kind: " << key << " held at the cluster's (--keep).\n";
      continue;
    }
    std::printf("# interference (%s): %s = %s\n", f.kind_weight_from.at(kind).c_str(), key.c_str(),
                fmt(w).c_str());
    calibrate::set_key(table, key, toml::value<double>(round6(w)));
    notes << "# Interference by kind: " << key << " from " << f.kind_weight_from.at(kind)
          << " (its slowdown as a share of the GEMM's).\n";
  }
}

/// The overlap factors: the device's, each group size's and each kind's, printed and set.
void write_interference(const calibrate::EagerFit& f, const calibrate::Measurements& m,
                        toml::table& table, std::ostringstream& notes,
                        const std::set<std::string>& kept) {
  if (f.overlap_compute > 0) {
    std::printf("# interference (%s): overlap_compute_factor = %s, overlap_transfer_factor = %s\n",
                f.interference_from.c_str(), fmt(f.overlap_compute).c_str(),
                fmt(f.overlap_transfer).c_str());
    calibrate::set_key(table, "device.overlap_compute_factor",
                       toml::value<double>(round6(std::max(1.0, f.overlap_compute))));
    calibrate::set_key(table, "device.overlap_transfer_factor",
                       toml::value<double>(round6(std::max(1.0, f.overlap_transfer))));
    notes << "# Interference: device.overlap_compute_factor and overlap_transfer_factor from "
          << f.interference_from << " (each against its time alone; at least 1).\n";
    for (const auto& [ranks, g] : f.overlap_by_group) {
      const std::string key = "device.overlap_by_group." + std::to_string(ranks);
      std::printf("# interference on %d GPUs (%s): compute_factor = %s, transfer_factor = %s\n",
                  ranks, g.from.c_str(), fmt(g.compute).c_str(), fmt(g.transfer).c_str());
      calibrate::set_key(table, key + ".compute_factor",
                         toml::value<double>(round6(std::max(1.0, g.compute))));
      calibrate::set_key(table, key + ".transfer_factor",
                         toml::value<double>(round6(std::max(1.0, g.transfer))));
      notes << "# Interference on " << ranks << " GPUs: " << key << " from " << g.from << ".\n";
    }
    write_kind_weights(f, table, notes, kept);
  } else if (!m.interference.empty()) {
    std::printf(
        "# interference: no GEMM measured beside an all-to-all; the factors are the "
        "cluster's\n");
  }
}

// Eager PyTorch ops and interference: the device's kernel tables, its host's issue costs and
// the overlap factors, printed and set in the cluster table.
void write_eager(const calibrate::EagerFit& f, const calibrate::Measurements& m,
                 const std::vector<std::string>& files, const std::string& date, toml::table& table,
                 std::ostringstream& notes, const std::set<std::string>& kept) {
  const std::string sources = eager_sources(m, files);
  print_eager_labels(f, m);
  set_eager_tables(f, sources, date, table, notes);
  write_host_costs(f, table, notes);
  write_interference(f, m, table, notes, kept);
}

// Breakdowns of flat steps: the spread of the ranks' device speeds, printed per case and set in
// the cluster table.
void write_spread(const calibrate::SpreadFit& f, toml::table& table, std::ostringstream& notes) {
  std::printf(
      "# breakdowns: %zu cases; the mean rank's wait for the slowest a step, measured and "
      "from the fitted spread\n",
      f.cases.size());
  std::printf("%-44s %5s %11s %11s %12s %8s %8s\n", "case", "gpus", "work_ms", "wait_ms",
              "predicted_ms", "error", "spread");
  for (const calibrate::SpreadCase& c : f.cases) {
    const calibrate::BreakdownPoint& p = *c.point;
    const double work = c.work_ms;
    if (!c.used) {
      std::printf(
          "%-44s %5d %11.2f %11.3f %12s %8s %8s  host-bound (GPU waits %.2f ms for its "
          "host): not used\n",
          p.where.c_str(), p.gpus, work, p.segment_wait_ms, "-", "-", "-", p.host_late_ms_max);
      continue;
    }
    const double err = p.segment_wait_ms > 0
                           ? 100.0 * (c.predicted_wait_ms - p.segment_wait_ms) / p.segment_wait_ms
                           : 0.0;
    std::printf("%-44s %5d %11.2f %11.3f %12.3f %7.1f%% %8.4f\n", p.where.c_str(), p.gpus, work,
                p.segment_wait_ms, c.predicted_wait_ms, err, c.spread);
  }
  if (f.used == 0) {
    std::printf("# breakdowns: every case is host-bound; device.rank_spread is the cluster's\n");
    return;
  }
  double worst = 0;
  for (const calibrate::SpreadCase& c : f.cases)
    if (c.used && c.point->segment_wait_ms > 0)
      worst = std::max(worst, std::abs(c.predicted_wait_ms / c.point->segment_wait_ms - 1));
  if (worst > 0.25)
    std::printf(
        "# warning: one spread misses a case's wait by %.0f%%: the ranks' devices differ "
        "more in some groups of GPUs than in others\n",
        100 * worst);
  std::printf(
      "# device.rank_spread = %s (least squares in ms of wait over %d device-bound "
      "cases)\n",
      fmt(f.rank_spread).c_str(), f.used);
  calibrate::set_key(table, "device.rank_spread", toml::value<double>(round6(f.rank_spread)));
  notes << "# Spread: device.rank_spread, least squares over " << f.used
        << " device-bound breakdown cases of their wait for the slowest rank.\n";
}

// chunks.json: a norm on a head group's strided slice against the same norm on a contiguous
// copy. device.strided_factor.norm is the median ratio over the cases of two or more groups (a
// whole tensor's "slice" is contiguous).
void write_strided(const std::vector<calibrate::ChunkPoint>& chunks, toml::table& table,
                   std::ostringstream& notes) {
  std::printf("# %-46s %5s %6s %6s %12s %12s %7s\n", "chunks", "ranks", "res", "groups",
              "strided_us", "contig_us", "ratio");
  std::vector<double> ratios;
  for (const calibrate::ChunkPoint& p : chunks) {
    const double r = p.norm_us / p.norm_contig_us;
    std::printf("%-48s %5d %6d %6d %12.3f %12.3f %7.3f%s\n", p.where.c_str(), p.ranks, p.resolution,
                p.chunks, p.norm_us, p.norm_contig_us, r,
                p.chunks >= 2 ? "" : " (whole: not used)");
    if (p.chunks >= 2) ratios.push_back(r);
  }
  if (ratios.empty()) {
    std::printf(
        "# chunks: no case of two or more groups; device.strided_factor is the cluster's\n");
    return;
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  const double f = calibrate::median(ratios);
  const double factor = std::max(0.1, std::round(f * 1000) / 1000);
  if (ratios.back() / ratios.front() > 1.25)
    std::printf("# warning: the cases' ratios range %.3f-%.3f: one factor fits them loosely\n",
                ratios.front(), ratios.back());
  std::printf("# device.strided_factor.norm = %s (median of %zu cases)\n", fmt(factor).c_str(), n);
  calibrate::set_key(table, "device.strided_factor.norm", toml::value<double>(factor));
  notes << "# Strided views: device.strided_factor.norm, the median over " << n
        << " cases of a norm on head groups' strided slices against contiguous copies.\n";
}

// A flat FLUX.1-dev step in phantom mode on one node of W GPUs (a NIC each) of a cluster table:
// milliseconds a step, the mean of two (as bench/fidelity/steps_fidelity.py times a measured
// step). The table and a run config are written into a directory of their own, removed with the
// runner.
class StepRunner {
 public:
  StepRunner() {
    dir_ = std::filesystem::temp_directory_path() /
           ("cocodiff-calibrate-steps-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    write_file_atomic((dir_ / "run.toml").string(),
                      "[model]\npreset = \"flux1-dev\"\n\n[run]\nmath = \"skip\"\nsteps = "
                      "2\nseed = 42\nstrategy = \"flat\"\n\n[emulator]\ntrace = false\n");
  }
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;
  ~StepRunner() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  double operator()(const toml::table& t, int gpus, int resolution) {
    const std::filesystem::path cluster = dir_ / "cluster.toml";
    write_file_atomic(cluster.string(), calibrate::cluster_file_text(t, ""));
    std::string nics;
    for (int r = 0; r < gpus; ++r) nics += (r ? "," : "") + std::to_string(r);
    const std::vector<std::string> sets = {"cluster.preset=" + cluster.string(),
                                           "cluster.nodes=1",
                                           "run.resolution=" + std::to_string(resolution),
                                           "cluster.topology.sizes=[" + std::to_string(gpus) + "]",
                                           "cluster.nic.count=" + std::to_string(gpus),
                                           "cluster.nic.rank_nic=[" + nics + "]"};
    const RunRecord rec = run_emulated(resolve_run_plan(dir_ / "run.toml", sets));
    return rec.report["virtual_time_s"].get<double>() / 2 * 1e3;
  }

 private:
  std::filesystem::path dir_;
};

// Device-bound steps: the kernels' step factor, fitted by timing the flat 1-GPU step in the
// emulator; printed per case and set in the cluster table (left as it is when the files hold no
// such step or the model's step is host-bound).
// A fitted roofline's launch and the efficiencies its points bound, set in the cluster table and
// printed after the line the caller began.
void write_roofline(const calibrate::KernelFit& kf, toml::table& table) {
  calibrate::set_key(table, "device.launch_overhead_ns",
                     toml::value<std::int64_t>(std::llround(kf.launch_s * 1e9)));
  for (int k = 0; k < kNumOpKinds; ++k) {
    const auto i = static_cast<size_t>(k);
    const std::string kind(op_kind_name(static_cast<OpKind>(k)));
    if (kf.fitted_c[i]) {
      std::printf(", compute_efficiency.%s = %s", kind.c_str(), fmt(kf.eff_c[i]).c_str());
      calibrate::set_key(table, "device.compute_efficiency." + kind,
                         toml::value<double>(round6(kf.eff_c[i])));
    }
    if (kf.fitted_m[i]) {
      std::printf(", memory_efficiency.%s = %s", kind.c_str(), fmt(kf.eff_m[i]).c_str());
      calibrate::set_key(table, "device.memory_efficiency." + kind,
                         toml::value<double>(round6(kf.eff_m[i])));
    }
  }
}

// Kernel grids by shape: device.grid names their directories, and the roofline that times what
// they do not cover is fitted to their points (the FLOPs and bytes the layers charge for each
// shape). Every point is printed, measured against the grid without it (its neighbours along its
// series) and against the fitted roofline.
void write_grid(const calibrate::Measurements& m, const RooflineParams& device,
                const std::array<double, kNumOpKinds>& scale, toml::table& table,
                std::ostringstream& notes) {
  KernelGrid g;
  std::vector<std::string> dirs;
  for (const auto& [name, text] : m.grid_files) {
    g.add_text(text, name);
    const std::string dir =
        std::filesystem::absolute(std::filesystem::path(name)).parent_path().lexically_normal();
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  }
  g.finish();
  if (g.empty()) throw InputError("calibrate: the grid files hold no bf16 point");
  std::vector<KernelPoint> kp;
  for (const KernelGrid::Point& p : g.points()) {
    const OpCost c = dit::charged_cost(p.shape);
    const double s = scale[static_cast<size_t>(kernel_class_kind(p.shape.kernel))];
    kp.push_back({p.source, std::string(kernel_class_name(p.shape.kernel)), c.kind, c.flops,
                  c.bytes, p.time_s * s * 1e6});
  }
  calibrate::KernelFit kf = calibrate::fit_kernels(device, kp);
  std::printf(
      "# grid: %zu points of %zu files; roofline fitted for what it does not cover: "
      "launch_overhead_ns = %.0f",
      kp.size(), m.grid_files.size(), kf.launch_s * 1e9);
  write_roofline(kf, table);
  std::printf("\n%-21s %-22s %12s %12s %8s %12s %8s\n", "kernel", "shape", "measured_us",
              "held_out_us", "error", "roofline_us", "error");
  struct ClassErrors {
    std::vector<double> held, roof;
  };
  std::map<std::string, ClassErrors> by_class;
  for (size_t i = 0; i < kp.size(); ++i) {
    const KernelGrid::Point& p = g.points()[i];
    const auto& d = p.shape.dims;
    const int nd = p.shape.kernel == KernelClass::kGemm   ? 4
                   : p.shape.kernel == KernelClass::kSdpa ? 5
                                                          : 2;
    std::string shape;
    for (int j = 0; j < nd; ++j)
      shape += (j ? "x" : "") + std::to_string(d[static_cast<size_t>(j)]);
    std::optional<double> h = g.held_out(i);
    if (h) *h *= scale[static_cast<size_t>(kernel_class_kind(p.shape.kernel))];
    const double roof_err = (kf.predicted_us[i] - kp[i].time_us) / kp[i].time_us;
    ClassErrors& e = by_class[kp[i].op];
    e.roof.push_back(std::abs(roof_err));
    char held[64] = "           -        -";
    if (h) {
      const double err = (*h * 1e6 - kp[i].time_us) / kp[i].time_us;
      e.held.push_back(std::abs(err));
      std::snprintf(held, sizeof held, "%12.2f %7.1f%%", *h * 1e6, 100 * err);
    }
    std::printf("%-21s %-22s %12.2f %s %12.2f %7.1f%%\n", kp[i].op.c_str(), shape.c_str(),
                kp[i].time_us, held, kf.predicted_us[i], 100 * roof_err);
  }
  const auto median_of = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "# by kernel: points, |error| held out (median, max), |error| of the roofline "
      "(median)\n");
  for (const auto& [cls, e] : by_class)
    std::printf("#   %-21s %5zu  %6.1f%% %6.1f%%  %6.1f%%\n", cls.c_str(), e.roof.size(),
                100 * median_of(e.held),
                100 * (e.held.empty() ? 0.0 : *std::max_element(e.held.begin(), e.held.end())),
                100 * median_of(e.roof));
  toml::array list;
  for (const std::string& d : dirs) list.push_back(d);
  calibrate::set_key(table, "device.grid", list);
  if (toml::table* dev = table["device"].as_table()) dev->erase("kernels");
  notes << "# Kernels: timed by shape from the grids of device.grid (" << kp.size()
        << " points); the roofline for what they do not cover fitted to them (rms error of log "
           "time "
        << fmt(kf.rms_log) << ").\n";
}

// The grids measured on another GPU (--grid-reference: the same eager ops measured on the grids'
// GPU): device.grid_scale.KIND, the geometric mean of the ratios of this GPU's times of the ops
// both measured to the reference's (calibrate/grid_scale_fit.hpp).
std::array<double, kNumOpKinds> write_grid_scale(const calibrate::Measurements& m,
                                                 const std::vector<std::string>& files,
                                                 toml::table& table, std::ostringstream& notes) {
  calibrate::Measurements ref;
  for (const std::string& f : files) calibrate::read_measurements(f, ref);
  if (ref.eager_ops.empty())
    throw InputError("calibrate: --grid-reference " + files.front() +
                     ": no eager op (op,label,tokens,heads,k,n,flops,device_us,host_us) to carry "
                     "the grids with");
  const calibrate::GridScaleFit f = calibrate::fit_grid_scale(m.eager_ops, ref.eager_ops);
  std::printf("# grids carried from the reference's GPU: device time here / there, by op\n");
  std::printf("%-16s %-11s %6s %12s %14s %8s %8s %8s\n", "op", "kind", "points", "here_us",
              "reference_us", "summed", "min", "max");
  for (const auto& [op, r] : f.ops)
    std::printf("%-16s %-11s %6d %12.1f %14.1f %8.3f %8.3f %8.3f\n", op.c_str(),
                std::string(op_kind_name(r.kind)).c_str(), r.points, r.mine_us, r.reference_us,
                r.mine_us / r.reference_us, r.min_ratio, r.max_ratio);
  std::string where;
  for (const std::string& f : files) where += (where.empty() ? "" : ", ") + f;
  notes << "# Grids carried from another GPU: device.grid_scale.KIND, the geometric mean of the "
           "ratios of the eager ops' device times measured here and on the grids' GPU ("
        << where << ") at the same shapes, by kind:";
  std::array<double, kNumOpKinds> scale{1, 1, 1, 1, 1};
  for (size_t k = 0; k < scale.size(); ++k) {
    if (!f.fitted[k]) continue;
    const std::string kind(op_kind_name(static_cast<OpKind>(k)));
    const double s = std::strtod(fmt(std::round(f.scale[k] * 1e4) / 1e4).c_str(), nullptr);
    if (!(s >= 0.2 && s <= 5))
      throw InputError("calibrate: --grid-reference: the " + kind + " kernels here take " + fmt(s) +
                       "x the reference's, outside 0.2 to 5: not the same ops or not "
                       "comparable GPUs; no cluster file written");
    scale[k] = s;
    std::printf("# device.grid_scale.%s = %s\n", kind.c_str(), fmt(s).c_str());
    calibrate::set_key(table, "device.grid_scale." + kind, toml::value<double>(s));
    notes << " " << kind << " " << fmt(s);
  }
  notes << " (" << f.unmatched.size() << " points here without a reference).\n";
  return scale;
}

void write_device_step(const std::vector<calibrate::StepPoint>& steps, toml::table& table,
                       std::ostringstream& notes) {
  const double current = table.at_path("device.step_factor").value_or(1.0);
  StepRunner runner;
  const calibrate::DeviceStepFit f = calibrate::fit_device_step(
      steps,
      [&](int resolution, double factor) {
        toml::table t = table;
        calibrate::set_key(t, "device.step_factor", toml::value<double>(factor));
        return runner(t, 1, resolution);
      },
      current);
  if (f.cases.empty()) {
    std::printf(
        "# steps: no flat 1-GPU step at %d^2, the files' largest resolution; "
        "device.step_factor is the cluster's\n",
        f.resolution);
    return;
  }
  std::printf(
      "# steps: %zu flat 1-GPU steps at %d^2 (device-bound), each file's median against a "
      "FLUX.1-dev step of the fitted cluster (%d emulated)\n",
      f.cases.size(), f.resolution, f.predictions);
  std::printf("%-56s %5s %12s %13s %8s\n", "file", "rows", "measured_ms", "predicted_ms", "error");
  for (const calibrate::DeviceStepCase& c : f.cases)
    std::printf("%-56s %5d %12.1f %13.1f %7.1f%%\n", c.source.c_str(), c.rows, c.measured_ms,
                c.predicted_ms, 100 * (c.predicted_ms / c.measured_ms - 1));
  if (!f.fitted) {
    std::printf(
        "# warning: the model's 1-GPU step at %d^2 is host-bound (it grows %.2f times as fast as "
        "its kernels): device.step_factor is the cluster's\n",
        f.resolution, f.sensitivity);
    return;
  }
  if (f.step_factor <= calibrate::kMinKernelStepFactor + 0.001 ||
      f.step_factor >= calibrate::kMaxKernelStepFactor - 0.001)
    std::printf(
        "# warning: the kernels' step factor is at the end of its range: the kernel tables and "
        "the steps measure different devices\n");
  std::printf(
      "# device.step_factor = %s (rms error of log time %.3f over %zu steps): a step's device "
      "work over its kernels' times alone\n",
      fmt(f.step_factor).c_str(), f.rms_log, f.cases.size());
  calibrate::set_key(table, "device.step_factor", toml::value<double>(f.step_factor));
  notes << "# Kernels in a step: device.step_factor = " << fmt(f.step_factor)
        << ", by golden-section search on the log error of " << f.cases.size()
        << " flat 1-GPU steps at " << f.resolution << "^2 (rms "
        << fmt(std::round(f.rms_log * 1000) / 1000) << "), each timed as a FLUX.1-dev step of "
        << "this file.\n";
}

// Host-bound steps: the host's sync slowdown, fitted by timing the flat step on each measured
// GPU count in the emulator; printed per case and set in the cluster table.
void write_host_sync(const std::vector<calibrate::StepPoint>& steps, toml::table& table,
                     std::ostringstream& notes) {
  StepRunner runner;
  const calibrate::HostSyncFit f = calibrate::fit_host_sync(
      steps, [&](int gpus, int resolution, double step_factor, double sync_slowdown) {
        toml::table t = table;
        calibrate::set_key(t, "device.host.step_factor", toml::value<double>(step_factor));
        calibrate::set_key(t, "device.host.sync_slowdown", toml::value<double>(sync_slowdown));
        calibrate::set_key(t, "device.host.per_rank_slowdown", toml::value<double>(0.0));
        return runner(t, gpus, resolution);
      });
  std::printf(
      "# steps: %zu flat steps of 2 or more GPUs at %d^2 (host-bound), each file's median "
      "against a FLUX.1-dev step of the fitted cluster (%d emulated)\n",
      f.cases.size(), f.resolution, f.predictions);
  std::printf("%-56s %5s %5s %12s %13s %8s\n", "file", "gpus", "rows", "measured_ms",
              "predicted_ms", "error");
  double worst = 0;
  for (const calibrate::HostSyncCase& c : f.cases) {
    const double err = c.predicted_ms / c.measured_ms - 1;
    worst = std::max(worst, std::abs(err));
    std::printf("%-56s %5d %5d %12.1f %13.1f %7.1f%%\n", c.source.c_str(), c.gpus, c.rows,
                c.measured_ms, c.predicted_ms, 100 * err);
  }
  if (worst > 0.25)
    std::printf(
        "# warning: the fitted host misses a step by %.0f%%: host-bound steps vary between "
        "machines and launches more than the host's two figures can follow\n",
        100 * worst);
  std::printf(
      "# device.host.step_factor = %s, sync_slowdown = %s (rms error of log time %.3f over %zu "
      "steps on %d GPU counts; per_rank_slowdown 0)%s\n",
      fmt(f.step_factor).c_str(), fmt(f.sync_slowdown).c_str(), f.rms_log, f.cases.size(),
      f.gpu_counts,
      f.gpu_counts < 2 ? "; one GPU count cannot tell the step factor from the sync slowdown: "
                         "the factor is kept at 1"
                       : "");
  calibrate::set_key(table, "device.host.step_factor", toml::value<double>(f.step_factor));
  calibrate::set_key(table, "device.host.sync_slowdown", toml::value<double>(f.sync_slowdown));
  calibrate::set_key(table, "device.host.per_rank_slowdown", toml::value<double>(0.0));
  if (f.machines >= 2) {
    std::printf(
        "# device.host.range = [%s, %s]: the lowest and highest measured / predicted of the %d "
        "machines' steps; `cocodiff tune` times its best configurations at both ends\n",
        fmt(f.range_low).c_str(), fmt(f.range_high).c_str(), f.machines);
    toml::array range;
    range.push_back(f.range_low);
    range.push_back(f.range_high);
    calibrate::set_key(table, "device.host.range", range);
    notes << "# Host range: device.host.range = [" << fmt(f.range_low) << ", " << fmt(f.range_high)
          << "], the lowest and highest measured / predicted of those steps "
          << "over " << f.machines << " machines (files).\n";
  } else if (toml::table* host = table["device"]["host"].as_table()) {
    host->erase("range");  // the base's range was against its own host, not the fitted one
  }
  notes << "# Host: device.host.step_factor = " << fmt(f.step_factor)
        << ", sync_slowdown = " << fmt(f.sync_slowdown)
        << " (per_rank_slowdown 0): each GPU count's factor timed by golden-section search, then "
           "a line in H(n) - 1 through them, on the log error of "
        << f.cases.size() << " flat steps of 2 or more GPUs at " << f.resolution << "^2 (rms "
        << fmt(std::round(f.rms_log * 1000) / 1000)
        << "), each timed as a FLUX.1-dev step of this file.\n";
}

// The collectives and steps the options select (--max-bytes, --transport, --ops); InputError
// where they are of several transports or none is left.
void select_points(const CalibrateOptions& o, const calibrate::Measurements& m,
                   std::vector<CollectivePoint>& pts, std::vector<calibrate::StepPoint>& steps) {
  std::set<std::string> transports;
  for (const CollectivePoint& p : m.collectives) {
    if (p.bytes > o.max_bytes) continue;
    if (!o.transport.empty() && p.transport != o.transport) continue;
    if (!o.ops.empty() &&
        std::find(o.ops.begin(), o.ops.end(), std::string(bench_op_name(p.op))) == o.ops.end())
      continue;
    transports.insert(p.transport);
    pts.push_back(p);
  }
  for (const calibrate::StepPoint& p : m.steps) {
    if (!o.transport.empty() && p.transport != o.transport) continue;
    transports.insert(p.transport);
    steps.push_back(p);
  }
  transports.erase("");
  if (transports.size() > 1) {
    std::string list;
    for (const std::string& t : transports) list += (list.empty() ? "" : ", ") + t;
    throw InputError("calibrate: the measurements are of several transports (" + list +
                     "), which one cluster file cannot hold; choose one with --transport");
  }
  if (pts.empty() && m.kernels.empty() && m.eager_ops.empty() && m.interference.empty() &&
      m.breakdowns.empty() && steps.empty() && m.chunks.empty() && m.grid_files.empty())
    throw InputError("calibrate: no measurement left after --max-bytes, --transport and --ops");
}

// The eager ops' fit (where there are eager ops or interference files); the kinds' weights
// --keep names into kept_kinds (InputError where the interference files give none), the other
// keys into fo.keep.
std::optional<calibrate::EagerFit> fit_eager_ops(const CalibrateOptions& o,
                                                 const calibrate::Measurements& m,
                                                 calibrate::CollectiveFitOptions& fo,
                                                 std::set<std::string>& kept_kinds) {
  // Kinds' shares of the compute factor come from the interference files, every other figure
  // from the collectives.
  const std::string kind_weight = "device.overlap_kind_weight.";
  for (const std::string& key : o.keep)
    if (key.rfind(kind_weight, 0) == 0)
      kept_kinds.insert(key);
    else
      fo.keep.push_back(key);
  // The eager ops' fit, made once: checked here, before the collectives' fit, and written below.
  std::optional<calibrate::EagerFit> eager;
  if (!m.eager_ops.empty() || !m.interference.empty())
    eager = calibrate::fit_eager(m.eager_ops, m.interference);
  if (!kept_kinds.empty()) {  // a kind's weight held: the interference files must give it
    for (const std::string& key : kept_kinds)
      if (!eager || eager->kind_weights.count(key.substr(kind_weight.size())) == 0) {
        std::string given;
        if (eager)
          for (const auto& [kind, w] : eager->kind_weights)
            given.append(given.empty() ? "" : ", ").append(kind_weight).append(kind);
        throw InputError("--keep " + key + ": not a figure these points fit (the interference " +
                         "files give: " + (given.empty() ? "no kind's weight" : given) + ")");
      }
  }
  return eager;
}

// The written file's opening notes: the base cluster, the files and the options it was fitted to.
void header_notes(const CalibrateOptions& o, const Cluster& base, const std::string& date,
                  std::ostringstream& notes) {
  notes << "# Written by cocodiff calibrate on " << date << ": cluster " << base.name << " ("
        << base.source << ")";
  for (const std::string& s : o.sets) notes << ", --set " << s;
  notes << ", fitted by least squares on log time to\n";
  for (const std::string& f : o.files) notes << "#   " << f << "\n";
  if (!o.transport.empty()) notes << "# (transport " << o.transport << " only)\n";
  if (o.loss != "linear") notes << "# (loss " << o.loss << ")\n";
  if (!o.ops.empty()) {
    notes << "# (ops";
    for (const std::string& op : o.ops) notes << " " << op;
    notes << " only)\n";
  }
  if (o.max_bytes < calibrate::kMaxBytes)
    notes << "# (points of at most " << o.max_bytes << " bytes only)\n";
  notes << "# A complete cluster file: run configs name it as cluster.preset = \"<this file>\".\n"
        << "# Every value not listed below is the base cluster's (its file says where each comes "
           "from).\n";
}

// The collectives' fitted values: printed, noted and set in the table.
void write_collective_values(const calibrate::CollectiveFit& cfit, toml::table& table,
                             std::ostringstream& notes) {
  for (const calibrate::FittedValue& v : cfit.values) {
    const std::string shown = v.integer ? std::to_string(std::llround(v.value)) : fmt(v.value);
    std::printf("#   %-40s = %-12s (was %s) %s: %s%s\n", v.key.c_str(), shown.c_str(),
                fmt(v.initial).c_str(),
                v.fitted ? "fitted"
                : v.held ? "held (--keep)"
                         : "kept, not determined by the points",
                v.what.c_str(),
                v.determined_by.empty() ? "" : ("; set by " + v.determined_by).c_str());
    notes << "#   " << v.key << " = " << shown << " ("
          << (v.fitted ? "fitted" : "kept: the points do not determine it") << "; was "
          << fmt(v.initial)
          << (v.determined_by.empty() ? std::string() : "; set by " + v.determined_by) << ")\n";
    if (v.integer)
      calibrate::set_key(table, v.key, toml::value<std::int64_t>(std::llround(v.value)));
    else
      calibrate::set_key(table, v.key, toml::value<double>(round6(v.value)));
  }
}

// The collectives' fit, refused where it sets a bandwidth past the cluster's datasheet.
void fit_collective_points(const Cluster& c, const Cluster& base,
                           const std::filesystem::path& preset_dir, int min_nodes,
                           const std::vector<CollectivePoint>& pts,
                           const calibrate::CollectiveFitOptions& fo,
                           std::chrono::steady_clock::time_point wall0, toml::table& table,
                           std::ostringstream& notes) {
  calibrate::CollectiveFit cfit;
  const std::vector<calibrate::LinkKnob> knobs = calibrate::link_knobs(c, table);
  cfit = calibrate::fit_collectives({table, base.source, preset_dir, min_nodes}, knobs, pts, fo);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  std::printf("# collectives: %zu points, %d simulations, %.1f s; protocol: %s\n", pts.size(),
              cfit.simulations, wall, cfit.protocol_note.c_str());
  notes << "# Collectives (" << pts.size() << " points); protocol: " << cfit.protocol_note << "\n";
  for (const calibrate::FittedValue& v : cfit.values)
    if (v.fitted && v.key.size() > 22 &&
        v.key.compare(v.key.size() - 22, 22, "bandwidth_gbytes_per_s") == 0 &&
        v.value > kBandwidthOverDatasheet * v.initial)
      throw InputError(
          "calibrate: the fit sets " + v.key + " = " + fmt(v.value) + ", above the cluster's " +
          fmt(v.initial) + " (" + v.what + ") by more than " +
          std::to_string(std::lround(100 * (kBandwidthOverDatasheet - 1))) +
          "%: faster than the hardware the cluster describes, so the points say something "
          "else (a launcher's floor, another tier's links, a wrong op or rank count); no "
          "cluster file written. Where the link is faster than the cluster says, --set " +
          v.key.substr(0, v.key.find('.')) + "... to its figure; or --keep " + v.key);
  write_collective_values(cfit, table, notes);
}

// The kernels' roofline fit: printed per point, its tables and efficiencies set in the table.
void fit_kernel_points(const CalibrateOptions& o, const Cluster& c,
                       const calibrate::Measurements& m, const char* date, toml::table& table,
                       std::ostringstream& notes) {
  const calibrate::KernelFit kf = calibrate::fit_kernels(c.device_params, m.kernels);
  std::printf("# kernels: %zu points; fitted roofline: launch_overhead_ns = %.0f", m.kernels.size(),
              kf.launch_s * 1e9);
  write_roofline(kf, table);
  std::printf("\n%-18s %-11s %12s %12s %12s %12s %8s\n", "op", "kind", "flops", "bytes",
              "measured_us", "roofline_us", "error");
  for (size_t i = 0; i < m.kernels.size(); ++i) {
    const KernelPoint& p = m.kernels[i];
    std::printf("%-18s %-11s %12.4g %12.4g %12.2f %12.2f %7.1f%%\n", p.op.c_str(),
                std::string(op_kind_name(p.kind)).c_str(), p.flops, p.bytes, p.time_us,
                kf.predicted_us[i], 100.0 * (kf.predicted_us[i] - p.time_us) / p.time_us);
  }
  std::printf("# rms error of log time (fitted roofline): %.4f\n", kf.rms_log);
  notes << "# Kernels: roofline fitted to " << m.kernels.size() << " points (rms error of log time "
        << fmt(kf.rms_log)
        << "); efficiencies no point was bound by are the cluster's; each op's points are its "
           "[device.kernels.OP] table.\n";
  std::string sources;
  for (const std::string& f : o.files) sources += (sources.empty() ? "" : ", ") + f;
  for (const auto& [op, t] : kf.tables)
    set_kernel_table(table, op, t, sources + " (cocodiff calibrate " + date + ")");
}

// The file's name (the output's stem), node count (at least its points') and description.
void name_fitted_file(const CalibrateOptions& o, const Cluster& base, int min_nodes,
                      const std::string& date, toml::table& table) {
  const std::string stem = std::filesystem::path(o.out).stem().string();
  calibrate::set_key(table, "name", toml::value<std::string>(stem.empty() ? "fit" : stem));
  // The file's node count covers its points: a run naming it runs the nodes they ran on.
  if (const std::optional<std::int64_t> nodes = table["nodes"].value<std::int64_t>();
      min_nodes > nodes.value_or(1))
    calibrate::set_key(table, "nodes", toml::value<std::int64_t>(min_nodes));
  const std::optional<std::string> desc = table["description"].value<std::string>();
  calibrate::set_key(table, "description",
                     toml::value<std::string>(desc.value_or(base.name) +
                                              " (fitted by cocodiff calibrate, " + date + ")"));
}

// Every point again, from the cluster the file holds (what a run naming it gets): noted, and
// InputError where their rms error of log time is past --accept-error.
void check_predictions(const CalibrateOptions& o, const std::filesystem::path& preset_dir,
                       int min_nodes, const std::vector<CollectivePoint>& pts,
                       const calibrate::CollectiveFitOptions& fo, const toml::table& table,
                       std::ostringstream& notes) {
  const std::vector<double> pred =
      calibrate::predict_collectives({table, o.out, preset_dir, min_nodes}, pts, fo);
  notes << "# Measured against this file's predictions:\n";
  report_collectives(pts, pred, notes);
  double sq = 0;
  size_t worst = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    const double e = std::log(pred[i] / pts[i].time_us);
    sq += e * e;
    if (std::abs(e) > std::abs(std::log(pred[worst] / pts[worst].time_us))) worst = i;
  }
  const double rms = std::sqrt(sq / static_cast<double>(pts.size()));
  if (!(rms <= o.accept_error))
    throw InputError("calibrate: the fit misses the measurements by an rms error of log time " +
                     fmt(rms) + ", more than --accept-error " + fmt(o.accept_error) +
                     " (the worst point, " + pts[worst].where + ", measured " +
                     fmt(pts[worst].time_us) + " us, predicted " + fmt(pred[worst]) +
                     " us); no cluster file written: fit fewer ops, one transport or a "
                     "narrower size range, or raise --accept-error");
  std::printf(
      "# each prediction is what `cocodiff netbench %s --rounds %s -w %d -n %d --op OP` "
      "prints for its size on a cluster of the point's ranks and nodes\n",
      o.out.c_str(), o.rounds.c_str(), fo.warmup, fo.iters);
}

// The grids' and the reference host's directories, relative to the written file's where they
// can be (its runs resolve them from there), as the fits above read them (absolute): the file
// names no directory of the machine that wrote it.
void relative_dirs(const CalibrateOptions& o, toml::table& table) {
  const std::filesystem::path here = std::filesystem::absolute(o.out).parent_path();
  const auto relative = [&here](toml::value<std::string>* d) {
    if (d == nullptr) return;
    const std::filesystem::path rel = std::filesystem::path(d->get()).lexically_relative(here);
    if (!rel.empty()) *d = rel.string();
  };
  if (toml::array* grid = table["device"]["grid"].as_array())
    for (toml::node& n : *grid) relative(n.as_string());
  relative(table["device"]["host"]["reference"].as_string());
}

void run_calibrate(const CalibrateOptions& o) {
  const auto wall0 = std::chrono::steady_clock::now();
  calibrate::Measurements m;
  for (const std::string& f : o.files) calibrate::read_measurements(f, m);
  std::vector<CollectivePoint> pts;
  std::vector<calibrate::StepPoint> steps;
  select_points(o, m, pts, steps);

  const std::filesystem::path preset_dir = config_dir() / "clusters";
  Config cfg = load_cluster_config(o.cluster, preset_dir);
  for (const std::string& s : o.sets) cfg.set(s);
  toml::table table = calibrate::complete_cluster_table(cfg, preset_dir);
  const Cluster base = load_cluster(cfg, preset_dir);  // errors name the config's lines
  const int min_nodes = nodes_needed(pts);
  const Cluster c = calibrate::load_cluster_table(table, base.source, preset_dir, min_nodes);
  // Measured times are of calls back to back (nccl-tests, measure_multi.py). Where the device
  // has a host, a call's issue overlaps the call before it, so the points are timed back to back
  // too; without one, a call repeats the time of the one before it.
  calibrate::CollectiveFitOptions fo;
  fo.rounds = o.rounds;
  fo.fit_protocol = !o.no_protocol;
  fo.soft_l1 = o.loss == "soft_l1";
  std::set<std::string> kept_kinds;
  const std::optional<calibrate::EagerFit> eager = fit_eager_ops(o, m, fo, kept_kinds);
  fo.warmup = o.warmup >= 0 ? o.warmup : (c.device->has_host() ? 1 : 0);
  fo.iters = o.iters >= 1 ? o.iters : (c.device->has_host() ? 2 : 1);
  std::printf(
      "# cocodiff calibrate: cluster %s (%s), library %s, all-to-all rounds %s, each point %d "
      "warm-up and %d timed calls\n",
      base.name.c_str(), base.source.c_str(), c.library.name.c_str(), o.rounds.c_str(), fo.warmup,
      fo.iters);
  for (const std::string& col : m.ignored_columns)
    std::printf("# column not read: %s\n", col.c_str());
  if (m.skipped_rows > 0) std::printf("# %zu times skipped (N/A, or of size 0)\n", m.skipped_rows);

  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::ostringstream notes;
  header_notes(o, base, date, notes);
  if (!pts.empty())
    fit_collective_points(c, base, preset_dir, min_nodes, pts, fo, wall0, table, notes);
  if (!m.kernels.empty()) fit_kernel_points(o, c, m, date, table, notes);

  if (eager) write_eager(*eager, m, o.files, date, table, notes, kept_kinds);
  // After the eager ops: the grids replace the kernel tables those write.
  if (!o.grid_reference.empty() && m.grid_files.empty())
    throw InputError(
        "calibrate: --grid-reference carries kernel grids to this GPU: give the grid "
        "files (gemm.csv, attention.csv, memory.csv) too");
  if (!m.grid_files.empty()) {
    std::array<double, kNumOpKinds> scale{1, 1, 1, 1, 1};
    if (!o.grid_reference.empty()) scale = write_grid_scale(m, o.grid_reference, table, notes);
    write_grid(m, c.device_params, scale, table, notes);
  }
  if (!m.breakdowns.empty()) write_spread(calibrate::fit_spread(m.breakdowns), table, notes);
  if (!m.chunks.empty()) write_strided(m.chunks, table, notes);
  // Last: the steps are timed on the cluster every other fit has made; the kernels' pace in a
  // step first (1-GPU steps at the largest resolution, device-bound), then the host's.
  if (!steps.empty()) {
    write_device_step(steps, table, notes);
    write_host_sync(steps, table, notes);
  }

  name_fitted_file(o, base, min_nodes, date, table);
  if (!pts.empty()) check_predictions(o, preset_dir, min_nodes, pts, fo, table, notes);
  relative_dirs(o, table);
  const std::string text = calibrate::cluster_file_text(table, notes.str() + "\n");
  auto lock = hold_interrupts();
  write_file_atomic(o.out, text);
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "fit a cluster (link latency and bandwidth per tier, the collective library's costs and "
      "protocol, the device's roofline and kernel tables) to measured times; writes a complete "
      "cluster file");
  cmd->add_option("files", o->files,
                  "collectives: nccl-tests output, netbench output or --json, or CSV "
                  "(op,ranks,nodes,bytes,time_us,transport); kernels: CSV "
                  "(op,kind,flops,bytes,time_us); eager ops: CSV "
                  "(op,label,tokens,heads,k,n,flops,device_us,host_us); whole steps: CSV "
                  "(strategy,gpus,resolution,image_tokens,median_ms,...); interference, "
                  "breakdown or chunks: JSON")
      ->required();
  cmd->add_option("--cluster", o->cluster, "cluster preset name or file the points ran on")
      ->required();
  cmd->add_option("--set", o->sets, "override a cluster key, e.g. --set cluster.nodes=2");
  cmd->add_option("--out", o->out, "the cluster file to write (complete: a run can name it)")
      ->required();
  cmd->add_option("--max-bytes", o->max_bytes, "use only points of at most this many bytes")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--transport", o->transport,
                  "use only points of this transport (the CSV's transport column)");
  cmd->add_option("--ops", o->ops,
                  "use only points of these collectives (e.g. all_to_all,all_gather)")
      ->delimiter(',')
      ->check(
          CLI::IsMember({"all_to_all", "all_gather", "reduce_scatter", "all_reduce", "sendrecv"}));
  cmd->add_option("--rounds", o->rounds,
                  "how each all-to-all posts its messages (as netbench --rounds; library: what "
                  "runs use)")
      ->check(CLI::IsMember(emu::all_to_all_choices()));
  cmd->add_option("-w,--warmup-iters", o->warmup,
                  "calls before the timed ones, per point (default: 1 where the cluster's device "
                  "has a host, else 0)")
      ->check(CLI::Range(0, 100));
  cmd->add_option("-n,--iters", o->iters,
                  "timed calls back to back per point (default: 2 where the cluster's device has "
                  "a host, else 1)")
      ->check(CLI::Range(1, 100));
  cmd->add_option("--loss", o->loss,
                  "linear: least squares on log time; soft_l1: past 10% off a point counts as "
                  "|error|, so that a few noisy points do not pull the fit")
      ->check(CLI::IsMember({"linear", "soft_l1"}));
  cmd->add_option("--keep", o->keep,
                  "hold a figure at the cluster's value instead of fitting it, by its key "
                  "(e.g. library.call_overhead_us from CUDA-graph device times, or "
                  "device.overlap_kind_weight.norm); repeatable");
  cmd->add_option("--accept-error", o->accept_error,
                  "the largest rms error of log time a written fit may have against its points "
                  "(1.0: a typical point within a factor of e); past it calibrate exits 2 and "
                  "writes no cluster file")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--grid-reference", o->grid_reference,
                  "the grid files were measured on another GPU: eager ops (kernels.csv of "
                  "measure_multi.py) measured on that GPU, which with the same ops measured on "
                  "this one give device.grid_scale per kind; repeatable")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-protocol", o->no_protocol,
                "keep the cluster's eager/rendezvous protocol instead of fitting a threshold");
  cmd->callback([o] { run_calibrate(*o); });
}

}  // namespace cocodiff::apps
