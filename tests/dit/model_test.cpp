// Model configs, presets, tensor shapes of the full-size models, seeded weights.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numbers>

#include "core/errors.hpp"
#include "core/hash.hpp"
#include "dit/local_comm.hpp"
#include "dit/model.hpp"
#include "dit/model_family.hpp"
#include "dit/normal_fill.hpp"
#include "dit/pipeline.hpp"

namespace cocodiff::dit {
namespace {

std::int64_t params(const std::string& preset) {
  const ModelConfig cfg = load_model_preset(preset);
  std::int64_t n = 0;
  for (const TensorSpec& s : make_model(cfg)->tensor_specs()) n += s.numel();
  return n;
}

TEST(ModelConfig, FullSizeParameterCountsMatchPublishedSizes) {
  // DiT-XL/2: 675,129,632 parameters as train.py logs them, which includes the fixed
  // pos_embed parameter (256 tokens x 1152) that we compute instead of storing.
  EXPECT_EQ(params("dit-xl-2") + 256 * 1152, 675129632);
  // FLUX.1-dev transformer: 11,901,408,320 (diffusers FluxTransformer2DModel.num_parameters()).
  EXPECT_EQ(params("flux1-dev"), 11901408320);
  // SD3.5 Large: 8.1B; SD3.5 Medium: 2.5B (Stability AI model cards). Those counts include
  // PatchEmbed's persistent sin-cos buffer (max^2 x hidden), which we compute instead.
  EXPECT_NEAR(static_cast<double>(params("sd35-large") + 192 * 192 * 2432), 8.1e9, 0.1e9);
  EXPECT_NEAR(static_cast<double>(params("sd35-medium") + 384 * 384 * 1536), 2.5e9, 0.05e9);
  // Qwen-Image: 20B MMDiT.
  EXPECT_NEAR(static_cast<double>(params("qwen-image")), 20.4e9, 0.3e9);
  // FLUX.2-dev: 32B (Black Forest Labs model card).
  EXPECT_NEAR(static_cast<double>(params("flux2-dev")), 32.0e9, 0.3e9);
}

TEST(ModelConfig, UpstreamTensorNamesAndShapes) {
  auto shape_of = [](const std::string& preset, const std::string& name) {
    for (const TensorSpec& s : make_model(load_model_preset(preset))->tensor_specs())
      if (s.name == name) return s.shape;
    return std::vector<std::int64_t>{};
  };
  using V = std::vector<std::int64_t>;
  EXPECT_EQ(shape_of("dit-xl-2", "x_embedder.proj.weight"), (V{1152, 4, 2, 2}));
  EXPECT_EQ(shape_of("dit-xl-2", "blocks.27.attn.qkv.weight"), (V{3456, 1152}));
  EXPECT_EQ(shape_of("dit-xl-2", "blocks.0.adaLN_modulation.1.weight"), (V{6912, 1152}));
  EXPECT_EQ(shape_of("dit-xl-2", "final_layer.linear.weight"), (V{32, 1152}));
  EXPECT_EQ(shape_of("dit-xl-2", "y_embedder.embedding_table.weight"), (V{1001, 1152}));
  EXPECT_EQ(shape_of("flux1-dev", "x_embedder.weight"), (V{3072, 64}));
  EXPECT_EQ(shape_of("flux1-dev", "context_embedder.weight"), (V{3072, 4096}));
  EXPECT_EQ(shape_of("flux1-dev", "transformer_blocks.18.attn.to_q.weight"), (V{3072, 3072}));
  EXPECT_EQ(shape_of("flux1-dev", "transformer_blocks.0.attn.norm_added_k.weight"), (V{128}));
  EXPECT_EQ(shape_of("flux1-dev", "single_transformer_blocks.37.proj_mlp.weight"),
            (V{12288, 3072}));
  EXPECT_EQ(shape_of("flux1-dev", "single_transformer_blocks.0.proj_out.weight"), (V{3072, 15360}));
  EXPECT_EQ(shape_of("flux1-dev", "time_text_embed.guidance_embedder.linear_1.weight"),
            (V{3072, 256}));
  EXPECT_EQ(shape_of("flux1-dev", "time_text_embed.text_embedder.linear_1.weight"), (V{3072, 768}));
  EXPECT_EQ(shape_of("sd35-medium", "transformer_blocks.12.norm1.linear.weight"),
            (V{9 * 1536, 1536}));
  EXPECT_EQ(shape_of("sd35-medium", "transformer_blocks.13.norm1.linear.weight"),
            (V{6 * 1536, 1536}));
  EXPECT_EQ(shape_of("sd35-large", "transformer_blocks.37.norm1_context.linear.weight"),
            (V{2 * 2432, 2432}));
  EXPECT_TRUE(shape_of("sd35-large", "transformer_blocks.37.attn.to_add_out.weight").empty());
  EXPECT_EQ(shape_of("qwen-image", "transformer_blocks.59.img_mod.1.weight"), (V{18432, 3072}));
  EXPECT_EQ(shape_of("qwen-image", "txt_norm.weight"), (V{3584}));
  // FLUX.2: shared modulation, SwiGLU (2 x 3 x 6144), fused single-block projections, no bias.
  EXPECT_EQ(shape_of("flux2-dev", "x_embedder.weight"), (V{6144, 128}));
  EXPECT_TRUE(shape_of("flux2-dev", "x_embedder.bias").empty());
  EXPECT_EQ(shape_of("flux2-dev", "context_embedder.weight"), (V{6144, 15360}));
  EXPECT_EQ(shape_of("flux2-dev", "double_stream_modulation_img.linear.weight"),
            (V{6 * 6144, 6144}));
  EXPECT_EQ(shape_of("flux2-dev", "single_stream_modulation.linear.weight"), (V{3 * 6144, 6144}));
  EXPECT_TRUE(shape_of("flux2-dev", "transformer_blocks.0.norm1.linear.weight").empty());
  EXPECT_EQ(shape_of("flux2-dev", "transformer_blocks.7.ff.linear_in.weight"), (V{36864, 6144}));
  EXPECT_EQ(shape_of("flux2-dev", "transformer_blocks.7.ff_context.linear_out.weight"),
            (V{6144, 18432}));
  EXPECT_EQ(shape_of("flux2-dev", "single_transformer_blocks.47.attn.to_qkv_mlp_proj.weight"),
            (V{3 * 6144 + 2 * 18432, 6144}));
  EXPECT_EQ(shape_of("flux2-dev", "single_transformer_blocks.0.attn.to_out.weight"),
            (V{6144, 6144 + 18432}));
  EXPECT_EQ(shape_of("flux2-dev", "time_guidance_embed.guidance_embedder.linear_1.weight"),
            (V{6144, 256}));
}

TEST(ModelConfig, Flux2NeedsFourRopeAxesAndTheGuidanceEmbedding) {
  Config axes =
      Config::parse("[model]\npreset = \"flux2-tiny\"\nrope_axes = [4, 6, 6]\n", "r.toml");
  try {
    load_model_config(axes);
    FAIL() << "3 RoPE axes accepted for flux2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.rope_axes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 RoPE axis widths"), std::string::npos) << e.what();
  }
  Config guidance =
      Config::parse("[model]\npreset = \"flux2-tiny\"\nguidance_embed = false\n", "r.toml");
  EXPECT_THROW(load_model_config(guidance), ConfigError);
}

TEST(ModelConfig, RunConfigOverridesPresetAndErrorsNameFileLineKey) {
  Config cfg = Config::parse("[model]\npreset = \"flux1-tiny\"\ndouble_blocks = 1\n", "run.toml");
  cfg.set("model.single_blocks=3");
  const ModelConfig m = load_model_config(cfg);
  EXPECT_EQ(m.name, "flux1-tiny");
  EXPECT_EQ(m.double_blocks, 1);  // run config wins over the preset's 2
  EXPECT_EQ(m.single_blocks, 3);  // --set wins
  EXPECT_EQ(m.heads, 24);         // from the preset
  EXPECT_TRUE(cfg.unknown_keys().empty());

  Config bad = Config::parse("[model]\npreset = \"flux1-tiny\"\nheads = 0\n", "run.toml");
  try {
    load_model_config(bad);
    FAIL() << "heads = 0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("run.toml:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.heads"), std::string::npos) << e.what();
  }
  Config axes =
      Config::parse("[model]\npreset = \"flux1-tiny\"\nrope_axes = [4, 4, 4]\n", "r.toml");
  EXPECT_THROW(load_model_config(axes), ConfigError);  // sums to 12, head_dim is 16
  Config missing = Config::parse("[model]\npreset = \"no-such-model\"\n", "r.toml");
  try {
    load_model_config(missing);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-model"), std::string::npos);
  }
  // Neither a preset nor a custom model: the message says what is missing and lists presets.
  Config neither = Config::parse("[run]\nsteps = 2\n[model]\nheads = 4\n", "r.toml");
  try {
    load_model_config(neither);
    FAIL();
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("r.toml:3: key 'model.preset': expected a model preset (", 0), 0u) << what;
    EXPECT_NE(what.find("flux1-tiny"), std::string::npos) << what;
    EXPECT_NE(what.find("found a [model] table with neither"), std::string::npos) << what;
  }
  // A preset value that is wrong is reported at the preset file's line.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "cocodiff_models";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "broken.toml") << "family = \"flux\"\nheads = 24\nhead_dim = 7\n";
  try {
    load_model_preset("broken", dir);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.toml:3"), std::string::npos) << e.what();
  }
}

TEST(ModelFamily, TheBuiltInsAreRegisteredAndAUsersFamilyLoadsAsTheyDo) {
  EXPECT_EQ(model_family_names(),
            (std::vector<std::string>{"dit", "sd3", "flux", "flux2", "qwen-image", "wan"}));
  EXPECT_FALSE(model_family("dit").text_conditioned);
  EXPECT_EQ(find_model_family("nope"), nullptr);
  // A user's family, registered as a built-in is: FLUX.1's blocks, its own defaults and check.
  static std::once_flag once;
  std::call_once(once, [] {
    ModelFamily f = model_family("flux");
    f.name = "test-flux-variant";
    f.default_pooled_dim = 32;
    f.check = [](const ModelConfig& m) -> std::optional<ModelConfigProblem> {
      if (m.double_blocks <= 4) return std::nullopt;
      return ModelConfigProblem{"double_blocks", "at most 4 for this family",
                                std::to_string(m.double_blocks)};
    };
    register_model_family(std::move(f));
  });
  Config cfg = Config::parse("[model]\npreset = \"flux1-tiny\"\n", "run.toml");
  const ModelConfig flux = load_model_config(cfg);
  Config mine_cfg = Config::parse("[model]\npreset = \"flux1-tiny\"\n", "run.toml");
  mine_cfg.set("model.family=\"test-flux-variant\"");
  const ModelConfig mine = load_model_config(mine_cfg);
  EXPECT_EQ(mine.family, "test-flux-variant");
  const auto names = [](const ModelConfig& m) {
    std::vector<std::string> out;
    for (const TensorSpec& t : make_model(m)->tensor_specs()) out.push_back(t.name);
    return out;
  };
  EXPECT_EQ(names(mine), names(flux));
  mine_cfg.set("model.double_blocks=5");
  try {
    load_model_config(mine_cfg);
    FAIL() << "the family's own check did not run";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.double_blocks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at most 4"), std::string::npos) << e.what();
  }
  // Taken names and unknown families are errors that name them.
  EXPECT_THROW(register_model_family(model_family("flux")), ConfigError);
  Config unknown = Config::parse("[model]\npreset = \"flux1-tiny\"\nfamily = \"sd4\"\n", "r.toml");
  try {
    load_model_config(unknown);
    FAIL() << "an unknown family was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("r.toml:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen-image"), std::string::npos) << e.what();
  }
}

TEST(Weights, ValuesDependOnSeedAndNameOnly) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  std::vector<TensorSpec> specs = make_model(cfg)->tensor_specs();
  const auto a = init_weights(specs, 7, false);
  std::reverse(specs.begin(), specs.end());
  const auto b = init_weights(specs, 7, false);
  const auto c = init_weights(specs, 8, false);
  for (const std::string& n : a->names()) {
    ASSERT_EQ((a->get(n).mat() - b->get(n).mat()).norm(), 0.0f) << n;
  }
  EXPECT_GT((a->get("x_embedder.weight").mat() - c->get("x_embedder.weight").mat()).norm(), 1.0f);
  // Linear weights ~ N(0, 1/fan_in).
  const Mat& w = a->get("single_transformer_blocks.0.proj_out.weight").mat();
  const double var = w.squaredNorm() / static_cast<double>(w.size());
  EXPECT_NEAR(var * static_cast<double>(w.cols()), 1.0, 0.05);
  // Phantom weights allocate nothing but keep shapes.
  const auto p = make_weights(load_model_preset("flux1-dev"), 7, true);
  EXPECT_TRUE(p->get("x_embedder.weight").phantom());
  EXPECT_EQ(p->get("x_embedder.weight").cols(), 64);
  EXPECT_TRUE(p->get("x_embedder.weight").data().empty());
}

// The float weight generator is a normal distribution: moments and mass within 1 and 2
// standard deviations, on 2^21 values.
TEST(Weights, FloatGeneratorIsNormal) {
  std::vector<float> z(std::size_t{1} << 21);
  seeded_weight_normals(11, "stats", 1.0f, z);
  double sum = 0, sq = 0, quad = 0;
  std::size_t in1 = 0, in2 = 0;
  float largest = 0;
  for (float v : z) {
    sum += v;
    sq += static_cast<double>(v) * v;
    quad += std::pow(static_cast<double>(v), 4);
    in1 += std::abs(v) < 1.0f;
    in2 += std::abs(v) < 2.0f;
    largest = std::max(largest, std::abs(v));
  }
  const double n = static_cast<double>(z.size());
  EXPECT_NEAR(sum / n, 0.0, 0.003);
  EXPECT_NEAR(sq / n, 1.0, 0.004);
  EXPECT_NEAR(quad / n, 3.0, 0.03);  // kurtosis of a normal
  EXPECT_NEAR(static_cast<double>(in1) / n, 0.682689, 0.0015);
  EXPECT_NEAR(static_cast<double>(in2) / n, 0.954500, 0.0008);
  EXPECT_LE(largest, 5.7683f);  // sqrt(48 ln 2): u1 >= 2^-24
}

// Its polynomial logarithm, sine and cosine agree with double-precision Box-Muller on the same
// 24-bit uniforms to within float rounding.
TEST(Weights, FloatGeneratorMatchesDoubleBoxMuller) {
  const std::uint64_t key = 0x0123456789abcdefull;
  const std::int64_t pairs = 200'000;
  std::vector<float> z(2 * static_cast<std::size_t>(pairs));
  fill_normal_pairs(z.data(), key, 0, pairs, 1.0f);
  double worst = 0;
  for (std::int64_t k = 0; k < pairs; ++k) {
    const std::uint64_t x = splitmix64(key + static_cast<std::uint64_t>(k));
    const double u1 = static_cast<double>((x >> 40) + 1) * 0x1p-24;
    const double u2 = static_cast<double>((x >> 16) & 0xFFFFFF) * 0x1p-24;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 2.0 * std::numbers::pi * u2;
    const auto i = 2 * static_cast<std::size_t>(k);
    worst =
        std::max({worst, std::abs(z[i] - r * std::cos(t)), std::abs(z[i + 1] - r * std::sin(t))});
  }
  EXPECT_LT(worst, 4e-6);
}

// The generator's values are pinned: a change of them is a change of every seeded model.
TEST(Weights, SeededValuesArePinnedByChecksum) {
  // Element i is the same whatever the length (odd lengths take the last pair's first value).
  std::vector<float> five(5), six(6);
  seeded_weight_normals(42, "pin", 0.5f, five);
  seeded_weight_normals(42, "pin", 0.5f, six);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(five[static_cast<std::size_t>(i)], six[static_cast<std::size_t>(i)]);
  std::vector<std::uint32_t> bits;
  for (float v : six) bits.push_back(std::bit_cast<std::uint32_t>(v));
  EXPECT_EQ(bits, (std::vector<std::uint32_t>{3199238704u, 3180588343u, 3199962380u, 3205295221u,
                                              3212651195u, 3202094902u}));
  // Every value of flux1-tiny's weights at seed 42, in name order.
  const auto w = make_weights(load_model_preset("flux1-tiny"), 42, false);
  Sha256 digest;
  for (const std::string& name : w->names()) {
    const Mat& m = w->get(name).mat();
    digest.update(
        std::as_bytes(std::span<const float>(m.data(), static_cast<std::size_t>(m.size()))));
  }
  EXPECT_EQ(digest.hex(), "7a51ce87f3b649170ccd39216f6d596d69c575fbdae3e96f0d6ce5a04f782281");
}

TEST(Pipeline, SerialRunIsDeterministicAndFinite) {
  const ModelConfig cfg = load_model_preset("flux1-tiny");
  const auto w = make_weights(cfg, 1, false);
  RunSettings st;
  st.resolution = 64;
  st.steps = 2;
  st.seed = 3;
  st.strategy = "serial";
  LocalComm c1, c2;
  const RunOutput a = generate(c1, cfg, *w, st);
  const RunOutput b = generate(c2, cfg, *w, st);
  ASSERT_EQ(a.latent.rows(), 16);
  ASSERT_EQ(a.latent.cols(), 8 * 8);
  EXPECT_TRUE(a.latent.mat().allFinite());
  EXPECT_EQ((a.latent.mat() - b.latent.mat()).norm(), 0.0f);
  EXPECT_EQ(a.forwards, 2);
  st.seed = 4;
  LocalComm c3;
  const RunOutput d = generate(c3, cfg, *w, st);
  EXPECT_GT((a.latent.mat() - d.latent.mat()).norm(), 1e-3f);
  EXPECT_THROW(
      {
        RunSettings bad = st;
        bad.resolution = 60;
        LocalComm c4;
        generate(c4, cfg, *w, bad);
      },
      ConfigError);
}

}  // namespace
}  // namespace cocodiff::dit
