#include "dit/normal_fill.hpp"

#include <bit>
#include <cmath>

namespace cocodiff::dit {

void fill_normal_pairs(float* out, std::uint64_t key, std::uint64_t first_pair, std::int64_t pairs,
                       float stddev) {
  constexpr float kLn2 = 0.693147180559945309f;
  constexpr float kSqrt2 = 1.41421356237309505f;
  constexpr float kSqrtHalf = 0.707106781186547524f;
  constexpr float kHalfPi = 1.57079632679489662f;
  for (std::int64_t k = 0; k < pairs; ++k) {
    const std::uint64_t bits = splitmix64(key + first_pair + static_cast<std::uint64_t>(k));
    const auto a = static_cast<std::uint32_t>(bits >> 40);              // 24 bits: radius
    const auto b = static_cast<std::uint32_t>(bits >> 16) & 0xFFFFFFu;  // 24 bits: angle

    // ln u1 with u1 = (a + 1) 2^-24 in (0, 1]: u1 = m 2^e with m in [sqrt(1/2), sqrt(2)), and
    // ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^11.
    const float u1 = static_cast<float>(a + 1) * 0x1p-24f;
    const std::uint32_t ub = std::bit_cast<std::uint32_t>(u1);
    float m = std::bit_cast<float>((ub & 0x7FFFFFu) | 0x3F800000u);
    int e = static_cast<int>(ub >> 23) - 127;
    const bool high = m > kSqrt2;
    m *= high ? 0.5f : 1.0f;  // selects constants only: the loop stays branch-free
    e += high ? 1 : 0;
    const float s = (m - 1.0f) / (m + 1.0f);
    const float s2 = s * s;
    const float ln_m =
        2.0f * s *
        (1.0f + s2 * (1.0f / 3 + s2 * (1.0f / 5 + s2 * (1.0f / 7 + s2 * (1.0f / 9 + s2 / 11)))));
    const float ln_u1 = static_cast<float>(e) * kLn2 + ln_m;
    const float r = std::sqrt(-2.0f * ln_u1) * stddev;

    // t = 2 pi u2 = q pi/2 + pi/4 + x: quadrant q from the top 2 bits, x in [-pi/4, pi/4).
    const std::uint32_t q = b >> 22;
    const float x = (static_cast<float>(b & 0x3FFFFFu) * 0x1p-22f - 0.5f) * kHalfPi;
    const float x2 = x * x;
    const float sin_x =
        x * (1.0f + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 + x2 / 362880))));
    const float cos_x =
        1.0f +
        x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 - x2 / 3628800))));
    const float c = (cos_x - sin_x) * kSqrtHalf;   // cos(pi/4 + x)
    const float sn = (cos_x + sin_x) * kSqrtHalf;  // sin(pi/4 + x)
    // Rotating by q quarter turns: (c, s) -> (-s, c) -> (-c, -s) -> (s, -c).
    const bool swap = (q & 1u) != 0;
    const std::uint32_t neg_cos = ((q + 1u) >> 1 & 1u) << 31;
    const std::uint32_t neg_sin = (q >> 1) << 31;
    const float cos_t = std::bit_cast<float>(std::bit_cast<std::uint32_t>(swap ? sn : c) ^ neg_cos);
    const float sin_t = std::bit_cast<float>(std::bit_cast<std::uint32_t>(swap ? c : sn) ^ neg_sin);
    out[2 * k] = r * cos_t;
    out[2 * k + 1] = r * sin_t;
  }
}

}  // namespace cocodiff::dit
