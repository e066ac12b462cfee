#pragma once
// Turns ops measured as eager PyTorch runs them (EagerOpPoint: a CUDA-graph device time and the
// host's issue time per op) and interference measurements into the device preset's tables:
//  - [device.kernels.LABEL]: for each op label cocodiff charges, the device times of the
//    PyTorch ops that do its work, keyed by the FLOPs cocodiff charges (equal FLOP counts
//    averaged in log time);
//  - [device.host]: op_issue_us, collective_issue_us and [device.host.ops] LABEL = the host's
//    time to issue the label's PyTorch code (median over every point of that op, so over every
//    machine given);
//  - device.overlap_compute_factor / overlap_transfer_factor: a GEMM and the largest all-to-all
//    measured beside it, each against its time alone;
//  - device.overlap_kind_weight.KIND: the attention's (attention) and Q/K norm+RoPE's (norm,
//    elementwise) slowdown beside that all-to-all, in the same file, as a share of the GEMM's.
// Which PyTorch op does the work of which label is the table in eager_fit.cpp, written from
// dit/ (what each label charges) and bench/fidelity/measure_multi.py (what each op runs).
//
//   EagerFit f = fit_eager(m.eager_ops, m.interference);
//   f.tables["q_proj"];  f.host_ops["q_rope"];  f.collective_issue_us;  f.overlap_compute

#include <map>
#include <string>
#include <vector>

#include "calibrate/kernel_fit.hpp"
#include "calibrate/measurements.hpp"

namespace cocodiff::calibrate {

struct EagerFit {
  std::map<std::string, KernelTableFit> tables;   // per label, from device times
  std::map<std::string, std::string> table_from;  // per label: "linear q_proj, ..." (its rows)
  std::map<std::string, double> host_ops;         // per label, from host times
  double op_issue_us = 0;          // any other op: the median of host_ops (0: no host times)
  double collective_issue_us = 0;  // all_to_all / all_gather issue (0: not measured)
  double overlap_compute = 0, overlap_transfer = 0;  // 0: no interference measured
  std::string interference_from;                     // the point the factors came from
  /// Where interference was measured over several group sizes: the base factors above are the
  /// largest group's, and every other group's are its own (device.overlap_by_group).
  struct GroupFactors {
    double compute = 0, transfer = 0;
    std::string from;
  };
  std::map<int, GroupFactors> overlap_by_group;
  /// device.overlap_kind_weight by kind name ("attention", "norm", "elementwise"): (s - 1) /
  /// (g - 1), s the kind's kernel's slowdown and g the GEMM's beside the same all-to-all; empty
  /// where the file has no such kernel or the GEMM was not slowed.
  std::map<std::string, double> kind_weights;
  std::map<std::string, std::string> kind_weight_from;  // per kind: the point it came from
  std::vector<std::string> missing;  // host ops a label needs that no point measured
};

/// InputError when a label's host time would be negative (norm_modulate measured below
/// rms_norm), naming the ops.
EagerFit fit_eager(const std::vector<EagerOpPoint>& ops,
                   const std::vector<InterferencePoint>& interference);

}  // namespace cocodiff::calibrate
