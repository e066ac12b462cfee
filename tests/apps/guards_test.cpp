// Values that used to crash, hang or pass silently: implausible physical quantities, floats where
// an integer is required, configs that are not regular files, non-finite or empty tensor inputs,
// and safetensors files whose tensors overlap or share a name. Each exits 2 with one message
// naming the key, file or tensor, and leaves no output behind.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
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

  /// flux1-tiny weights, with every tensor whose name starts with `huge_prefix` set to 3e38
  /// (finite, but no product of them is).
  fs::path weights_with_huge(const std::string& huge_prefix) {
    const dit::ModelConfig mc =
        dit::load_model_preset("flux1-tiny", fs::path(COCODIFF_SOURCE_DIR) / "configs" / "models");
    const auto w = dit::make_weights(mc, 5, false);
    std::vector<Tensor> copies;
    std::vector<dit::SafetensorsTensor> ts;
    const std::vector<std::string> names = w->names();
    copies.reserve(names.size());
    for (const std::string& n : names) {
      copies.push_back(Tensor::from(Mat(w->get(n).mat())));
      if (n.rfind(huge_prefix, 0) == 0) copies.back().mat().setConstant(3e38f);
    }
    for (size_t i = 0; i < names.size(); ++i)
      ts.push_back({names[i], w->spec(names[i]).shape, &copies[i]});
    const fs::path p = dir_ / "huge.safetensors";
    dit::write_safetensors(p, ts);
    return p;
  }

  /// A real-math flux1-tiny run config in dir_ with `extra` lines under [run].
  fs::path tiny_config(const std::string& extra) {
    const fs::path p = dir_ / "run.toml";
    std::ofstream(p) << "[model]\npreset = \"flux1-tiny\"\n[run]\nresolution = 64\nsteps = 1\n"
                     << "math = \"real\"\n"
                     << extra << "\n[cluster]\npreset = \"uniform\"\nnodes = 1\n"
                     << "[emulator]\nworkers = 1\n";
    return p;
  }

  /// A flux1-fmnist inpainting config in dir_ (28 x 28 pixels, phantom) with `extra` lines
  /// under [run]; the known picture is the test sneaker unless `extra` names another.
  fs::path inpaint_config(const std::string& extra) {
    const fs::path p = dir_ / "inpaint.toml";
    const fs::path sneaker =
        fs::path(COCODIFF_SOURCE_DIR) / "tests" / "e2e" / "data" / "fmnist_test_sneaker.png";
    std::ofstream(p) << "[model]\npreset = \"flux1-fmnist\"\n[run]\nresolution = 28\nsteps = 1\n"
                     << "math = \"skip\"\n"
                     << (extra.find("inpaint_image") == std::string::npos
                             ? "inpaint_image = \"" + sneaker.string() + "\"\n"
                             : std::string())
                     << extra << "\n[cluster]\npreset = \"uniform\"\nnodes = 1\n";
    return p;
  }

  fs::path dir_, out_;
};

// A PNG of a few dozen bytes whose header claims width x height pixels (RGB, 8 bits).
std::string png_claiming(std::uint32_t width, std::uint32_t height) {
  const auto crc32 = [](const std::string& bytes) {
    std::uint32_t c = 0xffffffffu;
    for (const char ch : bytes) {
      c ^= static_cast<std::uint8_t>(ch);
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
  };
  const auto be32 = [](std::uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  const auto chunk = [&](const std::string& type, const std::string& data) {
    return be32(static_cast<std::uint32_t>(data.size())) + type + data + be32(crc32(type + data));
  };
  const std::string ihdr = be32(width) + be32(height) + std::string("\x08\x02\x00\x00\x00", 5);
  const std::string idat("\x78\x9c\x63\x00\x00\x00\x01\x00\x01", 9);  // a zlib stream
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", idat) +
         chunk("IEND", "");
}

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

// A DiT input's class label indexes the class table (num_classes rows, then the null class):
// out of range, negative or fractional, it is refused by name instead of aborting.
TEST_F(Guards, ForwardRefusesAClassLabelOutOfRange) {
  const dit::ModelConfig mc =
      dit::load_model_preset("dit-xl-2-tiny", fs::path(COCODIFF_SOURCE_DIR) / "configs" / "models");
  ASSERT_EQ(mc.num_classes, 10);
  dit::write_safetensors(dir_ / "w.safetensors", *dit::make_weights(mc, 6, false));
  Tensor latent = Tensor::zeros(mc.latent_channels, 8 * 8, false);
  Tensor sigma = Tensor::from(Mat::Constant(1, 1, 0.5f));
  const std::string in = (dir_ / "in.safetensors").string();
  const auto forward_with = [&](float label) {
    Tensor l = Tensor::from(Mat::Constant(1, 1, label));
    dit::write_safetensors(in, {{"latent", {mc.latent_channels, 8, 8}, &latent},
                                {"sigma", {1}, &sigma},
                                {"class_label", {1}, &l}});
    out_ = dir_ / "out.safetensors";
    return run({"forward", "--model", "dit-xl-2-tiny", "--weights",
                (dir_ / "w.safetensors").string(), "--input", in, "--output", out_.string()});
  };
  for (const auto& [label, shown] : std::vector<std::pair<float, std::string>>{
           {11.0f, "11"}, {-1.0f, "-1"}, {1e9f, "1e+09"}, {2.5f, "2.5"}})
    expect_user_error(forward_with(label),
                      {in +
                       ": tensor 'class_label' must be a class index, an integer in [0, 9] "
                       "or 10 (the null class) for dit-xl-2-tiny; found " +
                       shown});
  EXPECT_EQ(forward_with(10.0f).exit_code, 0);  // the null class
  EXPECT_EQ(forward_with(9.0f).exit_code, 0);
}

// An empty path is refused by its key, also for a config named without a directory (whose
// directory is then empty), instead of an internal error from the file system.
TEST_F(Guards, AnEmptyPathIsRefusedByItsKey) {
  std::string text = read_text(kData / "good.toml");
  text.insert(text.find("seed = 1"), "weights = \"\"\n");
  std::ofstream(dir_ / "emptyw.toml") << text;
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  const ChildResult r = run({"run", "emptyw.toml", "--out", out_.string(), "-q"});
  const ChildResult v = run({"validate", "emptyw.toml"});
  const ChildResult s = run({"validate", "emptyw.toml", "--set", "run.weights=x.safetensors",
                             "--set", "run.initial_latent=\"\""});
  fs::current_path(cwd);
  expect_user_error(r, {"emptyw.toml:",
                        "key 'run.weights': expected a file path, found an empty "
                        "string"});
  expect_user_error(v, {"key 'run.weights': expected a file path, found an empty string"});
  expect_user_error(s, {"--set run.initial_latent", "expected a file path, found an empty string"});
}

// Inpainting rectangles are compared without sums, so coordinates near INT64_MAX cannot wrap
// into an accepted, empty region.
TEST_F(Guards, InpaintRectanglesNearInt64MaxAreRefused) {
  for (const std::string rect :
       {"[9223372036854775807, 0, 2, 1]", "[0, 9223372036854775807, 1, 2]",
        "[1, 0, 9223372036854775807, 1]", "[0, 1, 1, 9223372036854775807]"}) {
    const fs::path cfg = inpaint_config("inpaint_rect = " + rect);
    expect_user_error(run({"validate", cfg.string()}),
                      {"key 'run.inpaint_rect': expected [x, y, width, height] inside the 28 x 28 "
                       "image, found " +
                       rect});
    expect_user_error(run({"run", cfg.string(), "--out", out_.string(), "-q"}),
                      {"key 'run.inpaint_rect'"});
  }
  EXPECT_EQ(run({"validate", inpaint_config("inpaint_rect = [27, 27, 1, 1]").string()}).exit_code,
            0);
}

// A PNG's declared size is checked before its pixels are allocated: a 70-byte file claiming
// 30000 x 30000 pixels is refused at once, as the known picture and as the mask.
TEST_F(Guards, APngIsRefusedByItsDeclaredSizeBeforeDecoding) {
  std::ofstream(dir_ / "big.png", std::ios::binary) << png_claiming(30000, 30000);
  ASSERT_LT(fs::file_size(dir_ / "big.png"), 100u);
  const std::string big = (dir_ / "big.png").string();
  const auto t0 = std::chrono::steady_clock::now();
  expect_user_error(
      run({"validate",
           inpaint_config("inpaint_image = \"big.png\"\ninpaint_rect = [1, 1, 2, 2]").string()}),
      {"key 'run.inpaint_image'", big + ": a PNG of 30000 x 30000 pixels, expected 28 x 28"});
  expect_user_error(run({"validate", inpaint_config("inpaint_mask = \"big.png\"").string()}),
                    {"key 'run.inpaint_mask'", big + ": a PNG of 30000 x 30000 pixels"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// A real-math run whose values stop being finite (weights of 3e38 in one block, or such an
// initial latent) fails naming the first layer that produced them, and writes nothing.
TEST_F(Guards, ANonFiniteRunFailsNamingTheFirstLayer) {
  weights_with_huge("transformer_blocks.1.");
  expect_user_error(
      run({"run", tiny_config("weights = \"huge.safetensors\"").string(), "--out", out_.string(),
           "-q"}),
      {"step 0 of 1: non-finite values (NaN or infinity) first appear in the output of "
       "transformer_blocks.1 ("});
  weights_with_huge("single_transformer_blocks.0.");
  expect_user_error(run({"run", tiny_config("weights = \"huge.safetensors\"").string(), "--out",
                         out_.string(), "-q", "--set", "run.strategy=tapa"}),
                    {"first appear in the output of single_transformer_blocks.0 ("});
  Tensor latent = Tensor::from(Mat::Constant(16, 8 * 8, 3e38f));
  dit::write_safetensors(dir_ / "latent.safetensors", {{"latent", {16, 8, 8}, &latent}});
  expect_user_error(run({"run", tiny_config("initial_latent = \"latent.safetensors\"").string(),
                         "--out", out_.string(), "-q"}),
                    {"first appear in the output of x_embedder ("});
}

// `forward` too: a velocity that is not finite is an error naming the layer, and no file.
TEST_F(Guards, ForwardRefusesANonFiniteOutput) {
  const fs::path w = weights_with_huge("transformer_blocks.0.");
  const dit::ModelConfig mc =
      dit::load_model_preset("flux1-tiny", fs::path(COCODIFF_SOURCE_DIR) / "configs" / "models");
  Tensor latent = Tensor::zeros(mc.latent_channels, 64, false);
  Tensor s = Tensor::from(Mat::Constant(1, 1, 0.5f));
  dit::TextConditioning tc = dit::make_text_conditioning(mc, 3, false, false);
  dit::write_safetensors(dir_ / "in.safetensors",
                         {{"latent", {mc.latent_channels, 8, 8}, &latent},
                          {"sigma", {1}, &s},
                          {"text", {tc.text.rows(), tc.text.cols()}, &tc.text},
                          {"pooled", {tc.pooled.rows(), tc.pooled.cols()}, &tc.pooled}});
  out_ = dir_ / "out.safetensors";
  expect_user_error(run({"forward", "--model", "flux1-tiny", "--weights", w.string(), "--input",
                         (dir_ / "in.safetensors").string(), "--output", out_.string()}),
                    {"non-finite values (NaN or infinity) first appear in the output of "
                     "transformer_blocks.0 ("});
}

// A quoted key holding a dot is one TOML key of that name: refused by name and line, beside a
// [run] table or alone, instead of being dropped in silence.
TEST_F(Guards, QuotedDottedKeysAreRefusedByName) {
  const std::string good = read_text(kData / "good.toml");
  std::ofstream(dir_ / "q1.toml") << "\"run.seed\" = -5\n" << good;
  expect_user_error(run({"validate", (dir_ / "q1.toml").string()}),
                    {(dir_ / "q1.toml").string() + ":1: quoted key \"run.seed\" holds a dot"});
  std::ofstream(dir_ / "q2.toml") << good << "\n[cluster.topology]\n\"a.b\" = 1\n";
  expect_user_error(run({"validate", (dir_ / "q2.toml").string()}),
                    {"quoted key \"a.b\" in [cluster.topology] holds a dot"});
  expect_set_refused("cluster={\"nodes.x\"=1}", {"quoted key \"nodes.x\" in [cluster]"});
}

// One --set is one key = value: a line break would let the rest be read as more keys.
TEST_F(Guards, ASetWithALineBreakIsRefused) {
  expect_set_refused("run.steps=1\nrun.seed=-7",
                     {"--set 'run.steps=1\\nrun.seed=-7': holds a line break; give one key=value "
                      "per --set"});
}

}  // namespace
}  // namespace cocodiff::test
