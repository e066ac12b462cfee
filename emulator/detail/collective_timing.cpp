// How a matched collective message is timed: through the network model, or in closed form when
// no other flow can reach its route before it ends (delivered at once, or decided at the next
// step); and the members that finish ahead of virtual time.

#include <algorithm>
#include <optional>

#include "core/errors.hpp"
#include "emulator/detail/collective_runner.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
}  // namespace

void CollectiveRunner::deliver_closed() {
  // Collective messages timed in closed form, and those they lead to (the next rounds'): as the
  // network's completions, the sender's part, then the receiver's; the members they finish are
  // woken at their ends (op_finish).
  k_.deliver_all(
      closed_messages_,
      [this](const ClosedMessage& d) {
        op_message_done(*d.op, d.src, d.t);  // may finish and free op: dst's part is pending
        op_message_done(*d.op, d.dst, d.t);
      },
      [](const ClosedMessage& d) { return d.op->group->members[u(d.src)]; });
}

void CollectiveRunner::time_collective_message(CollectiveOp& op, int src, int dst, int step,
                                               SimTime start, std::int64_t bytes) {
  const int wsrc = op.group->members[u(src)];
  const int wdst = op.group->members[u(dst)];
  // Both ends wait for this op and nothing else, one message each way at a time: neither can
  // post another flow before this one ends, and on a route no other rank's flow can reach it
  // travels alone. Its end is known now: the controller delivers it at once, and wakes a
  // member it finishes when virtual time gets there (ClosedMessage, op_finish). A message matched
  // while an end could still post (the member starting the op, before it waits) is decided
  // when the controller next steps, before any new flow enters the network: the members
  // usually wait for the op by then.
  if (op.schedule->one_each_way()) {
    if (const std::optional<SimTime> end =
            k_.network().exclusive_end(wsrc, wdst, bytes, 1, start)) {
      if (op_waits_alone(op, src) && op_waits_alone(op, dst)) {
        k_.accounting().flow(start, *end, wsrc, wdst, bytes, {&op.label, 1}, /*exclusive=*/true);
        closed_messages_.push_back({&op, src, dst, *end});
      } else {
        undecided_.push_back({&op, src, dst, step, start, *end, bytes});
      }
      return;
    }
  }
  op_transfer(op, src, dst, step, start, bytes);
}

bool CollectiveRunner::settle_undecided() {
  bool timed = false;
  for (const UndecidedMessage& m : undecided_) {
    if (k_.aborting()) break;
    CollectiveOp& op = *m.op;
    const int wsrc = op.group->members[u(m.src)];
    const int wdst = op.group->members[u(m.dst)];
    if (op_waits_alone(op, m.src) && op_waits_alone(op, m.dst)) {
      k_.accounting().flow(m.start, m.end, wsrc, wdst, m.bytes, {&op.label, 1}, /*exclusive=*/true);
      closed_messages_.push_back({&op, m.src, m.dst, m.end});
      timed = true;
    } else {
      op_transfer(op, m.src, m.dst, m.step, m.start, m.bytes);
    }
  }
  undecided_.clear();
  return timed;
}

void CollectiveRunner::op_transfer(CollectiveOp& op, int src, int dst, int step, SimTime start,
                                   std::int64_t bytes) {
  const int wsrc = op.group->members[u(src)];
  const int wdst = op.group->members[u(dst)];
  // One message per (src, dst, tag): its channel's first match.
  Transfer t =
      Transfer::matched(start, ChannelKey{op.group->ctx, wsrc, wdst, collective_tag(op.seq, step)},
                        0, bytes, op.label, &op);
  t.src_member = src;
  t.dst_member = dst;
  k_.fabric().add(std::move(t));
}

bool CollectiveRunner::op_waits_alone(const CollectiveOp& op, int r) const {
  const CollectiveMember& m = op.members[u(r)];
  const int rank = op.group->members[u(r)];
  const FiberState& f = k_.main_fiber(rank);
  const TileStats& t = k_.accounting().tile(rank);
  // Blocked in wait() on this op (not in test(), which a timer may end), and it is the tile's
  // only open operation.
  return m.req != nullptr && f.blocked && !f.waiting_in_test && f.waiting_on == m.req.get() &&
         m.req->open && t.timing.open_collectives() == 1 && t.timing.open_p2p() == 0;
}

void CollectiveRunner::finish_early(SimTime t) {
  while (!early_finishes_.empty() && early_finishes_.front().t == t) {
    std::pop_heap(early_finishes_.begin(), early_finishes_.end(), EarlyFinish::Later{});
    EarlyFinish w = std::move(early_finishes_.back());
    early_finishes_.pop_back();
    k_.complete(*w.req, w.done);
  }
}

}  // namespace cocodiff::emu::detail
