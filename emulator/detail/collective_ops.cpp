// Collectives at the collective level: each member's part is a small state machine that the
// controller advances as its messages complete, with no fiber, request or channel per message.
// It follows the per-message algorithms of emulator/collectives/ step for step (the same post
// times, software costs, message tags and matching), so both paths give the same flows in the
// same order and hence the same timeline; tests compare them on every strategy.
//
// Per member r, with clock c starting at the caller's clock plus the library's call overhead:
//   pairwise/ring, round i: post the receive at c; c += sw(send); post the send at c; when both
//                           complete, c = max(c, their completions) and the next round starts.
//   concurrent:             post every receive at c, then each send after its own sw(m);
//                           c = max(c, every completion).
// A message enters the network at max(its send's post, its receive's post).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/errors.hpp"
#include "emulator/detail/kernel.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
}  // namespace

void Kernel::open_collective(FiberState& parent, ReqState& req) {
  if (!parent.is_main || req.op != ReqState::Op::kCollective) return;
  TileStats& t = tiles_[u(parent.rank)];
  req.open = true;
  req.started = parent.clock;
  req.overlap_mark = t.overlapped_compute;
  ++t.open_collectives;
}

Kernel::CollectiveMessage Kernel::op_recv(const CollectiveOp& op, int r, int round) const {
  const CollectiveSpec& s = op.members[u(r)].spec;
  const int p = static_cast<int>(op.members.size());
  switch (op.kind) {
    case CollectiveSpec::Kind::kRing: {
      const int in_block = (r - round - 1 + 2 * p) % p;
      return {(r - 1 + p) % p, in_block * s.count, s.count, round};
    }
    case CollectiveSpec::Kind::kPairwise: {
      const int from = pairwise_recv_peer(s.order, p, r, round + 1);
      if (s.uniform) return {from, from * s.count, s.count, 0};
      return {from, s.recv_displs[u(from)], s.recv_counts[u(from)], 0};
    }
    case CollectiveSpec::Kind::kConcurrent: {
      const int from = (r - round - 1 + p) % p;
      if (s.uniform) return {from, from * s.count, s.count, 0};
      return {from, s.recv_displs[u(from)], s.recv_counts[u(from)], 0};
    }
  }
  return {};
}

Kernel::CollectiveMessage Kernel::op_send(const CollectiveOp& op, int r, int round) const {
  const CollectiveSpec& s = op.members[u(r)].spec;
  const int p = static_cast<int>(op.members.size());
  switch (op.kind) {
    case CollectiveSpec::Kind::kRing: {
      const int out_block = (r - round + p) % p;
      return {(r + 1) % p, out_block * s.count, s.count, round};
    }
    case CollectiveSpec::Kind::kPairwise: {
      const int to = pairwise_send_peer(s.order, p, r, round + 1);
      if (s.uniform) return {to, to * s.count, s.count, 0};
      return {to, s.send_displs[u(to)], s.send_counts[u(to)], 0};
    }
    case CollectiveSpec::Kind::kConcurrent: {
      const int to = (r + round + 1) % p;
      if (s.uniform) return {to, to * s.count, s.count, 0};
      return {to, s.send_displs[u(to)], s.send_counts[u(to)], 0};
    }
  }
  return {};
}

ReqPtr Kernel::start_collective_op(FiberState& f, const std::shared_ptr<const Group>& g,
                                   int group_rank, std::uint64_t seq, ReqPtr req,
                                   const CollectiveSpec& spec) {
  const int p = static_cast<int>(g->members.size());
  // The caller's own block first, as the per-message algorithms do.
  if (!spec.send.empty() && !spec.recv.empty()) {
    std::int64_t from = 0, to = 0, n = 0;
    if (spec.kind == CollectiveSpec::Kind::kRing || spec.uniform) {
      from = spec.kind == CollectiveSpec::Kind::kRing ? 0 : group_rank * spec.count;
      to = group_rank * spec.count;
      n = spec.count;
    } else {
      from = spec.send_displs[u(group_rank)];
      to = spec.recv_displs[u(group_rank)];
      n = spec.send_counts[u(group_rank)];
    }
    if (n > 0)
      std::memcpy(spec.recv.data() + to, spec.send.data() + from,
                  static_cast<std::size_t>(n) * sizeof(float));
  }
  open_collective(f, *req);
  const std::uint32_t label = options_.trace ? intern(req->label) : 0;
  std::unique_lock<ThreadLock> lk(state_lock_);
  auto& slot = ops_[{g->ctx, seq}];
  if (slot == nullptr) {
    slot = op_pool_.take();  // a finished op's storage, if one is kept
    slot->group = g;
    slot->seq = seq;
    slot->label = label;
    slot->kind = spec.kind;
    slot->finished = 0;
    slot->members.assign(u(p), CollectiveMember{});
  }
  CollectiveOp& op = *slot;
  CollectiveMember& m = op.members[u(group_rank)];
  m.started = true;
  m.req = req;
  m.spec = spec;
  m.clock = f.clock + options_.library.call_overhead;
  if (p == 1) {
    op_finish(op, group_rank);
    return req;
  }
  if (op.kind == CollectiveSpec::Kind::kConcurrent) {
    m.recv_post = m.clock;
    m.recv_posted = true;
    m.pending = 2 * (p - 1);
    for (int k = 0; k + 1 < p; ++k) {  // every receive, matched with senders already started
      const CollectiveMessage in = op_recv(op, group_rank, k);
      const CollectiveMember& s = op.members[u(in.peer)];
      if (s.started)  // the sender's k-th send is to this rank too
        op_match(op, in.peer, group_rank, op_send(op, in.peer, k), in,
                 std::max(s.send_posts[u(group_rank)], m.clock));
    }
    m.send_posts.assign(u(p), SimTime{});
    for (int k = 0; k + 1 < p; ++k) {
      const CollectiveMessage msg = op_send(op, group_rank, k);
      m.clock += software_time(wire_bytes(msg.count));
      m.send_posts[u(msg.peer)] = m.clock;
      const CollectiveMember& d = op.members[u(msg.peer)];
      if (d.started)
        op_match(op, group_rank, msg.peer, msg, op_recv(op, msg.peer, k),
                 std::max(m.clock, d.recv_post));
    }
  } else {
    m.round = 0;
    op_post_round(op, group_rank);
  }
  return req;
}

void Kernel::op_post_round(CollectiveOp& op, int r) {
  CollectiveMember& m = op.members[u(r)];
  const CollectiveMessage in = op_recv(op, r, m.round);
  const CollectiveMessage out = op_send(op, r, m.round);
  m.pending = 2;
  m.send_posted = false;
  m.recv_posted = true;
  m.recv_post = m.clock;
  const CollectiveMember& s = op.members[u(in.peer)];
  if (s.started && s.round == m.round && s.send_posted)
    op_match(op, in.peer, r, op_send(op, in.peer, m.round), in, std::max(s.send_post, m.recv_post));
  m.clock += software_time(wire_bytes(out.count));
  m.send_posted = true;
  m.send_post = m.clock;
  const CollectiveMember& d = op.members[u(out.peer)];
  if (d.started && d.round == m.round && d.recv_posted)
    op_match(op, r, out.peer, out, op_recv(op, out.peer, m.round),
             std::max(m.send_post, d.recv_post));
}

void Kernel::op_match(CollectiveOp& op, int src, int dst, const CollectiveMessage& out,
                      const CollectiveMessage& in, SimTime start) {
  const CollectiveMember& s = op.members[u(src)];
  const CollectiveMember& d = op.members[u(dst)];
  COCO_CHECK(out.peer == dst && in.peer == src, "collective messages matched out of order");
  const int wsrc = op.group->members[u(src)];
  const int wdst = op.group->members[u(dst)];
  if (out.count != in.count) {
    throw CommError("message size mismatch: rank " + std::to_string(wsrc) + " sends " +
                    std::to_string(out.count) + " elements to rank " + std::to_string(wdst) +
                    ", which expects " + std::to_string(in.count) +
                    (op.members[u(src)].req->label.empty()
                         ? ""
                         : " (in '" + op.members[u(src)].req->label + "')"));
  }
  const std::span<const float> from =
      op.kind == CollectiveSpec::Kind::kRing ? std::span<const float>(s.spec.recv) : s.spec.send;
  if (!from.empty() && !d.spec.recv.empty() && out.count > 0)
    std::memcpy(d.spec.recv.data() + in.offset, from.data() + out.offset,
                static_cast<std::size_t>(out.count) * sizeof(float));
  const std::int64_t bytes = wire_bytes(out.count);
  // Both ends wait for this op and nothing else, one message each way at a time: neither can
  // post another flow before this one ends, and on a route no other rank's flow can reach it
  // travels alone. Its end is known now: the controller delivers it at once, and wakes a
  // member it finishes when virtual time gets there (OpDone, op_finish). A message matched
  // while an end could still post (the member starting the op, before it waits) is decided
  // when the controller next steps, before any new flow enters the network: the members
  // usually wait for the op by then.
  if (!options_.trace && op.kind != CollectiveSpec::Kind::kConcurrent) {
    if (const std::optional<SimTime> end = net_.exclusive_end(wsrc, wdst, bytes, 1, start)) {
      if (op_waits_alone(op, src) && op_waits_alone(op, dst)) {
        account_flow(start, *end, wsrc, wdst, bytes);
        ++flows_exclusive_;
        op_done_.push_back({&op, src, dst, *end});
      } else {
        op_later_.push_back({&op, src, dst, out.step, start, bytes});
      }
      return;
    }
  }
  op_transfer(op, src, dst, out.step, start, bytes);
}

bool Kernel::settle_op_later() {
  bool timed = false;
  for (const OpLater& m : op_later_) {
    if (aborting_) break;
    CollectiveOp& op = *m.op;
    const int wsrc = op.group->members[u(m.src)];
    const int wdst = op.group->members[u(m.dst)];
    if (op_waits_alone(op, m.src) && op_waits_alone(op, m.dst)) {
      const std::optional<SimTime> end = net_.exclusive_end(wsrc, wdst, m.bytes, 1, m.start);
      COCO_CHECK(end.has_value(), "an exclusive collective message's route is not exclusive");
      account_flow(m.start, *end, wsrc, wdst, m.bytes);
      ++flows_exclusive_;
      op_done_.push_back({&op, m.src, m.dst, *end});
      timed = true;
    } else {
      op_transfer(op, m.src, m.dst, m.step, m.start, m.bytes);
    }
  }
  op_later_.clear();
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
  t.op = &op;
  t.op_src = src;
  t.op_dst = dst;
  new_transfers_.push_back(std::move(t));
}

bool Kernel::op_waits_alone(const CollectiveOp& op, int r) const {
  const CollectiveMember& m = op.members[u(r)];
  const int rank = op.group->members[u(r)];
  const FiberState& f = *mains_[u(rank)];
  const TileStats& t = tiles_[u(rank)];
  // Blocked in wait() on this op (not in test(), which a timer may end), and it is the tile's
  // only open operation.
  return m.req != nullptr && f.blocked && !f.waiting_in_test && f.waiting_on == m.req.get() &&
         m.req->open && t.open_collectives == 1 && t.open_p2p == 0;
}

void Kernel::op_message_done(CollectiveOp& op, int r, SimTime t) {
  CollectiveMember& m = op.members[u(r)];
  m.clock = std::max(m.clock, t);
  m.latest = std::max(m.latest, t);
  if (--m.pending > 0) return;
  if (op.kind != CollectiveSpec::Kind::kConcurrent &&
      m.round + 2 < static_cast<int>(op.members.size())) {
    ++m.round;
    op_post_round(op, r);
    return;
  }
  op_finish(op, r);
}

void Kernel::op_finish(CollectiveOp& op, int r) {
  CollectiveMember& m = op.members[u(r)];
  m.recv_posted = m.send_posted = false;
  m.round = static_cast<int>(op.members.size());  // past every round: matches nothing more
  // Through the network, the member finishes when its last message ends; a closed-form one
  // may have been delivered ahead of virtual time: the member is woken when it gets there.
  if (m.latest > net_.now()) {
    op_wakes_.push_back({m.latest, op_wakes_seq_++, std::move(m.req), m.clock});
    std::push_heap(op_wakes_.begin(), op_wakes_.end(), OpWake::Later{});
  } else {
    complete(*m.req, m.clock);
  }
  m.req.reset();
  if (++op.finished < static_cast<int>(op.members.size())) return;
  const auto it = ops_.find({op.group->ctx, op.seq});
  it->second->group.reset();
  op_pool_.give(std::move(it->second));
  ops_.erase(it);
}

}  // namespace cocodiff::emu::detail
