#pragma once
// Collectives at the collective level: any schedule (emulator/collectives/schedule.hpp) run by
// the controller, each member's part a small state machine advanced as its messages complete,
// with no fiber, request or channel per message (collective_runner.cpp); what it tells the
// kernel's MessageTiming of a matched message, and the members that finish ahead of virtual
// time (collective_timing.cpp). The kernel's fibers, fabric, network and accounting are reached
// through the kernel it belongs to.

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

#include "emulator/detail/kernel.hpp"
#include "emulator/detail/recycler.hpp"

namespace cocodiff::emu::detail {

class CollectiveRunner final {
 public:
  explicit CollectiveRunner(Kernel& k) : k_(k) {}

  /// Starts member group_rank's part of the `seq`-th collective of group g (Kernel::issue_call
  /// and the tile's open collective done by the caller): `req` completes with its part, at the
  /// time collectives::run_on_fiber would give.
  void start(const std::shared_ptr<const Group>& g, int group_rank, std::uint64_t seq,
             const ReqPtr& req, const CollectiveSpec& spec, SimTime clock);
  /// Completes the requests of members that finished before virtual time reached t.
  void finish_early(SimTime t);
  /// When the next member that finished early is due (SimTime::max() when none is).
  SimTime next_early_finish() const {
    return early_finishes_.empty() ? SimTime::max() : early_finishes_.front().t;
  }
  /// No collective is under way and no completion waits.
  bool idle() const { return ops_.empty() && early_finishes_.empty(); }

 private:
  /// A collective run at the collective level: every member's progress through its rounds.
  struct CollectiveMember {
    bool started = false;
    int round = 0;      // current round
    int pending = 0;    // messages of the current round not yet complete
    SimTime clock;      // the time the fiber running the schedule would be at
    SimTime recv_post;  // when the current round's receives were posted
    boost::container::small_vector<SimTime, 1> send_posts;  // when each of its sends was
    SimTime latest;                                         // the latest end of its messages so far
    std::vector<float> scratch;                             // Schedule::scratch, when data moves
    ReqPtr req;
    CollectiveSpec spec;
  };
  struct CollectiveOp final : MessageSink {
    void message_done(const Transfer& t, SimTime end) override;
    void closed_done(int src, int dst, int /*flows: one*/, SimTime end) override {
      owner->op_message_done(*this, src, end);  // may finish and free this op: dst's is pending
      owner->op_message_done(*this, dst, end);
    }
    bool ends_wait_alone(int src, int dst) const override {
      return owner->op_waits_alone(*this, src) && owner->op_waits_alone(*this, dst);
    }
    CollectiveRunner* owner = nullptr;
    std::shared_ptr<const Group> group;
    std::uint64_t seq = 0;
    std::uint32_t label = 0;
    const collectives::Schedule* schedule = nullptr;
    int finished = 0;
    std::vector<CollectiveMember> members;
  };
  /// Posts member r's current round: its receives, then its sends (each after its software
  /// time), each matched with the other end if it has posted the same round.
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
  /// Member r's message of the current round ended at t.
  void op_message_done(CollectiveOp& op, int r, SimTime t);
  /// Every message of member r's round has ended: its next round, or its finish. Kept out of
  /// line: most completions leave a message of the round pending.
  [[gnu::noinline]] void op_round_done(CollectiveOp& op, int r);
  /// Hands the matched message from group rank src to dst of `op` to the kernel's
  /// MessageTiming (collective_timing.cpp): a schedule with one message each way at a time asks
  /// whether its route is exclusive and its ends wait for the op alone.
  void time_collective_message(CollectiveOp& op, int src, int dst, int step, SimTime start,
                               std::int64_t bytes);
  /// Whether member r of `op` can post nothing before its current messages end: its tile's
  /// main fiber is blocked in wait() on r's request, and the op is the tile's only open one.
  bool op_waits_alone(const CollectiveOp& op, int r) const;
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
  void op_finish(CollectiveOp& op, int r);
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
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::unique_ptr<CollectiveOp>> ops_;
  Recycler<CollectiveOp> op_pool_;  // finished ops, kept for their members
};

}  // namespace cocodiff::emu::detail
