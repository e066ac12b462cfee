#pragma once
// The timeline hash's digest: 64-bit words folded one at a time (hash_word), integers and
// enums as one word, strings as little-endian words and their length.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace cocodiff::emu::detail {

inline constexpr std::uint64_t kHashBasis = 1469598103934665603ull;  // the timeline hash's start

/// The timeline hash folds 64-bit words: xor, multiply by an odd constant (2^64 over the golden
/// ratio), and fold the high half into the low one, so every bit of a word reaches every bit of
/// the state within a few words, at one multiply a word. Ring pass rows are kept by the same
/// digest.
inline void hash_word(std::uint64_t& h, std::uint64_t v) {
  h = (h ^ v) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 32;
}

/// An integer or an enum as one word.
template <typename T>
inline void hash_value(std::uint64_t& h, T v) {
  static_assert(std::is_integral_v<T> || std::is_enum_v<T>);
  if constexpr (std::is_enum_v<T>)
    hash_word(h, static_cast<std::uint64_t>(static_cast<std::underlying_type_t<T>>(v)));
  else
    hash_word(h, static_cast<std::uint64_t>(v));
}

/// A string as little-endian words (the last one zero-padded), then its length. Words are loaded
/// whole where the machine is little-endian: the same values.
inline void hash_bytes(std::uint64_t& h, std::string_view s) {
  const size_t n = s.size();
  const auto bytewise = [&s](size_t i, size_t count) {
    std::uint64_t w = 0;
    for (size_t k = 0; k < count; ++k)
      w |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
    return w;
  };
  constexpr bool kLittle = std::endian::native == std::endian::little;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w = 0;
    if constexpr (kLittle)
      std::memcpy(&w, s.data() + i, 8);
    else
      w = bytewise(i, 8);
    hash_word(h, w);
  }
  std::uint64_t w = 0;
  if (kLittle && n >= 8 && i < n) {
    // The last 8 bytes, shifted down to the ones not hashed yet.
    std::memcpy(&w, s.data() + n - 8, 8);
    w >>= 8 * (8 - (n - i));
  } else if (kLittle) {
    if (i < n) std::memcpy(&w, s.data() + i, n - i);  // the low bytes; the rest stay zero
  } else {
    w = bytewise(i, n - i);
  }
  hash_word(h, w);
  hash_word(h, n);
}

}  // namespace cocodiff::emu::detail
