#include "runner/run_plan.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <thread>

#include "core/errors.hpp"
#include "dit/image.hpp"
#include "dit/model.hpp"
#include "dit/model_family.hpp"
#include "dit/parallel/pipefusion.hpp"
#include "dit/parallel/strategies.hpp"
#include "dit/safetensors.hpp"
#include "runner/measured_rates.hpp"
#include "runner/memory_estimate.hpp"

#ifndef COCODIFF_CONFIG_DIR
#define COCODIFF_CONFIG_DIR "configs"
#endif
#ifndef COCODIFF_INSTALL_CONFIG_DIR
#define COCODIFF_INSTALL_CONFIG_DIR COCODIFF_CONFIG_DIR
#endif

namespace cocodiff::apps {

namespace {

// A model conditioned on (motion, class) pairs (model.motions) takes run.motion, one of its
// motions (the first by default); the condition row is motion * classes + class.
void read_motion(const Config& cfg, RunPlan& plan) {
  const std::vector<std::string>& motions = plan.model.motions;
  if (motions.empty()) {
    if (cfg.has("run.motion"))
      throw ConfigError(cfg.where("run.motion"), "run.motion",
                        "no motion: " + plan.model.name + " is not conditioned on one",
                        cfg.require_string("run.motion"));
    return;
  }
  plan.motion = cfg.get_choice("run.motion", motions.front(), motions);
  const auto at = std::find(motions.begin(), motions.end(), plan.motion) - motions.begin();
  plan.settings.class_label += static_cast<int>(at) * plan.model.classes();
}

// Video frames: run.frames, or run.num_frames as xDiT spells it (not both). The model's VAE keeps
// the first frame and compresses the rest in time; an image model takes one frame.
void read_frames(const Config& cfg, const dit::ModelConfig& m, dit::RunSettings& s) {
  const bool xdit = cfg.has("run.num_frames");
  if (xdit && cfg.has("run.frames"))
    throw ConfigError(cfg.where("run.num_frames"), "run.num_frames",
                      "run.frames or run.num_frames (xDiT's name for it), not both", "both");
  const std::string key = xdit ? "run.num_frames" : "run.frames";
  s.frames = static_cast<int>(cfg.get_int(key, 1, 1, 1 << 16));
  const int ts = m.vae_temporal_scale;
  if ((s.frames - 1) % ts != 0)
    throw ConfigError(cfg.where(key), key,
                      "1 + a multiple of " + std::to_string(ts) + " (" + m.name +
                          "'s VAE keeps the first frame and compresses every " +
                          std::to_string(ts) + " after it into one latent frame)",
                      std::to_string(s.frames));
  if (m.latent_frames(s.frames) > 1 && !dit::model_family(m.family).video)
    throw ConfigError(cfg.where(key), key,
                      "1 for " + m.name + " (family " + m.family + " makes images, not video)",
                      std::to_string(s.frames));
}

}  // namespace

std::filesystem::path config_dir() {
  namespace fs = std::filesystem;
  const char* env = std::getenv("COCODIFF_CONFIG_DIR");
  if (env != nullptr && *env != 0) return fs::path(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path beside = exe.parent_path().parent_path() / "share" / "cocodiff" / "configs";
    if (fs::is_directory(beside / "models", ec)) return beside;
  }
  fs::path installed(COCODIFF_INSTALL_CONFIG_DIR);
  if (fs::is_directory(installed / "models", ec)) return installed;
  return fs::path(COCODIFF_CONFIG_DIR);
}

namespace {

// A key naming a file: a non-empty string, found beside the config file (or, from --set, in the
// working directory), then in the presets' directory (Config::require_path); `expected` says
// what the file is when neither has it.
std::filesystem::path file_key(const Config& cfg, const char* key, const std::string& expected) {
  const std::string v = cfg.require_string(key);
  if (v.empty()) throw ConfigError(cfg.where(key), key, "a file path", "an empty string");
  return cfg.require_path(key, config_dir(), expected);
}

// [pipeline], [v_major], [usp]: the strategies' settings (dit::StrategyOptions). Read whatever
// the strategy, so a key is checked (and never reported unknown) in every run.
void read_strategy_options(Config& cfg, dit::StrategyOptions& o) {
  o.uneven_heads = cfg.get_bool("ulysses.uneven_heads", o.uneven_heads);
  o.pipeline_chunks = static_cast<int>(cfg.get_int("pipeline.chunks", o.pipeline_chunks, 1, 1024));
  o.v_major_threshold = cfg.get_double("v_major.threshold", o.v_major_threshold, 0, 1e6);
  o.v_major_block_tokens =
      static_cast<int>(cfg.get_int("v_major.block_tokens", o.v_major_block_tokens, 1, 1 << 24));
  o.v_major_block_heads =
      static_cast<int>(cfg.get_int("v_major.block_heads", o.v_major_block_heads, 1, 4096));
  o.v_major_tiers = cfg.get_string_list("v_major.tiers", o.v_major_tiers);
  o.v_major_warmup_steps =
      static_cast<int>(cfg.get_int("v_major.warmup_steps", o.v_major_warmup_steps, 1, 100000));
  o.v_major_refresh_every =
      static_cast<int>(cfg.get_int("v_major.refresh_every", o.v_major_refresh_every, 0, 100000));
  o.v_major_phantom_active_fraction =
      cfg.get_double("v_major.phantom_active_fraction", o.v_major_phantom_active_fraction, 0, 1);
  o.usp_ring_levels = static_cast<int>(cfg.get_int("usp.ring_levels", o.usp_ring_levels, 0, 16));
  o.usp_tapa = cfg.get_bool("usp.tapa", o.usp_tapa);
  o.shard_text = cfg.get_bool("parallel.shard_text", o.shard_text);
  o.compress = cfg.get_choice("compress.all_to_all", o.compress, {"none", "fp8", "residual"});
  o.pipefusion_degree =
      static_cast<int>(cfg.get_int("parallel.pipefusion_degree", o.pipefusion_degree, 1, 1 << 20));
  o.pipefusion_patches =
      static_cast<int>(cfg.get_int("pipefusion.patches", o.pipefusion_patches, 1, 4096));
  o.pipefusion_warmup_steps = static_cast<int>(
      cfg.get_int("pipefusion.warmup_steps", o.pipefusion_warmup_steps, 1, 100000));
}

// [step_cache]: dit::StepCacheOptions; the threshold defaults to the policy's published one.
void read_step_cache(Config& cfg, dit::StepCacheOptions& o, int steps) {
  o.policy = cfg.get_choice("step_cache.policy", o.policy, dit::step_cache_policies());
  o.threshold =
      cfg.get_double("step_cache.threshold", dit::step_cache_default_threshold(o.policy), 0, 1e6);
  o.coefficients = cfg.get_double_list("step_cache.coefficients", o.coefficients);
  for (const std::int64_t v : cfg.get_int_list("step_cache.phantom_skipped", {})) {
    if (v <= 0 || v >= steps)
      throw ConfigError(
          cfg.where("step_cache.phantom_skipped"), "step_cache.phantom_skipped",
          "steps from 1 to " + std::to_string(steps - 1) + " (the first step always runs)",
          std::to_string(v));
    o.phantom_skipped.push_back(static_cast<int>(v));
  }
}

}  // namespace

namespace {

// Inpainting keys: run.inpaint_image (PNG of the known picture, resolution x resolution,
// pixel-space models) and the region to generate, either run.inpaint_rect = [x, y, width,
// height] in pixels or run.inpaint_mask, a PNG of the image's size whose nonzero (white) pixels
// are generated and whose black pixels are kept. Everything outside the region is kept from the
// known picture (in every frame of a video).
void read_inpainting(Config& cfg, const dit::ModelConfig& m, dit::RunSettings& s) {
  const bool has_image = cfg.has("run.inpaint_image"), has_rect = cfg.has("run.inpaint_rect"),
             has_mask = cfg.has("run.inpaint_mask");
  if (!has_image && !has_rect && !has_mask) return;
  if (has_rect && has_mask)
    throw ConfigError(cfg.where("run.inpaint_mask"), "run.inpaint_mask",
                      "run.inpaint_mask or run.inpaint_rect, not both",
                      "both run.inpaint_mask and run.inpaint_rect");
  const char* region_key = has_mask ? "run.inpaint_mask" : "run.inpaint_rect";
  if (!has_image || (!has_rect && !has_mask))
    throw ConfigError(cfg.where(has_image ? "run.inpaint_image" : region_key),
                      has_image ? "run.inpaint_image" : region_key,
                      "run.inpaint_image with run.inpaint_rect or run.inpaint_mask",
                      has_image ? "run.inpaint_image alone" : std::string(region_key) + " alone");
  if (!m.pixel_space)
    throw ConfigError(cfg.where("run.inpaint_image"), "run.inpaint_image",
                      "a pixel-space model (model.pixel_space = true)",
                      "model " + m.name + " with a latent space");
  const int hn = s.pixel_height(), wn = s.pixel_width();  // pixel space: latent = pixels
  const std::string size = std::to_string(wn) + " x " + std::to_string(hn);
  const std::string size_keys = cfg.has("run.height") ? "run.width x run.height" : "run.resolution";
  // A PNG of the run's size: ConfigError naming the key and the file otherwise.
  auto read_sized = [&](const char* key) {
    const std::filesystem::path file = file_key(cfg, key, "a " + size + " PNG");
    dit::Rgb img;
    try {
      img = dit::read_png(file, dit::PngSize{wn, hn});
    } catch (const InputError& e) {
      throw ConfigError(cfg.where(key), key, "a " + size + " PNG (" + size_keys + ")", e.what());
    }
    if (img.width != wn || img.height != hn)
      throw ConfigError(
          cfg.where(key), key, "a " + size + " PNG (" + size_keys + ")",
          file.string() + " of " + std::to_string(img.width) + " x " + std::to_string(img.height));
    return img;
  };
  const dit::Rgb img = read_sized("run.inpaint_image");
  Tensor mask;
  if (has_mask) {
    mask = dit::inpaint_mask(read_sized("run.inpaint_mask"));
    if (mask.mat().maxCoeff() == 0.0f)
      throw ConfigError(cfg.where("run.inpaint_mask"), "run.inpaint_mask",
                        "a mask with at least one nonzero (white) pixel to generate",
                        cfg.require_string("run.inpaint_mask") + ", black everywhere");
  } else {
    const std::vector<std::int64_t> r = cfg.get_int_list("run.inpaint_rect", {});
    // Compared without sums: x + width would overflow for x or width near INT64_MAX.
    if (r.size() != 4 || r[0] < 0 || r[1] < 0 || r[2] < 1 || r[3] < 1 || r[0] >= wn || r[1] >= hn ||
        r[2] > wn - r[0] || r[3] > hn - r[1]) {
      std::string found = "[";
      for (std::int64_t v : r) found += (found.size() > 1 ? ", " : "") + std::to_string(v);
      throw ConfigError(cfg.where("run.inpaint_rect"), "run.inpaint_rect",
                        "[x, y, width, height] inside the " + size + " image", found + "]");
    }
    mask = Tensor::zeros(1, std::int64_t{hn} * wn, false);
    for (std::int64_t y = r[1]; y < r[1] + r[3]; ++y)
      for (std::int64_t x = r[0]; x < r[0] + r[2]; ++x) mask.mat()(0, y * wn + x) = 1.0f;
  }
  // A video keeps the known picture outside the region in every frame.
  const int frames = m.latent_frames(s.frames);
  const Tensor known = dit::pixel_latent(img, m.latent_channels);
  s.known_latent = Tensor::from(Mat(known.mat().replicate(1, frames)));
  s.mask = Tensor::from(Mat(mask.mat().replicate(1, frames)));
}

}  // namespace

namespace {

using LayoutKind = dit::StrategyLayout::Kind;

// How the plan's strategy lays out its ranks (its entry's, or a program's own).
const dit::StrategyLayout& layout_of(const RunPlan& plan) {
  return dit::attention_strategy_layout(plan.settings.strategy, plan.settings.strategies.get());
}

// The strategy of layout `kind` that a degree key turns the default strategy into.
std::string strategy_of(const RunPlan& plan, LayoutKind kind) {
  return dit::strategy_of_layout(kind, plan.settings.strategies.get());
}

// What validate --dump needs beyond the values the readers saw: file paths made absolute (they
// are relative to the config's directory, which a dumped copy need not share) and the xDiT
// degrees the run resolved to.
void record_derived_values(RunPlan& plan, int ulysses_degree) {
  Config& cfg = plan.cfg;
  const auto absolute = [&](const std::string& key) {
    if (!cfg.has(key)) return;
    const std::filesystem::path file = file_key(cfg, key.c_str(), "a file");
    std::error_code ec;
    const std::filesystem::path full = std::filesystem::absolute(file, ec);
    cfg.set_effective(key, toml::value<std::string>(ec ? file.string() : full.string()));
  };
  for (const char* key :
       {"run.weights", "run.initial_latent", "run.inpaint_image", "run.inpaint_mask"})
    absolute(key);
  if (cfg.has("model.preset") && cfg.require_string("model.preset").ends_with(".toml"))
    absolute("model.preset");
  if (cfg.has("cluster.preset")) {
    const std::string v = cfg.require_string("cluster.preset");
    if (v.find('/') != std::string::npos || v.ends_with(".toml"))
      cfg.set_effective(
          "cluster.preset",
          toml::value<std::string>(std::filesystem::absolute(plan.cluster.source).string()));
  }
  const int sp_ranks = plan.ranks() / plan.settings.cfg_degree;
  plan.ulysses_degree = ulysses_degree;
  plan.ring_degree = sp_ranks / std::max(1, ulysses_degree * plan.pipefusion_degree);
  cfg.set_effective("parallel.ulysses_degree", toml::value<std::int64_t>(ulysses_degree));
  cfg.set_effective("parallel.ring_degree", toml::value<std::int64_t>(plan.ring_degree));
  cfg.set_effective("parallel.cfg_degree", toml::value<std::int64_t>(plan.settings.cfg_degree));
  cfg.set_effective("parallel.pipefusion_degree",
                    toml::value<std::int64_t>(plan.pipefusion_degree));
}

// The largest divisor of `ranks` that is at most `most` (at least 1).
int largest_divisor_up_to(int ranks, int most) {
  for (int d = std::min(ranks, most); d > 1; --d)
    if (ranks % d == 0) return d;
  return 1;
}

// What PipeFusion's sampling loop does not run, refused before the run as generate() would.
void check_pipefusion_settings(const RunPlan& plan) {
  const Config& cfg = plan.cfg;
  const dit::RunSettings& s = plan.settings;
  const std::string with = " with run.strategy \"" + s.strategy + "\"";
  if (s.known_latent) {
    const char* key = cfg.has("run.inpaint_mask") ? "run.inpaint_mask" : "run.inpaint_rect";
    throw ConfigError(cfg.where(key), key, "no inpainting" + with, "a region to regenerate");
  }
  if (s.step_cache.active())
    throw ConfigError(cfg.where("step_cache.policy"), "step_cache.policy", "\"none\"" + with,
                      "\"" + s.step_cache.policy + "\"");
  const double scale = s.cfg_scale >= 0 ? s.cfg_scale : plan.model.cfg_scale;
  if (plan.model.cfg_mode == dit::CfgMode::kTrue && scale != 1.0 && s.cfg_degree == 1)
    throw ConfigError(
        cfg.where("parallel.cfg_degree"), "parallel.cfg_degree",
        "2 for the true CFG of " + plan.model.name + with + " (a pipeline runs one pass a step)",
        "1");
}

// Pipeline stages (layout kStages: PipeFusion, dit/parallel/pipefusion.hpp):
// parallel.pipefusion_degree stages (xDiT's --pipefusion_parallel_degree), each a Ulysses group
// of the other ranks. A degree above 1 turns the config's default Ulysses (flat) into the
// stages' strategy, as a ring degree turns it into the ring's (usp). Without a degree, the stages
// take parallel.ulysses_degree's complement, else the largest divisor of the ranks that is at
// most the model's blocks. Returns the Ulysses degree; 0: not a strategy of stages.
int resolve_pipefusion(RunPlan& plan, int sp_ranks) {
  Config& cfg = plan.cfg;
  dit::RunSettings& s = plan.settings;
  dit::StrategyOptions& o = s.strategy_options;
  const char* key = "parallel.pipefusion_degree";
  if (o.pipefusion_degree > 1 && layout_of(plan).kind != LayoutKind::kStages) {
    const std::string stages = strategy_of(plan, LayoutKind::kStages);
    if (s.strategy != dit::kDefaultStrategy ||
        (cfg.has("run.strategy") && cfg.is_override("run.strategy")))
      throw ConfigError(cfg.where(key), key,
                        "1 with run.strategy \"" + s.strategy +
                            "\" (patch pipelining runs in the strategy \"" + stages + "\")",
                        std::to_string(o.pipefusion_degree));
    s.strategy = stages;
    cfg.set_effective("run.strategy", toml::value<std::string>(stages));
  }
  if (layout_of(plan).kind != LayoutKind::kStages) return 0;
  if (cfg.has("parallel.ring_degree") && cfg.get_int("parallel.ring_degree", 1, 1, 1 << 20) > 1)
    throw ConfigError(cfg.where("parallel.ring_degree"), "parallel.ring_degree",
                      "1 with run.strategy \"" + s.strategy + "\" (its stages run Ulysses)",
                      std::to_string(cfg.get_int("parallel.ring_degree", 1, 1, 1 << 20)));
  const dit::ModelFamily& fam = dit::model_family(plan.model.family);
  if (o.pipefusion_degree == 0) {
    const int u = static_cast<int>(cfg.get_int("parallel.ulysses_degree", 0, 1, 1 << 20));
    o.pipefusion_degree = u > 0 ? std::max(1, sp_ranks / u)
                          : fam.stage_blocks
                              ? largest_divisor_up_to(sp_ranks, fam.stage_blocks(plan.model))
                              : sp_ranks;
  }
  const int degree = o.pipefusion_degree;
  if (cfg.has("parallel.ulysses_degree")) {
    const int u = static_cast<int>(cfg.get_int("parallel.ulysses_degree", 0, 1, 1 << 20));
    if (static_cast<std::int64_t>(u) * degree != sp_ranks)
      throw ConfigError(cfg.where("parallel.ulysses_degree"), "parallel.ulysses_degree",
                        "parallel.ulysses_degree x parallel.pipefusion_degree = the " +
                            std::to_string(sp_ranks) + " ranks of a pipeline",
                        std::to_string(u) + " x " + std::to_string(degree));
  }
  const dit::TokenGrid grid{plan.model.latent_frames(s.frames),
                            plan.model.latent_side(s.pixel_height()) / plan.model.patch_size,
                            plan.model.latent_side(s.pixel_width()) / plan.model.patch_size};
  if (std::optional<dit::ModelConfigProblem> bad =
          dit::pipefusion_problem(plan.model, o, sp_ranks, grid))
    throw ConfigError(cfg.where(bad->key), bad->key, bad->expected, bad->found);
  check_pipefusion_settings(plan);
  if (o.pipefusion_patches == 0) o.pipefusion_patches = degree;
  cfg.set_effective("pipefusion.patches", toml::value<std::int64_t>(o.pipefusion_patches));
  plan.pipefusion_degree = degree;
  return sp_ranks / degree;
}

}  // namespace

namespace {

// What the run reads before its first step, checked now so that validate refuses what run
// would: the checkpoint holds the model's tensors (real math; a phantom run reads none) and the
// initial latent has the model's latent shape. Reads headers only.
void check_input_files(const RunPlan& plan) {
  const Config& cfg = plan.cfg;
  if (plan.weights_file && !plan.settings.phantom) {
    const std::string expected = "a safetensors checkpoint of " + plan.model.name +
                                 " (`cocodiff weights " + plan.model.name + "` lists its tensors)";
    try {
      const dit::SafetensorsCheckpoint ckpt(*plan.weights_file);
      const dit::CheckpointCheck c =
          dit::check_checkpoint(ckpt, dit::make_model(plan.model)->tensor_specs());
      if (!c.ok())
        throw ConfigError(cfg.where("run.weights"), "run.weights", expected,
                          plan.weights_file->string() + ", which does not fit: " + c.summary());
    } catch (const InputError& e) {
      throw ConfigError(cfg.where("run.weights"), "run.weights", expected, e.what());
    }
  }
  if (plan.initial_latent && !plan.settings.phantom) {
    const dit::TensorSpec want{
        "latent",
        {plan.model.latent_channels, plan.model.latent_side(plan.settings.pixel_height()),
         plan.model.latent_side(plan.settings.pixel_width())}};
    const std::string expected = "a safetensors file whose tensor \"latent\" has shape " +
                                 want.shape_str() + " (latent channels, height, width of " +
                                 plan.model.name + " at this size)";
    std::string found;
    try {
      const dit::SafetensorsFile f(*plan.initial_latent);
      const dit::SafetensorsEntry* e = f.find("latent");
      if (e == nullptr)
        found = plan.initial_latent->string() + " without a tensor \"latent\"";
      else if (e->shape != want.shape)
        found = plan.initial_latent->string() + " whose \"latent\" has shape " +
                dit::TensorSpec{"latent", e->shape}.shape_str();
    } catch (const InputError& e) {
      found = e.what();
    }
    if (!found.empty())
      throw ConfigError(cfg.where("run.initial_latent"), "run.initial_latent", expected, found);
  }
}

}  // namespace

namespace {

// run.resolution (a square) or run.height and run.width (a rectangle): the run's size in pixels.
void read_image_size(Config& cfg, dit::RunSettings& s) {
  // run.resolution is the square shorthand; run.height and run.width (together) a rectangle.
  // A height or width from the command line (--height, --width, --set) replaces the file's
  // resolution, which gives the side not named.
  const bool sides_replace_file = (cfg.is_override("run.height") || cfg.is_override("run.width")) &&
                                  cfg.has("run.resolution") && !cfg.is_override("run.resolution");
  if (cfg.has("run.height") || cfg.has("run.width")) {
    int file_side = 0;
    if (sides_replace_file) {
      const std::optional<std::int64_t> v =
          cfg.table().at_path("run.resolution").value_exact<std::int64_t>();
      cfg.mark_used("run.resolution");  // read, and left out of the effective config
      file_side = static_cast<int>(std::clamp<std::int64_t>(v.value_or(0), 0, 1 << 16));
    } else if (cfg.has("run.resolution")) {
      throw ConfigError(
          cfg.where("run.resolution"), "run.resolution",
          "either run.resolution (a square) or run.height and run.width, not both",
          "run.resolution and " + std::string(cfg.has("run.height") ? "run.height" : "run.width"));
    }
    for (const char* key : {"run.height", "run.width"})
      if (!cfg.has(key) && file_side == 0)
        throw ConfigError(
            cfg.where(key), key, "run.height and run.width together",
            std::string("only ") + (std::string(key) == "run.height" ? "run.width" : "run.height"));
    s.height = static_cast<int>(cfg.get_int("run.height", file_side, 16, 1 << 16));
    s.width = static_cast<int>(cfg.get_int("run.width", file_side, 16, 1 << 16));
    s.resolution = s.height == s.width ? s.height : 0;
  } else {
    s.resolution = static_cast<int>(cfg.get_int("run.resolution", 1024, 16, 1 << 16));
    s.height = s.width = s.resolution;
  }
}

// run.steps, run.seed, run.math and run.strategy, a built-in or registered strategy.
void read_steps_and_strategy(Config& cfg, RunPlan& plan,
                             std::shared_ptr<const dit::StrategyRegistry> strategies) {
  dit::RunSettings& s = plan.settings;
  s.steps = static_cast<int>(cfg.get_int("run.steps", plan.model.default_steps, 1, 100000));
  s.seed = static_cast<std::uint64_t>(cfg.get_int("run.seed", 0, 0));
  plan.math = cfg.get_choice("run.math", "real", {"real", "skip"});
  s.phantom = plan.math == "skip";
  const dit::StrategyRegistry* user = strategies.get();
  s.strategies = std::move(strategies);
  std::vector<std::string> names = dit::attention_strategy_names(user);
  s.strategy = cfg.get_string("run.strategy", dit::kDefaultStrategy);
  if (const std::string err = dit::attention_strategy_error(s.strategy, user); !err.empty()) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : " | ") + n;
    throw ConfigError(cfg.where("run.strategy"), "run.strategy",
                      "one of " + list + " (or features joined by '+')", "\"" + s.strategy + "\"");
  }
}

// run.cfg_scale and parallel.cfg_degree: CFG-parallel needs an unconditional pass, an even rank
// count and a strategy that runs on half the ranks.
void read_cfg_parallel(Config& cfg, RunPlan& plan) {
  dit::RunSettings& s = plan.settings;
  s.cfg_scale = cfg.get_double("run.cfg_scale", -1, -1, 100);
  if (s.cfg_scale < 0)  // -1: the model's own scale, which the resolved config names
    cfg.set_effective("run.cfg_scale", toml::value<double>(plan.model.cfg_scale));
  // CFG-parallel: the conditional and unconditional passes on two halves of the ranks.
  s.cfg_degree = static_cast<int>(cfg.get_int("parallel.cfg_degree", 1, 1, 2));
  if (s.cfg_degree == 2) {
    const double scale = s.cfg_scale >= 0 ? s.cfg_scale : plan.model.cfg_scale;
    if (plan.model.cfg_mode == dit::CfgMode::kNone || scale == 1.0)
      throw ConfigError(cfg.where("parallel.cfg_degree"), "parallel.cfg_degree",
                        "1 for " + plan.model.name +
                            (plan.model.cfg_mode == dit::CfgMode::kNone
                                 ? " (it has no unconditional pass: guidance is an input)"
                                 : " at guidance scale 1 (run.cfg_scale: no unconditional pass)"),
                        "2");
    if (plan.ranks() % 2 != 0)
      throw ConfigError(
          cfg.where("parallel.cfg_degree"), "parallel.cfg_degree",
          "a degree that divides the cluster's " + std::to_string(plan.ranks()) + " ranks", "2");
    if (const dit::StrategyLayout& layout = layout_of(plan); !layout.cfg_parallel)
      throw ConfigError(cfg.where("parallel.cfg_degree"), "parallel.cfg_degree",
                        "1 with run.strategy \"" + s.strategy +
                            "\" (CFG-parallel runs strategies on half the ranks; " +
                            (layout.kind == LayoutKind::kRing
                                 ? s.strategy + "'s ring spans the whole cluster"
                                 : "a registered strategy may assume the whole cluster") +
                            ")",
                        "2");
  }
}

// What the run is conditioned on and starts from: class, motion, input files, batch size,
// inpainting, and the measured rates.
void read_inputs(Config& cfg, RunPlan& plan) {
  dit::RunSettings& s = plan.settings;
  // A model with class labels has classes 0 .. num_classes - 1 (num_classes is its null class);
  // a model without them is conditioned on seeded text embeddings and ignores the key.
  s.class_label = static_cast<int>(cfg.get_int("run.class_label", 0, 0, 1 << 24));
  if (plan.model.num_classes > 0 && s.class_label >= plan.model.classes())
    throw ConfigError(cfg.where("run.class_label"), "run.class_label",
                      "a class of " + plan.model.name + " (0 to " +
                          std::to_string(plan.model.classes() - 1) + ")",
                      std::to_string(s.class_label) + " (out of range)");
  read_motion(cfg, plan);
  // An empty path is refused by its key before any file is looked for.
  for (const char* key :
       {"run.weights", "run.initial_latent", "run.inpaint_image", "run.inpaint_mask"})
    if (cfg.has(key) && cfg.require_string(key).empty())
      throw ConfigError(cfg.where(key), key, "a file path", "an empty string");
  if (cfg.has("run.weights"))
    plan.weights_file =
        file_key(cfg, "run.weights", "a safetensors checkpoint of " + plan.model.name);
  if (cfg.has("run.initial_latent"))
    plan.initial_latent =
        file_key(cfg, "run.initial_latent", "a safetensors file with a tensor \"latent\"");
  plan.save_latent = cfg.get_bool("run.save_latent", false);
  plan.batch_size = static_cast<int>(cfg.get_int("run.batch_size", 1, 1, 4096));
  read_inpainting(cfg, plan.model, s);
  read_measured_rates(cfg, plan);
}

// [emulator] and [mpi]: the engine's options and the MPI backend's watchdog.
void read_engine_options(Config& cfg, RunPlan& plan) {
  const dit::RunSettings& s = plan.settings;
  emu::EngineOptions& e = plan.engine;
  // Workers beyond the first run the tiles' arithmetic while the fibers go on (EngineOptions::
  // workers). By default a real-math run takes every hardware thread; a phantom run has no
  // arithmetic to hand over and takes one, leaving the others to independent runs (compare).
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 1024u));
  e.workers = static_cast<int>(cfg.get_int("emulator.workers", s.phantom ? 1 : threads, 1, 1024));
  plan.workers_set = cfg.has("emulator.workers");
  e.trace = cfg.get_bool("emulator.trace", true);
  e.replay = cfg.get_bool("emulator.replay", true);
  e.collective_ops = cfg.get_bool("emulator.collective_ops", true);
  e.call_tapes = cfg.get_bool("emulator.call_tapes", true);
  e.trace_limit = static_cast<std::size_t>(cfg.get_int("emulator.trace_limit", 2'000'000, 0));
  plan.trace_steps = static_cast<int>(cfg.get_int("emulator.trace_steps", 1, 0, 1'000'000));
  e.all_to_all_algorithm =
      cfg.get_choice("emulator.all_to_all", "library", emu::all_to_all_choices());
  e.wire_bytes_per_element = cfg.get_double("emulator.wire_bytes_per_element", 2, 0.125, 16);
  e.library = plan.cluster.library;
  e.stack_bytes = static_cast<std::size_t>(cfg.get_int("emulator.stack_kib", 1024, 256, 1 << 20))
                  << 10;
  plan.mpi_check_hosts = cfg.get_bool("mpi.check_hosts", true);
  // mpi.progress_timeout_s: seconds (0: off), or "auto" (the default).
  if (const toml::node* t = cfg.table().at_path("mpi.progress_timeout_s").node();
      t != nullptr && t->is_number()) {
    plan.mpi_progress_timeout_s = cfg.get_double("mpi.progress_timeout_s", 0, 0, 1e6);
    plan.mpi_progress_auto = false;
  } else if (t != nullptr && t->value_exact<std::string>() != "auto") {
    cfg.mark_used("mpi.progress_timeout_s");
    throw ConfigError(cfg.where("mpi.progress_timeout_s"), "mpi.progress_timeout_s",
                      "a number of seconds in [0, 1e6] (0: off) or \"auto\"", describe_node(*t));
  } else {
    cfg.get_string("mpi.progress_timeout_s", "auto");
  }
  plan.mpi_progress_floor_s = cfg.get_double("mpi.progress_floor_s", 30, 0.1, 1e6);
  plan.mpi_progress_multiple = cfg.get_double("mpi.progress_multiple", 10, 1, 1e6);
}

// emulator.memory_limit: a size in bytes, or "available".
void read_memory_limit(Config& cfg, RunPlan& plan) {
  // "available" (the default): MemAvailable of /proc/meminfo when the run starts.
  const bool available =
      !cfg.has("emulator.memory_limit") ||
      cfg.table().at_path("emulator.memory_limit").value_exact<std::string>() == "available";
  if (!available) {
    const std::int64_t limit = cfg.get_bytes("emulator.memory_limit", 0);
    if (limit > 0) plan.memory_limit_bytes = limit;  // 0: no limit
    plan.memory_limit_source = cfg.where("emulator.memory_limit");
  } else {
    cfg.mark_used("emulator.memory_limit");
    cfg.set_effective("emulator.memory_limit", toml::value<std::string>("available"));
    plan.memory_limit_bytes = available_memory_bytes();
    plan.memory_limit_source = cfg.has("emulator.memory_limit")
                                   ? cfg.where("emulator.memory_limit")
                                   : std::string("default: MemAvailable of /proc/meminfo");
  }
}

// The image's sides fit the model (multiples of VAE x patch, within SD3's positional table) and
// give every rank at least one token.
void check_image_size(const Config& cfg, const RunPlan& plan) {
  const dit::RunSettings& s = plan.settings;
  const int unit = plan.model.vae_scale * plan.model.patch_size;
  const bool rect = cfg.has("run.height");
  for (const char* key : {"run.height", "run.width"}) {
    const bool h = std::string(key) == "run.height";
    const std::string shown = rect ? key : "run.resolution";
    const int px = h ? s.height : s.width;
    if (px % unit != 0)
      throw ConfigError(cfg.where(shown), shown,
                        "a multiple of " + std::to_string(unit) + " (VAE " +
                            std::to_string(plan.model.vae_scale) + " x patch " +
                            std::to_string(plan.model.patch_size) + ")",
                        std::to_string(px));
    // SD3's positional table covers at most pos_embed_max_size patches a side.
    if (const int max_grid = plan.model.pos_embed_max_size; max_grid > 0 && px / unit > max_grid)
      throw ConfigError(cfg.where(shown), shown,
                        "at most " + std::to_string(max_grid * unit) + " (model " +
                            plan.model.name + "'s pos_embed_max_size " + std::to_string(max_grid) +
                            " patches a side, of " + std::to_string(unit) + " px)",
                        std::to_string(px) + " (" + std::to_string(px / unit) + " patches)");
  }
  if (plan.tokens() < plan.ranks()) {
    if (!rect) {
      std::int64_t side = 1;  // the smallest grid side with a token per rank
      while (side * side < plan.ranks()) ++side;
      throw ConfigError(
          cfg.where("run.resolution"), "run.resolution",
          "at least one image token per rank: " + std::to_string(plan.ranks()) +
              " ranks need a resolution of at least " + std::to_string(side * unit),
          std::to_string(s.resolution) + " (" + std::to_string(plan.tokens()) + " image tokens)");
    }
    throw ConfigError(cfg.where("run.height"), "run.height x run.width",
                      "at least one image token per rank: " + std::to_string(plan.ranks()) +
                          " ranks need " + std::to_string(plan.ranks()) + " tokens of " +
                          std::to_string(unit) + " x " + std::to_string(unit) + " px",
                      std::to_string(s.height) + " x " + std::to_string(s.width) + " (" +
                          std::to_string(plan.tokens()) + " image tokens)");
  }
}

// xDiT-style degrees: parallel.ulysses_degree x parallel.ring_degree = ranks. Ring attention
// runs over whole outer levels of the topology (usp.ring_levels), so a ring degree must be the
// product of the outermost levels' sizes: nodes, nodes x GPUs, ... These are the choices.
std::vector<int> ring_degree_choices(const Topology& topo) {
  std::vector<int> ring_choices = {1};  // ring degree of 0, 1, 2, ... outer levels
  for (int k = topo.num_levels() - 1; k > 0; --k)
    ring_choices.push_back(ring_choices.back() * topo.level(k).size);
  return ring_choices;
}

// The degree splits of the cluster as command-line flags ("--ulysses-degree U --ring-degree R");
// with `heads_divide`, only those whose Ulysses degree divides the model's heads.
std::string degree_splits(const RunPlan& plan, const std::vector<int>& ring_choices, int sp_ranks,
                          bool heads_divide) {
  const dit::RunSettings& s = plan.settings;
  std::string list;
  for (size_t i = 0; i < ring_choices.size(); ++i) {
    const int ring = ring_choices[i];
    if (i > 0 && ring == ring_choices[i - 1]) continue;  // a level of size 1
    if (ring > 1 && s.cfg_degree > 1) continue;          // CFG-parallel runs no ring
    const int u = sp_ranks / ring;
    if (heads_divide && plan.model.heads % u != 0) continue;
    list += (list.empty() ? "" : ", ") + std::string("--ulysses-degree ") + std::to_string(u) +
            " --ring-degree " + std::to_string(ring);
    // Only the default strategy gives way to the ring's by itself.
    if (ring > 1 && layout_of(plan).kind != LayoutKind::kRing &&
        s.strategy != dit::kDefaultStrategy)
      list += " --set run.strategy=" + strategy_of(plan, LayoutKind::kRing);
  }
  return list;
}

// parallel.ulysses_degree and parallel.ring_degree outside PipeFusion: their product is the
// sequence-parallel ranks, the ring spans whole outer levels, and a ring turns flat into usp.
void resolve_xdit_degrees(RunPlan& plan, const std::vector<int>& ring_choices, int sp_ranks) {
  Config& cfg = plan.cfg;
  dit::RunSettings& s = plan.settings;
  const bool has_u = cfg.has("parallel.ulysses_degree");
  const bool has_r = cfg.has("parallel.ring_degree");
  const int u_in = static_cast<int>(cfg.get_int("parallel.ulysses_degree", 0, 1, 1 << 20));
  const int r_in = static_cast<int>(cfg.get_int("parallel.ring_degree", 0, 1, 1 << 20));
  const int ring = has_r ? r_in : std::max(1, sp_ranks / u_in);
  const int ulysses = has_u ? u_in : std::max(1, sp_ranks / r_in);
  if (static_cast<std::int64_t>(ulysses) * ring != sp_ranks) {
    const std::string key = has_u ? "parallel.ulysses_degree" : "parallel.ring_degree";
    throw ConfigError(cfg.where(key), key,
                      "degrees whose product is " +
                          (s.cfg_degree > 1 ? "the cluster's " + std::to_string(plan.ranks()) +
                                                  " ranks / parallel.cfg_degree " +
                                                  std::to_string(s.cfg_degree) + " = "
                                            : std::string("the cluster's ")) +
                          std::to_string(sp_ranks) + " ranks (e.g. " +
                          degree_splits(plan, ring_choices, sp_ranks, false) + ")",
                      "ulysses " + std::to_string(ulysses) + " x ring " + std::to_string(ring) +
                          " = " + std::to_string(static_cast<std::int64_t>(ulysses) * ring));
  }
  const auto level = std::find(ring_choices.begin(), ring_choices.end(), ring);
  if (level == ring_choices.end()) {
    std::string sizes;
    for (size_t i = 0; i < ring_choices.size(); ++i)
      if (i == 0 || ring_choices[i] != ring_choices[i - 1])
        sizes += (sizes.empty() ? "" : ", ") + std::to_string(ring_choices[i]);
    throw ConfigError(cfg.where("parallel.ring_degree"), "parallel.ring_degree",
                      "a ring over whole outer levels of the topology: one of " + sizes,
                      std::to_string(ring));
  }
  // A ring degree above 1 is Ulysses x Ring: usp. It replaces plain Ulysses (flat, named by
  // the file or the default); a strategy named on the command line, or another one, stays
  // and is refused.
  const bool replaces_default = s.strategy == dit::kDefaultStrategy &&
                                !(cfg.has("run.strategy") && cfg.is_override("run.strategy"));
  if (ring > 1 && layout_of(plan).kind != LayoutKind::kRing) {
    const std::string ringed = strategy_of(plan, LayoutKind::kRing);
    if (cfg.has("run.strategy") && !replaces_default)
      throw ConfigError(cfg.where("parallel.ring_degree"), "parallel.ring_degree",
                        "1 with run.strategy \"" + s.strategy + "\" (ring attention runs in the " +
                            ringed + " strategy)",
                        std::to_string(ring));
    s.strategy = ringed;
    cfg.set_effective("run.strategy", toml::value<std::string>(ringed));
  }
  // Levels of size 1 give equal ring degrees: an explicit usp.ring_levels of that degree stays.
  const bool levels_agree =
      cfg.has("usp.ring_levels") &&
      s.strategy_options.usp_ring_levels < static_cast<int>(ring_choices.size()) &&
      ring_choices[static_cast<size_t>(s.strategy_options.usp_ring_levels)] == ring;
  if (layout_of(plan).kind == LayoutKind::kRing && !levels_agree)
    s.strategy_options.usp_ring_levels = static_cast<int>(level - ring_choices.begin());
}

// The Ulysses degree: a PipeFusion stage's (`pipefusion_ulysses`, unless 0), else every rank
// (flat, tapa, ...), or the inner levels (usp).
int ulysses_degree_of(const RunPlan& plan, int sp_ranks, int pipefusion_ulysses) {
  const dit::RunSettings& s = plan.settings;
  int ulysses_degree = pipefusion_ulysses > 0 ? pipefusion_ulysses : sp_ranks;
  if (layout_of(plan).kind == LayoutKind::kRing)
    for (int k = plan.cluster.topology.num_levels() - s.strategy_options.usp_ring_levels;
         k < plan.cluster.topology.num_levels(); ++k)
      ulysses_degree /= std::max(1, plan.cluster.topology.level(std::max(0, k)).size);
  return ulysses_degree;
}

// A Ulysses degree that does not divide the heads: refused, or with ulysses.uneven_heads the
// uneven split that plan.attention_note describes.
void explain_uneven_heads(RunPlan& plan, const std::vector<int>& ring_choices, int sp_ranks,
                          int ulysses_degree) {
  const Config& cfg = plan.cfg;
  const dit::RunSettings& s = plan.settings;
  const std::string fits = degree_splits(plan, ring_choices, sp_ranks, true);
  const std::string hint = fits.empty() ? "" : "; degree splits that divide them: " + fits;
  if (!s.strategy_options.uneven_heads) {
    const std::string key = cfg.has("cluster.nodes") ? "cluster.nodes" : "cluster.preset";
    throw ConfigError(cfg.where(key), key,
                      "a Ulysses degree that divides the " + std::to_string(plan.model.heads) +
                          " heads of " + plan.model.name +
                          " (Ulysses gives every rank heads / degree heads; set "
                          "ulysses.uneven_heads = true for DeepSpeed's uneven split" +
                          hint + ")",
                      std::to_string(plan.cluster.topology.num_nodes()) +
                          " nodes = " + std::to_string(plan.ranks()) + " ranks" +
                          (s.cfg_degree > 1 ? " / parallel.cfg_degree 2" : "") +
                          ", Ulysses degree " + std::to_string(ulysses_degree));
  }
  const int heads = plan.model.heads;
  plan.attention_note =
      "uneven heads: " + std::to_string(heads) + " heads over Ulysses degree " +
      std::to_string(ulysses_degree) + ": the first " + std::to_string(heads % ulysses_degree) +
      " ranks of each Ulysses group hold " + std::to_string(heads / ulysses_degree + 1) +
      " heads, the others " + std::to_string(heads / ulysses_degree) +
      (heads < ulysses_degree
           ? "; ranks " + std::to_string(heads) + " to " + std::to_string(ulysses_degree - 1) +
                 " of each group hold none and idle in attention"
           : std::string()) +
      hint;
}

// parallel.shard_text: a model with joint text attention, a built-in strategy, and a Ulysses
// degree that divides the text tokens.
void check_shard_text(const RunPlan& plan, const std::vector<int>& ring_choices, int sp_ranks,
                      int ulysses_degree, bool ulysses_split) {
  const Config& cfg = plan.cfg;
  const dit::RunSettings& s = plan.settings;
  const dit::ModelConfig& m = plan.model;
  const dit::ModelFamily& fam = dit::model_family(m.family);
  if (!fam.text_conditioned || !fam.joint_text)
    throw ConfigError(cfg.where("parallel.shard_text"), "parallel.shard_text",
                      "false for " + m.name + " (it has no text stream in its attention)", "true");
  if (layout_of(plan).kind == LayoutKind::kOwn)
    throw ConfigError(cfg.where("parallel.shard_text"), "parallel.shard_text",
                      "false with the registered strategy \"" + s.strategy + "\"", "true");
  if (ulysses_split && m.text_tokens % ulysses_degree != 0) {
    std::string fits;  // the degree splits of this cluster whose Ulysses degree does
    for (size_t i = 0; i < ring_choices.size(); ++i) {
      const int ring = ring_choices[i];
      if ((i > 0 && ring == ring_choices[i - 1]) || (ring > 1 && s.cfg_degree > 1)) continue;
      if (m.text_tokens % (sp_ranks / ring) == 0)
        fits += (fits.empty() ? "" : ", ") + std::string("--ulysses-degree ") +
                std::to_string(sp_ranks / ring) + " --ring-degree " + std::to_string(ring);
    }
    throw ConfigError(
        cfg.where("parallel.shard_text"), "parallel.shard_text",
        "a Ulysses degree that divides the " + std::to_string(m.text_tokens) + " text tokens of " +
            m.name + " (" +
            (fits.empty() ? "no degree split of this cluster does"
                          : "degree splits that do: " + fits) +
            "; or parallel.shard_text = false to replicate the text)",
        "Ulysses degree " + std::to_string(ulysses_degree) + " (" + std::to_string(sp_ranks) +
            " sequence-parallel ranks" +
            (layout_of(plan).kind == LayoutKind::kRing ? ", " + s.strategy : std::string()) + ")");
  }
}

// A one-rank strategy (serial) runs on one sequence-parallel rank, and one rank runs only the
// strategies that say they can (serial, flat, pipefusion, a registered strategy).
void check_strategy_ranks(const RunPlan& plan, int sp_ranks) {
  const Config& cfg = plan.cfg;
  const dit::RunSettings& s = plan.settings;
  const dit::StrategyLayout& layout = layout_of(plan);
  const std::string one = strategy_of(plan, LayoutKind::kOne);
  if (layout.kind == LayoutKind::kOne && sp_ranks > 1)
    throw ConfigError(cfg.where("run.strategy"), "run.strategy",
                      "a parallel strategy on " + std::to_string(sp_ranks) +
                          " sequence-parallel ranks (\"" + s.strategy +
                          "\" runs on one rank: cluster.nodes = 1 with "
                          "topology.sizes = [1], or --set run.strategy=" +
                          dit::kDefaultStrategy + ")",
                      "\"" + s.strategy + "\"");
  if (sp_ranks == 1 && !layout.single_rank)
    throw ConfigError(cfg.where("run.strategy"), "run.strategy",
                      one + " or " + dit::kDefaultStrategy + " on a single rank",
                      "\"" + s.strategy + "\"");
}

// v_major.tiers names tiers of the cluster's topology.
void check_v_major_tiers(const Config& cfg, const dit::RunSettings& s, const Topology& topo) {
  for (const std::string& tier : s.strategy_options.v_major_tiers) {
    bool found = false;
    std::string list;
    for (int k = 0; k < topo.num_tiers(); ++k) {
      found = found || topo.tier_name(k) == tier;
      list += (list.empty() ? "" : ", ") + topo.tier_name(k);
    }
    if (found) continue;
    // The default names the inter-node tier: where the cluster names it otherwise, the default
    // matters only to a strategy that runs V-Major, and the key to set is v_major.tiers.
    if (!cfg.has("v_major.tiers")) {
      const std::vector<std::string> f = dit::attention_strategy_features(s.strategy);
      if (std::find(f.begin(), f.end(), "v_major") == f.end()) continue;
      throw ConfigError(cfg.where("run.strategy"), "v_major.tiers",
                        "tiers of this cluster (" + list + "; its node tier is " +
                            topo.tier_name(topo.num_tiers() - 1) +
                            ", cluster.topology.node_tier): set v_major.tiers for strategy \"" +
                            s.strategy + "\"",
                        "the default [\"" + tier + "\"]");
    }
    throw ConfigError(cfg.where("v_major.tiers"), "v_major.tiers",
                      "tiers of this cluster (" + list + ")", "\"" + tier + "\"");
  }
}

}  // namespace

RunPlan resolve_run_plan(const std::filesystem::path& config_file,
                         const std::vector<std::string>& sets,
                         std::shared_ptr<const dit::StrategyRegistry> strategies) {
  Config cfg = Config::load(config_file);
  for (const std::string& s : sets) cfg.set(s);
  return resolve_run_plan(std::move(cfg), std::move(strategies));
}

RunPlan resolve_run_plan(Config file_cfg, std::shared_ptr<const dit::StrategyRegistry> strategies) {
  RunPlan plan;
  plan.cfg = std::move(file_cfg);
  Config& cfg = plan.cfg;

  plan.model = dit::load_model_config(cfg, config_dir() / "models");
  plan.weights_seed = static_cast<std::uint64_t>(cfg.get_int("model.weights_seed", 0, 0));
  plan.cluster = load_cluster(cfg, config_dir() / "clusters");

  dit::RunSettings& s = plan.settings;
  read_image_size(cfg, s);
  read_frames(cfg, plan.model, s);
  read_steps_and_strategy(cfg, plan, std::move(strategies));
  read_strategy_options(cfg, s.strategy_options);
  read_step_cache(cfg, s.step_cache, s.steps);
  read_cfg_parallel(cfg, plan);
  const int sp_ranks = plan.ranks() / s.cfg_degree;  // ranks of one sequence-parallel group
  read_inputs(cfg, plan);
  read_engine_options(cfg, plan);
  read_memory_limit(cfg, plan);

  // Consistency between sections.
  check_image_size(cfg, plan);
  const Topology& topo = plan.cluster.topology;
  if (layout_of(plan).kind == LayoutKind::kRing &&
      s.strategy_options.usp_ring_levels >= topo.num_levels())
    throw ConfigError(cfg.where("usp.ring_levels"), "usp.ring_levels",
                      "fewer than the topology's " + std::to_string(topo.num_levels()) + " levels",
                      std::to_string(s.strategy_options.usp_ring_levels));
  const std::vector<int> ring_choices = ring_degree_choices(topo);
  const int pipefusion_ulysses = resolve_pipefusion(plan, sp_ranks);
  if (pipefusion_ulysses == 0 &&
      (cfg.has("parallel.ulysses_degree") || cfg.has("parallel.ring_degree")))
    resolve_xdit_degrees(plan, ring_choices, sp_ranks);
  const int ulysses_degree = ulysses_degree_of(plan, sp_ranks, pipefusion_ulysses);
  // PipeFusion's stages check their own Ulysses degree (dit::pipefusion_problem).
  const LayoutKind kind = layout_of(plan).kind;
  const bool ulysses_split = kind == LayoutKind::kUlysses || kind == LayoutKind::kRing;
  if (ulysses_split && plan.model.heads % ulysses_degree != 0)
    explain_uneven_heads(plan, ring_choices, sp_ranks, ulysses_degree);
  // Text sharded over the Ulysses group (xDiT): only where the Ulysses degree divides the text.
  if (s.strategy_options.shard_text)
    check_shard_text(plan, ring_choices, sp_ranks, ulysses_degree, ulysses_split);
  check_strategy_ranks(plan, sp_ranks);
  check_v_major_tiers(cfg, s, topo);
  cfg.check_no_unknown_keys();
  check_input_files(plan);
  record_derived_values(plan, ulysses_degree);
  return plan;
}

InjectedFault::InjectedFault(int rank, int step)
    : Error("injected fault at step " + std::to_string(step) + " (--inject-fault rank=" +
            std::to_string(rank) + ",step=" + std::to_string(step) + ")"),
      rank_(rank),
      step_(step) {}

FaultSpec parse_fault(const std::string& spec, const RunPlan& plan) {
  FaultSpec f{-1, -1};
  std::string rest = spec;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (key == "kind") {  // kind=throw (the default) or kind=hang
      const std::string kind = eq == std::string::npos ? "" : item.substr(eq + 1);
      if (kind != "throw" && kind != "hang") {
        std::string msg = "--inject-fault '";
        msg += spec;
        msg += "': kind must be throw or hang, found '";
        msg += kind;
        msg += "'";
        throw ConfigError(msg);
      }
      f.hang = kind == "hang";
      continue;
    }
    int value = -1;
    if (eq != std::string::npos && eq + 1 < item.size() &&
        item.find_first_not_of("0123456789", eq + 1) == std::string::npos &&
        item.size() - eq - 1 <= 9)
      value = std::stoi(item.substr(eq + 1));
    if (value < 0 || (key != "rank" && key != "step"))
      throw ConfigError("--inject-fault '" + spec +
                        "': expected rank=R,step=S with non-negative integers, e.g. rank=3,step=1");
    (key == "rank" ? f.rank : f.step) = value;
  }
  if (f.rank < 0 || f.step < 0)
    throw ConfigError("--inject-fault '" + spec + "': both rank=R and step=S are needed");
  if (f.rank >= plan.ranks())
    throw ConfigError("--inject-fault: rank " + std::to_string(f.rank) +
                      " does not exist; the run has " + std::to_string(plan.ranks()) + " ranks");
  // Steps count from 1, as the progress line ("step 1/20") counts them.
  if (f.step < 1 || f.step > plan.settings.steps)
    throw ConfigError("--inject-fault: step " + std::to_string(f.step) +
                      " does not exist; the run has " + std::to_string(plan.settings.steps) +
                      " steps (1 to " + std::to_string(plan.settings.steps) +
                      ", counted as the progress line counts them)");
  return f;
}

std::function<void(int rank, int step)> step_hook(const RunPlan& plan) {
  const std::optional<FaultSpec> fault = plan.fault;
  const bool progress = plan.progress, lines = plan.progress_lines;
  const std::string label = plan.progress_label;
  const int steps = plan.settings.steps;
  if (!fault && !progress) return {};
  // Wall-clock pace (rank 0's hook only reads it; the virtual timeline does not depend on it).
  struct Pace {
    std::chrono::steady_clock::time_point start, last;
    bool printed = false;
  };
  auto pace = std::make_shared<Pace>();
  return [fault, progress, lines, label, steps, pace](int rank, int step) {
    if (progress && rank == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (step == 0) *pace = {now, now, false};
      const double elapsed = std::chrono::duration<double>(now - pace->start).count();
      const std::string left = step > 0 ? ", about " +
                                              std::to_string(static_cast<long>(
                                                  std::lround(elapsed / step * (steps - step)))) +
                                              " s left"
                                        : std::string();
      const std::string at = "step " + std::to_string(step + 1) + "/" + std::to_string(steps) +
                             " (" + std::to_string(static_cast<long>(std::lround(elapsed))) + " s" +
                             left + ")";
      if (!lines) {  // a terminal: one line, rewritten
        std::fprintf(stderr, "\r%s%s   %s", label.c_str(), at.c_str(),
                     step + 1 == steps ? "\n" : "");
        std::fflush(stderr);
      } else if (std::chrono::duration<double>(now - pace->last).count() >= kProgressLineS ||
                 (pace->printed && step + 1 == steps)) {  // a log: a line every few seconds
        std::fprintf(stderr, "%s%s\n", label.c_str(), at.c_str());
        std::fflush(stderr);
        pace->last = now;
        pace->printed = true;
      }
    }
    // `step` counts from 0; the fault's step, as progress shows it, from 1.
    const bool faulty = fault && fault->rank == rank && fault->step == step + 1;
    if (faulty && fault->hang) {
      std::fprintf(stderr,
                   "cocodiff: rank %d: injected hang at step %d (--inject-fault kind=hang)\n", rank,
                   step + 1);
      std::fflush(stderr);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // a stopped rank
    }
    if (faulty) throw InjectedFault(rank, step + 1);
  };
}

std::string describe(const RunPlan& p, const std::string& backend,
                     const std::vector<std::string>& strategies) {
  std::ostringstream os;
  std::string strategy = "strategy " + p.settings.strategy;
  if (!strategies.empty()) {
    strategy = "strategies ";
    for (size_t i = 0; i < strategies.size(); ++i) strategy += (i ? ", " : "") + strategies[i];
  }
  if (layout_of(p).kind == LayoutKind::kStages && strategies.empty()) {
    const dit::StrategyOptions& o = p.settings.strategy_options;
    strategy += " (" + std::to_string(p.pipefusion_degree) + " stages of Ulysses degree " +
                std::to_string(p.ulysses_degree) + ", " + std::to_string(o.pipefusion_patches) +
                " patches, " + std::to_string(o.pipefusion_warmup_steps) + " warm-up steps)";
  }
  if (p.settings.cfg_degree > 1)
    strategy += " on each half of the ranks (CFG-parallel: conditional | unconditional)";
  const Topology& t = p.cluster.topology;
  os << "model      " << p.model.name << " (" << p.model.family << ", " << p.model.heads
     << " heads x " << p.model.head_dim << ", " << p.model.double_blocks << " double + "
     << p.model.single_blocks << " single blocks)\n";
  os << "run        "
     << (p.settings.resolution > 0 && p.settings.height == p.settings.width
             ? std::to_string(p.settings.resolution) + "^2 px, "
             : std::to_string(p.settings.width) + " x " + std::to_string(p.settings.height) +
                   " px (width x height), ")
     << (p.settings.frames > 1
             ? std::to_string(p.settings.frames) + " frames (" +
                   std::to_string(p.model.latent_frames(p.settings.frames)) + " latent), "
             : std::string())
     << p.tokens() << (p.settings.frames > 1 ? " video tokens, " : " image tokens, ")
     << p.settings.steps << " steps, seed " << p.settings.seed << ", math " << p.math << ", "
     << strategy << "\n";
  os << "cluster    " << p.cluster.name << ": " << t.num_nodes() << " node(s), " << t.num_ranks()
     << " ranks (";
  for (int k = t.num_levels() - 1; k >= 0; --k)
    os << t.level(k).size << " " << t.level(k).name << (k > 0 ? " x " : "");
  os << "), network " << p.cluster.network_kind << ", device " << p.cluster.device->name() << "\n";
  if (!p.attention_note.empty()) os << "attention  " << p.attention_note << "\n";
  if (backend == "mpi") {
    os << "backend    MPI: one process per rank (" << t.num_ranks()
       << "), fp32 payloads (4 bytes per element on the wire), no trace or timeline\n";
    os << "watchdog   ";
    if (p.mpi_progress_auto)
      os << "auto: a wait with no progress for the largest of " << p.mpi_progress_floor_s
         << " s and " << p.mpi_progress_multiple
         << " x the longest step ends the job, naming the stopped rank\n";
    else if (p.mpi_progress_timeout_s > 0)
      os << p.mpi_progress_timeout_s
         << " s: a wait with no progress that long ends the job, naming the stopped rank\n";
    else
      os << "off (mpi.progress_timeout_s = 0): a stopped rank leaves the job waiting\n";
  } else {
    os << "emulator   " << p.engine.workers << " worker thread(s), all-to-all "
       << p.engine.all_to_all_algorithm << ", " << p.engine.wire_bytes_per_element
       << " wire bytes per element, trace " << (p.engine.trace ? "on" : "off") << "\n";
  }
  os << "memory     " << estimate_memory(p, backend).summary() << "\n";
  return os.str();
}

}  // namespace cocodiff::apps
