#pragma once
// Fits the host's step factor and sync slowdown (device.host.step_factor, sync_slowdown:
// net_models/device_model.hpp, host_issue_scale: a host's op issue costs are taken
// step_factor x (1 + sync_slowdown x (H(n) - 1)) times on n ranks) to measured host-bound
// steps: the flat steps of two or more GPUs at the smallest resolution the steps files hold
// (1024^2 in measure_multi.py's steps_*.csv, where eager steps are host-bound). Each file is one
// machine: a step measured in several launches counts once, at the median of its rows.
//
// Two stages. For each GPU count n, the whole factor c_n that times the flat step best (least
// squared log error over the files of that count, golden-section search to within 0.0005,
// every other figure of the cluster as it is). Then c_n = a + b (H(n) - 1) by least squares,
// each count weighted by its files: step_factor = a, sync_slowdown = b / a, both rounded to
// 0.01. Steps of a single GPU count cannot tell the two apart: the step factor stays 1 and the
// sync slowdown takes the whole of c_n. A factor that does not grow with n gives sync 0.
//
//   HostSyncFit f = fit_host_sync(m.steps, [&](int gpus, int res, double a, double s) { ... });
//   f.step_factor;  f.sync_slowdown;  f.rms_log;  f.cases[0].predicted_ms
//   f.range_low;  f.range_high;    // device.host.range, from two or more machines

#include <functional>
#include <string>
#include <vector>

#include "calibrate/measurements.hpp"

namespace cocodiff::calibrate {

/// The search's upper end for one GPU count's whole factor (the cluster file's ranges: step
/// factor 0.1 to 10, sync slowdown 0 to 10).
inline constexpr double kMaxHostScale = 10.0;

struct HostSyncCase {
  std::string source;  // the steps file
  int gpus = 0;
  int rows = 0;             // launches that measured the step
  double measured_ms = 0;   // the median of its rows
  double predicted_ms = 0;  // at the fitted step factor and sync slowdown
};

struct HostSyncFit {
  double step_factor = 1;           // rounded to 2 decimals
  double sync_slowdown = 0;         // rounded to 2 decimals
  double rms_log = 0;               // over the cases, at the fitted figures
  int resolution = 0;               // the steps' resolution (the smallest in the files)
  int gpu_counts = 0;               // distinct GPU counts among the cases
  int predictions = 0;              // distinct (gpus, factor, sync) the predictor was asked for
  std::vector<HostSyncCase> cases;  // by file, then gpus
  /// The machines' hosts against the fitted one (device.host.range): the lowest and highest
  /// measured / predicted of the cases, rounded outwards to 0.01, when the cases come from two
  /// or more files (machines); both 0 otherwise. A host-bound step takes about its host's time,
  /// so a machine whose step is measured at this ratio issues that much faster or slower.
  double range_low = 0, range_high = 0;
  int machines = 0;  // distinct files among the cases
};

/// Milliseconds of one flat step on `gpus` GPUs at resolution^2 with the host's step factor and
/// sync slowdown (every other figure the cluster's).
using StepPredictor =
    std::function<double(int gpus, int resolution, double step_factor, double sync_slowdown)>;

/// InputError when no flat step of two or more GPUs is among `steps`.
HostSyncFit fit_host_sync(const std::vector<StepPoint>& steps, const StepPredictor& predict);

}  // namespace cocodiff::calibrate
