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
// order the flows a controller step adds. The kernel's MessageTiming times each matched hop
// (message_timing.hpp): a hop whose flows are exclusive (no other rank's flow can share their
// links, and neither end has anything else open) never enters the network: its end is known
// when it is matched and its completion delivered at the next step, so a ring of such hops runs
// its rounds without waiting for virtual time to reach them (every later message of its ends
// starts after that end, so no other flow could have joined them); two hops whose links only
// each other's flows can reach are timed together when both are matched before the network
// moves on. Either way its ends are the network model's.
// A pass whose every hop is exclusive is timed whole (pass_whole): its members post nothing as
// they join, and the controller works out all of their rounds at once when the last one has.
// Since every member waits in the pass with nothing else open, no other flow can reach its
// hops, whenever they are worked out. A member that joins with something open or other block
// sizes ends that: the members before it post their first round in the order they joined (each
// hop matched by whichever end posts second, as on joining), and the rounds take over.

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <optional>
#include <span>

#include "core/errors.hpp"
#include "emulator/detail/ring_passes.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
int mod(int a, int p) { return ((a % p) + p) % p; }
/// OpCost's equality, without comparing the bytes of a label with themselves.
bool same_cost(const OpCost& a, const OpCost& b) {
  return a.kind == b.kind && a.flops == b.flops && a.bytes == b.bytes && a.shape == b.shape &&
         ((a.label.data() == b.label.data() && a.label.size() == b.label.size()) ||
          a.label == b.label);
}
}  // namespace

ReqPtr RingPasses::start(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                         std::uint64_t seq, const RingPass& pass, PassRows kept) {
  COCO_CHECK(f.is_main, "a ring pass runs on a tile's main fiber");
  k_.issue_call(f);
  const int p = static_cast<int>(g->members.size());
  const int parts = pass.parts;
  auto req = std::make_shared<ReqState>();
  req->op = ReqState::Op::kCollective;
  req->label = pass.labels.empty() ? std::string() : std::string(pass.labels.front());
  req->set_call(parts == 2   ? std::string_view("ring_pass(parts=2)")
                : parts == 1 ? std::string_view("ring_pass(parts=1)")
                             : k_.keep_label("ring_pass(parts=" + std::to_string(parts) + ")"),
                seq);
  req->group = g;
  std::vector<std::uint32_t> interned(u(parts), 0);
  if (k_.options().trace)
    for (int q = 0; q < parts; ++q) interned[u(q)] = k_.accounting().intern(pass.labels[u(q)]);
  std::unique_lock<NullLock> lk(k_.state_lock());
  if (k_.aborting()) throw Cancelled{};
  k_.note_group(*g);
  PassOp& op = pass_op(g, seq, parts, group_rank);
  // The block sizes and the rounds' charges by block, kept once for the run (a tape keeps them).
  op.counts[u(group_rank)] =
      kept.counts != nullptr ? kept.counts : pass_counts({pass.counts.data(), u(p)});
  op.costs[u(group_rank)] =
      kept.costs != nullptr ? kept.costs : &pass_costs({pass.work.data(), u(p)}, group_rank);
  for (int q = 0; q < parts; ++q) {
    op.labels[u(group_rank) * u(parts) + u(q)] = pass.labels[u(q)];
    op.trace_labels[u(group_rank) * u(parts) + u(q)] = interned[u(q)];
  }
  PassMember& m = op.members[u(group_rank)];
  m.started = true;
  m.data = static_cast<bool>(pass.data);
  m.round = 0;
  m.rank = g->members[u(group_rank)];
  m.pass = &pass;
  m.req = req;
  m.clock = f.clock;
  if (op.mode == PassOp::Mode::kUndecided)
    op.mode = pass_can_be_whole(op) ? PassOp::Mode::kWhole : PassOp::Mode::kRounds;
  if (op.mode == PassOp::Mode::kWhole) pass_join_whole(op, group_rank);
  if (op.mode == PassOp::Mode::kRounds) {
    try {
      pass_post_round(op, group_rank);  // may finish the pass at once (p == 1)
    } catch (...) {
      // A mismatched block: this rank leaves the pass, and its buffers with the stack it
      // unwinds, so no neighbour may match it any more (they wait; the run ends with the error).
      m = PassMember{};
      throw;
    }
  }
  return req;
}

RingPasses::PassOp& RingPasses::pass_op(const std::shared_ptr<const Group>& g, std::uint64_t seq,
                                        int parts, int group_rank) {
  const int p = static_cast<int>(g->members.size());
  auto& slot = passes_[{g->ctx, seq}];
  if (slot == nullptr) {
    // A finished pass's arrays are reused: every entry a round reads is written first (each
    // member's own when it starts, the completion times before its waits read them).
    slot = pass_pool_.take();
    slot->owner = this;
    slot->group = g;
    slot->seq = seq;
    slot->parts = parts;
    slot->finished = 0;
    slot->members.assign(u(p), PassMember{});
    slot->counts.resize(u(p));
    slot->costs.resize(u(p));
    slot->labels.resize(u(p) * u(parts));
    slot->trace_labels.resize(u(p) * u(parts));
    slot->done.resize(u(p) * u(2 * parts));
    slot->mode = PassOp::Mode::kUndecided;
    slot->late = false;
    slot->joined.clear();
  }
  PassOp& op = *slot;
  if (op.parts != parts) {
    throw CommError("mismatched ring passes on " + g->describe() + ", pass #" +
                    std::to_string(seq) + ": rank " + std::to_string(g->members[u(group_rank)]) +
                    " passes " + std::to_string(parts) + " parts, the ranks before it " +
                    std::to_string(op.parts));
  }
  return op;
}

void RingPasses::pass_join_whole(PassOp& op, int group_rank) {
  const int p = static_cast<int>(op.members.size());
  PassMember& m = op.members[u(group_rank)];
  const bool same_counts =
      op.joined.empty() || op.counts[u(op.joined.front())] == op.counts[u(group_rank)];
  if (k_.accounting().tile(m.rank).timing.nothing_open() && same_counts) {
    op.joined.push_back(group_rank);
    if (op.joined.size() == u(p)) whole_ready_.push_back(&op);  // the controller times it
  } else {
    // This member has something open or other block sizes: the members that joined before it
    // post their first round in the order they joined, as they would have on joining (each
    // hop matches whichever end posts second), then it posts its own.
    op.mode = PassOp::Mode::kRounds;
    op.late = true;
    m.started = false;  // a member is matched by the posts that come after its own
    for (const int k : op.joined) op.members[u(k)].started = false;
    for (const int k : op.joined) {
      op.members[u(k)].started = true;
      pass_post_round(op, k);  // one row of sizes so far: no mismatch
    }
    op.joined.clear();
    m.started = true;
  }
}

const std::int64_t* RingPasses::pass_counts(std::span<const std::int64_t> counts) {
  std::uint64_t h = counts.size();
  for (const std::int64_t c : counts) hash_word(h, static_cast<std::uint64_t>(c));
  std::vector<std::vector<std::int64_t>>& rows = pass_counts_[h];
  for (const std::vector<std::int64_t>& row : rows)
    if (std::equal(row.begin(), row.end(), counts.begin(), counts.end())) return row.data();
  rows.emplace_back(counts.begin(), counts.end());  // rows move, their arrays do not
  return rows.back().data();
}

const PassCosts& RingPasses::pass_costs(std::span<const OpCost> work, int group_rank) {
  const int p = static_cast<int>(work.size());
  // Round i of member r works on block r - i: the row by block is `work` turned by r.
  const auto by_block = [&](int b) -> const OpCost& { return work[u(mod(group_rank - b, p))]; };
  std::uint64_t h = static_cast<std::uint64_t>(p);
  std::string_view label;  // the last label digested (rounds mostly share one)
  std::uint64_t label_digest = std::hash<std::string_view>{}(label);
  for (int b = 0; b < p; ++b) {
    const OpCost& w = by_block(b);
    if (w.label.data() != label.data() || w.label.size() != label.size()) {
      label = w.label;
      label_digest = std::hash<std::string_view>{}(label);
    }
    hash_word(h, static_cast<std::uint64_t>(w.kind));
    hash_word(h, std::bit_cast<std::uint64_t>(w.flops));
    hash_word(h, std::bit_cast<std::uint64_t>(w.bytes));
    hash_word(h, label_digest);
  }
  std::vector<std::unique_ptr<PassCosts>>& rows = pass_costs_[h];
  for (const std::unique_ptr<PassCosts>& row : rows) {
    bool same = true;
    for (int b = 0; b < p && same; ++b) same = same_cost(by_block(b), row->costs[u(b)]);
    if (same) return *row;
  }
  auto row = std::make_unique<PassCosts>();
  row->costs.resize(u(p));
  row->dt.resize(u(p));
  row->work.resize(u(p));
  for (int b = 0; b < p; ++b) {
    // Rounds on blocks of one size charge the same op: its device time is worked out once. The
    // label outlives the caller's pass (other members charge it): the run's copy.
    const OpCost& w = by_block(b);
    const bool again = b > 0 && same_cost(w, by_block(b - 1));
    OpCost kept = w;
    kept.label = again ? row->costs[u(b - 1)].label : k_.keep_label(w.label);
    row->dt[u(b)] = again ? row->dt[u(b - 1)] : k_.device().time(w);
    row->work[u(b)] = kept.label.empty() ? op_kind_name(kept.kind) : kept.label;
    row->costs[u(b)] = kept;
  }
  rows.push_back(std::move(row));
  return *rows.back();
}

void RingPasses::pass_copy_block(const PassMember& s, const PassMember& d, int block,
                                 std::int64_t count, int parts) {
  if (!s.data || !d.data || count <= 0) return;
  for (int q = 0; q < parts; ++q) {
    const std::span<float> out = s.pass->data(q, block), in = d.pass->data(q, block);
    if (!out.empty() && !in.empty())
      std::memcpy(in.data(), out.data(), static_cast<std::size_t>(count) * sizeof(float));
  }
}

void RingPasses::pass_free(const PassOp& op) {
  const auto it = passes_.find({op.group->ctx, op.seq});
  it->second->group.reset();
  pass_pool_.give(std::move(it->second));
  passes_.erase(it);
}

void RingPasses::pass_post_round(PassOp& op, int r) {
  const int p = static_cast<int>(op.members.size());
  PassMember& m = op.members[u(r)];
  const int round = m.round;
  if (round + 1 < p) {
    m.post = m.clock;
    m.pending = 2 * op.parts;
    // Match with the neighbours already in this round (each pair matches once: whichever
    // posts second finds the other there).
    const int left = mod(r - 1, p), right = mod(r + 1, p);
    const PassMember& l = op.members[u(left)];
    if (l.started && l.round == round) pass_match(op, left, r);
    const PassMember& rt = op.members[u(right)];
    if (rt.started && rt.round == round) pass_match(op, r, right);
  }
  const PassCosts& c = *op.costs[u(r)];
  const size_t at = u(mod(r - round, p));  // by block
  m.clock = k_.accounting().charge(m.rank, m.clock, c.dt[at], c.work[at], c.costs[at].kind,
                                   c.costs[at].shape.kernel);
  if (round + 1 < p) return;
  m.round = p;  // past every round: matches nothing more
  k_.complete(*m.req, m.clock);
  m.req.reset();
  m.pass = nullptr;
  if (++op.finished < p) return;
  pass_free(op);
}

void RingPasses::pass_match(PassOp& op, int src, int dst) {
  const int p = static_cast<int>(op.members.size());
  const PassMember& s = op.members[u(src)];
  const PassMember& d = op.members[u(dst)];
  const int round = s.round;
  const int block = mod(src - round, p);  // the sender's holder, the receiver's next block
  const int parts = op.parts;
  const std::int64_t count = op.counts[u(src)][block];
  const std::int64_t expected = op.counts[u(dst)][block];
  if (count != expected) {
    throw CommError("message size mismatch: rank " + std::to_string(s.rank) + " sends " +
                    std::to_string(count) + " elements to rank " + std::to_string(d.rank) +
                    ", which expects " + std::to_string(expected) + " (in '" +
                    std::string(op.labels[u(src) * u(parts)]) + "')");
  }
  const SimTime start = std::max(s.post, d.post);
  const std::int64_t bytes = k_.wire_bytes(count);
  pass_copy_block(s, d, block, count, parts);
  time_pass_hop(op, src, dst, round, start, bytes);
}

void RingPasses::PassOp::message_done(const Transfer& t, SimTime end) {
  owner->pass_message_done(*this, t.src_member, parts + t.part, end);  // dst's part is pending
  owner->pass_message_done(*this, t.dst_member, t.part, end);
}

void RingPasses::pass_message_done(PassOp& op, int r, int slot, SimTime t, int count) {
  PassMember& m = op.members[u(r)];
  if (m.pass == nullptr) return;  // r left the pass with an error: the run is ending
  const int parts = op.parts;
  SimTime* done = op.done.data() + u(r) * u(2 * parts);
  std::fill_n(done + slot, count, t);
  m.pending -= count;
  if (m.pending > 0) return;
  // The waits, in posting order: receives, then sends.
  TileStats& ts = k_.accounting().tile(m.rank);
  for (int k = 0; k < 2 * parts; ++k) {
    if (done[k] <= m.clock) continue;
    ts.timing.expose(done[k] - m.clock);
    k_.accounting().tile_event(m.rank, TraceEvent::Kind::kWait, m.clock, done[k],
                               op.labels[u(r) * u(parts) + u(k % parts)]);
    m.clock = done[k];
  }
  ++m.round;
  pass_post_round(op, r);
}

}  // namespace cocodiff::emu::detail
