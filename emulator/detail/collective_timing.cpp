// What a matched message of a collective or a ring pass tells the kernel's MessageTiming (which
// times it in closed form when no other flow can reach its route before it ends, else through
// the network model), and the members that finish ahead of virtual time.

#include <algorithm>

#include "emulator/detail/collective_runner.hpp"
#include "emulator/detail/message_timing.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
}  // namespace

void CollectiveRunner::time_message(CollectiveOp& op, int src, int dst, int step, SimTime start,
                                    std::int64_t bytes) {
  MessageTiming::Message m;
  m.start = start;
  m.src = op.group->members[u(src)];
  m.dst = op.group->members[u(dst)];
  m.bytes = bytes;
  m.sink = &op;
  m.src_member = src;
  m.dst_member = dst;
  using Route = MessageTiming::Route;
  if (op.works) {
    // A ring pass's hop: the per-message pass's channel keys (tag parts * round + part), its
    // parts' labels. With nothing else open on either end (both wait in this pass, so neither
    // posts again before these messages end), the route asked with the op's mode decides.
    m.flows = op.parts;
    m.key = ChannelKey{op.group->ctx, m.src, m.dst, static_cast<std::uint64_t>(op.parts * step)};
    m.labels = {op.trace_labels.data() + u(src) * u(op.parts), u(op.parts)};
    m.may_start_past = op.late;  // posted when the op left kWhole: exclusive, in closed form
    k_.timing().time(
        m, op.routes[u(src)],
        op.ends_wait_alone(src, dst) ? MessageTiming::Ends::kAlone : MessageTiming::Ends::kBusy);
    return;
  }
  // With one message each way at a time, a member waiting for this op alone posts nothing
  // before the message ends: on a route no other rank's flow can reach, it travels alone, and
  // its end is known now. A member it finishes ahead of virtual time is woken when virtual time
  // gets there (op_finish). Any other schedule's messages go through the network model.
  m.key = ChannelKey{op.group->ctx, m.src, m.dst, collective_tag(op.seq, step)};
  m.labels = {&op.label, 1};
  m.may_start_past = true;
  k_.timing().time(m, Route{op.one_each_way ? Route::Kind::kAsk : Route::Kind::kNetwork},
                   MessageTiming::Ends::kAsk);
}

bool CollectiveRunner::CollectiveOp::ends_wait_alone(int src, int dst) const {
  if (works) {
    // Neither tile has anything else open: both wait in this pass.
    const Accounting& a = owner->k_.accounting();
    return a.tile(group->members[u(src)]).timing.nothing_open() &&
           a.tile(group->members[u(dst)]).timing.nothing_open();
  }
  return owner->op_waits_alone(*this, src) && owner->op_waits_alone(*this, dst);
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
