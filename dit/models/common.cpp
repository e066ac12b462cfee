#include "dit/models/common.hpp"

#include "core/errors.hpp"
#include "dit/math_cache.hpp"

namespace cocodiff::dit::models {

void SpecBuilder::linear(const std::string& name, std::int64_t out, std::int64_t in, bool bias) {
  specs_.push_back({name + ".weight", {out, in}, InitKind::kLinear});
  if (bias) specs_.push_back({name + ".bias", {out}, InitKind::kBias});
}

void SpecBuilder::conv(const std::string& name, std::int64_t out, std::int64_t in, std::int64_t p) {
  specs_.push_back({name + ".weight", {out, in, p, p}, InitKind::kLinear});
  specs_.push_back({name + ".bias", {out}, InitKind::kBias});
}

void SpecBuilder::tensor(const std::string& name, std::vector<std::int64_t> shape, InitKind init) {
  specs_.push_back({name, std::move(shape), init});
}

void SpecBuilder::norm(const std::string& name, std::int64_t dim) {
  specs_.push_back({name + ".weight", {dim}, InitKind::kNorm});
}

void SpecBuilder::embedding(const std::string& name, std::int64_t rows, std::int64_t cols) {
  specs_.push_back({name + ".weight", {rows, cols}, InitKind::kEmbedding});
}

void check_finite(const Exec& ex, std::string_view layer,
                  std::initializer_list<const Tensor*> outputs, int index) {
  if (ex.phantom) return;
  for (const Tensor* t : outputs)
    if (t != nullptr && !t->phantom() && t->numel() > 0 && !t->mat().allFinite())
      throw NumericError("non-finite values (NaN or infinity) first appear in the output of " +
                         std::string(layer) +
                         (index >= 0 ? "." + std::to_string(index) : std::string()) +
                         " (weights or inputs that overflow float32, whose largest finite value "
                         "is 3.4e38)");
}

Tensor dense(const Exec& ex, const Weights& w, const std::string& prefix, const Tensor& x,
             std::string_view label, RowRange rows) {
  return linear(ex, x, w.get(prefix + ".weight"), w.find(prefix + ".bias"), label, rows);
}

// mlp: y[N, D] = fc2(gelu_tanh(fc1(x[N, D]) [N, F]))
Tensor mlp_gelu(const Exec& ex, const Weights& w, const std::string& fc1, const std::string& fc2,
                const Tensor& x) {
  const double flops =
      4.0 * static_cast<double>(x.numel()) * static_cast<double>(w.get(fc1 + ".weight").rows());
  return ex.section(flops, [&](const Exec& e) {
    Tensor h = dense(e, w, fc1, x, "mlp_fc1");
    gelu_tanh(e, h, "mlp_gelu");
    return dense(e, w, fc2, h, "mlp_fc2");
  });
}

// embed_mlp: y[B, D] = lin2(silu(lin1(x[B, in])))
Tensor embed_mlp(const Exec& ex, const Weights& w, const std::string& lin1, const std::string& lin2,
                 const Tensor& x) {
  Tensor h = dense(ex, w, lin1, x, "embed_fc1");
  silu(ex, h, "embed_silu");
  return dense(ex, w, lin2, h, "embed_fc2");
}

// modulation: [B, n*D] = linear(silu(c)) -> n chunks of [B, D]
// (the same on every tile: computed once per process for each conditioning)
std::vector<Tensor> modulation(const Exec& ex, const Weights& w, const std::string& prefix,
                               const Tensor& c_silu, int n) {
  return shared_work(ex, prefix + "/adaln" + std::to_string(n), {&c_silu}, [&](const Exec& e) {
    const Tensor m = dense(e, w, prefix, c_silu, "adaln");
    std::vector<Tensor> out;
    for (int i = 0; i < n; ++i) out.push_back(chunk(m, i, n));
    return out;
  });
}

Tensor norm_modulate(const Exec& ex, const Tensor& x, const Tensor& shift, const Tensor& scale,
                     int batch, float eps, std::string_view label) {
  Tensor h = layer_norm(ex, x, eps, label);
  modulate(ex, h, shift, scale, batch, "modulate");
  return h;
}

Tensor first_block_modulated_input(const Exec& ex, const Weights& w, const std::string& prefix,
                                   const Tensor& c_silu, int chunks, const Tensor& x, int batch,
                                   float eps) {
  const std::vector<Tensor> m = modulation(ex, w, prefix, c_silu, chunks);
  return norm_modulate(ex, x, m[0], m[1], batch, eps, "teacache_norm1");
}

Tensor ModelQkv::project(const Exec& ex, int s, QkvPart part, int h0, int h1) const {
  const StreamQkv& st = at(s);
  const int p = static_cast<int>(part);
  // A view of a projection made before (a column slice in PyTorch: not charged).
  if (const Tensor* pre = st.projected[p]) {
    const std::int64_t c0 = std::int64_t{h0} * head_dim_, c1 = std::int64_t{h1} * head_dim_;
    if (c0 == 0 && c1 == pre->cols()) return *pre;
    if (pre->phantom()) return Tensor::zeros(pre->rows(), c1 - c0, true);
    return Tensor::from(pre->mat().middleCols(c0, c1 - c0));
  }
  static constexpr std::string_view kLabels[3] = {"q_proj", "k_proj", "v_proj"};
  const std::int64_t off = st.row_offset[p];
  return linear(ex, *st.x, *st.w[p], st.b[p], kLabels[p],
                RowRange{off + std::int64_t{h0} * head_dim_, off + std::int64_t{h1} * head_dim_});
}

void ModelQkv::prepare(const Exec& ex, int s, QkvPart part, Tensor& x, int h0, int h1,
                       std::int64_t token0) const {
  if (part == QkvPart::kV) return;
  const StreamQkv& st = at(s);
  const int p = static_cast<int>(part);
  // Labels by part (Q, K) and by whether the op reads a strided view (ex.strided_input): the
  // first op does; the norm writes a contiguous tensor for the RoPE.
  static constexpr std::string_view kNorm[2][2] = {{"q_norm", "q_norm_strided"},
                                                   {"k_norm", "k_norm_strided"}};
  static constexpr std::string_view kRope[2][2] = {{"q_rope", "q_rope_strided"},
                                                   {"k_rope", "k_rope_strided"}};
  const bool has_norm = st.norm[p] != nullptr && st.projected[p] == nullptr;
  if (has_norm)
    rms_norm_heads(ex, x, *st.norm[p], head_dim_, eps_, kNorm[p][ex.strided_input], st.norm_kernel);
  if (st.rope != nullptr)
    apply_rope(ex, x, *st.rope, h1 - h0, batch_, kRope[p][ex.strided_input && !has_norm], token0);
}

void bind_diffusers_qkv(StreamQkv& s, const Weights& w, const std::string& attn_prefix,
                        bool text_stream) {
  static const char* kImg[3] = {".to_q", ".to_k", ".to_v"};
  static const char* kTxt[3] = {".add_q_proj", ".add_k_proj", ".add_v_proj"};
  for (int p = 0; p < 3; ++p) {
    const std::string base = attn_prefix + (text_stream ? kTxt[p] : kImg[p]);
    s.w[p] = &w.get(base + ".weight");
    s.b[p] = w.find(base + ".bias");
  }
  s.norm[0] = w.find(attn_prefix + (text_stream ? ".norm_added_q" : ".norm_q") + ".weight");
  s.norm[1] = w.find(attn_prefix + (text_stream ? ".norm_added_k" : ".norm_k") + ".weight");
}

void joint_block_specs(SpecBuilder& sb, const std::string& prefix, std::int64_t dim,
                       std::int64_t head_dim, std::int64_t mlp_hidden, const JointNames& names,
                       const JointBlockOptions& opt) {
  const std::string p = prefix + ".";
  sb.linear(p + names.img_mod, (opt.dual_attention ? 9 : 6) * dim, dim);
  sb.linear(p + names.txt_mod, (opt.context_pre_only ? 2 : 6) * dim, dim);
  for (const char* n : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"})
    sb.linear(p + "attn." + n, dim, dim);
  if (opt.qk_norm)
    for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"})
      sb.norm(p + "attn." + n, head_dim);
  sb.linear(p + "attn.to_out.0", dim, dim);
  if (!opt.context_pre_only) sb.linear(p + "attn.to_add_out", dim, dim);
  if (opt.dual_attention) {
    for (const char* n : {"to_q", "to_k", "to_v"}) sb.linear(p + "attn2." + n, dim, dim);
    if (opt.qk_norm)
      for (const char* n : {"norm_q", "norm_k"}) sb.norm(p + "attn2." + n, head_dim);
    sb.linear(p + "attn2.to_out.0", dim, dim);
  }
  sb.linear(p + names.img_mlp + ".net.0.proj", mlp_hidden, dim);
  sb.linear(p + names.img_mlp + ".net.2", dim, mlp_hidden);
  if (!opt.context_pre_only) {
    sb.linear(p + names.txt_mlp + ".net.0.proj", mlp_hidden, dim);
    sb.linear(p + names.txt_mlp + ".net.2", dim, mlp_hidden);
  }
}

void joint_block(const Exec& ex, const Weights& w, AttentionStrategy& attn, const ModelConfig& cfg,
                 const std::string& prefix, const JointNames& names, const JointBlockOptions& opt,
                 const Tensor& c_silu, const StreamRope& rope, std::int64_t image_tokens, int batch,
                 Tensor& x, Tensor& c) {
  const std::string p = prefix + ".";
  const float eps = cfg.norm_eps;
  // Modulation vectors, each [B, D]: shift, scale, gate of the attention and of the MLP.
  const std::vector<Tensor> mi =
      modulation(ex, w, p + names.img_mod, c_silu, opt.dual_attention ? 9 : 6);
  const std::vector<Tensor> mt =
      modulation(ex, w, p + names.txt_mod, c_silu, opt.context_pre_only ? 2 : 6);
  const Tensor hi = norm_modulate(ex, x, mi[0], mi[1], batch, eps, "norm1");
  // AdaLayerNormContinuous (context_pre_only) chunks are (scale, shift).
  const Tensor ht = opt.context_pre_only
                        ? norm_modulate(ex, c, mt[1], mt[0], batch, eps, "norm1_context")
                        : norm_modulate(ex, c, mt[0], mt[1], batch, eps, "norm1_context");
  Tensor hi2;
  if (opt.dual_attention) hi2 = norm_modulate(ex, x, mi[6], mi[7], batch, eps, "norm1_x2");

  // Joint attention over [text, image] (or [image, text]).
  StreamQkv img, txt;
  img.x = &hi;
  img.sharded = true;
  img.total_tokens = image_tokens;
  img.rope = rope.image;
  bind_diffusers_qkv(img, w, p + "attn", false);
  txt.x = &ht;
  txt.text = true;
  txt.sharded = opt.sharded_text_tokens > 0;
  txt.total_tokens = txt.sharded ? opt.sharded_text_tokens : c.rows() / batch;
  txt.rope = rope.text;
  txt.wants_output = !opt.context_pre_only;
  bind_diffusers_qkv(txt, w, p + "attn", true);
  img.norm_kernel = txt.norm_kernel = opt.qk_norm_kernel;
  const int img_index = opt.text_first ? 1 : 0;
  std::vector<StreamQkv> streams =
      opt.text_first ? std::vector<StreamQkv>{txt, img} : std::vector<StreamQkv>{img, txt};
  const ModelQkv src(std::move(streams), cfg.head_dim, batch, eps);
  std::vector<Tensor> out =
      attn.attend(ex, src, {cfg.heads, cfg.head_dim, batch, opt.attention_kind});
  gated_residual(ex, x,
                 dense(ex, w, p + "attn.to_out.0", out[static_cast<size_t>(img_index)], "attn_out"),
                 &mi[2], batch, "residual");
  if (opt.dual_attention) {
    StreamQkv img2;
    img2.x = &hi2;
    img2.sharded = true;
    img2.total_tokens = image_tokens;
    bind_diffusers_qkv(img2, w, p + "attn2", false);
    img2.norm_kernel = opt.qk_norm_kernel;
    const ModelQkv src2({img2}, cfg.head_dim, batch, eps);
    std::vector<Tensor> out2 = attn.attend(ex, src2, {cfg.heads, cfg.head_dim, batch, "sd3_attn2"});
    gated_residual(ex, x, dense(ex, w, p + "attn2.to_out.0", out2[0], "attn2_out"), &mi[8], batch,
                   "residual");
  }
  const Tensor fi = norm_modulate(ex, x, mi[3], mi[4], batch, eps, "norm2");
  gated_residual(
      ex, x, mlp_gelu(ex, w, p + names.img_mlp + ".net.0.proj", p + names.img_mlp + ".net.2", fi),
      &mi[5], batch, "residual");
  if (opt.context_pre_only) return;
  // Replicated text: every tile holding the same c and text attention output shares one
  // computation of its update (sharded text: those holding the same shard).
  const Tensor& ot = out[static_cast<size_t>(1 - img_index)];
  std::vector<Tensor> cn = shared_work(
      ex, p + "text_update", {&c, &ot, &mt[2], &mt[3], &mt[4], &mt[5]}, [&](const Exec& e) {
        Tensor cu = c;
        gated_residual(e, cu, dense(e, w, p + "attn.to_add_out", ot, "attn_add_out"), &mt[2], batch,
                       "residual");
        const Tensor ft = norm_modulate(e, cu, mt[3], mt[4], batch, eps, "norm2_context");
        gated_residual(
            e, cu,
            mlp_gelu(e, w, p + names.txt_mlp + ".net.0.proj", p + names.txt_mlp + ".net.2", ft),
            &mt[5], batch, "residual");
        return std::vector<Tensor>{std::move(cu)};
      });
  c = std::move(cn[0]);
}

std::int64_t sharded_text_tokens(const ForwardInputs& in) {
  return in.text_shard ? in.text_shard->total : 0;
}

Eigen::MatrixXd text_positions(const ForwardInputs& in, const Eigen::MatrixXd& all) {
  if (!in.text_shard) return all;
  return all.middleRows(in.text_shard->begin, in.text_shard->count);
}

Tensor final_layer_continuous(const Exec& ex, const Weights& w, const Tensor& x,
                              const Tensor& c_silu, int batch, float eps) {
  const std::vector<Tensor> m = modulation(ex, w, "norm_out.linear", c_silu, 2);
  const Tensor h = norm_modulate(ex, x, /*shift=*/m[1], /*scale=*/m[0], batch, eps, "norm_out");
  return dense(ex, w, "proj_out", h, "proj_out");
}

void add_positional(const Exec& ex, Tensor& x, const Tensor& pos, int batch) {
  COCO_CHECK(x.rows() == pos.rows() * batch && x.cols() == pos.cols(),
             "add_positional: x " + x.shape_str() + " pos " + pos.shape_str());
  if (!ex.phantom)
    for (int b = 0; b < batch; ++b) x.mat().middleRows(b * pos.rows(), pos.rows()) += pos.mat();
  ex.charge(OpKind::kElementwise, static_cast<double>(x.numel()),
            3.0 * static_cast<double>(x.numel()), "pos_add",
            memory_shape(KernelClass::kAdd, x.numel(), x.cols()));
}

Tensor embedding_lookup(const Exec& ex, const Tensor& table, const std::vector<int>& ids) {
  Tensor y = Tensor::zeros(static_cast<std::int64_t>(ids.size()), table.cols(), ex.phantom);
  for (size_t b = 0; b < ids.size(); ++b) {
    COCO_CHECK(ids[b] >= 0 && ids[b] < table.rows(), "embedding id out of range");
    if (!ex.phantom) y.mat().row(static_cast<Eigen::Index>(b)) = table.mat().row(ids[b]);
  }
  ex.charge(OpKind::kCopy, 0, 2.0 * static_cast<double>(y.numel()), "embedding");
  return y;
}

Eigen::MatrixXd image_positions(const TokenShard& shard, const TokenGrid& grid, double row_offset,
                                double col_offset) {
  Eigen::MatrixXd pos(shard.count, 3);
  const std::int64_t plane = grid.frame_tokens();
  for (std::int64_t t = 0; t < shard.count; ++t) {
    const std::int64_t g = shard.begin + t;
    const std::int64_t in_frame = g % plane;
    pos(t, 0) = static_cast<double>(g / plane);
    pos(t, 1) = static_cast<double>(in_frame / grid.width) + row_offset;
    pos(t, 2) = static_cast<double>(in_frame % grid.width) + col_offset;
  }
  return pos;
}

}  // namespace cocodiff::dit::models
