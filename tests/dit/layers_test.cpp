// Each DiT layer against a hand-computed or closed-form case, and its charged cost.

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dit/layers.hpp"
#include "dit/local_comm.hpp"

namespace cocodiff::dit {
namespace {

Tensor random(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Mat m(rows, cols);
  for (std::int64_t i = 0; i < m.size(); ++i) m.data()[i] = n(rng);
  return Tensor::from(std::move(m));
}

TEST(Layers, LinearMatchesHandComputationAndChargesGemm) {
  LocalComm comm;
  const Exec ex{comm, false};
  Mat x(2, 3), w(2, 3), b(1, 2);
  x << 1, 2, 3, 4, 5, 6;
  w << 1, 0, -1, 0.5, 0.5, 0.5;
  b << 10, 20;
  const Tensor xt = Tensor::from(x), wt = Tensor::from(w), bt = Tensor::from(b);
  const Tensor y = linear(ex, xt, wt, &bt, "proj");
  EXPECT_FLOAT_EQ(y.mat()(0, 0), 1 - 3 + 10);
  EXPECT_FLOAT_EQ(y.mat()(0, 1), 3 + 20);
  EXPECT_FLOAT_EQ(y.mat()(1, 0), 4 - 6 + 10);
  EXPECT_FLOAT_EQ(y.mat()(1, 1), 7.5 + 20);
  EXPECT_DOUBLE_EQ(comm.flops(), 2.0 * 2 * 3 * 2);
  // Row range: only output feature 1.
  const Tensor y1 = linear(ex, xt, wt, &bt, "proj", RowRange{1, 2});
  ASSERT_EQ(y1.cols(), 1);
  EXPECT_FLOAT_EQ(y1.mat()(1, 0), 7.5 + 20);
}

TEST(Layers, LayerNormAndRmsNorm) {
  LocalComm comm;
  const Exec ex{comm, false};
  Mat x(1, 4);
  x << 1, 2, 3, 4;  // mean 2.5, var 1.25
  const Tensor ln = layer_norm(ex, Tensor::from(x), 0.0f, "ln");
  const float s = 1.0f / std::sqrt(1.25f);
  EXPECT_NEAR(ln.mat()(0, 0), -1.5f * s, 1e-6);
  EXPECT_NEAR(ln.mat()(0, 3), 1.5f * s, 1e-6);
  Mat w(1, 4);
  w << 1, 2, 1, 0.5;
  const Tensor rn = rms_norm(ex, Tensor::from(x), Tensor::from(w), 0.0f, "rms");
  const float r = std::sqrt((1 + 4 + 9 + 16) / 4.0f);  // sqrt(7.5)
  EXPECT_NEAR(rn.mat()(0, 1), 2 / r * 2, 1e-6);
  EXPECT_NEAR(rn.mat()(0, 3), 4 / r * 0.5f, 1e-6);
  // Per-head: two heads of 2 normalised independently.
  Tensor h = Tensor::from(x);
  Mat hw(1, 2);
  hw << 1, 1;
  rms_norm_heads(ex, h, Tensor::from(hw), 2, 0.0f, "qn");
  EXPECT_NEAR(h.mat()(0, 0), 1 / std::sqrt(2.5f), 1e-6);
  EXPECT_NEAR(h.mat()(0, 3), 4 / std::sqrt(12.5f), 1e-6);
}

TEST(Layers, GeluTanhSiluSwiglu) {
  LocalComm comm;
  const Exec ex{comm, false};
  Mat x(1, 4);
  x << -2, -0.5, 0, 1.5;
  Tensor g = Tensor::from(x);
  gelu_tanh(ex, g, "gelu");
  // torch.nn.functional.gelu(x, approximate="tanh")
  EXPECT_NEAR(g.mat()(0, 0), -0.04540230, 1e-6);
  EXPECT_NEAR(g.mat()(0, 1), -0.15428599, 1e-6);
  EXPECT_NEAR(g.mat()(0, 2), 0.0, 1e-7);
  EXPECT_NEAR(g.mat()(0, 3), 1.39957158, 1e-6);
  Tensor s = Tensor::from(x);
  silu(ex, s, "silu");
  EXPECT_NEAR(s.mat()(0, 0), -2 / (1 + std::exp(2.0f)), 1e-6);
  EXPECT_NEAR(s.mat()(0, 3), 1.5 / (1 + std::exp(-1.5f)), 1e-6);
  const Tensor sw = swiglu(ex, Tensor::from(x), "swiglu");  // silu([-2,-.5]) * [0, 1.5]
  EXPECT_NEAR(sw.mat()(0, 0), 0.0, 1e-7);
  EXPECT_NEAR(sw.mat()(0, 1), -0.5 / (1 + std::exp(0.5f)) * 1.5, 1e-6);
}

TEST(Layers, ModulateAndGatedResidualPerBatchElement) {
  LocalComm comm;
  const Exec ex{comm, false};
  Tensor x = Tensor::from(Mat::Ones(4, 2));  // batch 2 x 2 tokens
  Mat shift(2, 2), scale(2, 2);
  shift << 1, 2, 3, 4;
  scale << 0, 1, -1, 2;
  modulate(ex, x, Tensor::from(shift), Tensor::from(scale), 2, "mod");
  EXPECT_FLOAT_EQ(x.mat()(1, 1), 1 * 2 + 2);
  EXPECT_FLOAT_EQ(x.mat()(2, 0), 0 + 3);
  EXPECT_FLOAT_EQ(x.mat()(3, 1), 3 + 4);
  Tensor r = Tensor::from(Mat::Zero(4, 2));
  const Tensor gate = Tensor::from(scale);
  gated_residual(ex, r, x, &gate, 2, "res");
  EXPECT_FLOAT_EQ(r.mat()(3, 1), 7 * 2);
  EXPECT_FLOAT_EQ(r.mat()(0, 0), 0);
}

TEST(Layers, TimestepEmbeddingValues) {
  LocalComm comm;
  const Exec ex{comm, false};
  const Tensor e = timestep_embedding(ex, {0.0f, 500.0f}, 8);
  // half = 4, f_i = 10000^(-i/4): 1, 0.1, 0.01, 0.001
  EXPECT_FLOAT_EQ(e.mat()(0, 0), 1.0f);
  EXPECT_FLOAT_EQ(e.mat()(0, 4), 0.0f);
  EXPECT_NEAR(e.mat()(1, 0), std::cos(500.0), 1e-5);
  EXPECT_NEAR(e.mat()(1, 5), std::sin(50.0), 1e-5);
  EXPECT_NEAR(e.mat()(1, 7), std::sin(0.5), 1e-5);
}

TEST(Layers, RopePreservesNormsAndDependsOnRelativePosition) {
  LocalComm comm;
  const Exec ex{comm, false};
  const std::vector<int> axes{4, 6, 6};
  const int d = 16, heads = 2;
  // Four tokens: positions p and p + delta along each axis, twice (different offsets).
  Eigen::MatrixXd pos(4, 3);
  pos << 0, 3, 5, 0, 7, 2, 1, 10, 12, 1, 14, 9;  // rows 1 - 0 == rows 3 - 2 = (0, 4, -3)
  const RopeTable t = rope_table(ex, pos, axes, 10000.0);
  const Tensor base = random(1, std::int64_t{heads} * d, 1);
  const Tensor base_k = random(1, std::int64_t{heads} * d, 2);
  Tensor q = Tensor::from(base.mat().replicate(4, 1));
  Tensor k = Tensor::from(base_k.mat().replicate(4, 1));
  apply_rope(ex, q, t, heads, 1, "rope");
  apply_rope(ex, k, t, heads, 1, "rope");
  for (int r = 0; r < 4; ++r) EXPECT_NEAR(q.mat().row(r).norm(), base.mat().norm(), 1e-4);
  for (int h = 0; h < heads; ++h) {
    const float s01 = q.mat().row(1).segment(h * d, d).dot(k.mat().row(0).segment(h * d, d));
    const float s23 = q.mat().row(3).segment(h * d, d).dot(k.mat().row(2).segment(h * d, d));
    const float s02 = q.mat().row(2).segment(h * d, d).dot(k.mat().row(0).segment(h * d, d));
    EXPECT_NEAR(s01, s23, 1e-4) << "score must depend only on the position difference";
    EXPECT_GT(std::abs(s01 - s02), 1e-3) << "a different offset must change the score";
  }
  // Position zero is the identity.
  Eigen::MatrixXd zero = Eigen::MatrixXd::Zero(1, 3);
  Tensor z = base;
  apply_rope(ex, z, rope_table(ex, zero, axes, 10000.0), heads, 1, "rope");
  EXPECT_EQ((z.mat() - base.mat()).norm(), 0.0f);
}

// Closed form: pair i of axis a rotates by pos[a] * theta^(-2 j / axes_dim[a]) (j: the pair's
// index inside its axis), on interleaved pairs (x[2i], x[2i+1]); token0 picks table rows.
TEST(Layers, RopeAnglesAreTheClosedForm) {
  LocalComm comm;
  const Exec ex{comm, false};
  const std::vector<int> axes{2, 4};  // head_dim 6: pair 0 on axis 0, pairs 1-2 on axis 1
  Eigen::MatrixXd pos(2, 2);
  pos << 7, 11, 3, 5;
  const RopeTable t = rope_table(ex, pos, axes, 10000.0);
  const double a0 = 3, a1 = 5, a2 = 5 * std::pow(10000.0, -2.0 / 4);  // token 1
  Mat x(1, 6);
  x << 1, 0, 1, 0, 0, 1;
  Tensor q = Tensor::from(x);
  apply_rope(ex, q, t, 1, 1, "rope", 1);  // one row: token 1 of the table
  const Mat& y = q.mat();
  EXPECT_NEAR(y(0, 0), std::cos(a0), 1e-6);
  EXPECT_NEAR(y(0, 1), std::sin(a0), 1e-6);
  EXPECT_NEAR(y(0, 2), std::cos(a1), 1e-6);
  EXPECT_NEAR(y(0, 3), std::sin(a1), 1e-6);
  EXPECT_NEAR(y(0, 4), -std::sin(a2), 1e-6);
  EXPECT_NEAR(y(0, 5), std::cos(a2), 1e-6);
  // Both tokens, two heads, batch 2: rows b * 2 + t rotate by token t's angles in every head.
  Tensor all = Tensor::from(Mat(x.replicate(4, 2)));
  apply_rope(ex, all, t, 2, 2, "rope");
  for (int h = 0; h < 2; ++h) {
    EXPECT_NEAR(all.mat()(0, h * 6 + 0), std::cos(7.0), 1e-6);
    EXPECT_NEAR(all.mat()(2, h * 6 + 3), std::sin(11.0), 1e-6);
    EXPECT_NEAR(all.mat()(3, h * 6 + 4), -std::sin(a2), 1e-6);
  }
}

// DiT's get_2d_sincos_pos_embed: [sin(w o), cos(w o), sin(h o), cos(h o)], o_i =
// 10000^(-i / (dim / 4)); SD3 crops the grid and scales positions.
TEST(Layers, SinCosPosEmbed2dValues) {
  LocalComm comm;
  const Exec ex{comm, false};
  // dim 8: quarter 2, o = (1, 0.01). Grid 2 x 3, tokens 4 and 5: (h, w) = (1, 1) and (1, 2).
  const Tensor e = sincos_pos_embed_2d(ex, 8, 2, 3, 4, 2, 1.0, 0, 0);
  ASSERT_EQ(e.rows(), 2);
  const double want[2][8] = {{std::sin(1.0), std::sin(0.01), std::cos(1.0), std::cos(0.01),
                              std::sin(1.0), std::sin(0.01), std::cos(1.0), std::cos(0.01)},
                             {std::sin(2.0), std::sin(0.02), std::cos(2.0), std::cos(0.02),
                              std::sin(1.0), std::sin(0.01), std::cos(1.0), std::cos(0.01)}};
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 8; ++c) EXPECT_NEAR(e.mat()(r, c), want[r][c], 1e-6) << r << "," << c;
  // SD3: crop offset (1, 2), positions scaled by 0.5: token 0 sits at (h, w) = (0.5, 1).
  const Tensor s = sincos_pos_embed_2d(ex, 8, 2, 3, 0, 1, 0.5, 1, 2);
  EXPECT_NEAR(s.mat()(0, 0), std::sin(1.0), 1e-6);
  EXPECT_NEAR(s.mat()(0, 4), std::sin(0.5), 1e-6);
  EXPECT_NEAR(s.mat()(0, 7), std::cos(0.005), 1e-6);
}

TEST(Layers, PatchifyRoundTripAndOrder) {
  const int c = 3, h = 4, w = 6, p = 2;
  Mat l(c, h * w);
  for (int i = 0; i < l.size(); ++i) l.data()[i] = static_cast<float>(i);
  const Tensor lat = Tensor::from(l);
  const Tensor tok = patchify(lat, c, h, w, p);
  ASSERT_EQ(tok.rows(), 6);
  ASSERT_EQ(tok.cols(), 12);
  // Token 1 = patch (row 0, col 1): pixel (y=1, x=3) of channel 2 is feature (2, 1, 1) = 11.
  EXPECT_EQ(tok.mat()(1, 11), l(2, 1 * w + 3));
  const Tensor back = unpatchify(tok, c, h, w, p);
  EXPECT_EQ((back.mat() - l).norm(), 0.0f);
  // (py, px, c) -> (c, py, px) reorder.
  LocalComm comm;
  Mat pqc(1, 8);
  for (int py = 0; py < 2; ++py)
    for (int px = 0; px < 2; ++px)
      for (int ch = 0; ch < 2; ++ch) pqc(0, (py * 2 + px) * 2 + ch) = 100 * ch + 10 * py + px;
  const Tensor cpq = patch_order_pqc_to_cpq(Exec{comm, false}, Tensor::from(pqc), 2, 1, 2);
  ASSERT_EQ(cpq.cols(), 4);
  EXPECT_EQ(cpq.mat()(0, 3), 11);  // c 0, py 1, px 1
}

TEST(Layers, OnlineSoftmaxAttentionMatchesNaive) {
  LocalComm comm;
  const Exec ex{comm, false};
  const int heads = 3, d = 8, batch = 2;
  const std::int64_t nq = 300, nk = 700;  // several blocks of 256, ragged ends
  Tensor q = random(batch * nq, heads * d, 3), k = random(batch * nk, heads * d, 4),
         v = random(batch * nk, heads * d, 5);
  q.mat() *= 3.0f;  // sharp softmax: exercises the running max
  const Tensor o = attention(ex, q, k, v, heads, d, batch, "attn");
  const Mat ref = attention_naive(q.mat(), k.mat(), v.mat(), heads, d, batch);
  EXPECT_LT((o.mat() - ref).norm() / ref.norm(), 1e-5);
  EXPECT_DOUBLE_EQ(comm.flops(), 4.0 * batch * heads * nq * nk * d);
}

TEST(Layers, ConcatAndSplitTokensRoundTrip) {
  LocalComm comm;
  const Exec ex{comm, false};
  const Tensor a = random(2 * 3, 4, 6), b = random(2 * 5, 4, 7);
  const Tensor c = concat_tokens(ex, {&a, &b}, 2, "cat");
  EXPECT_EQ(c.mat().row(3), b.mat().row(0));  // batch 0: a's 3 rows, then b's
  EXPECT_EQ(c.mat().row(8), a.mat().row(3));  // batch 1 starts at row 8
  const std::vector<Tensor> s = split_tokens(ex, c, {3, 5}, 2, "split");
  EXPECT_EQ((s[0].mat() - a.mat()).norm(), 0.0f);
  EXPECT_EQ((s[1].mat() - b.mat()).norm(), 0.0f);
}

TEST(Layers, PhantomChargesTheSameAsReal) {
  LocalComm real_comm, phantom_comm;
  for (LocalComm* c : {&real_comm, &phantom_comm}) {
    const bool ph = c == &phantom_comm;
    const Exec ex{*c, ph};
    const Tensor x = ph ? Tensor::zeros(64, 32, true) : random(64, 32, 8);
    const Tensor w = ph ? Tensor::zeros(48, 32, true) : random(48, 32, 9);
    Tensor y = linear(ex, x, w, nullptr, "p");
    gelu_tanh(ex, y, "g");
    const Tensor n = layer_norm(ex, y, 1e-6f, "n");
    attention(ex, n, n, n, 3, 16, 2, "a");
    EXPECT_EQ(y.phantom(), ph);
  }
  EXPECT_GT(real_comm.flops(), 0);
  EXPECT_EQ(real_comm.flops(), phantom_comm.flops());
  EXPECT_EQ(real_comm.bytes(), phantom_comm.bytes());
  EXPECT_EQ(real_comm.ops(), phantom_comm.ops());
}

// Every layer charges its kernel's class and shape, and the FLOPs and bytes charged_cost gives
// that shape (up to the per-row and per-weight terms charged_cost leaves out): what calibrate
// fits a grid's fallback roofline to is what the layers charge.
TEST(Layers, EachChargeCarriesItsKernelShapeAndChargedCostAgrees) {
  LocalComm comm;
  std::vector<RecordedCharge> rec;
  Exec ex{comm, true};
  ex.record = &rec;
  const Tensor x = Tensor::zeros(64, 96, true), w = Tensor::zeros(48, 96, true);
  const Tensor b = Tensor::zeros(1, 48, true), nw = Tensor::zeros(1, 32, true);
  const Tensor gate = Tensor::zeros(1, 96, true), sc = Tensor::zeros(1, 96, true);
  linear(ex, x, w, &b, "proj");
  layer_norm(ex, x, 1e-6f, "norm");
  Tensor h = Tensor::zeros(64, 96, true);
  rms_norm_heads(ex, h, nw, 32, 1e-6f, "q_norm", KernelClass::kRmsNormUnfused);
  modulate(ex, h, sc, sc, 1, "modulate");
  gated_residual(ex, h, x, &gate, 1, "residual");
  gelu_tanh(ex, h, "gelu");
  silu(ex, h, "silu");
  attention(ex, x, x, x, 3, 32, 1, "attention");
  concat_cols(ex, x, x, "cat");
  ASSERT_EQ(rec.size(), 9u);
  const std::vector<KernelShape> want = {
      gemm_shape(64, 48, 96, true),
      memory_shape(KernelClass::kLayerNorm, 64 * 96, 96),
      memory_shape(KernelClass::kRmsNormUnfused, 64 * 96, 32),
      memory_shape(KernelClass::kModulateEager, 64 * 96, 96),
      memory_shape(KernelClass::kGatedResidualEager, 64 * 96, 96),
      memory_shape(KernelClass::kGeluTanh, 64 * 96, 96),
      memory_shape(KernelClass::kSilu, 64 * 96, 96),
      sdpa_shape(1, 64, 64, 3, 32),
      memory_shape(KernelClass::kCatFeat, 64 * 192, 192)};
  for (size_t i = 0; i < rec.size(); ++i) {
    SCOPED_TRACE(rec[i].label);
    EXPECT_EQ(rec[i].shape, want[i]);
    const OpCost c = charged_cost(rec[i].shape);
    EXPECT_EQ(c.kind, rec[i].kind);
    EXPECT_DOUBLE_EQ(c.flops, rec[i].flops);
    // The per-weight terms (a bias, a norm's weight) are left out of charged_cost.
    EXPECT_NEAR(c.bytes, rec[i].bytes, 2.0 * 96) << rec[i].label;
  }
}

}  // namespace
}  // namespace cocodiff::dit
