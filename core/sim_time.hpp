#pragma once
// Virtual time: integer nanoseconds, so that sums are exact and the timeline is reproducible.
// Arithmetic is checked: a result beyond the representable horizon (2^63 ns, about 292 years)
// throws TimeOverflowError rather than wrapping or saturating.

#include <compare>
#include <cstdint>
#include <limits>
#include <string_view>

namespace cocodiff {

/// Throws TimeOverflowError for `a op b` (op is "+" or "-"), which does not fit in 64 bits.
[[noreturn]] void sim_time_overflow(std::int64_t a, char op, std::int64_t b);

/// A point or a span of virtual time, in whole nanoseconds.
class SimTime {
 public:
  constexpr SimTime() = default;
  static constexpr SimTime from_ns(std::int64_t ns) { return SimTime(ns); }
  /// Rounds up, so that a non-zero cost never becomes free. A span that is not finite or lies
  /// beyond the horizon throws TimeOverflowError naming `what` (the quantity being converted).
  static SimTime from_seconds(double s, std::string_view what = "a time span");
  /// The sentinel "never"; not to be added to.
  static constexpr SimTime max() { return SimTime(std::numeric_limits<std::int64_t>::max()); }

  constexpr std::int64_t ns() const { return ns_; }
  constexpr double seconds() const { return static_cast<double>(ns_) * 1e-9; }
  constexpr double us() const { return static_cast<double>(ns_) * 1e-3; }

  constexpr SimTime operator+(SimTime o) const {
    std::int64_t r = 0;
    if (__builtin_add_overflow(ns_, o.ns_, &r)) sim_time_overflow(ns_, '+', o.ns_);
    return SimTime(r);
  }
  constexpr SimTime operator-(SimTime o) const {
    std::int64_t r = 0;
    if (__builtin_sub_overflow(ns_, o.ns_, &r)) sim_time_overflow(ns_, '-', o.ns_);
    return SimTime(r);
  }
  constexpr SimTime& operator+=(SimTime o) { return *this = *this + o; }
  constexpr auto operator<=>(const SimTime&) const = default;

 private:
  constexpr explicit SimTime(std::int64_t ns) : ns_(ns) {}
  std::int64_t ns_ = 0;
};

}  // namespace cocodiff
