// Qwen-Image (diffusers QwenImageTransformer2DModel): 60 MMDiT blocks over [text, image],
// per-head Q/K RMSNorm, then RoPE on text and image separately (QwenEmbedRope, scale_rope):
// image token (row, col) sits at (0, row - (H - H/2), col - (W - W/2)), text token k at
// (m + k, m + k, m + k) with m = max(H/2, W/2). Text enters through RMSNorm + a linear; the
// timestep alone drives modulation (no pooled text). True CFG is two forwards (sampler).

#include <string>

#include "dit/block_replay.hpp"
#include "dit/model_family.hpp"
#include "dit/models/common.hpp"
#include "dit/step_cache.hpp"

namespace cocodiff::dit {

namespace {

using models::SpecBuilder;

const models::JointNames kNames{"img_mod.1", "txt_mod.1", "img_mlp", "txt_mlp"};

class QwenImage final : public Model {
 public:
  explicit QwenImage(const ModelConfig& cfg) : Model(cfg) {}

  std::vector<TensorSpec> tensor_specs() const override {
    const std::int64_t d = cfg_.hidden();
    SpecBuilder sb;
    sb.linear("img_in", d, cfg_.token_features());
    sb.norm("txt_norm", cfg_.text_dim);
    sb.linear("txt_in", d, cfg_.text_dim);
    sb.linear("time_text_embed.timestep_embedder.linear_1", d, cfg_.timestep_dim);
    sb.linear("time_text_embed.timestep_embedder.linear_2", d, d);
    models::JointBlockOptions opt;
    opt.qk_norm = cfg_.qk_norm;
    for (int i = 0; i < cfg_.double_blocks; ++i)
      models::joint_block_specs(sb, "transformer_blocks." + std::to_string(i), d, cfg_.head_dim,
                                static_cast<std::int64_t>(d * cfg_.mlp_ratio), kNames, opt);
    sb.linear("norm_out.linear", 2 * d, d);
    sb.linear("proj_out", cfg_.token_features(), d);
    return sb.take();
  }

  // forward: x [B*n, C*4], text [B*Nt, text_dim] -> [B*n, C*4]
  //   h = img_in(x);  c = txt_in(rms_norm(text));  temb = t_mlp(temb(sigma * 1000))
  //   joint blocks; out = proj_out(norm_out(h, temb))
  Tensor forward(const Exec& ex, const Weights& w, AttentionStrategy& attn,
                 const ForwardInputs& in) const override {
    const int batch = in.batch;
    // A pipeline stage after the first starts from the image and text hidden states the stage
    // before left (the text is a joint-attention stream, carried with every patch).
    const StagePass* stage = in.stage;
    const bool embed = stage == nullptr || stage->first;
    Tensor h, c;
    if (embed) {
      h = models::dense(ex, w, "img_in", *in.x, "img_in");
      c = models::dense(ex, w, "txt_in",
                        rms_norm(ex, *in.text, w.get("txt_norm.weight"), cfg_.norm_eps, "txt_norm"),
                        "txt_in");
    } else {
      h = std::move(*stage->image);
      c = std::move(*stage->text);
    }
    std::vector<float> t;
    for (float s : in.sigmas) t.push_back(s * static_cast<float>(cfg_.timestep_scale));
    Tensor temb = models::embed_mlp(ex, w, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2",
                                    timestep_embedding(ex, t, cfg_.timestep_dim));
    silu(ex, temb, "temb_silu");
    models::check_finite(ex, "img_in", {&h});
    models::check_finite(ex, "txt_in and time_text_embed", {&c, &temb});

    const int gh = in.grid.height, gw = in.grid.width;
    // Qwen-Image rotates in complex arithmetic (its apply_rotary_emb_qwen).
    RopeTable img_rope =
        rope_table(ex, models::image_positions(in.shard, in.grid, -(gh - gh / 2), -(gw - gw / 2)),
                   cfg_.rope_axes, cfg_.rope_theta);
    img_rope.kernel = KernelClass::kRopeComplex;
    const std::int64_t nt = in.text_shard ? in.text_shard->total : c.rows() / batch;
    Eigen::MatrixXd txt_pos(nt, 3);
    const double m = std::max(gh / 2, gw / 2);
    for (std::int64_t k = 0; k < nt; ++k) txt_pos.row(k).setConstant(m + static_cast<double>(k));
    RopeTable txt_rope =
        rope_table(ex, models::text_positions(in, txt_pos), cfg_.rope_axes, cfg_.rope_theta);
    txt_rope.kernel = KernelClass::kRopeComplex;
    models::JointBlockOptions opt;
    opt.qk_norm = cfg_.qk_norm;
    opt.attention_kind = "qwen-image_joint";
    opt.sharded_text_tokens = models::sharded_text_tokens(in);
    static constexpr const char* kKind = "qwen-image joint";
    auto block = [&](int i) {
      run_block(ex, kKind, 1, [&] {
        models::joint_block(ex, w, attn, cfg_, "transformer_blocks." + std::to_string(i), kNames,
                            opt, temb, {&img_rope, &txt_rope}, in.shard.total, batch, h, c);
      });
      models::check_finite(ex, "transformer_blocks", {&h, &c}, i);
    };
    auto tea_input = [&] {
      return models::first_block_modulated_input(ex, w, "transformer_blocks.0.img_mod.1", temb, 6,
                                                 h, batch, cfg_.norm_eps);
    };
    const int b0 = stage != nullptr ? stage->first_block : 0;
    const int b1 = stage != nullptr ? stage->last_block : cfg_.double_blocks;
    run_blocks(
        ex, b1 - b0, [&](int i) { block(b0 + i); }, {&h, &c}, tea_input,
        [](int) { return std::string(kKind); });
    if (stage != nullptr && !stage->last) {
      *stage->image = std::move(h);
      *stage->text = std::move(c);
      return Tensor();
    }
    Tensor out = models::final_layer_continuous(ex, w, h, temb, batch, cfg_.norm_eps);
    models::check_finite(ex, "norm_out and proj_out", {&out});
    return out;
  }
};

}  // namespace

ModelFamily qwen_image_family() {
  ModelFamily f;
  f.name = "qwen-image";
  f.summary = "Qwen-Image: double-stream MMDiT blocks, 3-axis RoPE, true CFG";
  f.stage_blocks = [](const ModelConfig& m) { return m.double_blocks; };
  f.check = [](const ModelConfig& m) { return rope_axes_problem(m, 3, "frame, row, column"); };
  f.make = [](const ModelConfig& cfg) -> std::unique_ptr<Model> {
    return std::make_unique<QwenImage>(cfg);
  };
  return f;
}

}  // namespace cocodiff::dit
