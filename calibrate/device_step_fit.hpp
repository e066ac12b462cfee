#pragma once
// Fits the kernels' step factor (device.step_factor: net_models/device_model.hpp,
// DeviceModel::kernel_step_factor, every op's device time taken that many times) to measured
// device-bound steps: the flat steps of one GPU at the largest resolution the steps files hold
// (2048^2 in measure_multi.py's steps_*.csv, where an eager step keeps its GPU busy and makes no
// exchange). Each file is one machine: a step measured in several launches counts once, at the
// median of its rows.
//
// The factor that times them best: least squared log error, golden-section search on
// [kMinKernelStepFactor, kMaxKernelStepFactor] to within 0.0005, every other figure of the
// cluster as it is, rounded to 0.001. A step that the model times as host-bound cannot tell the
// factor: when the step grows by less than half of a change in the factor
// (d log step / d log factor < 0.5 at the cluster's factor), nothing is fitted.
//
//   DeviceStepFit f = fit_device_step(m.steps, [&](int res, double factor) { ... }, 1.0);
//   if (f.fitted) f.step_factor;  f.cases[0].predicted_ms;  f.sensitivity

#include <functional>
#include <string>
#include <vector>

#include "calibrate/measurements.hpp"

namespace cocodiff::calibrate {

/// The search's ends: a step's device work from half to twice its kernels' time alone.
inline constexpr double kMinKernelStepFactor = 0.5;
inline constexpr double kMaxKernelStepFactor = 2.0;

struct DeviceStepCase {
  std::string source;       // the steps file
  int rows = 0;             // launches that measured the step
  double measured_ms = 0;   // the median of its rows
  double predicted_ms = 0;  // at the fitted factor (at the cluster's when nothing was fitted)
};

struct DeviceStepFit {
  bool fitted = false;                // false: no such step, or the model's step is host-bound
  double step_factor = 1;             // rounded to 3 decimals (the cluster's when not fitted)
  double rms_log = 0;                 // over the cases, at step_factor
  double sensitivity = 0;             // d log(step) / d log(factor) at the cluster's factor
  int resolution = 0;                 // the steps' resolution (the largest in the files)
  int predictions = 0;                // distinct factors the predictor was asked for
  std::vector<DeviceStepCase> cases;  // by file
};

/// Milliseconds of one flat 1-GPU step at resolution^2 with the kernels' step factor (every
/// other figure the cluster's).
using DeviceStepPredictor = std::function<double(int resolution, double step_factor)>;

/// `current` is the cluster's factor. No case (and nothing fitted) when the files hold no flat
/// 1-GPU step at their largest resolution.
DeviceStepFit fit_device_step(const std::vector<StepPoint>& steps,
                              const DeviceStepPredictor& predict, double current);

}  // namespace cocodiff::calibrate
