// `cocodiff calibrate FILE... --cluster CONFIG --out OVERLAY.toml`: fits the collective
// library's per-call and per-message software costs to measured collective times, by least
// squares on log time, and writes them as a cluster overlay (a run config whose [cluster]
// names the preset and whose [cluster.library] holds the fit, with its provenance).
//
// Measurements: CSV files with the header `op,ranks,bytes,time_us` (op = all_to_all |
// all_gather | all_reduce; bytes = one rank's buffer as nccl-tests counts it: the whole send
// buffer of an all-to-all, the gathered output, the reduced buffer), or nccl-tests output as
// printed (the op from its file name: alltoall, all_gather / allgather, all_reduce / allreduce;
// the ranks from its "#  Rank" lines; the out-of-place time).
//
// Each point is run on the emulated cluster (the first `ranks` ranks) with the software costs
// off, which gives T0; the library adds call + k * message, k being the messages on the
// critical path (p-1 for all-to-all and ring all-gather, 2 (p-1) for ring all-reduce). The fit
// is then checked by running every point again with the fitted costs.
//
// Kernels: CSV files with the header `op,kind,flops,bytes,time_us` (op = the label cocodiff
// charges, e.g. q_proj; kind = gemm | attention | norm | elementwise | copy; flops and bytes as
// cocodiff charges them). The device's roofline, max(flops / (peak * compute_efficiency),
// bytes / (hbm * memory_efficiency)) + launch, is fitted by least squares on log time (the
// cluster's peak and HBM rate kept; per kind the efficiency the points bound, one launch
// overhead), and every op's points become a [device.kernels.OP] table.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "apps/run_plan.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
#include "core/op_cost.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"

namespace cocodiff::apps {

namespace {

struct CalibrateOptions {
  std::vector<std::string> files;
  std::string cluster;
  std::vector<std::string> sets;
  std::string out;
  double wire_bytes = 1;  // measurements count bytes, so one "element" is one byte
  std::int64_t max_bytes = std::int64_t{1} << 62;
};

struct Point {
  std::string where;  // file:line
  std::string op;
  int ranks = 0;
  std::int64_t bytes = 0;
  double time_us = 0;
};

struct KernelPoint {
  std::string where;  // file:line
  std::string op;     // the label cocodiff charges
  OpKind kind = OpKind::kGemm;
  double flops = 0, bytes = 0, time_us = 0;
};

struct Measurements {
  std::vector<Point> collectives;
  std::vector<KernelPoint> kernels;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(trim(cur));
  return out;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  std::string w;
  while (is >> w) out.push_back(w);
  return out;
}

[[noreturn]] void bad(const std::string& where, const std::string& expected,
                      const std::string& found) {
  throw InputError(where + ": expected " + expected + ", found " + found);
}

double to_double(const std::string& s, const std::string& where, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || !std::isfinite(v)) bad(where, what, "\"" + s + "\"");
  return v;
}

std::int64_t to_int(const std::string& s, const std::string& where, const std::string& what,
                    std::int64_t lo) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || v < lo) bad(where, what, "\"" + s + "\"");
  return v;
}

const std::vector<std::string> kOps = {"all_to_all", "all_gather", "all_reduce"};

void read_csv(const std::string& file, const std::vector<std::string>& lines,
              std::vector<Point>& out) {
  const std::vector<std::string> header = split(lines.front(), ',');
  if (header != std::vector<std::string>{"op", "ranks", "bytes", "time_us"})
    bad(file + ":1", "the header op,ranks,bytes,time_us", "\"" + trim(lines.front()) + "\"");
  for (size_t i = 1; i < lines.size(); ++i) {
    if (trim(lines[i]).empty()) continue;
    const std::string where = file + ":" + std::to_string(i + 1);
    const std::vector<std::string> f = split(lines[i], ',');
    if (f.size() != 4) bad(where, "4 fields (op,ranks,bytes,time_us)", std::to_string(f.size()));
    Point p;
    p.where = where;
    p.op = f[0];
    if (std::find(kOps.begin(), kOps.end(), p.op) == kOps.end())
      bad(where, "op all_to_all | all_gather | all_reduce", "\"" + p.op + "\"");
    p.ranks = static_cast<int>(to_int(f[1], where, "ranks >= 1", 1));
    p.bytes = to_int(f[2], where, "bytes >= 1", 1);
    p.time_us = to_double(f[3], where, "time_us > 0");
    if (!(p.time_us > 0)) bad(where, "time_us > 0", f[3]);
    out.push_back(p);
  }
}

bool parse_kind(const std::string& s, OpKind& out) {
  for (int k = 0; k < kNumOpKinds; ++k) {
    if (op_kind_name(static_cast<OpKind>(k)) == s) {
      out = static_cast<OpKind>(k);
      return true;
    }
  }
  return false;
}

void read_kernel_csv(const std::string& file, const std::vector<std::string>& lines,
                     std::vector<KernelPoint>& out) {
  for (size_t i = 1; i < lines.size(); ++i) {
    if (trim(lines[i]).empty()) continue;
    const std::string where = file + ":" + std::to_string(i + 1);
    const std::vector<std::string> f = split(lines[i], ',');
    if (f.size() != 5)
      bad(where, "5 fields (op,kind,flops,bytes,time_us)", std::to_string(f.size()));
    KernelPoint p;
    p.where = where;
    p.op = f[0];
    if (p.op.empty()) bad(where, "an op label", "an empty field");
    if (!parse_kind(f[1], p.kind))
      bad(where, "kind gemm | attention | norm | elementwise | copy", "\"" + f[1] + "\"");
    p.flops = to_double(f[2], where, "flops >= 0");
    p.bytes = to_double(f[3], where, "bytes >= 0");
    p.time_us = to_double(f[4], where, "time_us > 0");
    if (p.flops < 0) bad(where, "flops >= 0", f[2]);
    if (p.bytes < 0) bad(where, "bytes >= 0", f[3]);
    if (!(p.flops > 0 || p.bytes > 0)) bad(where, "flops or bytes > 0", "both 0");
    if (!(p.time_us > 0)) bad(where, "time_us > 0", f[4]);
    out.push_back(p);
  }
}

void read_nccl_tests(const std::string& file, const std::vector<std::string>& lines,
                     std::vector<Point>& out) {
  const std::string name = std::filesystem::path(file).filename().string();
  std::string op;
  if (name.find("alltoall") != std::string::npos) op = "all_to_all";
  if (name.find("all_gather") != std::string::npos || name.find("allgather") != std::string::npos)
    op = "all_gather";
  if (name.find("all_reduce") != std::string::npos || name.find("allreduce") != std::string::npos)
    op = "all_reduce";
  if (op.empty())
    bad(file, "an nccl-tests file named after its test (alltoall, all_gather, all_reduce)",
        "\"" + name + "\"");
  int ranks = 0;
  for (const std::string& l : lines)
    if (l.rfind("#  Rank", 0) == 0 || l.rfind("#   Rank", 0) == 0) ++ranks;
  if (ranks < 2) bad(file, "at least two \"#  Rank\" lines", std::to_string(ranks));
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string t = trim(lines[i]);
    if (t.empty() || t[0] == '#') continue;
    const std::vector<std::string> w = words(t);
    // size count type redop root time algbw busbw #wrong (out-of-place), then in-place.
    if (w.size() < 9 || !std::isdigit(static_cast<unsigned char>(w[0][0]))) continue;
    const std::string where = file + ":" + std::to_string(i + 1);
    Point p;
    p.where = where;
    p.op = op;
    p.ranks = ranks;
    p.bytes = to_int(w[0], where, "a size in bytes >= 1", 1);
    p.time_us = to_double(w[5], where, "an out-of-place time in us");
    if (!(p.time_us > 0)) bad(where, "an out-of-place time > 0", w[5]);
    out.push_back(p);
  }
}

void read_points(const std::string& file, Measurements& m) {
  std::ifstream in(file);
  if (!in) throw InputError(file + ": cannot read the measurements file");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  if (lines.empty()) throw InputError(file + ": empty measurements file");
  std::vector<Point> pts;
  std::vector<KernelPoint> kernels;
  bool nccl_tests = false;
  for (const std::string& l : lines)
    nccl_tests = nccl_tests || l.find("nThread") != std::string::npos;
  if (nccl_tests)
    read_nccl_tests(file, lines, pts);
  else if (split(lines.front(), ',') ==
           std::vector<std::string>{"op", "kind", "flops", "bytes", "time_us"})
    read_kernel_csv(file, lines, kernels);
  else
    read_csv(file, lines, pts);
  if (pts.empty() && kernels.empty()) throw InputError(file + ": no measurements in the file");
  m.collectives.insert(m.collectives.end(), pts.begin(), pts.end());
  m.kernels.insert(m.kernels.end(), kernels.begin(), kernels.end());
}

// Messages on the critical path of one call (none for a single rank).
int messages(const Point& p) { return p.op == "all_reduce" ? 2 * (p.ranks - 1) : p.ranks - 1; }

// Runs one point on the first p ranks of the cluster; the collective's time in us.
double simulate(const Cluster& c, const LibraryModel& lib, double wire_bytes, const Point& pt) {
  const int p = pt.ranks;
  emu::EngineOptions eo;
  eo.workers = 1;
  eo.wire_bytes_per_element = wire_bytes;
  eo.all_to_all_algorithm = "library";
  eo.library = lib;
  eo.trace = false;
  emu::Engine engine(c.topology, c.network->clone_empty(), c.device, eo);
  const int world = c.topology.num_ranks();
  std::vector<SimTime> start(static_cast<size_t>(world)), end(static_cast<size_t>(world));
  const double elems = static_cast<double>(pt.bytes) / wire_bytes;
  const auto per_peer = std::max<std::int64_t>(1, std::llround(elems / p));
  const auto whole = std::max<std::int64_t>(1, std::llround(elems));
  engine.run([&](Communicator& comm) {
    auto sub = comm.split(comm.rank() < p ? 0 : 1, comm.rank());
    if (comm.rank() >= p) return;
    sub->barrier();
    start[static_cast<size_t>(comm.rank())] = sub->now();
    if (pt.op == "all_to_all") sub->all_to_all({}, {}, per_peer, "calibrate");
    if (pt.op == "all_gather") sub->all_gather({}, {}, per_peer, "calibrate");
    if (pt.op == "all_reduce") sub->all_reduce({}, whole, ReduceOp::kSum, "calibrate");
    end[static_cast<size_t>(comm.rank())] = sub->now();
  });
  const SimTime t0 = *std::min_element(start.begin(), start.begin() + p);
  const SimTime t1 = *std::max_element(end.begin(), end.begin() + p);
  return (t1 - t0).us();
}

struct Fit {
  double call_us = 0, message_us = 0, rms_log = 0;
  bool message_fitted = true;
};

// Least squares on log time of T0 + call + k message, both >= 0 (Gauss-Newton).
Fit fit(const std::vector<Point>& pts, const std::vector<double>& t0, double message_default) {
  Fit f;
  bool varied = false;
  for (const Point& p : pts) varied = varied || messages(p) != messages(pts.front());
  f.message_fitted = varied;
  f.message_us = varied ? 0 : message_default;
  // A start above zero: a single rank's T0 is zero, and log time needs a positive prediction.
  double min_us = pts.front().time_us;
  for (const Point& p : pts) min_us = std::min(min_us, p.time_us);
  f.call_us = 0.01 * min_us;
  for (int it = 0; it < 100; ++it) {
    double a11 = 0, a12 = 0, a22 = 0, b1 = 0, b2 = 0;
    for (size_t i = 0; i < pts.size(); ++i) {
      const double k = messages(pts[i]);
      const double pred = t0[i] + f.call_us + k * f.message_us;
      const double r = std::log(pred) - std::log(pts[i].time_us);
      const double j1 = 1 / pred, j2 = k / pred;
      a11 += j1 * j1;
      a12 += j1 * j2;
      a22 += j2 * j2;
      b1 += j1 * r;
      b2 += j2 * r;
    }
    double d1 = 0, d2 = 0;
    const double det = a11 * a22 - a12 * a12;
    if (varied && det > 1e-12 * a11 * a22) {
      d1 = (a22 * b1 - a12 * b2) / det;
      d2 = (a11 * b2 - a12 * b1) / det;
    } else {
      d1 = b1 / a11;
    }
    f.call_us = std::max(0.0, f.call_us - d1);
    // Keep every prediction positive (a single rank has nothing but the call).
    for (size_t i = 0; i < pts.size(); ++i)
      if (t0[i] + f.call_us <= 0) f.call_us = 1e-6;
    f.message_us = std::max(0.0, f.message_us - d2);
    if (std::abs(d1) + std::abs(d2) < 1e-9) break;
  }
  return f;
}

// ---- kernels ----

struct KernelFit {
  double launch_s = 0;
  std::array<double, kNumOpKinds> eff_c{}, eff_m{};
  std::array<bool, kNumOpKinds> fitted_c{}, fitted_m{};
  double rms_log = 0;
};

double kernel_time_s(const RooflineParams& d, const KernelFit& f, const KernelPoint& p) {
  const auto k = static_cast<size_t>(p.kind);
  return std::max(p.flops / (d.peak_flops_per_s * f.eff_c[k]),
                  p.bytes / (d.hbm_bytes_per_s * f.eff_m[k])) +
         f.launch_s;
}

double log_error_sq(const RooflineParams& d, const KernelFit& f,
                    const std::vector<KernelPoint>& pts) {
  double sq = 0;
  for (const KernelPoint& p : pts) {
    const double e = std::log(kernel_time_s(d, f, p) / (p.time_us * 1e-6));
    sq += e * e;
  }
  return sq;
}

// Golden-section minimum of g on [lo, hi].
double golden(const std::function<double(double)>& g, double lo, double hi) {
  const double r = (std::sqrt(5.0) - 1) / 2;
  double a = lo, b = hi, c = b - r * (b - a), d = a + r * (b - a);
  double gc = g(c), gd = g(d);
  for (int i = 0; i < 80 && b - a > 1e-12 * std::max(1.0, std::abs(b)); ++i) {
    if (gc < gd) {
      b = d;
      d = c;
      gd = gc;
      c = b - r * (b - a);
      gc = g(c);
    } else {
      a = c;
      c = d;
      gc = gd;
      d = a + r * (b - a);
      gd = g(d);
    }
  }
  return (a + b) / 2;
}

// Least squares on log time by coordinate descent on the launch overhead and each kind's
// efficiencies (searched in log space within (0, 1], the range a preset accepts). Each point is
// classed compute- or memory-bound, first under the preset's efficiencies, and fitted on that
// term alone; then re-classed under the fit, until the classes hold. (A kind whose points all
// have one arithmetic intensity cannot tell the two bounds apart: the class the preset gives
// decides.) An efficiency no point is bound by keeps the preset's value.
KernelFit fit_kernels(const RooflineParams& d, const std::vector<KernelPoint>& pts) {
  KernelFit f;
  f.eff_c = d.compute_efficiency;
  f.eff_m = d.memory_efficiency;
  f.launch_s = d.launch_overhead.seconds();
  double min_s = pts.front().time_us * 1e-6;
  for (const KernelPoint& p : pts) min_s = std::min(min_s, p.time_us * 1e-6);
  f.launch_s = std::min(f.launch_s, 0.5 * min_s);
  auto compute_bound = [&](const KernelFit& t, const KernelPoint& p) {
    const auto k = static_cast<size_t>(p.kind);
    return p.flops / (d.peak_flops_per_s * t.eff_c[k]) >=
           p.bytes / (d.hbm_bytes_per_s * t.eff_m[k]);
  };
  std::vector<bool> cls(pts.size());
  for (size_t i = 0; i < pts.size(); ++i) cls[i] = compute_bound(f, pts[i]);
  auto error = [&](const KernelFit& t) {
    double sq = 0;
    for (size_t i = 0; i < pts.size(); ++i) {
      const KernelPoint& p = pts[i];
      const auto k = static_cast<size_t>(p.kind);
      const double s = (cls[i] ? p.flops / (d.peak_flops_per_s * t.eff_c[k])
                               : p.bytes / (d.hbm_bytes_per_s * t.eff_m[k])) +
                       t.launch_s;
      const double e = std::log(s / (p.time_us * 1e-6));
      sq += e * e;
    }
    return sq;
  };
  const double lo = std::log(1e-4), hi = 0;
  for (int round = 0; round < 10; ++round) {
    f.fitted_c = {};
    f.fitted_m = {};
    for (size_t i = 0; i < pts.size(); ++i)
      (cls[i] ? f.fitted_c : f.fitted_m)[static_cast<size_t>(pts[i].kind)] = true;
    for (int sweep = 0; sweep < 60; ++sweep) {
      const double before = error(f);
      f.launch_s = golden(
          [&](double x) {
            KernelFit t = f;
            t.launch_s = x;
            return error(t);
          },
          0, 0.999 * min_s);
      for (size_t k = 0; k < f.eff_c.size(); ++k) {
        for (const bool compute : {true, false}) {
          if (!(compute ? f.fitted_c : f.fitted_m)[k]) continue;
          const double x = golden(
              [&](double log_eff) {
                KernelFit t = f;
                (compute ? t.eff_c : t.eff_m)[k] = std::exp(log_eff);
                return error(t);
              },
              lo, hi);
          (compute ? f.eff_c : f.eff_m)[k] = std::exp(x);
        }
      }
      if (before - error(f) < 1e-14) break;
    }
    bool changed = false;
    for (size_t i = 0; i < pts.size(); ++i) {
      const bool c = compute_bound(f, pts[i]);
      changed = changed || c != cls[i];
      cls[i] = c;
    }
    if (!changed) break;
  }
  f.rms_log = std::sqrt(log_error_sq(d, f, pts) / static_cast<double>(pts.size()));
  return f;
}

std::string fmt(double v);

// The fitted roofline per point, and each op's points as a measured table.
std::string calibrate_kernels(const Cluster& c, const std::vector<KernelPoint>& pts,
                              const std::string& sources) {
  const RooflineParams& d = c.device_params;
  const KernelFit f = fit_kernels(d, pts);
  std::printf("# kernels: %zu points; fitted roofline: launch_overhead_ns = %.0f", pts.size(),
              f.launch_s * 1e9);
  for (int k = 0; k < kNumOpKinds; ++k) {
    const auto i = static_cast<size_t>(k);
    if (f.fitted_c[i])
      std::printf(", compute_efficiency.%s = %s",
                  std::string(op_kind_name(static_cast<OpKind>(k))).c_str(),
                  fmt(f.eff_c[i]).c_str());
    if (f.fitted_m[i])
      std::printf(", memory_efficiency.%s = %s",
                  std::string(op_kind_name(static_cast<OpKind>(k))).c_str(),
                  fmt(f.eff_m[i]).c_str());
  }
  std::printf("\n%-18s %-11s %12s %12s %12s %12s %8s\n", "op", "kind", "flops", "bytes",
              "measured_us", "roofline_us", "error");
  for (const KernelPoint& p : pts) {
    const double pred = kernel_time_s(d, f, p) * 1e6;
    std::printf("%-18s %-11s %12.4g %12.4g %12.2f %12.2f %7.1f%%\n", p.op.c_str(),
                std::string(op_kind_name(p.kind)).c_str(), p.flops, p.bytes, p.time_us, pred,
                100.0 * (pred - p.time_us) / p.time_us);
  }
  std::printf("# rms error of log time (fitted roofline): %.4f\n", f.rms_log);

  std::ostringstream os;
  os << "\n# Kernels: roofline fitted to " << pts.size() << " points (rms error of log time "
     << fmt(f.rms_log) << "); efficiencies no point was bound by are the preset's.\n";
  os << "[cluster.device]\nlaunch_overhead_ns = " << std::llround(f.launch_s * 1e9) << "\n";
  for (const auto& [table, fitted, eff] :
       {std::tuple{"compute_efficiency", &f.fitted_c, &f.eff_c},
        std::tuple{"memory_efficiency", &f.fitted_m, &f.eff_m}}) {
    bool any = false;
    for (bool b : *fitted) any = any || b;
    if (!any) continue;
    os << "\n[cluster.device." << table << "]\n";
    for (int k = 0; k < kNumOpKinds; ++k)
      if ((*fitted)[static_cast<size_t>(k)])
        os << op_kind_name(static_cast<OpKind>(k)) << " = " << fmt((*eff)[static_cast<size_t>(k)])
           << "\n";
  }
  // Each op's measured points (equal FLOP counts averaged in log time) as its table.
  std::map<std::string, std::map<double, std::vector<double>>> tables;
  for (const KernelPoint& p : pts)
    if (p.flops > 0) tables[p.op][p.flops].push_back(std::log(p.time_us));
  for (const auto& [op, by_flops] : tables) {
    os << "\n[cluster.device.kernels." << op << "]\nflops = [";
    std::string sep;
    for (const auto& [fl, logs] : by_flops) {
      os << sep << fmt(fl);
      sep = ", ";
    }
    os << "]\ntime_us = [";
    sep.clear();
    for (const auto& [fl, logs] : by_flops) {
      double s = 0;
      for (double l : logs) s += l;
      os << sep << fmt(std::exp(s / static_cast<double>(logs.size())));
      sep = ", ";
    }
    os << "]\nsource = \"" << sources << "\"\n";
  }
  return os.str();
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void run_calibrate(const CalibrateOptions& o) {
  Measurements m;
  for (const std::string& f : o.files) read_points(f, m);
  std::vector<Point> pts;
  for (const Point& p : m.collectives)
    if (p.bytes <= o.max_bytes) pts.push_back(p);
  if (pts.empty() && m.kernels.empty())
    throw InputError("calibrate: no measurement of at most --max-bytes bytes");
  Config cfg = load_cluster_config(o.cluster, config_dir() / "clusters");
  for (const std::string& s : o.sets) cfg.set(s);
  const Cluster c = load_cluster(cfg, config_dir() / "clusters");
  for (const Point& p : pts)
    if (p.ranks > c.topology.num_ranks())
      throw InputError(p.where + ": " + std::to_string(p.ranks) + " ranks, but cluster '" + c.name +
                       "' has " + std::to_string(c.topology.num_ranks()) +
                       " (set cluster.nodes higher)");
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  std::ostringstream os;
  os << "# Written by cocodiff calibrate on " << date << ": least squares on log time over\n";
  for (const std::string& f : o.files) os << "#   " << f << "\n";
  os << "# on cluster " << c.name << " (" << c.source << ").\n";
  os << "[cluster]\npreset = \"" << c.source << "\"\n";
  for (const std::string& s : o.sets)
    if (s.rfind("cluster.", 0) == 0) os << "# with --set " << s << "\n";
  std::printf("# cocodiff calibrate: cluster %s (%s), library %s\n", c.name.c_str(),
              c.source.c_str(), c.library.name.c_str());

  if (!pts.empty()) {
    LibraryModel base = c.library;
    base.call_overhead = SimTime{};
    base.message_overhead = SimTime{};
    std::vector<double> t0;
    t0.reserve(pts.size());
    for (const Point& p : pts) t0.push_back(simulate(c, base, o.wire_bytes, p));
    const Fit f = fit(pts, t0, c.library.message_overhead.us());
    LibraryModel fitted = base;
    fitted.call_overhead = SimTime::from_seconds(f.call_us * 1e-6);
    fitted.message_overhead = SimTime::from_seconds(f.message_us * 1e-6);

    std::printf(
        "# collectives: %zu points; fit: call_overhead_us = %s, message_overhead_us = %s%s\n",
        pts.size(), fmt(f.call_us).c_str(), fmt(f.message_us).c_str(),
        f.message_fitted ? "" : " (kept: every point has the same message count)");
    std::printf("%-11s %6s %12s %12s %12s %8s\n", "op", "ranks", "bytes", "measured_us",
                "predicted_us", "error");
    double sq = 0;
    for (const Point& p : pts) {
      const double pred = simulate(c, fitted, o.wire_bytes, p);
      const double e = std::log(pred / p.time_us);
      sq += e * e;
      std::printf("%-11s %6d %12lld %12.2f %12.2f %7.1f%%\n", p.op.c_str(), p.ranks,
                  static_cast<long long>(p.bytes), p.time_us, pred,
                  100.0 * (pred - p.time_us) / p.time_us);
    }
    const double rms = std::sqrt(sq / static_cast<double>(pts.size()));
    std::printf("# rms error of log time: %.4f\n", rms);
    os << "\n# Collectives: " << pts.size() << " points, rms error of log time " << fmt(rms)
       << ".\n";
    if (!f.message_fitted)
      os << "# message_overhead_us is the preset's: every point had the same message count.\n";
    os << "[cluster.library]\ncall_overhead_us = " << fmt(f.call_us)
       << "\nmessage_overhead_us = " << fmt(f.message_us) << "\n";
  }
  if (!m.kernels.empty()) {
    std::string sources;
    for (const std::string& f : o.files) sources += (sources.empty() ? "" : ", ") + f;
    os << calibrate_kernels(c, m.kernels, sources + " (cocodiff calibrate " + date + ")");
  }
  auto lock = hold_interrupts();
  write_file_atomic(o.out, os.str());
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "fit the collective library's software costs and the device's roofline and kernel tables "
      "to measured times");
  cmd->add_option("files", o->files,
                  "collectives: CSV (op,ranks,bytes,time_us) or nccl-tests output; kernels: CSV "
                  "(op,kind,flops,bytes,time_us)")
      ->required();
  cmd->add_option("--cluster", o->cluster, "cluster preset name or file the points ran on")
      ->required();
  cmd->add_option("--set", o->sets, "override a cluster key, e.g. --set cluster.nodes=2");
  cmd->add_option("--out", o->out, "the overlay TOML to write")->required();
  cmd->add_option("--max-bytes", o->max_bytes, "use only points of at most this many bytes")
      ->transform(CLI::AsSizeValue(false));
  cmd->callback([o] { run_calibrate(*o); });
}

}  // namespace cocodiff::apps
