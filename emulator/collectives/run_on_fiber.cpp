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

/// One round of member `me` message by message: its receives, its sends (each after its
/// software time), the waits in posting order, then the staged receives put in place.
class Round {
 public:
  Round(Port& port, const Schedule& s, const Sizes& sizes, Buffers& b, int round, ReduceOp op)
      : port_(port), s_(s), sizes_(sizes), b_(b), i_(round), op_(op) {}
  void run() {
    const int me = port_.rank();
    const int nr = s_.recvs(me, i_), ns = s_.sends(me, i_);
    staged_.assign(static_cast<size_t>(nr), {});
    for (int k = 0; k < nr; ++k) post_recv(k);
    for (int k = 0; k < ns; ++k) post_send(k);
    for (detail::ReqPtr& q : reqs_) port_.wait(q);
    if (moves())
      for (int k = 0; k < nr; ++k) put(k);
  }

 private:
  // Data moves unless the run is phantom (both buffers empty): a member that receives nothing
  // (an all-to-allv's) may still send.
  bool moves() const { return !b_.recv.empty() || !b_.send.empty(); }
  std::vector<Segment> segments(int k, bool sending) const {
    const Message m =
        sending ? s_.send(sizes_, port_.rank(), i_, k) : s_.recv(sizes_, port_.rank(), i_, k);
    std::vector<Segment> out;
    if (m.gathered)
      s_.segments(sizes_, port_.rank(), i_, k, sending, out);
    else
      out.push_back(m.at);
    return out;
  }
  // A gathered or reduced receive lands in staging first; others in place.
  void post_recv(int k) {
    const Message m = s_.recv(sizes_, port_.rank(), i_, k);
    std::span<float> into;
    if (moves() && (m.gathered || s_.reduces(i_))) {
      staged_[static_cast<size_t>(k)].resize(static_cast<size_t>(m.count));
      into = staged_[static_cast<size_t>(k)];
    } else if (!m.gathered) {
      into = b_.out(m.at);
    }
    reqs_.push_back(port_.irecv(into, m.count, m.peer, m.step));
  }
  // A gathered send is packed first. A message is copied when it is matched: its packed
  // elements stay in `staged_` (moving a vector keeps its storage) until the waits are over.
  void post_send(int k) {
    const Message m = s_.send(sizes_, port_.rank(), i_, k);
    port_.charge_message(m.count);
    std::vector<float> packed;
    std::span<const float> from = m.gathered ? std::span<const float>() : b_.in(m.at);
    if (moves() && m.gathered) {
      for (const Segment& g : segments(k, true)) {
        const std::span<const float> part = b_.in(g);
        packed.insert(packed.end(), part.begin(), part.end());
      }
      from = packed;
    }
    reqs_.push_back(port_.isend(from, m.count, m.peer, m.step));
    if (!packed.empty()) staged_.push_back(std::move(packed));
  }
  // A staged receive's elements, copied (or reduced) into its segments.
  void put(int k) {
    const std::vector<float>& got = staged_[static_cast<size_t>(k)];
    if (got.empty()) return;
    const bool reduces = s_.reduces(i_);
    std::size_t at = 0;
    for (const Segment& g : segments(k, false)) {
      const std::span<float> dst = b_.out(g);
      for (std::size_t e = 0; e < dst.size(); ++e, ++at)
        dst[e] = !reduces                ? got[at]
                 : op_ == ReduceOp::kSum ? dst[e] + got[at]
                                         : std::max(dst[e], got[at]);
    }
  }

  Port& port_;
  const Schedule& s_;
  const Sizes& sizes_;
  Buffers& b_;
  int i_;
  ReduceOp op_;
  std::vector<detail::ReqPtr> reqs_;
  std::vector<std::vector<float>> staged_;  // per receive, then packed sends
};

}  // namespace

void run_on_fiber(Port& port, const Schedule& s, const Sizes& sizes, std::span<const float> send,
                  std::span<float> recv, ReduceOp op) {
  Buffers b{send, recv, {}};
  const bool moves = !recv.empty() || !send.empty();
  if (moves) b.scratch.resize(static_cast<size_t>(s.scratch(sizes)));
  if (const std::optional<Schedule::Copy> c = s.own(sizes, port.rank());
      c && moves && !send.empty()) {
    const std::span<const float> from = b.in(c->from);
    if (!from.empty()) std::copy(from.begin(), from.end(), b.out(c->to).begin());
  }
  port.charge_call(s.local_elements(sizes, port.rank()));
  for (int i = 0; i < s.rounds(); ++i) Round(port, s, sizes, b, i, op).run();
}

}  // namespace cocodiff::emu::collectives
