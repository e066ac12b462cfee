// The paper's quality experiment on the trained model: inpainting held-back Fashion-MNIST test
// images with flux1-fmnist (real math, 24 emulated Aurora tiles), flat Ulysses (exact) against
// cocodiff at a sweep of V-Major thresholds. Per setting, over the image set (median, min, max):
// PSNR, SSIM and MSE of the picture against the ground truth (whole image and the masked
// region) and against the exact run, the share of V bytes sent on the selective tier, the
// virtual time per run and per step and the speedup over flat; and the speedup projected to
// paper scale: a phantom FLUX.1-dev run on the Aurora preset whose V-Major sends the share of
// V blocks measured on the trained model at that threshold (v_major.phantom_active_fraction).
//
//   inpaint_quality [--out DIR] [--smoke] [--images DIR] [--limit N] [--masks centre,lower]
//                   [--thresholds 0,0.02,...] [--nodes 2] [--steps 20]
//                   [--project-model flux1-dev] [--project-resolution 2048]
//                   [--project-nodes 2,8] [--project-steps 28] [--jobs N]
// --jobs runs that many images at once (each emulated run stays on one worker thread; results
// do not depend on it).
//   -> DIR/inpaint_quality.{csv,json,png}

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench/common/bench_util.hpp"
#include "core/config.hpp"
#include "dit/image.hpp"
#include "dit/model_config.hpp"
#include "dit/parallel/v_major.hpp"
#include "dit/pipeline.hpp"
#include "dit/quality.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"

namespace cocodiff::bench {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kSeed = 42;  // the quickstart's seed: every run of an image draws alike

struct Options {
  fs::path images = fs::path(COCODIFF_SOURCE_DIR) / "bench" / "paper" / "data" / "fmnist_test";
  int limit = 0;  // 0: every image
  std::vector<std::string> masks = {"centre"};
  std::vector<double> thresholds = {0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1};
  int nodes = 2;
  int steps = 0;  // 0: the model's default (20)
  std::string project_model = "flux1-dev";
  int project_resolution = 2048;
  std::vector<int> project_nodes = {2};
  int project_steps = 28;
};

struct Image {
  std::string name;
  int label = 0;
  dit::Rgb pixels;
};

// One emulated run's picture, virtual time and V-Major traffic.
struct Run {
  Tensor picture;  // [1, H*W] gray levels 0..255 of the final image (what image.png shows)
  double virtual_s = 0;
  double full_elements = 0, sent_elements = 0;  // V on the selective tier, all ranks
  std::int64_t blocks = 0, active_blocks = 0;
};

// The gray levels of a pixel-space latent as a [1, H*W] tensor (values 0..255).
Tensor gray(const Tensor& latent, int h, int w) {
  const dit::Rgb img = dit::pixel_image(latent, h, w);
  Tensor t = Tensor::zeros(1, std::int64_t{h} * w, false);
  for (std::int64_t i = 0; i < t.cols(); ++i)
    t.mat()(0, i) = static_cast<float>(img.pixels[static_cast<size_t>(i) * 3]);
  return t;
}

Run run_once(const Options& o, const Args& a, const dit::ModelConfig& mc,
             const dit::Weights& weights, const dit::RunSettings& settings) {
  Config cfg =
      Config::parse("[cluster]\npreset = \"aurora\"\nnodes = " + std::to_string(o.nodes) + "\n",
                    "<inpaint_quality>");
  Cluster cluster = load_cluster(cfg, a.config_dir / "clusters");
  // The engine as `cocodiff run` sets it up: the cluster's collective library and its choice of
  // all-to-all schedule, bf16 on the wire.
  emu::EngineOptions eo;
  eo.workers = a.workers;
  eo.trace = false;
  eo.all_to_all_algorithm = "library";
  eo.library = cluster.library;
  emu::Engine engine(cluster.topology, std::move(cluster.network), cluster.device, eo);
  Run res;
  std::mutex mu;
  std::vector<dit::StrategyStats> stats(static_cast<size_t>(cluster.topology.num_ranks()));
  const emu::RunResult rr = engine.run([&](Communicator& comm) {
    dit::RunOutput out = dit::generate(comm, mc, weights, settings);
    std::lock_guard<std::mutex> lk(mu);
    stats[static_cast<size_t>(comm.rank())] = out.strategy_stats;
    if (comm.rank() == 0) res.picture = gray(out.latent, out.latent_height, out.latent_width);
  });
  res.virtual_s = rr.makespan.seconds();
  for (const dit::StrategyStats& s : stats)
    for (const auto& [tier, v] : s.v_major) {
      res.full_elements += v.full_elements;
      res.sent_elements += v.sent_elements;
      res.blocks += v.blocks;
      res.active_blocks += v.active_blocks;
    }
  return res;
}

// The pixels of `t` ([1, H*W]) inside the rectangle [x0, x0+w) x [y0, y0+h) of an n-wide image.
Tensor crop(const Tensor& t, int n, int x0, int y0, int w, int h) {
  Tensor c = Tensor::zeros(1, std::int64_t{w} * h, false);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      c.mat()(0, std::int64_t{y} * w + x) = t.mat()(0, std::int64_t{y0 + y} * n + x0 + x);
  return c;
}

double mse(const Tensor& a, const Tensor& b) {
  return static_cast<double>((a.mat() - b.mat()).squaredNorm()) / static_cast<double>(a.numel());
}

// A masked rectangle of an n x n image: "centre" (the middle n/2 x n/2) or "lower" (the lower
// half).
struct MaskRect {
  int x, y, w, h;
};
MaskRect mask_rect(const std::string& name, int n) {
  if (name == "centre") return {n / 4, n / 4, n / 2, n / 2};
  return {0, n / 2, n, n - n / 2};
}

// Metrics of one picture. Identical pictures have an infinite PSNR.
struct Metrics {
  double psnr_gt, ssim_gt, mse_gt;     // whole image vs ground truth
  double psnr_gtr, ssim_gtr, mse_gtr;  // masked region vs ground truth
  double psnr_ex, ssim_ex, mse_ex;     // whole image vs the exact (flat) run
};

Metrics measure(const Tensor& pic, const Tensor& gt, const Tensor& exact, int n, MaskRect r) {
  Metrics m{};
  m.psnr_gt = dit::psnr(gt, pic, 255);
  m.ssim_gt = dit::ssim(gt, pic, n, n, 255);
  m.mse_gt = mse(gt, pic);
  const Tensor gr = crop(gt, n, r.x, r.y, r.w, r.h), pr = crop(pic, n, r.x, r.y, r.w, r.h);
  m.psnr_gtr = dit::psnr(gr, pr, 255);
  m.ssim_gtr = dit::ssim(gr, pr, r.h, r.w, 255);
  m.mse_gtr = mse(gr, pr);
  m.psnr_ex = dit::psnr(exact, pic, 255);
  m.ssim_ex = dit::ssim(exact, pic, n, n, 255);
  m.mse_ex = mse(exact, pic);
  return m;
}

// Median, min and max of a sample (infinities sort last; the median of an even count is the
// mean of the middle two, infinite if either is).
struct Summary {
  double median, min, max;
};
Summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  const double med = k % 2 == 1 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
  return {med, v.front(), v.back()};
}
nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }
nlohmann::json json_of(const Summary& s) {
  return {{"median", num(s.median)}, {"min", num(s.min)}, {"max", num(s.max)}};
}
std::string cell(double x, const char* f) { return std::isfinite(x) ? fmt(f, x) : "inf"; }
std::string dat(double x) { return std::isfinite(x) ? fmt("%.6g", x) : std::string("NaN"); }

std::vector<Image> load_images(const Options& o) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(o.images))
    if (e.path().extension() == ".png") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (o.limit > 0 && files.size() > static_cast<size_t>(o.limit))
    files.resize(static_cast<size_t>(o.limit));
  std::vector<Image> out;
  for (const fs::path& f : files) {
    // c<label>_<class>_<t10k index>.png (bench/paper/data/export_fmnist_test.py)
    const std::string stem = f.stem().string();
    if (stem.size() < 2 || stem[0] != 'c' || stem[1] < '0' || stem[1] > '9') {
      std::fprintf(stderr, "inpaint_quality: %s: expected a name c<label>_..., skipped\n",
                   f.c_str());
      continue;
    }
    out.push_back({stem, stem[1] - '0', dit::read_png(f)});
  }
  return out;
}

// Runs f(0) ... f(count - 1) on `jobs` threads (each run has its own engine; the weights are
// shared read-only). Blocking.
template <typename F>
void parallel_for(size_t count, int jobs, F&& f) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < count; i = next++) f(i);
  };
  std::vector<std::thread> pool;
  for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

struct Setting {
  std::string label;
  std::string strategy;
  double threshold;
};

int main_impl(int argc, char** argv) {
  const Args a =
      parse_args(argc, argv,
                 " [--images DIR] [--limit N] [--masks centre,lower] [--thresholds "
                 "a,b] [--nodes N] [--steps S] [--project-model M] "
                 "[--project-resolution R] [--project-nodes a,b] [--project-steps S] [--jobs N]");
  Options o;
  int jobs = 1;  // images (and projection runs) in flight at once
  if (a.smoke) {
    o.limit = 1;
    o.steps = 4;
    o.thresholds = {0, 0.2};
    o.project_resolution = 512;
    o.project_steps = 3;
  }
  if (a.rest.size() % 2 != 0) {
    std::fprintf(stderr, "%s: missing value after %s\n", argv[0], a.rest.back().c_str());
    return 2;
  }
  for (size_t i = 0; i + 1 < a.rest.size(); i += 2) {
    const std::string& k = a.rest[i];
    const std::string& v = a.rest[i + 1];
    auto split = [&v] {
      std::vector<std::string> out;
      std::stringstream ss(v);
      std::string x;
      while (std::getline(ss, x, ',')) out.push_back(x);
      return out;
    };
    if (k == "--jobs") {
      jobs = std::max(1, std::stoi(v));
    } else if (k == "--images") {
      o.images = v;
    } else if (k == "--limit") {
      o.limit = std::stoi(v);
    } else if (k == "--masks") {
      o.masks = split();
      for (const std::string& m : o.masks)
        if (m != "centre" && m != "lower") {
          std::fprintf(stderr, "%s: --masks: expected centre or lower, found %s\n", argv[0],
                       m.c_str());
          return 2;
        }
    } else if (k == "--thresholds") {
      o.thresholds.clear();
      for (const std::string& x : split()) o.thresholds.push_back(std::stod(x));
    } else if (k == "--nodes") {
      o.nodes = std::stoi(v);
    } else if (k == "--steps") {
      o.steps = std::stoi(v);
    } else if (k == "--project-model") {
      o.project_model = v;
    } else if (k == "--project-resolution") {
      o.project_resolution = std::stoi(v);
    } else if (k == "--project-nodes") {
      o.project_nodes = int_list(v);
    } else if (k == "--project-steps") {
      o.project_steps = std::stoi(v);
    } else {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], k.c_str());
      return 2;
    }
  }
  const std::vector<Image> images = load_images(o);
  if (images.empty()) {
    std::fprintf(stderr, "%s: no c<label>_*.png images in %s\n", argv[0], o.images.c_str());
    return 2;
  }
  const dit::ModelConfig mc = dit::load_model_preset("flux1-fmnist", a.config_dir / "models");
  const auto weights =
      dit::load_weights(mc, a.config_dir / "weights" / "flux1-fmnist" / "flux1-fmnist.safetensors");
  const int n = 28;
  const int steps = o.steps > 0 ? o.steps : mc.default_steps;

  std::vector<Setting> settings = {{"flat", "flat", 0}};
  for (double th : o.thresholds) settings.push_back({fmt("cocodiff %g", th), "cocodiff", th});
  const dit::StrategyOptions defaults;

  // results[mask][setting][image]
  std::map<std::string, std::vector<std::vector<Metrics>>> metrics;
  std::map<std::string, std::vector<std::vector<Run>>> runs;
  Progress progress(o.masks.size() * images.size() * settings.size() +
                    o.project_nodes.size() * (1 + o.thresholds.size()));
  for (const std::string& mask_name : o.masks) {
    metrics[mask_name].assign(settings.size(), std::vector<Metrics>(images.size()));
    runs[mask_name].assign(settings.size(), std::vector<Run>(images.size()));
  }
  // One task per (mask, image): its flat run first (the exact reference), then each threshold.
  std::mutex progress_mu;
  parallel_for(o.masks.size() * images.size(), jobs, [&](size_t task) {
    const std::string& mask_name = o.masks[task / images.size()];
    const size_t ii = task % images.size();
    const Image& img = images[ii];
    const MaskRect r = mask_rect(mask_name, n);
    Mat mask = Mat::Zero(1, std::int64_t{n} * n);
    for (int y = r.y; y < r.y + r.h; ++y)
      for (int x = r.x; x < r.x + r.w; ++x) mask(0, std::int64_t{y} * n + x) = 1.0f;
    dit::RunSettings base;
    base.resolution = n;
    base.steps = steps;
    base.seed = kSeed;
    base.class_label = img.label;
    base.known_latent = dit::pixel_latent(img.pixels, mc.latent_channels);
    base.mask = Tensor::from(std::move(mask));
    const Tensor gt = gray(*base.known_latent, n, n);
    Tensor exact;
    for (size_t si = 0; si < settings.size(); ++si) {
      {
        std::lock_guard<std::mutex> lk(progress_mu);
        progress.step(mask_name + " " + img.name + ": " + settings[si].label);
      }
      dit::RunSettings s = base;
      s.strategy = settings[si].strategy;
      s.strategy_options.v_major_threshold = settings[si].threshold;
      Run run = run_once(o, a, mc, *weights, s);
      if (si == 0) exact = run.picture;
      metrics.at(mask_name)[si][ii] = measure(run.picture, gt, exact, n, r);
      run.picture = Tensor();
      runs.at(mask_name)[si][ii] = std::move(run);
    }
  });

  // V blocks sent in V-Major's selective steps, per threshold: the fraction of the blocks it
  // considered there. Full steps (warm-up, refresh) send every block, so they are taken out:
  // every step considers the same number of blocks.
  int full_steps = 0;
  for (int t = 0; t < steps; ++t) full_steps += dit::VMajorCache::full_step_at(defaults, t);
  auto selective_fraction = [&](const Run& run) {
    if (run.blocks == 0 || full_steps >= steps) return 1.0;
    const double per_step = static_cast<double>(run.blocks) / steps;
    return (static_cast<double>(run.active_blocks) - full_steps * per_step) /
           (static_cast<double>(run.blocks) - full_steps * per_step);
  };

  // Paper-scale projection: phantom runs of the full model on the Aurora preset, flat and
  // cocodiff with the active fraction measured (median over the images of the first mask).
  struct Projection {
    int nodes;
    double flat_s;
    std::vector<double> cocodiff_s;  // per threshold
  };
  std::vector<Projection> proj;
  std::vector<double> active_median(o.thresholds.size(), 1.0);
  for (size_t ti = 0; ti < o.thresholds.size(); ++ti) {
    std::vector<double> f;
    for (const Run& run : runs[o.masks[0]][ti + 1]) f.push_back(selective_fraction(run));
    active_median[ti] = std::clamp(summarize(f).median, 0.0, 1.0);
  }
  auto phantom = [&](int nodes, const std::string& strategy, double fraction,
                     const std::string& name) {
    std::vector<std::string> sets = {
        "--set", "model.preset=" + o.project_model,
        "--set", "run.math=skip",
        "--set", "run.resolution=" + std::to_string(o.project_resolution),
        "--set", "run.steps=" + std::to_string(o.project_steps),
        "--set", "cluster.preset=\"aurora\"",
        "--set", "cluster.nodes=" + std::to_string(nodes),
        "--set", "ulysses.uneven_heads=true",
        "--set", "emulator.trace=false",
        "--set", "run.strategy=" + strategy};
    if (strategy == "cocodiff") {
      sets.insert(sets.end(), {"--set", fmt("v_major.phantom_active_fraction=%.6f", fraction)});
    }
    const ChildRun c = run_cocodiff(a, sets, name);
    if (!c.ok()) {
      std::fprintf(stderr, "inpaint_quality: phantom run %s failed:\n%s\n", name.c_str(),
                   c.error.c_str());
      std::exit(1);
    }
    return c.report["virtual_time_s"].get<double>();
  };
  for (int nodes : o.project_nodes)
    proj.push_back({nodes, 0, std::vector<double>(o.thresholds.size())});
  // One task per (nodes, setting): 0 is flat, k > 0 cocodiff at threshold k - 1.
  const size_t per_nodes = 1 + o.thresholds.size();
  parallel_for(proj.size() * per_nodes, jobs, [&](size_t task) {
    Projection& p = proj[task / per_nodes];
    const size_t k = task % per_nodes;
    const std::string label = k == 0 ? fmt("projection: %s %d^2 flat, %d nodes",
                                           o.project_model.c_str(), o.project_resolution, p.nodes)
                                     : fmt("projection: cocodiff, active fraction %.4f, %d nodes",
                                           active_median[k - 1], p.nodes);
    {
      std::lock_guard<std::mutex> lk(progress_mu);
      progress.step(label);
    }
    if (k == 0)
      p.flat_s = phantom(p.nodes, "flat", 1, fmt("proj_flat_n%d", p.nodes));
    else
      p.cocodiff_s[k - 1] = phantom(p.nodes, "cocodiff", active_median[k - 1],
                                    fmt("proj_cocodiff_n%d_t%zu", p.nodes, k - 1));
  });
  progress.done();

  std::vector<std::string> cols = {"mask",         "setting",    "V sent %",      "active %",
                                   "PSNR gt",      "SSIM gt",    "MSE gt",        "PSNR region",
                                   "SSIM region",  "MSE region", "PSNR vs exact", "SSIM vs exact",
                                   "MSE vs exact", "virtual ms", "ms/step",       "x flat"};
  for (int nodes : o.project_nodes) cols.push_back(fmt("projected x flat, %d nodes", nodes));
  Table t(cols);
  // The plot's data: one block per mask, a row per setting: label, emulated speedup, projected
  // speedup (first --project-nodes), PSNR and SSIM of the region vs ground truth, PSNR and SSIM
  // of the picture vs the exact run (NaN where infinite: not drawn).
  std::ostringstream plot_data;
  plot_data << "# setting speedup projected psnr_region_gt ssim_region_gt psnr_exact ssim_exact "
               "label_exact label_region\n";
  // The threshold labels of the projected line, each panel's own: a label is drawn only where it
  // keeps clear of the last one drawn (7% of the panel's span in x or y), so that the settings
  // whose points coincide (flat, 0, 0.02: the same speedup and quality) show one label.
  struct PlotRow {
    std::string name;
    double speedup, projected, pr, sr, pe, se;
  };
  std::map<std::string, std::vector<PlotRow>> plot_rows;
  for (const std::string& mask_name : o.masks) {
    plot_data << "# mask " << mask_name << "\n";
    for (size_t si = 0; si < settings.size(); ++si) {
      const std::vector<Metrics>& ms = metrics[mask_name][si];
      const std::vector<Run>& rs = runs[mask_name][si];
      auto col = [&ms](double Metrics::*f) {
        std::vector<double> v;
        for (const Metrics& m : ms) v.push_back(m.*f);
        return summarize(v);
      };
      std::vector<double> sent, active, vt, sp;
      for (size_t i = 0; i < rs.size(); ++i) {
        sent.push_back(rs[i].full_elements > 0 ? rs[i].sent_elements / rs[i].full_elements : 1.0);
        active.push_back(si == 0 ? 1.0 : selective_fraction(rs[i]));
        vt.push_back(rs[i].virtual_s);
        sp.push_back(runs[mask_name][0][i].virtual_s / rs[i].virtual_s);
      }
      const Summary s_sent = summarize(sent), s_active = summarize(active), s_vt = summarize(vt),
                    s_sp = summarize(sp);
      const Summary pg = col(&Metrics::psnr_gt), sg = col(&Metrics::ssim_gt),
                    mg = col(&Metrics::mse_gt), pr = col(&Metrics::psnr_gtr),
                    sr = col(&Metrics::ssim_gtr), mr = col(&Metrics::mse_gtr),
                    pe = col(&Metrics::psnr_ex), se = col(&Metrics::ssim_ex),
                    me = col(&Metrics::mse_ex);
      std::vector<std::string> cells = {
          mask_name,
          settings[si].label,
          fmt("%.1f", 100 * s_sent.median),
          fmt("%.1f", 100 * s_active.median),
          cell(pg.median, "%.2f"),
          fmt("%.4f", sg.median),
          fmt("%.2f", mg.median),
          cell(pr.median, "%.2f"),
          fmt("%.4f", sr.median),
          fmt("%.1f", mr.median),
          cell(pe.median, "%.2f") + " [" + cell(pe.min, "%.1f") + ", " + cell(pe.max, "%.1f") + "]",
          fmt("%.5f", se.median),
          fmt("%.3f", me.median),
          fmt("%.3f", 1e3 * s_vt.median),
          fmt("%.3f", 1e3 * s_vt.median / steps),
          fmt("%.3f", s_sp.median)};
      nlohmann::json projected = nlohmann::json::array();
      for (const Projection& p : proj) {
        const double x = si == 0 ? 1.0 : p.flat_s / p.cocodiff_s[si - 1];
        cells.push_back(fmt("%.3f", x));
        projected.push_back({{"nodes", p.nodes},
                             {"flat_virtual_s", p.flat_s},
                             {"virtual_s", si == 0 ? p.flat_s : p.cocodiff_s[si - 1]},
                             {"speedup_vs_flat", x}});
      }
      nlohmann::json row = {
          {"mask", mask_name},
          {"setting", settings[si].label},
          {"strategy", settings[si].strategy},
          {"threshold", si == 0 ? nlohmann::json() : nlohmann::json(settings[si].threshold)},
          {"images", ms.size()},
          {"v_bytes_sent_fraction", json_of(s_sent)},
          {"selective_active_block_fraction", json_of(s_active)},
          {"psnr_gt_db", json_of(pg)},
          {"ssim_gt", json_of(sg)},
          {"mse_gt", json_of(mg)},
          {"psnr_gt_region_db", json_of(pr)},
          {"ssim_gt_region", json_of(sr)},
          {"mse_gt_region", json_of(mr)},
          {"psnr_exact_db", json_of(pe)},
          {"ssim_exact", json_of(se)},
          {"mse_exact", json_of(me)},
          {"virtual_s", json_of(s_vt)},
          {"virtual_s_per_step", s_vt.median / steps},
          {"speedup_vs_flat", json_of(s_sp)},
          {"projected", projected}};
      t.add(std::move(cells), std::move(row));
      const double projected_x =
          proj.empty() ? std::numeric_limits<double>::quiet_NaN()
                       : (si == 0 ? 1.0 : proj[0].flat_s / proj[0].cocodiff_s[si - 1]);
      plot_rows[mask_name].push_back(
          {si == 0 ? std::string("flat") : fmt("%g", settings[si].threshold), s_sp.median,
           projected_x, pr.median, sr.median, pe.median, se.median});
    }
    const std::vector<PlotRow>& rows = plot_rows[mask_name];
    // Which labels each panel draws (y: PSNR vs exact, PSNR of the region vs truth).
    auto shown = [&rows](double PlotRow::*y) {
      double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
      for (const PlotRow& r : rows)
        if (std::isfinite(r.projected) && std::isfinite(r.*y)) {
          x0 = std::min(x0, r.projected);
          x1 = std::max(x1, r.projected);
          y0 = std::min(y0, r.*y);
          y1 = std::max(y1, r.*y);
        }
      const double dx = std::max(x1 - x0, 1e-9), dy = std::max(y1 - y0, 1e-9);
      std::vector<bool> keep(rows.size(), false);
      double lx = 1e300, ly = 1e300;
      for (size_t i = 0; i < rows.size(); ++i) {
        const PlotRow& r = rows[i];
        if (!std::isfinite(r.projected) || !std::isfinite(r.*y)) continue;
        if (std::abs(r.projected - lx) / dx > 0.07 || std::abs(r.*y - ly) / dy > 0.07) {
          keep[i] = true;
          lx = r.projected;
          ly = r.*y;
        }
      }
      return keep;
    };
    const std::vector<bool> keep_exact = shown(&PlotRow::pe), keep_region = shown(&PlotRow::pr);
    for (size_t i = 0; i < rows.size(); ++i) {
      const PlotRow& r = rows[i];
      plot_data << r.name << " " << fmt("%.6g ", r.speedup) << dat(r.projected) << " " << dat(r.pr)
                << " " << dat(r.sr) << " " << dat(r.pe) << " " << dat(r.se) << " \""
                << (keep_exact[i] ? r.name : "") << "\" \"" << (keep_region[i] ? r.name : "")
                << "\"\n";
    }
    plot_data << "\n\n";
  }
  nlohmann::json meta = {
      {"model", "flux1-fmnist (trained)"},
      {"images", images.size()},
      {"image_dir", o.images.lexically_proximate(COCODIFF_SOURCE_DIR).string()},
      {"masks", o.masks},
      {"steps", steps},
      {"seed", kSeed},
      {"nodes", o.nodes},
      {"ranks", o.nodes * 12},
      {"cluster", "aurora"},
      {"v_major_warmup_steps", defaults.v_major_warmup_steps},
      {"v_major_refresh_every", defaults.v_major_refresh_every},
      {"v_major_default_threshold", defaults.v_major_threshold},
      {"metrics",
       "pictures as 8-bit gray levels (data range 255); gt = the test image; region = the "
       "masked rectangle; exact = the flat run; median, min, max over the images; PSNR of "
       "identical pictures is infinite (null)"},
      {"projection",
       fmt("phantom %s %d^2, %d steps, Aurora, uneven heads: flat vs cocodiff with "
           "v_major.phantom_active_fraction = the median over the images (mask %s) of the share "
           "of V blocks V-Major sent in its selective steps on the trained model at that "
           "threshold; projected x flat = flat virtual time / cocodiff virtual time",
           o.project_model.c_str(), o.project_resolution, o.project_steps, o.masks[0].c_str())},
      {"projected_active_fraction", active_median}};
  t.finish(a, "inpaint_quality", meta);
  const std::string proj_title =
      proj.empty() ? std::string()
                   : fmt("projected: %s %d^2, %d Aurora nodes", o.project_model.c_str(),
                         o.project_resolution, proj[0].nodes);
  // Quality (y) against speedup over flat (x), like the paper's Figure 10: the projected
  // speedup as a line labelled with thresholds, the emulated 28 x 28 runs as points (their
  // speedup barely depends on the threshold: tiny latency-bound messages).
  std::string series;
  for (const int ycol : {6, 4}) {
    std::string p;
    if (!proj.empty())
      p +=
          fmt("$DATA index 0 using 3:%d with linespoints lw 2 pt 5 lc rgb '#D55E00' title '%s', "
              "$DATA index 0 using 3:%d:%d with labels offset 0,0.8 font 'sans,7' notitle, ",
              ycol, proj_title.c_str(), ycol, ycol == 6 ? 8 : 9);
    p +=
        fmt("$DATA index 0 using 2:%d with points pt 7 ps 1.2 lc rgb '#0072B2' title "
            "'emulated: flux1-fmnist 28^2, %d Aurora tiles'",
            ycol, o.nodes * 12);
    series += "plot " + p + "\n";
    if (ycol == 6) series += "set ylabel 'PSNR of the masked region vs ground truth (dB)'\n";
  }
  plot(a, "inpaint_quality", plot_data.str(),
       fmt("set multiplot layout 1,2 title 'Inpainting %zu held-back Fashion-MNIST test images "
           "(mask %s), flux1-fmnist trained, real math: quality vs speedup over flat (medians; "
           "labels: V-Major threshold)'\n",
           images.size(), o.masks[0].c_str()) +
           "set grid\nset key outside bottom center horizontal font 'sans,8'\n"
           "set offsets graph 0.04, graph 0.02, graph 0.05, graph 0.03\n"
           "set xlabel 'speedup over flat Ulysses (x)'\n"
           "set ylabel 'PSNR vs the exact (flat) run (dB)'\n" +
           series + "unset multiplot\n",
       1400, 560);
  return 0;
}

}  // namespace
}  // namespace cocodiff::bench

int main(int argc, char** argv) { return cocodiff::bench::main_impl(argc, argv); }
