#pragma once
// Fits the device's roofline to measured kernel times: max(flops / (peak x
// compute_efficiency[kind]), bytes / (hbm x memory_efficiency[kind])) + launch, by least squares
// on log time (the cluster's peak and HBM rate kept; per kind the efficiencies the points bound,
// one launch overhead), and turns every op's points into its measured table
// ([device.kernels.OP]: time by FLOP count, equal FLOP counts averaged in log time).
//
//   KernelFit f = fit_kernels(cluster.device_params, points);
//   f.launch_s;  f.eff_c[kind];  f.predicted_us[i];  f.tables["q_proj"]

#include <array>
#include <map>
#include <string>
#include <vector>

#include "calibrate/measurements.hpp"
#include "net_models/device_model.hpp"

namespace cocodiff::calibrate {

struct KernelTableFit {
  std::vector<double> flops;    // ascending
  std::vector<double> time_us;  // geometric mean of the points at each FLOP count
};

struct KernelFit {
  double launch_s = 0;
  std::array<double, kNumOpKinds> eff_c{}, eff_m{};
  std::array<bool, kNumOpKinds> fitted_c{}, fitted_m{};  // the efficiencies some point bounds
  std::vector<double> predicted_us;                      // per point, by the fitted roofline
  double rms_log = 0;
  std::map<std::string, KernelTableFit> tables;  // per op label (points with flops > 0)
};

/// Fits `points` (at least one) on device d; efficiencies no point is bound by keep d's.
KernelFit fit_kernels(const RooflineParams& d, const std::vector<KernelPoint>& points);

}  // namespace cocodiff::calibrate
