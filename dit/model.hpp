#pragma once
// One transformer forward pass of a DiT family, on this rank's shard of image tokens.
//
//   std::unique_ptr<Model> m = make_model(cfg);
//   std::shared_ptr<const Weights> w = init_weights(m->tensor_specs(), seed, phantom);
//   Tensor v = m->forward(ex, *w, strategy, inputs);   // [B * local tokens, token_features]

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/tensor.hpp"
#include "dit/attention_strategy.hpp"
#include "dit/exec.hpp"
#include "dit/model_config.hpp"
#include "dit/weights.hpp"

namespace cocodiff::dit {

/// One pipeline stage's share of a forward pass (PipeFusion, dit/parallel/pipefusion.hpp):
/// blocks [first_block, last_block) of the model's sequence of transformer blocks (FLUX: the
/// double-stream blocks, then the single-stream ones).
struct StagePass {
  int first_block = 0;
  int last_block = 0;
  bool first = true;  // embeds ForwardInputs::x and the text; else starts from image and text
  bool last = true;   // returns the model's prediction; else leaves image and text for the next
  /// The hidden states between stages, borrowed: image [B * shard.count, hidden] and text
  /// [B * text tokens, hidden]. Read when not first, written when not last.
  Tensor* image = nullptr;
  Tensor* text = nullptr;
};

/// Inputs of one forward pass. Image tokens are packed latent patches in (c, py, px) order.
struct ForwardInputs {
  int batch = 1;
  const Tensor* x = nullptr;     // [B * shard.count, token_features], local image tokens
  TokenGrid grid;                // image tokens: frames x rows x columns of patches
  TokenShard shard;              // this rank's image tokens (in the grid's order)
  std::vector<float> sigmas;     // B noise levels in [0, 1]
  std::vector<float> guidance;   // B distilled-guidance values (FLUX.1-dev), else empty
  const Tensor* text = nullptr;  // [B * text tokens here, text_dim]: all of them, or text_shard's
  /// This rank's text tokens when the strategy shards the text stream (`text` holds only them,
  /// per batch element); nullopt: the text is replicated (`text` holds every token).
  std::optional<TokenShard> text_shard;
  const Tensor* pooled = nullptr;  // [B, pooled_dim] or null
  std::vector<int> class_labels;   // B labels (DiT), num_classes = the null class
  /// true: return every channel the final layer predicts (out_channels: DiT's learned sigma
  /// too); false: the latent_channels the sampler steps with.
  bool all_channels = false;
  /// A pipeline stage's blocks only (ModelFamily::stage_blocks); null: the whole model.
  const StagePass* stage = nullptr;
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return cfg_; }
  /// Every tensor by its upstream checkpoint name, with its upstream shape.
  virtual std::vector<TensorSpec> tensor_specs() const = 0;
  /// The model's prediction (flow velocity) for the local tokens: [B * shard.count, features].
  virtual Tensor forward(const Exec& ex, const Weights& w, AttentionStrategy& attn,
                         const ForwardInputs& in) const = 0;

 protected:
  explicit Model(ModelConfig cfg) : cfg_(std::move(cfg)) {}
  ModelConfig cfg_;
};

/// The model of cfg.family (its registered make function: dit/model_family.hpp).
std::unique_ptr<Model> make_model(const ModelConfig& cfg);

}  // namespace cocodiff::dit
