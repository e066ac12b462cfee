#pragma once
// Fits device.rank_spread (net_models/device_model.hpp) to measured breakdowns of flat steps:
// in each case the mean rank waits segment_wait_ms a step for the slowest rank's work between
// two exchanges, and the model makes that wait rank_spread x rank_spread_top(gpus) x the mean
// rank's work outside exchanges. The fit is the least-squares spread over the device-bound cases
// (the GPU never waits for its own host for more than 1% of the step) in milliseconds of wait,
// so that the longest steps, whose waits cost the most time, weigh the most.
//
//   SpreadFit f = fit_spread(m.breakdowns);
//   f.rank_spread;  f.cases[0].spread;  f.cases[0].predicted_wait_ms

#include <string>
#include <vector>

#include "calibrate/measurements.hpp"

namespace cocodiff::calibrate {

struct SpreadCase {
  const BreakdownPoint* point = nullptr;
  bool used = false;             // device-bound
  double work_ms = 0;            // the mean rank's work outside exchanges, a step
  double spread = 0;             // the spread this case alone would give (0 for one not used)
  double predicted_wait_ms = 0;  // the fitted spread's wait for this case
};

struct SpreadFit {
  double rank_spread = 0;  // least squares over the used cases, at most 0.2
  int used = 0;
  std::vector<SpreadCase> cases;  // in the order given
};

/// The host's share of a step above which a case is host-bound and not used.
inline constexpr double kHostBoundShare = 0.01;

SpreadFit fit_spread(const std::vector<BreakdownPoint>& points);

}  // namespace cocodiff::calibrate
