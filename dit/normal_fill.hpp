#pragma once
// The float normal generator behind seeded random weights (dit/weights.hpp): one 64-bit
// counter draw per pair of values, Box-Muller in float with polynomial logarithm, sine and
// cosine, so the loop vectorises and has no library calls. Compiled without FMA contraction:
// the values are the same on every x86-64 machine, whatever -march the build tunes for.
//
//   std::vector<float> w(2 * 1000);
//   fill_normal_pairs(w.data(), key, /*first_pair=*/0, /*pairs=*/1000, /*stddev=*/0.02f);

#include <cstdint>

namespace cocodiff::dit {

/// splitmix64's output function: the counter-based stream of every seeded value.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// out[2k], out[2k+1] = stddev * (r cos t, r sin t) of counter key + first_pair + k, for
/// k < pairs: r = sqrt(-2 ln u1), t = 2 pi u2, u1 in (0, 1] and u2 in [0, 1) from 24 bits each
/// of splitmix64(counter). Magnitudes stop at sqrt(48 ln 2) = 5.77 (u1 >= 2^-24).
void fill_normal_pairs(float* out, std::uint64_t key, std::uint64_t first_pair, std::int64_t pairs,
                       float stddev);

}  // namespace cocodiff::dit
