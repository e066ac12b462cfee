// Video DiTs: the token grid with frames (patchify, positions), the tiny Wan model through every
// strategy against the serial run, CFG-parallel and inpainting over frames, the same timeline
// on 1, 2 and 4 workers, frames = 1 as an image, and the errors for frames a model cannot take.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "dit/layers.hpp"
#include "dit/local_comm.hpp"
#include "dit/model.hpp"
#include "dit/model_family.hpp"
#include "dit/models/common.hpp"
#include "dit/pipeline.hpp"
#include "dit/quality.hpp"
#include "dit/safetensors.hpp"
#include "emulator/engine.hpp"
#include "net_models/device_model.hpp"
#include "net_models/network_model.hpp"
#include "tests/dit/emulated_runs.hpp"

namespace cocodiff::dit {
namespace {

using test::bitwise_equal;
using test::make_engine;
using test::Outcome;
using test::run;
using test::serial;

// 9 frames (3 latent frames) of 64 x 64 pixels: 3 x 4 x 4 = 48 video tokens.
RunSettings video_run(int steps) {
  RunSettings st;
  st.resolution = 64;
  st.frames = 9;
  st.steps = steps;
  st.seed = 4;
  return st;
}

TEST(TokenGrid, PatchifyFramesAndPositionsFollowTheGridOrder) {
  // Two frames of a 4 x 4 latent, 2 channels, 2 x 2 patches: frame after frame.
  const int c = 2, h = 4, wd = 4, p = 2, f = 2;
  Mat m(c, f * h * wd);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(i);
  const Tensor latent = Tensor::from(m);
  const Tensor tokens = patchify(latent, c, h, wd, p, f);
  ASSERT_EQ(tokens.rows(), f * (h / p) * (wd / p));
  // The first token of frame 1 is frame 1's top-left patch.
  const Tensor frame1 = Tensor::from(Mat(m.middleCols(h * wd, h * wd)));
  EXPECT_EQ(Mat(tokens.mat().middleRows(4, 4)), patchify(frame1, c, h, wd, p).mat());
  EXPECT_EQ(unpatchify(tokens, c, h, wd, p, f).mat(), m);
  // Positions (frame, row, column) of tokens 5..9 of a 3 x 2 x 3 grid.
  const Eigen::MatrixXd pos = models::image_positions({5, 5, 18}, TokenGrid{3, 2, 3}, 0, 0);
  EXPECT_EQ(pos.row(0), Eigen::RowVector3d(0, 1, 2));  // token 5
  EXPECT_EQ(pos.row(1), Eigen::RowVector3d(1, 0, 0));  // token 6: frame 1 starts
  EXPECT_EQ(pos.row(4), Eigen::RowVector3d(1, 1, 0));  // token 9
}

TEST(Video, EveryStrategyOnTheTinyWanMatchesSerial) {
  const ModelConfig cfg = load_model_preset("wan-tiny");
  EXPECT_TRUE(model_family(cfg.family).video);
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = video_run(2);
  const Tensor ref = serial(cfg, *w, st);
  ASSERT_TRUE(ref.mat().allFinite());
  ASSERT_EQ(ref.cols(), 3 * 8 * 8);  // [C, F*H*W] at latent resolution
  // 12 ranks (one head each: pipeline chunks split tokens) over 2 nodes.
  emu::Engine engine = make_engine(2, 3, 2);
  st.strategy = "flat";
  const Outcome flat = run(engine, cfg, *w, st);
  EXPECT_EQ(flat.latent_frames, 3);
  EXPECT_LT(relative_l2(ref, flat.latent), 1e-5);
  st.strategy_options.v_major_threshold = 0;  // exact
  for (const char* name : {"tapa", "v_first", "pipeline", "v_major", "cocodiff", "usp"}) {
    st.strategy = name;
    const Outcome r = run(engine, cfg, *w, st);
    EXPECT_LT(relative_l2(ref, r.latent), 1e-5) << name;
    if (std::string(name) == "tapa") {
      EXPECT_TRUE(bitwise_equal(flat.latent, r.latent));
    }
  }
  // V-Major above zero sends less across nodes and says what it lost.
  st.strategy = "v_major";
  st.steps = 4;
  st.strategy_options.v_major_warmup_steps = 1;
  st.strategy_options.v_major_threshold = 0.5;
  st.strategy_options.v_major_block_tokens = 4;
  const Outcome lossy = run(engine, cfg, *w, st);
  st.strategy = "tapa";
  const Outcome exact = run(engine, cfg, *w, st);
  EXPECT_LT(lossy.result.bytes_by_tier[2], exact.result.bytes_by_tier[2]);
  const double e = relative_l2(exact.latent, lossy.latent);
  EXPECT_GT(e, 0.0);
  EXPECT_LT(e, 0.5);
}

TEST(Video, CfgParallelAndInpaintingOverFramesMatchSerial) {
  const ModelConfig cfg = load_model_preset("wan-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = video_run(2);
  // Keep the first latent frame, generate the other two.
  const int cells = 3 * 8 * 8, plane = 8 * 8;
  Mat known = Mat::Constant(cfg.latent_channels, cells, 0.25f);
  Mat mask = Mat::Ones(1, cells);
  mask.leftCols(plane).setZero();
  st.known_latent = Tensor::from(known);
  st.mask = Tensor::from(mask);
  const Tensor ref = serial(cfg, *w, st);
  EXPECT_EQ((ref.mat().leftCols(plane).array() - 0.25f).abs().maxCoeff(), 0.0f);
  EXPECT_GT((ref.mat().rightCols(cells - plane).array() - 0.25f).abs().maxCoeff(), 0.1f);
  emu::Engine engine = make_engine(2, 3, 2);  // 12 ranks: two halves of 6
  st.strategy = "flat";
  EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5);
  st.cfg_degree = 2;
  EXPECT_LT(relative_l2(ref, run(engine, cfg, *w, st).latent), 1e-5);
}

TEST(Video, TheSameTimelineOnOneTwoAndFourWorkers) {
  const ModelConfig cfg = load_model_preset("wan-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = video_run(2);
  st.strategy = "cocodiff";
  test::on_one_two_and_four_workers(
      2, 3, 2, cfg, *w, st, [](const Outcome& first, const Outcome& r, int workers) {
        EXPECT_EQ(r.result.timeline_sha256, first.result.timeline_sha256) << workers;
        EXPECT_TRUE(bitwise_equal(r.latent, first.latent)) << workers;
      });
}

TEST(Video, OneFrameIsAnImageAndFramesTheModelCannotTakeAreErrors) {
  const ModelConfig cfg = load_model_preset("wan-tiny");
  const auto w = make_weights(cfg, 5, false);
  RunSettings st = video_run(1);
  st.frames = 1;
  LocalComm comm;
  st.strategy = "serial";
  const RunOutput one = generate(comm, cfg, *w, st);
  EXPECT_EQ(one.latent_frames, 1);
  EXPECT_EQ(one.tokens, 16);
  st.frames = 8;  // not 1 + a multiple of the VAE's 4
  EXPECT_THROW(generate(comm, cfg, *w, st), ConfigError);
  const ModelConfig image = load_model_preset("flux1-tiny");
  const auto wi = make_weights(image, 5, false);
  st.frames = 5;
  try {
    generate(comm, image, *wi, st);
    FAIL() << "an image model accepted 5 frames";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("run.frames"), std::string::npos) << e.what();
  }
}

TEST(Video, FullSizeWanHasThePublishedShapes) {
  auto params = [](const std::string& preset) {
    std::int64_t n = 0;
    for (const TensorSpec& s : make_model(load_model_preset(preset))->tensor_specs())
      n += s.numel();
    return n;
  };
  // Wan2.1-T2V-1.3B and -14B: the published configs' shapes summed by hand (patch embedding,
  // condition embedder, 30 or 40 blocks of two attentions, norm2, FFN and table, proj_out and
  // table), which the model cards round to 1.3B and 14B; diffusers' class counts the same
  // (configs/measurements/h200x1-video/env.json).
  EXPECT_EQ(params("wan2.1-t2v-1.3b"), 1418996800);
  EXPECT_EQ(params("wan2.1-t2v-14b"), 14288491584);
  const ModelConfig big = load_model_preset("wan2.1-t2v-14b");
  EXPECT_EQ(big.latent_frames(81), 21);
  EXPECT_EQ(big.image_tokens(720, 1280) * big.latent_frames(81), 75600);
}

// The trained video model's weights (configs/video.toml's, 20 steps, true CFG at 3) through
// 24 tiles of usp (Ulysses over each GPU's 2 tiles, Ring over 12 GPUs, as configs/video.toml)
// give the serial run's frames; consecutive frames differ, and another motion or class asked
// for gives another video. (Whether the frames show the class and motion asked for is the
// training script's score, wan_fmnist_video.py score, in the weights' PROVENANCE.md.)
TEST(Video, TheTrainedWeightsOnTwentyFourTilesGiveTheSerialFrames) {
  const std::filesystem::path dir =
      std::filesystem::path(COCODIFF_CONFIG_DIR) / "weights/wan-fmnist";
  const ModelConfig cfg = load_model_preset("wan-fmnist");
  ASSERT_EQ(cfg.motions, (std::vector<std::string>{"right", "left", "down", "up"}));
  const auto w =
      load_safetensors_weights(dir / "wan-fmnist.safetensors", make_model(cfg)->tensor_specs());
  RunSettings st;
  st.resolution = 24;
  st.frames = 8;
  st.steps = 20;
  st.seed = 42;
  st.class_label = 9;  // ankle boot, moving right
  const Tensor ref = serial(cfg, *w, st);
  ASSERT_EQ(ref.cols(), 8 * 24 * 24);
  for (int f = 1; f < 8; ++f) {
    const double diff =
        (ref.mat().middleCols(f * 576, 576) - ref.mat().middleCols((f - 1) * 576, 576))
            .cwiseAbs()
            .mean();
    EXPECT_GT(diff, 1e-3) << "frame " << f;
  }
  RunSettings other = st;
  other.class_label = 3 * cfg.classes() + 9;  // moving up
  EXPECT_GT(relative_l2(ref, serial(cfg, *w, other)), 0.05);
  emu::Engine engine = make_engine(2, 6, 2);
  st.strategy = "usp";
  st.strategy_options.usp_ring_levels = 2;  // the ring over nodes and GPUs, Ulysses over tiles
  const Outcome usp = run(engine, cfg, *w, st);
  EXPECT_LT(relative_l2(ref, usp.latent), 1e-4);
}

// The frame classifier scripts/train/wan_fmnist_video.py trains to score the video model
// (FrameClassifier there: three 3x3 convolutions of 32, 64 and 64 channels with ReLU, 2x2 max
// pools and an adaptive 2x2 max pool, then linear 256 -> 128 -> 10), read from
// frame_classifier.safetensors and run here on a 24 x 24 frame in [-1, 1].
class FrameClassifier {
 public:
  explicit FrameClassifier(const std::filesystem::path& file) {
    const SafetensorsFile f(file);
    for (const char* n : {"net.0", "net.3", "net.6", "net.10", "net.12"}) {
      const Tensor w = f.read(std::string(n) + ".weight");
      const Tensor b = f.read(std::string(n) + ".bias");
      w_.emplace_back(w.mat().data(), w.mat().data() + w.numel());
      b_.emplace_back(b.mat().data(), b.mat().data() + b.numel());
    }
  }
  int classify(const float* frame) const {
    std::vector<float> x(frame, frame + 24 * 24);
    int c = 1, side = 24;
    const int widths[3] = {32, 64, 64};
    for (int l = 0; l < 3; ++l) {
      x = relu(conv(x, c, widths[l], side, l));
      c = widths[l];
      x = l < 2 ? pool(x, c, side, 2) : pool(x, c, side, side / 2);  // the last: to 2 x 2
      side = l < 2 ? side / 2 : 2;
    }
    const std::vector<float> h = relu(linear(x, 3, 128));
    const std::vector<float> logits = linear(h, 4, 10);
    return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

 private:
  static std::vector<float> relu(std::vector<float> v) {
    for (float& e : v) e = std::max(e, 0.0f);
    return v;
  }
  std::vector<float> conv(const std::vector<float>& x, int cin, int cout, int side, int l) const {
    std::vector<float> y(static_cast<size_t>(cout * side * side));
    for (int o = 0; o < cout; ++o)
      for (int i = 0; i < side; ++i)
        for (int j = 0; j < side; ++j) {
          float acc = b_[l][static_cast<size_t>(o)];
          for (int ci = 0; ci < cin; ++ci)
            for (int di = -1; di <= 1; ++di)
              for (int dj = -1; dj <= 1; ++dj) {
                const int a = i + di, b = j + dj;
                if (a < 0 || b < 0 || a >= side || b >= side) continue;
                acc += w_[l][static_cast<size_t>(((o * cin + ci) * 3 + di + 1) * 3 + dj + 1)] *
                       x[static_cast<size_t>((ci * side + a) * side + b)];
              }
          y[static_cast<size_t>((o * side + i) * side + j)] = acc;
        }
    return y;
  }
  // Max over k x k windows (the adaptive 2 x 2 pool of a 6 x 6 map is k = 3).
  static std::vector<float> pool(const std::vector<float>& x, int c, int side, int k) {
    const int out = side / k;
    std::vector<float> y(static_cast<size_t>(c * out * out), -1e30f);
    for (int ch = 0; ch < c; ++ch)
      for (int i = 0; i < side; ++i)
        for (int j = 0; j < side; ++j) {
          float& m = y[static_cast<size_t>((ch * out + i / k) * out + j / k)];
          m = std::max(m, x[static_cast<size_t>((ch * side + i) * side + j)]);
        }
    return y;
  }
  std::vector<float> linear(const std::vector<float>& x, int l, int out) const {
    std::vector<float> y(b_[l]);
    const size_t in = x.size();
    for (int o = 0; o < out; ++o)
      for (size_t i = 0; i < in; ++i) y[static_cast<size_t>(o)] += w_[l][o * in + i] * x[i];
    return y;
  }
  std::vector<std::vector<float>> w_, b_;
};

// The centre of brightness of a frame in [-1, 1]: (row, column).
std::array<double, 2> centre(const float* frame) {
  double tot = 0, r = 0, c = 0;
  for (int i = 0; i < 24; ++i)
    for (int j = 0; j < 24; ++j) {
      const double w = (std::clamp(frame[i * 24 + j], -1.0f, 1.0f) + 1) / 2;
      tot += w;
      r += w * i;
      c += w * j;
    }
  return {r / std::max(tot, 1e-6), c / std::max(tot, 1e-6)};
}

// The picture check: the trained video model (configs/video.toml's settings: 20 steps, true CFG
// at 3), asked for every class moving two ways (20 clips, seed 42), makes frames the frame
// classifier takes for the class asked for and clips whose centre of brightness travels the way
// asked, each far above chance (10% and 25%). The training script's own score (200 clips, 5
// seeds a condition, its PyTorch classifier) is in PROVENANCE.md: 62.3% and 43.5%.
TEST(Video, TheTrainedModelMakesTheClassAndTheMotionAskedFor) {
  const std::filesystem::path dir =
      std::filesystem::path(COCODIFF_CONFIG_DIR) / "weights/wan-fmnist";
  const ModelConfig cfg = load_model_preset("wan-fmnist");
  const auto w =
      load_safetensors_weights(dir / "wan-fmnist.safetensors", make_model(cfg)->tensor_specs());
  const FrameClassifier judge(dir / "frame_classifier.safetensors");
  RunSettings st;
  st.resolution = 24;
  st.frames = 8;
  st.steps = 20;
  st.seed = 42;
  int right_class = 0, right_motion = 0, frames = 0, clips = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int cls = 0; cls < cfg.classes(); ++cls) {
      const int motion = (cls + 2 * pass) % 4;  // every class two ways, every way five times
      st.class_label = motion * cfg.classes() + cls;
      const Tensor v = serial(cfg, *w, st);
      const float* px = v.mat().data();
      for (int f = 0; f < 8; ++f, ++frames) right_class += judge.classify(px + f * 576) == cls;
      const std::array<double, 2> a = centre(px), b = centre(px + 7 * 576);
      const double dr = b[0] - a[0], dc = b[1] - a[1];
      const int moved = std::abs(dc) >= std::abs(dr) ? (dc > 0 ? 0 : 1) : (dr > 0 ? 2 : 3);
      right_motion += moved == motion;
      ++clips;
    }
  const double class_rate = static_cast<double>(right_class) / frames;
  const double motion_rate = static_cast<double>(right_motion) / clips;
  std::printf("frames of the class asked for %.3f, clips moving as asked %.3f\n", class_rate,
              motion_rate);
  // Measured here: 0.662 (106 of 160 frames) and 0.50 (10 of 20 clips); the bounds leave room for
  // another CPU's rounding to flip the borderline frames and clips.
  EXPECT_GE(class_rate, 0.5);   // chance: 0.1
  EXPECT_GE(motion_rate, 0.4);  // chance: 0.25
}

}  // namespace
}  // namespace cocodiff::dit
