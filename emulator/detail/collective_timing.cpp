// What a matched collective message tells the kernel's MessageTiming (which times it in closed
// form when no other flow can reach its route before it ends, else through the network model),
// and the members that finish ahead of virtual time.

#include <algorithm>

#include "emulator/detail/collective_runner.hpp"
#include "emulator/detail/message_timing.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
}  // namespace

void CollectiveRunner::time_collective_message(CollectiveOp& op, int src, int dst, int step,
                                               SimTime start, std::int64_t bytes) {
  // With one message each way at a time, a member waiting for this op alone posts nothing
  // before the message ends: on a route no other rank's flow can reach, it travels alone, and
  // its end is known now. A member it finishes ahead of virtual time is woken when virtual time
  // gets there (op_finish). Any other schedule's messages go through the network model.
  MessageTiming::Message m;
  m.start = start;
  m.src = op.group->members[u(src)];
  m.dst = op.group->members[u(dst)];
  m.bytes = bytes;
  m.key = ChannelKey{op.group->ctx, m.src, m.dst, collective_tag(op.seq, step)};
  m.labels = {&op.label, 1};
  m.sink = &op;
  m.src_member = src;
  m.dst_member = dst;
  m.may_start_past = true;
  using Route = MessageTiming::Route;
  k_.timing().time(m,
                   Route{op.schedule->one_each_way() ? Route::Kind::kAsk : Route::Kind::kNetwork},
                   MessageTiming::Ends::kAsk);
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
