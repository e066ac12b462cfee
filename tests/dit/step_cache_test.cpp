// Step caching (dit/step_cache.hpp): threshold 0 is the exact run, bit for bit and byte for
// byte; every strategy skips the steps the serial run skips and matches it; CFG-parallel's
// halves skip alike; the rules' bounds (First-Block-Cache runs the first block, TeaCache the
// first and last steps); the same timeline on 1, 2 and 4 workers; a phantom run given the
// skipped steps moves the real run's bytes; every family's TeaCache input.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dit/model_family.hpp"
#include "dit/parallel/fp8.hpp"
#include "dit/pipeline.hpp"
#include "dit/quality.hpp"
#include "dit/step_cache.hpp"
#include "tests/dit/emulated_runs.hpp"

namespace cocodiff::dit {
namespace {

using test::bitwise_equal;
using test::make_engine;
using test::Outcome;
using test::run;
using test::serial_output;

RunSettings image_run(const ModelConfig& cfg, int steps) {
  RunSettings st;
  st.resolution = 8 * cfg.vae_scale * cfg.patch_size;  // 64 tokens
  st.steps = steps;
  st.seed = 3;
  return st;
}

// A threshold between two of the serial run's measured changes, so that some steps skip and
// some run, with a margin far above the strategies' rounding differences.
double middle_threshold(const StepCacheStats& s) {
  std::vector<double> c;
  for (const double v : s.change)
    if (v >= 0) c.push_back(v);
  std::sort(c.begin(), c.end());
  if (c.size() < 2) return 0;
  const size_t i = c.size() / 2;
  return (c[i - 1] + c[i]) / 2;
}

TEST(StepCache, ThresholdZeroIsTheExactRunBitForBitAndByteForByte) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = image_run(cfg, 4);
  st.strategy = "cocodiff";
  emu::Engine engine = make_engine(2, 2, 2);
  const Outcome exact = run(engine, cfg, *w, st);
  for (const char* policy : {"first_block", "teacache"}) {
    st.step_cache.policy = policy;
    st.step_cache.threshold = 0;
    const Outcome r = run(engine, cfg, *w, st);
    EXPECT_TRUE(bitwise_equal(exact.latent, r.latent)) << policy;
    EXPECT_EQ(r.result.bytes_by_tier, exact.result.bytes_by_tier) << policy;
    EXPECT_EQ(r.result.timeline_sha256, exact.result.timeline_sha256) << policy;
    EXPECT_TRUE(r.cache.skipped.empty());
  }
}

TEST(StepCache, EveryStrategySkipsTheSerialRunsStepsAndMatchesIt) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  emu::Engine engine = make_engine(2, 2, 2);
  for (const char* policy : {"first_block", "teacache"}) {
    RunSettings st = image_run(cfg, 8);
    st.step_cache.policy = policy;
    st.step_cache.threshold = 1e6;  // measure every change
    st.step_cache.threshold = middle_threshold(serial_output(cfg, *w, st).step_cache);
    ASSERT_GT(st.step_cache.threshold, 0) << policy;
    const RunOutput ref = serial_output(cfg, *w, st);
    ASSERT_FALSE(ref.step_cache.skipped.empty()) << policy;
    ASSERT_LT(ref.step_cache.skipped.size(), 7u) << policy;
    RunSettings exact = st;
    exact.step_cache = {};
    // A skip changes the output: the error against the exact run is measurable, and bounded.
    const double lost = relative_l2(serial_output(cfg, *w, exact).latent, ref.latent);
    EXPECT_GT(lost, 0.0) << policy;
    EXPECT_LT(lost, 0.5) << policy;
    st.strategy_options.v_major_threshold = 0;
    for (const char* name : {"flat", "tapa", "v_first", "pipeline", "v_major", "cocodiff", "usp"}) {
      st.strategy = name;
      const Outcome r = run(engine, cfg, *w, st);
      EXPECT_EQ(r.cache.skipped, ref.step_cache.skipped) << policy << " " << name;
      EXPECT_LT(relative_l2(ref.latent, r.latent), 1e-5) << policy << " " << name;
      EXPECT_EQ(r.cache.blocks_run, ref.step_cache.blocks_run) << policy << " " << name;
    }
  }
}

TEST(StepCache, TheRulesBoundsFirstBlockAlwaysRunsTeaCacheFirstAndLastSteps) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  const int blocks = cfg.double_blocks + cfg.single_blocks, steps = 5;
  RunSettings st = image_run(cfg, steps);
  st.step_cache.threshold = 1e9;  // skip whatever the rule lets skip
  st.step_cache.policy = "first_block";
  const StepCacheStats fb = serial_output(cfg, *w, st).step_cache;
  EXPECT_EQ(fb.skipped, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(fb.blocks_run, blocks + (steps - 1));  // step 0 whole, then the first block only
  EXPECT_EQ(fb.blocks_total, blocks * steps);
  st.step_cache.policy = "teacache";
  const StepCacheStats tc = serial_output(cfg, *w, st).step_cache;
  EXPECT_EQ(tc.skipped, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(tc.blocks_run, 2 * blocks);
}

TEST(StepCache, TeaCacheRescalesWithTheFamilysPolynomial) {
  // FLUX.1's published polynomial; a family without one accumulates the raw change.
  EXPECT_EQ(model_family("flux").teacache_coefficients.size(), 5u);
  EXPECT_TRUE(model_family("sd3").teacache_coefficients.empty());
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = image_run(cfg, 4);
  st.step_cache.policy = "teacache";
  st.step_cache.threshold = 1e9;
  st.step_cache.coefficients = {1, 0};  // identity: the accumulated raw change
  const StepCacheStats raw = serial_output(cfg, *w, st).step_cache;
  st.step_cache.coefficients = {2, 1};  // 2x + 1
  const StepCacheStats lin = serial_output(cfg, *w, st).step_cache;
  ASSERT_GE(raw.change[1], 0);
  EXPECT_NEAR(lin.change[1], 2 * raw.change[1] + 1, 1e-12);
  EXPECT_NEAR(lin.change[2], lin.change[1] + 2 * (raw.change[2] - raw.change[1]) + 1, 1e-9);
}

TEST(StepCache, CfgParallelHalvesSkipTheStepsTheSequentialPassesSkip) {
  const ModelConfig cfg = load_model_preset("qwen-image-tiny");  // true CFG
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = image_run(cfg, 6);
  st.step_cache.policy = "first_block";
  st.step_cache.threshold = 1e6;
  st.step_cache.threshold = middle_threshold(serial_output(cfg, *w, st).step_cache);
  const RunOutput ref = serial_output(cfg, *w, st);
  ASSERT_FALSE(ref.step_cache.skipped.empty());
  emu::Engine engine = make_engine(2, 2, 2);
  st.strategy = "flat";
  st.cfg_degree = 2;
  const Outcome r = run(engine, cfg, *w, st);
  EXPECT_EQ(r.cache.skipped, ref.step_cache.skipped);
  EXPECT_LT(relative_l2(ref.latent, r.latent), 1e-5);
}

TEST(StepCache, TheSameTimelineOnOneTwoAndFourWorkers) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = image_run(cfg, 6);
  st.strategy = "cocodiff";
  st.step_cache.policy = "teacache";
  st.step_cache.threshold = 1.0;
  test::on_one_two_and_four_workers(
      2, 2, 2, cfg, *w, st, [](const Outcome& first, const Outcome& r, int workers) {
        EXPECT_EQ(r.result.timeline_sha256, first.result.timeline_sha256) << workers;
        EXPECT_EQ(r.cache.skipped, first.cache.skipped) << workers;
        EXPECT_TRUE(bitwise_equal(r.latent, first.latent)) << workers;
      });
}

TEST(StepCache, APhantomRunGivenTheSkippedStepsMovesTheRealRunsBytes) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto real_w = make_weights(cfg, 5, false);
  const auto phantom_w = make_weights(cfg, 5, true);
  emu::Engine engine = make_engine(2, 2, 2);
  for (const char* policy : {"first_block", "teacache"}) {
    RunSettings st = image_run(cfg, 6);
    st.strategy = "tapa";  // bytes that depend on the steps run alone
    st.step_cache.policy = policy;
    st.step_cache.threshold = 1e6;
    st.step_cache.threshold = middle_threshold(serial_output(cfg, *real_w, st).step_cache);
    const Outcome real = run(engine, cfg, *real_w, st);
    ASSERT_FALSE(real.cache.skipped.empty()) << policy;
    RunSettings ps = st;
    ps.phantom = true;
    ps.step_cache.phantom_skipped = real.cache.skipped;
    const Outcome ph = run(engine, cfg, *phantom_w, ps);
    EXPECT_EQ(ph.cache.skipped, real.cache.skipped) << policy;
    EXPECT_TRUE(ph.cache.phantom);
    EXPECT_EQ(ph.result.bytes_by_tier, real.result.bytes_by_tier) << policy;
    EXPECT_EQ(ph.result.makespan, real.result.makespan) << policy;
    // With V-Major too, the phantom run takes the measured share of blocks sent: the same
    // bytes by tier within 1%.
    st.strategy = ps.strategy = "cocodiff";
    st.strategy_options.v_major_threshold = ps.strategy_options.v_major_threshold = 1.0;
    st.strategy_options.v_major_block_tokens = ps.strategy_options.v_major_block_tokens = 4;
    st.strategy_options.v_major_warmup_steps = ps.strategy_options.v_major_warmup_steps = 1;
    const Outcome rv = run(engine, cfg, *real_w, st);
    double blocks = 0, active = 0;
    for (const auto& [tier, t] : rv.stats.v_major) {
      blocks += static_cast<double>(t.selective_blocks);
      active += static_cast<double>(t.selective_active_blocks);
    }
    ASSERT_GT(blocks, 0);
    ASSERT_LT(active, blocks);
    ps.step_cache.phantom_skipped = rv.cache.skipped;
    ps.strategy_options.v_major_phantom_active_fraction = active / blocks;
    const Outcome pv = run(engine, cfg, *phantom_w, ps);
    for (size_t k = 0; k < rv.result.bytes_by_tier.size(); ++k)
      EXPECT_NEAR(static_cast<double>(pv.result.bytes_by_tier[k]),
                  static_cast<double>(rv.result.bytes_by_tier[k]),
                  0.01 * static_cast<double>(rv.result.bytes_by_tier[k]))
          << policy << " tier " << k;
  }
}

TEST(StepCache, EveryFamilyRunsBothPoliciesAndSkips) {
  for (const char* preset :
       {"flux1-tiny", "flux2-tiny", "sd35-tiny", "qwen-image-tiny", "dit-xl-2-tiny", "wan-tiny"}) {
    const ModelConfig cfg = load_model_preset(preset);
    const auto w = make_weights(cfg, 5, false);
    RunSettings st = image_run(cfg, 4);
    if (model_family(cfg.family).video) st.resolution = 32;
    for (const char* policy : {"first_block", "teacache"}) {
      st.step_cache.policy = policy;
      st.step_cache.threshold = 1e9;
      const RunOutput o = serial_output(cfg, *w, st);
      EXPECT_TRUE(o.latent.mat().allFinite()) << preset << " " << policy;
      EXPECT_FALSE(o.step_cache.skipped.empty()) << preset << " " << policy;
    }
  }
}

}  // namespace
}  // namespace cocodiff::dit

namespace cocodiff::dit {
namespace {

TEST(Fp8, E4m3RoundsToNearestEvenAndClampsAtItsLargestValue) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    const float v = e4m3_decode(static_cast<std::uint8_t>(c));
    if (v == 0.0f) continue;            // -0 and +0
    EXPECT_EQ(e4m3_encode(v), c) << c;  // every value is its own code
  }
  EXPECT_EQ(e4m3_decode(e4m3_encode(1000.0f)), kE4m3Max);
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), 0.001953125f);  // the smallest subnormal, 2^-9
  // 1.0625 lies halfway between 1.0 (code 0x38, even) and 1.125 (0x39): ties to even.
  EXPECT_EQ(e4m3_encode(1.0625f), 0x38);
  EXPECT_EQ(e4m3_encode(1.1875f), 0x3A);  // between 1.125 (odd) and 1.25 (even)
}

TEST(Fp8, RowsRoundTripWithinTheFormatsErrorAndZeroRowsStayZero) {
  Mat x(3, 5);
  x << 1, -2, 3, 0.5, 448, 0, 0, 0, 0, 0, 1e-3f, -7, 2.5f, 100, -0.01f;
  std::vector<float> words(static_cast<size_t>(3 * fp8_row_words(5)));
  EXPECT_EQ(fp8_row_words(5), 4);  // a scale and three words of two codes
  fp8_encode(ConstMatMap(x.data(), 3, 5), words.data());
  Mat y(3, 5);
  fp8_decode(words.data(), MatMap(y.data(), 3, 5));
  EXPECT_EQ(y.row(1), x.row(1));
  EXPECT_EQ(y(0, 4), 448.0f);  // a row's largest element is exact
  for (Eigen::Index r = 0; r < 3; ++r) {
    const float amax = x.row(r).cwiseAbs().maxCoeff();
    for (Eigen::Index c = 0; c < 5; ++c)      // 3 mantissa bits: within 1/16 of the value, or of
      EXPECT_LE(std::abs(y(r, c) - x(r, c)),  // the row's smallest normal step
                std::max(std::abs(x(r, c)) / 16, amax / kE4m3Max * 0.002f))
          << r << " " << c;
  }
}

TEST(Fp8, EveryUlyssesStrategyCompressedSendsLessAndStaysNearSerial) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = image_run(cfg, 3);
  const Tensor ref = test::serial(cfg, *w, st);
  emu::Engine engine = make_engine(2, 2, 2);
  st.strategy_options.v_major_threshold = 0;
  for (const char* name : {"flat", "tapa", "v_first", "pipeline", "cocodiff", "usp"}) {
    st.strategy = name;
    st.strategy_options.compress = "none";
    const Outcome exact = run(engine, cfg, *w, st);
    st.strategy_options.compress = "fp8";
    const Outcome r = run(engine, cfg, *w, st);
    const double e = relative_l2(ref, r.latent);
    EXPECT_GT(e, 1e-5) << name;  // lossy, and it shows
    EXPECT_LT(e, 0.1) << name;
    // Less on every tier the Ulysses exchanges cross (usp's ring passes are not compressed).
    std::int64_t sent = 0, sent_exact = 0;
    for (size_t k = 0; k < exact.result.bytes_by_tier.size(); ++k) {
      EXPECT_LE(r.result.bytes_by_tier[k], exact.result.bytes_by_tier[k]) << name << " " << k;
      sent += r.result.bytes_by_tier[k];
      sent_exact += exact.result.bytes_by_tier[k];
    }
    EXPECT_LT(sent, sent_exact) << name;
    // Deterministic: the same bytes again.
    const Outcome again = run(engine, cfg, *w, st);
    EXPECT_TRUE(bitwise_equal(r.latent, again.latent)) << name;
  }
}

TEST(Residual, FourBitRowsRoundTripWithinHalfAStepAndZeroRowsStayZero) {
  Mat x(3, 6);
  x << 1, -2, 3, 0.5f, 7, -7, 0, 0, 0, 0, 0, 0, 1e-3f, -0.7f, 0.25f, 0.35f, -0.05f, 0.7f;
  EXPECT_EQ(int4_row_words(6), 3);  // a scale and two words of four codes
  EXPECT_EQ(int4_row_words(0), 0);
  std::vector<float> words(static_cast<size_t>(3 * int4_row_words(6)));
  int4_encode(ConstMatMap(x.data(), 3, 6), words.data());
  Mat y(3, 6);
  int4_decode(words.data(), MatMap(y.data(), 3, 6));
  EXPECT_EQ(y.row(1), x.row(1));
  EXPECT_EQ(y(0, 4), 7.0f);  // scale 1: integers are exact, and so is the row's largest
  EXPECT_EQ(y(0, 3), 0.0f);  // 0.5 lies halfway between 0 and 1: ties to even
  for (Eigen::Index r = 0; r < 3; ++r) {
    const float step = x.row(r).cwiseAbs().maxCoeff() / 7;
    for (Eigen::Index c = 0; c < 6; ++c)
      EXPECT_LE(std::abs(y(r, c) - x(r, c)), step / 2 * 1.0001f) << r << " " << c;
  }
}

TEST(Residual, EveryUlyssesStrategySendsResidualsNearSerialWithLessThanFp8) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = image_run(cfg, 4);
  const Tensor ref = test::serial(cfg, *w, st);
  emu::Engine engine = make_engine(2, 2, 2);
  st.strategy_options.v_major_threshold = 0;
  for (const char* name : {"flat", "tapa", "v_first", "pipeline", "cocodiff", "usp"}) {
    st.strategy = name;
    st.strategy_options.compress = "fp8";
    const Outcome fp8 = run(engine, cfg, *w, st);
    st.strategy_options.compress = "residual";
    const Outcome r = run(engine, cfg, *w, st);
    const double e = relative_l2(ref, r.latent);
    // Lossy, and it shows; on random weights a step's change is as large as the activation, so
    // 4 bits of it lose more than FP8 does (on the trained model it is the other way round:
    // Run.ResidualExchangesBeatFp8OnTheTrainedModel).
    EXPECT_GT(e, 1e-7) << name;
    EXPECT_LT(e, 0.05) << name;
    std::int64_t sent = 0, sent_fp8 = 0;
    for (size_t k = 0; k < r.result.bytes_by_tier.size(); ++k) {
      sent += r.result.bytes_by_tier[k];
      sent_fp8 += fp8.result.bytes_by_tier[k];
    }
    EXPECT_LT(sent, sent_fp8) << name;  // the first step exact, then half of FP8's bytes
    const Outcome again = run(engine, cfg, *w, st);
    EXPECT_TRUE(bitwise_equal(r.latent, again.latent)) << name;
    EXPECT_EQ(again.result.timeline_sha256, r.result.timeline_sha256) << name;
  }
  // The same bytes and timeline on 1, 2 and 4 workers, with the step cache too.
  st.strategy = "cocodiff";
  st.step_cache.policy = "teacache";
  st.step_cache.threshold = 1.0;
  test::on_one_two_and_four_workers(
      2, 2, 2, cfg, *w, st, [](const Outcome& first, const Outcome& r, int workers) {
        EXPECT_EQ(r.result.timeline_sha256, first.result.timeline_sha256) << workers;
        EXPECT_EQ(r.result.bytes_by_tier, first.result.bytes_by_tier) << workers;
        EXPECT_TRUE(bitwise_equal(r.latent, first.latent)) << workers;
      });
  // One step: nothing to take a residual against, so the exact run's bytes and latent.
  RunSettings one = image_run(cfg, 1);
  one.strategy = "tapa";
  const Outcome exact1 = run(engine, cfg, *w, one);
  one.strategy_options.compress = "residual";
  const Outcome res1 = run(engine, cfg, *w, one);
  EXPECT_TRUE(bitwise_equal(exact1.latent, res1.latent));
  EXPECT_EQ(exact1.result.bytes_by_tier, res1.result.bytes_by_tier);
}

}  // namespace
}  // namespace cocodiff::dit
