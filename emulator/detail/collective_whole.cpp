// Ops timed whole. A working op (a ring pass) whose schedule sends to and receives from the same
// peers every round (Schedule::same_peers), whose every route is exclusive (no other rank's flow
// can reach its links), and whose members all joined with nothing else open and the same sizes
// runs every round of every member in one loop, with the same charges, waits, flows and ends as
// the rounds (op_post_round, op_match, op_round_done) and no matching or completion list.

#include <algorithm>
#include <optional>

#include "core/errors.hpp"
#include "emulator/detail/collective_runner.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t u(int i) { return static_cast<std::size_t>(i); }
}  // namespace

/// Per member of an op timed whole: when it posted the round, when its receive and send end,
/// and its send's duration (exclusive_end from a start of zero) for its last message size.
struct CollectiveRunner::WholeRows {
  explicit WholeRows(int p) : post(u(p)), recv(u(p)), send(u(p)), bytes(u(p), -1), span_ns(u(p)) {}
  std::vector<SimTime> post, recv, send;
  std::vector<std::int64_t> bytes, span_ns;
};

bool CollectiveRunner::can_be_whole(CollectiveOp& op) {
  const int p = static_cast<int>(op.members.size());
  const collectives::Schedule& sched = *op.schedule;
  if (sched.rounds() == 0 || !sched.same_peers() || !op.one_each_way) return false;
  // Each member's route, asked once for the op: every round's message goes by it.
  const std::vector<int>& ranks = op.group->members;
  const collectives::Sizes none;
  op.routes.resize(u(p));
  bool whole = true;
  for (int r = 0; r < p; ++r) {
    const int to = sched.send(none, r, 0, 0).peer;
    op.routes[u(r)] = k_.timing().route(ranks[u(r)], ranks[u(to)], op.parts);
    whole = whole && op.routes[u(r)].kind == MessageTiming::Route::Kind::kExclusive;
  }
  return whole;
}

bool CollectiveRunner::settle() {
  if (whole_ready_.empty()) return false;
  // Each op's members are its own: the order ops are timed in does not matter. (The members
  // they wake run only after this controller step: none joins an op meanwhile.)
  for (CollectiveOp* op : whole_ready_) op_whole(*op);
  whole_ready_.clear();
  return true;
}

void CollectiveRunner::op_whole(CollectiveOp& op) {
  // Member by member within each round: every member joined with nothing else open and waits in
  // the op, so no flow of anyone else can join its messages' links, and each message's end is
  // exclusive_end's. A tile's events keep their order (round i's charge, then its waits); flows
  // add to the statistics and the timeline hash in any order.
  const int p = static_cast<int>(op.members.size());
  const int rounds = op.schedule->rounds();
  WholeRows rows(p);
  for (int i = 0; i <= rounds; ++i) {
    for (int r = 0; r < p; ++r) {
      rows.post[u(r)] = op.members[u(r)].clock;
      charge_work(op, r, i);
    }
    if (i == rounds) break;  // the last charge follows the last round
    whole_messages(op, i, rows);
    whole_waits(op, rows);
  }
  ++passes_whole_;
  for (CollectiveMember& m : op.members) {
    m.round = rounds;
    k_.complete(*m.req, m.clock);
    m.req.reset();
    m.pass = nullptr;
  }
  op_free(op);
}

void CollectiveRunner::whole_messages(CollectiveOp& op, int round, WholeRows& rows) {
  const int p = static_cast<int>(op.members.size());
  const int parts = op.parts;
  const collectives::Schedule& sched = *op.schedule;
  for (int r = 0; r < p; ++r) {
    const CollectiveMember& s = op.members[u(r)];
    const collectives::Message out = sched.send(s.spec.sizes, r, round, 0);
    const int d = out.peer;
    const CollectiveMember& dm = op.members[u(d)];
    const int src = op.group->members[u(r)], dst = op.group->members[u(d)];
    const std::int64_t bytes = k_.wire_bytes(out.count);
    const SimTime start = std::max(rows.post[u(r)], rows.post[u(d)]);
    if (s.data && dm.data) copy_block(s, dm, static_cast<int>(out.at.offset), out.count, parts);
    // An exclusive message's end moves with its start (its join is start + latency): each
    // member's is worked out once per message size.
    if (rows.bytes[u(r)] != bytes) {
      const std::optional<SimTime> span =
          k_.network().exclusive_end(src, dst, bytes, parts, SimTime{});
      COCO_CHECK(span.has_value(), "a message of an op timed whole is not exclusive");
      rows.bytes[u(r)] = bytes;
      rows.span_ns[u(r)] = span->ns();
    }
    const SimTime end = start + SimTime::from_ns(rows.span_ns[u(r)]);
    k_.accounting().flow(start, end, src, dst, bytes,
                         {op.trace_labels.data() + u(r) * u(parts), u(parts)}, /*exclusive=*/true);
    rows.send[u(r)] = end;
    rows.recv[u(d)] = end;
  }
}

void CollectiveRunner::whole_waits(CollectiveOp& op, const WholeRows& rows) {
  const int p = static_cast<int>(op.members.size());
  for (int r = 0; r < p; ++r) {
    CollectiveMember& m = op.members[u(r)];
    const int rank = op.group->members[u(r)];
    // The waits, in posting order: the receive (every part ends at once), then the send.
    for (const SimTime done : {rows.recv[u(r)], rows.send[u(r)]})
      work_wait(rank, m.clock, done, op.labels[u(r) * u(op.parts)]);
  }
}

}  // namespace cocodiff::emu::detail
