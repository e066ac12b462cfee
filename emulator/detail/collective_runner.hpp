#pragma once
// The one runner of schedules at the collective level (emulator/collectives/schedule.hpp): a
// library collective's (all-to-all, all-gather, all-reduce, barrier) and a ring pass's
// (Communicator::ring_pass: make_ring_pass, with its caller's compute beside the rounds), each
// member's part a small state machine the controller advances as its messages complete, with no
// fiber, request or channel per message (collective_runner.cpp); what a ring pass's member
// brings (collective_pass.cpp); ops timed whole when every route is exclusive
// (collective_whole.cpp); what it tells the kernel's MessageTiming of a matched message, and
// the members that finish ahead of virtual time (collective_timing.cpp). The kernel's fibers,
// fabric, network and accounting are reached through the kernel it belongs to.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "emulator/detail/event_source.hpp"
#include "emulator/detail/kernel.hpp"
#include "emulator/detail/message_timing.hpp"
#include "emulator/detail/recycler.hpp"

namespace cocodiff::emu::detail {

class CollectiveRunner final : public EventSource {
 public:
  explicit CollectiveRunner(Kernel& k) : k_(k) {}

  /// Starts member group_rank's part of the `seq`-th collective of group g (Kernel::issue_call
  /// and the tile's open collective done by the caller): `req` completes with its part, at the
  /// time collectives::run_on_fiber would give.
  void start(const std::shared_ptr<const Group>& g, int group_rank, std::uint64_t seq,
             const ReqPtr& req, const CollectiveSpec& spec, SimTime clock);
  /// Member group_rank of group g joins its `seq`-th ring pass (make_ring_pass, with the
  /// pass's charges beside the rounds): posts its first round (or, for a pass timed whole,
  /// nothing yet). Returns the request that completes with its part; its charges and waits are
  /// on its tile's accounting by then. `kept`: the caller's kept rows.
  ReqPtr start_pass(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                    std::uint64_t seq, const RingPass& pass, PassRows kept);
  /// The run's kept row of member `group_rank`'s charges `work` (one per round) by block.
  const PassCosts& pass_costs(std::span<const OpCost> work, int group_rank);
  /// The run's kept copy of a pass's block sizes.
  const std::int64_t* pass_counts(std::span<const std::int64_t> counts);
  /// Completes the requests of members that finished before virtual time reached t.
  void finish_early(SimTime t);
  /// When the next member that finished early is due (SimTime::max() when none is).
  SimTime next_early_finish() const {
    return early_finishes_.empty() ? SimTime::max() : early_finishes_.front().t;
  }
  /// Its events: the ops timed whole whose last member has joined (op_whole).
  bool settle() override;
  /// No op is under way and no completion waits.
  bool idle() const { return ops_.empty() && early_finishes_.empty(); }
  /// Ring passes timed whole so far (RunResult::passes_whole).
  std::uint64_t passes_whole() const { return passes_whole_; }

 private:
  /// A member's progress through its rounds.
  struct CollectiveMember {
    bool started = false;
    int round = 0;      // current round
    int pending = 0;    // flows of the current round not yet complete
    SimTime clock;      // the time the fiber running the schedule would be at
    SimTime recv_post;  // when the current round's receives were posted
    boost::container::small_vector<SimTime, 1> send_posts;  // when each of its sends was
    /// Its current round's first receive and send (k = 0), once posted: what a peer matching
    /// them reads.
    collectives::Message first_recv, first_send;
    SimTime latest;              // the latest end of its messages so far
    std::vector<float> scratch;  // Schedule::scratch, when data moves
    ReqPtr req;
    CollectiveSpec spec;
    const RingPass* pass = nullptr;  // a working op's: the caller's, alive until its part is done
    bool data = false;               // a working op's: the caller passes its blocks' data
  };
  /// A collective or ring pass run at the collective level.
  ///
  /// A working op (a ring pass) differs in what its caller brings, not in how it runs: its
  /// members charge their compute beside the rounds (costs, by Schedule::work_block) and
  /// account their waits as they make them (exposed, in posting order: receives, then sends);
  /// its messages are point-to-point (no call overhead or software time; tag parts * round +
  /// part; `parts` flows each); it is not an open collective of its tiles, so a member
  /// finishes at its clock. Such an op may be timed whole (op_whole).
  struct CollectiveOp final : MessageSink {
    void message_done(const Transfer& t, SimTime end) override;
    /// Every flow's send and receive at once (the sender's first: it may free this op, dst's
    /// part is pending).
    void closed_done(int src, int dst, int flows, SimTime end) override {
      if (works) {
        owner->work_message_done(*this, src, flows, flows, end);
        owner->work_message_done(*this, dst, 0, flows, end);
      } else {
        owner->op_message_done(*this, src, end);
        owner->op_message_done(*this, dst, end);
      }
    }
    bool ends_wait_alone(int src, int dst) const override;
    CollectiveRunner* owner = nullptr;
    std::shared_ptr<const Group> group;
    std::uint64_t seq = 0;
    std::uint32_t label = 0;  // a collective's messages' label (trace only)
    const collectives::Schedule* schedule = nullptr;
    bool one_each_way = true;  // the schedule's (Schedule::one_each_way), asked once
    int finished = 0;
    std::vector<CollectiveMember> members;
    // A working op's (empty for a collective):
    bool works = false;
    int parts = 1;  // flows a message
    /// Timed whole (op_whole): decided by its first member (kUndecided until then); kWhole
    /// while every member so far joined with nothing else open and the same sizes, and posts
    /// nothing; kRounds when it runs round by round (a collective always does).
    enum class Mode : std::uint8_t { kUndecided, kWhole, kRounds } mode = Mode::kRounds;
    /// Its rounds were posted only when it left kWhole: their first messages may start before
    /// the network's present (they are exclusive: timed in closed form).
    bool late = false;
    std::vector<int> joined;  // kWhole: the members that joined, in order
    /// Per member r, the route of its messages (Schedule::same_peers), asked with the mode.
    std::vector<MessageTiming::Route> routes;
    std::vector<const PassCosts*> costs;      // per member: its charges, by block
    std::vector<std::string_view> labels;     // parts per member: its messages' labels
    std::vector<std::uint32_t> trace_labels;  // parts per member: interned (trace only)
    std::vector<SimTime> done;  // 2 parts per member: the round's receives, then sends
  };
  /// The `seq`-th op of group g, made when its first member joins: a collective, or a working
  /// op (`works`: a group numbers its ring passes apart from its collectives). `made`: whether
  /// this call made it.
  CollectiveOp& op_for(const std::shared_ptr<const Group>& g, std::uint64_t seq, bool works,
                       const collectives::Schedule* schedule, std::uint32_t label, bool& made);
  /// The ring pass schedule of p members (one per size, kept for the run).
  const collectives::Schedule& ring_schedule(int p);
  /// A ring pass's `seq`-th op of g; a member passing another number of parts than those
  /// before it is an error.
  CollectiveOp& pass_op(const std::shared_ptr<const Group>& g, std::uint64_t seq, int parts,
                        int group_rank);
  /// Member group_rank joins an op that may be timed whole: it posts nothing while every member
  /// so far has nothing else open and the same sizes; otherwise the members so far post their
  /// first round in the order they joined, then it posts its own, and the op runs round by
  /// round.
  void join_whole(CollectiveOp& op, int group_rank);
  /// Posts member r's current round: its receives, then its sends (each after its software
  /// time), each matched with the other end if it has posted the same round; a working op's
  /// member then charges the round's compute.
  void op_post_round(CollectiveOp& op, int r);
  /// Matches the k-th message of the current round from group rank src to dst, both posted,
  /// as the sender names it (`out`) and the receiver (`in`): copies its data and times it from
  /// `start`.
  void op_match(CollectiveOp& op, int src, int dst, int k, SimTime start,
                const collectives::Message& out, const collectives::Message& in);
  /// Copies (or reduces) a matched message's elements from its sender's buffers into its
  /// receiver's.
  void op_copy(const CollectiveOp& op, const CollectiveMember& s, int src, CollectiveMember& d,
               int dst, int k, const collectives::Message& out, const collectives::Message& in);
  /// Copies block `block` (count elements of each part) from sender s's blocks into receiver
  /// d's (Buffer::kBlock; both pass data: CollectiveMember::data).
  static void copy_block(const CollectiveMember& s, const CollectiveMember& d, int block,
                         std::int64_t count, int parts);
  /// A message of member r's current round ended at t.
  void op_message_done(CollectiveOp& op, int r, SimTime t) {
    CollectiveMember& m = op.members[static_cast<std::size_t>(r)];
    m.clock = std::max(m.clock, t);
    m.latest = std::max(m.latest, t);
    if (--m.pending == 0) op_round_done(op, r);
  }
  /// A working op's: `count` flows of member r's current round ended at t, from `slot` on
  /// (receives' parts, then sends').
  void work_message_done(CollectiveOp& op, int r, int slot, int count, SimTime t);
  /// Every message of member r's round has ended: its waits (a working op's), then its next
  /// round, or its finish. Kept out of line: most completions leave a message pending.
  [[gnu::noinline]] void op_round_done(CollectiveOp& op, int r);
  /// A working op's member of world rank `rank`, at `clock`, waits for a message that ended at
  /// `done`: an exposed wait with its event when the clock moves.
  void work_wait(int rank, SimTime& clock, SimTime done, std::string_view label) {
    if (done <= clock) return;
    k_.accounting().tile(rank).timing.expose(done - clock);
    k_.accounting().tile_event(rank, TraceEvent::Kind::kWait, clock, done, label);
    clock = done;
  }
  /// A working op's member r charges its compute of `round` (Schedule::work_block).
  void charge_work(CollectiveOp& op, int r, int round) {
    CollectiveMember& m = op.members[static_cast<std::size_t>(r)];
    const PassCosts& c = *op.costs[static_cast<std::size_t>(r)];
    const auto at = static_cast<std::size_t>(op.schedule->work_block(r, round));  // by block
    m.clock =
        k_.accounting().charge(op.group->members[static_cast<std::size_t>(r)], m.clock, c.dt[at],
                               c.work[at], c.costs[at].kind, c.costs[at].shape.kernel);
  }
  /// Member r is done: a working op's last charge, then its request completes.
  void op_finish(CollectiveOp& op, int r);
  /// Gives a finished op's storage back to the pool.
  void op_free(CollectiveOp& op);
  /// Hands the matched message from group rank src to dst of `op` to the kernel's
  /// MessageTiming (collective_timing.cpp): a working op's on the route asked with its mode, a
  /// collective whose schedule has one message each way at a time asking whether its route is
  /// exclusive and its ends wait for the op alone.
  void time_message(CollectiveOp& op, int src, int dst, int step, SimTime start,
                    std::int64_t bytes);
  /// Whether member r of collective `op` can post nothing before its current messages end: its
  /// tile's main fiber is blocked in wait() on r's request, and the op is the tile's only open
  /// one.
  bool op_waits_alone(const CollectiveOp& op, int r) const;

  // Working ops timed whole (collective_whole.cpp).
  /// Whether `op` can be timed whole: every member's route (Schedule::same_peers) exclusive
  /// (NetworkModel::exclusive_end). Its members then post nothing as they join; the controller
  /// times the whole op when the last one has (op_whole), unless a member joins with something
  /// else open or other sizes: then the members so far post their first round, in the order
  /// they joined, and the op runs round by round.
  bool can_be_whole(CollectiveOp& op);
  /// Every round of every member of `op`, all of whose members have joined, in closed form: the
  /// same charges, waits, flows and ends as the rounds, with no completion list or matching.
  void op_whole(CollectiveOp& op);
  struct WholeRows;
  /// Round `round` of an op timed whole: every member's send, in closed form.
  void whole_messages(CollectiveOp& op, int round, WholeRows& rows);
  /// Then every member's waits for its messages' ends, in posting order.
  void whole_waits(CollectiveOp& op, const WholeRows& rows);

  /// A member's request finished before virtual time reached its last message's end (a
  /// closed-form message, op_finish): completed at `done`, at controller time t.
  struct EarlyFinish {
    SimTime t;
    std::uint64_t seq;  // in the order finished: equal times are woken in that order
    ReqPtr req;
    SimTime done;
    struct Later {
      bool operator()(const EarlyFinish& a, const EarlyFinish& b) const {
        return std::tie(a.t, a.seq) > std::tie(b.t, b.seq);
      }
    };
  };
  /// message_software_time of the library for a message of `wire_bytes`, kept for the last
  /// size asked (a collective's messages mostly have one size).
  SimTime software_time(std::int64_t wire_bytes) {
    if (wire_bytes != software_bytes_) {
      software_bytes_ = wire_bytes;
      software_time_ = message_software_time(k_.options().library, wire_bytes);
    }
    return software_time_;
  }

  Kernel& k_;
  std::vector<EarlyFinish> early_finishes_;  // a heap, soonest first (EarlyFinish::Later)
  std::uint64_t early_finish_seq_ = 0;
  std::int64_t software_bytes_ = -1;  // software_time's last size, and its time
  SimTime software_time_;
  /// By group context, working or not, and number.
  std::map<std::tuple<std::uint64_t, bool, std::uint64_t>, std::unique_ptr<CollectiveOp>> ops_;
  // Finished ops kept for their arrays: a ring of 128 members would otherwise allocate and
  // free about 400 KB per pass.
  Recycler<CollectiveOp> op_pool_;
  std::vector<CollectiveOp*> whole_ready_;  // ops whose members have all joined (kWhole)
  std::map<int, std::unique_ptr<const collectives::Schedule>> ring_schedules_;  // by size
  // pass_costs' rows, by a digest of their charges (rows with one digest compared in full).
  std::unordered_map<std::uint64_t, std::vector<std::unique_ptr<PassCosts>>> pass_costs_;
  // pass_counts' rows, likewise.
  std::unordered_map<std::uint64_t, std::vector<std::vector<std::int64_t>>> pass_counts_;
  std::uint64_t passes_whole_ = 0;  // ops timed by op_whole
};

}  // namespace cocodiff::emu::detail
