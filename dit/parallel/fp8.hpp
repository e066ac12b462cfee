#pragma once
// FP8 exchanges: a block all-to-all whose payload is FP8 e4m3 with one fp32 scale per row, as
// FastUSP's quantized all-to-all sends activations (per-token scales). E4M3 is the OCP "E4M3FN"
// format of NVIDIA's FP8 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no infinities,
// largest finite 448, S.1111.111 NaN): a row x is sent as scale = max |x| / 448 and
// e4m3(x / scale), rounded to nearest, ties to even, and read back as scale * value. The relative
// error of an element is at most 2^-4 of its row's scale band, and a row of zeros stays zero.
//
// On the wire a row of n values is one word for its scale and ceil(n / 2) words of two FP8 bytes
// each: the emulator times a word as one element (emulator.wire_bytes_per_element, 2 bytes), so
// a row costs 2 + n bytes (bf16: 2n). The two bytes sit in a word's low 16 bits, so a word is
// never a NaN pattern a copy could change.
//
//   const std::int64_t words = fp8_row_words(cols);        // per row on the wire
//   fp8_encode(ConstMatMap(x, rows, cols), out_words);     // rows * words floats
//   fp8_decode(in_words, MatMap(y, rows, cols));

#include <cstdint>

#include "core/tensor.hpp"

namespace cocodiff::dit {

/// Largest finite e4m3 value.
inline constexpr float kE4m3Max = 448.0f;

/// The e4m3 code nearest to v (ties to even; beyond +-448: +-448; NaN: the NaN code).
std::uint8_t e4m3_encode(float v);
/// The value of an e4m3 code.
float e4m3_decode(std::uint8_t code);

/// Words a row of `cols` values takes on the wire: its scale, then two codes a word.
inline std::int64_t fp8_row_words(std::int64_t cols) { return cols == 0 ? 0 : 1 + (cols + 1) / 2; }

/// x [rows, cols] -> rows * fp8_row_words(cols) words at `out`.
void fp8_encode(ConstMatMap x, float* out);
/// The inverse: rows * fp8_row_words(cols) words at `in` -> y [rows, cols].
void fp8_decode(const float* in, MatMap y);

// 4-bit residuals (StrategyOptions::compress = "residual": the residual compression of
// CompactFusion, "Accelerating Parallel Diffusion Model Serving with Residual Compression", which
// sends each step's change of an exchanged activation, compressed, and keeps the receiver's
// reconstruction on the sender too, so that the compression error does not build up): a
// row r is sent as scale = max |r| / 7 and round(r / scale) in [-7, 7] (ties to even), stored as
// that plus 8 in a nibble, four nibbles in a word's low 16 bits after the row's scale word. A row
// of n values is 1 + ceil(n / 4) words: 2 + n / 2 bytes at 2 bytes a word (bf16: 2n).

/// Words a row of `cols` values takes on the wire as 4-bit codes.
inline std::int64_t int4_row_words(std::int64_t cols) { return cols == 0 ? 0 : 1 + (cols + 3) / 4; }
/// x [rows, cols] -> rows * int4_row_words(cols) words at `out`.
void int4_encode(ConstMatMap x, float* out);
/// The inverse: rows * int4_row_words(cols) words at `in` -> y [rows, cols].
void int4_decode(const float* in, MatMap y);

}  // namespace cocodiff::dit
