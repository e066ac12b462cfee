#include "core/sim_time.hpp"

#include <cmath>

namespace cocodiff {

SimTime SimTime::from_seconds(double s) {
  if (!(s > 0)) return SimTime(0);
  return SimTime(static_cast<std::int64_t>(std::ceil(s * 1e9 - 1e-6)));
}

}  // namespace cocodiff
