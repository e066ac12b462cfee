#pragma once
// Chunks of an in-place ring (reduce-scatter, all-reduce): chunk c of `count` elements, sent to
// the right neighbour or received from the left one, in the receive buffer.

#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

inline Message chunk_to_right(std::int64_t count, int p, int me, int c, int step) {
  const std::int64_t n = chunk_size(count, p, c);
  return {(me + 1) % p, step, n, {Buffer::kRecv, chunk_begin(count, p, c), n}};
}
inline Message chunk_from_left(std::int64_t count, int p, int me, int c, int step) {
  const std::int64_t n = chunk_size(count, p, c);
  return {wrap(me - 1, p), step, n, {Buffer::kRecv, chunk_begin(count, p, c), n}};
}

}  // namespace cocodiff::emu::collectives
