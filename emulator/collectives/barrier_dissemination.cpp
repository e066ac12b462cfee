// Dissemination barrier: in round k rank r signals r + 2^k and waits for r - 2^k;
// ceil(log2 p) rounds of empty messages, each costing the sender the library's software time.

#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu::collectives {

void barrier_dissemination(Port& port) {
  const int p = port.size();
  const int r = port.rank();
  port.charge_call();
  int round = 0;
  for (int dist = 1; dist < p; dist *= 2, ++round) {
    detail::ReqPtr rr = port.irecv({}, 0, (r - dist + p) % p, round);
    port.charge_message(0);
    detail::ReqPtr sr = port.isend({}, 0, (r + dist) % p, round);
    port.wait(rr);
    port.wait(sr);
  }
}

}  // namespace cocodiff::emu::collectives
