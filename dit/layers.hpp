#pragma once
// The serial DiT layers: one function per layer, each doing its math on Eigen (unless the Exec
// is phantom) and charging its cost. Activations are row-major [rows, cols] Tensors; a batch of
// B sequences of N tokens is stacked as [B*N, C] (batch-major). Per-sample vectors (adaLN
// modulation, timestep embeddings) are [B, C].
//
//   Tensor h = layer_norm(ex, x, 1e-6f, "norm1");          // [B*N, C]
//   modulate(ex, h, shift, scale, batch);                   // h * (1 + scale) + shift
//   Tensor qkv = linear(ex, h, w_qkv, &b_qkv, "qkv");       // [B*N, 3*H*D]
//   Tensor o = attention(ex, q, k, v, heads, head_dim, batch, "attn");

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tensor.hpp"
#include "dit/exec.hpp"

namespace cocodiff::dit {

/// Rows of a weight matrix used by a projection: [begin, end) of W's output features.
struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = -1;  // -1: all rows
};

/// The FLOPs and bytes the layers below charge for one kernel of `shape` (as linear(),
/// attention(), layer_norm(), ... charge it, up to their per-row and per-weight terms): what
/// `cocodiff calibrate` fits the roofline of a grid's fallback to.
OpCost charged_cost(const KernelShape& shape);

/// y = x W[r]^T + b[r].   x: [N, in], W: [out, in], b: [1, out] or null -> y: [N, |r|].
/// A row range projects only some output features (e.g. one Ulysses rank's heads).
Tensor linear(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor* b,
              std::string_view label, RowRange rows = {});

/// y = (x - mean) / sqrt(var + eps) per row, no affine.   x: [N, C] -> [N, C].
Tensor layer_norm(const Exec& ex, const Tensor& x, float eps, std::string_view label);

/// y = (x - mean) / sqrt(var + eps) * w + b per row.   x: [N, C], w, b: [1, C] -> [N, C].
Tensor layer_norm_affine(const Exec& ex, const Tensor& x, const Tensor& w, const Tensor& b,
                         float eps, std::string_view label);

/// y = x / sqrt(mean(x^2) + eps) * w per row.   x: [N, C], w: [1, C] -> [N, C].
/// `kernel` is how the reference runs it (kRmsNorm: torch.nn.RMSNorm; kRmsNormUnfused:
/// diffusers' RMSNorm), for the device's grids.
Tensor rms_norm(const Exec& ex, const Tensor& x, const Tensor& w, float eps, std::string_view label,
                KernelClass kernel = KernelClass::kRmsNormUnfused);

/// Per-head RMSNorm in place: each head_dim chunk of each row is normalised and scaled by w.
/// x: [N, h*D], w: [1, D]. (SD3/FLUX/Qwen Q/K norm.) `kernel` as for rms_norm.
void rms_norm_heads(const Exec& ex, Tensor& x, const Tensor& w, int head_dim, float eps,
                    std::string_view label, KernelClass kernel = KernelClass::kRmsNorm);

/// x = x * (1 + scale[b]) + shift[b] in place.   x: [B*N, C], shift/scale: [B, C].
void modulate(const Exec& ex, Tensor& x, const Tensor& shift, const Tensor& scale, int batch,
              std::string_view label);

/// x += gate[b] * y in place.   x, y: [B*N, C], gate: [B, C] (or null for a plain residual).
void gated_residual(const Exec& ex, Tensor& x, const Tensor& y, const Tensor* gate, int batch,
                    std::string_view label);

/// GELU, tanh approximation, in place: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh(const Exec& ex, Tensor& x, std::string_view label);

/// SiLU in place: x * sigmoid(x).
void silu(const Exec& ex, Tensor& x, std::string_view label);

/// SwiGLU: [N, 2F] -> [N, F], y = silu(x[:, :F]) * x[:, F:].
Tensor swiglu(const Exec& ex, const Tensor& x, std::string_view label);

/// Columns [i*C/n, (i+1)*C/n) of x: the i-th of n chunks (a view in PyTorch: not charged).
Tensor chunk(const Tensor& x, int i, int n);

/// Concatenation along columns: [N, a] ++ [N, b] -> [N, a+b] (charged as a copy).
Tensor concat_cols(const Exec& ex, const Tensor& a, const Tensor& b, std::string_view label);

/// Sinusoidal timestep embedding [cos(t f_i), sin(t f_i)], f_i = max_period^(-i/half).
/// t: B values -> [B, dim]. (DiT TimestepEmbedder; diffusers Timesteps(flip_sin_to_cos=True,
/// downscale_freq_shift=0).)
Tensor timestep_embedding(const Exec& ex, const std::vector<float>& t, int dim,
                          float max_period = 10000.0f);

/// 2-D sin-cos position embedding of grid positions (DiT / SD3 PatchEmbed), for the tokens
/// [token_begin, token_begin + count) of a grid_h x grid_w grid in row-major order.
/// Per token: [sin(w o), cos(w o), sin(h o), cos(h o)], o_i = 10000^(-i/(dim/4)); h and w are
/// (crop offset + index) * pos_scale. -> [count, dim].
Tensor sincos_pos_embed_2d(const Exec& ex, int dim, int grid_h, int grid_w,
                           std::int64_t token_begin, std::int64_t count, double pos_scale,
                           int crop_top, int crop_left);

/// Rotary tables for multi-axis RoPE: per token, per rotated pair i (D/2 of them) the angle
/// pos[axis(i)] * theta^(-2 j / axes_dim[axis]) with j the pair's index inside its axis.
struct RopeTable {
  Mat cos;  // [N, D/2]
  Mat sin;  // [N, D/2]
  std::int64_t tokens = 0;
  int head_dim = 0;
  /// How the reference rotates (kRopeReal: FLUX's apply_rotary_emb; kRopeComplex: Qwen-Image's).
  KernelClass kernel = KernelClass::kRopeReal;
};
/// positions: [N, axes] (one row per token). Phantom: shapes only.
RopeTable rope_table(const Exec& ex, const Eigen::MatrixXd& positions,
                     const std::vector<int>& axes_dim, double theta);

/// Rotates interleaved pairs (x[2i], x[2i+1]) of every head of every row in place (FLUX/Qwen
/// convention).   x: [B*n, h*D] holds tokens [token0, token0 + n) of the table's N tokens
/// (n = N, token0 = 0: all of them).
void apply_rope(const Exec& ex, Tensor& x, const RopeTable& table, int heads, int batch,
                std::string_view label, std::int64_t token0 = 0);

/// 2x2 (p x p) packing: latent [C, F*H*W] (channel-major, then frame-major) -> tokens
/// [F(H/p)(W/p), C*p*p], frame after frame, each token's features in (c, py, px) order (FLUX
/// pack, DiT/SD3 conv patch embedding, Wan's 1 x p x p patch). Images: frames = 1.
Tensor patchify(const Tensor& latent, int channels, int height, int width, int p, int frames = 1);
/// Inverse of patchify: tokens [F(H/p)(W/p), C*p*p] in (c, py, px) order -> latent [C, F*H*W].
Tensor unpatchify(const Tensor& tokens, int channels, int height, int width, int p, int frames = 1);
/// Reorders token features from (py, px, c) (DiT/SD3 final layer) to (c, py, px), keeping the
/// first `keep_channels` of `channels` (DiT's learned sigma is dropped). [N, p*p*C] -> [N,
/// keep*p*p].
Tensor patch_order_pqc_to_cpq(const Exec& ex, const Tensor& x, int channels, int keep_channels,
                              int p);

/// softmax(Q K^T / sqrt(D)) V per head and batch element, computed blockwise with an online
/// softmax (never an N x N matrix).   q: [B*Nq, h*D], k, v: [B*Nk, h*D] -> [B*Nq, h*D].
Tensor attention(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                 int head_dim, int batch, std::string_view label);

/// attention() takes keys in blocks of this many (its online softmax rescales per block).
inline constexpr std::int64_t kBlockK = 256;

/// attention()'s arithmetic without charging a clock, into out [B*Nq, h*D] (every element
/// written), for strategies that charge the work in their own steps (usp's ring). Keys are
/// taken `key_block` at a time: attention() uses kBlockK; a few query rows against many keys
/// are cheaper in one block (one score product, no rescaling).
void attention_values(const Mat& q, const Mat& k, const Mat& v, int heads, int head_dim, int batch,
                      Mat& out, std::int64_t key_block = kBlockK);

/// Reference attention that materialises the full score matrix (tests only; not charged).
Mat attention_naive(const Mat& q, const Mat& k, const Mat& v, int heads, int head_dim, int batch);

/// Stacks streams per batch element: for each b, rows of parts[0] for b, then parts[1] ...
/// Each part is [B*N_i, C] -> [B*sum N_i, C]. (Joint text + image attention's concatenation.)
Tensor concat_tokens(const Exec& ex, const std::vector<const Tensor*>& parts, int batch,
                     std::string_view label);
/// concat_tokens' values without charging a clock, into out (shaped [B*sum N_i, C] by the
/// caller).
void stack_tokens(const std::vector<const Tensor*>& parts, int batch, Mat& out);
/// Inverse of concat_tokens: splits [B*sum N_i, C] into parts of N_i tokens per batch element.
std::vector<Tensor> split_tokens(const Exec& ex, const Tensor& x,
                                 const std::vector<std::int64_t>& tokens, int batch,
                                 std::string_view label);

}  // namespace cocodiff::dit
