// How a matched message is timed: through the network model, or in closed form when no other
// flow can reach its route before it ends (delivered at once, or decided at the next step).

#include "emulator/detail/kernel.hpp"

#include <algorithm>
#include <array>
#include <optional>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
}  // namespace

bool Kernel::deliver_closed_form() {
  if (closed_pass_messages_.empty() && closed_messages_.empty()) return false;
  // Collective messages timed in closed form, and those they lead to (the next rounds'): as the
  // network's completions, the sender's part, then the receiver's; the members they finish are
  // woken at their ends (op_finish).
  while (!closed_messages_.empty()) {
    const ClosedMessage d = closed_messages_.back();
    closed_messages_.pop_back();
    try {
      op_message_done(*d.op, d.src, d.t);  // may finish and free op: dst's part is pending
      op_message_done(*d.op, d.dst, d.t);
    } catch (const CommError& e) {  // a mismatched message of a later round
      failures_.push_back({d.op->group->members[static_cast<size_t>(d.src)], d.t, e.what(), true});
      aborting_ = true;
      closed_messages_.clear();
    }
  }
  if (closed_pass_messages_.empty()) return true;
  // Each completion may finish a member's round, post its next round and match exclusive
  // messages whose completions join the list: the whole of an exclusive ring runs here. The
  // order does not matter: a member acts once all of its round's completions are in.
  while (!closed_pass_messages_.empty()) {
    const ClosedPassMessage d = closed_pass_messages_.back();
    closed_pass_messages_.pop_back();
    try {
      pass_message_done(*d.op, d.member, d.slot, d.t, d.count);
    } catch (const CommError& e) {  // a mismatched message of a later round
      failures_.push_back({d.op->members[static_cast<size_t>(d.member)].rank, d.t, e.what(), true});
      aborting_ = true;
      closed_pass_messages_.clear();
    }
  }
  return true;
}

void Kernel::time_collective_message(CollectiveOp& op, int src, int dst, int step, SimTime start,
                                     std::int64_t bytes) {
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
    if (const std::optional<SimTime> end = net_.exclusive_end(wsrc, wdst, bytes, 1, start)) {
      if (op_waits_alone(op, src) && op_waits_alone(op, dst)) {
        acct_.flow(start, *end, wsrc, wdst, bytes, {&op.label, 1}, /*exclusive=*/true);
        closed_messages_.push_back({&op, src, dst, *end});
      } else {
        undecided_.push_back({&op, src, dst, step, start, *end, bytes});
      }
      return;
    }
  }
  op_transfer(op, src, dst, step, start, bytes);
}

bool Kernel::settle_undecided() {
  bool timed = false;
  for (const UndecidedMessage& m : undecided_) {
    if (aborting_) break;
    CollectiveOp& op = *m.op;
    const int wsrc = op.group->members[u(m.src)];
    const int wdst = op.group->members[u(m.dst)];
    if (op_waits_alone(op, m.src) && op_waits_alone(op, m.dst)) {
      acct_.flow(m.start, m.end, wsrc, wdst, m.bytes, {&op.label, 1}, /*exclusive=*/true);
      closed_messages_.push_back({&op, m.src, m.dst, m.end});
      timed = true;
    } else {
      op_transfer(op, m.src, m.dst, m.step, m.start, m.bytes);
    }
  }
  undecided_.clear();
  return timed;
}

void Kernel::op_transfer(CollectiveOp& op, int src, int dst, int step, SimTime start,
                         std::int64_t bytes) {
  const int wsrc = op.group->members[u(src)];
  const int wdst = op.group->members[u(dst)];
  Transfer t;
  t.start = start;
  t.src = wsrc;
  t.dst = wdst;
  t.key = ChannelKey{op.group->ctx, wsrc, wdst, collective_tag(op.seq, step)};
  t.seq = 0;  // one message per (src, dst, tag): its channel's first match
  t.bytes = bytes;
  t.label = op.label;
  t.sink = &op;
  t.src_member = src;
  t.dst_member = dst;
  new_transfers_.push_back(std::move(t));
}

bool Kernel::op_waits_alone(const CollectiveOp& op, int r) const {
  const CollectiveMember& m = op.members[u(r)];
  const int rank = op.group->members[u(r)];
  const FiberState& f = *mains_[u(rank)];
  const TileStats& t = acct_.tile(rank);
  // Blocked in wait() on this op (not in test(), which a timer may end), and it is the tile's
  // only open operation.
  return m.req != nullptr && f.blocked && !f.waiting_in_test && f.waiting_on == m.req.get() &&
         m.req->open && t.open_collectives == 1 && t.open_p2p == 0;
}

void Kernel::time_pass_hop(const PassHop& hop) {
  PassOp& op = *hop.op;
  const int parts = op.parts;
  // With nothing else open on either end (s and d wait in this pass, so neither posts again
  // before these messages end), a route on which no other rank's flow can travel carries them
  // alone: their end is known now, and they never enter the network model.
  if (!acct_.tile(hop.src_rank).nothing_open() || !acct_.tile(hop.dst_rank).nothing_open()) {
    pass_transfers(hop);
    return;
  }
  const HopRoute route = op.hops[u(hop.src)];  // set with the mode
  if (route.kind == HopRoute::Kind::kExclusive) {
    const std::optional<SimTime> end =
        net_.exclusive_end(hop.src_rank, hop.dst_rank, hop.bytes, parts, hop.start);
    COCO_CHECK(end.has_value(), "an exclusive hop's route is not exclusive");
    pass_closed(hop, *end);
    return;
  }
  // A route whose links only one other pair's flows can reach (two tiles behind one NIC, each
  // in a ring of its own): held until that pair's message is matched, then both are timed
  // together if nothing else can change their ends (NetworkModel::exclusive_pair_ends), else
  // they go to the network. Rings that run in step match both before the controller moves the
  // network on (flush_held).
  if (route.kind == HopRoute::Kind::kNetwork) {
    pass_transfers(hop);
    return;
  }
  const int key = route.pair_key;
  const auto k = static_cast<size_t>(key);
  if (held_at_.size() <= k) held_at_.resize(k + 1, 0);
  if (held_at_[k] == 0) {
    held_.push_back({hop, key});
    held_at_[k] = static_cast<std::uint32_t>(held_.size());
    return;
  }
  const PassHop other = held_[held_at_[k] - 1].hop;
  held_[held_at_[k] - 1] = held_.back();
  held_at_[static_cast<size_t>(held_.back().key)] = held_at_[k];
  held_.pop_back();
  held_at_[k] = 0;
  const std::array<std::optional<SimTime>, 2> ends = net_.exclusive_pair_ends(
      {other.src_rank, other.dst_rank, other.bytes, other.op->parts, other.start},
      {hop.src_rank, hop.dst_rank, hop.bytes, parts, hop.start});
  const std::array<const PassHop*, 2> both = {&other, &hop};
  for (size_t i = 0; i < 2; ++i) {
    if (ends[i].has_value())
      pass_closed(*both[i], *ends[i]);
    else
      pass_transfers(*both[i]);
  }
}

void Kernel::pass_closed(const PassHop& h, SimTime end) {
  COCO_CHECK(h.op->late || h.start >= net_.now(), "an exclusive flow starts in the past");
  const int parts = h.op->parts;
  acct_.flow(h.start, end, h.src_rank, h.dst_rank, h.bytes,
             {h.op->trace_labels.data() + u(h.src) * u(parts), u(parts)}, /*exclusive=*/true);
  closed_pass_messages_.push_back(
      {h.op, h.src, parts, parts, end});                          // the sends; dst's are pending
  closed_pass_messages_.push_back({h.op, h.dst, 0, parts, end});  // the receives
}

void Kernel::pass_transfers(const PassHop& h) {
  const int parts = h.op->parts;
  for (int q = 0; q < parts; ++q) {
    Transfer t;
    t.start = h.start;
    t.src = h.src_rank;
    t.dst = h.dst_rank;
    t.key = ChannelKey{h.op->group->ctx, h.src_rank, h.dst_rank,
                       static_cast<std::uint64_t>(parts * h.round + q)};
    t.seq = 0;  // one message per (src, dst, tag) in flight: its channel's first match
    t.bytes = h.bytes;
    t.label = h.op->trace_labels[u(h.src) * u(parts) + u(q)];
    t.sink = h.op;
    t.src_member = h.src;
    t.dst_member = h.dst;
    t.part = q;
    new_transfers_.push_back(std::move(t));
  }
}

void Kernel::flush_held() {
  for (const HeldHop& h : held_) {
    held_at_[static_cast<size_t>(h.key)] = 0;
    if (!aborting_) pass_transfers(h.hop);
  }
  held_.clear();
}

void Kernel::finish_early(SimTime t) {
  while (!early_finishes_.empty() && early_finishes_.front().t == t) {
    std::pop_heap(early_finishes_.begin(), early_finishes_.end(), EarlyFinish::Later{});
    EarlyFinish w = std::move(early_finishes_.back());
    early_finishes_.pop_back();
    complete(*w.req, w.done);
  }
}

}  // namespace cocodiff::emu::detail
