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

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "apps/run_plan.hpp"
#include "core/atomic_file.hpp"
#include "core/errors.hpp"
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

std::vector<Point> read_points(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw InputError(file + ": cannot read the measurements file");
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  if (lines.empty()) throw InputError(file + ": empty measurements file");
  std::vector<Point> pts;
  bool nccl_tests = false;
  for (const std::string& l : lines)
    nccl_tests = nccl_tests || l.find("nThread") != std::string::npos;
  if (nccl_tests)
    read_nccl_tests(file, lines, pts);
  else
    read_csv(file, lines, pts);
  if (pts.empty()) throw InputError(file + ": no measurements in the file");
  return pts;
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

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void run_calibrate(const CalibrateOptions& o) {
  std::vector<Point> pts;
  for (const std::string& f : o.files) {
    for (const Point& p : read_points(f))
      if (p.bytes <= o.max_bytes) pts.push_back(p);
  }
  if (pts.empty()) throw InputError("calibrate: no measurement of at most --max-bytes bytes");
  Config cfg = load_cluster_config(o.cluster, config_dir() / "clusters");
  for (const std::string& s : o.sets) cfg.set(s);
  const Cluster c = load_cluster(cfg, config_dir() / "clusters");
  for (const Point& p : pts)
    if (p.ranks > c.topology.num_ranks())
      throw InputError(p.where + ": " + std::to_string(p.ranks) + " ranks, but cluster '" + c.name +
                       "' has " + std::to_string(c.topology.num_ranks()) +
                       " (set cluster.nodes higher)");
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

  std::printf("# cocodiff calibrate: %zu points, cluster %s (%s), library %s\n", pts.size(),
              c.name.c_str(), c.source.c_str(), c.library.name.c_str());
  std::printf("# fit: call_overhead_us = %s, message_overhead_us = %s%s\n", fmt(f.call_us).c_str(),
              fmt(f.message_us).c_str(),
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

  std::ostringstream os;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  os << "# Written by cocodiff calibrate on " << date << ": least squares on log time over "
     << pts.size() << " points of\n";
  for (const std::string& f : o.files) os << "#   " << f << "\n";
  os << "# on cluster " << c.name << " (" << c.source << "), rms error of log time " << fmt(rms)
     << ".\n";
  if (!f.message_fitted)
    os << "# message_overhead_us is the preset's: every point had the same message count.\n";
  os << "[cluster]\npreset = \"" << c.source << "\"\n";
  for (const std::string& s : o.sets)
    if (s.rfind("cluster.", 0) == 0) os << "# with --set " << s << "\n";
  os << "\n[cluster.library]\ncall_overhead_us = " << fmt(f.call_us)
     << "\nmessage_overhead_us = " << fmt(f.message_us) << "\n";
  auto lock = hold_interrupts();
  write_file_atomic(o.out, os.str());
}

}  // namespace

void add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate", "fit the collective library's software costs to measured collective times");
  cmd->add_option("files", o->files, "CSV (op,ranks,bytes,time_us) or nccl-tests output files")
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
