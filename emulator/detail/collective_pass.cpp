// What a ring pass's member brings to the one runner (collective_runner.cpp): the ring pass
// schedule (collectives::make_ring_pass), its block sizes and its charges by block, kept once
// for the run, its labels, and its blocks' data through the caller's function. The runner
// follows the per-message pass (Communicator::do_ring_pass) step for step, so both give the
// same flows in the same order and hence the same timeline; tests compare them.
//
// Its messages keep the per-message path's channel keys (group context, world ranks, tag
// parts * round + part), which order the flows a controller step adds. A pass whose every hop is
// exclusive is timed whole (collective_whole.cpp): its members post nothing as they join, and
// the controller works out all of their rounds at once when the last one has. A member that
// joins with something open or other block sizes ends that: the members before it post their
// first round in the order they joined (each hop matched by whichever end posts second, as on
// joining), and the rounds take over.

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>

#include "core/errors.hpp"
#include "emulator/detail/collective_runner.hpp"
#include "emulator/detail/timeline_hash.hpp"

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
std::string_view pass_call(Kernel& k, int parts) {
  return parts == 2   ? std::string_view("ring_pass(parts=2)")
         : parts == 1 ? std::string_view("ring_pass(parts=1)")
                      : k.keep_label("ring_pass(parts=" + std::to_string(parts) + ")");
}
}  // namespace

ReqPtr CollectiveRunner::start_pass(FiberState& f, const std::shared_ptr<const Group>& g,
                                    int group_rank, std::uint64_t seq, const RingPass& pass,
                                    PassRows kept) {
  COCO_CHECK(f.is_main, "a ring pass runs on a tile's main fiber");
  k_.issue_call(f);
  const int p = static_cast<int>(g->members.size());
  const int parts = pass.parts;
  auto req = std::make_shared<ReqState>();
  req->op = ReqState::Op::kCollective;
  req->label = pass.labels.empty() ? std::string() : std::string(pass.labels.front());
  req->set_call(pass_call(k_, parts), seq);
  req->group = g;
  std::vector<std::uint32_t> interned(u(parts), 0);
  if (k_.options().trace)
    for (int q = 0; q < parts; ++q) interned[u(q)] = k_.accounting().intern(pass.labels[u(q)]);
  std::unique_lock<NullLock> lk(k_.state_lock());
  if (k_.aborting()) throw Cancelled{};
  k_.note_group(*g);
  CollectiveOp& op = pass_op(g, seq, parts, group_rank);
  CollectiveMember& m = op.members[u(group_rank)];
  // The block sizes and the rounds' charges by block, kept once for the run (a tape keeps them).
  m.spec.schedule = op.schedule;
  m.spec.sizes.send_counts =
      kept.counts != nullptr ? kept.counts : pass_counts({pass.counts.data(), u(p)});
  op.costs[u(group_rank)] =
      kept.costs != nullptr ? kept.costs : &pass_costs({pass.work.data(), u(p)}, group_rank);
  for (int q = 0; q < parts; ++q) {
    op.labels[u(group_rank) * u(parts) + u(q)] = pass.labels[u(q)];
    op.trace_labels[u(group_rank) * u(parts) + u(q)] = interned[u(q)];
  }
  m.started = true;
  m.round = 0;
  m.pass = &pass;
  m.data = static_cast<bool>(pass.data);
  m.req = req;
  m.clock = f.clock;
  if (op.mode == CollectiveOp::Mode::kUndecided)
    op.mode = can_be_whole(op) ? CollectiveOp::Mode::kWhole : CollectiveOp::Mode::kRounds;
  if (op.mode == CollectiveOp::Mode::kWhole) join_whole(op, group_rank);
  if (op.mode == CollectiveOp::Mode::kRounds) {
    try {
      if (op.schedule->rounds() == 0)
        op_finish(op, group_rank);  // one member: its one charge
      else
        op_post_round(op, group_rank);
    } catch (...) {
      // A mismatched block: this rank leaves the pass, and its buffers with the stack it
      // unwinds, so no neighbour may match it any more (they wait; the run ends with the error).
      m = CollectiveMember{};
      throw;
    }
  }
  return req;
}

const collectives::Schedule& CollectiveRunner::ring_schedule(int p) {
  std::unique_ptr<const collectives::Schedule>& s = ring_schedules_[p];
  if (s == nullptr) s = collectives::make_ring_pass(p);
  return *s;
}

CollectiveRunner::CollectiveOp& CollectiveRunner::pass_op(const std::shared_ptr<const Group>& g,
                                                          std::uint64_t seq, int parts,
                                                          int group_rank) {
  const int p = static_cast<int>(g->members.size());
  bool made = false;
  CollectiveOp& op = op_for(g, seq, true, &ring_schedule(p), 0, made);
  if (made) {
    op.parts = parts;
    op.mode = CollectiveOp::Mode::kUndecided;
    op.costs.resize(u(p));
    op.labels.resize(u(p) * u(parts));
    op.trace_labels.resize(u(p) * u(parts));
    op.done.resize(u(p) * u(2 * parts));
  }
  if (op.parts != parts) {
    throw CommError("mismatched ring passes on " + g->describe() + ", pass #" +
                    std::to_string(seq) + ": rank " + std::to_string(g->members[u(group_rank)]) +
                    " passes " + std::to_string(parts) + " parts, the ranks before it " +
                    std::to_string(op.parts));
  }
  return op;
}

void CollectiveRunner::join_whole(CollectiveOp& op, int group_rank) {
  const int p = static_cast<int>(op.members.size());
  CollectiveMember& m = op.members[u(group_rank)];
  const bool same_counts =
      op.joined.empty() ||
      op.members[u(op.joined.front())].spec.sizes.send_counts == m.spec.sizes.send_counts;
  if (k_.accounting().tile(op.group->members[u(group_rank)]).timing.nothing_open() && same_counts) {
    op.joined.push_back(group_rank);
    if (op.joined.size() == u(p)) whole_ready_.push_back(&op);  // the controller times it
  } else {
    // This member has something open or other block sizes: the members that joined before it
    // post their first round in the order they joined, as they would have on joining (each
    // hop matches whichever end posts second), then it posts its own.
    op.mode = CollectiveOp::Mode::kRounds;
    op.late = true;
    m.started = false;  // a member is matched by the posts that come after its own
    for (const int k : op.joined) op.members[u(k)].started = false;
    for (const int k : op.joined) {
      op.members[u(k)].started = true;
      op_post_round(op, k);  // one row of sizes so far: no mismatch
    }
    op.joined.clear();
    m.started = true;
  }
}

const std::int64_t* CollectiveRunner::pass_counts(std::span<const std::int64_t> counts) {
  std::uint64_t h = counts.size();
  for (const std::int64_t c : counts) hash_word(h, static_cast<std::uint64_t>(c));
  std::vector<std::vector<std::int64_t>>& rows = pass_counts_[h];
  for (const std::vector<std::int64_t>& row : rows)
    if (std::equal(row.begin(), row.end(), counts.begin(), counts.end())) return row.data();
  rows.emplace_back(counts.begin(), counts.end());  // rows move, their arrays do not
  return rows.back().data();
}

const PassCosts& CollectiveRunner::pass_costs(std::span<const OpCost> work, int group_rank) {
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

void CollectiveRunner::copy_block(const CollectiveMember& s, const CollectiveMember& d, int block,
                                  std::int64_t count, int parts) {
  if (count <= 0) return;
  for (int q = 0; q < parts; ++q) {
    const std::span<float> out = s.pass->data(q, block), in = d.pass->data(q, block);
    if (!out.empty() && !in.empty())
      std::memcpy(in.data(), out.data(), static_cast<std::size_t>(count) * sizeof(float));
  }
}

}  // namespace cocodiff::emu::detail
