#pragma once
// What an operation costs a device: the device model turns this into time, by the kernel's
// shape where the device has measured grids (net_models/kernel_grid.hpp), else by its FLOPs and
// bytes (roofline).

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cocodiff {

enum class OpKind : std::uint8_t { kGemm, kAttention, kNorm, kElementwise, kCopy };
inline constexpr int kNumOpKinds = 5;

std::string_view op_kind_name(OpKind kind);

/// The kernel an operation runs as in the reference implementations (diffusers in eager
/// PyTorch), which the device's grids time by shape. The names are the `op` column of a memory
/// grid (bench/fidelity/models/microbench.py): each is one eager call sequence, e.g.
/// modulate_eager is x * (1 + scale[:, None]) + shift[:, None] (3 kernels).
enum class KernelClass : std::uint8_t {
  kNone,  // not a measured kernel: the roofline times it
  kGemm,  // dims: m, n, k, bias (0 or 1)
  kSdpa,  // dims: batch, query tokens, key tokens, heads, head_dim
  // memory-bound kernels; dims: elements of the main tensor, its row width
  kLayerNorm,
  kLayerNormAffine,
  kRmsNorm,         // torch.nn.RMSNorm (fused)
  kRmsNormUnfused,  // diffusers' RMSNorm: to(fp32), pow, mean, rsqrt, mul, to, mul (8 kernels)
  kRopeReal,        // diffusers apply_rotary_emb(use_real=True) (FLUX.1, FLUX.2)
  kRopeComplex,     // Qwen-Image's complex rotation
  kAdd,
  kMul,
  kSilu,
  kGeluTanh,
  kSwiglu,
  kModulateEager,
  kGatedResidualEager,
  kCopy,
  kTransposeBhsdBshd,
  kLayoutA2a,
  kCatSeq,
  kCatFeat,
  /// No device work: the host's issue of one transformer block (or of a forward's work outside
  /// the blocks) as the reference implementation issues it; the label names "model/scope"
  /// (DeviceModel::host_reference).
  kHostBlock,
};
inline constexpr int kNumKernelClasses = 22;

/// The grid name of a class ("gemm", "sdpa", "layernorm", ...; "" for kNone).
std::string_view kernel_class_name(KernelClass c);
/// The class of a grid name, or nullopt.
std::optional<KernelClass> kernel_class_of(std::string_view name);
/// The op kind a class's kernel is (kGemm, kAttention, kNorm, kElementwise or kCopy).
OpKind kernel_class_kind(KernelClass c);

/// A kernel's class and shape: see KernelClass for what the dims mean.
struct KernelShape {
  KernelClass kernel = KernelClass::kNone;
  std::array<std::int64_t, 5> dims{};
  bool operator==(const KernelShape&) const = default;
};

/// FLOPs and HBM bytes of one operation on one tile, and its kernel's shape. `label` names it
/// in traces.
struct OpCost {
  OpKind kind = OpKind::kElementwise;
  double flops = 0;
  double bytes = 0;
  std::string_view label = {};
  KernelShape shape = {};
  bool operator==(const OpCost&) const = default;
};

/// The shape of a GEMM y[m, n] = x[m, k] W[n, k]^T (+ b).
inline KernelShape gemm_shape(std::int64_t m, std::int64_t n, std::int64_t k, bool bias) {
  return {KernelClass::kGemm, {m, n, k, bias ? 1 : 0, 0}};
}
/// The shape of a scaled-dot-product attention over `heads` heads of `head_dim`.
inline KernelShape sdpa_shape(std::int64_t batch, std::int64_t q_tokens, std::int64_t kv_tokens,
                              std::int64_t heads, std::int64_t head_dim) {
  return {KernelClass::kSdpa, {batch, q_tokens, kv_tokens, heads, head_dim}};
}
/// The shape of a memory-bound kernel over `elements` elements in rows of `width`.
inline KernelShape memory_shape(KernelClass c, std::int64_t elements, std::int64_t width) {
  return {c, {elements, width, 0, 0, 0}};
}

inline std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kNorm:
      return "norm";
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kCopy:
      return "copy";
  }
  return "?";
}

inline constexpr std::array<std::string_view, kNumKernelClasses> kKernelClassNames = {
    "",
    "gemm",
    "sdpa",
    "layernorm",
    "layernorm_affine",
    "rms_norm",
    "rms_norm_unfused",
    "rope_real",
    "rope_complex",
    "add",
    "mul",
    "silu",
    "gelu_tanh",
    "swiglu",
    "modulate_eager",
    "gated_residual_eager",
    "copy",
    "transpose_bhsd_bshd",
    "layout_a2a",
    "cat_seq",
    "cat_feat",
    "host_block",
};

inline std::string_view kernel_class_name(KernelClass c) {
  return kKernelClassNames[static_cast<size_t>(c)];
}

inline std::optional<KernelClass> kernel_class_of(std::string_view name) {
  if (name.empty()) return std::nullopt;
  for (int i = 1; i < kNumKernelClasses; ++i)
    if (kKernelClassNames[static_cast<size_t>(i)] == name) return static_cast<KernelClass>(i);
  return std::nullopt;
}

inline OpKind kernel_class_kind(KernelClass c) {
  switch (c) {
    case KernelClass::kGemm:
      return OpKind::kGemm;
    case KernelClass::kSdpa:
      return OpKind::kAttention;
    case KernelClass::kLayerNorm:
    case KernelClass::kLayerNormAffine:
    case KernelClass::kRmsNorm:
    case KernelClass::kRmsNormUnfused:
      return OpKind::kNorm;
    case KernelClass::kCopy:
    case KernelClass::kTransposeBhsdBshd:
    case KernelClass::kLayoutA2a:
    case KernelClass::kCatSeq:
    case KernelClass::kCatFeat:
      return OpKind::kCopy;
    default:
      return OpKind::kElementwise;
  }
}

}  // namespace cocodiff
