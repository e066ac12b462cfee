#include <algorithm>
#include <cstring>
#include <vector>

#include "emulator/collectives/collectives.hpp"

namespace cocodiff::emu::collectives {

namespace {

/// The member's buffers, as segments name them; all empty when no data moves.
struct Buffers {
  std::span<const float> send;
  std::span<float> recv;
  std::vector<float> scratch;
  std::span<const float> in(const Segment& g) const {
    const std::span<const float> b = g.buffer == Buffer::kSend   ? send
                                     : g.buffer == Buffer::kRecv ? std::span<const float>(recv)
                                                                 : std::span<const float>(scratch);
    return sub(b, g.offset, g.count);
  }
  std::span<float> out(const Segment& g) {
    const std::span<float> b = g.buffer == Buffer::kScratch ? std::span<float>(scratch) : recv;
    return sub(b, g.offset, g.count);
  }
};

}  // namespace

void run_on_fiber(Port& port, const Schedule& s, const Sizes& sizes, std::span<const float> send,
                  std::span<float> recv, ReduceOp op) {
  const int me = port.rank();
  Buffers b{send, recv, {}};
  const bool moves = !recv.empty();
  if (moves) b.scratch.resize(static_cast<size_t>(s.scratch(sizes)));
  if (const std::optional<Schedule::Copy> c = s.own(sizes, me); c && moves && !send.empty()) {
    const std::span<const float> from = b.in(c->from);
    if (!from.empty()) std::copy(from.begin(), from.end(), b.out(c->to).begin());
  }
  port.charge_call();
  std::vector<detail::ReqPtr> reqs;
  std::vector<std::vector<float>> staged;  // per receive: its elements, when not in place
  std::vector<Segment> segs;
  for (int i = 0; i < s.rounds(); ++i) {
    const int nr = s.recvs(me, i), ns = s.sends(me, i);
    const bool reduces = s.reduces(i);
    reqs.clear();
    staged.assign(static_cast<size_t>(nr), {});
    for (int k = 0; k < nr; ++k) {
      const Message m = s.recv(sizes, me, i, k);
      std::span<float> into;
      if (moves && (m.gathered || reduces)) {
        staged[static_cast<size_t>(k)].resize(static_cast<size_t>(m.count));
        into = staged[static_cast<size_t>(k)];
      } else if (!m.gathered) {
        into = b.out(m.at);
      }
      reqs.push_back(port.irecv(into, m.count, m.peer, m.step));
    }
    for (int k = 0; k < ns; ++k) {
      const Message m = s.send(sizes, me, i, k);
      port.charge_message(m.count);
      std::vector<float> packed;
      std::span<const float> from = m.gathered ? std::span<const float>() : b.in(m.at);
      if (moves && m.gathered) {
        segs.clear();
        s.segments(sizes, me, i, k, true, segs);
        for (const Segment& g : segs) {
          const std::span<const float> part = b.in(g);
          packed.insert(packed.end(), part.begin(), part.end());
        }
        from = packed;
      }
      // A message is copied when it is matched: its packed elements stay in `staged` (moving a
      // vector keeps its storage) until the round's waits are over.
      reqs.push_back(port.isend(from, m.count, m.peer, m.step));
      if (!packed.empty()) staged.push_back(std::move(packed));
    }
    for (detail::ReqPtr& q : reqs) port.wait(q);
    if (!moves) continue;
    for (int k = 0; k < nr; ++k) {
      const std::vector<float>& got = staged[static_cast<size_t>(k)];
      if (got.empty()) continue;
      const Message m = s.recv(sizes, me, i, k);
      segs.clear();
      if (m.gathered)
        s.segments(sizes, me, i, k, false, segs);
      else
        segs.push_back(m.at);
      std::size_t at = 0;
      for (const Segment& g : segs) {
        const std::span<float> dst = b.out(g);
        for (std::size_t e = 0; e < dst.size(); ++e, ++at)
          dst[e] = !reduces               ? got[at]
                   : op == ReduceOp::kSum ? dst[e] + got[at]
                                          : std::max(dst[e], got[at]);
      }
    }
  }
}

}  // namespace cocodiff::emu::collectives
