#pragma once
// Kernel grids measured on another GPU, carried to this one: the same eager PyTorch ops measured
// on both GPUs (bench/fidelity/measure_multi.py's kernels.csv, CUDA-graph device times) give
// each kind of kernel the factor this GPU's times are of the grids' GPU's
// (device.grid_scale.KIND). The factor is fitted by least squares on log time over the ops both
// files measured at the same shape (op, label, tokens, heads, k, n): the geometric mean of their
// ratios, every shape counting alike. (Their summed times' ratio, set by the largest kernels of a
// whole-image step, charged the smaller kernels of a rank on 2 and 4 GPUs too much: those run
// nearly alike on both GPUs.) Each op's own range of ratios is kept to be shown.
//
//   GridScaleFit f = fit_grid_scale(h100_ops, h200_ops);
//   f.scale[size_t(OpKind::kGemm)];   // 1.03: an H100 GEMM takes 1.03x the H200 grid's time
//
// Which kind each PyTorch op is: the projections (linear, linear_heads) and the modulation's
// linear (adaln) are GEMMs, sdpa is attention, rms_norm and norm_modulate are norms, rope, gelu
// and gated_residual elementwise, the layout copies (pack, unpack) and concat copies.

#include <array>
#include <map>
#include <string>
#include <vector>

#include "calibrate/measurements.hpp"

namespace cocodiff::calibrate {

struct GridScaleFit {
  std::array<double, kNumOpKinds> scale{1, 1, 1, 1, 1};
  std::array<bool, kNumOpKinds> fitted{};  // false: no op of the kind measured on both
  struct OpRatios {
    OpKind kind = OpKind::kGemm;
    int points = 0;
    double mine_us = 0, reference_us = 0;  // summed over the points
    double min_ratio = 0, max_ratio = 0;
  };
  std::map<std::string, OpRatios> ops;  // by PyTorch op
  std::vector<std::string> unmatched;   // "file:line" of this GPU's points the reference lacks
};

/// InputError when no op of `mine` with a device time has a counterpart in `reference`.
GridScaleFit fit_grid_scale(const std::vector<EagerOpPoint>& mine,
                            const std::vector<EagerOpPoint>& reference);

}  // namespace cocodiff::calibrate
