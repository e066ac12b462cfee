// Concurrent all-to-all (NCCL-style grouped send/recv): every pair's message is posted at
// once and the network model decides how they share the links. The sender posts its messages
// one after another, each after the library's software time: with p-1 messages of m bytes on a
// contention-free network, T = call + (p-1) sw(m) + alpha + m beta.

#include <cstring>
#include <vector>

#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu::collectives {

void all_to_allv_concurrent(Port& port, std::span<const float> send, std::span<float> recv,
                            const AllToAllvLayout& l) {
  const int p = port.size();
  const int r = port.rank();
  const auto u = [](int i) { return static_cast<size_t>(i); };
  if (!send.empty() && !recv.empty() && l.send_counts[u(r)] > 0)
    std::memcpy(recv.data() + l.recv_displs[u(r)], send.data() + l.send_displs[u(r)],
                static_cast<size_t>(l.send_counts[u(r)]) * sizeof(float));
  port.charge_call();
  std::vector<detail::ReqPtr> reqs;
  reqs.reserve(2 * static_cast<size_t>(p));
  for (int k = 1; k < p; ++k) {
    const int from = (r - k + p) % p;
    reqs.push_back(port.irecv(sub(recv, l.recv_displs[u(from)], l.recv_counts[u(from)]),
                              l.recv_counts[u(from)], from, 0));
  }
  for (int k = 1; k < p; ++k) {
    const int to = (r + k) % p;
    port.charge_message(l.send_counts[u(to)]);
    reqs.push_back(port.isend(sub(send, l.send_displs[u(to)], l.send_counts[u(to)]),
                              l.send_counts[u(to)], to, 0));
  }
  for (detail::ReqPtr& q : reqs) port.wait(q);
}

}  // namespace cocodiff::emu::collectives
