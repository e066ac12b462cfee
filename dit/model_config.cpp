#include "dit/model_config.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "dit/model_family.hpp"

#ifndef COCODIFF_MODEL_DIR
#define COCODIFF_MODEL_DIR "configs/models"
#endif

namespace cocodiff::dit {

std::int64_t ModelConfig::image_tokens(int height, int width) const {
  return std::int64_t{latent_side(height) / patch_size} * (latent_side(width) / patch_size);
}

std::int64_t ModelConfig::image_tokens(int resolution) const {
  const std::int64_t side = latent_side(resolution) / patch_size;
  return side * side;
}

std::filesystem::path default_model_dir() { return COCODIFF_MODEL_DIR; }

namespace {

// Reads `model.<key>` from the run config when it sets the key, else from the preset file
// (so errors name the file and line the value came from), marking it used in the run config.
class Reader {
 public:
  Reader(const Config& run, const Config* preset) : run_(run), preset_(preset) {}
  bool has(const std::string& key) const { return pick(key).has(name(key)); }
  std::string where(const std::string& key) const { return pick(key).where(name(key)); }
  int get_int(const std::string& key, int def, int lo, int hi) const {
    return static_cast<int>(pick(key).get_int(name(key), def, lo, hi));
  }
  double get_double(const std::string& key, double def, double lo, double hi) const {
    return pick(key).get_double(name(key), def, lo, hi);
  }
  bool get_bool(const std::string& key, bool def) const {
    return pick(key).get_bool(name(key), def);
  }
  std::string get_string(const std::string& key, std::string def) const {
    return pick(key).get_string(name(key), std::move(def));
  }
  std::string get_choice(const std::string& key, std::string def,
                         std::initializer_list<std::string_view> choices) const {
    return pick(key).get_choice(name(key), std::move(def), choices);
  }
  std::string get_choice(const std::string& key, std::string def,
                         std::span<const std::string> choices) const {
    return pick(key).get_choice(name(key), std::move(def), choices);
  }
  std::vector<std::int64_t> get_int_list(const std::string& key) const {
    return pick(key).get_int_list(name(key), {});
  }
  std::vector<std::string> get_string_list(const std::string& key) const {
    return pick(key).get_string_list(name(key), {});
  }

 private:
  bool from_preset(const std::string& key) const {
    return preset_ != nullptr && !run_.has("model." + key) && preset_->has(key);
  }
  const Config& pick(const std::string& key) const {
    run_.mark_used("model." + key);
    return from_preset(key) ? *preset_ : run_;
  }
  std::string name(const std::string& key) const { return from_preset(key) ? key : "model." + key; }
  const Config& run_;
  const Config* preset_;
};

// The stems of the .toml files in `dir`, sorted (none when it cannot be read).
std::vector<std::string> preset_names(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".toml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The preset file model.preset names, loaded (none when the key is unset).
std::optional<Config> load_preset(const Config& cfg, const std::filesystem::path& preset_dir) {
  std::optional<Config> preset;
  if (!cfg.has("model.preset")) return preset;
  const std::string name = cfg.require_string("model.preset");
  std::filesystem::path file;
  if (name.size() > 5 && name.substr(name.size() - 5) == ".toml")
    file = cfg.directory() / name;
  else
    file = preset_dir / (name + ".toml");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    const std::vector<std::string> known = preset_names(preset_dir);
    const std::string best = closest_match(name, known);
    throw ConfigError(cfg.where("model.preset"), "model.preset",
                      "a model preset name (a file " + (preset_dir / "<name>.toml").string() +
                          ") or a path to a .toml file",
                      "\"" + name + "\" (no file " + file.string() + ")" +
                          (best.empty() ? "" : "; did you mean '" + best + "'?"));
  }
  preset = Config::load(file);
  preset->mark_used("preset");
  return preset;
}

// Throws for a config with neither model.preset nor model.family, listing the presets.
[[noreturn]] void no_model(const Config& cfg, const std::filesystem::path& preset_dir) {
  // Neither a preset nor the start of a custom model: say so, rather than failing later on
  // whichever default of the custom path happens to be checked first.
  const std::vector<std::string> names = preset_names(preset_dir);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError(cfg.where(cfg.has("model") ? "model" : ""), "model.preset",
                    "a model preset" + (list.empty() ? "" : " (" + list + ")") +
                        ", or a custom model described from model.family on",
                    cfg.has("model") ? "a [model] table with neither" : "no [model] table");
}

// Reads the transformer's shapes and the latent's patches (the keys after model.family).
void read_shapes(const Reader& cfg_reader, ModelConfig& m) {
  m.heads = cfg_reader.get_int("heads", m.heads, 1, 1024);
  m.head_dim = cfg_reader.get_int("head_dim", m.head_dim, 2, 1024);
  if (m.head_dim % 2 != 0)
    throw ConfigError(cfg_reader.where("head_dim"), "model.head_dim", "an even number",
                      std::to_string(m.head_dim));
  m.double_blocks = cfg_reader.get_int("double_blocks", m.double_blocks, 0, 1000);
  m.single_blocks = cfg_reader.get_int("single_blocks", 0, 0, 1000);
  m.dual_attention_blocks = cfg_reader.get_int("dual_attention_blocks", 0, 0, m.double_blocks);
  m.mlp_ratio = cfg_reader.get_double("mlp_ratio", m.mlp_ratio, 0.25, 64);
  m.latent_channels = cfg_reader.get_int("latent_channels", m.latent_channels, 1, 1024);
  m.out_channels = cfg_reader.get_int("out_channels", m.latent_channels, m.latent_channels, 4096);
  m.patch_size = cfg_reader.get_int("patch_size", m.patch_size, 1, 16);
  m.vae_scale = cfg_reader.get_int("vae_scale", m.vae_scale, 1, 64);
  m.vae_temporal_scale = cfg_reader.get_int("vae_temporal_scale", 1, 1, 64);
}

// Reads the conditioning: text and pooled embeddings, classes and motions, guidance input.
void read_conditioning(const Reader& cfg_reader, const ModelFamily& fam, ModelConfig& m) {
  m.text_tokens = cfg_reader.get_int("text_tokens", fam.default_text_tokens, 0, 1 << 20);
  m.text_dim = cfg_reader.get_int("text_dim", m.text_dim, 1, 1 << 20);
  m.pooled_dim = cfg_reader.get_int("pooled_dim", fam.default_pooled_dim, 0, 1 << 20);
  m.num_classes = cfg_reader.get_int("num_classes", fam.default_num_classes, 0, 1 << 24);
  m.motions = cfg_reader.get_string_list("motions");
  if (!m.motions.empty() &&
      (m.num_classes == 0 || m.num_classes % static_cast<int>(m.motions.size()) != 0))
    throw ConfigError(cfg_reader.where("motions"), "model.motions",
                      "motions that divide model.num_classes (" + std::to_string(m.num_classes) +
                          " conditions: motion x class)",
                      std::to_string(m.motions.size()) + " motions");
  m.guidance_embed = cfg_reader.get_bool("guidance_embed", false);
  m.pixel_space = cfg_reader.get_bool("pixel_space", false);
  m.timestep_dim = cfg_reader.get_int("timestep_dim", m.timestep_dim, 2, 1 << 16);
}

// Reads the positions (RoPE axes and theta, SD3's sin-cos grid) and the norms.
void read_positions(const Reader& cfg_reader, const ModelFamily& fam, ModelConfig& m) {
  for (std::int64_t a : cfg_reader.get_int_list("rope_axes")) {
    if (a <= 0 || a % 2 != 0)
      throw ConfigError(cfg_reader.where("rope_axes"), "model.rope_axes",
                        "positive even axis widths", std::to_string(a));
    m.rope_axes.push_back(static_cast<int>(a));
  }
  if (!m.rope_axes.empty()) {
    int sum = 0;
    for (int a : m.rope_axes) sum += a;
    if (sum != m.head_dim)
      throw ConfigError(cfg_reader.where("rope_axes"), "model.rope_axes",
                        "axis widths summing to model.head_dim = " + std::to_string(m.head_dim),
                        "a sum of " + std::to_string(sum));
  }
  m.rope_theta = cfg_reader.get_double("rope_theta", m.rope_theta, 1.0, 1e9);
  m.pos_embed_max_size = cfg_reader.get_int("pos_embed_max_size", 0, 0, 1 << 16);
  m.pos_embed_base_size = cfg_reader.get_int("pos_embed_base_size", 0, 0, 1 << 16);
  m.qk_norm = cfg_reader.get_bool("qk_norm", fam.default_qk_norm);
  m.norm_eps = static_cast<float>(cfg_reader.get_double("norm_eps", 1e-6, 1e-12, 1.0));
}

// Reads the sampler's defaults: steps, guidance, the sigma shift and the timestep scale.
void read_sampler(const Config& cfg, const Reader& cfg_reader, ModelConfig& m) {
  m.default_steps = cfg_reader.get_int("steps", m.default_steps, 1, 10000);
  const std::string cfg_mode = cfg_reader.get_choice("cfg", "none", {"none", "batch", "true"});
  m.cfg_mode = cfg_mode == "none"    ? CfgMode::kNone
               : cfg_mode == "batch" ? CfgMode::kBatch
                                     : CfgMode::kTrue;
  m.cfg_scale = cfg_reader.get_double("cfg_scale", 1.0, 0.0, 100.0);
  m.cfg_rescale = cfg_reader.get_bool("cfg_rescale", true);
  m.shift = cfg_reader.get_double("shift", 1.0, 1e-3, 1e3);
  m.dynamic_shift = cfg_reader.get_bool("dynamic_shift", false);
  m.base_shift = cfg_reader.get_double("base_shift", m.base_shift, -10, 10);
  m.max_shift = cfg_reader.get_double("max_shift", m.max_shift, -10, 10);
  m.base_seq_len = cfg_reader.get_int("base_seq_len", m.base_seq_len, 1, 1 << 24);
  m.max_seq_len = cfg_reader.get_int("max_seq_len", m.max_seq_len, 2, 1 << 24);
  if (m.max_seq_len <= m.base_seq_len) {
    // Blame the key that was set: a base above the preset's max is the base's fault.
    const bool max_set = cfg.has("model.max_seq_len");
    const std::string key = max_set ? "max_seq_len" : "base_seq_len";
    throw ConfigError(cfg_reader.where(key), "model." + key,
                      max_set ? "above model.base_seq_len (" + std::to_string(m.base_seq_len) + ")"
                              : "below model.max_seq_len (" + std::to_string(m.max_seq_len) + ")",
                      std::to_string(max_set ? m.max_seq_len : m.base_seq_len));
  }
  m.timestep_scale = cfg_reader.get_double("timestep_scale", 1000.0, 1e-6, 1e6);
}

// Structural checks that involve several keys, then the family's own check.
void check_structure(const Reader& cfg_reader, const ModelFamily& fam, const ModelConfig& m) {
  if (m.pixel_space && m.latent_channels != 1 && m.latent_channels != 3)
    throw ConfigError(cfg_reader.where("latent_channels"), "model.latent_channels",
                      "1 (gray) or 3 (RGB) channels for a pixel-space model",
                      std::to_string(m.latent_channels));
  if (!fam.text_conditioned && m.num_classes < 1)
    throw ConfigError(cfg_reader.where("num_classes"), "model.num_classes",
                      "at least 1 class for family " + m.family, std::to_string(m.num_classes));
  if (fam.text_conditioned && m.text_tokens < 1)
    throw ConfigError(cfg_reader.where("text_tokens"), "model.text_tokens",
                      "at least 1 text token for family " + m.family,
                      std::to_string(m.text_tokens));
  if (m.double_blocks + m.single_blocks == 0) {
    const std::string key = "double_blocks";
    throw ConfigError(cfg_reader.where(key), "model." + key,
                      "at least one transformer block (model.double_blocks + model.single_blocks "
                      ">= 1): a model of no blocks computes nothing to time",
                      "0 blocks");
  }
  if (m.dual_attention_blocks > 0 && !fam.dual_attention)
    throw ConfigError(cfg_reader.where("dual_attention_blocks"), "model.dual_attention_blocks",
                      "0 (family " + m.family + " has no dual attention)",
                      std::to_string(m.dual_attention_blocks));
  if (fam.check)
    if (const std::optional<ModelConfigProblem> bad = fam.check(m))
      throw ConfigError(cfg_reader.where(bad->at.empty() ? bad->key : bad->at), "model." + bad->key,
                        bad->expected, bad->found);
}

}  // namespace

ModelConfig load_model_config(Config& cfg, const std::filesystem::path& preset_dir) {
  std::optional<Config> preset = load_preset(cfg, preset_dir);
  if (!preset && !cfg.has("model.family")) no_model(cfg, preset_dir);
  const Reader cfg_reader(cfg, preset ? &*preset : nullptr);
  ModelConfig m;
  m.name = cfg_reader.get_string("name", "custom");
  const std::vector<std::string> families = model_family_names();
  m.family = cfg_reader.get_choice("family", "flux", families);
  const ModelFamily& fam = model_family(m.family);
  read_shapes(cfg_reader, m);
  read_conditioning(cfg_reader, fam, m);
  read_positions(cfg_reader, fam, m);
  read_sampler(cfg, cfg_reader, m);
  check_structure(cfg_reader, fam, m);
  if (preset) {
    cfg.merge_under("model", *preset);  // the resolved config shows every value
    cfg.adopt_effective("model", *preset);
  }
  return m;
}

ModelConfig load_model_preset(const std::string& name, const std::filesystem::path& preset_dir) {
  Config cfg = Config::parse("[model]\npreset = \"" + name + "\"\n", "<preset " + name + ">");
  return load_model_config(cfg, preset_dir);
}

}  // namespace cocodiff::dit
