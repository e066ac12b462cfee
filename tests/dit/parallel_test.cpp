// Flat Ulysses on the emulator against the serial run, for every family's small variant, and
// phantom vs real virtual time.

#include <gtest/gtest.h>

#include <mutex>

#include "core/errors.hpp"
#include "dit/local_comm.hpp"
#include "dit/pipeline.hpp"
#include "dit/quality.hpp"
#include "emulator/engine.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"
#include "tests/dit/emulated_runs.hpp"

namespace cocodiff::dit {
namespace {

// tiles x gpus x nodes with Aurora-like tiers and device (numbers only need to be plausible).
emu::Engine make_engine(int ranks) {
  const int tiles = ranks >= 2 ? 2 : 1;
  const int gpus = std::min(ranks / tiles, 6);
  const int nodes = ranks / (tiles * gpus);
  COCO_CHECK(tiles * gpus * nodes == ranks, "test topology");
  return test::make_engine(tiles, gpus, nodes);
}

struct Parallel {
  std::vector<Tensor> latents;  // per rank
  emu::RunResult result;
};

Parallel run_parallel(int ranks, const ModelConfig& cfg, const Weights& w, const RunSettings& st) {
  emu::Engine engine = make_engine(ranks);
  Parallel out;
  out.latents.resize(static_cast<size_t>(ranks));
  std::mutex mu;
  out.result = engine.run([&](Communicator& comm) {
    RunOutput o = generate(comm, cfg, w, st);
    std::lock_guard<std::mutex> lock(mu);
    out.latents[static_cast<size_t>(comm.rank())] = std::move(o.latent);
  });
  return out;
}

RunOutput run_serial(const ModelConfig& cfg, const Weights& w, RunSettings st) {
  st.strategy = "serial";
  LocalComm comm;
  return generate(comm, cfg, w, st);
}

class FamilyTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FamilyTest, FlatUlyssesMatchesSerialAtDegrees2To24) {
  const ModelConfig cfg = load_model_preset(GetParam());
  const auto w = make_weights(cfg, 5, false);  // once, shared by every run and rank
  RunSettings st;
  st.resolution = 192;  // 24x24 latent, 144 image tokens
  st.steps = 2;
  st.seed = 9;
  const RunOutput ref = run_serial(cfg, *w, st);
  ASSERT_TRUE(ref.latent.mat().allFinite());
  ASSERT_GT(ref.latent.mat().norm(), 1.0f);
  for (int degree : {2, 4, 12, 24}) {
    const Parallel par = run_parallel(degree, cfg, *w, st);
    for (int r = 0; r < degree; ++r) {
      const double e = relative_l2(ref.latent, par.latents[static_cast<size_t>(r)]);
      EXPECT_LT(e, 1e-5) << GetParam() << " degree " << degree << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, FamilyTest,
                         ::testing::Values("dit-xl-2-tiny", "sd35-tiny", "flux1-tiny", "flux2-tiny",
                                           "qwen-image-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(FlatUlysses, UnevenShardsAndInpaintingMatchSerial) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st;
  st.resolution = 80;  // 10x10 latent, 25 tokens over 4 ranks: 7, 6, 6, 6
  st.steps = 2;
  st.seed = 2;
  const int cells = 10 * 10;
  Mat known = Mat::Constant(16, cells, 0.5f);
  Mat mask = Mat::Zero(1, cells);
  mask.rightCols(cells / 2).setOnes();  // generate the bottom half
  st.known_latent = Tensor::from(known);
  st.mask = Tensor::from(mask);
  const RunOutput ref = run_serial(cfg, *w, st);
  // Kept region: exactly the known latent (sigma ends at 0).
  EXPECT_EQ((ref.latent.mat().leftCols(cells / 2).array() - 0.5f).abs().maxCoeff(), 0.0f);
  EXPECT_GT((ref.latent.mat().rightCols(cells / 2).array() - 0.5f).abs().maxCoeff(), 0.1f);
  const Parallel par = run_parallel(4, cfg, *w, st);
  EXPECT_LT(relative_l2(ref.latent, par.latents[3]), 1e-5);
}

TEST(FlatUlysses, PhantomChargesTheSameVirtualTimeAsReal) {
  const ModelConfig cfg = load_model_preset("sd35-tiny");
  RunSettings st;
  st.resolution = 192;
  st.steps = 2;
  st.seed = 1;
  const auto real_w = make_weights(cfg, 5, false);
  const auto phantom_w = make_weights(cfg, 5, true);
  const Parallel real = run_parallel(4, cfg, *real_w, st);
  st.phantom = true;
  const Parallel phantom = run_parallel(4, cfg, *phantom_w, st);
  EXPECT_GT(real.result.makespan.ns(), 0);
  EXPECT_EQ(real.result.makespan, phantom.result.makespan);
  EXPECT_EQ(real.result.rank_compute, phantom.result.rank_compute);
  EXPECT_EQ(real.result.bytes_by_tier, phantom.result.bytes_by_tier);
  EXPECT_EQ(real.result.timeline_sha256, phantom.result.timeline_sha256);
  EXPECT_TRUE(phantom.latents[0].phantom());
}

TEST(FlatUlysses, FullSizeFluxInPhantomModeIsFast) {
  const ModelConfig cfg = load_model_preset("flux1-dev");
  const auto w = make_weights(cfg, 0, true);
  RunSettings st;
  st.resolution = 2048;  // 16384 image tokens
  st.steps = 2;
  st.phantom = true;
  const Parallel par = run_parallel(24, cfg, *w, st);
  // 2 steps x 57 blocks: the all-to-alls move 4 x 16384 x 3072 elements per block and step.
  EXPECT_GT(par.result.bytes_by_tier[1], 0);
  EXPECT_GT(par.result.makespan.seconds(), 0.01);
  EXPECT_LT(par.result.wall_seconds, 30.0);
}

TEST(FlatUlysses, HeadsNotDivisibleByDegreeIsAConfigError) {
  const ModelConfig cfg = load_model_preset("dit-xl-2-tiny");  // 24 heads
  const auto w = make_weights(cfg, 5, true);
  RunSettings st;
  st.resolution = 64;
  st.steps = 1;
  st.phantom = true;
  emu::Engine engine = make_engine(10);  // 2 tiles x 5 gpus: 24 % 10 != 0
  try {
    engine.run([&](Communicator& comm) { generate(comm, cfg, *w, st); });
    FAIL() << "degree 10 accepted";
  } catch (const RankError& e) {
    EXPECT_TRUE(e.user_error());
    EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cocodiff::dit
