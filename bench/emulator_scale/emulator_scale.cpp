// The emulator's own cost, measured on `cocodiff run` child processes:
//  phantom  wall time, simulation events and flows per wall second, and peak resident memory
//           (ru_maxrss of each child) as the tile count grows (Aurora, 1 to 128 nodes);
//  real     the wall time of real math on 1 tile against the same run spread over P emulated
//           tiles (the emulation's cost over the math itself);
//  math     a transformer block's GFLOP/s next to Eigen GEMM's (runs bench_dit_block);
//  grid     the paper study's grid as whole images: 4 models x 3 resolutions x 4 node counts x
//           5 strategies at each model's default step count (phantom, Aurora), one run after
//           another: total CPU and wall seconds, and each run's;
//  replay   phantom CPU and wall seconds per strategy with replay off (every step and block
//           simulated, the cost before replay) and on (repeated steps and blocks replayed),
//           interleaved, medians of --repeats, the issue's figures beside them at its
//           configuration, and the command of each run.
//  collective  phantom CPU seconds of one step per strategy with every collective run message by
//           message (emulator.collective_ops=false) and at the collective level, replay off,
//           interleaved, medians of --repeats; fails unless both give the same timeline.
//  large    the issue's 1,536-tile row: each strategy's whole phantom run on --large-nodes
//           Aurora nodes with replay and collective-level operations, CPU and wall seconds
//           (medians of --repeats) and peak resident memory beside the goal (60 s, 1 GiB).
//  video    the video goal: phantom Wan 2.1 14B, 720p, 81 frames (configs/wan-video.toml), each
//           strategy's whole run of --video-steps steps on --video-nodes Aurora nodes, one
//           worker, replay and collective-level operations on: CPU and wall seconds (medians of
//           --repeats) and peak resident memory beside the goal (120 s of wall time, 2 GiB).
//  workers  real-math runs (1 tile, --real-nodes) and one phantom step on --replay-nodes, each on
//           one worker, the default count and every hardware thread: wall and CPU seconds.
//  memory   report.json's memory_estimate_bytes against the peak resident memory of the child
//           (ru_maxrss) over the configs of bench/README.md's memory tables: real math and
//           phantom, trace off and on, one tile to 24, workers, and phantom FLUX.1-dev 2048^2
//           at --memory-tiles tiles (uniform, 4 a node) and on 1,536 Aurora tiles.
// Each part prints a table and writes <out>/emulator_<part>.{csv,json,png}; memory writes
// <out>/memory_estimate.{csv,json}.
//
//   emulator_scale [--out DIR] [--smoke]
//                  [--parts phantom,real,math,replay,grid,collective,large,video,workers,memory]
//                  [--nodes 1,2,4]
//                  [--model flux1-dev] [--resolution 1024] [--strategy usp]
//                  [--blocks D,S] [--steps 1] [--real-nodes 2,8]
//                  [--replay-strategies usp,tapa,v_first,flat,cocodiff] [--replay-nodes 8]
//                  [--replay-resolution 2048] [--replay-steps 28] [--repeats 3]
//                  [--large-strategies tapa,v_first,flat,cocodiff] [--large-nodes 128]
//                  [--large-steps 28] [--video-strategies cocodiff,tapa,usp,flat]
//                  [--video-nodes 128] [--video-steps 50] [--memory-tiles 256,512,1024,2048]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <sys/resource.h>

#include "bench/common/bench_util.hpp"

namespace cocodiff::bench {
namespace {

struct Options {
  std::set<std::string> parts = {"phantom",    "real",  "math",  "replay",  "grid",
                                 "collective", "large", "video", "workers", "memory"};
  std::vector<std::string> large_strategies = {"tapa", "v_first", "flat", "cocodiff"};
  int large_nodes = 128;
  int large_steps = 28;
  std::vector<std::string> video_strategies = {"cocodiff", "tapa", "usp", "flat"};
  int video_nodes = 128;
  int video_steps = 50;
  std::vector<int> nodes = {1, 2, 4, 8, 16, 32, 64, 128};
  std::string model = "flux1-dev";
  int resolution = 1024;
  std::string strategy = "usp";
  std::string blocks;  // "D,S": override the model's double and single block counts
  int steps = 1;
  std::string real_model = "flux1-tiny";
  int real_resolution = 384;
  int real_steps = 2;
  std::vector<int> real_nodes = {2, 8};
  std::string real_strategy = "usp";
  std::filesystem::path dit_block_bin;
  std::vector<std::string> replay_strategies = {"usp", "tapa", "v_first", "flat", "cocodiff"};
  int replay_nodes = 8;
  int replay_resolution = 2048;
  int replay_steps = 28;
  int repeats = 3;
  std::vector<std::string> grid_models = {"flux1-dev", "sd35-large", "qwen-image", "sd35-medium"};
  std::vector<int> grid_resolutions = {1024, 2048, 4096};
  std::vector<int> grid_nodes = {1, 2, 4, 8};
  std::vector<std::string> grid_strategies = {"flat", "tapa", "v_first", "cocodiff", "usp"};
  int grid_steps = 0;                                      // 0: each model's default
  std::vector<int> memory_tiles = {256, 512, 1024, 2048};  // memory: uniform, 4 tiles a node
  bool memory_aurora = true;       // memory: flat and usp on --large-nodes Aurora nodes, one step
  std::filesystem::path baseline;  // real: a cocodiff built before a change, run beside it
  // real: the baseline's outputs may differ (a change of the seeded weights, say why)
  std::string baseline_differs;
};

Options parse(const Args& a) {
  Options o;
#ifdef COCODIFF_DIT_BLOCK_BIN
  o.dit_block_bin = COCODIFF_DIT_BLOCK_BIN;
#endif
  if (a.smoke) {
    o.nodes = {1, 2};
    o.blocks = "1,1";
    o.real_nodes = {1};
    o.real_steps = 1;
    o.real_resolution = 192;
    o.replay_strategies = {"flat", "cocodiff"};
    o.replay_nodes = 1;
    o.replay_resolution = 512;
    o.replay_steps = 4;
    o.repeats = 1;
    o.grid_models = {"flux1-dev"};
    o.grid_resolutions = {512};
    o.grid_nodes = {1};
    o.grid_strategies = {"flat", "cocodiff"};
    o.large_strategies = {"tapa", "cocodiff"};
    o.large_nodes = 2;
    o.large_steps = 2;
    o.video_strategies = {"cocodiff"};
    o.video_nodes = 1;
    o.video_steps = 2;
    o.grid_steps = 3;
    o.memory_tiles = {16};
    o.memory_aurora = false;
  }
  for (size_t i = 0; i < a.rest.size(); ++i) {
    const std::string& k = a.rest[i];
    if (i + 1 >= a.rest.size()) throw std::runtime_error("missing value after " + k);
    const std::string v = a.rest[++i];
    if (k == "--parts") {
      o.parts.clear();
      std::stringstream ss(v);
      std::string p;
      while (std::getline(ss, p, ',')) o.parts.insert(p);
    } else if (k == "--nodes") {
      o.nodes = int_list(v);
    } else if (k == "--model") {
      o.model = v;
    } else if (k == "--resolution") {
      o.resolution = std::stoi(v);
    } else if (k == "--strategy") {
      o.strategy = v;
    } else if (k == "--blocks") {
      o.blocks = v;
    } else if (k == "--steps") {
      o.steps = std::stoi(v);
    } else if (k == "--real-nodes") {
      o.real_nodes = int_list(v);
    } else if (k == "--real-model") {
      o.real_model = v;
    } else if (k == "--real-steps") {
      o.real_steps = std::stoi(v);
    } else if (k == "--baseline") {
      o.baseline = v;
    } else if (k == "--baseline-differs") {
      o.baseline_differs = v;
    } else if (k == "--real-strategy") {
      o.real_strategy = v;
    } else if (k == "--replay-strategies") {
      o.replay_strategies.clear();
      std::stringstream ss(v);
      std::string p;
      while (std::getline(ss, p, ',')) o.replay_strategies.push_back(p);
    } else if (k == "--large-strategies") {
      o.large_strategies.clear();
      std::stringstream ss(v);
      std::string p;
      while (std::getline(ss, p, ',')) o.large_strategies.push_back(p);
    } else if (k == "--video-strategies") {
      o.video_strategies.clear();
      std::stringstream ss(v);
      std::string p;
      while (std::getline(ss, p, ',')) o.video_strategies.push_back(p);
    } else if (k == "--video-nodes") {
      o.video_nodes = std::stoi(v);
    } else if (k == "--video-steps") {
      o.video_steps = std::stoi(v);
    } else if (k == "--large-nodes") {
      o.large_nodes = std::stoi(v);
    } else if (k == "--large-steps") {
      o.large_steps = std::stoi(v);
    } else if (k == "--replay-nodes") {
      o.replay_nodes = std::stoi(v);
    } else if (k == "--replay-resolution") {
      o.replay_resolution = std::stoi(v);
    } else if (k == "--replay-steps") {
      o.replay_steps = std::stoi(v);
    } else if (k == "--memory-tiles") {
      o.memory_tiles = int_list(v);
    } else if (k == "--repeats") {
      o.repeats = std::max(1, std::stoi(v));
    } else {
      throw std::runtime_error("unknown option " + k);
    }
  }
  return o;
}

std::vector<std::string> block_sets(const std::string& blocks) {
  if (blocks.empty()) return {};
  const auto comma = blocks.find(',');
  return {"--set", "model.double_blocks=" + blocks.substr(0, comma), "--set",
          "model.single_blocks=" + blocks.substr(comma + 1)};
}

[[noreturn]] void fail(const ChildRun& r, const std::string& what) {
  std::fprintf(stderr, "%s failed (exit %d): %s\n", what.c_str(), r.exit_code, r.error.c_str());
  std::exit(1);
}

// Phantom mode: cost of the emulation alone as the cluster grows.
void phantom(const Args& a, const Options& o) {
  Table t({"nodes", "tiles", "virtual ms", "events", "flows", "run wall s", "Mevents/s", "us/flow",
           "peak RSS MiB"});
  Progress progress(o.nodes.size());
  std::string dat = "# tiles wall_s events_per_s us_per_flow rss_mib\n";
  for (int n : o.nodes) {
    progress.step(fmt("phantom %s %dpx, %d node(s)", o.model.c_str(), o.resolution, n));
    std::vector<std::string> sets = {"--set", "run.math=skip",
                                     "--set", "model.preset=" + o.model,
                                     "--set", "run.resolution=" + std::to_string(o.resolution),
                                     "--set", "run.steps=" + std::to_string(o.steps),
                                     "--set", "run.strategy=" + o.strategy,
                                     "--set", "cluster.preset=aurora",
                                     "--set", "cluster.nodes=" + std::to_string(n),
                                     "--set", "emulator.trace=false"};
    for (const std::string& s : block_sets(o.blocks)) sets.push_back(s);
    const ChildRun r = run_cocodiff(a, sets, fmt("phantom_n%d", n));
    if (!r.ok()) fail(r, fmt("phantom run on %d node(s)", n));
    const auto& rep = r.report;
    const double run_s = rep["wall_time_s"].get<double>();
    const double events = rep["events"].get<double>(), flows = rep["flows"].get<double>();
    const double rss_mib = static_cast<double>(r.maxrss_kib) / 1024.0;
    const int tiles = rep["ranks"].get<int>();
    t.add({std::to_string(n), std::to_string(tiles),
           fmt("%.3f", rep["virtual_time_s"].get<double>() * 1e3), fmt("%.0f", events),
           fmt("%.0f", flows), fmt("%.2f", run_s), fmt("%.3f", events / run_s / 1e6),
           fmt("%.2f", flows > 0 ? run_s / flows * 1e6 : 0.0), fmt("%.0f", rss_mib)},
          {{"nodes", n},
           {"tiles", tiles},
           {"virtual_time_s", rep["virtual_time_s"]},
           {"events", events},
           {"flows", flows},
           {"run_wall_s", run_s},
           {"process_wall_s", r.wall_s},
           {"events_per_s", events / run_s},
           {"wall_us_per_flow", flows > 0 ? run_s / flows * 1e6 : 0.0},
           {"peak_rss_mib", rss_mib}});
    dat += fmt("%d %.6g %.6g %.6g %.6g\n", tiles, run_s, events / run_s,
               flows > 0 ? run_s / flows * 1e6 : 0.0, rss_mib);
  }
  progress.done();
  const nlohmann::json meta = {
      {"model", o.model},
      {"resolution", o.resolution},
      {"strategy", o.strategy},
      {"steps", o.steps},
      {"blocks", o.blocks.empty() ? "preset" : o.blocks},
      {"cluster", "aurora"},
      {"workers", a.workers},
      {"note",
       "run wall s = report.json wall_time_s (engine run); peak RSS = ru_maxrss of the "
       "child cocodiff process; trace off"}};
  t.finish(a, "emulator_phantom", meta);
  const std::string title =
      fmt("phantom-mode cost: %s %dpx, %d step(s), %s, %s blocks, Aurora, %d worker(s)",
          o.model.c_str(), o.resolution, o.steps, o.strategy.c_str(),
          o.blocks.empty() ? "all" : o.blocks.c_str(), a.workers);
  plot(a, "emulator_phantom", dat,
       "set multiplot layout 1,2 title '" + title +
           "'\n"
           "set logscale x 2\nset grid\nset key top left\nset xlabel 'emulated tiles'\n"
           "set logscale y\nset ylabel 'wall seconds'\nset y2label 'million events / s'\n"
           "set y2tics\nset ytics nomirror\n"
           "plot $DATA using 1:2 with linespoints lw 2 pt 7 title 'wall time (left)', "
           "$DATA using 1:($3/1e6) axes x1y2 with linespoints lw 2 pt 5 title 'events/s (right)'\n"
           "unset logscale y\nset ylabel 'peak RSS (MiB)'\nset y2label 'wall us per flow'\n"
           "set yrange [0:*]\nset y2range [0:*]\n"
           "plot $DATA using 1:5 with linespoints lw 2 pt 7 lc rgb '#D55E00' title 'peak RSS', "
           "$DATA using 1:4 axes x1y2 with linespoints lw 2 pt 5 lc rgb '#009E73' "
           "title 'wall us per flow (right)'\n"
           "unset multiplot\n",
       1300, 520);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The real-math runs: one tile (a one-rank cluster: uniform preset, 1 tile x 1 GPU x 1 node, the
// serial reference), then --real-nodes Aurora nodes (flat up to 24 tiles, else --real-strategy);
// each with its whole --set list.
struct RealPoint {
  std::string label;
  std::vector<std::string> sets;
};
std::vector<RealPoint> real_points(const Options& o) {
  const std::vector<std::string> base = {
      "--set", "run.math=real",
      "--set", "model.preset=" + o.real_model,
      "--set", "run.resolution=" + std::to_string(o.real_resolution),
      "--set", "run.steps=" + std::to_string(o.real_steps),
      "--set", "emulator.trace=false"};
  std::vector<RealPoint> points;
  std::vector<std::string> serial = base;
  serial.insert(serial.end(),
                {"--set", "cluster.preset=uniform", "--set", "cluster.nodes=1", "--set",
                 "cluster.topology.sizes=[1,1]", "--set", "cluster.nic.rank_nic=[0]", "--set",
                 "cluster.nic.count=1", "--set", "run.strategy=serial"});
  points.push_back({"1 tile (serial)", serial});
  for (int n : o.real_nodes) {
    std::vector<std::string> p = base;
    const std::string strategy = n * 12 <= 24 ? "flat" : o.real_strategy;
    p.insert(p.end(), {"--set", "cluster.preset=aurora", "--set",
                       "cluster.nodes=" + std::to_string(n), "--set", "run.strategy=" + strategy});
    points.push_back({fmt("%d Aurora tiles (%s)", 12 * n, strategy.c_str()), p});
  }
  return points;
}

// Real math: the same run on 1 tile and on P emulated tiles (with --baseline, also with an
// earlier build of cocodiff, interleaved: CPU medians of --repeats runs each).
void real(const Args& a, const Options& o) {
  const std::vector<RealPoint> points = real_points(o);
  const bool before = !o.baseline.empty();
  std::vector<std::string> cols = {"run",          "tiles",        "run wall s",   "x 1 tile",
                                   "CPU s",        "CPU x 1 tile", "events",       "flows",
                                   "CPU us/event", "peak RSS MiB", "output sha256"};
  if (before) cols.insert(cols.begin() + 6, {"CPU s before", "CPU x 1 tile before", "command"});
  Table t(cols);
  const int repeats = before ? o.repeats : 1;
  Progress progress(points.size() * static_cast<size_t>(repeats) * (before ? 2 : 1));
  // Runs interleaved (each point with the new and the baseline binary, repeat after repeat) so
  // both see the same load; CPU seconds are medians over the repeats.
  Args base_args = a;
  base_args.cocodiff = o.baseline;
  std::vector<std::vector<ChildRun>> runs(points.size()), base_runs(points.size());
  for (int rep = 0; rep < repeats; ++rep)
    for (size_t k = 0; k < points.size(); ++k) {
      const std::vector<std::string>& sets = points[k].sets;
      progress.step("real math: " + points[k].label);
      runs[k].push_back(run_cocodiff(a, sets, fmt("real_%zu", k)));
      if (!runs[k].back().ok()) fail(runs[k].back(), "real-math run " + points[k].label);
      if (!before) continue;
      progress.step("real math, baseline: " + points[k].label);
      base_runs[k].push_back(run_cocodiff(base_args, sets, fmt("real_%zu_before", k)));
      if (!base_runs[k].back().ok()) fail(base_runs[k].back(), "baseline run " + points[k].label);
      if (base_runs[k].back().report["output_sha256"] != runs[k].back().report["output_sha256"] &&
          o.baseline_differs.empty())
        throw std::runtime_error("real math: " + points[k].label +
                                 ": the baseline's output bytes differ (--baseline-differs "
                                 "REASON when a change of them is deliberate)");
    }
  auto median_cpu = [](const std::vector<ChildRun>& rs) {
    std::vector<double> v;
    for (const ChildRun& r : rs) v.push_back(r.cpu_s);
    return median(v);
  };
  double wall1 = 0, cpu1 = 0, base_cpu1 = 0;
  std::string dat = "# label wall_s ratio cpu_s cpu_ratio\n";
  for (size_t k = 0; k < points.size(); ++k) {
    const RealPoint& p = points[k];
    const ChildRun& r = runs[k].back();
    const auto& rep = r.report;
    const double wall = rep["wall_time_s"].get<double>();
    const double cpu = median_cpu(runs[k]);
    const double base_cpu = before ? median_cpu(base_runs[k]) : 0.0;
    if (k == 0) {
      wall1 = wall;
      cpu1 = cpu;
      base_cpu1 = base_cpu;
    }
    const double events = rep["events"].get<double>();
    const std::string sha = rep["output_sha256"].is_string()
                                ? rep["output_sha256"].get<std::string>().substr(0, 12)
                                : "-";
    std::string command = "cocodiff run " + a.config.filename().string();
    for (size_t j = 1; j < p.sets.size(); j += 2) command += " --set " + p.sets[j];
    command += " --set emulator.workers=" + std::to_string(a.workers);
    std::vector<std::string> row = {p.label,
                                    std::to_string(rep["ranks"].get<int>()),
                                    fmt("%.3f", wall),
                                    fmt("%.2f", wall / wall1),
                                    fmt("%.2f", cpu),
                                    fmt("%.2f", cpu / cpu1),
                                    fmt("%.0f", events),
                                    fmt("%.0f", rep["flows"].get<double>()),
                                    fmt("%.1f", events > 0 ? (cpu - cpu1) / events * 1e6 : 0.0),
                                    fmt("%.0f", static_cast<double>(r.maxrss_kib) / 1024),
                                    sha};
    if (before)
      row.insert(row.begin() + 6,
                 {fmt("%.2f", base_cpu), fmt("%.2f", base_cpu / base_cpu1), command});
    nlohmann::json j = {{"run", p.label},
                        {"tiles", rep["ranks"]},
                        {"run_wall_s", wall},
                        {"ratio_to_1_tile", wall / wall1},
                        {"process_cpu_s", cpu},
                        {"cpu_ratio_to_1_tile", cpu / cpu1},
                        {"events", events},
                        {"flows", rep["flows"]},
                        {"peak_rss_mib", static_cast<double>(r.maxrss_kib) / 1024},
                        {"output_sha256", rep["output_sha256"]},
                        {"command", command}};
    if (before) {
      j["process_cpu_s_before"] = base_cpu;
      j["cpu_ratio_to_1_tile_before"] = base_cpu / base_cpu1;
    }
    t.add(row, j);
    dat +=
        fmt("\"%s\" %.6g %.6g %.6g %.6g\n", p.label.c_str(), wall, wall / wall1, cpu, cpu / cpu1);
  }
  progress.done();
  t.finish(a, "emulator_real",
           {{"model", o.real_model},
            {"resolution", o.real_resolution},
            {"steps", o.real_steps},
            {"workers", a.workers},
            {"baseline_output_differs", o.baseline_differs},
            {"note",
             "run wall s = report.json wall_time_s (weights + run); CPU s = user + system CPU of "
             "the whole child; CPU us/event = (CPU - CPU of 1 tile) / events, the emulation's "
             "cost per event; wall times depend on the machine's load, CPU times much less"}});
  plot(a, "emulator_real", dat,
       fmt("set title 'real math, %s %dpx, %d step(s): 1 tile vs emulated tiles (%d worker(s)); "
           "labels: CPU time x 1 tile'\n",
           o.real_model.c_str(), o.real_resolution, o.real_steps, a.workers) +
           "set style data histogram\nset style histogram cluster gap 1\n"
           "set style fill solid 0.8 border -1\nset grid ytics\nset key top left\n"
           "set ylabel 'seconds'\nset yrange [0:*]\nset xtics nomirror\n"
           "plot $DATA using 2:xtic(1) title 'run wall time' lc rgb '#0072B2', "
           "'' using 4 title 'process CPU time (user + sys)' lc rgb '#E69F00', "
           "'' using ($0+0.17):4:(sprintf('%.2fx', $5)) with labels offset 0,1 notitle\n",
       900, 500);
}

// The issue's figures for FLUX.1-dev 2048^2, 28 steps, 8 Aurora nodes, phantom, one worker, CPU
// seconds, measured before any replay: printed beside ours for that configuration only.
std::string figure_before_replay(const std::string& strategy) {
  static const std::map<std::string, std::string> before = {
      {"usp", "11"}, {"tapa", "~34"}, {"v_first", "~41"}, {"flat", "~78"}, {"cocodiff", "84-119"}};
  auto it = before.find(strategy);
  return it == before.end() ? "-" : it->second;
}

// The phantom FLUX-on-Aurora run the replay, collective and large parts time, plus `extra`.
std::vector<std::string> phantom_sets(const Options& o, const std::string& strategy, int steps,
                                      int nodes, std::vector<std::string> extra) {
  std::vector<std::string> sets = {"--set", "run.math=skip",
                                   "--set", "model.preset=" + o.model,
                                   "--set", "run.resolution=" + std::to_string(o.replay_resolution),
                                   "--set", "run.steps=" + std::to_string(steps),
                                   "--set", "run.strategy=" + strategy,
                                   "--set", "cluster.preset=aurora",
                                   "--set", "cluster.nodes=" + std::to_string(nodes),
                                   "--set", "ulysses.uneven_heads=true"};
  for (const std::string& e : extra) sets.insert(sets.end(), {"--set", e});
  sets.insert(sets.end(), {"--set", "emulator.trace=false"});
  return sets;
}

// Runs `sets` with an engine key off and on, interleaved, --repeats times each, and fails
// unless both give the same virtual time, bytes, flows and timeline hash; also the command
// that reproduces the runs (without the key).
struct OffOn {
  std::vector<double> cpu[2], wall[2];
  ChildRun last[2];
  std::string command;
};
OffOn off_on(const Args& a, const Options& o, Progress& progress, const std::string& strategy,
             const std::vector<std::string>& sets, const std::string& key) {
  OffOn r;
  for (int rep = 0; rep < o.repeats; ++rep)
    for (int on = 0; on < 2; ++on) {
      progress.step(fmt("%s=%s: %s, repeat %d", key.c_str(), on ? "true" : "false",
                        strategy.c_str(), rep + 1));
      std::vector<std::string> x = sets;
      x.insert(x.end(), {"--set", key + "=" + (on ? "true" : "false")});
      r.last[on] = run_cocodiff(
          a, x, fmt("%s_%s_%s_%d", key.c_str(), strategy.c_str(), on ? "on" : "off", rep));
      if (!r.last[on].ok()) fail(r.last[on], key + " run of " + strategy);
      r.cpu[on].push_back(r.last[on].cpu_s);
      r.wall[on].push_back(r.last[on].wall_s);
    }
  for (const char* k : {"virtual_time_s", "timeline_sha256", "bytes_by_tier", "flows"})
    if (r.last[0].report[k] != r.last[1].report[k]) {
      std::fprintf(stderr, "%s changed %s of %s\n", key.c_str(), k, strategy.c_str());
      std::exit(1);
    }
  r.command = "cocodiff run configs/flux1-tiny-24tiles.toml";
  for (size_t i = 1; i < sets.size(); i += 2) r.command += " --set " + sets[i];
  r.command += fmt(" --set emulator.workers=%d", a.workers);
  return r;
}

// Region replay: the same phantom run with every region simulated (replay off, what every run
// cost before replay) and with repeated steps and blocks replayed, interleaved so that both see
// the same load. Both must give the same virtual time, bytes and timeline hash; the bench fails
// otherwise.
void replay(const Args& a, const Options& o) {
  const bool issue_point = o.model == "flux1-dev" && o.replay_resolution == 2048 &&
                           o.replay_nodes == 8 && o.replay_steps == 28;
  Table t({"strategy", "tiles", "steps", "virtual s", "CPU s off", "CPU s on", "speedup",
           "wall s off", "wall s on", "issue's CPU s (before)", "regions replayed",
           "peak RSS MiB on", "command (add --set emulator.replay=false)"});
  Progress progress(o.replay_strategies.size() * static_cast<size_t>(o.repeats) * 2);
  for (const std::string& s : o.replay_strategies) {
    const std::vector<std::string> sets =
        phantom_sets(o, s, o.replay_steps, o.replay_nodes, {"v_major.warmup_steps=1"});
    const OffOn r = off_on(a, o, progress, s, sets, "emulator.replay");
    const auto& cpu = r.cpu;
    const auto& wall = r.wall;
    const auto& last = r.last;
    const nlohmann::json& on = last[1].report;
    const std::string& cmd = r.command;
    const double c0 = median(cpu[0]), c1 = median(cpu[1]);
    t.add({s, std::to_string(on["ranks"].get<int>()), std::to_string(o.replay_steps),
           fmt("%.4f", on["virtual_time_s"].get<double>()), fmt("%.2f", c0), fmt("%.2f", c1),
           fmt("%.2f", c0 / c1), fmt("%.2f", median(wall[0])), fmt("%.2f", median(wall[1])),
           issue_point ? figure_before_replay(s) : "-",
           std::to_string(on["regions_replayed"].get<int>()),
           fmt("%.0f", static_cast<double>(last[1].maxrss_kib) / 1024), cmd},
          {{"strategy", s},
           {"tiles", on["ranks"]},
           {"steps", o.replay_steps},
           {"virtual_time_s", on["virtual_time_s"]},
           {"cpu_s_replay_off", cpu[0]},
           {"cpu_s_replay_on", cpu[1]},
           {"median_cpu_s_replay_off", c0},
           {"median_cpu_s_replay_on", c1},
           {"wall_s_replay_off", wall[0]},
           {"wall_s_replay_on", wall[1]},
           {"issue_cpu_s_before_replay", issue_point ? figure_before_replay(s) : "-"},
           {"regions_replayed", on["regions_replayed"]},
           {"peak_rss_mib_replay_on", static_cast<double>(last[1].maxrss_kib) / 1024},
           {"timeline_sha256", on["timeline_sha256"]},
           {"command", cmd}});
  }
  progress.done();
  t.finish(a, "emulator_replay",
           {{"model", o.model},
            {"resolution", o.replay_resolution},
            {"nodes", o.replay_nodes},
            {"repeats", o.repeats},
            {"workers", a.workers},
            {"note",
             "CPU s = user + system CPU of the child, median of the repeats, off and on "
             "interleaved; replay off simulates every step and block (the cost before replay); "
             "both give the same virtual time, bytes, flows and timeline hash (checked)"}});
}

// Collective-level operations: one step of each strategy with replay off (every block
// simulated), collectives message by message and at the collective level, interleaved.
void collective(const Args& a, const Options& o) {
  Table t({"strategy", "tiles", "steps", "flows", "CPU s per message", "CPU s collective level",
           "speedup", "wall s per message / collective level", "command"});
  Progress progress(o.replay_strategies.size() * static_cast<size_t>(o.repeats) * 2);
  for (const std::string& s : o.replay_strategies) {
    const std::vector<std::string> sets =
        phantom_sets(o, s, 1, o.replay_nodes, {"emulator.replay=false"});
    const OffOn r = off_on(a, o, progress, s, sets, "emulator.collective_ops");
    const auto& cpu = r.cpu;
    const auto& wall = r.wall;
    const nlohmann::json& on = r.last[1].report;
    const std::string& cmd = r.command;
    const double c0 = median(cpu[0]), c1 = median(cpu[1]);
    t.add({s, std::to_string(on["ranks"].get<int>()), "1",
           std::to_string(on["flows"].get<std::int64_t>()), fmt("%.2f", c0), fmt("%.2f", c1),
           fmt("%.2f", c0 / c1), fmt("%.2f / %.2f", median(wall[0]), median(wall[1])),
           cmd + " --set emulator.collective_ops=false|true"},
          {{"strategy", s},
           {"tiles", on["ranks"]},
           {"flows", on["flows"]},
           {"cpu_s_per_message", cpu[0]},
           {"cpu_s_collective_level", cpu[1]},
           {"median_cpu_s_per_message", c0},
           {"median_cpu_s_collective_level", c1},
           {"wall_s_per_message", wall[0]},
           {"wall_s_collective_level", wall[1]},
           {"timeline_sha256", on["timeline_sha256"]},
           {"command", cmd}});
  }
  progress.done();
  t.finish(a, "emulator_collective",
           {{"model", o.model},
            {"resolution", o.replay_resolution},
            {"nodes", o.replay_nodes},
            {"repeats", o.repeats},
            {"workers", a.workers},
            {"note",
             "one step, replay off; CPU s = user + system CPU of the child, median of the "
             "repeats, per-message and collective-level runs interleaved; both give the same "
             "virtual time, bytes, flows and timeline hash (checked)"}});
}

// Whole runs of each strategy, --repeats times, repeats interleaved: every run's CPU and wall
// seconds by strategy, and the run of the largest peak memory. `run` makes one (strategy, repeat).
struct WholeRuns {
  std::map<std::string, std::vector<double>> cpu, wall;
  std::map<std::string, ChildRun> last;
};
WholeRuns whole_runs(const Options& o, const std::vector<std::string>& strategies,
                     const std::string& what,
                     const std::function<ChildRun(const std::string&, int)>& run) {
  WholeRuns w;
  Progress progress(strategies.size() * static_cast<size_t>(o.repeats));
  for (int rep = 0; rep < o.repeats; ++rep)
    for (const std::string& s : strategies) {
      progress.step(fmt("%s %s, repeat %d", s.c_str(), what.c_str(), rep + 1));
      ChildRun r = run(s, rep);
      if (!r.ok()) fail(r, what + " run of " + s);
      w.cpu[s].push_back(r.cpu_s);
      w.wall[s].push_back(r.wall_s);
      ChildRun& last = w.last[s];
      if (r.maxrss_kib > last.maxrss_kib || last.report.is_null()) last = std::move(r);
    }
  progress.done();
  return w;
}

// The 1,536-tile row: whole runs with everything the engine has (replay, collective-level
// operations), one strategy after another, repeats interleaved.
void large(const Args& a, const Options& o) {
  Table t({"strategy", "tiles", "steps", "virtual s", "CPU s", "wall s", "peak RSS MiB",
           "regions replayed", "goal (<= 60 s, <= 1 GiB)", "issue's CPU s (before)", "command"});
  auto sets_of = [&](const std::string& s) {
    return phantom_sets(o, s, o.large_steps, o.large_nodes, {"v_major.warmup_steps=1"});
  };
  auto [cpu, wall, last] =
      whole_runs(o, o.large_strategies, fmt("large, %d nodes", o.large_nodes),
                 [&](const std::string& s, int rep) {
                   return run_cocodiff(a, sets_of(s), fmt("large_%s_%d", s.c_str(), rep));
                 });
  const bool issue_point = o.model == "flux1-dev" && o.replay_resolution == 2048 &&
                           o.large_nodes == 128 && o.large_steps == 28;
  for (const std::string& s : o.large_strategies) {
    const nlohmann::json& rep = last[s].report;
    const double c = median(cpu[s]), w = median(wall[s]);
    const double rss_mib = static_cast<double>(last[s].maxrss_kib) / 1024;
    const bool met = c <= 60 && rss_mib <= 1024;
    const std::string before = !issue_point      ? "-"
                               : s == "usp"      ? "~5 h"
                               : s == "cocodiff" ? "~12 h (2 GB)"
                                                 : "-";
    std::string cmd = "cocodiff run configs/flux1-tiny-24tiles.toml";
    const std::vector<std::string> sets = sets_of(s);
    for (size_t i = 1; i < sets.size(); i += 2) cmd += " --set " + sets[i];
    cmd += fmt(" --set emulator.workers=%d", a.workers);
    t.add({s, std::to_string(rep["ranks"].get<int>()), std::to_string(o.large_steps),
           fmt("%.4f", rep["virtual_time_s"].get<double>()), fmt("%.2f", c), fmt("%.2f", w),
           fmt("%.0f", rss_mib), std::to_string(rep["regions_replayed"].get<std::int64_t>()),
           met ? "met" : "not met", before, cmd},
          {{"strategy", s},
           {"tiles", rep["ranks"]},
           {"steps", o.large_steps},
           {"virtual_time_s", rep["virtual_time_s"]},
           {"cpu_s", cpu[s]},
           {"wall_s", wall[s]},
           {"median_cpu_s", c},
           {"median_wall_s", w},
           {"peak_rss_mib", rss_mib},
           {"regions_replayed", rep["regions_replayed"]},
           {"flows", rep["flows"]},
           {"goal_met", met},
           {"timeline_sha256", rep["timeline_sha256"]},
           {"command", cmd}});
  }
  t.finish(a, "emulator_large",
           {{"model", o.model},
            {"resolution", o.replay_resolution},
            {"nodes", o.large_nodes},
            {"steps", o.large_steps},
            {"repeats", o.repeats},
            {"workers", a.workers},
            {"note",
             "CPU s = user + system CPU of the child, median of the repeats; peak RSS is the "
             "largest of the repeats; replay and collective-level operations on (the defaults)"}});
}

// The video goal: configs/wan-video.toml's whole phantom runs, one strategy after another,
// repeats interleaved.
void video(const Args& a, const Options& o) {
  Table t({"strategy", "tiles", "steps", "virtual s", "CPU s", "wall s", "peak RSS MiB",
           "regions replayed", "goal (<= 120 s wall, <= 2 GiB)", "command"});
  const std::filesystem::path config = a.config_dir / "wan-video.toml";
  auto sets_of = [&](const std::string& s) {
    return std::vector<std::string>{"cluster.nodes=" + std::to_string(o.video_nodes),
                                    "run.steps=" + std::to_string(o.video_steps),
                                    "run.strategy=" + s, "emulator.trace=false",
                                    "emulator.workers=" + std::to_string(a.workers)};
  };
  auto [cpu, wall, last] = whole_runs(
      o, o.video_strategies, fmt("video, %d nodes", o.video_nodes),
      [&](const std::string& s, int rep) {
        const std::filesystem::path dir = a.out / "runs" / fmt("video_%s_%d", s.c_str(), rep);
        std::vector<std::string> argv = {a.cocodiff.string(), "run", config.string(), "--out",
                                         dir.string(),        "-q"};
        for (const std::string& x : sets_of(s)) argv.insert(argv.end(), {"--set", x});
        return run_report(argv, dir);
      });
  for (const std::string& s : o.video_strategies) {
    const nlohmann::json& rep = last[s].report;
    const double c = median(cpu[s]), w = median(wall[s]);
    const double rss_mib = static_cast<double>(last[s].maxrss_kib) / 1024;
    const bool met = w <= 120 && rss_mib <= 2048;
    std::string cmd = "cocodiff run configs/wan-video.toml";
    for (const std::string& x : sets_of(s)) cmd += " --set " + x;
    t.add({s, std::to_string(rep["ranks"].get<int>()), std::to_string(o.video_steps),
           fmt("%.4f", rep["virtual_time_s"].get<double>()), fmt("%.2f", c), fmt("%.2f", w),
           fmt("%.0f", rss_mib), std::to_string(rep["regions_replayed"].get<std::int64_t>()),
           met ? "met" : "not met", cmd},
          {{"strategy", s},
           {"tiles", rep["ranks"]},
           {"steps", o.video_steps},
           {"virtual_time_s", rep["virtual_time_s"]},
           {"cpu_s", cpu[s]},
           {"wall_s", wall[s]},
           {"median_cpu_s", c},
           {"median_wall_s", w},
           {"peak_rss_mib", rss_mib},
           {"regions_replayed", rep["regions_replayed"]},
           {"flows", rep["flows"]},
           {"goal_met", met},
           {"timeline_sha256", rep["timeline_sha256"]},
           {"command", cmd}});
  }
  t.finish(a, "emulator_video",
           {{"model", "wan2.1-t2v-14b"},
            {"height", 720},
            {"width", 1280},
            {"frames", 81},
            {"nodes", o.video_nodes},
            {"steps", o.video_steps},
            {"repeats", o.repeats},
            {"workers", a.workers},
            {"note",
             "wall s = the child's wall time, CPU s = its user + system CPU, medians of the "
             "repeats; peak RSS is the largest of the repeats; replay and collective-level "
             "operations on (the defaults)"}});
}

// The study grid as whole images, one run at a time, one worker each: what a what-if sweep of
// the paper's configurations costs. SD3.5's learned position table stops at 3072 px.
void grid(const Args& a, const Options& o) {
  Table t({"model", "runs", "CPU s", "wall s", "largest run CPU s", "its configuration"});
  struct Point {
    std::string model, strategy;
    int res, nodes;
  };
  std::vector<Point> points;
  for (const std::string& m : o.grid_models)
    for (int res : o.grid_resolutions) {
      if ((m == "sd35-large" || m == "sd35-medium") && res > 3072) continue;
      for (int n : o.grid_nodes)
        for (const std::string& s : o.grid_strategies) points.push_back({m, s, res, n});
    }
  Progress progress(points.size());
  nlohmann::json runs = nlohmann::json::array();
  struct Sum {
    int runs = 0;
    double cpu = 0, wall = 0, max_cpu = 0;
    std::string max_at;
  };
  std::map<std::string, Sum> by_model;
  Sum all;
  for (const Point& p : points) {
    const std::string what =
        fmt("%s %dpx %d node(s) %s", p.model.c_str(), p.res, p.nodes, p.strategy.c_str());
    progress.step(what);
    std::vector<std::string> x = {"--set", "run.math=skip",
                                  "--set", "model.preset=" + p.model,
                                  "--set", "run.resolution=" + std::to_string(p.res),
                                  "--set", "run.strategy=" + p.strategy,
                                  "--set", "cluster.preset=aurora",
                                  "--set", "cluster.nodes=" + std::to_string(p.nodes),
                                  "--set", "ulysses.uneven_heads=true",
                                  "--set", "emulator.trace=false"};
    if (o.grid_steps > 0) x.insert(x.end(), {"--set", fmt("run.steps=%d", o.grid_steps)});
    const ChildRun r = run_cocodiff(
        a, x, fmt("grid_%s_%d_%d_%s", p.model.c_str(), p.res, p.nodes, p.strategy.c_str()));
    if (!r.ok()) fail(r, "grid run " + what);
    for (Sum* sum : {&by_model[p.model], &all}) {
      ++sum->runs;
      sum->cpu += r.cpu_s;
      sum->wall += r.wall_s;
      if (r.cpu_s > sum->max_cpu) {
        sum->max_cpu = r.cpu_s;
        sum->max_at = what;
      }
    }
    runs.push_back({{"model", p.model},
                    {"resolution", p.res},
                    {"nodes", p.nodes},
                    {"strategy", p.strategy},
                    {"steps", r.report["steps"]},
                    {"tiles", r.report["ranks"]},
                    {"virtual_time_s", r.report["virtual_time_s"]},
                    {"regions_replayed", r.report["regions_replayed"]},
                    {"cpu_s", r.cpu_s},
                    {"wall_s", r.wall_s},
                    {"peak_rss_mib", static_cast<double>(r.maxrss_kib) / 1024}});
  }
  progress.done();
  auto add = [&t](const std::string& name, const Sum& s, nlohmann::json extra) {
    nlohmann::json j = {{"model", name},
                        {"runs", s.runs},
                        {"cpu_s", s.cpu},
                        {"wall_s", s.wall},
                        {"largest_cpu_s", s.max_cpu},
                        {"largest_at", s.max_at}};
    if (extra.is_object()) j.update(extra);
    t.add({name, std::to_string(s.runs), fmt("%.1f", s.cpu), fmt("%.1f", s.wall),
           fmt("%.2f", s.max_cpu), s.max_at},
          j);
  };
  for (const auto& [m, s] : by_model) add(m, s, {});
  add("all", all, {{"runs_detail", runs}});
  std::string cmd =
      "cocodiff run configs/flux1-tiny-24tiles.toml --set run.math=skip --set "
      "model.preset=M --set run.resolution=R --set run.strategy=S --set "
      "cluster.preset=aurora --set cluster.nodes=N --set ulysses.uneven_heads=true "
      "--set emulator.trace=false";
  cmd += fmt(" --set emulator.workers=%d", a.workers);
  if (o.grid_steps > 0) cmd += fmt(" --set run.steps=%d", o.grid_steps);
  t.finish(a, "emulator_grid",
           {{"command", cmd},
            {"note",
             "whole images at each model's default step count (FLUX.1-dev and SD3.5 Large 28, "
             "SD3.5 Medium 40, Qwen-Image 50), phantom, one run at a time; CPU s = user + "
             "system of each child, summed"}});
}

// Worker threads: the same runs on one worker, with the default count (no emulator.workers:
// every hardware thread for real math, one for phantom runs) and on every hardware thread,
// interleaved; wall and CPU medians of --repeats. Fails unless all give the same output and
// timeline.
void workers(const Args& a, const Options& o) {
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<RealPoint> points = real_points(o);
  for (RealPoint& p : points) p.label = "real math, " + p.label;
  points.push_back({fmt("phantom, %d tiles, cocodiff, 1 step, replay off", 12 * o.replay_nodes),
                    phantom_sets(o, "cocodiff", 1, o.replay_nodes, {"emulator.replay=false"})});
  // Variants: one worker, the default, every hardware thread.
  const std::vector<std::string> variants = {"1", "default", std::to_string(threads)};
  Progress progress(points.size() * variants.size() * static_cast<size_t>(o.repeats));
  std::vector<std::vector<std::vector<ChildRun>>> runs(
      points.size(), std::vector<std::vector<ChildRun>>(variants.size()));
  for (int rep = 0; rep < o.repeats; ++rep)
    for (size_t k = 0; k < points.size(); ++k)
      for (size_t v = 0; v < variants.size(); ++v) {
        progress.step(fmt("%s, workers %s", points[k].label.c_str(), variants[v].c_str()));
        const std::filesystem::path dir = a.out / "runs" / fmt("workers_%zu_%zu", k, v);
        std::vector<std::string> argv = {a.cocodiff.string(), "run", a.config.string(), "--out",
                                         dir.string(),        "-q"};
        argv.insert(argv.end(), points[k].sets.begin(), points[k].sets.end());
        if (variants[v] != "default")
          argv.insert(argv.end(), {"--set", "emulator.workers=" + variants[v]});
        ChildRun r = run_report(argv, dir);
        if (!r.ok()) fail(r, "workers run " + points[k].label);
        runs[k][v].push_back(std::move(r));
      }
  progress.done();
  Table t({"run", "default workers", "wall s: 1 / default / " + std::to_string(threads),
           "CPU s: 1 / default / " + std::to_string(threads), "default / 1 worker (wall)",
           "command"});
  for (size_t k = 0; k < points.size(); ++k) {
    std::vector<double> wall, cpu;
    for (size_t v = 0; v < variants.size(); ++v) {
      std::vector<double> w, c;
      for (const ChildRun& r : runs[k][v]) {
        w.push_back(r.wall_s);
        c.push_back(r.cpu_s);
        for (const char* key : {"output_sha256", "timeline_sha256", "virtual_time_s"})
          if (r.report[key] != runs[k][0].front().report[key]) {
            std::fprintf(stderr, "workers changed %s of %s\n", key, points[k].label.c_str());
            std::exit(1);
          }
      }
      wall.push_back(median(w));
      cpu.push_back(median(c));
    }
    std::string cmd = "cocodiff run " + a.config.string();
    for (size_t i = 1; i < points[k].sets.size(); i += 2) cmd += " --set " + points[k].sets[i];
    cmd += " [--set emulator.workers=W]";
    const int default_workers = runs[k][1].front().report["workers"].get<int>();
    t.add({points[k].label, std::to_string(default_workers),
           fmt("%.2f / %.2f / %.2f", wall[0], wall[1], wall[2]),
           fmt("%.2f / %.2f / %.2f", cpu[0], cpu[1], cpu[2]), fmt("%.2f", wall[1] / wall[0]), cmd},
          {{"run", points[k].label},
           {"default_workers", default_workers},
           {"median_wall_s", {{"1", wall[0]}, {"default", wall[1]}, {variants[2], wall[2]}}},
           {"median_cpu_s", {{"1", cpu[0]}, {"default", cpu[1]}, {variants[2], cpu[2]}}},
           {"command", cmd}});
  }
  t.finish(a, "emulator_workers",
           {{"hardware_threads", threads},
            {"repeats", o.repeats},
            {"note",
             "wall and CPU seconds of each child, medians of the repeats, the three worker "
             "settings interleaved; every setting gives the same output and timeline (checked)"}});
}

// Math throughput: bench_dit_block's block GFLOP/s against Eigen GEMM in the same run.
void math(const Args& a, const Options& o) {
  if (o.dit_block_bin.empty()) {
    std::fprintf(stderr, "math: bench_dit_block not known; skipped\n");
    return;
  }
  Progress progress(1);
  progress.step("bench_dit_block");
  const std::filesystem::path json = std::filesystem::absolute(a.out / "dit_block_raw.json");
  std::vector<std::string> argv = {o.dit_block_bin.string(), "--json", json.string()};
  if (a.smoke) argv.push_back("--smoke");
  const ChildRun r = run_command(argv, a.out / "dit_block_log.txt");
  if (r.exit_code != 0) fail(r, "bench_dit_block");
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  Table t({"size", "hidden", "tokens", "block GFLOP", "block GFLOP/s", "GEMM GFLOP/s", "ratio"});
  std::string dat = "# size block_gflops gemm_gflops\n";
  for (const auto& row : j["results"]) {
    const double b = row["block_gflops"].get<double>(), g = row["gemm_gflops"].get<double>();
    t.add({row["size"].get<std::string>(), std::to_string(row["hidden"].get<int>()),
           std::to_string(row["tokens"].get<long long>()),
           fmt("%.2f", row["block_gflop"].get<double>()), fmt("%.1f", b), fmt("%.1f", g),
           fmt("%.2f", b / g)},
          row);
    dat += fmt("\"%s\" %.6g %.6g\n", row["size"].get<std::string>().c_str(), b, g);
  }
  progress.done();
  t.finish(a, "emulator_math", {{"source", "bench_dit_block (bench/dit), 1 thread"}});
  plot(a, "emulator_math", dat,
       "set title 'real math: FLUX double-stream block vs Eigen GEMM of its projection (same "
       "run)'\nset style data histogram\nset style histogram cluster gap 1\n"
       "set style fill solid 0.8 border -1\nset grid ytics\nset ylabel 'GFLOP/s'\n"
       "set yrange [0:*]\nset key top left\n"
       "plot $DATA using 2:xtic(1) title 'transformer block' lc rgb '#0072B2', "
       "'' using 3 title 'Eigen GEMM' lc rgb '#E69F00'\n",
       800, 450);
}

// The memory estimate against the measured peak. Each run is `cocodiff run CONFIG --set ...`
// with emulator.workers set; the estimate is report.json's memory_estimate_bytes (what the run
// printed before it started), the peak is the child's ru_maxrss (posix_spawn shares this
// process's memory until the exec, so a peak below this process's own would be ours: checked).
struct MemoryRun {
  std::string group;   // "configs" (real math and phantom configs) or "tiles" (phantom, many tiles)
  std::string label;   // how the table names it
  std::string config;  // a file of configs/
  std::vector<std::string> sets;  // key=value, emulator.workers among them
};

// S1: one tile alone, serial.
const std::vector<std::string> kOneTile = {"cluster.nodes=1", "cluster.topology.sizes=[1,1]",
                                           "cluster.nic.rank_nic=[0]", "run.strategy=serial"};
// P96: phantom FLUX.1-dev 1024^2 on 8 Aurora nodes (96 tiles), one step.
const std::vector<std::string> kPhantom96 = {"model.preset=flux1-dev",    "run.math=skip",
                                             "run.resolution=1024",       "cluster.nodes=8",
                                             "ulysses.uneven_heads=true", "run.steps=1"};

std::vector<MemoryRun> memory_runs(const Options& o, bool smoke) {
  const auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::string quick = "quickstart.toml", tiny = "flux1-tiny-24tiles.toml";
  std::vector<MemoryRun> runs;
  if (smoke) {
    runs.push_back({"configs",
                    "quickstart.toml, 1 step",
                    quick,
                    {"run.steps=1", "emulator.workers=1", "emulator.trace=false"}});
    runs.push_back({"configs", "quickstart.toml `S1`, 1 step", quick,
                    with({"run.steps=1", "emulator.workers=1", "emulator.trace=false"}, kOneTile)});
  } else {
    runs = {
        {"configs", "flux1-dev phantom (`P96`)", tiny,
         with(kPhantom96, {"emulator.workers=1", "emulator.trace=false"})},
        {"configs", "flux1-dev phantom (`P96`)", tiny,
         with(kPhantom96, {"emulator.workers=1", "emulator.trace=true"})},
        {"configs",
         "flux1-tiny-24tiles.toml",
         tiny,
         {"emulator.workers=1", "emulator.trace=false"}},
        {"configs", "flux1-tiny-24tiles.toml", tiny, {"emulator.workers=1", "emulator.trace=true"}},
        {"configs",
         "flux1-tiny-24tiles.toml, cocodiff, threshold 0",
         tiny,
         {"run.strategy=cocodiff", "v_major.threshold=0", "emulator.workers=1",
          "emulator.trace=false"}},
        {"configs",
         "quickstart.toml (flux1-fmnist)",
         quick,
         {"emulator.workers=1", "emulator.trace=false"}},
        {"configs",
         "quickstart.toml (flux1-fmnist)",
         quick,
         {"emulator.workers=1", "emulator.trace=true"}},
        {"configs",
         "quickstart.toml, 16 workers",
         quick,
         {"emulator.workers=16", "emulator.trace=true"}},
        {"configs", "flux1-tiny-24tiles.toml `S1`", tiny,
         with({"emulator.workers=1", "emulator.trace=false"}, kOneTile)},
        {"configs", "flux1-tiny-24tiles.toml `S1`, 1024^2, 1 step", tiny,
         with({"run.resolution=1024", "run.steps=1", "emulator.workers=1", "emulator.trace=false"},
              kOneTile)},
        {"configs", "quickstart.toml `S1`", quick,
         with({"emulator.workers=1", "emulator.trace=false"}, kOneTile)},
        // The README's own phantom command: a trace of a million events.
        {"configs",
         "quickstart.toml phantom flux1-dev 1024^2, 2 steps",
         quick,
         {"run.math=skip", "model.preset=flux1-dev", "run.resolution=1024", "run.steps=2",
          "emulator.workers=1", "emulator.trace=true"}},
    };
  }
  // Many tiles: every pair of the widest collective holds its messages at once.
  const std::vector<std::string> big = {
      "model.preset=flux1-dev",    "run.math=skip",        "run.resolution=2048", "run.steps=1",
      "ulysses.uneven_heads=true", "emulator.trace=false", "emulator.workers=1"};
  for (const int tiles : o.memory_tiles)
    runs.push_back({"tiles", "flat, uniform", quick,
                    with(big, {"cluster.preset=uniform",
                               "cluster.nodes=" + std::to_string(std::max(1, tiles / 4)),
                               "run.strategy=flat"})});
  if (o.memory_aurora)
    for (const char* strategy : {"flat", "usp"})
      runs.push_back(
          {"tiles", std::string(strategy) + ", Aurora", quick,
           with(big, {"cluster.preset=aurora", "cluster.nodes=" + std::to_string(o.large_nodes),
                      std::string("run.strategy=") + strategy})});
  return runs;
}

// "21.8 MiB", "1.37 GiB": binary units, three significant digits (as `cocodiff run` prints them).
std::string mib_text(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = bytes;
  int u = 0;
  for (; v >= 1024.0 && u < 5; ++u) v /= 1024.0;
  if (u == 0) return fmt("%.0f B", bytes);
  return fmt(v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, kUnits[u]);
}

void memory(const Args& a, const Options& o) {
  const std::vector<MemoryRun> runs = memory_runs(o, a.smoke);
  Table t({"group", "run", "tiles", "workers", "trace", "events", "peak RSS", "estimate",
           "estimate / peak", "command"});
  Progress progress(runs.size());
  double lo = 1e300, hi = 0;
  int below = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const MemoryRun& m = runs[i];
    const std::string trace_set = "emulator.trace=true";
    const bool trace = std::find(m.sets.begin(), m.sets.end(), trace_set) != m.sets.end();
    progress.step(fmt("%s, trace %s", m.label.c_str(), trace ? "on" : "off"));
    const std::filesystem::path dir = a.out / "runs" / fmt("memory_%zu", i);
    std::vector<std::string> argv = {
        a.cocodiff.string(), "run", (a.config_dir / m.config).string(), "--out",
        dir.string(),        "-q"};
    std::string cmd = "cocodiff run configs/" + m.config;
    for (const std::string& kv : m.sets) {
      argv.insert(argv.end(), {"--set", kv});
      cmd += " --set " + kv;
    }
    const ChildRun r = run_report(argv, dir);
    if (!r.ok()) fail(r, "memory run " + m.label);
    const nlohmann::json& rep = r.report;
    const double peak = static_cast<double>(r.maxrss_kib) * 1024;
    const double estimate = rep["memory_estimate_bytes"].get<double>();
    rusage self{};
    getrusage(RUSAGE_SELF, &self);
    if (r.maxrss_kib <= self.ru_maxrss) {
      std::fprintf(stderr, "memory: %s peaked at %ld KiB, no more than this bench's own %ld KiB\n",
                   m.label.c_str(), r.maxrss_kib, self.ru_maxrss);
      std::exit(1);
    }
    const double ratio = estimate / peak;
    lo = std::min(lo, ratio);
    hi = std::max(hi, ratio);
    below += estimate < peak;
    const int tiles = rep["ranks"].get<int>(), workers = rep["workers"].get<int>();
    t.add({m.group, m.label, std::to_string(tiles), std::to_string(workers), trace ? "on" : "off",
           fmt("%.0f", rep["events"].get<double>()), mib_text(peak), mib_text(estimate),
           fmt("%.2f", ratio), cmd},
          {{"group", m.group},
           {"run", m.label},
           {"config", m.config},
           {"sets", m.sets},
           {"tiles", tiles},
           {"nodes", rep["nodes"]},
           {"strategy", rep["strategy"]},
           {"math", rep["math"]},
           {"steps", rep["steps"]},
           {"resolution", rep["resolution"]},
           {"workers", workers},
           {"trace", trace},
           {"events", rep["events"]},
           {"virtual_time_s", rep["virtual_time_s"]},
           {"peak_rss_bytes", static_cast<std::int64_t>(r.maxrss_kib) * 1024},
           {"memory_estimate_bytes", rep["memory_estimate_bytes"]},
           {"estimate_over_peak", ratio},
           {"upper_bound", estimate >= peak},
           {"cpu_s", r.cpu_s},
           {"wall_s", r.wall_s},
           {"command", cmd}});
  }
  progress.done();
  if (below > 0)
    std::fprintf(stderr, "memory: the estimate is below the peak on %d of %zu runs\n", below,
                 runs.size());
  t.finish(a, "memory_estimate",
           {{"runs", runs.size()},
            {"upper_bound_on_every_run", below == 0},
            {"estimate_over_peak_min", lo},
            {"estimate_over_peak_max", hi},
            {"note",
             "estimate = report.json memory_estimate_bytes (the estimate `cocodiff run` prints "
             "before the run); peak = ru_maxrss of the child cocodiff process (its VmHWM); one "
             "run at a time"}});
}

int main_impl(int argc, char** argv) {
  const Args a =
      parse_args(argc, argv,
                 " [--parts phantom,real,math,replay,grid,collective,large,video,workers,memory] "
                 "[--nodes 1,2,..] "
                 "[--model M] "
                 "[--resolution R] [--strategy S] [--blocks D,S] [--steps N] "
                 "[--real-nodes 2,8] [--real-model M] [--real-strategy S] [--real-steps 2] "
                 "[--baseline OLD_COCODIFF] "
                 "[--replay-strategies S,..] [--replay-nodes N] "
                 "[--replay-resolution R] [--replay-steps N] [--repeats N] "
                 "[--large-strategies S,..] [--large-nodes N] [--large-steps N] "
                 "[--video-strategies S,..] [--video-nodes N] [--video-steps N] "
                 "[--memory-tiles 256,512,..]");
  Options o;
  try {
    o = parse(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  if (o.parts.count("phantom")) phantom(a, o);
  if (o.parts.count("real")) real(a, o);
  if (o.parts.count("math")) math(a, o);
  if (o.parts.count("replay")) replay(a, o);
  if (o.parts.count("grid")) grid(a, o);
  if (o.parts.count("collective")) collective(a, o);
  if (o.parts.count("large")) large(a, o);
  if (o.parts.count("video")) video(a, o);
  if (o.parts.count("workers")) workers(a, o);
  if (o.parts.count("memory")) memory(a, o);
  return 0;
}

}  // namespace
}  // namespace cocodiff::bench

int main(int argc, char** argv) { return cocodiff::bench::main_impl(argc, argv); }
