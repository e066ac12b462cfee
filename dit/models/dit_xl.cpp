// DiT (Peebles & Xie, facebookresearch/DiT models.py): class-conditional, adaLN-Zero blocks,
// fused qkv, fixed 2-D sin-cos positions, no Q/K norm, no RoPE. Tensor names are the original
// repository's (x_embedder.proj.weight, blocks.0.attn.qkv.weight, final_layer.linear.weight).

#include <string>

#include "dit/block_replay.hpp"
#include "dit/model_family.hpp"
#include "dit/models/common.hpp"
#include "dit/step_cache.hpp"

namespace cocodiff::dit {

namespace {

using models::SpecBuilder;

class DitXl final : public Model {
 public:
  explicit DitXl(const ModelConfig& cfg) : Model(cfg) {}

  std::vector<TensorSpec> tensor_specs() const override {
    const std::int64_t d = cfg_.hidden();
    const std::int64_t f = static_cast<std::int64_t>(d * cfg_.mlp_ratio);
    const int p = cfg_.patch_size;
    SpecBuilder sb;
    sb.conv("x_embedder.proj", d, cfg_.latent_channels, p);
    sb.linear("t_embedder.mlp.0", d, cfg_.timestep_dim);
    sb.linear("t_embedder.mlp.2", d, d);
    sb.embedding("y_embedder.embedding_table", cfg_.num_classes + 1, d);  // + the null class
    for (int i = 0; i < cfg_.double_blocks; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      sb.linear(b + "attn.qkv", 3 * d, d);
      sb.linear(b + "attn.proj", d, d);
      sb.linear(b + "mlp.fc1", f, d);
      sb.linear(b + "mlp.fc2", d, f);
      sb.linear(b + "adaLN_modulation.1", 6 * d, d);
    }
    sb.linear("final_layer.linear", std::int64_t{p} * p * cfg_.out_channels, d);
    sb.linear("final_layer.adaLN_modulation.1", 2 * d, d);
    return sb.take();
  }

  // forward: x [B*n, C*p*p] -> velocity [B*n, C*p*p]
  //   h = patch_embed(x) + pos;  c = t_mlp(temb(sigma * 1000)) + y_table[label]
  //   per block: h += g1 * attn(mod(LN(h))); h += g2 * mlp(mod(LN(h)))
  //   out = linear(mod(LN(h)))   ((py, px, c) order, first C of out_channels kept)
  Tensor forward(const Exec& ex, const Weights& w, AttentionStrategy& attn,
                 const ForwardInputs& in) const override {
    const int batch = in.batch;
    const std::int64_t d = cfg_.hidden();
    // A pipeline stage after the first starts from the image hidden states the stage before
    // left; there is no text stream (the class label enters through the modulation, which
    // every stage computes from the label).
    const StagePass* stage = in.stage;
    Tensor h;
    if (stage == nullptr || stage->first) {
      h = models::dense(ex, w, "x_embedder.proj", *in.x, "patch_embed");  // [B*n, D]
      models::add_positional(
          ex, h,
          sincos_pos_embed_2d(ex, static_cast<int>(d), in.grid.height, in.grid.width,
                              in.shard.begin, in.shard.count, 1.0, 0, 0),
          batch);
    } else {
      h = std::move(*stage->image);
    }
    std::vector<float> t;
    for (float s : in.sigmas) t.push_back(s * static_cast<float>(cfg_.timestep_scale));
    Tensor c = models::embed_mlp(ex, w, "t_embedder.mlp.0", "t_embedder.mlp.2",
                                 timestep_embedding(ex, t, cfg_.timestep_dim));  // [B, D]
    gated_residual(
        ex, c,
        models::embedding_lookup(ex, w.get("y_embedder.embedding_table.weight"), in.class_labels),
        nullptr, batch, "class_embed");
    Tensor c_silu = c;
    silu(ex, c_silu, "c_silu");
    models::check_finite(ex, "x_embedder", {&h});
    models::check_finite(ex, "t_embedder and y_embedder", {&c});

    static constexpr const char* kKind = "dit";
    auto block = [&](int i) {
      run_block(ex, kKind, 1, [&] {
        const std::string b = "blocks." + std::to_string(i) + ".";
        const std::vector<Tensor> m =
            models::modulation(ex, w, b + "adaLN_modulation.1", c_silu, 6);
        const Tensor hn = models::norm_modulate(ex, h, m[0], m[1], batch, cfg_.norm_eps, "norm1");
        models::StreamQkv s;
        s.x = &hn;
        s.sharded = true;
        s.total_tokens = in.shard.total;
        for (int part = 0; part < 3; ++part) {
          s.w[part] = &w.get(b + "attn.qkv.weight");
          s.b[part] = &w.get(b + "attn.qkv.bias");
          s.row_offset[part] = part * d;
        }
        const models::ModelQkv src({s}, cfg_.head_dim, batch, cfg_.norm_eps);
        std::vector<Tensor> o = attn.attend(ex, src, {cfg_.heads, cfg_.head_dim, batch, "dit"});
        gated_residual(ex, h, models::dense(ex, w, b + "attn.proj", o[0], "attn_out"), &m[2], batch,
                       "residual");
        const Tensor hm = models::norm_modulate(ex, h, m[3], m[4], batch, cfg_.norm_eps, "norm2");
        gated_residual(ex, h, models::mlp_gelu(ex, w, b + "mlp.fc1", b + "mlp.fc2", hm), &m[5],
                       batch, "residual");
      });
      models::check_finite(ex, "blocks", {&h}, i);
    };
    auto tea_input = [&] {
      return models::first_block_modulated_input(ex, w, "blocks.0.adaLN_modulation.1", c_silu, 6, h,
                                                 batch, cfg_.norm_eps);
    };
    const int b0 = stage != nullptr ? stage->first_block : 0;
    const int b1 = stage != nullptr ? stage->last_block : cfg_.double_blocks;
    run_blocks(
        ex, b1 - b0, [&](int i) { block(b0 + i); }, {&h}, tea_input,
        [](int) { return std::string(kKind); });
    if (stage != nullptr && !stage->last) {
      *stage->image = std::move(h);
      return Tensor();
    }
    const std::vector<Tensor> m =
        models::modulation(ex, w, "final_layer.adaLN_modulation.1", c_silu, 2);  // shift, scale
    const Tensor hf = models::norm_modulate(ex, h, m[0], m[1], batch, cfg_.norm_eps, "norm_final");
    const Tensor out = models::dense(ex, w, "final_layer.linear", hf, "final_linear");
    models::check_finite(ex, "final_layer", {&out});
    return patch_order_pqc_to_cpq(ex, out, cfg_.out_channels,
                                  in.all_channels ? cfg_.out_channels : cfg_.latent_channels,
                                  cfg_.patch_size);
  }
};

}  // namespace

ModelFamily dit_family() {
  ModelFamily f;
  f.name = "dit";
  f.summary =
      "DiT-XL/2 (Peebles & Xie): class-conditioned adaLN-Zero blocks, 2-D sin-cos positions";
  f.text_conditioned = false;
  f.default_text_tokens = 0;
  f.default_num_classes = 1000;
  f.default_qk_norm = false;
  f.stage_blocks = [](const ModelConfig& m) { return m.double_blocks; };
  f.check = [](const ModelConfig& m) -> std::optional<ModelConfigProblem> {
    if (m.hidden() % 4 == 0) return std::nullopt;
    return ModelConfigProblem{"heads * model.head_dim",
                              "a multiple of 4 (2-D sin-cos position embedding)",
                              std::to_string(m.hidden()), "head_dim"};
  };
  f.make = [](const ModelConfig& cfg) -> std::unique_ptr<Model> {
    return std::make_unique<DitXl>(cfg);
  };
  return f;
}

}  // namespace cocodiff::dit
