#include "core/sim_time.hpp"

#include <cmath>
#include <sstream>

#include "core/errors.hpp"

namespace cocodiff {

void sim_time_overflow(std::int64_t a, char op, std::int64_t b) {
  std::ostringstream os;
  os << "virtual time overflow: " << a << " ns " << op << " " << b
     << " ns does not fit in the representable horizon of 2^63 ns (about 292 years); a "
        "bandwidth, peak or latency in the config is implausibly small or large";
  throw TimeOverflowError(os.str());
}

SimTime SimTime::from_seconds(double s, std::string_view what) {
  if (s <= 0) return SimTime(0);
  // 2^63 ns as a double; anything at or above it (or NaN, or inf) cannot be represented.
  constexpr double kHorizonNs = 9223372036854775808.0;
  const double ns = std::ceil(s * 1e9 - 1e-6);
  if (!(ns < kHorizonNs)) {
    std::ostringstream os;
    os << "virtual time overflow: " << what << " takes " << s
       << " s, beyond the representable horizon of 2^63 ns (about 292 years)";
    throw TimeOverflowError(os.str());
  }
  return SimTime(static_cast<std::int64_t>(ns));
}

}  // namespace cocodiff
