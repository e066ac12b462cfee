#include "dit/model_config.hpp"

#include "core/errors.hpp"

#ifndef COCODIFF_MODEL_DIR
#define COCODIFF_MODEL_DIR "configs/models"
#endif

namespace cocodiff::dit {

std::string family_name(Family f) {
  switch (f) {
    case Family::kDiT:
      return "dit";
    case Family::kSD3:
      return "sd3";
    case Family::kFlux:
      return "flux";
    case Family::kQwenImage:
      return "qwen-image";
  }
  return "?";
}

std::int64_t ModelConfig::image_tokens(int resolution) const {
  const std::int64_t side = latent_side(resolution) / patch_size;
  return side * side;
}

std::filesystem::path default_model_dir() { return COCODIFF_MODEL_DIR; }

namespace {

int get_int(const Config& cfg, const char* key, int def, int lo, int hi) {
  return static_cast<int>(cfg.get_int(key, def, lo, hi));
}

}  // namespace

ModelConfig load_model_config(Config& cfg, const std::filesystem::path& preset_dir) {
  if (cfg.has("model.preset")) {
    const std::string preset = cfg.require_string("model.preset");
    std::filesystem::path file;
    if (preset.size() > 5 && preset.substr(preset.size() - 5) == ".toml")
      file = cfg.directory() / preset;
    else
      file = preset_dir / (preset + ".toml");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec))
      throw ConfigError(cfg.where("model.preset"), "model.preset",
                        "a model preset name (a file " + (preset_dir / "<name>.toml").string() +
                            ") or a path to a .toml file",
                        "\"" + preset + "\" (no file " + file.string() + ")");
    cfg.merge_under("model", Config::load(file));
  }
  ModelConfig m;
  m.name = cfg.get_string("model.name", "custom");
  const std::string family =
      cfg.get_choice("model.family", "flux", {"dit", "sd3", "flux", "qwen-image"});
  m.family = family == "dit"    ? Family::kDiT
             : family == "sd3"  ? Family::kSD3
             : family == "flux" ? Family::kFlux
                                : Family::kQwenImage;
  m.heads = get_int(cfg, "model.heads", m.heads, 1, 1024);
  m.head_dim = get_int(cfg, "model.head_dim", m.head_dim, 2, 1024);
  if (m.head_dim % 2 != 0)
    throw ConfigError(cfg.where("model.head_dim"), "model.head_dim", "an even number",
                      std::to_string(m.head_dim));
  m.double_blocks = get_int(cfg, "model.double_blocks", m.double_blocks, 0, 1000);
  m.single_blocks = get_int(cfg, "model.single_blocks", 0, 0, 1000);
  m.dual_attention_blocks = get_int(cfg, "model.dual_attention_blocks", 0, 0, m.double_blocks);
  m.mlp_ratio = cfg.get_double("model.mlp_ratio", m.mlp_ratio, 0.25, 64);
  m.latent_channels = get_int(cfg, "model.latent_channels", m.latent_channels, 1, 1024);
  m.out_channels = get_int(cfg, "model.out_channels", m.latent_channels, m.latent_channels, 4096);
  m.patch_size = get_int(cfg, "model.patch_size", m.patch_size, 1, 16);
  m.vae_scale = get_int(cfg, "model.vae_scale", m.vae_scale, 1, 64);
  m.text_tokens = get_int(cfg, "model.text_tokens", m.family == Family::kDiT ? 0 : 512, 0, 1 << 20);
  m.text_dim = get_int(cfg, "model.text_dim", m.text_dim, 1, 1 << 20);
  m.pooled_dim = get_int(cfg, "model.pooled_dim", m.family == Family::kFlux ? 768 : 0, 0, 1 << 20);
  m.num_classes =
      get_int(cfg, "model.num_classes", m.family == Family::kDiT ? 1000 : 0, 0, 1 << 24);
  m.guidance_embed = cfg.get_bool("model.guidance_embed", false);
  m.timestep_dim = get_int(cfg, "model.timestep_dim", m.timestep_dim, 2, 1 << 16);
  for (std::int64_t a : cfg.get_int_list("model.rope_axes", {})) {
    if (a <= 0 || a % 2 != 0)
      throw ConfigError(cfg.where("model.rope_axes"), "model.rope_axes",
                        "positive even axis widths", std::to_string(a));
    m.rope_axes.push_back(static_cast<int>(a));
  }
  if (!m.rope_axes.empty()) {
    int sum = 0;
    for (int a : m.rope_axes) sum += a;
    if (sum != m.head_dim)
      throw ConfigError(cfg.where("model.rope_axes"), "model.rope_axes",
                        "axis widths summing to model.head_dim = " + std::to_string(m.head_dim),
                        "a sum of " + std::to_string(sum));
  }
  m.rope_theta = cfg.get_double("model.rope_theta", m.rope_theta, 1.0, 1e9);
  m.pos_embed_max_size = get_int(cfg, "model.pos_embed_max_size", 0, 0, 1 << 16);
  m.pos_embed_base_size = get_int(cfg, "model.pos_embed_base_size", 0, 0, 1 << 16);
  m.qk_norm = cfg.get_bool("model.qk_norm", m.family != Family::kDiT);
  m.norm_eps = static_cast<float>(cfg.get_double("model.norm_eps", 1e-6, 1e-12, 1.0));
  m.default_steps = get_int(cfg, "model.steps", m.default_steps, 1, 10000);
  const std::string cfg_mode = cfg.get_choice("model.cfg", "none", {"none", "batch", "true"});
  m.cfg_mode = cfg_mode == "none"    ? CfgMode::kNone
               : cfg_mode == "batch" ? CfgMode::kBatch
                                     : CfgMode::kTrue;
  m.cfg_scale = cfg.get_double("model.cfg_scale", 1.0, 0.0, 100.0);
  m.shift = cfg.get_double("model.shift", 1.0, 1e-3, 1e3);
  m.dynamic_shift = cfg.get_bool("model.dynamic_shift", false);
  m.base_shift = cfg.get_double("model.base_shift", m.base_shift, -10, 10);
  m.max_shift = cfg.get_double("model.max_shift", m.max_shift, -10, 10);
  m.base_seq_len = get_int(cfg, "model.base_seq_len", m.base_seq_len, 1, 1 << 24);
  m.max_seq_len = get_int(cfg, "model.max_seq_len", m.max_seq_len, m.base_seq_len + 1, 1 << 24);
  m.timestep_scale = cfg.get_double("model.timestep_scale", 1000.0, 1e-6, 1e6);

  // Structural checks that involve several keys.
  if (m.family == Family::kDiT && m.num_classes < 1)
    throw ConfigError(cfg.where("model.num_classes"), "model.num_classes",
                      "at least 1 class for a DiT model", std::to_string(m.num_classes));
  if (m.family != Family::kDiT && m.text_tokens < 1)
    throw ConfigError(cfg.where("model.text_tokens"), "model.text_tokens",
                      "at least 1 text token for family " + family, std::to_string(m.text_tokens));
  if ((m.family == Family::kFlux || m.family == Family::kQwenImage) && m.rope_axes.size() != 3)
    throw ConfigError(cfg.where("model.rope_axes"), "model.rope_axes",
                      "3 RoPE axis widths (frame, row, column) for family " + family,
                      std::to_string(m.rope_axes.size()) + " axes");
  if (m.dual_attention_blocks > 0 && m.family != Family::kSD3)
    throw ConfigError(cfg.where("model.dual_attention_blocks"), "model.dual_attention_blocks",
                      "0 (only the sd3 family has dual attention)",
                      std::to_string(m.dual_attention_blocks));
  if (m.family == Family::kSD3 && m.pooled_dim < 1)
    throw ConfigError(cfg.where("model.pooled_dim"), "model.pooled_dim",
                      "a pooled text width for family sd3", std::to_string(m.pooled_dim));
  if (m.family == Family::kDiT && (m.hidden() % 4 != 0))
    throw ConfigError(cfg.where("model.head_dim"), "model.heads * model.head_dim",
                      "a multiple of 4 (2-D sin-cos position embedding)",
                      std::to_string(m.hidden()));
  return m;
}

ModelConfig load_model_preset(const std::string& name, const std::filesystem::path& preset_dir) {
  Config cfg = Config::parse("[model]\npreset = \"" + name + "\"\n", "<preset " + name + ">");
  return load_model_config(cfg, preset_dir);
}

}  // namespace cocodiff::dit
