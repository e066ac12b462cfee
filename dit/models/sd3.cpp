// Stable Diffusion 3.5 Large / Medium (diffusers SD3Transformer2DModel): MMDiT joint blocks over
// [image, text], per-head Q/K RMSNorm, no RoPE, 2-D sin-cos positions cropped from a
// pos_embed_max_size grid. Medium adds an image-only attention (attn2, SD35AdaLayerNormZeroX
// with 9 modulation vectors) in blocks [0, dual_attention_blocks). The last block is
// context_pre_only: its text stream is read by attention but never updated.

#include <string>

#include "core/errors.hpp"
#include "dit/block_replay.hpp"
#include "dit/model_family.hpp"
#include "dit/models/common.hpp"
#include "dit/step_cache.hpp"

namespace cocodiff::dit {

namespace {

using models::SpecBuilder;

const models::JointNames kNames{"norm1.linear", "norm1_context.linear", "ff", "ff_context"};

class Sd3 final : public Model {
 public:
  explicit Sd3(const ModelConfig& cfg) : Model(cfg) {}

  models::JointBlockOptions block_options(int i) const {
    models::JointBlockOptions o;
    o.text_first = false;
    o.context_pre_only = i == cfg_.double_blocks - 1;
    o.dual_attention = i < cfg_.dual_attention_blocks;
    o.qk_norm = cfg_.qk_norm;
    o.attention_kind = "sd3_joint";
    return o;
  }

  std::vector<TensorSpec> tensor_specs() const override {
    const std::int64_t d = cfg_.hidden();
    SpecBuilder sb;
    sb.conv("pos_embed.proj", d, cfg_.latent_channels, cfg_.patch_size);
    sb.linear("time_text_embed.timestep_embedder.linear_1", d, cfg_.timestep_dim);
    sb.linear("time_text_embed.timestep_embedder.linear_2", d, d);
    sb.linear("time_text_embed.text_embedder.linear_1", d, cfg_.pooled_dim);
    sb.linear("time_text_embed.text_embedder.linear_2", d, d);
    sb.linear("context_embedder", d, cfg_.text_dim);
    for (int i = 0; i < cfg_.double_blocks; ++i)
      models::joint_block_specs(sb, "transformer_blocks." + std::to_string(i), d, cfg_.head_dim,
                                static_cast<std::int64_t>(d * cfg_.mlp_ratio), kNames,
                                block_options(i));
    sb.linear("norm_out.linear", 2 * d, d);
    sb.linear("proj_out", std::int64_t{cfg_.patch_size} * cfg_.patch_size * cfg_.out_channels, d);
    return sb.take();
  }

  // forward: x [B*n, C*p*p], text [B*Nt, text_dim], pooled [B, pooled] -> [B*n, C*p*p]
  //   h = patch_embed(x) + crop(sincos);  c = context_embedder(text)
  //   temb = t_mlp(temb(sigma * 1000)) + text_mlp(pooled)
  //   joint blocks; out = proj_out(norm_out(h, temb))   ((py, px, c) -> (c, py, px))
  Tensor forward(const Exec& ex, const Weights& w, AttentionStrategy& attn,
                 const ForwardInputs& in) const override {
    const int batch = in.batch;
    const int d = cfg_.hidden();
    // A pipeline stage after the first starts from the image and text hidden states the stage
    // before left (the text stream is a joint-attention stream, carried with every patch).
    const StagePass* stage = in.stage;
    const bool embed = stage == nullptr || stage->first;
    Tensor h, c;
    if (embed) {
      h = models::dense(ex, w, "pos_embed.proj", *in.x, "patch_embed");
      // PatchEmbed: the sin-cos table of a max x max grid (positions scaled by base/max),
      // centre-cropped to the image's grid.
      const int max = cfg_.pos_embed_max_size > 0 ? cfg_.pos_embed_max_size
                                                  : std::max(in.grid.height, in.grid.width);
      if (in.grid.height > max || in.grid.width > max)
        throw ConfigError("model " + cfg_.name + ": image of " + std::to_string(in.grid.height) +
                          "x" + std::to_string(in.grid.width) +
                          " patches exceeds pos_embed_max_size " + std::to_string(max));
      const int base = cfg_.pos_embed_base_size > 0 ? cfg_.pos_embed_base_size : max;
      models::add_positional(
          ex, h,
          sincos_pos_embed_2d(ex, d, in.grid.height, in.grid.width, in.shard.begin, in.shard.count,
                              static_cast<double>(base) / max, (max - in.grid.height) / 2,
                              (max - in.grid.width) / 2),
          batch);
      c = models::dense(ex, w, "context_embedder", *in.text, "context_embedder");
    } else {
      h = std::move(*stage->image);
      c = std::move(*stage->text);
    }
    std::vector<float> t;
    for (float s : in.sigmas) t.push_back(s * static_cast<float>(cfg_.timestep_scale));
    Tensor temb = models::embed_mlp(ex, w, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2",
                                    timestep_embedding(ex, t, cfg_.timestep_dim));
    gated_residual(ex, temb,
                   models::embed_mlp(ex, w, "time_text_embed.text_embedder.linear_1",
                                     "time_text_embed.text_embedder.linear_2", *in.pooled),
                   nullptr, batch, "temb_add");
    silu(ex, temb, "temb_silu");
    models::check_finite(ex, "pos_embed", {&h});
    models::check_finite(ex, "context_embedder and time_text_embed", {&c, &temb});
    // The last block (text not updated) and SD3.5 Medium's dual-attention blocks differ.
    auto kind = [&](int i) {
      const models::JointBlockOptions o = block_options(i);
      return std::string(o.context_pre_only ? "sd3 joint, context pre-only"
                         : o.dual_attention ? "sd3 joint, dual attention"
                                            : "sd3 joint");
    };
    auto block = [&](int i) {
      models::JointBlockOptions o = block_options(i);
      o.sharded_text_tokens = models::sharded_text_tokens(in);
      run_block(ex, kind(i), o.dual_attention ? 2 : 1, [&] {
        models::joint_block(ex, w, attn, cfg_, "transformer_blocks." + std::to_string(i), kNames, o,
                            temb, {}, in.shard.total, batch, h, c);
      });
      models::check_finite(ex, "transformer_blocks", {&h, &c}, i);
    };
    auto tea_input = [&] {
      return models::first_block_modulated_input(ex, w, "transformer_blocks.0.norm1.linear", temb,
                                                 block_options(0).dual_attention ? 9 : 6, h, batch,
                                                 cfg_.norm_eps);
    };
    const int b0 = stage != nullptr ? stage->first_block : 0;
    const int b1 = stage != nullptr ? stage->last_block : cfg_.double_blocks;
    run_blocks(
        ex, b1 - b0, [&](int i) { block(b0 + i); }, {&h, &c}, tea_input,
        [&](int i) { return kind(b0 + i); });
    if (stage != nullptr && !stage->last) {
      *stage->image = std::move(h);
      *stage->text = std::move(c);
      return Tensor();
    }
    const Tensor out = models::final_layer_continuous(ex, w, h, temb, batch, cfg_.norm_eps);
    models::check_finite(ex, "norm_out and proj_out", {&out});
    return patch_order_pqc_to_cpq(ex, out, cfg_.out_channels,
                                  in.all_channels ? cfg_.out_channels : cfg_.latent_channels,
                                  cfg_.patch_size);
  }
};

}  // namespace

ModelFamily sd3_family() {
  ModelFamily f;
  f.name = "sd3";
  f.summary = "SD3 / SD3.5: MMDiT joint blocks, sin-cos crop positions, pooled text";
  f.dual_attention = true;
  f.stage_blocks = [](const ModelConfig& m) { return m.double_blocks; };
  f.check = [](const ModelConfig& m) -> std::optional<ModelConfigProblem> {
    if (m.pooled_dim >= 1) return std::nullopt;
    return ModelConfigProblem{"pooled_dim", "a pooled text width for family sd3",
                              std::to_string(m.pooled_dim)};
  };
  f.make = [](const ModelConfig& cfg) -> std::unique_ptr<Model> {
    return std::make_unique<Sd3>(cfg);
  };
  return f;
}

}  // namespace cocodiff::dit
