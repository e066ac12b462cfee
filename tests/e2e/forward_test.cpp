// `cocodiff forward` reads a checkpoint and inputs by their documented names and writes the same
// prediction as dit::forward computed here, in-process.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "dit/layers.hpp"
#include "dit/local_comm.hpp"
#include "dit/model.hpp"
#include "dit/pipeline.hpp"
#include "dit/safetensors.hpp"

namespace cocodiff {
namespace {

namespace fs = std::filesystem;

TEST(Forward, CommandMatchesTheLibrary) {
  const fs::path dir = fs::temp_directory_path() / ("cocodiff_forward_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const dit::ModelConfig mc =
      dit::load_model_preset("flux1-tiny", fs::path(COCODIFF_CONFIG_DIR) / "models");
  std::shared_ptr<const dit::Weights> w = dit::make_weights(mc, 5, false);
  dit::write_safetensors(dir / "w.safetensors", *w);

  const int h = 8, wd = 8;
  Tensor latent = Tensor::zeros(mc.latent_channels, h * wd, false);
  latent.mat().setRandom();
  Tensor sigma = Tensor::from(Mat::Constant(1, 1, 0.7f));
  dit::TextConditioning tc = dit::make_text_conditioning(mc, 3, false, false);
  dit::write_safetensors(dir / "in.safetensors",
                         {{"latent", {mc.latent_channels, h, wd}, &latent},
                          {"sigma", {1}, &sigma},
                          {"text", {tc.text.rows(), tc.text.cols()}, &tc.text},
                          {"pooled", {tc.pooled.rows(), tc.pooled.cols()}, &tc.pooled}});
  const std::string cmd = std::string(COCODIFF_BIN) + " forward --model flux1-tiny --weights " +
                          (dir / "w.safetensors").string() + " --input " +
                          (dir / "in.safetensors").string() + " --output " +
                          (dir / "out.safetensors").string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  const Tensor tokens = dit::patchify(latent, mc.latent_channels, h, wd, mc.patch_size);
  dit::ForwardInputs fi;
  fi.x = &tokens;
  fi.grid = {1, h / mc.patch_size, wd / mc.patch_size};
  fi.shard = dit::shard_tokens(tokens.rows(), 1, 0);
  fi.sigmas = {0.7f};
  fi.guidance = {static_cast<float>(mc.cfg_scale)};
  fi.text = &tc.text;
  fi.pooled = &tc.pooled;
  dit::LocalComm comm;
  const Tensor expect = dit::unpatchify(dit::forward(comm, mc, *w, "serial", fi, false),
                                        mc.out_channels, h, wd, mc.patch_size);
  dit::SafetensorsFile out(dir / "out.safetensors");
  ASSERT_NE(out.find("velocity"), nullptr);
  EXPECT_EQ(out.find("velocity")->shape, (std::vector<std::int64_t>{mc.out_channels, h, wd}));
  const Tensor got = out.read("velocity");
  ASSERT_EQ(got.rows(), expect.rows());
  EXPECT_EQ((got.mat() - expect.mat()).cwiseAbs().maxCoeff(), 0.0f);
  EXPECT_GT(expect.mat().cwiseAbs().maxCoeff(), 0.0f);

  // A missing input tensor is a clear error with exit code 2.
  dit::write_safetensors(dir / "bad.safetensors",
                         {{"latent", {mc.latent_channels, h, wd}, &latent}});
  const std::string bad = std::string(COCODIFF_BIN) + " forward --model flux1-tiny --weights " +
                          (dir / "w.safetensors").string() + " --input " +
                          (dir / "bad.safetensors").string() + " --output " +
                          (dir / "out2.safetensors").string() + " 2> " + (dir / "err.txt").string();
  const int status = std::system(bad.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_FALSE(fs::exists(dir / "out2.safetensors"));
  fs::remove_all(dir);
}

// DiT predicts noise and learned-sigma channels (out_channels = 2 x latent_channels): `forward`
// writes every one of them as "output", equal to the library's prediction with all channels, and
// "velocity" as the first latent_channels of it.
TEST(Forward, WritesEveryOutputChannel) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_forward_dit_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const dit::ModelConfig mc =
      dit::load_model_preset("dit-xl-2-tiny", fs::path(COCODIFF_CONFIG_DIR) / "models");
  ASSERT_GT(mc.out_channels, mc.latent_channels);
  std::shared_ptr<const dit::Weights> w = dit::make_weights(mc, 6, false);
  dit::write_safetensors(dir / "w.safetensors", *w);
  const int h = 8, wd = 8;
  Tensor latent = Tensor::zeros(mc.latent_channels, h * wd, false);
  latent.mat().setRandom();
  Tensor sigma = Tensor::from(Mat::Constant(1, 1, 0.5f));
  Tensor label = Tensor::from(Mat::Constant(1, 1, 3.0f));
  dit::write_safetensors(dir / "in.safetensors", {{"latent", {mc.latent_channels, h, wd}, &latent},
                                                  {"sigma", {1}, &sigma},
                                                  {"class_label", {1}, &label}});
  const std::string cmd = std::string(COCODIFF_BIN) + " forward --model dit-xl-2-tiny --weights " +
                          (dir / "w.safetensors").string() + " --input " +
                          (dir / "in.safetensors").string() + " --output " +
                          (dir / "out.safetensors").string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  const Tensor tokens = dit::patchify(latent, mc.latent_channels, h, wd, mc.patch_size);
  dit::ForwardInputs fi;
  fi.x = &tokens;
  fi.grid = {1, h / mc.patch_size, wd / mc.patch_size};
  fi.shard = dit::shard_tokens(tokens.rows(), 1, 0);
  fi.sigmas = {0.5f};
  fi.class_labels = {3};
  fi.all_channels = true;
  dit::LocalComm comm;
  const Tensor expect = dit::unpatchify(dit::forward(comm, mc, *w, "serial", fi, false),
                                        mc.out_channels, h, wd, mc.patch_size);
  dit::SafetensorsFile out(dir / "out.safetensors");
  ASSERT_NE(out.find("output"), nullptr);
  EXPECT_EQ(out.find("output")->shape, (std::vector<std::int64_t>{mc.out_channels, h, wd}));
  EXPECT_EQ(out.find("velocity")->shape, (std::vector<std::int64_t>{mc.latent_channels, h, wd}));
  const Tensor all = out.read("output");
  ASSERT_EQ(all.rows(), expect.rows());
  EXPECT_EQ((all.mat() - expect.mat()).cwiseAbs().maxCoeff(), 0.0f);
  EXPECT_GT(expect.mat().bottomRows(mc.out_channels - mc.latent_channels).cwiseAbs().maxCoeff(),
            0.0f);  // the learned-sigma channels are there, not zeros
  const Tensor v = out.read("velocity");
  EXPECT_TRUE(v.mat() == expect.mat().topRows(mc.latent_channels));
  fs::remove_all(dir);
}

// Runs `cocodiff forward` and returns its exit code; stderr goes to `err`.
int forward_cmd(const std::string& model, const fs::path& weights, const fs::path& in,
                const fs::path& out, const fs::path& err) {
  const std::string cmd = std::string(COCODIFF_BIN) + " forward --model " + model + " --weights " +
                          weights.string() + " --input " + in.string() + " --output " +
                          out.string() + " > /dev/null 2> " + err.string();
  return WEXITSTATUS(std::system(cmd.c_str()));
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// flux1-fmnist (learned class tokens): class_label selects the class's tokens, as `run` does,
// so classes 9 and 3 give different predictions, each equal to the library's; a model without
// classes refuses class_label; class_label beside text is refused; so is a class out of range.
TEST(Forward, ClassLabelIsHonouredOrRefused) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_forward_class_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const dit::ModelConfig mc =
      dit::load_model_preset("flux1-fmnist", fs::path(COCODIFF_CONFIG_DIR) / "models");
  ASSERT_GT(mc.num_classes, 0);
  const fs::path weights =
      fs::path(COCODIFF_CONFIG_DIR) / "weights/flux1-fmnist/flux1-fmnist.safetensors";
  const std::shared_ptr<const dit::Weights> w = dit::load_weights(mc, weights);
  const int h = 28, wd = 28;
  Tensor latent = Tensor::zeros(mc.latent_channels, h * wd, false);
  latent.mat().setRandom();
  Tensor sigma = Tensor::from(Mat::Constant(1, 1, 0.6f));
  std::vector<std::string> got;
  for (const int label : {9, 3}) {
    Tensor l = Tensor::from(Mat::Constant(1, 1, static_cast<float>(label)));
    const fs::path in = dir / ("in" + std::to_string(label) + ".safetensors");
    const fs::path out = dir / ("out" + std::to_string(label) + ".safetensors");
    dit::write_safetensors(in, {{"latent", {mc.latent_channels, h, wd}, &latent},
                                {"sigma", {1}, &sigma},
                                {"class_label", {1}, &l}});
    ASSERT_EQ(forward_cmd("flux1-fmnist", weights, in, out, dir / "err"), 0)
        << read_text(dir / "err");
    const Tensor tokens = dit::patchify(latent, mc.latent_channels, h, wd, mc.patch_size);
    const dit::TextConditioning c = dit::class_conditioning(mc, *w, label, false);
    dit::ForwardInputs fi;
    fi.x = &tokens;
    fi.grid = {1, h / mc.patch_size, wd / mc.patch_size};
    fi.shard = dit::shard_tokens(tokens.rows(), 1, 0);
    fi.sigmas = {0.6f};
    fi.text = &c.text;
    if (mc.pooled_dim > 0) fi.pooled = &c.pooled;
    if (mc.guidance_embed) fi.guidance = {static_cast<float>(mc.cfg_scale)};
    fi.class_labels = {label};
    fi.all_channels = true;
    dit::LocalComm comm;
    const Tensor expect = dit::unpatchify(dit::forward(comm, mc, *w, "serial", fi, false),
                                          mc.out_channels, h, wd, mc.patch_size);
    const Tensor v = dit::SafetensorsFile(out).read("output");
    EXPECT_EQ((v.mat() - expect.mat()).cwiseAbs().maxCoeff(), 0.0f) << label;
    got.push_back(read_text(out));
  }
  EXPECT_NE(got[0], got[1]);

  // class_label beside text: refused, naming both.
  const dit::TextConditioning tc = dit::class_conditioning(mc, *w, 1, false);
  Tensor l = Tensor::from(Mat::Constant(1, 1, 12.0f));
  dit::write_safetensors(dir / "both.safetensors",
                         {{"latent", {mc.latent_channels, h, wd}, &latent},
                          {"sigma", {1}, &sigma},
                          {"class_label", {1}, &l},
                          {"text", {tc.text.rows(), tc.text.cols()}, &tc.text}});
  EXPECT_EQ(forward_cmd("flux1-fmnist", weights, dir / "both.safetensors", dir / "x", dir / "err"),
            2);
  EXPECT_NE(read_text(dir / "err").find("either class_label (its learned class tokens) or text"),
            std::string::npos)
      << read_text(dir / "err");
  dit::write_safetensors(dir / "range.safetensors",
                         {{"latent", {mc.latent_channels, h, wd}, &latent},
                          {"sigma", {1}, &sigma},
                          {"class_label", {1}, &l}});
  EXPECT_EQ(forward_cmd("flux1-fmnist", weights, dir / "range.safetensors", dir / "x", dir / "err"),
            2);
  EXPECT_NE(read_text(dir / "err")
                .find("must be a class index, an integer in [0, 9] or 10 (the null class) for "
                      "flux1-fmnist; found 12"),
            std::string::npos)
      << read_text(dir / "err");
  EXPECT_FALSE(fs::exists(dir / "x"));
  fs::remove_all(dir);
}

// flux1-tiny has no classes: a class_label input is refused, not ignored. Weights of another
// model: the missing tensors are summarised in a few lines, each name pattern once.
TEST(Forward, UnusedInputsAreRefusedAndMissingWeightsSummarised) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_forward_refuse_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const dit::ModelConfig mc =
      dit::load_model_preset("flux1-tiny", fs::path(COCODIFF_CONFIG_DIR) / "models");
  std::shared_ptr<const dit::Weights> w = dit::make_weights(mc, 5, false);
  dit::write_safetensors(dir / "w.safetensors", *w);
  const int h = 8, wd = 8;
  Tensor latent = Tensor::zeros(mc.latent_channels, h * wd, false);
  Tensor sigma = Tensor::from(Mat::Constant(1, 1, 0.7f));
  Tensor label = Tensor::from(Mat::Constant(1, 1, 3.0f));
  dit::TextConditioning tc = dit::make_text_conditioning(mc, 3, false, false);
  dit::write_safetensors(dir / "in.safetensors",
                         {{"latent", {mc.latent_channels, h, wd}, &latent},
                          {"sigma", {1}, &sigma},
                          {"text", {tc.text.rows(), tc.text.cols()}, &tc.text},
                          {"pooled", {tc.pooled.rows(), tc.pooled.cols()}, &tc.pooled},
                          {"class_label", {1}, &label}});
  EXPECT_EQ(forward_cmd("flux1-tiny", dir / "w.safetensors", dir / "in.safetensors",
                        dir / "out.safetensors", dir / "err"),
            2);
  const std::string err = read_text(dir / "err");
  EXPECT_NE(err.find("tensor 'class_label' is not an input of flux1-tiny (it takes latent, sigma, "
                     "text, pooled"),
            std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dir / "out.safetensors"));

  // flux1-tiny's weights for sd35-tiny: one line, every missing name pattern once.
  EXPECT_EQ(forward_cmd("sd35-tiny", dir / "w.safetensors", dir / "in.safetensors",
                        dir / "out.safetensors", dir / "err"),
            2);
  const std::string wrong = read_text(dir / "err");
  EXPECT_EQ(std::count(wrong.begin(), wrong.end(), '\n'), 1) << wrong;
  EXPECT_NE(wrong.find("missing and "), std::string::npos) << wrong;
  EXPECT_NE(wrong.find(" (x"), std::string::npos) << wrong;  // a pattern with its count
  fs::remove_all(dir);
}

// diffusers' own WanTransformer3DModel (float64 on the CPU, random weights and inputs, one block
// of wan-tiny's structure: bench/fidelity/models/wan_reference.py, its output shipped in
// tests/e2e/data/wan_reference/) against `cocodiff forward` on a video latent [16, 3, 4, 6].
TEST(Forward, WanMatchesDiffusersOnAVideoLatent) {
  const fs::path data = fs::path(COCODIFF_SOURCE_DIR) / "tests" / "e2e" / "data" / "wan_reference";
  const fs::path dir = fs::temp_directory_path() / ("cocodiff_wan_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string cmd = std::string(COCODIFF_BIN) +
                          " forward --model wan-tiny --set model.double_blocks=1"
                          " --set model.heads=4 --weights " +
                          (data / "wan_weights.safetensors").string() + " --input " +
                          (data / "wan_input.safetensors").string() + " --output " +
                          (dir / "out.safetensors").string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const dit::SafetensorsFile got(dir / "out.safetensors");
  const dit::SafetensorsFile want(data / "wan_expected.safetensors");
  ASSERT_NE(got.find("velocity"), nullptr);
  EXPECT_EQ(got.find("velocity")->shape, (std::vector<std::int64_t>{16, 3, 4, 6}));
  const Tensor a = got.read("velocity"), b = want.read("velocity");
  ASSERT_EQ(a.numel(), b.numel());
  const double rel = (a.mat() - b.mat()).norm() / b.mat().norm();
  // The reference runs its layer norms, modulation and timestep embedding in float32 (diffusers'
  // FP32LayerNorm and .float() casts) and the rest in float64: 1.5e-6 measured.
  EXPECT_LT(rel, 5e-6);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cocodiff
