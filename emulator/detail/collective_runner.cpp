// CollectiveRunner: any schedule (emulator/collectives/schedule.hpp) run by the controller,
// each member's part a small state machine advanced as its messages complete, with no fiber,
// request or channel per message. It posts what the per-message runner posts (a library
// collective: collectives::run_on_fiber; a ring pass: Communicator::do_ring_pass), at the same
// times, with the same software costs and tags, so both give the same flows and hence the same
// timeline; tests compare them.
//
// Per member r, with clock c starting at the caller's clock (plus the library's call overhead
// for a collective), round i: post every receive at c; then each send at c += sw(its size)
// (nothing for a ring pass's point-to-point messages); a ring pass then charges the round's
// compute, c += its time. When every message of the round has completed: c = max(c, their
// completions) for a collective; for a ring pass, a wait for each in posting order (c = max(c,
// its completion), a wait event when c moves). Then the next round starts; a ring pass's last
// charge follows its last round. A message enters the network at max(its send's post, its
// receive's post); its data is copied when it is matched.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/errors.hpp"
#include "emulator/detail/collective_runner.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
// A member moves data unless the run is phantom (both buffers empty). A member may have one
// buffer empty in a run with data: an all-to-allv member that receives nothing still sends.
bool moves(const CollectiveSpec& s) { return !s.send.empty() || !s.recv.empty(); }
}  // namespace

void CollectiveRunner::start(const std::shared_ptr<const Group>& g, int group_rank,
                             std::uint64_t seq, const ReqPtr& req, const CollectiveSpec& spec,
                             SimTime clock) {
  const collectives::Schedule& sched = *spec.schedule;
  // The caller's own block first, as the fiber runner does.
  if (const auto c = sched.own(spec.sizes, group_rank);
      c && !spec.send.empty() && !spec.recv.empty() && c->from.count > 0)
    std::memcpy(spec.recv.data() + c->to.offset, spec.send.data() + c->from.offset,
                static_cast<std::size_t>(c->from.count) * sizeof(float));
  const std::uint32_t label = k_.options().trace ? k_.accounting().intern(req->label) : 0;
  std::unique_lock<NullLock> lk(k_.state_lock());
  if (k_.aborting()) throw Cancelled{};
  bool made = false;
  CollectiveOp& op = op_for(g, seq, false, spec.schedule, label, made);
  CollectiveMember& m = op.members[u(group_rank)];
  m.started = true;
  m.req = req;
  m.spec = spec;
  const LibraryModel& lib = k_.options().library;
  m.clock = clock + lib.call_overhead;
  if (lib.local_copy_bytes_per_s > 0)
    m.clock += local_copy_time(lib, k_.wire_bytes(sched.local_elements(spec.sizes, group_rank)));
  if (moves(spec)) {
    m.scratch.resize(static_cast<std::size_t>(sched.scratch(spec.sizes)));
  } else {
    // Sizes only: where the elements would be is never read, so an all-to-allv's displacement
    // arrays (the caller's, rarely in cache) are not either.
    m.spec.sizes.send_displs = nullptr;
    m.spec.sizes.recv_displs = nullptr;
  }
  if (sched.rounds() == 0) {
    op_finish(op, group_rank);
    return;
  }
  m.round = 0;
  try {
    op_post_round(op, group_rank);
  } catch (const CommError& e) {
    // A mismatched message: the caller unwinds, and this member's sizes and buffers with its
    // stack, so no member may read them again, and nothing more is matched or delivered: the
    // run fails with this error (the others stop at their next call or wait).
    m = CollectiveMember{};
    k_.message_failed(g->members[u(group_rank)], clock, e);
    throw Cancelled{};
  }
}

CollectiveRunner::CollectiveOp& CollectiveRunner::op_for(const std::shared_ptr<const Group>& g,
                                                         std::uint64_t seq, bool works,
                                                         const collectives::Schedule* schedule,
                                                         std::uint32_t label, bool& made) {
  auto& slot = ops_[{g->ctx, works, seq}];
  made = slot == nullptr;
  if (made) {
    // A finished op's storage, if one is kept: every entry a round reads is written first
    // (each member's own when it starts, the completion times before its waits read them).
    slot = op_pool_.take();
    slot->owner = this;
    slot->group = g;
    slot->seq = seq;
    slot->label = label;
    slot->schedule = schedule;
    slot->one_each_way = schedule->one_each_way();
    slot->finished = 0;
    slot->members.assign(g->members.size(), CollectiveMember{});
    slot->works = works;
    slot->parts = 1;
    slot->mode = CollectiveOp::Mode::kRounds;
    slot->late = false;
    slot->joined.clear();
  }
  return *slot;
}

void CollectiveRunner::op_post_round(CollectiveOp& op, int r) {
  const collectives::Schedule& sched = *op.schedule;
  CollectiveMember& m = op.members[u(r)];
  const int round = m.round;
  const int recvs = sched.recvs(r, round), sends = sched.sends(r, round);
  m.pending = (recvs + sends) * op.parts;
  m.recv_post = m.clock;
  // A peer that has posted this round kept its first receive and send (k = 0): the message it
  // names is read there, not asked of the schedule again.
  for (int k = 0; k < recvs; ++k) {
    const collectives::Message in = sched.recv(m.spec.sizes, r, round, k);
    if (k == 0) m.first_recv = in;
    const CollectiveMember& s = op.members[u(in.peer)];
    if (s.started && s.round == round)
      op_match(op, in.peer, r, k, std::max(s.send_posts[u(k)], m.recv_post),
               k == 0 ? s.first_send : sched.send(s.spec.sizes, in.peer, round, k), in);
  }
  if (m.send_posts.size() != u(sends)) m.send_posts.resize(u(sends));
  for (int k = 0; k < sends; ++k) {
    const collectives::Message out = sched.send(m.spec.sizes, r, round, k);
    if (k == 0) m.first_send = out;
    if (!op.works) m.clock += software_time(k_.wire_bytes(out.count));
    m.send_posts[u(k)] = m.clock;
    const CollectiveMember& d = op.members[u(out.peer)];
    if (d.started && d.round == round)
      op_match(op, r, out.peer, k, std::max(m.clock, d.recv_post), out,
               k == 0 ? d.first_recv : sched.recv(d.spec.sizes, out.peer, round, k));
  }
  if (op.works) charge_work(op, r, round);
}

void CollectiveRunner::op_match(CollectiveOp& op, int src, int dst, int k, SimTime start,
                                const collectives::Message& out, const collectives::Message& in) {
  CollectiveMember& s = op.members[u(src)];
  CollectiveMember& d = op.members[u(dst)];
  COCO_CHECK(out.peer == dst && in.peer == src, "collective messages matched out of order");
  if (out.count != in.count) {
    const int wsrc = op.group->members[u(src)];
    const int wdst = op.group->members[u(dst)];
    throw CommError("message size mismatch: rank " + std::to_string(wsrc) + " sends " +
                    std::to_string(out.count) + " elements to rank " + std::to_string(wdst) +
                    ", which expects " + std::to_string(in.count) +
                    (s.req->label.empty() ? "" : " (in '" + s.req->label + "')"));
  }
  if (out.at.buffer == collectives::Buffer::kBlock) {
    if (s.data && d.data) copy_block(s, d, static_cast<int>(out.at.offset), out.count, op.parts);
  } else if (moves(s.spec) && moves(d.spec) && out.count > 0)
    op_copy(op, s, src, d, dst, k, out, in);
  time_message(op, src, dst, out.step, start, k_.wire_bytes(out.count));
}

void CollectiveRunner::op_copy(const CollectiveOp& op, const CollectiveMember& s, int src,
                               CollectiveMember& d, int dst, int k, const collectives::Message& out,
                               const collectives::Message& in) {
  using collectives::Buffer;
  using collectives::Segment;
  const collectives::Schedule& sched = *op.schedule;
  const int round = s.round;
  std::vector<Segment> from, to;  // a gathered message's segments, in travel order
  if (out.gathered)
    sched.segments(s.spec.sizes, src, round, k, true, from);
  else
    from.push_back(out.at);
  if (in.gathered)
    sched.segments(d.spec.sizes, dst, round, k, false, to);
  else
    to.push_back(in.at);
  const auto read = [&s](const Segment& g) -> const float* {
    return (g.buffer == Buffer::kSend   ? s.spec.send.data()
            : g.buffer == Buffer::kRecv ? s.spec.recv.data()
                                        : s.scratch.data()) +
           g.offset;
  };
  const auto write = [&d](const Segment& g) -> float* {
    return (g.buffer == Buffer::kScratch ? d.scratch.data() : d.spec.recv.data()) + g.offset;
  };
  const bool reduces = sched.reduces(round);
  const bool sum = d.spec.op == ReduceOp::kSum;
  // Walk both lists at once: a segment of one side may span several of the other's.
  std::size_t a = 0, b = 0;
  std::int64_t at_a = 0, at_b = 0;
  while (a < from.size() && b < to.size()) {
    const std::int64_t n = std::min(from[a].count - at_a, to[b].count - at_b);
    const float* x = read(from[a]) + at_a;
    float* y = write(to[b]) + at_b;
    if (!reduces)
      std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(float));
    else
      for (std::int64_t e = 0; e < n; ++e) y[e] = sum ? y[e] + x[e] : std::max(y[e], x[e]);
    at_a += n;
    at_b += n;
    if (at_a == from[a].count) ++a, at_a = 0;
    if (at_b == to[b].count) ++b, at_b = 0;
  }
}

void CollectiveRunner::CollectiveOp::message_done(const Transfer& t, SimTime end) {
  if (!works) {
    owner->op_message_done(*this, t.src_member, end);  // may free this op: dst's is pending
    owner->op_message_done(*this, t.dst_member, end);
    return;
  }
  // The sender's flows take the slots after the receives' (a working op's waits).
  owner->work_message_done(*this, t.src_member, parts + t.part, 1, end);
  owner->work_message_done(*this, t.dst_member, t.part, 1, end);
}

void CollectiveRunner::work_message_done(CollectiveOp& op, int r, int slot, int count, SimTime t) {
  CollectiveMember& m = op.members[u(r)];
  if (m.pass == nullptr) return;  // r left the pass with an error: the run is ending
  std::fill_n(op.done.data() + u(r) * u(2 * op.parts) + u(slot), count, t);
  m.pending -= count;
  if (m.pending == 0) op_round_done(op, r);
}

void CollectiveRunner::op_round_done(CollectiveOp& op, int r) {
  CollectiveMember& m = op.members[u(r)];
  if (op.works) {
    // The waits, in posting order: receives, then sends.
    const int parts = op.parts;
    const int rank = op.group->members[u(r)];
    const SimTime* done = op.done.data() + u(r) * u(2 * parts);
    for (int k = 0; k < 2 * parts; ++k)
      work_wait(rank, m.clock, done[k], op.labels[u(r) * u(parts) + u(k % parts)]);
  }
  if (m.round + 1 < op.schedule->rounds()) {
    ++m.round;
    op_post_round(op, r);
    return;
  }
  op_finish(op, r);
}

void CollectiveRunner::op_finish(CollectiveOp& op, int r) {
  CollectiveMember& m = op.members[u(r)];
  const int rounds = op.schedule->rounds();
  m.round = rounds;  // past every round: matches nothing more
  if (op.works) {
    // The compute on the last block, then its part is done: every charge and wait is on its
    // tile's accounting (no open collective of the tile waits for it).
    charge_work(op, r, rounds);
    k_.complete(*m.req, m.clock);
    m.pass = nullptr;
  } else if (m.latest > k_.network().now()) {
    // Through the network, the member finishes when its last message ends; a closed-form one
    // may have been delivered ahead of virtual time: the member is woken when it gets there.
    early_finishes_.push_back({m.latest, early_finish_seq_++, std::move(m.req), m.clock});
    std::push_heap(early_finishes_.begin(), early_finishes_.end(), EarlyFinish::Later{});
  } else {
    k_.complete(*m.req, m.clock);
  }
  m.req.reset();
  if (++op.finished < static_cast<int>(op.members.size())) return;
  op_free(op);
}

void CollectiveRunner::op_free(CollectiveOp& op) {
  const auto it = ops_.find({op.group->ctx, op.works, op.seq});
  it->second->group.reset();
  it->second->schedule = nullptr;
  op_pool_.give(std::move(it->second));
  ops_.erase(it);
}

}  // namespace cocodiff::emu::detail
