#include "calibrate/spread_fit.hpp"

#include <algorithm>

#include "net_models/device_model.hpp"

namespace cocodiff::calibrate {

SpreadFit fit_spread(const std::vector<BreakdownPoint>& points) {
  SpreadFit f;
  double wa = 0, aa = 0;  // least squares of wait = spread x a, a = top(gpus) x work
  for (const BreakdownPoint& p : points) {
    SpreadCase c;
    c.point = &p;
    c.work_ms = 0.5 * (p.rest_ms_min + p.rest_ms_max);
    const double a = rank_spread_top(p.gpus) * c.work_ms;
    c.used = p.host_late_ms_max <= kHostBoundShare * p.step_ms && a > 0;
    if (c.used) {
      c.spread = p.segment_wait_ms / a;
      wa += p.segment_wait_ms * a;
      aa += a * a;
      ++f.used;
    }
    f.cases.push_back(c);
  }
  if (aa > 0) f.rank_spread = std::min(0.2, wa / aa);
  for (SpreadCase& c : f.cases)
    c.predicted_wait_ms = f.rank_spread * rank_spread_top(c.point->gpus) * c.work_ms;
  return f;
}

}  // namespace cocodiff::calibrate
