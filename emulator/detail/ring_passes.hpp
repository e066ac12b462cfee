#pragma once
// Ring passes (Communicator::ring_pass) at the collective level: every member's rounds as a
// small state machine the controller advances as its messages complete (ring_pass.cpp); how
// they are timed (ring_pass_timing.cpp): whole when every hop is exclusive, else each matched
// hop by the kernel's MessageTiming (in closed form, as one of a pair, or through the network
// model). The kernel's fibers, fabric, network and accounting are reached through the kernel it
// belongs to.

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "emulator/detail/event_source.hpp"
#include "emulator/detail/kernel.hpp"
#include "emulator/detail/message_timing.hpp"
#include "emulator/detail/recycler.hpp"

namespace cocodiff::emu::detail {

class RingPasses final : public EventSource {
 public:
  explicit RingPasses(Kernel& k) : k_(k) {}

  /// Member group_rank of group g joins its `seq`-th pass: posts its first round (or, for a
  /// pass timed whole, nothing yet). Returns the request that completes with its part; its
  /// charges and waits are on its tile's accounting by then. `kept`: the caller's kept rows.
  ReqPtr start(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
               std::uint64_t seq, const RingPass& pass, PassRows kept);
  /// The run's kept row of member `group_rank`'s charges `work` (one per round) by block.
  const PassCosts& pass_costs(std::span<const OpCost> work, int group_rank);
  /// The run's kept copy of a pass's block sizes.
  const std::int64_t* pass_counts(std::span<const std::int64_t> counts);
  /// Runs the passes whose last member has joined (pass_whole). Returns false when none was.
  bool run_whole_passes();
  /// Its events: whole passes run first.
  bool settle() override { return run_whole_passes(); }
  /// No pass is under way.
  bool idle() const { return passes_.empty(); }
  /// Passes timed whole so far (RunResult::passes_whole).
  std::uint64_t passes_whole() const { return passes_whole_; }

 private:
  /// What can reach a ring hop's links (MessageTiming::route): no other rank's flow, one other
  /// pair's only, or any.
  using HopRoute = MessageTiming::Route;
  /// A ring pass run at the collective level: every member's progress through its rounds.
  struct PassMember {
    bool started = false;
    bool data = false;  // the caller passes buffers (RingPass::data)
    int round = 0;
    int pending = 0;  // messages of the current round not yet complete
    int rank = 0;     // world rank
    SimTime post;     // when the current round's messages were posted
    SimTime clock;    // the rank's clock: after the round's charge, then after each wait
    const RingPass* pass = nullptr;  // the caller's, alive until its part is done
    ReqPtr req;
  };
  /// Member state the rounds read is copied in at the start, flat and beside the other
  /// members' (member r's entries start at r times the per-member count), so a round touches
  /// no memory of the caller's.
  struct PassOp final : MessageSink {
    void message_done(const Transfer& t, SimTime end) override;
    /// Every part's send and receive at once.
    void closed_done(int src, int dst, int flows, SimTime end) override {
      owner->pass_message_done(*this, src, flows, end, flows);  // the sends; dst's are pending
      owner->pass_message_done(*this, dst, 0, end, flows);      // the receives
    }
    bool ends_wait_alone(int src, int dst) const override;
    RingPasses* owner = nullptr;
    std::shared_ptr<const Group> group;
    std::uint64_t seq = 0;
    int parts = 1;
    int finished = 0;
    /// Whether the pass is timed whole (pass_whole): decided by its first member (kUndecided
    /// until then); kWhole while every member so far joined with nothing else open and the
    /// same block sizes, and posts nothing; kRounds when it runs round by round.
    enum class Mode : std::uint8_t { kUndecided, kWhole, kRounds } mode = Mode::kUndecided;
    /// A member whose rounds were posted only when the pass left kWhole: its first messages
    /// may start before the network's present (they are exclusive: timed in closed form).
    bool late = false;
    std::vector<int> joined;  // kWhole: the members that joined, in order
    std::vector<PassMember> members;
    /// Per member r, the route of its hop (to r + 1). Set with the mode, a property of the
    /// routes.
    std::vector<HopRoute> hops;
    std::vector<const std::int64_t*> counts;  // per member: its block sizes (pass_counts)
    std::vector<const PassCosts*> costs;      // per member: its charges, by block
    std::vector<std::string_view> labels;     // parts per member: its messages' labels
    std::vector<std::uint32_t> trace_labels;  // parts per member: interned (trace only)
    std::vector<SimTime> done;  // 2 parts per member: the round's receives, then sends
  };
  /// The `seq`-th pass of group g, made when its first member joins; a member passing another
  /// number of parts than those before it is an error.
  PassOp& pass_op(const std::shared_ptr<const Group>& g, std::uint64_t seq, int parts,
                  int group_rank);
  /// Member group_rank joins a pass that may be timed whole: it posts nothing while every member
  /// so far has nothing else open and the same block sizes; otherwise the members so far post
  /// their first round in the order they joined, then it posts its own, and the pass runs round
  /// by round.
  void pass_join_whole(PassOp& op, int group_rank);
  /// Posts member r's current round (its messages, matched with neighbours that posted the
  /// same round), charges the round's work and finishes r after its last round.
  void pass_post_round(PassOp& op, int r);
  void pass_match(PassOp& op, int src, int dst);
  /// Whether pass `op` of p members can be timed whole: every hop (member r to
  /// r + 1) exclusive (NetworkModel::exclusive_end). Its members then post nothing as they join;
  /// the controller times the whole pass when the last one has (pass_whole), unless a member
  /// joins with something else open or other block sizes: then the members so far post their
  /// first round, in the order they joined, and the pass runs round by round.
  bool pass_can_be_whole(PassOp& op);
  /// Every round of every member of `op`, all of whose members have joined, in closed form: the
  /// same charges, waits, flows and ends as the rounds, with no completion list or matching.
  void pass_whole(PassOp& op);
  struct WholeRows;
  /// Round `round` of a pass timed whole: every member's hop, in closed form.
  void pass_whole_hops(PassOp& op, int round, WholeRows& rows);
  /// Then every member's waits for its hops' ends, in posting order.
  void pass_whole_waits(PassOp& op, const WholeRows& rows);
  /// Copies block `block` (count elements of each part) from sender s's buffers into receiver
  /// d's, when both pass data.
  static void pass_copy_block(const PassMember& s, const PassMember& d, int block,
                              std::int64_t count, int parts);
  /// Gives a finished pass's storage back to the pool.
  void pass_free(const PassOp& op);
  /// Hands the hop of member src's round `round` to dst, matched, to the kernel's MessageTiming
  /// (ring_pass_timing.cpp): in closed form when neither end has anything else open and no other
  /// flow can reach its route, with its pair when one other pair's flows can, else through the
  /// network model; one flow per part.
  void time_pass_hop(PassOp& op, int src, int dst, int round, SimTime start, std::int64_t bytes);
  /// `count` of member r's messages of this round completed, from `slot` on (receives, then
  /// sends).
  void pass_message_done(PassOp& op, int r, int slot, SimTime t, int count = 1);

  Kernel& k_;
  std::vector<PassOp*> whole_ready_;  // passes whose members have all joined (kWhole)
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::unique_ptr<PassOp>> passes_;
  // Finished passes kept for their arrays (p * p entries each): a ring of 128 members would
  // otherwise allocate and free about 400 KB per pass.
  Recycler<PassOp> pass_pool_;
  // pass_costs' rows, by a digest of their charges (rows with one digest compared in full).
  std::unordered_map<std::uint64_t, std::vector<std::unique_ptr<PassCosts>>> pass_costs_;
  // pass_counts' rows, likewise.
  std::unordered_map<std::uint64_t, std::vector<std::vector<std::int64_t>>> pass_counts_;
  std::uint64_t passes_whole_ = 0;  // passes timed by pass_whole
};

}  // namespace cocodiff::emu::detail
