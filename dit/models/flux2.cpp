// FLUX.2 (diffusers Flux2Transformer2DModel): FLUX.1's double-stream then single-stream layout,
// with four changes that matter here:
//  - modulation is shared: three projections of silu(temb) computed once per forward (image
//    and text of the double blocks, 2 x (shift, scale, gate) each; single blocks, 1 set), not
//    one per block;
//  - SwiGLU feed-forwards (linear_in to 2F, silu(a) * b, linear_out), ratio 3, no biases at all;
//  - single blocks fuse Q, K, V and the MLP input into one projection (to_qkv_mlp_proj) and the
//    attention and MLP outputs into one (to_out);
//  - 4-axis RoPE (32, 32, 32, 32), theta 2000: image token (0, row, col, 0), text token
//    (0, 0, 0, index).
// Guidance-distilled: the guidance value is an embedded input, one forward per step.

#include <string>

#include "dit/block_replay.hpp"
#include "dit/model_family.hpp"
#include "dit/models/common.hpp"
#include "dit/step_cache.hpp"

namespace cocodiff::dit {

namespace {

using models::SpecBuilder;

class Flux2 final : public Model {
 public:
  explicit Flux2(const ModelConfig& cfg) : Model(cfg) {}

  std::vector<TensorSpec> tensor_specs() const override {
    const std::int64_t d = cfg_.hidden();
    const std::int64_t f = mlp_hidden();
    constexpr bool kNoBias = false;
    SpecBuilder sb;
    sb.linear("x_embedder", d, cfg_.token_features(), kNoBias);
    sb.linear("context_embedder", d, cfg_.text_dim, kNoBias);
    for (const char* e : {"timestep_embedder", "guidance_embedder"}) {
      const std::string p = std::string("time_guidance_embed.") + e;
      sb.linear(p + ".linear_1", d, cfg_.timestep_dim, kNoBias);
      sb.linear(p + ".linear_2", d, d, kNoBias);
    }
    sb.linear("double_stream_modulation_img.linear", 6 * d, d, kNoBias);
    sb.linear("double_stream_modulation_txt.linear", 6 * d, d, kNoBias);
    sb.linear("single_stream_modulation.linear", 3 * d, d, kNoBias);
    for (int i = 0; i < cfg_.double_blocks; ++i) {
      const std::string b = "transformer_blocks." + std::to_string(i) + ".";
      for (const char* n : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"})
        sb.linear(b + "attn." + n, d, d, kNoBias);
      if (cfg_.qk_norm)
        for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"})
          sb.norm(b + "attn." + n, cfg_.head_dim);
      sb.linear(b + "attn.to_out.0", d, d, kNoBias);
      sb.linear(b + "attn.to_add_out", d, d, kNoBias);
      for (const char* ff : {"ff", "ff_context"}) {
        sb.linear(b + ff + ".linear_in", 2 * f, d, kNoBias);
        sb.linear(b + ff + ".linear_out", d, f, kNoBias);
      }
    }
    for (int i = 0; i < cfg_.single_blocks; ++i) {
      const std::string b = "single_transformer_blocks." + std::to_string(i) + ".attn.";
      sb.linear(b + "to_qkv_mlp_proj", 3 * d + 2 * f, d, kNoBias);
      if (cfg_.qk_norm) {
        sb.norm(b + "norm_q", cfg_.head_dim);
        sb.norm(b + "norm_k", cfg_.head_dim);
      }
      sb.linear(b + "to_out", d, d + f, kNoBias);
    }
    sb.linear("norm_out.linear", 2 * d, d, kNoBias);
    sb.linear("proj_out", cfg_.token_features(), d, kNoBias);
    return sb.take();
  }

  // forward: x [B*n, C*4], text [B*Nt, text_dim] -> [B*n, C*4]
  //   temb = t_mlp(temb(sigma*1000)) + g_mlp(temb(guidance*1000));  m_* = linear(silu(temb))
  //   h = x_embedder(x);  c = context_embedder(text);  double blocks, single blocks
  //   out = proj_out(LN(h) * (1 + scale) + shift),  (scale, shift) = norm_out(silu(temb))
  Tensor forward(const Exec& ex, const Weights& w, AttentionStrategy& attn,
                 const ForwardInputs& in) const override {
    const int batch = in.batch;
    COCO_CHECK(in.guidance.size() == static_cast<size_t>(batch), "FLUX.2 needs guidance values");
    const float ts = static_cast<float>(cfg_.timestep_scale);
    std::vector<float> t, g;
    for (float s : in.sigmas) t.push_back(s * ts);
    for (float v : in.guidance) g.push_back(v * ts);
    Tensor temb = models::embed_mlp(ex, w, "time_guidance_embed.timestep_embedder.linear_1",
                                    "time_guidance_embed.timestep_embedder.linear_2",
                                    timestep_embedding(ex, t, cfg_.timestep_dim));
    gated_residual(ex, temb,
                   models::embed_mlp(ex, w, "time_guidance_embed.guidance_embedder.linear_1",
                                     "time_guidance_embed.guidance_embedder.linear_2",
                                     timestep_embedding(ex, g, cfg_.timestep_dim)),
                   nullptr, batch, "temb_add");
    silu(ex, temb, "temb_silu");
    const std::vector<Tensor> m_img =
        models::modulation(ex, w, "double_stream_modulation_img.linear", temb, 6);
    const std::vector<Tensor> m_txt =
        models::modulation(ex, w, "double_stream_modulation_txt.linear", temb, 6);
    const std::vector<Tensor> m_single =
        models::modulation(ex, w, "single_stream_modulation.linear", temb, 3);

    // A pipeline stage after the first starts from the image and text hidden states the stage
    // before left (the text is a joint-attention stream, carried with every patch); every stage
    // makes the shared modulation its blocks read.
    const StagePass* stage = in.stage;
    const bool embed = stage == nullptr || stage->first;
    Tensor h =
        embed ? models::dense(ex, w, "x_embedder", *in.x, "x_embedder") : std::move(*stage->image);
    Tensor c = embed ? models::dense(ex, w, "context_embedder", *in.text, "context_embedder")
                     : std::move(*stage->text);
    models::check_finite(ex, "time_guidance_embed", {&temb});
    models::check_finite(ex, "x_embedder", {&h});
    models::check_finite(ex, "context_embedder", {&c});

    // RoPE ids (t, h, w, l): image token (0, row, col, 0), text token (0, 0, 0, index).
    const std::int64_t nt = in.text_shard ? in.text_shard->total : c.rows() / batch;
    Eigen::MatrixXd img_pos = Eigen::MatrixXd::Zero(in.shard.count, 4);
    img_pos.leftCols(3) = models::image_positions(in.shard, in.grid, 0, 0);
    Eigen::MatrixXd txt_pos = Eigen::MatrixXd::Zero(nt, 4);
    for (std::int64_t i = 0; i < nt; ++i) txt_pos(i, 3) = static_cast<double>(i);
    const RopeTable img_rope = rope_table(ex, img_pos, cfg_.rope_axes, cfg_.rope_theta);
    const RopeTable txt_rope =
        rope_table(ex, models::text_positions(in, txt_pos), cfg_.rope_axes, cfg_.rope_theta);
    const models::StreamRope rope{&img_rope, &txt_rope};

    const int nd = cfg_.double_blocks;
    auto kind = [&](int i) { return std::string(i < nd ? "flux2 double" : "flux2 single"); };
    auto block = [&](int i) {
      if (i < nd) {
        run_block(ex, kind(i), 1,
                  [&] { double_block(ex, w, attn, i, m_img, m_txt, rope, in, c, h); });
        models::check_finite(ex, "transformer_blocks", {&h, &c}, i);
      } else {
        run_block(ex, kind(i), 1,
                  [&] { single_block(ex, w, attn, i - nd, m_single, rope, in, c, h); });
        models::check_finite(ex, "single_transformer_blocks", {&h, &c}, i - nd);
      }
    };
    // The first block's norm1 of the image stream, with the shared modulation.
    auto tea_input = [&] {
      const std::vector<Tensor>& m = nd > 0 ? m_img : m_single;
      return models::norm_modulate(ex, h, m[0], m[1], batch, cfg_.norm_eps, "teacache_norm1");
    };
    const int b0 = stage != nullptr ? stage->first_block : 0;
    const int b1 = stage != nullptr ? stage->last_block : nd + cfg_.single_blocks;
    run_blocks(
        ex, b1 - b0, [&](int i) { block(b0 + i); }, {&h, &c}, tea_input,
        [&](int i) { return kind(b0 + i); });
    if (stage != nullptr && !stage->last) {
      *stage->image = std::move(h);
      *stage->text = std::move(c);
      return Tensor();
    }
    Tensor out = models::final_layer_continuous(ex, w, h, temb, batch, cfg_.norm_eps);
    models::check_finite(ex, "norm_out and proj_out", {&out});
    return out;
  }

 private:
  std::int64_t mlp_hidden() const {
    return static_cast<std::int64_t>(cfg_.hidden() * cfg_.mlp_ratio);
  }

  // SwiGLU feed-forward: linear_out(silu(a) * b), [a, b] = linear_in(x).   [N, D] -> [N, D]
  static Tensor feed_forward(const Exec& ex, const Weights& w, const std::string& prefix,
                             const Tensor& x) {
    const Tensor ab = models::dense(ex, w, prefix + ".linear_in", x, "ff_in");
    return models::dense(ex, w, prefix + ".linear_out", swiglu(ex, ab, "ff_swiglu"), "ff_out");
  }

  // double block, in place on text c [B*Nt, D] and image x [B*n, D], with the shared
  // modulation m = (shift, scale, gate) of attention, then of the feed-forward, per stream:
  //   s += gate1 * attn(LN(s) * (1 + scale1) + shift1)[s]
  //   s += gate2 * ff(LN(s) * (1 + scale2) + shift2)
  void double_block(const Exec& ex, const Weights& w, AttentionStrategy& attn, int i,
                    const std::vector<Tensor>& mi, const std::vector<Tensor>& mt,
                    const models::StreamRope& rope, const ForwardInputs& in, Tensor& c,
                    Tensor& x) const {
    const int batch = in.batch;
    const float eps = cfg_.norm_eps;
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    const Tensor hi = models::norm_modulate(ex, x, mi[0], mi[1], batch, eps, "norm1");
    const Tensor ht = models::norm_modulate(ex, c, mt[0], mt[1], batch, eps, "norm1_context");
    models::StreamQkv img, txt;
    txt.x = &ht;
    txt.text = true;
    txt.sharded = in.text_shard.has_value();
    txt.total_tokens = in.text_shard ? in.text_shard->total : c.rows() / batch;
    txt.rope = rope.text;
    models::bind_diffusers_qkv(txt, w, b + "attn", true);
    img.x = &hi;
    img.sharded = true;
    img.total_tokens = in.shard.total;
    img.rope = rope.image;
    models::bind_diffusers_qkv(img, w, b + "attn", false);
    const models::ModelQkv src({txt, img}, cfg_.head_dim, batch, eps);
    std::vector<Tensor> o =
        attn.attend(ex, src, {cfg_.heads, cfg_.head_dim, batch, "flux2_double"});
    gated_residual(ex, x, models::dense(ex, w, b + "attn.to_out.0", o[1], "attn_out"), &mi[2],
                   batch, "residual");
    gated_residual(ex, x,
                   feed_forward(ex, w, b + "ff",
                                models::norm_modulate(ex, x, mi[3], mi[4], batch, eps, "norm2")),
                   &mi[5], batch, "residual");
    gated_residual(ex, c, models::dense(ex, w, b + "attn.to_add_out", o[0], "attn_add_out"), &mt[2],
                   batch, "residual");
    gated_residual(
        ex, c,
        feed_forward(ex, w, b + "ff_context",
                     models::norm_modulate(ex, c, mt[3], mt[4], batch, eps, "norm2_context")),
        &mt[5], batch, "residual");
  }

  // single block, in place on text c and image x, shared modulation m = (shift, scale, gate):
  //   h = LN(s) * (1 + scale) + shift;  [q, k, v, a, b] = to_qkv_mlp_proj(h)
  //   s += gate * to_out([attn(q, k, v), silu(a) * b])              [.., D + F] -> [.., D]
  void single_block(const Exec& ex, const Weights& w, AttentionStrategy& attn, int i,
                    const std::vector<Tensor>& m, const models::StreamRope& rope,
                    const ForwardInputs& in, Tensor& c, Tensor& x) const {
    const int batch = in.batch;
    const std::int64_t d = cfg_.hidden(), f = mlp_hidden();
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".attn.";
    const Tensor& fused = w.get(b + "to_qkv_mlp_proj.weight");
    Tensor* streams[2] = {&c, &x};
    Tensor hn[2], mlp[2];
    std::vector<models::StreamQkv> qkv(2);
    for (int s = 0; s < 2; ++s) {
      hn[s] = models::norm_modulate(ex, *streams[s], m[0], m[1], batch, cfg_.norm_eps, "norm");
      mlp[s] =
          swiglu(ex, linear(ex, hn[s], fused, nullptr, "mlp_in", RowRange{3 * d, 3 * d + 2 * f}),
                 "mlp_swiglu");
      models::StreamQkv& q = qkv[static_cast<size_t>(s)];
      q.x = &hn[s];
      q.text = s == 0;
      q.sharded = s == 1 || in.text_shard.has_value();
      q.total_tokens = s == 1          ? in.shard.total
                       : in.text_shard ? in.text_shard->total
                                       : c.rows() / batch;
      q.rope = s == 1 ? rope.image : rope.text;
      for (int p = 0; p < 3; ++p) {
        q.w[p] = &fused;
        q.row_offset[p] = p * d;
      }
      q.norm[0] = w.find(b + "norm_q.weight");
      q.norm[1] = w.find(b + "norm_k.weight");
    }
    const models::ModelQkv src(std::move(qkv), cfg_.head_dim, batch, cfg_.norm_eps);
    std::vector<Tensor> o =
        attn.attend(ex, src, {cfg_.heads, cfg_.head_dim, batch, "flux2_single"});
    for (int s = 0; s < 2; ++s) {
      const Tensor cat = concat_cols(ex, o[static_cast<size_t>(s)], mlp[s], "attn_mlp_concat");
      gated_residual(ex, *streams[s], models::dense(ex, w, b + "to_out", cat, "proj_out"), &m[2],
                     batch, "residual");
    }
  }
};

}  // namespace

ModelFamily flux2_family() {
  ModelFamily f;
  f.name = "flux2";
  f.summary = "FLUX.2: shared modulation, 4-axis RoPE, embedded guidance, no pooled text";
  f.stage_blocks = [](const ModelConfig& m) { return m.double_blocks + m.single_blocks; };
  f.check = [](const ModelConfig& m) -> std::optional<ModelConfigProblem> {
    if (auto bad = rope_axes_problem(m, 4, "frame, row, column, text index")) return bad;
    if (!m.guidance_embed)
      return ModelConfigProblem{"guidance_embed", "true (FLUX.2 always embeds the guidance value)",
                                "false"};
    if (m.pooled_dim != 0)
      return ModelConfigProblem{"pooled_dim", "0 (FLUX.2 has no pooled text embedding)",
                                std::to_string(m.pooled_dim)};
    return std::nullopt;
  };
  f.make = [](const ModelConfig& cfg) -> std::unique_ptr<Model> {
    return std::make_unique<Flux2>(cfg);
  };
  return f;
}

}  // namespace cocodiff::dit
