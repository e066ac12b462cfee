// V-Major's trade-off with real math: inpainting with a small model on emulated Aurora nodes,
// the exact run (tapa+v_first+pipeline) against cocodiff (the same + V-Major) at several
// thresholds: output quality of the final latent (relative L2, PSNR, SSIM against the exact
// run), V bytes saved on the selective tier, and the virtual-time speedup.
//
//   vmajor_quality [--out DIR] [--smoke] [--model flux1-tiny] [--resolution 384] [--nodes 2]
//                  [--steps 8] [--thresholds 0,0.01,0.05]

#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "bench/common/bench_util.hpp"
#include "core/config.hpp"
#include "dit/model_config.hpp"
#include "dit/pipeline.hpp"
#include "dit/quality.hpp"
#include "dit/weights.hpp"
#include "emulator/engine.hpp"
#include "net_models/cluster.hpp"

namespace cocodiff::bench {
namespace {

struct Options {
  std::string model = "flux1-tiny";
  int resolution = 384;
  int nodes = 2;
  int steps = 8;
  std::vector<double> thresholds = {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1, 1.5};
};

struct Result {
  Tensor latent;
  int h = 0, w = 0;
  double virtual_s = 0, wall_s = 0;
  double full_bytes = 0, sent_bytes = 0;
};

Result run_once(const Options& o, const Args& a, const dit::ModelConfig& mc,
                const dit::Weights& weights, const dit::RunSettings& settings) {
  Config cfg =
      Config::parse("[cluster]\npreset = \"aurora\"\nnodes = " + std::to_string(o.nodes) + "\n",
                    "<vmajor_quality>");
  Cluster cluster = load_cluster(cfg, a.config_dir / "clusters");
  emu::EngineOptions eo;
  eo.workers = a.workers;
  eo.trace = false;
  emu::Engine engine(cluster.topology, std::move(cluster.network), cluster.device, eo);
  Result res;
  std::mutex mu;
  std::vector<dit::StrategyStats> stats(static_cast<size_t>(cluster.topology.num_ranks()));
  const emu::RunResult rr = engine.run([&](Communicator& comm) {
    dit::RunOutput out = dit::generate(comm, mc, weights, settings);
    std::lock_guard<std::mutex> lk(mu);
    stats[static_cast<size_t>(comm.rank())] = out.strategy_stats;
    if (comm.rank() == 0) {
      res.latent = std::move(out.latent);
      res.h = out.latent_height;
      res.w = out.latent_width;
    }
  });
  res.virtual_s = rr.makespan.seconds();
  res.wall_s = rr.wall_seconds;
  for (const dit::StrategyStats& s : stats)
    for (const auto& [tier, v] : s.v_major) {
      res.full_bytes += v.full_elements * dit::kBytesPerElement;
      res.sent_bytes += v.sent_elements * dit::kBytesPerElement;
    }
  return res;
}

int main_impl(int argc, char** argv) {
  const Args a = parse_args(
      argc, argv, " [--model M] [--resolution R] [--nodes N] [--steps S] [--thresholds a,b]");
  Options o;
  if (a.smoke) {
    o.resolution = 192;
    o.steps = 3;
    o.thresholds = {0, 0.5};
  }
  for (size_t i = 0; i + 1 < a.rest.size(); i += 2) {
    const std::string& k = a.rest[i];
    const std::string& v = a.rest[i + 1];
    if (k == "--model") {
      o.model = v;
    } else if (k == "--resolution") {
      o.resolution = std::stoi(v);
    } else if (k == "--nodes") {
      o.nodes = std::stoi(v);
    } else if (k == "--steps") {
      o.steps = std::stoi(v);
    } else if (k == "--thresholds") {
      o.thresholds.clear();
      std::stringstream ss(v);
      std::string x;
      while (std::getline(ss, x, ',')) o.thresholds.push_back(std::stod(x));
    } else {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], k.c_str());
      return 2;
    }
  }
  if (a.rest.size() % 2 != 0) {
    std::fprintf(stderr, "%s: missing value after %s\n", argv[0], a.rest.back().c_str());
    return 2;
  }
  const dit::ModelConfig mc = dit::load_model_preset(o.model, a.config_dir / "models");
  const auto weights = dit::make_weights(mc, 0, false);
  // Inpainting: keep a seeded "known" latent outside a centred square (half the side), generate
  // inside it, as the paper measures V-Major's quality on inpainting.
  const int side = mc.latent_side(o.resolution);
  dit::RunSettings base;
  base.resolution = o.resolution;
  base.steps = o.steps;
  base.seed = 7;
  base.known_latent = dit::seeded_normal(mc.latent_channels, static_cast<std::int64_t>(side) * side,
                                         11, "known", 1.0f, false);
  Mat mask = Mat::Zero(1, static_cast<Eigen::Index>(side) * side);
  for (int y = side / 4; y < side - side / 4; ++y)
    for (int x = side / 4; x < side - side / 4; ++x) mask(0, y * side + x) = 1.0f;
  base.mask = Tensor::from(std::move(mask));

  Progress progress(o.thresholds.size() + 1);
  progress.step("exact: tapa+v_first+pipeline");
  dit::RunSettings exact_s = base;
  exact_s.strategy = "tapa+v_first+pipeline";
  const Result exact = run_once(o, a, mc, *weights, exact_s);
  const double range = dit::data_range(exact.latent);
  Table t({"threshold", "rel L2", "PSNR dB", "SSIM", "V bytes saved %", "virtual ms", "x exact"});
  std::ostringstream dat;
  dat << "# threshold rel_l2 psnr ssim saved speedup\n";
  for (double th : o.thresholds) {
    progress.step(fmt("cocodiff, v_major.threshold = %g", th));
    dit::RunSettings s = base;
    s.strategy = "cocodiff";
    s.strategy_options.v_major_threshold = th;
    const Result r = run_once(o, a, mc, *weights, s);
    const double l2 = dit::relative_l2(exact.latent, r.latent);
    const double p = dit::psnr(exact.latent, r.latent, range);
    const double ss = dit::ssim(exact.latent, r.latent, r.h, r.w, range);
    const double saved = r.full_bytes > 0 ? 1 - r.sent_bytes / r.full_bytes : 0;
    const double sp = exact.virtual_s / r.virtual_s;
    t.add(
        {fmt("%g", th), fmt("%.2e", l2), std::isfinite(p) ? fmt("%.2f", p) : "inf", fmt("%.5f", ss),
         fmt("%.1f", 100 * saved), fmt("%.3f", r.virtual_s * 1e3), fmt("%.3f", sp)},
        {{"threshold", th},
         {"relative_l2", l2},
         {"psnr_db", std::isfinite(p) ? nlohmann::json(p) : nlohmann::json(nullptr)},
         {"ssim", ss},
         {"v_bytes_saved_fraction", saved},
         {"virtual_s", r.virtual_s},
         {"speedup_vs_exact", sp},
         {"wall_s", r.wall_s}});
    // Identical latents (infinite PSNR) are left out of the PSNR curves (NaN: not drawn).
    dat << fmt("%g %.6g ", th, l2) + (std::isfinite(p) ? fmt("%.6g", p) : std::string("NaN")) +
               fmt(" %.6g %.6g %.6g\n", ss, 100 * saved, sp);
  }
  progress.done();
  t.finish(a, "study_vmajor_quality",
           {{"model", o.model},
            {"resolution", o.resolution},
            {"nodes", o.nodes},
            {"steps", o.steps},
            {"exact_virtual_s", exact.virtual_s},
            {"task", "inpainting, centred square of half the side generated"},
            {"note", fmt("real math; V-Major on the inter-node tier, %d warm-up steps, ",
                         base.strategy_options.v_major_warmup_steps) +
                         (base.strategy_options.v_major_refresh_every > 0 &&
                                  base.strategy_options.v_major_refresh_every < o.steps
                              ? fmt("a full refresh every %d steps; ",
                                    base.strategy_options.v_major_refresh_every)
                              : std::string("no refresh within the run; ")) +
                         "PSNR of identical latents is infinite (null here, not plotted)"}});
  plot(a, "study_vmajor_quality", dat.str(),
       fmt("set multiplot layout 1,2 title 'V-Major thresholds, real math inpainting: %s %dpx, "
           "%d steps, %d Aurora nodes (quality vs the exact run)'\n",
           o.model.c_str(), o.resolution, o.steps, o.nodes) +
           "set grid\nset key bottom left\nset xlabel 'V bytes saved on inter-node (%)'\n"
           "set ylabel 'PSNR (dB)'\nset y2label 'SSIM'\nset y2tics\nset ytics nomirror\n"
           "plot $DATA using 5:3 with linespoints lw 2 pt 7 title 'PSNR', $DATA using 5:4 axes "
           "x1y2 with linespoints lw 2 pt 5 title 'SSIM (right)', $DATA using 5:3:(sprintf('%g', "
           "$1)) with labels offset 0,1 font 'sans,8' notitle\n"
           "unset y2tics\nunset y2label\nset ytics mirror\nset xrange [0.9:1.1]\n"
           "set xlabel 'virtual-time speedup over the exact run (x)'\nset ylabel 'PSNR (dB)'\n"
           "plot $DATA using 6:3 with linespoints lw 2 pt 7 lc rgb '#0072B2' title 'PSNR', "
           "$DATA using 6:3:(sprintf('%g', $1)) with labels offset 0,1 font 'sans,8' notitle\n"
           "unset multiplot\n",
       1300, 520);
  return 0;
}

}  // namespace
}  // namespace cocodiff::bench

int main(int argc, char** argv) { return cocodiff::bench::main_impl(argc, argv); }
