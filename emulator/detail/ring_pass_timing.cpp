// How a ring pass is timed. A matched hop: in closed form when neither end has anything else
// open and no other rank's flow can reach its route, with the one other pair whose flows can
// (held until both are matched), or through the network model; and the delivery of the
// completions timed in closed form. A whole pass: one whose every hop is exclusive (no other
// rank's flow can reach its links) and whose members all joined with nothing else open and the
// same block sizes runs every round of every member in one loop, with the same charges, waits,
// flows and ends as the rounds (pass_post_round, pass_match, pass_message_done) and no matching
// or completion list.

#include "emulator/detail/ring_passes.hpp"

#include <algorithm>
#include <array>
#include <optional>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
int mod(int a, int p) { return ((a % p) + p) % p; }
}  // namespace

/// Per member of a pass timed whole: when it posted the round, when its receives and sends
/// end, and its hop's duration (exclusive_end from a start of zero) for its last block size.
struct RingPasses::WholeRows {
  explicit WholeRows(int p) : post(u(p)), recv(u(p)), send(u(p)), bytes(u(p), -1), span_ns(u(p)) {}
  std::vector<SimTime> post, recv, send;
  std::vector<std::int64_t> bytes, span_ns;
};

bool RingPasses::pass_can_be_whole(PassOp& op) {
  const int p = static_cast<int>(op.members.size());
  if (p < 2) return false;
  // Each hop's kind, asked once per pass: its rounds' messages go by it.
  const std::vector<int>& ranks = op.group->members;
  op.hops.resize(u(p));
  bool whole = true;
  for (int r = 0; r < p; ++r) {
    const int s = ranks[u(r)], d = ranks[u((r + 1) % p)];
    HopRoute& hop = op.hops[u(r)];
    if (k_.network().exclusive_end(s, d, 0, op.parts, k_.network().now())) {
      hop = {HopRoute::Kind::kExclusive, -1};
      continue;
    }
    whole = false;
    const std::optional<int> key = k_.network().pair_key(s, d);
    hop = key.has_value() ? HopRoute{HopRoute::Kind::kPaired, *key} : HopRoute{};
  }
  return whole;
}

bool RingPasses::run_whole_passes() {
  if (whole_ready_.empty()) return false;
  // Each pass's members are its own: the order passes are timed in does not matter. (The
  // members they wake run only after this controller step: none joins a pass meanwhile.)
  for (PassOp* op : whole_ready_) pass_whole(*op);
  whole_ready_.clear();
  return true;
}

void RingPasses::pass_whole(PassOp& op) {
  // Member by member within each round: every member joined with nothing else open and waits in
  // the pass, so no flow of anyone else can join its hops' links, and each hop's end is
  // exclusive_end's. A tile's events keep their order (round i's charge, then its waits); flows
  // add to the statistics and the timeline hash in any order.
  const int p = static_cast<int>(op.members.size());
  WholeRows rows(p);
  for (int i = 0; i < p; ++i) {
    for (int r = 0; r < p; ++r) {
      PassMember& m = op.members[u(r)];
      rows.post[u(r)] = m.clock;
      const PassCosts& c = *op.costs[u(r)];
      const size_t at = u(mod(r - i, p));  // by block
      m.clock = k_.accounting().charge(m.rank, m.clock, c.dt[at], c.work[at], c.costs[at].kind,
                                       c.costs[at].shape.kernel);
    }
    if (i + 1 == p) break;  // the last round only charges
    pass_whole_hops(op, i, rows);
    pass_whole_waits(op, rows);
  }
  ++passes_whole_;
  for (PassMember& m : op.members) {
    m.round = p;
    k_.complete(*m.req, m.clock);
    m.req.reset();
    m.pass = nullptr;
  }
  pass_free(op);
}

void RingPasses::pass_whole_hops(PassOp& op, int round, WholeRows& rows) {
  const int p = static_cast<int>(op.members.size());
  const int parts = op.parts;
  const std::int64_t* const counts = op.counts[0];  // every member's (kWhole)
  for (int r = 0; r < p; ++r) {
    const int d = (r + 1) % p;
    const PassMember& s = op.members[u(r)];
    const PassMember& dm = op.members[u(d)];
    const int block = mod(r - round, p);  // the sender's holder, the receiver's next block
    const std::int64_t count = counts[u(block)];
    const std::int64_t bytes = k_.wire_bytes(count);
    const SimTime start = std::max(rows.post[u(r)], rows.post[u(d)]);
    pass_copy_block(s, dm, block, count, parts);
    // An exclusive hop's end moves with its start (its join is start + latency): each member's
    // is worked out once per block size.
    if (rows.bytes[u(r)] != bytes) {
      const std::optional<SimTime> span =
          k_.network().exclusive_end(s.rank, dm.rank, bytes, parts, SimTime{});
      COCO_CHECK(span.has_value(), "a hop of a whole ring pass is not exclusive");
      rows.bytes[u(r)] = bytes;
      rows.span_ns[u(r)] = span->ns();
    }
    const SimTime end = start + SimTime::from_ns(rows.span_ns[u(r)]);
    k_.accounting().flow(start, end, s.rank, dm.rank, bytes,
                         {op.trace_labels.data() + u(r) * u(parts), u(parts)}, /*exclusive=*/true);
    rows.send[u(r)] = end;
    rows.recv[u(d)] = end;
  }
}

void RingPasses::pass_whole_waits(PassOp& op, const WholeRows& rows) {
  const int p = static_cast<int>(op.members.size());
  for (int r = 0; r < p; ++r) {
    PassMember& m = op.members[u(r)];
    TileStats& ts = k_.accounting().tile(m.rank);
    // The waits, in posting order: the receives (every part ends at once), then the sends.
    for (const SimTime done : {rows.recv[u(r)], rows.send[u(r)]}) {
      if (done <= m.clock) continue;
      ts.timing.expose(done - m.clock);
      k_.accounting().tile_event(m.rank, TraceEvent::Kind::kWait, m.clock, done,
                                 op.labels[u(r) * u(op.parts)]);
      m.clock = done;
    }
  }
}

void RingPasses::deliver_closed() {
  // Each completion may finish a member's round, post its next round and match exclusive
  // messages whose completions join the list: the whole of an exclusive ring runs here. The
  // order does not matter: a member acts once all of its round's completions are in.
  k_.deliver_all(
      closed_pass_messages_,
      [this](const ClosedPassMessage& d) {
        pass_message_done(*d.op, d.member, d.slot, d.t, d.count);
      },
      [](const ClosedPassMessage& d) { return d.op->members[u(d.member)].rank; });
}

void RingPasses::time_pass_hop(const PassHop& hop) {
  PassOp& op = *hop.op;
  const int parts = op.parts;
  // With nothing else open on either end (s and d wait in this pass, so neither posts again
  // before these messages end), a route on which no other rank's flow can travel carries them
  // alone: their end is known now, and they never enter the network model.
  if (!k_.accounting().tile(hop.src_rank).timing.nothing_open() ||
      !k_.accounting().tile(hop.dst_rank).timing.nothing_open()) {
    pass_transfers(hop);
    return;
  }
  const HopRoute route = op.hops[u(hop.src)];  // set with the mode
  if (route.kind == HopRoute::Kind::kExclusive) {
    const std::optional<SimTime> end =
        k_.network().exclusive_end(hop.src_rank, hop.dst_rank, hop.bytes, parts, hop.start);
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
  const std::array<std::optional<SimTime>, 2> ends = k_.network().exclusive_pair_ends(
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

void RingPasses::pass_closed(const PassHop& h, SimTime end) {
  COCO_CHECK(h.op->late || h.start >= k_.network().now(), "an exclusive flow starts in the past");
  const int parts = h.op->parts;
  k_.accounting().flow(h.start, end, h.src_rank, h.dst_rank, h.bytes,
                       {h.op->trace_labels.data() + u(h.src) * u(parts), u(parts)},
                       /*exclusive=*/true);
  closed_pass_messages_.push_back(
      {h.op, h.src, parts, parts, end});                          // the sends; dst's are pending
  closed_pass_messages_.push_back({h.op, h.dst, 0, parts, end});  // the receives
}

void RingPasses::pass_transfers(const PassHop& h) {
  const int parts = h.op->parts;
  for (int q = 0; q < parts; ++q) {
    // One message per (src, dst, tag) in flight: its channel's first match.
    Transfer t =
        Transfer::matched(h.start,
                          ChannelKey{h.op->group->ctx, h.src_rank, h.dst_rank,
                                     static_cast<std::uint64_t>(parts * h.round + q)},
                          0, h.bytes, h.op->trace_labels[u(h.src) * u(parts) + u(q)], h.op);
    t.src_member = h.src;
    t.dst_member = h.dst;
    t.part = q;
    k_.fabric().add(std::move(t));
  }
}

void RingPasses::flush_held() {
  for (const HeldHop& h : held_) {
    held_at_[static_cast<size_t>(h.key)] = 0;
    if (!k_.aborting()) pass_transfers(h.hop);
  }
  held_.clear();
}

}  // namespace cocodiff::emu::detail
