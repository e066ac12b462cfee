#pragma once
// Building blocks shared by the model families: spec builders, named projections, the
// Q/K/V source every attention layer hands to its AttentionStrategy, and the MMDiT joint block
// (SD3, FLUX double-stream, Qwen-Image), whose tensor names differ only in a few prefixes.

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "dit/attention_strategy.hpp"
#include "dit/layers.hpp"
#include "dit/model.hpp"
#include "dit/weights.hpp"

namespace cocodiff::dit::models {

/// Collects TensorSpecs with upstream names.
class SpecBuilder {
 public:
  /// name.weight [out, in] (+ name.bias [out]).
  void linear(const std::string& name, std::int64_t out, std::int64_t in, bool bias = true);
  /// A conv patch embedding name.weight [out, in, p, p] + name.bias [out].
  void conv(const std::string& name, std::int64_t out, std::int64_t in, std::int64_t p);
  /// Any tensor: its upstream name, shape and initialisation.
  void tensor(const std::string& name, std::vector<std::int64_t> shape, InitKind init);
  /// name.weight [dim] (RMSNorm scale).
  void norm(const std::string& name, std::int64_t dim);
  void embedding(const std::string& name, std::int64_t rows, std::int64_t cols);
  std::vector<TensorSpec> take() { return std::move(specs_); }

 private:
  std::vector<TensorSpec> specs_;
};

/// Real math: throws NumericError when one of `outputs` holds a NaN or an infinity, naming
/// `layer` (an upstream weight prefix such as "norm_out", or "transformer_blocks.3" for layer
/// "transformer_blocks" and index 3) as the first layer whose output is not finite. Called
/// after each layer group, so the first call that throws names it. Phantom: nothing. Costs one
/// pass over the tensors.
void check_finite(const Exec& ex, std::string_view layer,
                  std::initializer_list<const Tensor*> outputs, int index = -1);

/// y = x W^T + b with W = w[prefix.weight], b = w[prefix.bias] when the model has one.
Tensor dense(const Exec& ex, const Weights& w, const std::string& prefix, const Tensor& x,
             std::string_view label, RowRange rows = {});

/// y = fc2(gelu_tanh(fc1(x))).   x: [N, D] -> [N, D].
Tensor mlp_gelu(const Exec& ex, const Weights& w, const std::string& fc1, const std::string& fc2,
                const Tensor& x);

/// y = lin2(silu(lin1(x))): timestep / text projection embedders.   x: [B, in] -> [B, D].
Tensor embed_mlp(const Exec& ex, const Weights& w, const std::string& lin1, const std::string& lin2,
                 const Tensor& x);

/// adaLN modulation: linear(silu(c)) split in n vectors of [B, D] (silu(c) passed in).
std::vector<Tensor> modulation(const Exec& ex, const Weights& w, const std::string& prefix,
                               const Tensor& c_silu, int n);

/// TeaCache's indicator (dit/step_cache.hpp): the first block's norm1 output, LN(x) * (1 +
/// scale) + shift with (shift, scale) the first two of the `chunks` vectors of modulation
/// `prefix`.
Tensor first_block_modulated_input(const Exec& ex, const Weights& w, const std::string& prefix,
                                   const Tensor& c_silu, int chunks, const Tensor& x, int batch,
                                   float eps);

/// Per-token layer norm followed by x * (1 + scale) + shift.
Tensor norm_modulate(const Exec& ex, const Tensor& x, const Tensor& shift, const Tensor& scale,
                     int batch, float eps, std::string_view label);

/// One token stream of an attention layer: its input, its Q/K/V weights, and its Q/K prep.
struct StreamQkv {
  const Tensor* x = nullptr;  // [B * local tokens, D], normalised and modulated
  bool sharded = false;  // image tokens (sharded), text tokens (replicated, or sharded: text_shard)
  bool text = false;     // a text stream
  std::int64_t total_tokens = 0;                     // per batch element, all shards
  const Tensor* w[3] = {nullptr, nullptr, nullptr};  // q, k, v weights (may be one fused qkv)
  const Tensor* b[3] = {nullptr, nullptr, nullptr};
  std::int64_t row_offset[3] = {0, 0, 0};      // a fused qkv weight's row offset of q, k, v
  const Tensor* norm[2] = {nullptr, nullptr};  // per-head RMSNorm of q and k, or null
  /// Projections made before the strategy runs, [rows, heads * head_dim] (Wan normalises Q and
  /// K across all heads of a token, which a head range cannot do): project() hands out their
  /// columns, and `w`, `b` and `norm` are unused. Null: projected from `x` as asked.
  const Tensor* projected[3] = {nullptr, nullptr, nullptr};
  /// How the reference runs that norm: torch.nn.RMSNorm (FLUX.1, FLUX.2) or diffusers' own
  /// RMSNorm (SD3.5, Qwen-Image), for the device's grids.
  KernelClass norm_kernel = KernelClass::kRmsNorm;
  const RopeTable* rope = nullptr;  // RoPE of the local tokens, or null
  bool wants_output = true;         // false: attention output unused (SD3 last text)
};

/// The QkvSource of the models: projections with head-sliced weight rows.
class ModelQkv final : public QkvSource {
 public:
  ModelQkv(std::vector<StreamQkv> streams, int head_dim, int batch, float eps)
      : streams_(std::move(streams)), head_dim_(head_dim), batch_(batch), eps_(eps) {}
  int num_streams() const override { return static_cast<int>(streams_.size()); }
  bool sharded(int s) const override { return at(s).sharded; }
  bool text(int s) const override { return at(s).text; }
  std::int64_t total_tokens(int s) const override { return at(s).total_tokens; }
  std::int64_t rows(int s) const override { return at(s).x->rows(); }
  bool wants_output(int s) const override { return at(s).wants_output; }
  Tensor project(const Exec& ex, int s, QkvPart part, int h0, int h1) const override;
  void prepare(const Exec& ex, int s, QkvPart part, Tensor& x, int h0, int h1,
               std::int64_t token0) const override;

 private:
  const StreamQkv& at(int s) const { return streams_.at(static_cast<size_t>(s)); }
  std::vector<StreamQkv> streams_;
  int head_dim_;
  int batch_;
  float eps_;
};

/// Fills q/k/v weights and q/k norms of a stream from diffusers attention names:
/// prefix.to_q / prefix.to_k / prefix.to_v (image) or add_q_proj / ... (text), norm_q / norm_k
/// or norm_added_q / norm_added_k.
void bind_diffusers_qkv(StreamQkv& s, const Weights& w, const std::string& attn_prefix,
                        bool text_stream);

/// The tensor names of an MMDiT joint block that differ between families.
struct JointNames {
  std::string img_mod;  // "norm1.linear" (SD3/FLUX) or "img_mod.1" (Qwen)
  std::string txt_mod;  // "norm1_context.linear" or "txt_mod.1"
  std::string img_mlp;  // "ff" or "img_mlp"
  std::string txt_mlp;  // "ff_context" or "txt_mlp"
};

struct JointBlockOptions {
  bool text_first = true;         // FLUX/Qwen concatenate [text, image]; SD3 [image, text]
  bool context_pre_only = false;  // SD3 last block: text stream is not updated
  bool dual_attention = false;    // SD3.5 Medium: a second image-only attention (attn2)
  bool qk_norm = true;
  /// How the reference normalises Q/K: diffusers' own (unfused) RMSNorm (SD3.5, Qwen-Image) or
  /// torch.nn.RMSNorm (FLUX.1), for the device's grids.
  KernelClass qk_norm_kernel = KernelClass::kRmsNormUnfused;
  /// > 0: the text stream is sharded over the group (ForwardInputs::text_shard), this many
  /// tokens per batch element in all; 0: replicated.
  std::int64_t sharded_text_tokens = 0;
  /// The attention layer's kind for strategy statistics (AttentionShape::kind).
  std::string attention_kind = "joint";
};

/// JointBlockOptions::sharded_text_tokens of a forward pass's inputs.
std::int64_t sharded_text_tokens(const ForwardInputs& in);

/// The RoPE positions of a text stream's tokens here: rows of `all` (every text token's
/// positions) for the tokens this rank holds (ForwardInputs::text_shard), or all of them.
Eigen::MatrixXd text_positions(const ForwardInputs& in, const Eigen::MatrixXd& all);

/// Declares the tensors of one joint block.
void joint_block_specs(SpecBuilder& sb, const std::string& prefix, std::int64_t dim,
                       std::int64_t head_dim, std::int64_t mlp_hidden, const JointNames& names,
                       const JointBlockOptions& opt);

/// Positions of one stream for RoPE (null when the model has none).
struct StreamRope {
  const RopeTable* image = nullptr;
  const RopeTable* text = nullptr;
};

/// One MMDiT joint block, in place on x (image, [B*n, D]) and c (text, [B*Nt, D]).
///   x += g1 * attn(mod(LN(x)))[img];  x += g2 * mlp(mod(LN(x)))     (likewise for c)
void joint_block(const Exec& ex, const Weights& w, AttentionStrategy& attn, const ModelConfig& cfg,
                 const std::string& prefix, const JointNames& names, const JointBlockOptions& opt,
                 const Tensor& c_silu, const StreamRope& rope, std::int64_t image_tokens, int batch,
                 Tensor& x, Tensor& c);

/// AdaLayerNormContinuous + proj_out: proj(LN(x) * (1 + scale) + shift), (scale, shift) from
/// linear(silu(temb)) in that order (diffusers norm_out).
Tensor final_layer_continuous(const Exec& ex, const Weights& w, const Tensor& x,
                              const Tensor& c_silu, int batch, float eps);

/// x[b*n + t] += pos[t] for every batch element.   x: [B*n, D], pos: [n, D].
void add_positional(const Exec& ex, Tensor& x, const Tensor& pos, int batch);

/// Rows of an embedding table: y[b] = table[ids[b]].   -> [B, D].
Tensor embedding_lookup(const Exec& ex, const Tensor& table, const std::vector<int>& ids);

/// Positions of the local image tokens of `grid` as [count, 3] rows (frame, row, col), the
/// offsets added to row and column.
Eigen::MatrixXd image_positions(const TokenShard& shard, const TokenGrid& grid, double row_offset,
                                double col_offset);

}  // namespace cocodiff::dit::models
