// `cocodiff forward` reads a checkpoint and inputs by their documented names and writes the same
// prediction as dit::forward computed here, in-process.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>

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
  fi.grid_h = h / mc.patch_size;
  fi.grid_w = wd / mc.patch_size;
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
  fi.grid_h = h / mc.patch_size;
  fi.grid_w = wd / mc.patch_size;
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

}  // namespace
}  // namespace cocodiff
