// FLUX.1 (diffusers FluxTransformer2DModel): double-stream MMDiT blocks over [text, image]
// with per-head Q/K RMSNorm and 3-axis RoPE (ids: text (0,0,0), image (0, row, col)), then
// single-stream blocks on the concatenated sequence: one modulation (shift, scale, gate), the
// MLP input projection beside Q/K/V, and one output projection of [attention, gelu(mlp)].
// Guidance-distilled (dev): the guidance value is an embedded input, one forward per step.

#include <string>

#include "dit/block_replay.hpp"
#include "dit/math_cache.hpp"
#include "dit/model_family.hpp"
#include "dit/models/common.hpp"
#include "dit/step_cache.hpp"

namespace cocodiff::dit {

namespace {

using models::SpecBuilder;

const models::JointNames kNames{"norm1.linear", "norm1_context.linear", "ff", "ff_context"};

class Flux final : public Model {
 public:
  explicit Flux(const ModelConfig& cfg) : Model(cfg) {}

  std::vector<TensorSpec> tensor_specs() const override {
    const std::int64_t d = cfg_.hidden();
    const std::int64_t f = static_cast<std::int64_t>(d * cfg_.mlp_ratio);
    SpecBuilder sb;
    sb.linear("x_embedder", d, cfg_.token_features());
    sb.linear("context_embedder", d, cfg_.text_dim);
    sb.linear("time_text_embed.timestep_embedder.linear_1", d, cfg_.timestep_dim);
    sb.linear("time_text_embed.timestep_embedder.linear_2", d, d);
    if (cfg_.guidance_embed) {
      sb.linear("time_text_embed.guidance_embedder.linear_1", d, cfg_.timestep_dim);
      sb.linear("time_text_embed.guidance_embedder.linear_2", d, d);
    }
    if (cfg_.pooled_dim > 0) {
      sb.linear("time_text_embed.text_embedder.linear_1", d, cfg_.pooled_dim);
      sb.linear("time_text_embed.text_embedder.linear_2", d, d);
    }
    models::JointBlockOptions opt;
    opt.qk_norm = cfg_.qk_norm;
    for (int i = 0; i < cfg_.double_blocks; ++i)
      models::joint_block_specs(sb, "transformer_blocks." + std::to_string(i), d, cfg_.head_dim, f,
                                kNames, opt);
    for (int i = 0; i < cfg_.single_blocks; ++i) {
      const std::string b = "single_transformer_blocks." + std::to_string(i) + ".";
      sb.linear(b + "norm.linear", 3 * d, d);
      sb.linear(b + "proj_mlp", f, d);
      for (const char* n : {"to_q", "to_k", "to_v"}) sb.linear(b + "attn." + n, d, d);
      if (cfg_.qk_norm) {
        sb.norm(b + "attn.norm_q", cfg_.head_dim);
        sb.norm(b + "attn.norm_k", cfg_.head_dim);
      }
      sb.linear(b + "proj_out", d, d + f);
    }
    sb.linear("norm_out.linear", 2 * d, d);
    sb.linear("proj_out", cfg_.token_features(), d);
    if (cfg_.num_classes > 0) {
      // Learned class conditioning in place of a text encoder: per class (and a null class for
      // CFG, row num_classes) text_tokens x text_dim embeddings and a pooled embedding.
      sb.embedding("class_embedding.text", cfg_.num_classes + 1,
                   std::int64_t{cfg_.text_tokens} * cfg_.text_dim);
      if (cfg_.pooled_dim > 0)
        sb.embedding("class_embedding.pooled", cfg_.num_classes + 1, cfg_.pooled_dim);
    }
    return sb.take();
  }

  // single block, in place on text c [B*Nt, D] and image x [B*n, D]:
  //   (shift, scale, gate) = linear(silu(temb));  h = LN(s) * (1 + scale) + shift
  //   s += gate * proj_out([attn(h), gelu(proj_mlp(h))])      [.., D + F] -> [.., D]
  void single_block(const Exec& ex, const Weights& w, AttentionStrategy& attn, int i,
                    const Tensor& c_silu, const models::StreamRope& rope, const ForwardInputs& in,
                    Tensor& c, Tensor& x) const {
    const int batch = in.batch;
    const std::string b = "single_transformer_blocks." + std::to_string(i) + ".";
    const std::vector<Tensor> m = models::modulation(ex, w, b + "norm.linear", c_silu, 3);
    Tensor* streams[2] = {&c, &x};
    Tensor hn[2], mlp[2];
    std::vector<models::StreamQkv> qkv(2);
    for (int s = 0; s < 2; ++s) {
      // Stream 0 (text) is replicated (or sharded): tiles holding the same one share its
      // computation.
      auto input_side = [&](const Exec& e) {
        Tensor h = models::norm_modulate(e, *streams[s], m[0], m[1], batch, cfg_.norm_eps, "norm");
        Tensor f = models::dense(e, w, b + "proj_mlp", h, "proj_mlp");
        gelu_tanh(e, f, "mlp_gelu");
        return std::vector<Tensor>{std::move(h), std::move(f)};
      };
      // The image stream's side is one section of work for a math thread (Exec::section).
      const double in_flops = 2.0 * static_cast<double>(streams[s]->numel()) *
                              static_cast<double>(w.get(b + "proj_mlp.weight").rows());
      std::vector<Tensor> hf = s == 0
                                   ? shared_work(ex, b + "text_in", {&c, &m[0], &m[1]}, input_side)
                                   : ex.section(in_flops, input_side);
      hn[s] = std::move(hf[0]);
      mlp[s] = std::move(hf[1]);
      qkv[s].x = &hn[s];
      qkv[s].text = s == 0;
      qkv[s].sharded = s == 1 || in.text_shard.has_value();
      qkv[s].total_tokens = s == 1          ? in.shard.total
                            : in.text_shard ? in.text_shard->total
                                            : c.rows() / batch;
      qkv[s].rope = s == 1 ? rope.image : rope.text;
      models::bind_diffusers_qkv(qkv[s], w, b + "attn", false);
    }
    const models::ModelQkv src(std::move(qkv), cfg_.head_dim, batch, cfg_.norm_eps);
    std::vector<Tensor> o = attn.attend(ex, src, {cfg_.heads, cfg_.head_dim, batch, "flux_single"});
    for (int s = 0; s < 2; ++s) {
      const Tensor& os = o[static_cast<size_t>(s)];
      auto output_side = [&](const Exec& e) {
        Tensor y = *streams[s];
        const Tensor cat = concat_cols(e, os, mlp[s], "attn_mlp_concat");
        gated_residual(e, y, models::dense(e, w, b + "proj_out", cat, "proj_out"), &m[2], batch,
                       "residual");
        return std::vector<Tensor>{std::move(y)};
      };
      if (s == 0) {
        c = std::move(shared_work(ex, b + "text_out", {&c, &os, &mlp[0], &m[2]}, output_side)[0]);
      } else {
        const double out_flops = 2.0 * static_cast<double>(x.rows()) *
                                 static_cast<double>(os.cols() + mlp[s].cols()) *
                                 static_cast<double>(w.get(b + "proj_out.weight").rows());
        x = std::move(ex.section(out_flops, output_side)[0]);
      }
    }
  }

  // Embeddings: c = context_embedder(text) [B*Nt, D];
  //   temb = silu(t_mlp(temb(sigma*1000)) + g_mlp(temb(guidance*1000)) + text_mlp(pooled)) [B, D]
  // (`text` false: a pipeline stage after the first, whose text stream arrives from the stage
  // before: c is left empty.)
  std::vector<Tensor> embeddings(const Exec& ex, const Weights& w, const ForwardInputs& in,
                                 bool text) const {
    const int batch = in.batch;
    Tensor c =
        text ? models::dense(ex, w, "context_embedder", *in.text, "context_embedder") : Tensor();
    const float ts = static_cast<float>(cfg_.timestep_scale);
    std::vector<float> t, g;
    for (float s : in.sigmas) t.push_back(s * ts);
    Tensor temb = models::embed_mlp(ex, w, "time_text_embed.timestep_embedder.linear_1",
                                    "time_text_embed.timestep_embedder.linear_2",
                                    timestep_embedding(ex, t, cfg_.timestep_dim));
    if (cfg_.guidance_embed) {
      COCO_CHECK(in.guidance.size() == static_cast<size_t>(batch), "FLUX needs guidance values");
      for (float v : in.guidance) g.push_back(v * ts);
      gated_residual(ex, temb,
                     models::embed_mlp(ex, w, "time_text_embed.guidance_embedder.linear_1",
                                       "time_text_embed.guidance_embedder.linear_2",
                                       timestep_embedding(ex, g, cfg_.timestep_dim)),
                     nullptr, batch, "temb_add");
    }
    if (cfg_.pooled_dim > 0)
      gated_residual(ex, temb,
                     models::embed_mlp(ex, w, "time_text_embed.text_embedder.linear_1",
                                       "time_text_embed.text_embedder.linear_2", *in.pooled),
                     nullptr, batch, "temb_add");
    silu(ex, temb, "temb_silu");
    return {std::move(c), std::move(temb)};
  }

  // forward: x [B*n, C*4], text [B*Nt, text_dim], pooled [B, 768] -> [B*n, C*4]
  //   h = x_embedder(x);  c = context_embedder(text)
  //   temb = t_mlp(temb(sigma*1000)) + g_mlp(temb(guidance*1000)) + text_mlp(pooled)
  //   double blocks, single blocks, out = proj_out(norm_out(h, temb))
  Tensor forward(const Exec& ex, const Weights& w, AttentionStrategy& attn,
                 const ForwardInputs& in) const override {
    const int batch = in.batch;
    // A pipeline stage after the first starts from the hidden states the stage before left.
    const StagePass* stage = in.stage;
    const bool embed = stage == nullptr || stage->first;
    Tensor h =
        embed ? models::dense(ex, w, "x_embedder", *in.x, "x_embedder") : std::move(*stage->image);
    // Text and timestep embeddings: the same on every tile, computed once per process.
    Mat key_values(1, in.sigmas.size() + in.guidance.size() + 1);
    {
      Eigen::Index i = 0;
      for (float v : in.sigmas) key_values(0, i++) = v;
      for (float v : in.guidance) key_values(0, i++) = v;
      key_values(0, i) = static_cast<float>(batch);
    }
    const Tensor key = Tensor::from(std::move(key_values));
    const Tensor no_pooled;
    std::vector<Tensor> ct =
        shared_work(ex, embed ? "flux_embeddings" : "flux_time_embeddings",
                    {in.text, in.pooled ? in.pooled : &no_pooled, &key},
                    [&](const Exec& e) { return embeddings(e, w, in, embed); });
    // Every stage embeds the timestep (its blocks' modulation needs it); a later stage's text
    // stream is the stage before's.
    Tensor c = embed ? std::move(ct[0]) : std::move(*stage->text);
    Tensor temb = std::move(ct[1]);
    models::check_finite(ex, "x_embedder", {&h});
    models::check_finite(ex, "context_embedder and time_text_embed", {&c, &temb});

    // RoPE ids: text tokens all at (0, 0, 0); image token (0, row, col).
    const RopeTable img_rope = rope_table(ex, models::image_positions(in.shard, in.grid, 0, 0),
                                          cfg_.rope_axes, cfg_.rope_theta);
    const RopeTable txt_rope =
        rope_table(ex, Eigen::MatrixXd::Zero(c.rows() / batch, 3), cfg_.rope_axes, cfg_.rope_theta);
    const models::StreamRope rope{&img_rope, &txt_rope};
    models::JointBlockOptions opt;
    opt.qk_norm_kernel = KernelClass::kRmsNorm;  // FluxAttention: torch.nn.RMSNorm
    opt.qk_norm = cfg_.qk_norm;
    opt.attention_kind = "flux_double";
    opt.sharded_text_tokens = models::sharded_text_tokens(in);
    const int nd = cfg_.double_blocks;
    auto kind = [&](int i) { return std::string(i < nd ? "flux double" : "flux single"); };
    auto block = [&](int i) {
      if (i < nd) {
        run_block(ex, kind(i), 1, [&] {
          models::joint_block(ex, w, attn, cfg_, "transformer_blocks." + std::to_string(i), kNames,
                              opt, temb, rope, in.shard.total, batch, h, c);
        });
        models::check_finite(ex, "transformer_blocks", {&h, &c}, i);
      } else {
        run_block(ex, kind(i), 1, [&] { single_block(ex, w, attn, i - nd, temb, rope, in, c, h); });
        models::check_finite(ex, "single_transformer_blocks", {&h, &c}, i - nd);
      }
    };
    // TeaCache4FLUX: transformer_blocks[0].norm1 of the image stream.
    auto tea_input = [&] {
      return nd > 0
                 ? models::first_block_modulated_input(ex, w, "transformer_blocks.0.norm1.linear",
                                                       temb, 6, h, batch, cfg_.norm_eps)
                 : models::first_block_modulated_input(ex, w,
                                                       "single_transformer_blocks.0.norm.linear",
                                                       temb, 3, h, batch, cfg_.norm_eps);
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
};

}  // namespace

ModelFamily flux_family() {
  ModelFamily f;
  f.name = "flux";
  f.summary = "FLUX.1: double-stream then single-stream blocks, 3-axis RoPE, pooled CLIP text";
  f.class_tokens = true;
  f.default_pooled_dim = 768;
  // TeaCache4FLUX/teacache_flux.py
  f.teacache_coefficients = {4.98651651e+02, -2.83781631e+02, 5.58554382e+01, -3.82021401e+00,
                             2.64230861e-01};
  f.stage_blocks = [](const ModelConfig& m) { return m.double_blocks + m.single_blocks; };
  f.check = [](const ModelConfig& m) { return rope_axes_problem(m, 3, "frame, row, column"); };
  f.make = [](const ModelConfig& cfg) -> std::unique_ptr<Model> {
    return std::make_unique<Flux>(cfg);
  };
  return f;
}

}  // namespace cocodiff::dit
