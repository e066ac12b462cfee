// Wan 2.1 text-to-video (diffusers WanTransformer3DModel, transformer_wan.py; Wan-Video/Wan2.1
// wan/modules/model.py): a 1 x 2 x 2 patch embedding of the video latent, then blocks of
//   self-attention over every video token (Q/K RMSNorm across all heads, 3-D RoPE over frame,
//   row and column), cross-attention to the text (no RoPE), a GELU-tanh FFN,
// each modulated by a per-block table plus a projection of the timestep embedding, and an
// output layer modulated by the timestep embedding itself. Tensor names are diffusers'.
//
// Under sequence parallelism only the self-attention goes through the strategy: the text is
// replicated, so each rank attends its own video tokens to every text token with no exchange,
// and each rank projects the text keys and values of every block itself (xDiT's Wan USP does
// the same: its cross-attention runs on the local sequence shard against the full text).

#include <cmath>
#include <string>

#include "dit/block_replay.hpp"
#include "dit/math_cache.hpp"
#include "dit/model_family.hpp"
#include "dit/models/common.hpp"
#include "dit/step_cache.hpp"

namespace cocodiff::dit {

namespace {

using models::SpecBuilder;

// x[b] = table + y[b]: a [1, D] table row added to each batch element's [B, D] row.
Tensor add_table(const Exec& ex, const Tensor& table_row, const Tensor& y) {
  Tensor out = y;
  if (!ex.phantom) out.mat().rowwise() += table_row.mat().row(0);
  ex.charge(OpKind::kElementwise, static_cast<double>(y.numel()),
            2.0 * static_cast<double>(y.numel()), "modulation_table",
            memory_shape(KernelClass::kAdd, y.numel(), y.cols()));
  return out;
}

// diffusers' WanTransformerBlock runs its norms, modulations and residuals in float32 on a bf16
// model (FP32LayerNorm, `.float()` before each norm and residual, `.type_as()` after): kernels
// that this model's bf16 charges leave out. `casts` conversions between bf16 and float32 of
// `like`'s shape (6 bytes an element: a bf16 copy of 1.5x the elements), and the extra bytes of
// one float32 op of class `twice` (a second op of its bf16 shape).
void charge_fp32(const Exec& ex, const Tensor& like, int casts, KernelClass twice,
                 std::string_view label) {
  const std::int64_t e = like.numel(), cast = e + e / 2;
  for (int i = 0; i < casts; ++i)
    ex.charge(OpKind::kCopy, 0, static_cast<double>(cast), label,
              memory_shape(KernelClass::kCopy, cast, like.cols()));
  ex.charge(OpKind::kElementwise, 0, 2.0 * static_cast<double>(e), label,
            memory_shape(twice, e, like.cols()));
}

class Wan final : public Model {
 public:
  explicit Wan(const ModelConfig& cfg) : Model(cfg) {}

  std::vector<TensorSpec> tensor_specs() const override {
    const std::int64_t d = cfg_.hidden();
    // llround: a ratio such as 35/6 (8960 / 1536) is not exact in binary.
    const std::int64_t ffn = std::llround(static_cast<double>(d) * cfg_.mlp_ratio);
    const std::int64_t p = cfg_.patch_size;
    SpecBuilder sb;
    sb.tensor("patch_embedding.weight", {d, cfg_.latent_channels, 1, p, p}, InitKind::kLinear);
    sb.tensor("patch_embedding.bias", {d}, InitKind::kBias);
    sb.linear("condition_embedder.time_embedder.linear_1", d, cfg_.timestep_dim);
    sb.linear("condition_embedder.time_embedder.linear_2", d, d);
    sb.linear("condition_embedder.time_proj", 6 * d, d);
    sb.linear("condition_embedder.text_embedder.linear_1", d, cfg_.text_dim);
    sb.linear("condition_embedder.text_embedder.linear_2", d, d);
    for (int i = 0; i < cfg_.double_blocks; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      for (const char* a : {"attn1", "attn2"}) {
        for (const char* proj : {".to_q", ".to_k", ".to_v", ".to_out.0"})
          sb.linear(b + a + proj, d, d);
        sb.norm(b + a + ".norm_q", d);
        sb.norm(b + a + ".norm_k", d);
      }
      sb.norm(b + "norm2", d);
      sb.tensor(b + "norm2.bias", {d}, InitKind::kBias);
      sb.linear(b + "ffn.net.0.proj", ffn, d);
      sb.linear(b + "ffn.net.2", d, ffn);
      sb.tensor(b + "scale_shift_table", {1, 6, d}, InitKind::kBias);
    }
    sb.linear("proj_out", p * p * cfg_.out_channels, d);
    sb.tensor("scale_shift_table", {1, 2, d}, InitKind::kBias);
    if (cfg_.num_classes > 0)  // learned conditioning tokens in place of a text encoder, as
                               // flux1-fmnist's; row num_classes is the null condition of CFG
      sb.embedding("class_embedding.text", cfg_.num_classes + 1,
                   std::int64_t{cfg_.text_tokens} * cfg_.text_dim);
    return sb.take();
  }

  // forward: x [B*n, C*p*p] -> velocity [B*n, C*p*p]
  //   h = patch_embed(x);  temb = t_mlp(temb(sigma * 1000));  tp = time_proj(silu(temb))
  //   text = text_mlp(text);  per block: m = table + tp (6 x [B, D])
  //     h += m2 * self_attn(LN(h) * (1 + m1) + m0);  h += cross_attn(LN_affine(h), text)
  //     h += m5 * ffn(LN(h) * (1 + m4) + m3)
  //   out = proj_out(LN(h) * (1 + table1 + temb) + table0 + temb)   ((pt, py, px, c) order)
  Tensor forward(const Exec& ex, const Weights& w, AttentionStrategy& attn,
                 const ForwardInputs& in) const override {
    const int batch = in.batch;
    COCO_CHECK(in.text != nullptr, "Wan needs text embeddings");
    // A pipeline stage after the first starts from the video hidden states the stage before
    // left. The text is no stream of the blocks: every stage projects it itself for its blocks'
    // cross-attention, as every rank does under sequence parallelism.
    const StagePass* stage = in.stage;
    Tensor h = stage == nullptr || stage->first
                   ? models::dense(ex, w, "patch_embedding", *in.x, "patch_embed")  // [B*n, D]
                   : std::move(*stage->image);
    std::vector<float> t;
    for (float s : in.sigmas) t.push_back(s * static_cast<float>(cfg_.timestep_scale));
    const Tensor temb = models::embed_mlp(ex, w, "condition_embedder.time_embedder.linear_1",
                                          "condition_embedder.time_embedder.linear_2",
                                          timestep_embedding(ex, t, cfg_.timestep_dim));
    Tensor temb_silu = temb;
    silu(ex, temb_silu, "temb_silu");
    const Tensor tp = models::dense(ex, w, "condition_embedder.time_proj", temb_silu, "time_proj");
    // The text projection is the same on every tile: computed once per process.
    const Tensor text = shared_work(ex, "wan/text_embedder", {in.text}, [&](const Exec& e) {
      return std::vector<Tensor>{models::mlp_gelu(e, w, "condition_embedder.text_embedder.linear_1",
                                                  "condition_embedder.text_embedder.linear_2",
                                                  *in.text)};
    })[0];
    const RopeTable rope = rope_table(ex, models::image_positions(in.shard, in.grid, 0, 0),
                                      cfg_.rope_axes, cfg_.rope_theta);
    models::check_finite(ex, "patch_embedding", {&h});
    models::check_finite(ex, "condition_embedder", {&temb, &tp, &text});

    static constexpr const char* kKind = "wan";
    auto one_block = [&](int i) {
      // diffusers' WanTransformer3DModel holds its blocks in `blocks`.
      run_block(
          ex, kKind, 1, [&] { block(ex, w, attn, in, i, tp, text, rope, h); }, "blocks");
      models::check_finite(ex, "blocks", {&h}, i);
    };
    // TeaCache4Wan2.1 reads the timestep projection (its e0) rather than a norm's output.
    const int b0 = stage != nullptr ? stage->first_block : 0;
    const int b1 = stage != nullptr ? stage->last_block : cfg_.double_blocks;
    run_blocks(
        ex, b1 - b0, [&](int i) { one_block(b0 + i); }, {&h}, [&] { return tp; },
        [](int) { return std::string(kKind); });
    if (stage != nullptr && !stage->last) {
      *stage->image = std::move(h);
      return Tensor();
    }
    const Tensor& table = w.get("scale_shift_table");
    const Tensor shift = add_table(ex, chunk(table, 0, 2), temb);
    const Tensor scale = add_table(ex, chunk(table, 1, 2), temb);
    const Tensor hf = models::norm_modulate(ex, h, shift, scale, batch, cfg_.norm_eps, "norm_out");
    const Tensor out = models::dense(ex, w, "proj_out", hf, "proj_out");
    models::check_finite(ex, "proj_out", {&out});
    return patch_order_pqc_to_cpq(ex, out, cfg_.out_channels,
                                  in.all_channels ? cfg_.out_channels : cfg_.latent_channels,
                                  cfg_.patch_size);
  }

 private:
  // One WanTransformerBlock on the local tokens h [B*n, D].
  void block(const Exec& ex, const Weights& w, AttentionStrategy& attn, const ForwardInputs& in,
             int i, const Tensor& tp, const Tensor& text, const RopeTable& rope, Tensor& h) const {
    const int batch = in.batch;
    const float eps = cfg_.norm_eps;
    const std::string b = "blocks." + std::to_string(i) + ".";
    // shift, scale, gate of the self-attention, then of the FFN: table + timestep projection.
    const std::vector<Tensor> m = shared_work(ex, b + "modulation", {&tp}, [&](const Exec& e) {
      std::vector<Tensor> out;
      const Tensor& table = w.get(b + "scale_shift_table");
      for (int k = 0; k < 6; ++k) out.push_back(add_table(e, chunk(table, k, 6), chunk(tp, k, 6)));
      return out;
    });

    // Self-attention through the strategy; Q and K normalised over all heads first.
    const Tensor hn = models::norm_modulate(ex, h, m[0], m[1], batch, eps, "norm1");
    // norm1(h.float()) * (1 + scale) + shift, .type_as(h): 2 casts, norm and modulation at fp32.
    charge_fp32(ex, h, 2, KernelClass::kLayerNorm, "norm1_fp32");
    charge_fp32(ex, h, 0, KernelClass::kModulateEager, "norm1_fp32");
    const Tensor q =
        rms_norm(ex, models::dense(ex, w, b + "attn1.to_q", hn, "q_proj"),
                 w.get(b + "attn1.norm_q.weight"), eps, "q_norm", KernelClass::kRmsNorm);
    const Tensor k =
        rms_norm(ex, models::dense(ex, w, b + "attn1.to_k", hn, "k_proj"),
                 w.get(b + "attn1.norm_k.weight"), eps, "k_norm", KernelClass::kRmsNorm);
    const Tensor v = models::dense(ex, w, b + "attn1.to_v", hn, "v_proj");
    models::StreamQkv s;
    s.x = &hn;
    s.sharded = true;
    s.total_tokens = in.shard.total;
    s.projected[0] = &q;
    s.projected[1] = &k;
    s.projected[2] = &v;
    s.rope = &rope;
    const models::ModelQkv src({s}, cfg_.head_dim, batch, eps);
    const std::vector<Tensor> o =
        attn.attend(ex, src, {cfg_.heads, cfg_.head_dim, batch, "wan_self"});
    gated_residual(ex, h, models::dense(ex, w, b + "attn1.to_out.0", o[0], "attn_out"), &m[2],
                   batch, "residual");
    // (h.float() + attn * gate).type_as(h): 2 casts, the residual at float32.
    charge_fp32(ex, h, 2, KernelClass::kGatedResidualEager, "residual_fp32");

    // Cross-attention of the local tokens to the whole text; the text's keys and values are
    // the same on every tile.
    const Tensor n2 =
        layer_norm_affine(ex, h, w.get(b + "norm2.weight"), w.get(b + "norm2.bias"), eps, "norm2");
    // norm2(h.float()).type_as(h): 2 casts, the norm at float32.
    charge_fp32(ex, h, 2, KernelClass::kLayerNormAffine, "norm2_fp32");
    const Tensor q2 =
        rms_norm(ex, models::dense(ex, w, b + "attn2.to_q", n2, "cross_q_proj"),
                 w.get(b + "attn2.norm_q.weight"), eps, "cross_q_norm", KernelClass::kRmsNorm);
    const std::vector<Tensor> kv = shared_work(ex, b + "attn2.kv", {&text}, [&](const Exec& e) {
      Tensor k2 =
          rms_norm(e, models::dense(e, w, b + "attn2.to_k", text, "cross_k_proj"),
                   w.get(b + "attn2.norm_k.weight"), eps, "cross_k_norm", KernelClass::kRmsNorm);
      return std::vector<Tensor>{std::move(k2),
                                 models::dense(e, w, b + "attn2.to_v", text, "cross_v_proj")};
    });
    const Tensor o2 =
        attention(ex, q2, kv[0], kv[1], cfg_.heads, cfg_.head_dim, batch, "cross_attn");
    gated_residual(ex, h, models::dense(ex, w, b + "attn2.to_out.0", o2, "cross_out"), nullptr,
                   batch, "residual");

    const Tensor n3 = models::norm_modulate(ex, h, m[3], m[4], batch, eps, "norm3");
    charge_fp32(ex, h, 2, KernelClass::kLayerNorm, "norm3_fp32");
    charge_fp32(ex, h, 0, KernelClass::kModulateEager, "norm3_fp32");
    gated_residual(ex, h, models::mlp_gelu(ex, w, b + "ffn.net.0.proj", b + "ffn.net.2", n3), &m[5],
                   batch, "residual");
    // (h.float() + ff.float() * gate).type_as(h): 3 casts, the residual at float32.
    charge_fp32(ex, h, 3, KernelClass::kGatedResidualEager, "residual_fp32");
  }
};

}  // namespace

ModelFamily wan_family() {
  ModelFamily f;
  f.name = "wan";
  f.summary = "Wan 2.1: video self-attention with 3-D RoPE, cross-attention to the text";
  f.video = true;
  f.joint_text = false;
  f.class_tokens = true;
  // PipeFusion's patches of a video are runs of token rows taken frame after frame
  // (dit/parallel/pipefusion.hpp).
  f.stage_blocks = [](const ModelConfig& m) { return m.double_blocks; };
  f.check = [](const ModelConfig& m) -> std::optional<ModelConfigProblem> {
    if (auto bad = rope_axes_problem(m, 3, "frame, row, column")) return bad;
    if (m.pooled_dim != 0)
      return ModelConfigProblem{"pooled_dim", "0 (Wan has no pooled text embedding)",
                                std::to_string(m.pooled_dim)};
    return std::nullopt;
  };
  f.make = [](const ModelConfig& cfg) -> std::unique_ptr<Model> {
    return std::make_unique<Wan>(cfg);
  };
  return f;
}

}  // namespace cocodiff::dit
