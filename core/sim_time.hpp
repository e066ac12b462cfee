#pragma once
// Virtual time: integer nanoseconds, so that sums are exact and the timeline is reproducible.

#include <compare>
#include <cstdint>
#include <limits>

namespace cocodiff {

/// A point or a span of virtual time, in whole nanoseconds.
class SimTime {
 public:
  constexpr SimTime() = default;
  static constexpr SimTime from_ns(std::int64_t ns) { return SimTime(ns); }
  /// Rounds up, so that a non-zero cost never becomes free.
  static SimTime from_seconds(double s);
  static constexpr SimTime max() { return SimTime(std::numeric_limits<std::int64_t>::max()); }

  constexpr std::int64_t ns() const { return ns_; }
  constexpr double seconds() const { return static_cast<double>(ns_) * 1e-9; }
  constexpr double us() const { return static_cast<double>(ns_) * 1e-3; }

  constexpr SimTime operator+(SimTime o) const { return SimTime(ns_ + o.ns_); }
  constexpr SimTime operator-(SimTime o) const { return SimTime(ns_ - o.ns_); }
  constexpr SimTime& operator+=(SimTime o) {
    ns_ += o.ns_;
    return *this;
  }
  constexpr auto operator<=>(const SimTime&) const = default;

 private:
  constexpr explicit SimTime(std::int64_t ns) : ns_(ns) {}
  std::int64_t ns_ = 0;
};

}  // namespace cocodiff
