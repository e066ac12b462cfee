// Pairwise-exchange all-to-all (MPI's large-message algorithm): p-1 synchronised rounds; in
// round k rank r sends to pairwise_send_peer(k) and receives from pairwise_recv_peer(k), and
// waits for both before the next round. Shift order pairs r with r+k and r-k; XOR order (MPICH
// and Open MPI for power-of-two groups) pairs r with r^k, so each round is a set of disjoint
// two-way exchanges. Each message first costs the sender the library's software time sw(m).
// On a contention-free alpha-beta network with m bytes per block:
// T = call + (p-1) (sw(m) + alpha + m beta).

#include <algorithm>
#include <cstring>

#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu::collectives {

void all_to_allv_pairwise(Port& port, std::span<const float> send, std::span<float> recv,
                          const AllToAllvLayout& l, AllToAllAlgorithm order) {
  const int p = port.size();
  const int r = port.rank();
  const auto u = [](int i) { return static_cast<size_t>(i); };
  if (!send.empty() && !recv.empty() && l.send_counts[u(r)] > 0)
    std::memcpy(recv.data() + l.recv_displs[u(r)], send.data() + l.send_displs[u(r)],
                static_cast<size_t>(l.send_counts[u(r)]) * sizeof(float));
  port.charge_call();
  for (int k = 1; k < p; ++k) {
    const int to = pairwise_send_peer(order, p, r, k);
    const int from = pairwise_recv_peer(order, p, r, k);
    detail::ReqPtr rr = port.irecv(sub(recv, l.recv_displs[u(from)], l.recv_counts[u(from)]),
                                   l.recv_counts[u(from)], from, 0);
    port.charge_message(l.send_counts[u(to)]);
    detail::ReqPtr sr = port.isend(sub(send, l.send_displs[u(to)], l.send_counts[u(to)]),
                                   l.send_counts[u(to)], to, 0);
    port.wait(rr);
    port.wait(sr);
  }
}

}  // namespace cocodiff::emu::collectives
