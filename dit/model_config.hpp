#pragma once
// What a DiT model is: its family and shapes, read from the `[model]` section of a run config.
// `model.preset = "flux1-dev"` pulls configs/models/flux1-dev.toml under `[model]`; keys set in
// the run config or with --set win over the preset's.
//
//   Config cfg = Config::load("run.toml");          // [model] preset = "flux1-tiny"
//   cfg.set("model.double_blocks=2");
//   ModelConfig m = load_model_config(cfg);          // ConfigError names file:line:key

#include <filesystem>
#include <string>
#include <vector>

#include "core/config.hpp"

namespace cocodiff::dit {

/// How the sampler applies classifier-free guidance.
enum class CfgMode {
  kNone,   // one forward per step (FLUX.1-dev: guidance-distilled, guidance is an input)
  kBatch,  // conditional and unconditional as a batch of 2 in one forward (SD3.5, DiT)
  kTrue,   // two separate forwards, combined with norm rescaling (Qwen-Image true CFG)
};

struct ModelConfig {
  std::string name;             // model.name, e.g. "flux1-dev"
  std::string family = "flux";  // a registered family (dit/model_family.hpp)
  // Transformer shapes.
  int heads = 24;
  int head_dim = 128;
  int hidden() const { return heads * head_dim; }
  /// Attention layers of one forward (every block kind attends once).
  int attention_layers() const { return double_blocks + single_blocks + dual_attention_blocks; }
  int double_blocks = 19;         // DiT blocks, SD3 joint blocks, FLUX double, Qwen blocks
  int single_blocks = 0;          // FLUX single-stream blocks
  int dual_attention_blocks = 0;  // SD3.5 Medium: blocks [0, n) add an image-only attention
  double mlp_ratio = 4.0;
  // Latent and patches.
  int latent_channels = 16;  // VAE latent channels
  int out_channels = 16;     // channels the model predicts (DiT learn_sigma: 8)
  int patch_size = 2;
  int vae_scale = 8;           // pixels per latent cell
  int vae_temporal_scale = 1;  // video frames per latent frame after the first (Wan-VAE: 4)
  bool pixel_space = false;    // the latent is the image: 1 (gray) or 3 (RGB) channels in [-1, 1]
  // Conditioning.
  int text_tokens = 512;
  int text_dim = 4096;               // text encoder width (joint_attention_dim)
  int pooled_dim = 768;              // pooled text embedding width (0: none)
  int num_classes = 0;               // class labels (a null class is added for CFG); FLUX: learned
                                     // class tokens (class_embedding.*) replace the text embeddings
  std::vector<std::string> motions;  // a video model's motions: its num_classes conditions are
                                     // (motion, class) pairs, row motion * classes() + class
  bool guidance_embed = false;       // FLUX.1-dev distilled guidance input
  int timestep_dim = 256;            // sinusoidal embedding width
  // Positions.
  std::vector<int> rope_axes;  // empty: no RoPE
  double rope_theta = 10000.0;
  int pos_embed_max_size = 0;   // SD3 sin-cos crop grid (0: grid of the image itself)
  int pos_embed_base_size = 0;  // SD3 base_size = sample_size / patch_size
  bool qk_norm = true;
  float norm_eps = 1e-6f;
  // Sampler defaults.
  int default_steps = 28;
  CfgMode cfg_mode = CfgMode::kNone;
  double cfg_scale = 1.0;      // CFG scale, or FLUX distilled guidance value
  bool cfg_rescale = true;     // true CFG: rescale to the conditional norm (Qwen-Image; Wan: no)
  double shift = 1.0;          // static sigma shift (SD3: 3.0)
  bool dynamic_shift = false;  // resolution-dependent shift (FLUX, Qwen-Image)
  double base_shift = 0.5, max_shift = 1.15;
  int base_seq_len = 256, max_seq_len = 4096;
  double timestep_scale = 1000.0;  // model timestep = sigma * scale

  /// Image tokens of one sample at `resolution` pixels per side.
  std::int64_t image_tokens(int resolution) const;
  /// Image tokens of one height x width (pixels) sample.
  std::int64_t image_tokens(int height, int width) const;
  /// Latent frames of `frames` video frames (the VAE keeps the first and compresses the rest).
  /// Item classes of a model conditioned on (motion, class) pairs; num_classes otherwise.
  int classes() const {
    return motions.empty() ? num_classes : num_classes / static_cast<int>(motions.size());
  }
  int latent_frames(int frames) const { return (frames - 1) / vae_temporal_scale + 1; }
  /// Latent cells per side at `resolution`.
  int latent_side(int resolution) const { return resolution / vae_scale; }
  /// Features of one packed latent token (latent_channels * patch^2).
  int token_features() const { return latent_channels * patch_size * patch_size; }
};

/// The source tree's configs/models directory (compiled in).
std::filesystem::path default_model_dir();

/// Reads `[model]`. When `model.preset` is set, the preset file is merged under `[model]` first
/// (keys already in `cfg` win). A preset is a name (`preset_dir/<name>.toml`) or a path ending
/// in .toml (relative to the run config's directory). Every value is range-checked; errors are
/// ConfigError naming file:line and key.
ModelConfig load_model_config(Config& cfg,
                              const std::filesystem::path& preset_dir = default_model_dir());
/// Loads `preset_dir/<name>.toml` alone as a model config (tests, benchmarks).
ModelConfig load_model_preset(const std::string& name,
                              const std::filesystem::path& preset_dir = default_model_dir());

}  // namespace cocodiff::dit
