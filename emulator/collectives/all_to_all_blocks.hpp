#pragma once
// The blocks of an all-to-all: what goes to a peer and what comes from one, as every
// all-to-all schedule names them.

#include "emulator/collectives/schedule.hpp"

namespace cocodiff::emu::collectives {

/// The block for `to`, from the send buffer.
inline Message block_to(const Sizes& s, int to, int step) {
  const std::int64_t n = s.send_count(to);
  return {to, step, n, {Buffer::kSend, s.send_displ(to), n}};
}
/// The block from `from`, into the receive buffer.
inline Message block_from(const Sizes& s, int from, int step) {
  const std::int64_t n = s.recv_count(from);
  return {from, step, n, {Buffer::kRecv, s.recv_displ(from), n}};
}
/// A member's block for itself.
inline Schedule::Copy own_block(const Sizes& s, int me) {
  return {{Buffer::kSend, s.send_displ(me), s.send_count(me)},
          {Buffer::kRecv, s.recv_displ(me), s.send_count(me)}};
}

}  // namespace cocodiff::emu::collectives
