#pragma once
// What an operation costs a device: the device model turns this into time (roofline).

#include <cstdint>
#include <string_view>

namespace cocodiff {

enum class OpKind : std::uint8_t { kGemm, kAttention, kNorm, kElementwise, kCopy };
inline constexpr int kNumOpKinds = 5;

std::string_view op_kind_name(OpKind kind);

/// FLOPs and HBM bytes of one operation on one tile. `label` names it in traces.
struct OpCost {
  OpKind kind = OpKind::kElementwise;
  double flops = 0;
  double bytes = 0;
  std::string_view label = {};
  bool operator==(const OpCost&) const = default;
};

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

}  // namespace cocodiff
