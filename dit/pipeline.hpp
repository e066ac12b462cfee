#pragma once
// The DiT entry points other modules call: weights once, then generate() on every rank.
//
//   ModelConfig mc = load_model_config(cfg);
//   std::shared_ptr<const Weights> w = make_weights(mc, seed, phantom);   // once, shared
//   engine.run([&](Communicator& comm) {
//     RunOutput out = generate(comm, mc, *w, {.resolution = 256, .steps = 4, .seed = 1});
//     // out.latent: [C, H*W] full final latent on every rank
//   });

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/tensor.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/model.hpp"
#include "dit/model_config.hpp"
#include "dit/parallel/strategies.hpp"
#include "dit/step_cache.hpp"
#include "dit/weights.hpp"

namespace cocodiff::dit {

struct RunSettings {
  int resolution = 1024;      // pixels per side (a multiple of vae_scale * patch_size)
  int height = 0, width = 0;  // pixels of a non-square image; 0: resolution
  int pixel_height() const { return height > 0 ? height : resolution; }
  int pixel_width() const { return width > 0 ? width : resolution; }
  /// Video frames in pixel space (1: an image). The model's VAE keeps the first frame and
  /// compresses the rest by ModelConfig::vae_temporal_scale: F frames are
  /// (F - 1) / scale + 1 latent frames, F - 1 a multiple of the scale.
  int frames = 1;
  int steps = 0;                     // denoising steps; 0 = the model's default
  std::uint64_t seed = 0;            // noise and text embeddings (weights have their own seed)
  bool phantom = false;              // math = "skip": shapes and costs only
  std::string strategy = "flat";     // attention strategy (dit/parallel/strategies.hpp)
  StrategyOptions strategy_options;  // [pipeline], [v_major], [usp] settings
  StepCacheOptions step_cache;       // [step_cache]: skip steps whose blocks would change little
  double cfg_scale = -1;             // < 0: the model's default (CFG scale or FLUX guidance)
  /// CFG-parallel (xDiT's cfg degree): 2 runs the conditional pass on the first half of the
  /// ranks and the unconditional one on the second half, each half sequence-parallel on its own,
  /// exchanging their outputs once per step. Needs classifier-free guidance and a strategy that
  /// runs on a group (not usp, whose ring spans the whole cluster).
  int cfg_degree = 1;
  int class_label = 0;  // DiT class
  /// Inpainting: latent [C, F*H*W] to keep where mask is 0, and mask [1, F*H*W] (1 =
  /// generate), both at latent resolution (F latent frames; images: 1). Either both or neither.
  std::optional<Tensor> known_latent;
  std::optional<Tensor> mask;
  /// Start from this latent [C, F*H*W] instead of seeded noise (the noise is still drawn for
  /// inpainting's re-noising).
  std::optional<Tensor> initial_latent;
  /// Called on every rank at the start of each denoising step with (comm rank, step index):
  /// progress reports, fault injection. May throw; the exception ends the run on that rank.
  std::function<void(int rank, int step)> on_step;
  /// Called after on_step with this rank's clock (virtual on the emulator, wall on MPI) at the
  /// start of each step: a caller may stop a run whose time already says enough (cocodiff tune).
  std::function<void(int rank, int step, SimTime now)> on_step_clock;
  /// A strategy of your own instead of `strategy` (research code, tests): called once per rank
  /// with that rank's communicator. Null: make_attention_strategy(strategy, ...).
  std::function<std::unique_ptr<AttentionStrategy>(Communicator&, const ModelConfig&)>
      make_strategy;
  /// Strategies registered by the program; `strategy` may name one of them (shared, read-only).
  std::shared_ptr<const StrategyRegistry> strategies;
};

struct RunOutput {
  Tensor latent;            // [C, F*H*W] final latent, all tokens, on every rank (phantom: shape)
  int latent_frames = 1;    // F (images: 1)
  int latent_height = 0;    // H
  int latent_width = 0;     // W
  std::int64_t tokens = 0;  // image tokens per sample
  std::int64_t local_tokens = 0;  // this rank's share
  int steps = 0;
  int forwards = 0;              // transformer passes (true CFG: 2 per step)
  int batch = 1;                 // sequences per forward (batch CFG: 2)
  std::vector<double> sigmas;    // steps + 1 values
  StrategyStats strategy_stats;  // what the attention strategy measured on this rank
  StepCacheStats step_cache;     // which steps the step cache skipped (the same on every rank)
};

/// Seeded random weights for the model; no data when phantom. Call once, outside the ranks.
std::shared_ptr<const Weights> make_weights(const ModelConfig& cfg, std::uint64_t seed,
                                            bool phantom);
/// Weights from a safetensors checkpoint with the upstream names (InputError on a mismatch).
std::shared_ptr<const Weights> load_weights(const ModelConfig& cfg,
                                            const std::filesystem::path& checkpoint);

/// The conditioning of one prompt, made from the seed (text encoders are out of scope):
/// text [text_tokens, text_dim], pooled [1, pooled_dim] (or empty). `negative` gives the
/// unconditional / negative prompt's embeddings.
struct TextConditioning {
  Tensor text;
  Tensor pooled;
};
TextConditioning make_text_conditioning(const ModelConfig& cfg, std::uint64_t seed, bool negative,
                                        bool phantom);

/// The learned class tokens of a class-conditioned FLUX model (class_embedding.* rows of
/// `label`; label num_classes is the null class): text [text_tokens, text_dim], pooled [1, P].
TextConditioning class_conditioning(const ModelConfig& cfg, const Weights& w, int label,
                                    bool phantom);

/// One transformer pass on this rank's tokens with the named strategy over `comm`.
/// Collective over `comm`. Returns [B * in.shard.count, token_features].
Tensor forward(Communicator& comm, const ModelConfig& cfg, const Weights& w,
               const std::string& strategy, const ForwardInputs& in, bool phantom);

/// Writes out.latent as safetensors tensor "latent" [C, H, W] (fp32; video [C, F, H, W]),
/// atomically.
void write_latent_safetensors(const std::filesystem::path& path, const RunOutput& out);

/// The full sampling loop on every rank of `comm` (collective). Image tokens are sharded over
/// the ranks; the final latent is gathered to all of them.
RunOutput generate(Communicator& comm, const ModelConfig& cfg, const Weights& w,
                   const RunSettings& settings);

}  // namespace cocodiff::dit
