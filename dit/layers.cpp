#include "dit/layers.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dit/math_cache.hpp"

namespace cocodiff::dit {

namespace {

double n(std::int64_t v) { return static_cast<double>(v); }

// Attention tile sizes: a [kBlockQ x kBlockK] score tile (256 KiB) lives on the heap.
constexpr std::int64_t kBlockQ = 256;

}  // namespace

OpCost charged_cost(const KernelShape& shape) {
  const auto& d = shape.dims;
  const KernelClass c = shape.kernel;
  OpCost cost;
  cost.kind = kernel_class_kind(c);
  cost.shape = shape;
  const double e = n(d[0]);
  double flops = 0, moved = 0;  // elements read and written
  switch (c) {
    case KernelClass::kNone:
      break;
    case KernelClass::kGemm:
      flops = 2.0 * n(d[0]) * n(d[1]) * n(d[2]);
      moved = n(d[0]) * n(d[2]) + n(d[1]) * n(d[2]) + n(d[0]) * n(d[1]) + (d[3] != 0 ? n(d[1]) : 0);
      break;
    case KernelClass::kSdpa:
      flops = 4.0 * n(d[0]) * n(d[3]) * n(d[1]) * n(d[2]) * n(d[4]);
      moved = 2.0 * n(d[0]) * n(d[3]) * n(d[4]) * (n(d[1]) + n(d[2]));
      break;
    case KernelClass::kLayerNorm:
    case KernelClass::kLayerNormAffine:
      flops = 8.0 * e, moved = 2.0 * e;
      break;
    case KernelClass::kRmsNorm:
    case KernelClass::kRmsNormUnfused:
      flops = 4.0 * e, moved = 2.0 * e + n(d[1]);
      break;
    case KernelClass::kRopeReal:
    case KernelClass::kRopeComplex:
      flops = 3.0 * e, moved = 2.0 * e;
      break;
    case KernelClass::kModulateEager:
      flops = 2.0 * e, moved = 2.0 * e;
      break;
    case KernelClass::kGatedResidualEager:
    case KernelClass::kAdd:
    case KernelClass::kMul:
      flops = 2.0 * e, moved = 3.0 * e;
      break;
    case KernelClass::kGeluTanh:
      flops = 10.0 * e, moved = 2.0 * e;
      break;
    case KernelClass::kSilu:
      flops = 4.0 * e, moved = 2.0 * e;
      break;
    case KernelClass::kSwiglu:  // elements of the input, twice the output's
      flops = 2.5 * e, moved = 1.5 * e;
      break;
    default:  // copies, concatenations, layout copies
      moved = 2.0 * e;
      break;
  }
  cost.flops = flops;
  cost.bytes = moved * kBytesPerElement;
  return cost;
}

// ---------------------------------------------------------------------------------------------
// linear: y[N, r] = x[N, in] @ W[r, in]^T + b[r]
// ---------------------------------------------------------------------------------------------
Tensor linear(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor* b,
              std::string_view label, RowRange rows) {
  const std::int64_t r0 = rows.begin;
  const std::int64_t r1 = rows.end < 0 ? w.rows() : rows.end;
  COCO_CHECK(x.cols() == w.cols(),
             "linear " + std::string(label) + ": x " + x.shape_str() + " vs W " + w.shape_str());
  COCO_CHECK(0 <= r0 && r0 <= r1 && r1 <= w.rows(), "linear row range");
  const std::int64_t out = r1 - r0;
  // Not zero-filled: Eigen's product and MathCache::multiply zero it where they accumulate.
  Tensor y = Tensor::uninitialized(x.rows(), out, ex.phantom);
  const double flops = 2.0 * n(x.rows()) * n(x.cols()) * n(out);
  if (!ex.phantom)
    ex.math(flops, [&] {
      // Thin products (a tile's shard) reuse the weight packed once; same bytes as Eigen's.
      if (ex.cache == nullptr || !ex.cache->multiply(x.mat(), w, r0, out, y.mat()))
        y.mat().noalias() = x.mat() * w.mat().middleRows(r0, out).transpose();
      if (b != nullptr) y.mat().rowwise() += b->mat().row(0).segment(r0, out);
    });
  ex.charge(OpKind::kGemm, flops,
            n(x.numel()) + n(out) * n(w.cols()) + n(y.numel()) + (b ? n(out) : 0.0), label,
            gemm_shape(x.rows(), out, x.cols(), b != nullptr));
  return y;
}

// ---------------------------------------------------------------------------------------------
// layer_norm: y = (x - mean_row) / sqrt(var_row + eps)      x: [N, C] -> [N, C]
// ---------------------------------------------------------------------------------------------
namespace {
// y = (x - mean) / sqrt(var + eps) per row, into y (shaped as x).
void normalize_rows(const Mat& xm, float eps, Mat& y) {
  const Eigen::VectorXf mean = xm.rowwise().mean();
  y = xm.colwise() - mean;
  const Eigen::VectorXf var = y.array().square().rowwise().mean();
  const Eigen::VectorXf inv = (var.array() + eps).rsqrt();
  y = y.array().colwise() * inv.array();
}
}  // namespace

Tensor layer_norm(const Exec& ex, const Tensor& x, float eps, std::string_view label) {
  Tensor y = Tensor::uninitialized(x.rows(), x.cols(), ex.phantom);
  if (!ex.phantom) normalize_rows(x.mat(), eps, y.mat());
  ex.charge(OpKind::kNorm, 8.0 * n(x.numel()), 2.0 * n(x.numel()), label,
            memory_shape(KernelClass::kLayerNorm, x.numel(), x.cols()));
  return y;
}

Tensor layer_norm_affine(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& b,
                         float eps, std::string_view label) {
  COCO_CHECK(w.cols() == x.cols() && b.cols() == x.cols(), "layer_norm_affine weight width");
  Tensor y = Tensor::uninitialized(x.rows(), x.cols(), ex.phantom);
  if (!ex.phantom) {
    normalize_rows(x.mat(), eps, y.mat());
    y.mat() =
        (y.mat().array().rowwise() * w.mat().row(0).array()).rowwise() + b.mat().row(0).array();
  }
  ex.charge(OpKind::kNorm, 8.0 * n(x.numel()), 2.0 * n(x.numel()) + 2.0 * n(w.numel()), label,
            memory_shape(KernelClass::kLayerNormAffine, x.numel(), x.cols()));
  return y;
}

// ---------------------------------------------------------------------------------------------
// rms_norm: y = x / sqrt(mean(x^2) + eps) * w              x: [N, C], w: [1, C] -> [N, C]
// ---------------------------------------------------------------------------------------------
Tensor rms_norm(const Exec& ex, const Tensor& x, const Tensor& w, float eps, std::string_view label,
                KernelClass kernel) {
  COCO_CHECK(w.cols() == x.cols(), "rms_norm weight width");
  Tensor y = Tensor::uninitialized(x.rows(), x.cols(), ex.phantom);
  if (!ex.phantom) {
    const Eigen::VectorXf inv = (x.mat().array().square().rowwise().mean() + eps).rsqrt();
    y.mat() = (x.mat().array().colwise() * inv.array()).rowwise() * w.mat().row(0).array();
  }
  ex.charge(OpKind::kNorm, 4.0 * n(x.numel()), 2.0 * n(x.numel()) + n(w.numel()), label,
            memory_shape(kernel, x.numel(), x.cols()));
  return y;
}

// ---------------------------------------------------------------------------------------------
// rms_norm_heads: per head h, x[:, hD:(h+1)D] = rms_norm(x[:, hD:(h+1)D]) * w
//   x: [N, heads*D], w: [1, D]
// ---------------------------------------------------------------------------------------------
void rms_norm_heads(const Exec& ex, Tensor& x, const Tensor& w, int head_dim, float eps,
                    std::string_view label, KernelClass kernel) {
  COCO_CHECK(w.cols() == head_dim && x.cols() % head_dim == 0, "rms_norm_heads shapes");
  if (!ex.phantom) {
    Mat& xm = x.mat();
    const std::int64_t heads = x.cols() / head_dim;
    for (std::int64_t h = 0; h < heads; ++h) {
      Eigen::Ref<Mat, 0, Eigen::OuterStride<>> blk = xm.middleCols(h * head_dim, head_dim);
      const Eigen::VectorXf inv = (blk.array().square().rowwise().mean() + eps).rsqrt();
      blk = (blk.array().colwise() * inv.array()).rowwise() * w.mat().row(0).array();
    }
  }
  ex.charge(OpKind::kNorm, 4.0 * n(x.numel()), 2.0 * n(x.numel()) + n(w.numel()), label,
            memory_shape(kernel, x.numel(), head_dim));
}

// ---------------------------------------------------------------------------------------------
// modulate: x[b] = x[b] * (1 + scale[b]) + shift[b]        x: [B*N, C], shift/scale: [B, C]
// ---------------------------------------------------------------------------------------------
void modulate(const Exec& ex, Tensor& x, const Tensor& shift, const Tensor& scale, int batch,
              std::string_view label) {
  COCO_CHECK(x.rows() % batch == 0 && shift.rows() == batch && scale.rows() == batch &&
                 shift.cols() == x.cols() && scale.cols() == x.cols(),
             "modulate shapes: x " + x.shape_str() + " shift " + shift.shape_str());
  if (!ex.phantom) {
    const std::int64_t tokens = x.rows() / batch;
    for (int b = 0; b < batch; ++b) {
      Eigen::Ref<Mat> xb = x.mat().middleRows(b * tokens, tokens);
      const Vec one_plus = scale.mat().row(b).array() + 1.0f;
      xb = (xb.array().rowwise() * one_plus.array()).rowwise() + shift.mat().row(b).array();
    }
  }
  ex.charge(OpKind::kElementwise, 2.0 * n(x.numel()), 2.0 * n(x.numel()), label,
            memory_shape(KernelClass::kModulateEager, x.numel(), x.cols()));
}

// ---------------------------------------------------------------------------------------------
// gated_residual: x[b] += gate[b] * y[b]                    x, y: [B*N, C], gate: [B, C]
// ---------------------------------------------------------------------------------------------
void gated_residual(const Exec& ex, Tensor& x, const Tensor& y, const Tensor* gate, int batch,
                    std::string_view label) {
  COCO_CHECK(x.rows() == y.rows() && x.cols() == y.cols(),
             "gated_residual: x " + x.shape_str() + " y " + y.shape_str());
  if (!ex.phantom) {
    if (gate == nullptr) {
      x.mat() += y.mat();
    } else {
      COCO_CHECK(gate->rows() == batch && gate->cols() == x.cols(), "gated_residual gate");
      const std::int64_t tokens = x.rows() / batch;
      for (int b = 0; b < batch; ++b)
        x.mat().middleRows(b * tokens, tokens).array() +=
            y.mat().middleRows(b * tokens, tokens).array().rowwise() * gate->mat().row(b).array();
    }
  }
  ex.charge(OpKind::kElementwise, 2.0 * n(x.numel()), 3.0 * n(x.numel()), label,
            memory_shape(gate != nullptr ? KernelClass::kGatedResidualEager : KernelClass::kAdd,
                         x.numel(), x.cols()));
}

// ---------------------------------------------------------------------------------------------
// gelu_tanh: x = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// ---------------------------------------------------------------------------------------------
void gelu_tanh(const Exec& ex, Tensor& x, std::string_view label) {
  if (!ex.phantom) {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
    Eigen::ArrayXXf a = x.mat().array();
    x.mat().array() = 0.5f * a * (1.0f + (kC * (a + 0.044715f * a.cube())).tanh());
  }
  ex.charge(OpKind::kElementwise, 10.0 * n(x.numel()), 2.0 * n(x.numel()), label,
            memory_shape(KernelClass::kGeluTanh, x.numel(), x.cols()));
}

// ---------------------------------------------------------------------------------------------
// silu: x = x / (1 + exp(-x))
// ---------------------------------------------------------------------------------------------
void silu(const Exec& ex, Tensor& x, std::string_view label) {
  if (!ex.phantom) x.mat().array() = x.mat().array() / (1.0f + (-x.mat().array()).exp());
  ex.charge(OpKind::kElementwise, 4.0 * n(x.numel()), 2.0 * n(x.numel()), label,
            memory_shape(KernelClass::kSilu, x.numel(), x.cols()));
}

// ---------------------------------------------------------------------------------------------
// swiglu: y = silu(x[:, :F]) * x[:, F:]                    x: [N, 2F] -> [N, F]
// ---------------------------------------------------------------------------------------------
Tensor swiglu(const Exec& ex, const Tensor& x, std::string_view label) {
  COCO_CHECK(x.cols() % 2 == 0, "swiglu needs an even width");
  const std::int64_t f = x.cols() / 2;
  Tensor y = Tensor::zeros(x.rows(), f, ex.phantom);
  if (!ex.phantom) {
    const Eigen::ArrayXXf a = x.mat().leftCols(f).array();
    y.mat().array() = a / (1.0f + (-a).exp()) * x.mat().rightCols(f).array();
  }
  ex.charge(OpKind::kElementwise, 5.0 * n(y.numel()), 3.0 * n(y.numel()), label,
            memory_shape(KernelClass::kSwiglu, x.numel(), x.cols()));
  return y;
}

Tensor chunk(const Tensor& x, int i, int count) {
  COCO_CHECK(x.cols() % count == 0 && i >= 0 && i < count, "chunk of " + x.shape_str());
  const std::int64_t w = x.cols() / count;
  if (x.phantom()) return Tensor::zeros(x.rows(), w, true);
  return Tensor::from(x.mat().middleCols(i * w, w));
}

// ---------------------------------------------------------------------------------------------
// concat_cols: [N, a] ++ [N, b] -> [N, a + b]
// ---------------------------------------------------------------------------------------------
Tensor concat_cols(const Exec& ex, const Tensor& a, const Tensor& b, std::string_view label) {
  COCO_CHECK(a.rows() == b.rows(), "concat_cols rows");
  Tensor y = Tensor::zeros(a.rows(), a.cols() + b.cols(), ex.phantom);
  if (!ex.phantom) y.mat() << a.mat(), b.mat();
  ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), label,
            memory_shape(KernelClass::kCatFeat, y.numel(), y.cols()));
  return y;
}

// ---------------------------------------------------------------------------------------------
// timestep_embedding: e[b] = [cos(t_b f), sin(t_b f)], f_i = max_period^(-i/half)   -> [B, dim]
// ---------------------------------------------------------------------------------------------
Tensor timestep_embedding(const Exec& ex, const std::vector<float>& t, int dim, float max_period) {
  const int half = dim / 2;
  const std::int64_t batch = static_cast<std::int64_t>(t.size());
  Tensor e = Tensor::zeros(batch, dim, ex.phantom);
  if (!ex.phantom) {
    for (std::int64_t b = 0; b < batch; ++b)
      for (int i = 0; i < half; ++i) {
        const double f = std::exp(-std::log(static_cast<double>(max_period)) * i / half);
        const double arg = static_cast<double>(t[static_cast<size_t>(b)]) * f;
        e.mat()(b, i) = static_cast<float>(std::cos(arg));
        e.mat()(b, half + i) = static_cast<float>(std::sin(arg));
      }
  }
  ex.charge(OpKind::kElementwise, 4.0 * n(e.numel()), n(e.numel()), "timestep_embedding");
  return e;
}

// ---------------------------------------------------------------------------------------------
// sincos_pos_embed_2d: per token [sin(w o), cos(w o), sin(h o), cos(h o)]   -> [count, dim]
// ---------------------------------------------------------------------------------------------
Tensor sincos_pos_embed_2d(const Exec& ex, int dim, int grid_h, int grid_w,
                           std::int64_t token_begin, std::int64_t count, double pos_scale,
                           int crop_top, int crop_left) {
  COCO_CHECK(dim % 4 == 0, "sincos_pos_embed_2d needs dim % 4 == 0");
  COCO_CHECK(token_begin >= 0 && token_begin + count <= std::int64_t{grid_h} * grid_w,
             "sincos_pos_embed_2d token range");
  const int quarter = dim / 4;
  Tensor e = Tensor::zeros(count, dim, ex.phantom);
  if (!ex.phantom) {
    for (std::int64_t t = 0; t < count; ++t) {
      const std::int64_t g = token_begin + t;
      const double h = static_cast<double>(crop_top + g / grid_w) * pos_scale;
      const double w = static_cast<double>(crop_left + g % grid_w) * pos_scale;
      for (int i = 0; i < quarter; ++i) {
        const double o = 1.0 / std::pow(10000.0, static_cast<double>(i) / quarter);
        e.mat()(t, i) = static_cast<float>(std::sin(w * o));
        e.mat()(t, quarter + i) = static_cast<float>(std::cos(w * o));
        e.mat()(t, 2 * quarter + i) = static_cast<float>(std::sin(h * o));
        e.mat()(t, 3 * quarter + i) = static_cast<float>(std::cos(h * o));
      }
    }
  }
  ex.charge(OpKind::kElementwise, 4.0 * n(e.numel()), n(e.numel()), "pos_embed");
  return e;
}

// ---------------------------------------------------------------------------------------------
// rope_table: angle[n, i] = pos[n, axis(i)] * theta^(-2 j / axes_dim[axis(i)])   -> [N, D/2]
// ---------------------------------------------------------------------------------------------
RopeTable rope_table(const Exec& ex, const Eigen::MatrixXd& positions,
                     const std::vector<int>& axes_dim, double theta) {
  COCO_CHECK(positions.cols() == static_cast<Eigen::Index>(axes_dim.size()),
             "rope_table: one position column per axis");
  RopeTable r;
  r.tokens = positions.rows();
  for (int d : axes_dim) r.head_dim += d;
  const int pairs = r.head_dim / 2;
  if (!ex.phantom) {
    r.cos.resize(r.tokens, pairs);
    r.sin.resize(r.tokens, pairs);
    int col = 0;
    for (size_t a = 0; a < axes_dim.size(); ++a) {
      const int d = axes_dim[a];
      for (int j = 0; j < d / 2; ++j, ++col) {
        const double freq = 1.0 / std::pow(theta, 2.0 * j / d);
        for (std::int64_t t = 0; t < r.tokens; ++t) {
          const double ang = positions(t, static_cast<Eigen::Index>(a)) * freq;
          r.cos(t, col) = static_cast<float>(std::cos(ang));
          r.sin(t, col) = static_cast<float>(std::sin(ang));
        }
      }
    }
  }
  ex.charge(OpKind::kElementwise, 4.0 * n(r.tokens) * pairs, 2.0 * n(r.tokens) * pairs,
            "rope_table");
  return r;
}

// ---------------------------------------------------------------------------------------------
// apply_rope: (x0, x1) <- (x0 cos - x1 sin, x0 sin + x1 cos) per interleaved pair
//   x: [B*N, heads*D], table: [N, D/2]
// ---------------------------------------------------------------------------------------------
void apply_rope(const Exec& ex, Tensor& x, const RopeTable& table, int heads, int batch,
                std::string_view label, std::int64_t token0) {
  const int d = table.head_dim;
  const std::int64_t tokens = batch > 0 ? x.rows() / batch : 0;
  COCO_CHECK(x.cols() == std::int64_t{heads} * d && x.rows() == tokens * batch && token0 >= 0 &&
                 token0 + tokens <= table.tokens,
             "apply_rope: x " + x.shape_str() + " (tokens from " + std::to_string(token0) +
                 ") vs " + std::to_string(table.tokens) + " tokens x " + std::to_string(d));
  if (!ex.phantom && tokens > 0) {
    const int pairs = d / 2;
    for (std::int64_t row = 0; row < x.rows(); ++row) {
      const std::int64_t t = token0 + row % tokens;
      float* xr = x.mat().row(row).data();
      const float* c = table.cos.row(t).data();
      const float* s = table.sin.row(t).data();
      for (int h = 0; h < heads; ++h) {
        float* xh = xr + std::int64_t{h} * d;
        for (int i = 0; i < pairs; ++i) {
          const float x0 = xh[2 * i];
          const float x1 = xh[2 * i + 1];
          xh[2 * i] = x0 * c[i] - x1 * s[i];
          xh[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
      }
    }
  }
  ex.charge(OpKind::kElementwise, 3.0 * n(x.numel()), 2.0 * n(x.numel()) + n(tokens) * d, label,
            memory_shape(table.kernel, x.numel(), d));
}

// ---------------------------------------------------------------------------------------------
// patchify: latent [C, F*H*W] -> tokens [F(H/p)(W/p), C*p*p], features (c, py, px)
// ---------------------------------------------------------------------------------------------
Tensor patchify(const Tensor& latent, int channels, int height, int width, int p, int frames) {
  const std::int64_t plane = std::int64_t{height} * width;
  COCO_CHECK(latent.rows() == channels && latent.cols() == frames * plane && height % p == 0 &&
                 width % p == 0 && frames >= 1,
             "patchify: latent " + latent.shape_str());
  const int gh = height / p, gw = width / p;
  const std::int64_t per_frame = std::int64_t{gh} * gw;
  Tensor t = Tensor::zeros(frames * per_frame, std::int64_t{channels} * p * p, latent.phantom());
  if (latent.phantom()) return t;
  for (int f = 0; f < frames; ++f)
    for (int c = 0; c < channels; ++c)
      for (int y = 0; y < height; ++y)
        for (int x = 0; x < width; ++x)
          t.mat()(f * per_frame + (y / p) * gw + x / p, (c * p + y % p) * p + x % p) =
              latent.mat()(c, f * plane + std::int64_t{y} * width + x);
  return t;
}

Tensor unpatchify(const Tensor& tokens, int channels, int height, int width, int p, int frames) {
  const int gh = height / p, gw = width / p;
  const std::int64_t plane = std::int64_t{height} * width, per_frame = std::int64_t{gh} * gw;
  COCO_CHECK(tokens.rows() == frames * per_frame &&
                 tokens.cols() == std::int64_t{channels} * p * p && frames >= 1,
             "unpatchify: tokens " + tokens.shape_str());
  Tensor l = Tensor::zeros(channels, frames * plane, tokens.phantom());
  if (tokens.phantom()) return l;
  for (int f = 0; f < frames; ++f)
    for (int c = 0; c < channels; ++c)
      for (int y = 0; y < height; ++y)
        for (int x = 0; x < width; ++x)
          l.mat()(c, f * plane + std::int64_t{y} * width + x) =
              tokens.mat()(f * per_frame + (y / p) * gw + x / p, (c * p + y % p) * p + x % p);
  return l;
}

// ---------------------------------------------------------------------------------------------
// patch_order_pqc_to_cpq: [N, p*p*C] (py, px, c) -> [N, keep*p*p] (c, py, px)
// ---------------------------------------------------------------------------------------------
Tensor patch_order_pqc_to_cpq(const Exec& ex, const Tensor& x, int channels, int keep_channels,
                              int p) {
  COCO_CHECK(x.cols() == std::int64_t{p} * p * channels && keep_channels <= channels,
             "patch_order_pqc_to_cpq shapes");
  Tensor y = Tensor::zeros(x.rows(), std::int64_t{p} * p * keep_channels, ex.phantom);
  if (!ex.phantom)
    for (int c = 0; c < keep_channels; ++c)
      for (int py = 0; py < p; ++py)
        for (int px = 0; px < p; ++px)
          y.mat().col((c * p + py) * p + px) = x.mat().col((py * p + px) * channels + c);
  ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), "unpatchify_order",
            memory_shape(KernelClass::kCopy, y.numel(), y.cols()));
  return y;
}

// ---------------------------------------------------------------------------------------------
// attention: O = softmax(Q K^T / sqrt(D)) V, per (batch, head), online softmax over K blocks
//   q: [B*Nq, h*D], k, v: [B*Nk, h*D] -> [B*Nq, h*D]
//   Running row max m, row sum l and output O per Q block:
//     S = Qb Kb^T;  m' = max(m, rowmax S);  P = exp(S - m');
//     l = l e^(m - m') + rowsum P;  O = O e^(m - m') + P Vb;  finally O /= l
// ---------------------------------------------------------------------------------------------
Tensor attention(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                 int head_dim, int batch, std::string_view label) {
  const std::int64_t width = std::int64_t{heads} * head_dim;
  COCO_CHECK(
      q.cols() == width && k.cols() == width && v.cols() == width && k.rows() == v.rows() &&
          q.rows() % batch == 0 && k.rows() % batch == 0,
      "attention shapes: q " + q.shape_str() + " k " + k.shape_str() + " v " + v.shape_str());
  Tensor out = Tensor::uninitialized(q.rows(), width, ex.phantom);
  const double flops = 4.0 * batch * heads * n(q.rows() / batch) * n(k.rows() / batch) * head_dim;
  if (!ex.phantom)
    ex.math(flops, [&] {
      attention_values(q.mat(), k.mat(), v.mat(), heads, head_dim, batch, out.mat(), kBlockK);
    });
  ex.charge(OpKind::kAttention, flops, n(q.numel()) + n(k.numel()) + n(v.numel()) + n(out.numel()),
            label, sdpa_shape(batch, q.rows() / batch, k.rows() / batch, heads, head_dim));
  return out;
}

void attention_values(const Mat& q, const Mat& k, const Mat& v, int heads, int head_dim, int batch,
                      Mat& out, std::int64_t key_block) {
  COCO_CHECK(key_block > 0, "attention key block");
  const std::int64_t nq = q.rows() / batch;
  const std::int64_t nk = k.rows() / batch;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  Mat qh, s, o;
  Eigen::VectorXf m, l, m_new, alpha;
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      qh = q.block(b * nq, std::int64_t{h} * head_dim, nq, head_dim) * scale;
      // K and V are read in place (the products pack them anyway).
      const auto kh = k.block(b * nk, std::int64_t{h} * head_dim, nk, head_dim);
      const auto vh = v.block(b * nk, std::int64_t{h} * head_dim, nk, head_dim);
      for (std::int64_t q0 = 0; q0 < nq; q0 += kBlockQ) {
        const std::int64_t bq = std::min(kBlockQ, nq - q0);
        o.setZero(bq, head_dim);
        m.setConstant(bq, -std::numeric_limits<float>::infinity());
        l.setZero(bq);
        for (std::int64_t k0 = 0; k0 < nk; k0 += key_block) {
          const std::int64_t bk = std::min(key_block, nk - k0);
          s.noalias() = qh.middleRows(q0, bq) * kh.middleRows(k0, bk).transpose();
          m_new = m.cwiseMax(s.rowwise().maxCoeff());
          alpha = (m - m_new).array().exp();
          s.array().colwise() -= m_new.array();
          s.array() = s.array().exp();
          l = l.cwiseProduct(alpha) + s.rowwise().sum();
          o.array().colwise() *= alpha.array();
          o.noalias() += s * vh.middleRows(k0, bk);
          m = m_new;
        }
        // No keys at all: zeros (l = 0 would divide 0 by 0).
        if (nk == 0)
          o.setZero();
        else
          o.array().colwise() /= l.array();
        out.block(b * nq + q0, std::int64_t{h} * head_dim, bq, head_dim) = o;
      }
    }
  }
}

Mat attention_naive(const Mat& q, const Mat& k, const Mat& v, int heads, int head_dim, int batch) {
  const std::int64_t nq = q.rows() / batch, nk = k.rows() / batch;
  Mat out(q.rows(), q.cols());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      const Mat qh = q.block(b * nq, std::int64_t{h} * head_dim, nq, head_dim);
      const Mat kh = k.block(b * nk, std::int64_t{h} * head_dim, nk, head_dim);
      const Mat vh = v.block(b * nk, std::int64_t{h} * head_dim, nk, head_dim);
      Eigen::MatrixXd s = (qh * kh.transpose()).cast<double>() / std::sqrt(double(head_dim));
      for (Eigen::Index r = 0; r < s.rows(); ++r) {
        s.row(r).array() -= s.row(r).maxCoeff();
        s.row(r) = s.row(r).array().exp().matrix();
        s.row(r) /= s.row(r).sum();
      }
      out.block(b * nq, std::int64_t{h} * head_dim, nq, head_dim) =
          (s * vh.cast<double>()).cast<float>();
    }
  return out;
}

// ---------------------------------------------------------------------------------------------
// concat_tokens: per batch element b, [parts[0][b]; parts[1][b]; ...]   -> [B*sum N_i, C]
// ---------------------------------------------------------------------------------------------
Tensor concat_tokens(const Exec& ex, const std::vector<const Tensor*>& parts, int batch,
                     std::string_view label) {
  std::int64_t rows = 0;
  const std::int64_t cols = parts.at(0)->cols();
  for (const Tensor* p : parts) {
    COCO_CHECK(p->cols() == cols && p->rows() % batch == 0, "concat_tokens shapes");
    rows += p->rows();
  }
  Tensor y = Tensor::uninitialized(rows, cols, ex.phantom);  // every row is copied below
  if (!ex.phantom) stack_tokens(parts, batch, y.mat());
  if (parts.size() > 1)
    ex.charge(OpKind::kCopy, 0, 2.0 * n(y.numel()), label,
              memory_shape(KernelClass::kCatSeq, y.numel(), y.cols()));
  return y;
}

void stack_tokens(const std::vector<const Tensor*>& parts, int batch, Mat& out) {
  std::int64_t at = 0;
  for (int b = 0; b < batch; ++b)
    for (const Tensor* p : parts) {
      const std::int64_t t = p->rows() / batch;
      out.middleRows(at, t) = p->mat().middleRows(b * t, t);
      at += t;
    }
}

std::vector<Tensor> split_tokens(const Exec& ex, const Tensor& x,
                                 const std::vector<std::int64_t>& tokens, int batch,
                                 std::string_view label) {
  std::int64_t per_batch = 0;
  for (std::int64_t t : tokens) per_batch += t;
  COCO_CHECK(x.rows() == per_batch * batch, "split_tokens: x " + x.shape_str());
  std::vector<Tensor> out;
  for (std::int64_t t : tokens) out.push_back(Tensor::zeros(t * batch, x.cols(), ex.phantom));
  if (!ex.phantom) {
    std::int64_t at = 0;
    for (int b = 0; b < batch; ++b)
      for (size_t i = 0; i < tokens.size(); ++i) {
        out[i].mat().middleRows(b * tokens[i], tokens[i]) = x.mat().middleRows(at, tokens[i]);
        at += tokens[i];
      }
  }
  if (tokens.size() > 1)
    ex.charge(OpKind::kCopy, 0, 2.0 * n(x.numel()), label,
              memory_shape(KernelClass::kCopy, x.numel(), x.cols()));
  return out;
}

}  // namespace cocodiff::dit
