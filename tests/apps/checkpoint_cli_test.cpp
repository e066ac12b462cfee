// Bad checkpoints given to `cocodiff run` (run.weights, run.initial_latent): exit 2 with a message
// naming the file and the tensor, no crash, no output files.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "core/tensor.hpp"
#include "dit/model_config.hpp"
#include "dit/pipeline.hpp"
#include "dit/safetensors.hpp"
#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

class CheckpointCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cocodiff_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // A raw safetensors file: 8-byte length, header, `data_bytes` zero bytes.
  fs::path raw(const std::string& name, const std::string& header, std::size_t data_bytes) {
    const fs::path p = dir_ / name;
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header << std::string(data_bytes, '\0');
    return p;
  }

  // Runs flux1-tiny with real math and `key` = `file`; expects exit 2 naming the config file,
  // the key's line, the key, the file and every piece, and `validate` to refuse it the same way.
  void expect_rejected(const std::string& key, const fs::path& file,
                       const std::vector<std::string>& pieces) {
    const fs::path cfg = dir_ / "run.toml";
    std::ofstream(cfg) << "[model]\npreset = \"flux1-tiny\"\n[run]\nresolution = 64\nsteps = 1\n"
                       << "math = \"real\"\n"
                       << key.substr(4) << " = \"" << file.filename().string() << "\"\n"
                       << "[cluster]\npreset = \"uniform\"\nnodes = 1\n[emulator]\nworkers = 1\n";
    const fs::path out = dir_ / "out";
    const ChildResult r =
        run_cocodiff({"run", cfg.string(), "--out", out.string(), "-q"}, dir_ / "log");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("cocodiff: error: " + cfg.string() + ":7: key '" + key + "': ", 0), 0u)
        << r.err;
    EXPECT_NE(r.err.find(file.string()), std::string::npos) << r.err;
    for (const std::string& p : pieces) EXPECT_NE(r.err.find(p), std::string::npos) << p;
    EXPECT_FALSE(fs::exists(out) && !fs::is_empty(out)) << "outputs left in " << out;
    const ChildResult v = run_cocodiff({"validate", cfg.string()}, dir_ / "vlog");
    EXPECT_EQ(v.exit_code, 2) << v.out;
    EXPECT_EQ(v.err, r.err);
  }

  fs::path dir_;
};

TEST_F(CheckpointCli, TruncatedWeights) {
  // A tensor whose bytes are cut off: the header promises 64 bytes, the file holds 40.
  expect_rejected(
      "run.weights",
      raw("w.safetensors",
          R"({"x_embedder.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}})", 40),
      {"tensor 'x_embedder.weight': data_offsets [0, 64) outside the 40-byte data "
       "section (truncated file?)"});
}

TEST_F(CheckpointCli, HeaderClaimingATerabyteTensorFailsBeforeAllocating) {
  expect_rejected(
      "run.weights",
      raw("w.safetensors",
          R"({"x":{"dtype":"F32","shape":[262144,1048576],"data_offsets":[0,1099511627776]}})", 16),
      {"tensor 'x': shape larger than the file"});
  expect_rejected("run.weights", raw("h.safetensors", "", 0), {"header is not valid JSON"});
}

TEST_F(CheckpointCli, WrongDtype) {
  expect_rejected(
      "run.weights",
      raw("w.safetensors", R"({"x":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4),
      {"tensor 'x': unsupported dtype I8 (expected F32, F16 or BF16)"});
}

TEST_F(CheckpointCli, MissingTensorNamesTheExpectedShape) {
  Mat m = Mat::Zero(1, 4);
  const Tensor t = Tensor::from(m);
  const fs::path p = dir_ / "w.safetensors";
  dit::write_safetensors(p, {{"unrelated", {4}, &t}});
  expect_rejected(
      "run.weights", p,
      {"missing and 0 mis-shaped tensor(s); missing: '", "`cocodiff weights flux1-tiny`"});
}

TEST_F(CheckpointCli, InitialLatentWithoutTheLatentTensor) {
  Mat m = Mat::Zero(1, 4);
  const Tensor t = Tensor::from(m);
  const fs::path p = dir_ / "latent.safetensors";
  dit::write_safetensors(p, {{"not_latent", {4}, &t}});
  expect_rejected("run.initial_latent", p, {"without a tensor \"latent\""});
}

TEST_F(CheckpointCli, InitialLatentOfTheWrongShape) {
  Mat m = Mat::Zero(2, 16);
  const Tensor t = Tensor::from(m);
  const fs::path p = dir_ / "latent.safetensors";
  dit::write_safetensors(p, {{"latent", {2, 4, 4}, &t}});
  expect_rejected(
      "run.initial_latent", p,
      {"whose \"latent\" has shape [2, 4, 4]", "tensor \"latent\" has shape [", "of flux1-tiny"});
}

// run.save_latent writes the final latent; run.initial_latent starts a run from a saved one.
TEST_F(CheckpointCli, SavedLatentStartsAnotherRun) {
  const fs::path cfg = dir_ / "run.toml";
  const std::string base =
      "[model]\npreset = \"flux1-tiny\"\n[run]\nresolution = 64\nsteps = 1\nmath = \"real\"\n";
  const std::string cluster =
      "[cluster]\npreset = \"uniform\"\nnodes = 1\n[emulator]\nworkers = 1\n";
  std::ofstream(cfg) << base << "save_latent = true\n" << cluster;
  const ChildResult a =
      run_cocodiff({"run", cfg.string(), "--out", (dir_ / "a").string(), "-q"}, dir_ / "log");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_TRUE(fs::exists(dir_ / "a" / "latent.safetensors"));
  fs::copy_file(dir_ / "a" / "latent.safetensors", dir_ / "start.safetensors");
  const fs::path cfg2 = dir_ / "run2.toml";
  std::ofstream(cfg2) << base << "initial_latent = \"start.safetensors\"\n" << cluster;
  const ChildResult b =
      run_cocodiff({"run", cfg2.string(), "--out", (dir_ / "b").string(), "-q"}, dir_ / "log");
  EXPECT_EQ(b.exit_code, 0) << b.err;
  const std::string ra = read_text(dir_ / "a" / "report.json"),
                    rb = read_text(dir_ / "b" / "report.json");
  // A different start gives a different result.
  const auto sha = [](const std::string& r) {
    const size_t i = r.find("\"output_sha256\"");
    return i == std::string::npos ? std::string() : r.substr(i, 84);
  };
  EXPECT_FALSE(sha(ra).empty());
  EXPECT_NE(sha(ra), sha(rb));
}

// A file that is not there: the error names both places looked (beside the config, then the
// presets' directory).
TEST_F(CheckpointCli, MissingWeightsFile) {
  expect_rejected("run.weights", dir_ / "nope.safetensors",
                  {"no such file (looked for " + (dir_ / "nope.safetensors").string() + " and ",
                   "configs/nope.safetensors; a path in a config is relative to its file, then "
                   "to the presets' directory)"});
}

// `weights --check` on a flux1-tiny checkpoint missing three tensors names all three at once,
// with their expected shapes, also reports an extra one, and exits 2; the complete checkpoint
// passes. `weights MODEL` lists every expected tensor.
TEST_F(CheckpointCli, WeightsCheckNamesEveryMissingTensor) {
  const dit::ModelConfig cfg = dit::load_model_preset("flux1-tiny");
  const auto w = dit::make_weights(cfg, 3, false);
  const std::vector<std::string> names = w->names();
  ASSERT_GT(names.size(), 10u);
  const std::vector<std::string> dropped = {names[1], names[names.size() / 2], names.back()};
  std::vector<dit::SafetensorsTensor> ts;
  for (const std::string& n : names)
    if (std::find(dropped.begin(), dropped.end(), n) == dropped.end())
      ts.push_back({n, w->spec(n).shape, &w->get(n)});
  const Tensor stray = Tensor::from(Mat::Zero(1, 2));
  ts.push_back({"not_a_flux_tensor", {2}, &stray});
  const fs::path p = dir_ / "partial.safetensors";
  dit::write_safetensors(p, ts);

  const ChildResult r =
      run_cocodiff({"weights", "flux1-tiny", "--check", p.string()}, dir_ / "log");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  for (const std::string& n : dropped)
    EXPECT_NE(r.out.find("missing tensor '" + n + "' (expected shape " + w->spec(n).shape_str()),
              std::string::npos)
        << n << "\n"
        << r.out;
  EXPECT_NE(r.out.find("extra tensor 'not_a_flux_tensor'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 missing, 0 mis-shaped, 0 with bad values, 1 extra"), std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("3 missing, 0 mis-shaped and 0 tensor(s) with values"), std::string::npos)
      << r.err;

  const fs::path full = dir_ / "full.safetensors";
  dit::write_safetensors(full, *w);
  const ChildResult ok =
      run_cocodiff({"weights", "flux1-tiny", "--check", full.string()}, dir_ / "log2");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;

  const ChildResult list = run_cocodiff({"weights", "flux1-tiny"}, dir_ / "log3");
  EXPECT_EQ(list.exit_code, 0) << list.err;
  for (const std::string& n : names)
    EXPECT_NE(list.out.find("  " + n + " "), std::string::npos) << n;
}

// `weights --check` reads the values as `run` does: a NaN and an infinity are named with their
// tensors and element, and the check exits 2, as the run would.
TEST_F(CheckpointCli, WeightsCheckRefusesNonFiniteValues) {
  const dit::ModelConfig cfg = dit::load_model_preset("flux1-tiny");
  const auto w = dit::make_weights(cfg, 3, false);
  const std::vector<std::string> names = w->names();
  std::vector<Tensor> copies;
  copies.reserve(names.size());
  std::vector<dit::SafetensorsTensor> ts;
  for (const std::string& n : names) copies.push_back(w->get(n));
  copies[2].mat()(0, 0) = std::numeric_limits<float>::quiet_NaN();
  copies[5].mat()(0, 1) = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < names.size(); ++i)
    ts.push_back({names[i], w->spec(names[i]).shape, &copies[i]});
  const fs::path p = dir_ / "nan.safetensors";
  dit::write_safetensors(p, ts);
  const ChildResult r = run_cocodiff({"weights", "flux1-tiny", "--check", p.string()}, dir_ / "l");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.out.find("tensor '" + names[2] + "': element 0 is NaN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tensor '" + names[5] + "': element 1 is infinite"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("0 missing, 0 mis-shaped, 2 with bad values"), std::string::npos) << r.out;
  expect_rejected("run.weights", p, {"element 0 is NaN"});
}

}  // namespace
}  // namespace cocodiff::test
