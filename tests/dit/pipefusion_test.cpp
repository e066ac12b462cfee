// PipeFusion (dit/parallel/pipefusion.hpp): with every step a warm-up step it is the serial run
// (stages alone, with Ulysses inside them, with batch CFG and CFG-parallel); with one warm-up
// step the stale K/V changes the output by a bounded amount on the trained model; the same
// timeline and bytes on 1, 2 and 4 workers; phantom charges what real runs charge; patches
// overlap the stages; what it cannot run is a ConfigError naming the key.

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/errors.hpp"
#include "dit/parallel/pipefusion.hpp"
#include "dit/pipeline.hpp"
#include "dit/quality.hpp"
#include "tests/dit/emulated_runs.hpp"

namespace cocodiff::dit {
namespace {

using test::bitwise_equal;
using test::make_engine;
using test::Outcome;
using test::run;
using test::serial;

RunSettings pipefusion_run(int degree, int steps, int warmup) {
  RunSettings st;
  st.resolution = 128;  // flux1-tiny: 8 x 8 tokens
  st.steps = steps;
  st.seed = 4;
  st.strategy = "pipefusion";
  st.strategy_options.pipefusion_degree = degree;
  st.strategy_options.pipefusion_warmup_steps = warmup;
  return st;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {  // the engine carries a rank's error out as a RankError
    return e.what();
  }
  return {};
}

TEST(PipeFusion, StagesSplitTheBlocksAndPatchesTheRows) {
  // 57 blocks (FLUX.1-dev) over 4 stages: 15, 14, 14, 14; every block once.
  int next = 0;
  for (int s = 0; s < 4; ++s) {
    const StageBlocks b = pipefusion_stage_blocks(57, 4, s);
    EXPECT_EQ(b.first, next);
    EXPECT_EQ(b.count, s == 0 ? 15 : 14);
    next += b.count;
  }
  // 14 rows of 14 tokens in 4 patches: 4, 4, 3, 3 rows.
  const TokenShard p2 = pipefusion_patch(14, 14, 4, 2);
  EXPECT_EQ(p2.begin, 8 * 14);
  EXPECT_EQ(p2.count, 3 * 14);
  EXPECT_EQ(p2.total, 196);
}

// Every step a warm-up step: each layer attends over fresh keys of every token, as serially.
TEST(PipeFusion, WarmUpOverEveryStepMatchesSerial) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = pipefusion_run(2, 3, 3);
  const Tensor ref = serial(cfg, *w, st);
  ASSERT_GT(ref.mat().norm(), 1.0f);
  struct Layout {
    int tiles, gpus, degree;  // ranks = tiles x gpus; Ulysses degree = ranks / degree
  };
  for (const Layout l : {Layout{2, 1, 2}, Layout{2, 2, 4}, Layout{2, 2, 2}, Layout{2, 4, 4}}) {
    st.strategy_options.pipefusion_degree = l.degree;
    emu::Engine engine = make_engine(l.tiles, l.gpus, 1);
    const Outcome r = run(engine, cfg, *w, st);
    EXPECT_LT(relative_l2(ref, r.latent), 1e-5) << l.tiles * l.gpus << " ranks, " << l.degree;
  }
}

// Batch CFG through the pipeline, and CFG-parallel (a pipeline per half), on flux1-fmnist's
// structure with random weights.
TEST(PipeFusion, WarmUpOverEveryStepMatchesSerialWithCfg) {
  const ModelConfig cfg = load_model_preset("flux1-fmnist");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = pipefusion_run(2, 3, 3);
  st.resolution = 28;
  st.class_label = 3;
  const Tensor ref = serial(cfg, *w, st);
  emu::Engine engine = make_engine(2, 2, 1);
  EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5) << "batch CFG";
  st.cfg_degree = 2;
  EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5) << "CFG-parallel";
}

// One warm-up step: later steps attend over the step before's K/V of the other patches. On the
// trained model that costs a little, measured against the serial run.
TEST(PipeFusion, StaleKvIsLossyAndBoundedOnTheTrainedModel) {
  const ModelConfig cfg = load_model_preset("flux1-fmnist");
  const auto w = load_weights(cfg, std::string(COCODIFF_CONFIG_DIR) +
                                       "/weights/flux1-fmnist/flux1-fmnist"
                                       ".safetensors");
  RunSettings st = pipefusion_run(4, 10, 1);
  st.resolution = 28;
  st.class_label = 9;
  const Tensor ref = serial(cfg, *w, st);
  emu::Engine engine = make_engine(2, 2, 1);
  const Tensor lossy = run(engine, cfg, *w, st).latent;
  const double e = relative_l2(ref, lossy);
  const double p = psnr(ref, lossy, data_range(ref));
  EXPECT_GT(e, 1e-4) << "stale K/V must change the output";
  EXPECT_LT(e, 0.1);
  EXPECT_GT(p, 25.0);
  // More warm-up steps, fresher caches: closer to the serial run.
  st.strategy_options.pipefusion_warmup_steps = 5;
  EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), e);
}

// Ulysses inside a stage is exact, stale K/V included: the lossy run on stages of 1, 2 and 4
// ranks gives one output (uneven shards of the patches among them), and CFG-parallel gives the
// output of batch CFG.
TEST(PipeFusion, UlyssesInsideStagesAndCfgParallelKeepThePatchedOutput) {
  const ModelConfig tiny = load_model_preset("flux1-tiny");
  const auto w = make_weights(tiny, 5, false);
  RunSettings st = pipefusion_run(2, 4, 1);
  st.resolution = 112;  // 7 x 7 tokens: patches of 2, 2, 2, 1 rows
  st.strategy_options.pipefusion_patches = 4;
  emu::Engine two = make_engine(2, 1, 1);
  const Tensor ref = run(two, tiny, *w, st).latent;
  EXPECT_GT(relative_l2(serial(tiny, *w, st), ref), 1e-4) << "stale K/V must change the output";
  for (const int gpus : {2, 4}) {
    emu::Engine engine = make_engine(2, gpus, 1);
    EXPECT_LT(relative_l2(ref, run(engine, tiny, *w, st).latent), 1e-5) << 2 * gpus << " ranks";
  }
  const ModelConfig fmnist = load_model_preset("flux1-fmnist");
  const auto wf = make_weights(fmnist, 5, false);
  st.resolution = 28;
  emu::Engine four = make_engine(2, 2, 1);
  const Tensor batch_cfg = run(four, fmnist, *wf, st).latent;
  st.cfg_degree = 2;
  EXPECT_LT(relative_l2(batch_cfg, run(four, fmnist, *wf, st).latent), 1e-5);
}

TEST(PipeFusion, SameTimelineAndBytesOnOneTwoAndFourWorkers) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = pipefusion_run(2, 3, 1);
  st.strategy_options.pipefusion_patches = 4;
  test::on_one_two_and_four_workers(
      2, 2, 1, cfg, *w, st, [](const Outcome& first, const Outcome& r, int workers) {
        EXPECT_EQ(r.result.timeline_sha256, first.result.timeline_sha256) << workers;
        EXPECT_EQ(r.result.bytes_by_tier, first.result.bytes_by_tier) << workers;
        EXPECT_TRUE(bitwise_equal(r.latent, first.latent)) << workers;
      });
}

TEST(PipeFusion, PhantomChargesTheSameVirtualTimeAsReal) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  RunSettings st = pipefusion_run(2, 3, 1);
  emu::Engine engine = make_engine(2, 2, 1);
  const Outcome real = run(engine, cfg, *make_weights(cfg, 5, false), st);
  st.phantom = true;
  const Outcome phantom = run(engine, cfg, *make_weights(cfg, 5, true), st);
  EXPECT_GT(real.result.makespan.ns(), 0);
  EXPECT_EQ(real.result.makespan, phantom.result.makespan);
  EXPECT_EQ(real.result.bytes_by_tier, phantom.result.bytes_by_tier);
  EXPECT_EQ(real.result.timeline_sha256, phantom.result.timeline_sha256);
}

// After the warm-up the stages work on different patches at once: four stages with four
// patches take well under the time of running every step whole through them in turn, where
// each stage idles while the three others run (a quarter of the time busy); patches keep them
// busy most of it, though running a step in four passes costs each stage more compute (its
// weights read and its text stream run once a patch).
TEST(PipeFusion, PatchesOverlapTheStages) {
  const ModelConfig cfg = load_model_preset("flux1-dev");
  const auto w = make_weights(cfg, 0, true);
  RunSettings st = pipefusion_run(4, 6, 6);
  st.resolution = 1024;
  st.phantom = true;
  emu::Engine engine = make_engine(2, 2, 1);
  const Outcome whole = run(engine, cfg, *w, st);
  st.strategy_options.pipefusion_warmup_steps = 1;
  const Outcome patched = run(engine, cfg, *w, st);
  const double t_whole = whole.result.makespan.seconds();
  const double t_patched = patched.result.makespan.seconds();
  EXPECT_LT(t_patched, 0.6 * t_whole);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_LT(whole.result.rank_compute[r].seconds(), 0.3 * t_whole) << r;
    EXPECT_GT(patched.result.rank_compute[r].seconds(), 0.5 * t_patched) << r;
  }
}

TEST(PipeFusion, WhatItCannotRunIsAConfigErrorNamingTheKey) {
  const ModelConfig flux = load_model_preset("flux1-tiny");  // 4 blocks, 8 x 8 tokens at 128
  const TokenGrid grid{1, 8, 8};
  StrategyOptions o;
  o.pipefusion_degree = 3;
  EXPECT_EQ(pipefusion_problem(flux, o, 4, grid)->key, "parallel.pipefusion_degree");
  o.pipefusion_degree = 8;
  EXPECT_EQ(pipefusion_problem(flux, o, 8, grid)->key, "parallel.pipefusion_degree");  // > blocks
  o.pipefusion_degree = 2;
  EXPECT_FALSE(pipefusion_problem(flux, o, 4, grid).has_value());
  o.pipefusion_patches = 9;  // more than the 8 token rows
  EXPECT_EQ(pipefusion_problem(flux, o, 4, grid)->key, "pipefusion.patches");
  o.pipefusion_patches = 0;
  o.pipefusion_warmup_steps = 0;
  EXPECT_EQ(pipefusion_problem(flux, o, 4, grid)->key, "pipefusion.warmup_steps");
  o.pipefusion_warmup_steps = 1;
  const std::optional<ModelConfigProblem> sd3 =
      pipefusion_problem(load_model_preset("sd35-tiny"), o, 4, grid);
  ASSERT_TRUE(sd3.has_value());
  EXPECT_EQ(sd3->key, "run.strategy");
  EXPECT_NE(sd3->expected.find("flux"), std::string::npos) << sd3->expected;
  // generate() refuses it too, naming the key.
  const auto w = make_weights(flux, 5, true);
  RunSettings st = pipefusion_run(3, 1, 1);
  st.phantom = true;
  emu::Engine engine = make_engine(2, 2, 1);
  EXPECT_NE(error_of([&] { run(engine, flux, *w, st); }).find("parallel.pipefusion_degree"),
            std::string::npos);
}

}  // namespace
}  // namespace cocodiff::dit
