#include "dit/parallel/fp8.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace cocodiff::dit {

namespace {

// The 127 non-negative finite values, by code 0x00..0x7E (increasing).
const std::array<float, 127>& positive_values() {
  static const std::array<float, 127> v = [] {
    std::array<float, 127> t{};
    for (int c = 0; c < 127; ++c) {
      const int e = c >> 3, m = c & 7;
      t[static_cast<size_t>(c)] = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6)
                                         : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
    }
    return t;
  }();
  return v;
}

}  // namespace

std::uint8_t e4m3_encode(float v) {
  if (std::isnan(v)) return 0x7F;
  const std::uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float a = std::min(std::fabs(v), kE4m3Max);
  const std::array<float, 127>& t = positive_values();
  const auto hi = std::lower_bound(t.begin(), t.end(), a);  // first value >= a
  int code = static_cast<int>(hi - t.begin());
  if (code > 0 && (code == 127 || *hi != a)) {
    const int lo = code - 1;
    const float dl = a - t[static_cast<size_t>(lo)];
    const float dh = code < 127 ? t[static_cast<size_t>(code)] - a : INFINITY;
    // Nearest; a tie goes to the even code (mantissa's last bit 0).
    code = dl < dh || (dl == dh && (lo & 1) == 0) ? lo : code;
  }
  return static_cast<std::uint8_t>(sign | code);
}

float e4m3_decode(std::uint8_t code) {
  const int c = code & 0x7F;
  if (c == 0x7F) return NAN;
  const float a = positive_values()[static_cast<size_t>(c)];
  return (code & 0x80) != 0 ? -a : a;
}

void fp8_encode(ConstMatMap x, float* out) {
  const std::int64_t cols = x.cols(), words = fp8_row_words(cols);
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    float* row = out + r * words;
    const float amax = cols > 0 ? x.row(r).cwiseAbs().maxCoeff() : 0.0f;
    const float scale = amax > 0 && std::isfinite(amax) ? amax / kE4m3Max : 1.0f;
    row[0] = scale;
    for (std::int64_t j = 0; j < cols; j += 2) {
      std::uint32_t w = e4m3_encode(x(r, j) / scale);
      if (j + 1 < cols) w |= static_cast<std::uint32_t>(e4m3_encode(x(r, j + 1) / scale)) << 8;
      std::memcpy(row + 1 + j / 2, &w, sizeof w);
    }
  }
}

void fp8_decode(const float* in, MatMap y) {
  const std::int64_t cols = y.cols(), words = fp8_row_words(cols);
  for (Eigen::Index r = 0; r < y.rows(); ++r) {
    const float* row = in + r * words;
    const float scale = row[0];
    for (std::int64_t j = 0; j < cols; j += 2) {
      std::uint32_t w = 0;
      std::memcpy(&w, row + 1 + j / 2, sizeof w);
      y(r, j) = scale * e4m3_decode(static_cast<std::uint8_t>(w & 0xFF));
      if (j + 1 < cols) y(r, j + 1) = scale * e4m3_decode(static_cast<std::uint8_t>(w >> 8));
    }
  }
}

void int4_encode(ConstMatMap x, float* out) {
  const std::int64_t cols = x.cols(), words = int4_row_words(cols);
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    float* row = out + r * words;
    const float amax = cols > 0 ? x.row(r).cwiseAbs().maxCoeff() : 0.0f;
    const float scale = amax > 0 && std::isfinite(amax) ? amax / 7.0f : 1.0f;
    row[0] = scale;
    for (std::int64_t j = 0; j < cols; j += 4) {
      std::uint32_t w = 0;
      for (std::int64_t k = 0; k < 4 && j + k < cols; ++k) {
        const float q = std::nearbyint(std::clamp(x(r, j + k) / scale, -7.0f, 7.0f));  // ties even
        const auto code = static_cast<std::uint32_t>(static_cast<int>(q) + 8);
        w |= code << (4 * k);
      }
      std::memcpy(row + 1 + j / 4, &w, sizeof w);
    }
  }
}

void int4_decode(const float* in, MatMap y) {
  const std::int64_t cols = y.cols(), words = int4_row_words(cols);
  for (Eigen::Index r = 0; r < y.rows(); ++r) {
    const float* row = in + r * words;
    const float scale = row[0];
    for (std::int64_t j = 0; j < cols; j += 4) {
      std::uint32_t w = 0;
      std::memcpy(&w, row + 1 + j / 4, sizeof w);
      for (std::int64_t k = 0; k < 4 && j + k < cols; ++k)
        y(r, j + k) = scale * static_cast<float>(static_cast<int>((w >> (4 * k)) & 0xF) - 8);
    }
  }
}

}  // namespace cocodiff::dit
