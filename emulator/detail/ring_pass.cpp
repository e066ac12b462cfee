// Ring passes (Communicator::ring_pass) at the collective level: each member's rounds are a
// small state machine that the controller advances as its messages complete. It follows the
// per-message pass (Communicator::do_ring_pass) step for step, so both give the same flows in
// the same order and hence the same timeline; tests compare them.
//
// Per member r, round i, with clock c:
//   post the receives of block (r - i - 1) and the sends of block (r - i), all at c (point-to-
//   point messages cost no software time); c += the round's charge; then, when the round's
//   messages complete, wait for each in posting order: c = max(c, its completion), a wait
//   event when c moves. The last round only charges.
// A message enters the network at max(its send's post, its receive's post). Messages keep the
// per-message path's channel keys (group context, world ranks, tag parts * i + part), which
// order the flows a controller step adds.

#include <algorithm>
#include <cstring>

#include "core/errors.hpp"
#include "emulator/detail/kernel.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
int mod(int a, int p) { return ((a % p) + p) % p; }
bool same_op(const OpCost& a, const OpCost& b) {
  return a.kind == b.kind && a.flops == b.flops && a.bytes == b.bytes && a.label == b.label;
}
}  // namespace

void Kernel::ring_pass(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                       std::uint64_t seq, const RingPass& pass) {
  COCO_CHECK(f.is_main, "a ring pass runs on a tile's main fiber");
  const int p = static_cast<int>(g->members.size());
  auto req = std::make_shared<ReqState>();
  req->op = ReqState::Op::kCollective;
  req->call = "ring_pass(parts=" + std::to_string(pass.parts) + ") #" + std::to_string(seq);
  req->label = pass.labels.empty() ? std::string() : std::string(pass.labels.front());
  req->group = g;
  std::vector<std::uint32_t> labels(u(pass.parts), 0);
  if (options_.trace)
    for (int q = 0; q < pass.parts; ++q) labels[u(q)] = intern(pass.labels[u(q)]);
  std::unique_lock<std::mutex> lk(mutex_);
  if (aborting_) throw Cancelled{};
  groups_seen_.emplace(g->ctx, *g);
  auto& slot = passes_[{g->ctx, seq}];
  if (slot == nullptr) {
    slot = std::make_unique<PassOp>();
    slot->group = g;
    slot->seq = seq;
    slot->labels = std::move(labels);
    slot->members.resize(u(p));
  }
  PassOp& op = *slot;
  if (static_cast<int>(op.labels.size()) != pass.parts) {
    throw CommError("mismatched ring passes on " + g->describe() + ", pass #" +
                    std::to_string(seq) + ": rank " + std::to_string(g->members[u(group_rank)]) +
                    " passes " + std::to_string(pass.parts) + " parts, the ranks before it " +
                    std::to_string(op.labels.size()));
  }
  PassMember& m = op.members[u(group_rank)];
  m.started = true;
  m.round = 0;
  m.pass = &pass;
  m.req = req;
  m.clock = f.clock;
  m.done.assign(u(2 * pass.parts), SimTime{});
  m.counts = pass.counts;
  try {
    pass_post_round(op, group_rank);  // may finish the pass at once (p == 1)
  } catch (...) {
    // A mismatched block: this rank leaves the pass, and its buffers with the stack it unwinds,
    // so no neighbour may match it any more (they wait; the run ends with the error).
    m = PassMember{};
    throw;
  }
  if (!req->done) {
    req->waiter = &f;
    block(f, lk, req.get(), false);
  }
  COCO_CHECK(req->done, "woken before completion");
  // Every charge and wait is already on the tile's accounting: the clock only catches up.
  f.clock = req->done_time;
}

void Kernel::pass_post_round(PassOp& op, int r) {
  const int p = static_cast<int>(op.members.size());
  PassMember& m = op.members[u(r)];
  const int round = m.round;
  const int rank = op.group->members[u(r)];
  if (round + 1 < p) {
    m.post = m.clock;
    m.pending = 2 * m.pass->parts;
    // Match with the neighbours already in this round (each pair matches once: whichever
    // posts second finds the other there).
    const int left = mod(r - 1, p), right = mod(r + 1, p);
    const PassMember& l = op.members[u(left)];
    if (l.started && l.round == round) pass_match(op, left, r);
    const PassMember& rt = op.members[u(right)];
    if (rt.started && rt.round == round) pass_match(op, r, right);
  }
  // Rounds on blocks of one size charge the same op: the device is asked once.
  const OpCost& w = m.pass->work[u(round)];
  const bool again = round > 0 && same_op(w, m.pass->work[u(round - 1)]);
  if (!again) m.last_dt = device_.time(w);
  m.clock = charge(rank, m.clock, m.last_dt, w.label.empty() ? op_kind_name(w.kind) : w.label);
  if (round + 1 < p) return;
  m.round = p;  // past every round: matches nothing more
  complete(*m.req, m.clock);
  m.req.reset();
  m.pass = nullptr;
  m.counts = {};
  if (++op.finished == p) passes_.erase({op.group->ctx, op.seq});
}

void Kernel::pass_match(PassOp& op, int src, int dst) {
  const int p = static_cast<int>(op.members.size());
  const PassMember& s = op.members[u(src)];
  const PassMember& d = op.members[u(dst)];
  const int round = s.round;
  const int block = mod(src - round, p);  // the sender's holder, the receiver's next block
  const int wsrc = op.group->members[u(src)];
  const int wdst = op.group->members[u(dst)];
  const int parts = s.pass->parts;
  const std::int64_t count = s.counts[u(block)];
  if (count != d.counts[u(block)]) {
    throw CommError("message size mismatch: rank " + std::to_string(wsrc) + " sends " +
                    std::to_string(count) + " elements to rank " + std::to_string(wdst) +
                    ", which expects " + std::to_string(d.counts[u(block)]) + " (in '" +
                    std::string(s.pass->labels.front()) + "')");
  }
  for (int q = 0; q < parts; ++q) {
    if (s.pass->data && d.pass->data && count > 0) {
      const std::span<float> out = s.pass->data(q, block), in = d.pass->data(q, block);
      if (!out.empty() && !in.empty())
        std::memcpy(in.data(), out.data(), static_cast<std::size_t>(count) * sizeof(float));
    }
    Transfer t;
    t.start = std::max(s.post, d.post);
    t.src = wsrc;
    t.dst = wdst;
    t.key = ChannelKey{op.group->ctx, wsrc, wdst, static_cast<std::uint64_t>(parts * round + q)};
    t.seq = 0;  // one message per (src, dst, tag) in flight: its channel's first match
    t.bytes = wire_bytes(count);
    t.label = op.labels[u(q)];
    t.pass = &op;
    t.op_src = src;
    t.op_dst = dst;
    t.part = q;
    new_transfers_.push_back(std::move(t));
  }
}

void Kernel::pass_message_done(PassOp& op, int r, int slot, SimTime t) {
  PassMember& m = op.members[u(r)];
  if (m.pass == nullptr) return;  // r left the pass with an error: the run is ending
  m.done[u(slot)] = t;
  if (--m.pending > 0) return;
  // The waits, in posting order: receives, then sends.
  const int rank = op.group->members[u(r)];
  TileStats& ts = tiles_[u(rank)];
  const int parts = m.pass->parts;
  for (int k = 0; k < 2 * parts; ++k) {
    const SimTime done = m.done[u(k)];
    if (done <= m.clock) continue;
    ts.exposed += done - m.clock;
    record_tile_event(rank, TraceEvent::Kind::kWait, m.clock, done, m.pass->labels[u(k % parts)]);
    m.clock = done;
  }
  ++m.round;
  pass_post_round(op, r);
}

}  // namespace cocodiff::emu::detail
