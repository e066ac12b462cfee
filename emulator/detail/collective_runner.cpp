// CollectiveRunner: any schedule (emulator/collectives/schedule.hpp) run by
// the controller, each member's part a small state machine advanced as its messages complete,
// with no fiber, request or channel per message. It posts what the fiber runner
// (collectives::run_on_fiber) posts, at the same times, with the same software costs and tags,
// so both give the same flows and hence the same timeline; tests compare them.
//
// Per member r, with clock c starting at the caller's clock plus the library's call overhead,
// round i: post every receive at c; then each send at c += sw(its size); when every message of
// the round has completed, c = max(c, their completions) and the next round starts. A message
// enters the network at max(its send's post, its receive's post); its data is copied when it
// is matched.

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
  const int p = static_cast<int>(g->members.size());
  const collectives::Schedule& sched = *spec.schedule;
  // The caller's own block first, as the fiber runner does.
  if (const auto c = sched.own(spec.sizes, group_rank);
      c && !spec.send.empty() && !spec.recv.empty() && c->from.count > 0)
    std::memcpy(spec.recv.data() + c->to.offset, spec.send.data() + c->from.offset,
                static_cast<std::size_t>(c->from.count) * sizeof(float));
  const std::uint32_t label = k_.options().trace ? k_.accounting().intern(req->label) : 0;
  std::unique_lock<NullLock> lk(k_.state_lock());
  if (k_.aborting()) throw Cancelled{};
  auto& slot = ops_[{g->ctx, seq}];
  if (slot == nullptr) {
    slot = op_pool_.take();  // a finished op's storage, if one is kept
    slot->owner = this;
    slot->group = g;
    slot->seq = seq;
    slot->label = label;
    slot->schedule = spec.schedule;
    slot->finished = 0;
    slot->members.assign(u(p), CollectiveMember{});
  }
  CollectiveOp& op = *slot;
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

void CollectiveRunner::op_post_round(CollectiveOp& op, int r) {
  const collectives::Schedule& sched = *op.schedule;
  CollectiveMember& m = op.members[u(r)];
  const int round = m.round;
  const int recvs = sched.recvs(r, round), sends = sched.sends(r, round);
  m.pending = recvs + sends;
  m.recv_post = m.clock;
  for (int k = 0; k < recvs; ++k) {
    const collectives::Message in = sched.recv(m.spec.sizes, r, round, k);
    const CollectiveMember& s = op.members[u(in.peer)];
    if (s.started && s.round == round)
      op_match(op, in.peer, r, k, std::max(s.send_posts[u(k)], m.recv_post),
               sched.send(s.spec.sizes, in.peer, round, k), in);
  }
  m.send_posts.resize(u(sends));
  for (int k = 0; k < sends; ++k) {
    const collectives::Message out = sched.send(m.spec.sizes, r, round, k);
    m.clock += software_time(k_.wire_bytes(out.count));
    m.send_posts[u(k)] = m.clock;
    const CollectiveMember& d = op.members[u(out.peer)];
    if (d.started && d.round == round)
      op_match(op, r, out.peer, k, std::max(m.clock, d.recv_post), out,
               sched.recv(d.spec.sizes, out.peer, round, k));
  }
}

void CollectiveRunner::op_match(CollectiveOp& op, int src, int dst, int k, SimTime start,
                                const collectives::Message& out, const collectives::Message& in) {
  CollectiveMember& s = op.members[u(src)];
  CollectiveMember& d = op.members[u(dst)];
  COCO_CHECK(out.peer == dst && in.peer == src, "collective messages matched out of order");
  const int wsrc = op.group->members[u(src)];
  const int wdst = op.group->members[u(dst)];
  if (out.count != in.count) {
    throw CommError("message size mismatch: rank " + std::to_string(wsrc) + " sends " +
                    std::to_string(out.count) + " elements to rank " + std::to_string(wdst) +
                    ", which expects " + std::to_string(in.count) +
                    (s.req->label.empty() ? "" : " (in '" + s.req->label + "')"));
  }
  if (moves(s.spec) && moves(d.spec) && out.count > 0) op_copy(op, s, src, d, dst, k, out, in);
  time_collective_message(op, src, dst, out.step, start, k_.wire_bytes(out.count));
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
  owner->op_message_done(*this, t.src_member,
                         end);  // may finish and free this op: dst's part is pending
  owner->op_message_done(*this, t.dst_member, end);
}

void CollectiveRunner::op_message_done(CollectiveOp& op, int r, SimTime t) {
  CollectiveMember& m = op.members[u(r)];
  m.clock = std::max(m.clock, t);
  m.latest = std::max(m.latest, t);
  if (--m.pending == 0) op_round_done(op, r);
}

void CollectiveRunner::op_round_done(CollectiveOp& op, int r) {
  CollectiveMember& m = op.members[u(r)];
  if (m.round + 1 < op.schedule->rounds()) {
    ++m.round;
    op_post_round(op, r);
    return;
  }
  op_finish(op, r);
}

void CollectiveRunner::op_finish(CollectiveOp& op, int r) {
  CollectiveMember& m = op.members[u(r)];
  m.round = op.schedule->rounds();  // past every round: matches nothing more
  // Through the network, the member finishes when its last message ends; a closed-form one
  // may have been delivered ahead of virtual time: the member is woken when it gets there.
  if (m.latest > k_.network().now()) {
    early_finishes_.push_back({m.latest, early_finish_seq_++, std::move(m.req), m.clock});
    std::push_heap(early_finishes_.begin(), early_finishes_.end(), EarlyFinish::Later{});
  } else {
    k_.complete(*m.req, m.clock);
  }
  m.req.reset();
  if (++op.finished < static_cast<int>(op.members.size())) return;
  const auto it = ops_.find({op.group->ctx, op.seq});
  it->second->group.reset();
  it->second->schedule = nullptr;
  op_pool_.give(std::move(it->second));
  ops_.erase(it);
}

}  // namespace cocodiff::emu::detail
