// How a ring pass is timed. A matched hop goes to the kernel's MessageTiming: in closed form when
// neither end has anything else open and no other rank's flow can reach its route, with the one
// other pair whose flows can (held until both are matched), or through the network model. A
// whole pass: one whose every hop is exclusive (no other rank's flow can reach its links) and
// whose members all joined with nothing else open and the same block sizes runs every round of
// every member in one loop, with the same charges, waits, flows and ends as the rounds
// (pass_post_round, pass_match, pass_message_done) and no matching or completion list.

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
    op.hops[u(r)] = k_.timing().route(ranks[u(r)], ranks[u((r + 1) % p)], op.parts);
    whole = whole && op.hops[u(r)].kind == HopRoute::Kind::kExclusive;
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

void RingPasses::time_pass_hop(PassOp& op, int src, int dst, int round, SimTime start,
                               std::int64_t bytes) {
  const int parts = op.parts;
  MessageTiming::Message m;
  m.start = start;
  m.src = op.members[u(src)].rank;
  m.dst = op.members[u(dst)].rank;
  m.bytes = bytes;
  m.flows = parts;
  // The per-message pass's channel keys: tag parts * round + part.
  m.key = ChannelKey{op.group->ctx, m.src, m.dst, static_cast<std::uint64_t>(parts * round)};
  m.labels = {op.trace_labels.data() + u(src) * u(parts), u(parts)};
  m.sink = &op;
  m.src_member = src;
  m.dst_member = dst;
  m.may_start_past = op.late;  // posted when the pass left kWhole: exclusive, in closed form
  // With nothing else open on either end (s and d wait in this pass, so neither posts again
  // before these messages end), the route decides (set with the pass's mode).
  k_.timing().time(
      m, op.hops[u(src)],
      op.ends_wait_alone(src, dst) ? MessageTiming::Ends::kAlone : MessageTiming::Ends::kBusy);
}

// Neither tile has anything else open: both wait in this pass.
bool RingPasses::PassOp::ends_wait_alone(int src, int dst) const {
  const Accounting& a = owner->k_.accounting();
  return a.tile(members[u(src)].rank).timing.nothing_open() &&
         a.tile(members[u(dst)].rank).timing.nothing_open();
}

}  // namespace cocodiff::emu::detail
