// The CoCoDiff paper's study on the emulator (phantom mode), driving `cocodiff run`:
//  speedup    flat vs tapa vs cocodiff per step, for models x resolutions x node counts;
//  exposed    the critical tile's virtual time split into compute and exposed communication
//             (from the speedup runs: no extra runs);
//  breakdown  flat -> +tapa -> +v_first -> +pipeline -> +v_major for one model/resolution/size;
//  a2a        all-to-all time on one node vs message size, flat vs tapa (`cocodiff netbench`).
// Every part prints a table and writes <out>/study_<part>[_cluster].{csv,json,png}.
//
// Times are per denoising step. Exact strategies cost the same every step, so one step is run.
// V-Major (in cocodiff) sends everything during its warm-up steps, so cocodiff runs 1 and 2
// steps with v_major.warmup_steps = 1 and its steady-state step is T(2) - T(1). In phantom mode
// V-Major cannot measure change: the share of blocks sent is v_major.phantom_active_fraction.
//
//   study [--out DIR] [--smoke] [--parts speedup,breakdown,a2a] [--cluster aurora]
//         [--models flux1-dev,sd35-large,...] [--resolutions 1024,2048] [--nodes 1,2,4,8]
//         [--reuse] [--jobs N]
//
// The speedup part's runs are independent: --jobs of them (default: the hardware threads over
// --workers) run side by side as child processes.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "bench/common/bench_util.hpp"
#include "core/config.hpp"
#include "dit/attention_strategy.hpp"

namespace cocodiff::bench {
namespace {

struct Options {
  std::set<std::string> parts = {"speedup", "breakdown", "a2a"};
  std::string cluster = "aurora";
  std::vector<std::string> models = {"flux1-dev", "sd35-large", "qwen-image", "sd35-medium"};
  std::vector<int> resolutions = {1024, 2048, 4096};
  std::vector<int> nodes = {1, 2, 4, 8};
  std::string breakdown_model = "flux1-dev";
  int breakdown_resolution = 2048;
  int breakdown_nodes = 4;
  bool reuse = false;  // read an existing report.json instead of running again
  int jobs = 0;        // runs side by side; 0: hardware threads / workers
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) v.push_back(x);
  return v;
}

Options parse(const Args& a) {
  Options o;
  if (a.smoke) {
    o.models = {"flux1-dev"};
    o.resolutions = {1024};
    o.nodes = {1, 2};
    o.breakdown_resolution = 1024;
    o.breakdown_nodes = 1;
  }
  for (size_t i = 0; i < a.rest.size(); ++i) {
    const std::string& k = a.rest[i];
    if (k == "--reuse") {
      o.reuse = true;
      continue;
    }
    if (i + 1 >= a.rest.size()) throw std::runtime_error("missing value after " + k);
    const std::string v = a.rest[++i];
    if (k == "--parts") {
      const auto p = split(v);
      o.parts = std::set<std::string>(p.begin(), p.end());
    } else if (k == "--cluster") {
      o.cluster = v;
    } else if (k == "--jobs") {
      o.jobs = std::max(0, std::stoi(v));
    } else if (k == "--models") {
      o.models = split(v);
    } else if (k == "--resolutions") {
      o.resolutions = int_list(v);
    } else if (k == "--nodes") {
      o.nodes = int_list(v);
    } else if (k == "--breakdown") {  // model,resolution,nodes
      const auto p = split(v);
      if (p.size() != 3) throw std::runtime_error("--breakdown wants model,resolution,nodes");
      o.breakdown_model = p[0];
      o.breakdown_resolution = std::stoi(p[1]);
      o.breakdown_nodes = std::stoi(p[2]);
    } else {
      throw std::runtime_error("unknown option " + k);
    }
  }
  return o;
}

// One phantom run (or its earlier report with --reuse).
ChildRun phantom_run(const Args& a, const Options& o, const std::string& model, int res, int nodes,
                     const std::string& strategy, int steps) {
  std::string sname = strategy;
  std::replace(sname.begin(), sname.end(), '+', '-');
  const std::string name = fmt("%s_%s_%d_n%d_%s_s%d", o.cluster.c_str(), model.c_str(), res, nodes,
                               sname.c_str(), steps);
  if (o.reuse) {
    std::ifstream in(a.out / "runs" / name / "report.json");
    if (in) {
      ChildRun r;
      r.exit_code = 0;
      r.report = nlohmann::json::parse(in);
      r.dir = a.out / "runs" / name;
      return r;
    }
  }
  return run_cocodiff(a, {"--set", "run.math=skip",
                          "--set", "model.preset=" + model,
                          "--set", "run.resolution=" + std::to_string(res),
                          "--set", "run.steps=" + std::to_string(steps),
                          "--set", "cluster.preset=" + o.cluster,
                          "--set", "cluster.nodes=" + std::to_string(nodes),
                          "--set", "run.strategy=" + strategy,
                          "--set", "ulysses.uneven_heads=true",
                          "--set", "v_major.warmup_steps=1",
                          "--set", "emulator.trace=false"},
                      name);
}

struct StepTime {
  bool ok = false;
  std::string error;
  double step_s = 0;            // virtual seconds per (steady-state) step
  double compute_s = 0;         // critical tile, per step
  double exposed_s = 0;         // critical tile, per step
  double warm_step_s = 0;       // V-Major: the warm-up step
  double v_saved_fraction = 0;  // V-Major: share of V bytes not sent on its tiers
  int ranks = 0;
  double wall_s = 0;
};

// Per-step virtual time of a strategy; with V-Major, the steady-state step T(2) - T(1).
StepTime step_time(const Args& a, const Options& o, const std::string& model, int res, int nodes,
                   const std::string& strategy) {
  StepTime t;
  const bool vmajor = strategy == "cocodiff" || strategy.find("v_major") != std::string::npos;
  const ChildRun r1 = phantom_run(a, o, model, res, nodes, strategy, 1);
  if (!r1.ok()) {
    t.error = r1.error;
    return t;
  }
  auto get = [](const ChildRun& r, const char* k) {
    return r.report["breakdown"][k].get<double>();
  };
  t.ranks = r1.report["ranks"].get<int>();
  t.wall_s = r1.report["wall_time_s"].get<double>();
  t.step_s = r1.report["virtual_time_s"].get<double>();
  t.compute_s = get(r1, "compute_s");
  t.exposed_s = get(r1, "exposed_comm_s");
  if (vmajor) {
    const ChildRun r2 = phantom_run(a, o, model, res, nodes, strategy, 2);
    if (!r2.ok()) {
      t.error = r2.error;
      return t;
    }
    t.wall_s += r2.report["wall_time_s"].get<double>();
    t.warm_step_s = t.step_s;
    t.step_s = r2.report["virtual_time_s"].get<double>() - t.step_s;
    t.compute_s = get(r2, "compute_s") - t.compute_s;
    t.exposed_s = get(r2, "exposed_comm_s") - t.exposed_s;
    double full = 0, sent = 0;  // no V-Major section: no selective tier (one node)
    const nlohmann::json& ss = r2.report["strategy_stats"];
    if (ss.contains("v_major") && ss["v_major"].contains("tiers"))
      for (const auto& tier : ss["v_major"]["tiers"]) {
        full += tier["v_full_bytes"].get<double>();
        sent += tier["v_sent_bytes"].get<double>();
      }
    // Two steps, the first sent in full: the second step's saving is twice the run's.
    t.v_saved_fraction = full > 0 ? 2 * (1 - sent / full) : 0;
  }
  t.ok = true;
  return t;
}

std::string short_model(const std::string& m) {
  if (m == "flux1-dev") return "FLUX.1-dev";
  if (m == "sd35-large") return "SD3.5-L";
  if (m == "sd35-medium") return "SD3.5-M";
  if (m == "qwen-image") return "Qwen-Image";
  return m;
}

// Resolutions a model accepts (SD3.5's position embedding stops at 192 patches per side).
bool allowed(const std::string& model, int res) {
  return !((model == "sd35-large" || model == "sd35-medium") && res > 3072);
}

// End to end over the model's default step count: exact strategies cost the same every step;
// cocodiff's V-Major sends everything during its warm-up steps and every refresh step (the
// defaults, 2 and every 10th), which cost the measured warm-up step, the others the steady one.
struct EndToEnd {
  int steps = 0, full_steps = 0;
};
EndToEnd end_to_end(const Args& a, const std::string& model) {
  const Config c = Config::load(a.config_dir / "models" / (model + ".toml"));
  const dit::StrategyOptions def;
  EndToEnd e;
  e.steps = static_cast<int>(c.get_int("steps", 28, 1, 100000));
  for (int s = 0; s < e.steps; ++s)
    if (s < def.v_major_warmup_steps ||
        (def.v_major_refresh_every > 0 && s % def.v_major_refresh_every == 0))
      ++e.full_steps;
  return e;
}

void speedup(const Args& a, const Options& o) {
  const std::vector<std::string> strategies = {"flat", "tapa", "cocodiff"};
  Table t({"model", "res", "nodes", "tiles", "flat ms/step", "tapa ms/step", "cocodiff ms/step",
           "tapa x", "cocodiff x", "flat exposed %", "cocodiff exposed %", "steps", "flat s/image",
           "cocodiff s/image", "cocodiff x image", "wall s"});
  Table e({"model", "res", "nodes", "strategy", "compute ms", "exposed ms", "exposed %"});
  // Every (model, resolution, nodes, strategy) is an independent run: run them side by side
  // first, then tabulate in order.
  struct Task {
    std::string model;
    int res, nodes;
    std::string strategy;
  };
  std::vector<Task> tasks;
  for (const auto& m : o.models)
    for (int res : o.resolutions)
      if (allowed(m, res))
        for (int n : o.nodes)
          for (const auto& s : strategies) tasks.push_back({m, res, n, s});
  std::vector<StepTime> done(tasks.size());
  {
    const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const size_t jobs = std::min(
        tasks.size(),
        static_cast<size_t>(o.jobs > 0 ? o.jobs : std::max(1, hw / std::max(1, a.workers))));
    Progress progress(tasks.size());
    std::mutex mu;
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next++) < tasks.size();) {
        const Task& k = tasks[i];
        {
          std::lock_guard<std::mutex> lk(mu);
          progress.step(fmt("%s %dpx %d node(s) %s on %s (%zu at a time)", k.model.c_str(), k.res,
                            k.nodes, k.strategy.c_str(), o.cluster.c_str(), jobs));
        }
        done[i] = step_time(a, o, k.model, k.res, k.nodes, k.strategy);
      }
    };
    std::vector<std::thread> threads;
    for (size_t j = 1; j < jobs; ++j) threads.emplace_back(work);
    work();
    for (std::thread& th : threads) th.join();
    progress.done();
  }
  size_t next_done = 0;
  std::ostringstream dat;
  dat << "# group model res nodes tapa_x cocodiff_x\n";
  // Exposed-communication shares: one gnuplot data block (index) per model.
  std::map<std::string, std::ostringstream> exposed_dat;
  std::vector<double> tapa_x, cc_x, cc_image_x;
  std::map<std::string, int> groups_per_model;
  for (const auto& m : o.models) {
    for (int res : o.resolutions) {
      if (!allowed(m, res)) continue;
      for (int n : o.nodes) {
        std::map<std::string, StepTime> st;
        double wall = 0;
        std::string err;
        for (const auto& s : strategies) {
          st[s] = done[next_done++];
          wall += st[s].wall_s;
          if (!st[s].ok) err = s + ": " + st[s].error;
        }
        if (!err.empty()) {
          std::fprintf(stderr, "  skipped: %s\n", err.c_str());
          t.add({short_model(m), std::to_string(res), std::to_string(n), "-", "failed"},
                {{"model", m}, {"resolution", res}, {"nodes", n}, {"error", err}});
          continue;
        }
        const double f = st["flat"].step_s, tp = st["tapa"].step_s, cc = st["cocodiff"].step_s;
        tapa_x.push_back(f / tp);
        cc_x.push_back(f / cc);
        const EndToEnd e2e = end_to_end(a, m);
        const double flat_image = e2e.steps * f;
        const double cc_image =
            e2e.full_steps * st["cocodiff"].warm_step_s + (e2e.steps - e2e.full_steps) * cc;
        cc_image_x.push_back(flat_image / cc_image);
        t.add({short_model(m), std::to_string(res), std::to_string(n),
               std::to_string(st["flat"].ranks), fmt("%.2f", f * 1e3), fmt("%.2f", tp * 1e3),
               fmt("%.2f", cc * 1e3), fmt("%.2f", f / tp), fmt("%.2f", f / cc),
               fmt("%.1f", 100 * st["flat"].exposed_s / f),
               fmt("%.1f", 100 * st["cocodiff"].exposed_s / cc), std::to_string(e2e.steps),
               fmt("%.2f", flat_image), fmt("%.2f", cc_image), fmt("%.2f", flat_image / cc_image),
               fmt("%.1f", wall)},
              {{"model", m},
               {"resolution", res},
               {"nodes", n},
               {"tiles", st["flat"].ranks},
               {"flat_step_s", f},
               {"tapa_step_s", tp},
               {"cocodiff_step_s", cc},
               {"cocodiff_warmup_step_s", st["cocodiff"].warm_step_s},
               {"cocodiff_v_saved_fraction", st["cocodiff"].v_saved_fraction},
               {"tapa_speedup", f / tp},
               {"cocodiff_speedup", f / cc},
               {"flat_exposed_s", st["flat"].exposed_s},
               {"tapa_exposed_s", st["tapa"].exposed_s},
               {"cocodiff_exposed_s", st["cocodiff"].exposed_s},
               {"image_steps", e2e.steps},
               {"cocodiff_full_steps", e2e.full_steps},
               {"flat_image_s", flat_image},
               {"cocodiff_image_s", cc_image},
               {"cocodiff_image_speedup", flat_image / cc_image},
               {"wall_s", wall}});
        dat << fmt("\"%s %d/%dn\" %s %d %d %.6g %.6g\n", short_model(m).c_str(), res, n, m.c_str(),
                   res, n, f / tp, f / cc);
        ++groups_per_model[m];
        for (const auto& s : strategies) {
          const StepTime& x = st[s];
          e.add({short_model(m), std::to_string(res), std::to_string(n), s,
                 fmt("%.2f", x.compute_s * 1e3), fmt("%.2f", x.exposed_s * 1e3),
                 fmt("%.1f", 100 * x.exposed_s / x.step_s)},
                {{"model", m},
                 {"resolution", res},
                 {"nodes", n},
                 {"strategy", s},
                 {"compute_s", x.compute_s},
                 {"exposed_s", x.exposed_s},
                 {"step_s", x.step_s}});
          exposed_dat[m] << fmt("\"%d/%dn %s\" %.6g %.6g\n", res, n, s.c_str(),
                                100 * x.compute_s / x.step_s, 100 * x.exposed_s / x.step_s);
        }
        exposed_dat[m] << "\"\" 0 0\n";  // a gap between configurations
      }
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  auto peak = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  const nlohmann::json meta = {
      {"cluster", o.cluster},
      {"mode", "phantom (run.math=skip), ulysses.uneven_heads=true"},
      {"per_step",
       "exact strategies: 1-step runs; cocodiff: T(2 steps) - T(1 step) with "
       "v_major.warmup_steps=1 (steady state); phantom V-Major sends "
       "v_major.phantom_active_fraction (1, measured: the trained models send every block at "
       "the default threshold) of the blocks on inter-node"},
      {"tapa_speedup_mean", mean(tapa_x)},
      {"tapa_speedup_peak", peak(tapa_x)},
      {"cocodiff_speedup_mean", mean(cc_x)},
      {"cocodiff_speedup_peak", peak(cc_x)},
      {"image",
       "s/image: the model's default step count; cocodiff's warm-up (2) and refresh (every "
       "10th) steps cost its measured full step, the others its steady-state step"},
      {"cocodiff_image_speedup_mean", mean(cc_image_x)},
      {"cocodiff_image_speedup_peak", peak(cc_image_x)}};
  const std::string sfx = o.cluster == "aurora" ? "" : "_" + o.cluster;
  t.finish(a, "study_speedup" + sfx, meta);
  std::printf(
      "mean speedup over flat: tapa %.2fx, cocodiff %.2fx; peak: tapa %.2fx, cocodiff %.2fx; "
      "whole image (default steps): cocodiff %.2fx mean, %.2fx peak\n",
      mean(tapa_x), mean(cc_x), peak(tapa_x), peak(cc_x), mean(cc_image_x), peak(cc_image_x));
  e.finish(a, "study_exposed" + sfx, {{"cluster", o.cluster}, {"per_step", meta["per_step"]}});
  const int groups = static_cast<int>(cc_x.size());
  plot(a, "study_speedup" + sfx, dat.str(),
       fmt("set title 'speedup per denoising step over flat Ulysses, phantom mode, %s (labels: "
           "model res/nodes; mean cocodiff %.2fx, peak %.2fx)'\n",
           o.cluster.c_str(), mean(cc_x), peak(cc_x)) +
           "set style data histogram\nset style histogram cluster gap 1\n"
           "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset grid ytics\n"
           "set ylabel 'speedup over flat (x)'\nset yrange [0:*]\nset key top left\n"
           "set xtics rotate by -60 font 'sans,8' nomirror\n"
           "set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555'\n"
           "plot $DATA using 5:xtic(1) title 'tapa' lc rgb '#E69F00', '' using 6 title "
           "'cocodiff (tapa+v_first+pipeline+v_major)' lc rgb '#0072B2'\n",
       std::max(900, 60 + groups * 34), 560);
  // One panel per model: for each resolution and node count, flat / tapa / cocodiff as bars
  // stacked to 100% of the critical tile's step (compute below, exposed communication above).
  std::string blocks, panels;
  int panel = 0, widest = 0;
  for (const auto& m : o.models) {
    if (!exposed_dat.count(m)) continue;
    blocks += (panel > 0 ? "\n\n" : "") + exposed_dat[m].str();
    panels += fmt("set title '%s'\n", short_model(m).c_str()) +
              fmt("plot $DATA index %d using 2:xtic(1) title 'compute' lc rgb '#0072B2', '' "
                  "index %d using 3 title 'exposed communication' lc rgb '#A50F15'\n",
                  panel, panel) +
              (panel == 0 ? "unset key\n" : "");
    widest = std::max(widest, 4 * groups_per_model[m]);
    ++panel;
  }
  if (panel > 0)
    plot(a, "study_exposed" + sfx, blocks,
         fmt("set multiplot layout %d,1 title 'share of each step spent computing and waiting for "
             "communication (critical tile), phantom mode, %s'\n",
             panel, o.cluster.c_str()) +
             "set style data histogram\nset style histogram rowstacked\n"
             "set style fill solid 0.85 border -1\nset boxwidth 0.8\nset grid ytics\n"
             "set ylabel '% of step'\nset yrange [0:100]\nset key outside right top\n"
             "set xtics rotate by -60 font 'sans,8' nomirror\n" +
             panels + "unset multiplot\n",
         std::max(900, 200 + widest * 24), 330 * panel);
}

void breakdown(const Args& a, const Options& o) {
  const std::vector<std::pair<std::string, std::string>> steps = {
      {"flat", "flat"},
      {"+tapa", "tapa"},
      {"+v_first", "tapa+v_first"},
      {"+pipeline", "tapa+v_first+pipeline"},
      {"+v_major", "tapa+v_first+pipeline+v_major"}};
  Table t(
      {"strategy", "run.strategy", "ms/step", "x flat", "compute ms", "exposed ms", "exposed %"});
  Progress progress(steps.size());
  std::ostringstream dat;
  dat << "# label step_ms speedup compute_ms exposed_ms\n";
  double flat = 0;
  for (const auto& [label, strategy] : steps) {
    progress.step(label);
    const StepTime s =
        step_time(a, o, o.breakdown_model, o.breakdown_resolution, o.breakdown_nodes, strategy);
    if (!s.ok) {
      std::fprintf(stderr, "%s failed: %s\n", strategy.c_str(), s.error.c_str());
      std::exit(1);
    }
    if (flat == 0) flat = s.step_s;
    t.add({label, strategy, fmt("%.2f", s.step_s * 1e3), fmt("%.2f", flat / s.step_s),
           fmt("%.2f", s.compute_s * 1e3), fmt("%.2f", s.exposed_s * 1e3),
           fmt("%.1f", 100 * s.exposed_s / s.step_s)},
          {{"label", label},
           {"strategy", strategy},
           {"step_s", s.step_s},
           {"speedup", flat / s.step_s},
           {"compute_s", s.compute_s},
           {"exposed_s", s.exposed_s},
           {"v_saved_fraction", s.v_saved_fraction}});
    dat << fmt("\"%s\" %.6g %.6g %.6g %.6g\n", label.c_str(), s.step_s * 1e3, flat / s.step_s,
               s.compute_s * 1e3, s.exposed_s * 1e3);
  }
  progress.done();
  const std::string what = fmt("%s %dpx, %d %s node(s)", o.breakdown_model.c_str(),
                               o.breakdown_resolution, o.breakdown_nodes, o.cluster.c_str());
  const std::string sfx = o.cluster == "aurora" ? "" : "_" + o.cluster;
  t.finish(a, "study_breakdown" + sfx,
           {{"config", what}, {"per_step", "steady state; see study_speedup meta"}});
  plot(a, "study_breakdown" + sfx, dat.str(),
       "set title 'breakdown, " + what +
           ": virtual ms per step (critical tile), speedup over flat on top'\n"
           "set style data histogram\nset style histogram rowstacked\n"
           "set style fill solid 0.85 border -1\nset boxwidth 0.6\nset grid ytics\n"
           "set ylabel 'virtual ms per step'\nset yrange [0:*]\nset key top right\n"
           "plot $DATA using 4:xtic(1) title 'compute' lc rgb '#0072B2', '' using 5 title "
           "'exposed communication' lc rgb '#A50F15', '' using 0:2:(sprintf('%.2fx', $3)) "
           "with labels offset 0,0.8 notitle\n",
       900, 520);
}

void a2a(const Args& a, const Options& o) {
  Table t({"bytes per rank", "flat us", "tapa us", "tapa x", "flat busbw GB/s", "tapa busbw GB/s"});
  std::map<std::string, nlohmann::json> res;
  Progress progress(2);
  for (const std::string algo : {"flat", "tapa"}) {
    progress.step("netbench " + algo);
    const std::filesystem::path json = std::filesystem::absolute(a.out / ("a2a_" + algo + ".json"));
    std::vector<std::string> argv = {a.cocodiff.string(), "netbench",
                                     (a.config_dir / "clusters" / (o.cluster + ".toml")).string(),
                                     "--set", "cluster.nodes=1", "--op", "all_to_all", "--algo",
                                     algo, "--min-bytes", a.smoke ? "64K" : "1K", "--max-bytes",
                                     a.smoke ? "256K" : "256M",
                                     // One call, pairwise rounds: the study's sweep as it was
                                     // recorded (netbench's defaults are calibrate's).
                                     "--rounds", "pairwise", "-w", "0", "-n", "1", "--workers",
                                     std::to_string(a.workers), "--json", json.string()};
    const ChildRun r = run_command(argv, a.out / ("a2a_" + algo + ".log"));
    if (r.exit_code != 0) {
      std::fprintf(stderr, "netbench %s failed: %s\n", algo.c_str(), r.error.c_str());
      std::exit(1);
    }
    std::ifstream in(json);
    res[algo] = nlohmann::json::parse(in);
  }
  progress.done();
  std::ostringstream dat;
  dat << "# bytes flat_us tapa_us\n";
  const auto& fr = res["flat"]["rows"];
  const auto& tr = res["tapa"]["rows"];
  for (size_t i = 0; i < fr.size() && i < tr.size(); ++i) {
    const double b = fr[i]["bytes"].get<double>();
    const double f = fr[i]["time_ns"].get<double>() / 1e3, p = tr[i]["time_ns"].get<double>() / 1e3;
    t.add({fmt("%.0f", b), fmt("%.1f", f), fmt("%.1f", p), fmt("%.2f", f / p),
           fmt("%.1f", fr[i]["busbw_gbytes_per_s"].get<double>()),
           fmt("%.1f", tr[i]["busbw_gbytes_per_s"].get<double>())},
          {{"bytes", b}, {"flat_us", f}, {"tapa_us", p}, {"tapa_speedup", f / p}});
    dat << fmt("%.0f %.6g %.6g\n", b, f, p);
  }
  const std::string sfx = o.cluster == "aurora" ? "" : "_" + o.cluster;
  t.finish(a, "study_a2a" + sfx,
           {{"cluster", o.cluster},
            {"ranks", res["flat"]["ranks"]},
            {"source", "cocodiff netbench --op all_to_all (pairwise rounds, bf16 wire)"}});
  plot(a, "study_a2a" + sfx, dat.str(),
       "set title 'all-to-all on one " + o.cluster + " node (" +
           std::to_string(res["flat"]["ranks"].get<int>()) +
           " ranks): virtual time vs send buffer per rank'\n"
           "set logscale xy\nset grid\nset key top left\nset format x '%.0s%cB'\n"
           "set xlabel 'bytes sent per rank'\nset ylabel 'virtual time (us)'\n"
           "plot $DATA using 1:2 with linespoints lw 2 pt 7 lc rgb '#A50F15' title 'flat', "
           "$DATA using 1:3 with linespoints lw 2 pt 5 lc rgb '#0072B2' title 'tapa'\n",
       900, 540);
}

int main_impl(int argc, char** argv) {
  const Args a = parse_args(argc, argv,
                            " [--parts speedup,breakdown,a2a] [--cluster C] [--models a,b] "
                            "[--resolutions 1024,2048] [--nodes 1,2,4,8] "
                            "[--breakdown model,res,nodes] [--reuse]");
  Options o;
  try {
    o = parse(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
  if (o.parts.count("a2a")) a2a(a, o);
  if (o.parts.count("breakdown")) breakdown(a, o);
  if (o.parts.count("speedup")) speedup(a, o);
  return 0;
}

}  // namespace
}  // namespace cocodiff::bench

int main(int argc, char** argv) { return cocodiff::bench::main_impl(argc, argv); }
