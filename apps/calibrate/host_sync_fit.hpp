#pragma once
// Fits device.host.sync_slowdown (net_models/device_model.hpp, host_issue_scale: a host's op
// issue costs grow with the run's n ranks as 1 + sync_slowdown x (H(n) - 1), each exchange
// waiting for the slowest host) to measured host-bound steps: the flat steps of two or more
// GPUs at the smallest resolution the steps files hold (1024^2 in measure_multi.py's
// steps_*.csv, where eager H100 steps are host-bound). Each file is one machine: a step
// measured in several launches counts once, at the median of its rows. The fit minimises the
// sum of squared log errors by golden-section search over [0, kMaxSyncSlowdown], to within
// 0.01, every other figure of the cluster as it is; the caller's predictor times the step.
//
//   HostSyncFit f = fit_host_sync(m.steps, [&](int gpus, int res, double s) { return ms; });
//   f.sync_slowdown;  f.rms_log;  f.cases[0].predicted_ms

#include <functional>
#include <string>
#include <vector>

#include "apps/calibrate/measurements.hpp"

namespace cocodiff::calibrate {

/// The search's upper end (the cluster file's range for the key is 0 to 10).
inline constexpr double kMaxSyncSlowdown = 6.0;

struct HostSyncCase {
  std::string source;  // the steps file
  int gpus = 0;
  int rows = 0;             // launches that measured the step
  double measured_ms = 0;   // the median of its rows
  double predicted_ms = 0;  // at the fitted sync_slowdown
};

struct HostSyncFit {
  double sync_slowdown = 0;         // rounded to 2 decimals
  double rms_log = 0;               // over the cases, at sync_slowdown
  int resolution = 0;               // the steps' resolution (the smallest in the files)
  int predictions = 0;              // distinct (gpus, sync_slowdown) the predictor was asked for
  std::vector<HostSyncCase> cases;  // by file, then gpus
};

/// Milliseconds of one flat step on `gpus` GPUs at resolution^2 with the host's sync slowdown
/// `sync_slowdown` (every other figure the cluster's).
using StepPredictor = std::function<double(int gpus, int resolution, double sync_slowdown)>;

/// InputError when no flat step of two or more GPUs is among `steps`.
HostSyncFit fit_host_sync(const std::vector<StepPoint>& steps, const StepPredictor& predict);

}  // namespace cocodiff::calibrate
