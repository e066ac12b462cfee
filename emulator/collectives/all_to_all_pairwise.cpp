// Pairwise-exchange all-to-all (MPI's large-message algorithm): in round k = 1..p-1, rank r
// sends its block for (r+k) mod p and receives the block of (r-k) mod p, and waits for both
// before the next round. On a contention-free alpha-beta network with m bytes per block:
// T = (p-1) (alpha + m beta).

#include <cstring>

#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu::collectives {

void all_to_allv_pairwise(Port& port, std::span<const float> send, std::span<float> recv,
                          const AllToAllvLayout& l) {
  const int p = port.size();
  const int r = port.rank();
  const auto u = [](int i) { return static_cast<size_t>(i); };
  if (!send.empty() && !recv.empty() && l.send_counts[u(r)] > 0)
    std::memcpy(recv.data() + l.recv_displs[u(r)], send.data() + l.send_displs[u(r)],
                static_cast<size_t>(l.send_counts[u(r)]) * sizeof(float));
  for (int k = 1; k < p; ++k) {
    const int to = (r + k) % p;
    const int from = (r - k + p) % p;
    detail::ReqPtr rr = port.irecv(sub(recv, l.recv_displs[u(from)], l.recv_counts[u(from)]),
                                   l.recv_counts[u(from)], from, 0);
    detail::ReqPtr sr = port.isend(sub(send, l.send_displs[u(to)], l.send_counts[u(to)]),
                                   l.send_counts[u(to)], to, 0);
    port.wait(rr);
    port.wait(sr);
  }
}

}  // namespace cocodiff::emu::collectives
