// Ring all-gather: in step k = 0..p-2, rank r forwards block (r-k) mod p to r+1 and receives
// block (r-k-1) mod p from r-1. T = call + (p-1) (sw(m) + alpha + m beta) on a contention-free
// network, sw being the library's software time per message.

#include <cstring>

#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu::collectives {

void all_gather_ring(Port& port, std::span<const float> send, std::span<float> recv,
                     std::int64_t count) {
  const int p = port.size();
  const int r = port.rank();
  if (!send.empty() && !recv.empty() && count > 0)
    std::memcpy(recv.data() + r * count, send.data(), static_cast<size_t>(count) * sizeof(float));
  const int right = (r + 1) % p;
  const int left = (r - 1 + p) % p;
  port.charge_call();
  for (int k = 0; k + 1 < p; ++k) {
    const int out_block = (r - k + p) % p;
    const int in_block = (r - k - 1 + 2 * p) % p;
    detail::ReqPtr rr = port.irecv(sub(recv, in_block * count, count), count, left, k);
    port.charge_message(count);
    detail::ReqPtr sr =
        port.isend(sub(std::span<const float>(recv), out_block * count, count), count, right, k);
    port.wait(rr);
    port.wait(sr);
  }
}

}  // namespace cocodiff::emu::collectives
