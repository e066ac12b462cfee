// PipeFusion (dit/parallel/pipefusion.hpp): with every step a warm-up step it is the serial run
// (stages alone, with Ulysses inside them, with batch CFG and CFG-parallel) for every built-in
// family; with one warm-up step the stale K/V changes the output by a bounded amount on the
// trained model and on each family's tiny model; the same timeline and bytes on 1, 2 and 4
// workers; phantom charges what real runs charge; patches overlap the stages; what it cannot
// run is a ConfigError naming the key.

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

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

// The other families' tiny presets: each with its guidance as its sampler runs it (batch CFG
// through the pipeline, true CFG as CFG-parallel: a pipeline per branch), Wan on a video.
struct FamilyRun {
  const char* preset;
  int resolution, frames, cfg_degree;
  double lossy_bound;  // relative L2 of one warm-up step against the serial run
};
// The bounds are about 1.6x the errors measured (4 steps, 4 patches, 2 stages, seed 4): sd35
// 0.090, qwen-image 0.0094, flux2 0.017, dit 0.089, wan 0.031.
const FamilyRun kFamilies[] = {
    {"sd35-tiny", 128, 1, 1, 0.15},         // batch CFG, dual attention, context-pre-only block
    {"qwen-image-tiny", 128, 1, 2, 0.015},  // true CFG
    {"flux2-tiny", 128, 1, 1, 0.03},        // no CFG, shared modulation
    {"dit-xl-2-tiny", 128, 1, 1, 0.15},     // batch CFG over class labels, no text
    {"wan-tiny", 64, 9, 2, 0.05},           // true CFG, 3 latent frames of 4 x 4 tokens
};

RunSettings family_run(const FamilyRun& f, int degree, int steps, int warmup) {
  RunSettings st = pipefusion_run(degree, steps, warmup);
  st.resolution = f.resolution;
  st.frames = f.frames;
  st.cfg_degree = f.cfg_degree;
  st.class_label = 3;
  return st;
}

// The serial run of `st` (its guidance on one rank).
Tensor serial_of(const ModelConfig& cfg, const Weights& w, RunSettings st) {
  st.cfg_degree = 1;
  return serial(cfg, w, st);
}

// Every step a warm-up step: each family's stages (2 of them, alone or with a Ulysses group of
// 2 inside) give the serial run.
TEST(PipeFusion, WarmUpOverEveryStepMatchesSerialForEveryFamily) {
  for (const FamilyRun& f : kFamilies) {
    const ModelConfig cfg = load_model_preset(f.preset);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = family_run(f, 2, 3, 3);
    const Tensor ref = serial_of(cfg, *w, st);
    ASSERT_GT(ref.mat().norm(), 1.0f) << f.preset;
    for (const int gpus : {1, 2}) {
      emu::Engine engine = make_engine(2, gpus * f.cfg_degree, 1);
      const Outcome r = run(engine, cfg, *w, st);
      EXPECT_EQ(r.latent_frames, (f.frames - 1) / cfg.vae_temporal_scale + 1) << f.preset;
      EXPECT_LT(relative_l2(ref, r.latent), 1e-5) << f.preset << ", Ulysses degree " << gpus;
    }
  }
}

// One warm-up step of four: the later steps attend over stale K/V of the other patches, which
// changes each family's output by a bounded amount (random weights: no trained model to judge
// the image by); two warm-up steps bring it closer.
TEST(PipeFusion, StaleKvIsLossyAndBoundedForEveryFamily) {
  for (const FamilyRun& f : kFamilies) {
    const ModelConfig cfg = load_model_preset(f.preset);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = family_run(f, 2, 4, 1);
    st.strategy_options.pipefusion_patches = 4;
    const Tensor ref = serial_of(cfg, *w, st);
    emu::Engine engine = make_engine(2, f.cfg_degree, 1);
    const Tensor lossy = run(engine, cfg, *w, st).latent;
    const double e1 = relative_l2(ref, lossy);
    st.strategy_options.pipefusion_warmup_steps = 2;
    const Tensor fresher = run(engine, cfg, *w, st).latent;
    const double e2 = relative_l2(ref, fresher);
    std::printf("%-16s warm-up 1: relative L2 %.3g, PSNR %.1f dB; warm-up 2: %.3g, %.1f dB\n",
                f.preset, e1, psnr(ref, lossy, data_range(ref)), e2,
                psnr(ref, fresher, data_range(ref)));
    EXPECT_GT(e1, 1e-4) << f.preset << ": stale K/V must change the output";
    EXPECT_LT(e1, f.lossy_bound) << f.preset;
    EXPECT_LT(e2, e1) << f.preset;
  }
}

// SD3.5 (batch CFG, text after the image) and the Wan video, lossy, with Ulysses inside the
// stages: one timeline, bytes and output on 1, 2 and 4 workers.
TEST(PipeFusion, OtherFamiliesKeepTheirTimelineOnOneTwoAndFourWorkers) {
  for (const FamilyRun& f : {kFamilies[0], kFamilies[4]}) {
    const ModelConfig cfg = load_model_preset(f.preset);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = family_run(f, 2, 3, 1);
    st.strategy_options.pipefusion_patches = 3;
    test::on_one_two_and_four_workers(
        2, 2 * f.cfg_degree, 1, cfg, *w, st,
        [&](const Outcome& first, const Outcome& r, int workers) {
          EXPECT_EQ(r.result.timeline_sha256, first.result.timeline_sha256) << f.preset << workers;
          EXPECT_EQ(r.result.bytes_by_tier, first.result.bytes_by_tier) << f.preset << workers;
          EXPECT_TRUE(bitwise_equal(r.latent, first.latent)) << f.preset << workers;
        });
  }
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
  EXPECT_FALSE(pipefusion_problem(load_model_preset("sd35-tiny"), o, 4, grid).has_value());
  // A video's patches are runs of its rows frame after frame: 3 frames of 8 rows take 24.
  const ModelConfig wan = load_model_preset("wan-tiny");
  o.pipefusion_patches = 24;
  EXPECT_FALSE(pipefusion_problem(wan, o, 4, TokenGrid{3, 8, 8}).has_value());
  o.pipefusion_patches = 25;
  EXPECT_EQ(pipefusion_problem(wan, o, 4, TokenGrid{3, 8, 8})->key, "pipefusion.patches");
  o.pipefusion_patches = 0;
  EXPECT_EQ(pipefusion_problem(flux, o, 4, TokenGrid{3, 8, 8})->key, "run.frames");
  // A family whose forward does not run a stage's blocks is refused, naming the ones that do.
  if (find_model_family("pipefusion-test-whole") == nullptr) {
    ModelFamily whole = model_family("flux");
    whole.name = "pipefusion-test-whole";
    whole.stage_blocks = nullptr;
    register_model_family(std::move(whole));
  }
  ModelConfig other = flux;
  other.family = "pipefusion-test-whole";
  const std::optional<ModelConfigProblem> refused = pipefusion_problem(other, o, 4, grid);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->key, "run.strategy");
  for (const char* family : {"flux", "sd3", "qwen-image", "flux2", "dit", "wan"})
    EXPECT_NE(refused->expected.find(family), std::string::npos) << refused->expected;
  EXPECT_NE(refused->found.find("pipefusion-test-whole"), std::string::npos) << refused->found;
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
