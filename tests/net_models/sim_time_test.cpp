// Virtual time arithmetic is checked: sums, differences and conversions that leave the 2^63 ns
// horizon throw TimeOverflowError naming the quantity, instead of wrapping (which once made a
// flow start "in the past") or saturating (which once reported 2^62 ns as a result).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/errors.hpp"
#include "core/sim_time.hpp"
#include "net_models/device_model.hpp"

namespace cocodiff {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

template <typename F>
std::string overflow_of(F f) {
  try {
    f();
  } catch (const TimeOverflowError& e) {
    return e.what();
  }
  return "(no TimeOverflowError)";
}

TEST(SimTimeGuard, SumsAndDifferencesBeyondTheHorizonThrow) {
  const SimTime big = SimTime::from_ns(kMax - 10);
  EXPECT_EQ((big + SimTime::from_ns(10)).ns(), kMax);
  EXPECT_NE(overflow_of([&] { (void)(big + SimTime::from_ns(11)); }).find("virtual time overflow"),
            std::string::npos);
  SimTime t = big;
  EXPECT_NE(overflow_of([&] { t += big; }).find("does not fit"), std::string::npos);
  EXPECT_EQ(t, big);  // unchanged after the failed addition
  const SimTime low = SimTime::from_ns(std::numeric_limits<std::int64_t>::min() + 5);
  EXPECT_NE(overflow_of([&] { (void)(low - SimTime::from_ns(6)); }).find("virtual time overflow"),
            std::string::npos);
}

TEST(SimTimeGuard, ConversionsBeyondTheHorizonNameTheQuantity) {
  EXPECT_EQ(SimTime::from_seconds(9e9).ns(), 9'000'000'000'000'000'000);  // 285 years: fits
  EXPECT_EQ(SimTime::from_seconds(-1).ns(), 0);
  EXPECT_EQ(overflow_of([] { (void)SimTime::from_seconds(1e10, "the widget time"); }),
            "virtual time overflow: the widget time takes 1e+10 s, beyond the representable "
            "horizon of 2^63 ns (about 292 years)");
  EXPECT_NE(overflow_of([] { (void)SimTime::from_seconds(std::nan("")); }).find("nan s"),
            std::string::npos);
  EXPECT_NE(overflow_of([] {
              (void)SimTime::from_seconds(std::numeric_limits<double>::infinity());
            }).find("inf s"),
            std::string::npos);
}

TEST(SimTimeGuard, AnOperationBeyondTheHorizonNamesTheDeviceKey) {
  RooflineParams p;
  p.peak_flops_per_s = 1e9;  // the smallest plausible peak, 0.001 TFLOP/s
  p.hbm_bytes_per_s = 1e9;
  const RooflineDevice d(p);
  EXPECT_NE(overflow_of([&] {
              (void)d.time({OpKind::kGemm, 1e19, 1});
            }).find("an operation's compute time at device.peak_tflops takes 1e+10 s"),
            std::string::npos);
  EXPECT_NE(overflow_of([&] {
              (void)d.time({OpKind::kGemm, 1, 1e19});
            }).find("memory time at device.hbm_gbytes_per_s"),
            std::string::npos);
}

}  // namespace
}  // namespace cocodiff
