// Values that used to crash, hang or pass silently: implausible physical quantities, floats where
// an integer is required, configs that are not regular files, non-finite or empty tensor inputs,
// and safetensors files whose tensors overlap or share a name. Each exits 2 with one message
// naming the key, file or tensor, and leaves no output behind.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "dit/model.hpp"
#include "dit/model_config.hpp"
#include "dit/pipeline.hpp"
#include "dit/safetensors.hpp"
#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

const fs::path kData = COCODIFF_TEST_DATA;

class Guards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cocodiff_guards_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    out_ = dir_ / "out";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  ChildResult run(const std::vector<std::string>& args) { return run_cocodiff(args, dir_ / "log"); }

  /// Exit 2, one "cocodiff: error: " line holding every piece, nothing on stdout, no outputs.
  void expect_user_error(const ChildResult& r, const std::vector<std::string>& pieces) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("cocodiff: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const std::string& p : pieces) EXPECT_NE(r.err.find(p), std::string::npos) << p;
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(fs::exists(out_) && !fs::is_empty(out_)) << "outputs left in " << out_;
  }

  /// `run` and `validate` of good.toml with one --set: both refuse it alike.
  void expect_set_refused(const std::string& set, const std::vector<std::string>& pieces) {
    const std::string g = (kData / "good.toml").string();
    expect_user_error(run({"run", g, "--out", out_.string(), "-q", "--set", set}), pieces);
    expect_user_error(run({"validate", g, "--set", set}), pieces);
  }

  // A raw safetensors file: 8-byte length, header, then `data_bytes` zero bytes.
  fs::path raw(const std::string& name, const std::string& header, std::size_t data_bytes) {
    const fs::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header << std::string(data_bytes, '\0');
    return p;
  }

  /// `cocodiff forward` of flux1-tiny on random weights and the given inputs.
  ChildResult forward(float sigma, float guidance, int h, int w) {
    const dit::ModelConfig mc =
        dit::load_model_preset("flux1-tiny", fs::path(COCODIFF_SOURCE_DIR) / "configs" / "models");
    dit::write_safetensors(dir_ / "w.safetensors", *dit::make_weights(mc, 5, false));
    Tensor latent = Tensor::zeros(mc.latent_channels, static_cast<std::int64_t>(h) * w, false);
    Tensor s = Tensor::from(Mat::Constant(1, 1, sigma));
    Tensor g = Tensor::from(Mat::Constant(1, 1, guidance));
    dit::TextConditioning tc = dit::make_text_conditioning(mc, 3, false, false);
    dit::write_safetensors(dir_ / "in.safetensors",
                           {{"latent", {mc.latent_channels, h, w}, &latent},
                            {"sigma", {1}, &s},
                            {"guidance", {1}, &g},
                            {"text", {tc.text.rows(), tc.text.cols()}, &tc.text},
                            {"pooled", {tc.pooled.rows(), tc.pooled.cols()}, &tc.pooled}});
    out_ = dir_ / "out.safetensors";
    return run({"forward", "--model", "flux1-tiny", "--weights", (dir_ / "w.safetensors").string(),
                "--input", (dir_ / "in.safetensors").string(), "--output", out_.string()});
  }

  fs::path dir_, out_;
};

TEST_F(Guards, ImplausiblePeakIsRefusedWhereItIsParsed) {
  // Used to abort (SIGABRT, "flow starts in the past") in run and pass validate.
  expect_set_refused("cluster.device.peak_tflops=1e-30",
                     {"key 'cluster.device.peak_tflops': expected a plausible peak in [0.001, "
                      "1e+06] TFLOP/s, found 1e-30"});
  expect_set_refused("cluster.device.hbm_gbytes_per_s=1e300",
                     {"key 'cluster.device.hbm_gbytes_per_s'", "found 1e+300"});
}

TEST_F(Guards, TinyBandwidthIsRefusedNotSaturated) {
  // Used to exit 0 reporting a virtual time of 2^62 ns.
  expect_set_refused("cluster.nic.bandwidth_gbytes_per_s=1e-300",
                     {"key 'cluster.nic.bandwidth_gbytes_per_s': expected a plausible bandwidth "
                      "in [0.001, 1e+06] GB/s per direction, found 1e-300"});
  expect_set_refused("cluster.nic.bandwidth_gbytes_per_s=inf",
                     {"key 'cluster.nic.bandwidth_gbytes_per_s'", "found inf"});
  expect_set_refused("cluster.nic.bandwidth_gbytes_per_s=nan",
                     {"key 'cluster.nic.bandwidth_gbytes_per_s'", "found nan"});
}

TEST_F(Guards, AFloatIsNotAnInteger) {
  expect_set_refused("run.resolution=384.0",
                     {"key 'run.resolution': expected an integer in [", "found float 384"});
}

TEST_F(Guards, AConfigMustBeARegularFile) {
  const fs::path fifo = dir_ / "fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_user_error(run({"validate", dir_.string()}),
                    {dir_.string() + ": not a regular file (a directory)"});
  expect_user_error(run({"validate", fifo.string()}),
                    {fifo.string() + ": not a regular file (a FIFO)"});
  expect_user_error(run({"run", "/dev/null", "--out", out_.string()}),
                    {"/dev/null: not a regular file (a device)"});
  // A file over the size limit is refused before it is parsed.
  const fs::path big = dir_ / "big.toml";
  std::ofstream(big) << std::string((std::size_t{16} << 20) + 1, '#');
  expect_user_error(run({"validate", big.string()}),
                    {big.string() + ": 16777217 bytes; a config file may hold at most 16777216"});
}

TEST_F(Guards, ForwardRefusesNonFiniteAndEmptyInputs) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::string in = (dir_ / "in.safetensors").string();
  expect_user_error(forward(nan, 3.5f, 8, 8),
                    {in + ": tensor 'sigma': element 0 is NaN (inputs must be finite)"});
  expect_user_error(forward(0.5f, inf, 8, 8),
                    {in + ": tensor 'guidance': element 0 is infinite (inputs must be finite)"});
  expect_user_error(forward(0.5f, 3.5f, 0, 0),
                    {in + ": tensor 'latent' has the empty shape [16, 0, 0]"});
  const ChildResult ok = forward(0.5f, 3.5f, 8, 8);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(out_));
}

TEST_F(Guards, SafetensorsTensorsMustTileTheDataAndHaveUniqueNames) {
  const std::string cfg_text =
      "[model]\npreset = \"flux1-tiny\"\n[run]\nresolution = 64\nsteps = 1\nmath = \"real\"\n"
      "weights = \"w.safetensors\"\n[cluster]\npreset = \"uniform\"\nnodes = 1\n";
  std::ofstream(dir_ / "run.toml") << cfg_text;
  const std::vector<std::string> args{"run", (dir_ / "run.toml").string(), "--out", out_.string(),
                                      "-q"};
  const std::string w = (dir_ / "w.safetensors").string();
  raw("w.safetensors",
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
      24);
  expect_user_error(run(args), {w + ": tensor 'b': data_offsets [8, 24) overlap tensor 'a'"});
  raw("w.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      16);
  expect_user_error(run(args), {w + ": tensor 'a' is listed twice in the header"});
  raw("w.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
      20);
  expect_user_error(run(args), {w + ": tensor 'b': data_offsets [12, 20) leave a gap of 4 bytes"});
  raw("w.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12);
  expect_user_error(run(args), {w + ": the tensors cover 8 bytes of the 12-byte data section"});
}

}  // namespace
}  // namespace cocodiff::test
