#include "emulator/timeline_plot.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <tuple>

#include "core/atomic_file.hpp"
#include "core/errors.hpp"

extern char** environ;

namespace cocodiff::emu {

namespace {

using Rgb = std::array<double, 3>;

// Okabe-Ito colours (distinguishable with colour-blindness); tiers innermost first.
constexpr Rgb kCompute = {0x00, 0x72, 0xB2};
constexpr Rgb kWait = {0xA5, 0x0F, 0x15};
constexpr std::array<Rgb, 6> kTier = {{{0x00, 0x9E, 0x73},
                                       {0xE6, 0x9F, 0x00},
                                       {0x7B, 0x32, 0x94},
                                       {0x56, 0xB4, 0xE9},
                                       {0xF0, 0xE4, 0x42},
                                       {0x00, 0x00, 0x00}}};
constexpr Rgb kIdle = {0xF2, 0xF2, 0xF2};
constexpr Rgb kGap = {0xFF, 0xFF, 0xFF};
constexpr int kRowsPerLane = 5;  // compute, compute, transfers, transfers, gap

std::string hex(const Rgb& c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02X%02X%02X", static_cast<unsigned>(c[0]),
                static_cast<unsigned>(c[1]), static_cast<unsigned>(c[2]));
  return buf;
}

std::string level_letter(const Topology& topo, int k) {
  const std::string& n = topo.level(k).name;
  return n.empty() ? "l" + std::to_string(k) : n.substr(0, 1);
}

// Pixel rows per lane in a panel; lanes get thinner as there are more of them.
int lane_px(int lanes) {
  if (lanes <= 12) return 24;
  if (lanes <= 24) return 16;
  if (lanes <= 36) return 13;
  return 11;
}

constexpr int kHeaderPx = 78;      // title and legend
constexpr int kPanelExtraPx = 78;  // a panel's title, x tics and x label
constexpr int kLeftPx = 110, kRightPx = 24;

// The zoom window: about `events` compute spans of rank 0 from the middle of the run.
bool zoom_window(const RunResult& r, int events, SimTime& begin, SimTime& end) {
  std::vector<SimTime> starts;
  for (const TraceEvent& e : r.trace)
    if (e.rank == 0 && e.kind == TraceEvent::Kind::kCompute) starts.push_back(e.start);
  if (events < 1 || starts.size() <= 2 * static_cast<size_t>(events)) return false;
  std::sort(starts.begin(), starts.end());
  const size_t i0 = starts.size() / 2;
  begin = starts[i0];
  end = starts[i0 + static_cast<size_t>(events)];
  return end > begin;
}

void add_interval(std::vector<double>& bins, double begin_ns, double width_ns, double s, double e,
                  double weight) {
  const int n = static_cast<int>(bins.size());
  const double end_ns = begin_ns + width_ns * n;
  s = std::max(s, begin_ns);
  e = std::min(e, end_ns);
  if (e <= s) return;
  int b0 = static_cast<int>((s - begin_ns) / width_ns);
  int b1 = static_cast<int>((e - begin_ns) / width_ns);
  b0 = std::clamp(b0, 0, n - 1);
  b1 = std::clamp(b1, 0, n - 1);
  for (int b = b0; b <= b1; ++b) {
    const double lo = std::max(s, begin_ns + width_ns * b);
    const double hi = std::min(e, begin_ns + width_ns * (b + 1));
    if (hi > lo) bins[static_cast<size_t>(b)] += weight * (hi - lo) / width_ns;
  }
}

Rgb mix(const std::vector<std::pair<double, Rgb>>& parts) {
  double total = 0;
  for (const auto& p : parts) total += p.first;
  const double scale = total > 1 ? 1 / total : 1;
  Rgb c{};
  for (int i = 0; i < 3; ++i) {
    double v = (1 - std::min(total, 1.0)) * kIdle[static_cast<size_t>(i)];
    for (const auto& p : parts) v += p.first * scale * p.second[static_cast<size_t>(i)];
    c[static_cast<size_t>(i)] = v;
  }
  return c;
}

// The image of one panel: kRowsPerLane pixel rows per lane, `bins` pixels per row, RGB bytes.
std::string panel_image(const TimelineBins& b, int tiers) {
  std::string img;
  img.reserve(static_cast<size_t>(b.lanes) * kRowsPerLane * static_cast<size_t>(b.bins) * 3);
  auto put = [&img](const Rgb& c) {
    for (double v : c) img.push_back(static_cast<char>(std::lround(std::clamp(v, 0.0, 255.0))));
  };
  std::vector<std::pair<double, Rgb>> parts;
  for (int l = 0; l < b.lanes; ++l) {
    const auto lz = static_cast<size_t>(l);
    for (int row = 0; row < kRowsPerLane; ++row) {
      for (int i = 0; i < b.bins; ++i) {
        const auto iz = static_cast<size_t>(i);
        parts.clear();
        if (row < 2) {
          parts.push_back({b.compute[lz][iz], kCompute});
          parts.push_back({b.wait[lz][iz], kWait});
          put(mix(parts));
        } else if (row < 4) {
          for (int t = 0; t < tiers; ++t)
            parts.push_back({b.tier[static_cast<size_t>(t)][lz][iz],
                             kTier[static_cast<size_t>(t) % kTier.size()]});
          put(mix(parts));
        } else {
          put(kGap);
        }
      }
    }
  }
  return img;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Runs `argv` in the directory `cwd` with stdin from /dev/null and stdout/stderr into `log`;
// returns the exit status (or -1 when it could not start, with `error` set).
int run_process(const std::vector<std::string>& argv, const std::filesystem::path& cwd,
                const std::filesystem::path& log, std::string& error) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    error = argv[0] + ": cannot start: " + std::strerror(rc);
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      error = "waitpid failed: " + std::string(std::strerror(errno));
      return -1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  error = argv[0] + " was killed by signal " + std::to_string(WTERMSIG(status));
  return -1;
}

std::string read_tail(const std::filesystem::path& p, size_t max_chars) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > max_chars) s = "..." + s.substr(s.size() - max_chars);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

constexpr const char* kScratchPrefix = "cocodiff-timeline-";

// Removes the scratch directories of processes that no longer exist (killed with SIGKILL, which
// no destructor survives): "cocodiff-timeline-PID-XXXXXX" in the temporary directory.
void remove_stale_scratch(const std::filesystem::path& tmp) {
  std::error_code ec;
  const std::string prefix = kScratchPrefix;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid > 0 && end != nullptr && *end == '-' && pid != ::getpid() &&
        ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      std::filesystem::remove_all(e.path(), ec);
  }
}

// A scratch directory removed on scope exit.
class TempDir {
 public:
  TempDir() {
    std::error_code ec;
    const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) return;
    remove_stale_scratch(tmp);
    std::string tmpl = tmp / (std::string(kScratchPrefix) + std::to_string(::getpid()) + "-XXXXXX");
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace

TimelineLayout timeline_layout(const Topology& topo, const TimelineOptions& options) {
  TimelineLayout out;
  const int ranks = topo.num_ranks();
  const int max_lanes = std::max(1, options.max_lanes);
  // Group adjacent tiles level by level (tile -> GPU -> node), and within the level that gets
  // under max_lanes take the smallest divisor of its size that does.
  int group = 1, level = -1, per = 1;  // per: units of `level` per lane
  for (int k = 0; k < topo.num_levels(); ++k) {
    if ((ranks + group - 1) / group <= max_lanes) break;
    const int size = topo.level(k).size;
    const int rest = (ranks + group - 1) / group;
    int m = size;
    for (int d = 1; d <= size; ++d)
      if (size % d == 0 && (rest + d - 1) / d <= max_lanes) {
        m = d;
        break;
      }
    level = k;
    per = m;
    group *= m;
    if (m < size) break;
  }
  if ((ranks + group - 1) / group > max_lanes) group = (ranks + max_lanes - 1) / max_lanes;
  out.group = group;
  out.lanes = (ranks + group - 1) / group;
  for (int l = 0; l < out.lanes; ++l) {
    const int first = l * group;
    const int last = std::min(ranks, first + group) - 1;
    std::string name;
    for (int k = topo.num_levels() - 1; k >= 0; --k) {
      if (k < level || (k == level && per == topo.level(k).size)) break;
      if (!name.empty()) name += " ";
      name += level_letter(topo, k) + std::to_string(topo.coord(first, k));
      if (k == level && per > 1) name += "-" + std::to_string(topo.coord(last, k));
    }
    if (name.empty() || (level < 0 && group > 1))
      name = "r" + std::to_string(first) + (last > first ? "-" + std::to_string(last) : "");
    out.lane_names.push_back(name);
  }
  out.width_px = std::max(400, options.width_px);
  const int panel = out.lanes * lane_px(out.lanes) + kPanelExtraPx;
  out.height_px = kHeaderPx + 2 * panel;
  return out;
}

TimelineBins bin_timeline(const RunResult& result, const Topology& topo,
                          const TimelineLayout& layout, SimTime begin, SimTime end, int bins) {
  TimelineBins b;
  b.begin = begin;
  b.end = end;
  b.bins = std::max(1, bins);
  b.lanes = layout.lanes;
  const auto lanes = static_cast<size_t>(layout.lanes);
  const std::vector<double> zero(static_cast<size_t>(b.bins), 0.0);
  b.compute.assign(lanes, zero);
  b.wait.assign(lanes, zero);
  b.tier.assign(static_cast<size_t>(topo.num_tiers()),
                std::vector<std::vector<double>>(lanes, zero));
  const double begin_ns = static_cast<double>(begin.ns());
  const double width_ns = std::max(1e-9, static_cast<double>((end - begin).ns()) / b.bins);
  const int ranks = topo.num_ranks();
  auto members = [&](int lane) {
    return std::min(ranks, (lane + 1) * layout.group) - lane * layout.group;
  };
  struct Span {
    int rank, tier;
    std::int64_t start, end;
  };
  std::vector<Span> flows;
  for (const TraceEvent& e : result.trace) {
    if (e.rank < 0 || e.rank >= ranks) continue;
    const int lane = e.rank / layout.group;
    const double w = 1.0 / members(lane);
    const auto s = static_cast<double>(e.start.ns()), t = static_cast<double>(e.end.ns());
    if (e.kind == TraceEvent::Kind::kCompute)
      add_interval(b.compute[static_cast<size_t>(lane)], begin_ns, width_ns, s, t, w);
    else if (e.kind == TraceEvent::Kind::kWait)
      add_interval(b.wait[static_cast<size_t>(lane)], begin_ns, width_ns, s, t, w);
    else if (e.tier >= 0 && e.tier < topo.num_tiers() && e.end > begin && e.start < end)
      flows.push_back({e.rank, e.tier, e.start.ns(), e.end.ns()});
  }
  // A tile's concurrent transfers on one tier count once: merge them into their union.
  std::sort(flows.begin(), flows.end(), [](const Span& x, const Span& y) {
    return std::tie(x.rank, x.tier, x.start) < std::tie(y.rank, y.tier, y.start);
  });
  for (size_t i = 0; i < flows.size();) {
    const Span& f = flows[i];
    std::int64_t s = f.start, t = f.end;
    size_t j = i + 1;
    for (; j < flows.size() && flows[j].rank == f.rank && flows[j].tier == f.tier; ++j) {
      if (flows[j].start > t) {
        const int lane = f.rank / layout.group;
        add_interval(b.tier[static_cast<size_t>(f.tier)][static_cast<size_t>(lane)], begin_ns,
                     width_ns, static_cast<double>(s), static_cast<double>(t), 1.0 / members(lane));
        s = flows[j].start;
      }
      t = std::max(t, flows[j].end);
    }
    const int lane = f.rank / layout.group;
    add_interval(b.tier[static_cast<size_t>(f.tier)][static_cast<size_t>(lane)], begin_ns, width_ns,
                 static_cast<double>(s), static_cast<double>(t), 1.0 / members(lane));
    i = j;
  }
  return b;
}

std::vector<TimelineLabel> timeline_labels(const RunResult& result, SimTime begin, SimTime end,
                                           int width_px, std::vector<std::string>* names) {
  std::vector<TimelineLabel> labels;
  if (end <= begin) return labels;
  const double px_per_ns = width_px / static_cast<double>((end - begin).ns());
  constexpr double kCharPx = 6.5;  // sans 7 pt, about
  std::vector<const TraceEvent*> spans;
  for (const TraceEvent& e : result.trace)
    if (e.rank == 0 && e.kind != TraceEvent::Kind::kWait && e.end > begin && e.start < end)
      spans.push_back(&e);
  std::stable_sort(spans.begin(), spans.end(),
                   [](const TraceEvent* a, const TraceEvent* b) { return a->start < b->start; });
  std::array<double, 2> row_free_px = {-1e300, -1e300};  // compute row, transfer row
  for (const TraceEvent* e : spans) {
    const std::string& text = result.labels.at(e->label);
    if (names != nullptr && std::find(names->begin(), names->end(), text) == names->end())
      names->push_back(text);
    const SimTime s = std::max(e->start, begin), t = std::min(e->end, end);
    const double x0 = static_cast<double>((s - begin).ns()) * px_per_ns;
    const double x1 = static_cast<double>((t - begin).ns()) * px_per_ns;
    const double need = kCharPx * static_cast<double>(text.size()) + 4;
    const bool send = e->kind == TraceEvent::Kind::kFlow;
    double& free_px = row_free_px[send ? 1 : 0];
    if (x1 - x0 < need || x0 < free_px) continue;
    labels.push_back({s + SimTime::from_ns((t - s).ns() / 2), 0, send, text});
    free_px = x1;
  }
  return labels;
}

std::filesystem::path find_gnuplot() {
  if (const char* env = std::getenv("COCODIFF_GNUPLOT"); env != nullptr) {
    std::filesystem::path p(env);
    return ::access(p.c_str(), X_OK) == 0 ? p : std::filesystem::path();
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::filesystem::path p = std::filesystem::path(dir) / "gnuplot";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

namespace {

constexpr const char* kNoGnuplot =
    "gnuplot not found (install the Debian package gnuplot-nox, or set COCODIFF_GNUPLOT)";

// The image a job's script draws, in its scratch directory.
constexpr const char* kPlotPng = "plot.png";

// Runs `gnuplot` (find_gnuplot's, not empty) in `dir` on `script`, written there beside the data
// it reads by bare name. No path reaches the script. Empty on success.
std::string run_gnuplot_in(const std::filesystem::path& gnuplot, const std::filesystem::path& dir,
                           const std::string& script) {
  const std::filesystem::path file = dir / "plot.gp";
  {
    std::ofstream out(file);
    out << script;
    if (!out) return "cannot write the gnuplot script in " + dir.string();
  }
  std::string error;
  const std::filesystem::path log = dir / "gnuplot.log";
  const int rc = run_process({gnuplot.string(), "plot.gp"}, dir, log, error);
  if (rc == 0) return {};
  if (error.empty())
    error =
        gnuplot.string() + " failed (exit code " + std::to_string(rc) + "): " + read_tail(log, 600);
  return error;
}

// One panel of the timeline image: its data file, title and window.
struct Panel {
  std::string file, title;
  SimTime begin, end;
};

// The whole run, and the zoom window when there is one; each panel's pixels written to its
// file in `dir`. Empty on success.
std::string write_panels(const RunResult& result, const Topology& topo,
                         const TimelineLayout& layout, const TimelineOptions& options,
                         const std::filesystem::path& dir, SimTime end, int bins,
                         std::vector<Panel>& panels) {
  panels = {{"full.rgb", "whole run", SimTime(), end}};
  SimTime z0, z1;
  if (zoom_window(result, options.zoom_events, z0, z1))
    panels.push_back({"zoom.rgb",
                      "zoom: " + fmt(z0.seconds() * 1e3) + " to " + fmt(z1.seconds() * 1e3) +
                          " ms (about " + std::to_string(options.zoom_events) +
                          " compute spans of rank 0 from mid-run)",
                      z0, z1});
  for (const Panel& p : panels) {
    const TimelineBins b = bin_timeline(result, topo, layout, p.begin, p.end, bins);
    std::ofstream out(dir / p.file, std::ios::binary);
    const std::string img = panel_image(b, topo.num_tiers());
    out.write(img.data(), static_cast<std::streamsize>(img.size()));
    if (!out) return "cannot write the plot's data in " + dir.string();
  }
  return {};
}

// The script's page: terminal, title, run statistics, key, lanes and margins.
void page_header(std::ostream& s, const RunResult& result, const Topology& topo,
                 const TimelineLayout& layout, const TimelineOptions& options, SimTime end) {
  const double H = layout.height_px, W = layout.width_px;
  s << "set multiplot\n";
  const std::string head = options.title.empty() ? std::string("cocodiff run") : options.title;
  char stats[256];
  std::snprintf(stats, sizeof stats, "virtual time %.3f ms, %d tiles%s, %llu trace events%s",
                end.seconds() * 1e3, topo.num_ranks(),
                layout.group > 1 ? (", " + std::to_string(layout.group) + " per lane").c_str() : "",
                static_cast<unsigned long long>(result.trace.size()),
                result.trace_truncated ? " (trace truncated: later events missing)" : "");
  s << "set label 1 " << gnuplot_string(head) << " at screen 0.5, screen " << fmt(1 - 16 / H)
    << " center font 'sans,12'\n"
    << "set label 2 " << gnuplot_string(stats) << " at screen 0.5, screen " << fmt(1 - 34 / H)
    << " center\n";
  // The legend: one key entry per colour, in a row under the title.
  s << "set key at screen 0.5, screen " << fmt(1 - 44 / H)
    << " center top horizontal maxrows 1 samplen 2 width 1 box lc rgb '#BBBBBB'\n"
    << "set style fill solid 1.0 noborder\n"
    << "set xlabel 'virtual time (ms)' offset 0,0.6\n"
    << "set ytics scale 0 font 'sans,8' (";
  for (int l = 0; l < layout.lanes; ++l)
    s << (l ? ", " : "") << gnuplot_string(layout.lane_names[static_cast<size_t>(l)]) << " "
      << fmt(l + 0.4);
  s << ")\n"
    << "set yrange [" << layout.lanes << ":0]\n"
    << "set xtics nomirror out\nset mxtics\nset border 3\nset grid xtics lc rgb '#DDDDDD'\n"
    << "set lmargin at screen " << fmt(kLeftPx / W) << "\nset rmargin at screen "
    << fmt(1 - kRightPx / W) << "\n";
}

// The key's entries: one per colour.
std::string key_entries(const Topology& topo) {
  std::string keys;
  keys += ", keyentry with boxes lc rgb '" + hex(kCompute) + "' title 'compute'";
  keys += ", keyentry with boxes lc rgb '" + hex(kWait) + "' title 'exposed comm (wait)'";
  for (int t = 0; t < topo.num_tiers(); ++t)
    keys += ", keyentry with boxes lc rgb '" + hex(kTier[static_cast<size_t>(t) % kTier.size()]) +
            "' title " + gnuplot_string("send: " + topo.tier_name(t));
  keys += ", keyentry with boxes lc rgb '" + hex(kIdle) + "' title 'idle'";
  return keys;
}

// Panel i of the script. The first carries the key and frames the zoom window; the zoom panel
// names the first tile's operations where they are wide enough.
void panel_plot(std::ostream& s, const std::vector<Panel>& panels, size_t i,
                const TimelineLayout& layout, int bins, const std::string& keys,
                const std::vector<TimelineLabel>& labels, const std::vector<SimTime>& steps) {
  const Panel& p = panels[i];
  const int panel_px = layout.lanes * lane_px(layout.lanes) + kPanelExtraPx;
  const double H = layout.height_px;
  const double top = kHeaderPx + static_cast<double>(i) * panel_px + 22;
  const double bottom = kHeaderPx + static_cast<double>(i + 1) * panel_px - 40;
  const double x0 = p.begin.seconds() * 1e3, x1 = p.end.seconds() * 1e3;
  const double dx = (x1 - x0) / bins;
  s << "set tmargin at screen " << fmt(1 - top / H) << "\nset bmargin at screen "
    << fmt(1 - bottom / H) << "\n"
    << "set title "
    << gnuplot_string(i == 0
                          ? p.title + " (each lane: compute stream above, its sends below" +
                                (steps.size() > 1 ? "; dashed: each step's start, numbered)" : ")")
                          : p.title)
    << (i == 0 && steps.size() > 1 ? " offset 0,0.2\n" : " offset 0,-0.5\n") << "set xrange ["
    << fmt(x0) << ":" << fmt(x1) << "]\n";
  if (i == 0 && panels.size() > 1)
    s << "set object 1 rect from " << fmt(panels[1].begin.seconds() * 1e3) << ", graph 0 to "
      << fmt(panels[1].end.seconds() * 1e3)
      << ", graph 1 front fillstyle empty border lc rgb '#000000' lw 1.5\n";
  else
    s << "unset object 1\n";
  // The whole run: a line at the start of each step, numbered where the numbers fit (at least
  // 18 pixels apart), so that the steps read apart however alike they are.
  const double plot_px = layout.width_px - kLeftPx - kRightPx;
  const double px_per_ms = x1 > x0 ? plot_px / (x1 - x0) : 0;
  double last_px = -1e9;
  for (size_t k = 0; k < steps.size(); ++k) {
    const double at = steps[k].seconds() * 1e3;
    if (i == 0 && k > 0)
      s << "set arrow " << 1 + k << " from " << fmt(at) << ", graph 0 to " << fmt(at)
        << ", graph 1 nohead front lc rgb '#000000' lw 1.5 dt 2\n";
    else
      s << "unset arrow " << 1 + k << "\n";
    const double px = at * px_per_ms;
    if (i == 0 && px - last_px >= 18) {
      s << "set label " << 1000 + k << " " << gnuplot_string(std::to_string(k)) << " at " << fmt(at)
        << ", graph 1.008 left offset 0.2,0 font 'sans,7'\n";
      last_px = px;
    } else {
      s << "unset label " << 1000 + k << "\n";
    }
  }
  if (i > 0) {
    s << "unset key\nunset label 1\nunset label 2\n";
    for (size_t k = 0; k < labels.size(); ++k)
      s << "set label " << 10 + k << " " << gnuplot_string(labels[k].text) << " at "
        << fmt(labels[k].at.seconds() * 1e3) << ", "
        << fmt(labels[k].lane + (labels[k].send ? 0.6 : 0.2))
        << " center front font 'sans,7' tc rgb '#FFFFFF'\n";
  }
  s << "plot " << gnuplot_string(p.file) << " binary array=(" << bins << ","
    << layout.lanes * kRowsPerLane << ") format='%uchar%uchar%uchar' dx=" << fmt(dx)
    << " dy=" << fmt(1.0 / kRowsPerLane) << " origin=(" << fmt(x0 + dx / 2) << ","
    << fmt(0.5 / kRowsPerLane) << ") with rgbimage notitle" << (i == 0 ? keys : "") << "\n";
}

// Copies the image gnuplot drew in `dir` to `png`, atomically. Empty on success.
std::string install_png(const std::filesystem::path& dir, const std::filesystem::path& png) {
  std::ifstream in(dir / kPlotPng, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in || bytes.str().empty()) return "gnuplot wrote no image";
  try {
    write_file_atomic(png, bytes.str());
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// The script of a job: its terminal, the output in the scratch directory, its commands.
std::string job_script(const std::string& terminal, const std::string& commands) {
  return "set terminal " + terminal + "\nset output '" + kPlotPng + "'\n" + commands +
         "\nset output\n";
}

}  // namespace

std::string gnuplot_string(std::string_view text) {
  std::string q = "'";
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '\'')
      q += "''";
    else if (u < 0x20 || u == 0x7f)
      q += ' ';
    else
      q += ch;
  }
  return q + "'";
}

std::string render_gnuplot_png(const std::string& terminal, const std::string& commands,
                               const std::vector<std::pair<std::string, std::string>>& files,
                               const std::filesystem::path& png) {
  const std::filesystem::path gnuplot = find_gnuplot();
  if (gnuplot.empty()) return kNoGnuplot;
  TempDir tmp;
  if (tmp.path().empty()) return "cannot create a temporary directory";
  for (const auto& [name, bytes] : files) {
    COCO_CHECK(!name.empty() && name.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                                    std::string::npos,
               "render_gnuplot_png: a data file's name is a bare name");
    std::ofstream out(tmp.path() / name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) return "cannot write the plot's data in " + tmp.path().string();
  }
  if (std::string why = run_gnuplot_in(gnuplot, tmp.path(), job_script(terminal, commands));
      !why.empty())
    return why;
  return install_png(tmp.path(), png);
}

std::string write_timeline_png(const RunResult& result, const Topology& topo,
                               const std::filesystem::path& png, const TimelineOptions& options) {
  if (result.trace.empty()) return "the run recorded no trace events (emulator.trace = false?)";
  const std::filesystem::path gnuplot = find_gnuplot();
  if (gnuplot.empty()) return kNoGnuplot;
  TempDir tmp;
  if (tmp.path().empty()) return "cannot create a temporary directory";
  const TimelineLayout layout = timeline_layout(topo, options);
  SimTime end = result.makespan;
  for (const TraceEvent& e : result.trace) end = std::max(end, e.end);
  if (end.ns() <= 0) return "the run's timeline is empty (virtual time 0)";
  const int bins = std::max(16, options.bins);
  std::vector<Panel> panels;
  if (std::string why = write_panels(result, topo, layout, options, tmp.path(), end, bins, panels);
      !why.empty())
    return why;

  std::ostringstream s;
  page_header(s, result, topo, layout, options, end);
  std::vector<TimelineLabel> labels;
  if (panels.size() > 1) {  // the zoom panel names the first tile's operations
    std::vector<std::string> names;
    labels = timeline_labels(result, panels[1].begin, panels[1].end,
                             static_cast<int>(layout.width_px - kLeftPx - kRightPx), &names);
    // The title fits the image: about 7.5 px a character at the terminal's 9-point font (measured).
    const std::string head = panels[1].title + "; " + layout.lane_names.front() + "'s operations: ";
    const size_t room = static_cast<size_t>(std::max(60.0, (layout.width_px - 40) / 7.5));
    std::string list;
    size_t k = 0;
    for (; k < names.size(); ++k) {
      const std::string next = (k ? ", " : "") + names[k];
      if (head.size() + list.size() + next.size() + 5 > room) break;
      list += next;
    }
    if (k < names.size()) list += ", ...";
    panels[1].title = head + list;
  }
  const std::string keys = key_entries(topo);
  for (size_t i = 0; i < panels.size(); ++i)
    panel_plot(s, panels, i, layout, bins, keys, labels, options.step_starts);
  s << "unset multiplot\n";
  const std::string terminal = "pngcairo size " + std::to_string(layout.width_px) + "," +
                               std::to_string(layout.height_px) + " noenhanced font 'sans,9'";
  if (std::string why = run_gnuplot_in(gnuplot, tmp.path(), job_script(terminal, s.str()));
      !why.empty())
    return why;
  return install_png(tmp.path(), png);
}

void write_timeline_png_or_warn(const RunResult& result, const Topology& topo,
                                const std::filesystem::path& png, const TimelineOptions& options) {
  std::string why;
  try {
    why = write_timeline_png(result, topo, png, options);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty())
    std::cerr << "cocodiff: warning: " << png.filename().string() << " not written: " << why
              << "\n";
}

}  // namespace cocodiff::emu
