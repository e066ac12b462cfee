#pragma once
// The emulator's private kernel (emulator/README.md describes its design): the event loop
// (kernel.cpp), how tiles block, wait and are woken (fibers.cpp). Its other mechanisms are
// classes of their own, each reaching the kernel it belongs to: Accounting (what the run counts
// and hashes), Fabric (point-to-point matching and the network's transfers), CollectiveRunner
// (collectives and ring passes at the collective level), MessageTiming, RegionReplay and
// TapeRuns.
// Everything here lives on the controller's thread, with every fiber of the run (the other
// workers only run arithmetic: MathPool); Kernel::state_lock_ (a NullLock) marks where it is used.
// Fibers block through block(), the only place a tile fiber waits for the simulation (one
// waiting for its arithmetic, run_math, stays runnable), so "no runnable fiber" (runnable_ == 0)
// means every tile has posted everything it will post before its next wake-up: the controller may
// then advance virtual time (conservative discrete-event simulation).

#include <atomic>
#include <boost/fiber/condition_variable.hpp>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/errors.hpp"
#include "core/replay.hpp"
#include "emulator/collectives/registry.hpp"
#include "emulator/collectives/schedule.hpp"
#include "emulator/detail/accounting.hpp"
#include "emulator/detail/event_source.hpp"
#include "emulator/detail/fabric.hpp"
#include "emulator/detail/fiber_state.hpp"
#include "emulator/detail/math_pool.hpp"
#include "emulator/detail/recycler.hpp"
#include "emulator/detail/request.hpp"
#include "emulator/detail/stack_pool.hpp"
#include "emulator/detail/timeline_hash.hpp"
#include "emulator/engine.hpp"
#include "net_models/collective_model.hpp"

namespace cocodiff::emu::detail {

/// What a mark of the world is (RegionReplay::begin): a region judged at the mark
/// (Replay::begin_region), one judged where the tiles arrive (Replay::pass_region), a span.
enum class MarkKind : std::uint8_t { kRegion, kPassedRegion, kSpan };

/// One rank's part of a collective run at the collective level (Kernel::start_collective_op):
/// the schedule every member runs, this member's sizes and buffers. The buffers and an
/// all-to-allv's count arrays stay alive until the request completes (as MPI_Ialltoallv's).
struct CollectiveSpec {
  const collectives::Schedule* schedule = nullptr;  // the group's (Kernel::group_schedule)
  collectives::Sizes sizes;
  std::span<const float> send;
  std::span<float> recv;
  ReduceOp op = ReduceOp::kSum;  // rounds that reduce (Schedule::reduces)
};

/// Calls the engine issues for a tile whose fiber waits (TapeRuns::start). advance() issues
/// them in order until one waits for a request that is not over (TapeRuns::wait returned
/// false) or none is left (returns true). Only compute charges, collectives at the collective
/// level, point-to-point messages and waits: nothing that would block the caller.
struct TapeRun {
  virtual ~TapeRun() = default;
  virtual bool advance() = 0;
  FiberState* f = nullptr;
  std::shared_ptr<ReqState> waiting;  // the request its next call waits for
  bool pass = false;                  // `waiting` is a ring pass's: the clock only catches up
  SimTime before;                     // the tile's clock when that wait began
  std::exception_ptr error;           // thrown by advance() on the controller's side
};

/// A ring pass member's charges by block (member r's round i works on block r - i: a ring
/// attention's charge is its block's): each one with its label kept, the device's time for
/// it, and its label as the tile's events name it. Kept once for the run per distinct row
/// (pass_costs): the members, passes and tapes that charge alike share one, which stays in
/// cache where a copy per pass did not.
struct PassCosts {
  std::vector<OpCost> costs;
  std::vector<SimTime> dt;
  std::vector<std::string_view> work;
};
/// What a ring pass member brings that is kept once for the run: its charges by block
/// (Kernel::pass_costs) and its block sizes (Kernel::pass_counts, p of them). A tape keeps both
/// for each pass it makes; a null entry is worked out as the member joins.
struct PassRows {
  const PassCosts* costs = nullptr;
  const std::int64_t* counts = nullptr;
};

class CollectiveRunner;
class RegionReplay;
class MessageTiming;
class TapeRuns;

class Kernel {
 public:
  Kernel(const Topology& topo, NetworkModel& net, const DeviceModel& device,
         const EngineOptions& options);
  ~Kernel();

  RunResult run(const std::function<void(Communicator&)>& tile_main);

  // ---- called from fibers ----
  /// Posts a send (data may be empty: sizes only). Matching is FIFO per (ctx, src, dst, tag).
  ReqPtr post_send(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                   std::span<const float> data, std::int64_t count, std::string_view label) {
    return fabric_.post_send(f, ctx, src, dst, tag, data, count, label);
  }
  ReqPtr post_recv(FiberState& f, std::uint64_t ctx, int src, int dst, std::uint64_t tag,
                   std::span<float> data, std::int64_t count, std::string_view label) {
    return fabric_.post_recv(f, ctx, src, dst, tag, data, count, label);
  }
  /// Blocks f until req completes; f.clock = max(f.clock, completion). Main fibers account
  /// the jump as exposed communication.
  void wait(FiberState& f, ReqState& req);
  /// True when req completed at or before f.clock (may block until virtual time reaches it).
  bool test(FiberState& f, ReqState& req);
  /// req's completion time, once it is complete (nullopt before).
  std::optional<SimTime> done_time(const ReqState& req);
  void compute(FiberState& f, const OpCost& cost);
  /// Issues `run`'s calls for f's tile (TapeRuns::start).
  void run_tape(FiberState& f, TapeRun& run);
  /// In TapeRun::advance: a wait for `req` (TapeRuns::wait).
  bool tape_wait(TapeRun& run, const ReqPtr& req, bool pass);
  /// ring_pass() without waiting for its end: the pass's request.
  /// `kept`: the pass's rows, where the caller kept them (a tape).
  ReqPtr ring_pass_start(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                         std::uint64_t seq, const RingPass& pass, PassRows kept = {});
  /// The run's kept row of member `group_rank`'s charges `work` (one per round) by block.
  const PassCosts& pass_costs(std::span<const OpCost> work, int group_rank);
  /// The run's kept copy of a pass's block sizes.
  const std::int64_t* pass_counts(std::span<const std::int64_t> counts);
  /// The device's time for `cost`, as compute() charges it.
  SimTime device_time(const OpCost& cost) const { return device_.time(cost); }
  const DeviceModel& device() const { return device_; }
  /// compute() of an op whose device time `dt` is already known; `label` names its event.
  void charge_compute(FiberState& f, SimTime dt, std::string_view label, OpKind kind,
                      KernelClass kernel = KernelClass::kNone);
  /// Runs `work` (pure arithmetic) on a math thread or here; other fibers run meanwhile.
  void run_math(FiberState& f, const std::function<void()>& work);
  /// A region mark of the world (see Replay::begin_region); main fibers only.
  Replay::RegionMark begin_region(FiberState& f, std::string_view key, bool may_skip);
  /// A region mark of the world judged where the tile arrives (see Replay::pass_region).
  Replay::RegionMark pass_region(FiberState& f, std::string_view key, bool may_skip,
                                 std::string_view next);
  /// How the passed region tile f marked last was judged (see Replay::passed_answer).
  Replay::RegionMark passed_answer(FiberState& f);
  /// A span mark of the world (see Replay::begin_span); main fibers only.
  void begin_span(FiberState& f, std::string_view key, bool may_skip, std::string_view next);
  /// Tile f's call other than a compute charge: it first arrives at the mark it passed, if any
  /// (RegionReplay::arrive_pending).
  void arrive(FiberState& f) {
    if (f.pending_span >= 0) arrive_pending(f);
  }
  /// Starts a fiber at parent's clock that runs body and then completes req at its own clock.
  void spawn_comm(FiberState& parent, std::function<void(FiberState&)> body, ReqPtr req);
  /// A collective call issued by tile f's host (DeviceModel::collective_issue): its kernel
  /// starts no earlier than the host has issued it. Every way a collective starts calls this.
  void issue_call(FiberState& f);
  /// Tile f's host blocks until its device has caught up (a barrier, as MPI_Barrier and
  /// torch.distributed.barrier block the caller): it issues nothing before f's clock.
  void block_host(FiberState& f);
  /// Starts this rank's part of the `seq`-th collective of group g at the collective level: the
  /// controller runs its schedule directly, without a fiber, request or channel per message, and
  /// the timeline is the one collectives::run_on_fiber gives. Returns the request that completes
  /// with this rank's part.
  ReqPtr start_collective_op(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                             std::uint64_t seq, ReqPtr req, const CollectiveSpec& spec);
  /// This rank's part of the `seq`-th ring pass of group g (Communicator::ring_pass) at the
  /// collective level: the controller posts each round's messages, charges its compute and
  /// accounts its waits for the rank, without a fiber, request or channel per message, giving
  /// the timeline of the per-message pass. Returns when this rank's part is done.
  void ring_pass(FiberState& f, const std::shared_ptr<const Group>& g, int group_rank,
                 std::uint64_t seq, const RingPass& pass, PassRows kept = {});
  /// The registered algorithms the library model names, looked up once for the run.
  struct LibraryAlgorithms {
    collectives::AlgorithmId all_to_all_large = -1, all_to_all_small = -1;
    collectives::AlgorithmId all_gather = -1, all_reduce = -1, barrier = -1;
  };
  const LibraryAlgorithms& algorithms() const { return algorithms_; }
  /// The schedule of registered algorithm `algorithm` for the group with context `ctx`, of
  /// `size` members whose topology coordinates `coords` lists (asked only when it is made),
  /// made the first time a member asks and kept for the run: every member of a group, and every
  /// collective it runs, reads the same one.
  const collectives::Schedule& group_schedule(
      std::uint64_t ctx, collectives::AlgorithmId algorithm, int size,
      const std::function<std::vector<std::vector<int>>()>& coords);
  /// Checks that every member's `seq`-th collective on ctx is the same call.
  void register_collective(const Group& g, int group_rank, std::uint64_t seq,
                           std::string_view call);
  const Topology& topology() const { return topo_; }
  const EngineOptions& options() const { return options_; }
  /// One copy of `label` kept for the run: equal labels share it (a tape's labels point there,
  /// so that hashing them reads memory every call of that label reads).
  std::string_view keep_label(std::string_view label) { return acct_.keep_label(label); }
  /// A tile issued recorded calls again (EmuComm::play_tape): counted for the report.
  void tape_played();
  /// Wire bytes of `count` fp32 elements (EngineOptions::wire_bytes_per_element).
  std::int64_t wire_bytes(std::int64_t count) const {
    // A whole number of bytes per element (2 or 4) multiplies exactly what llround would round:
    // no library call per message.
    constexpr std::int64_t kExact = std::int64_t{1} << 40;
    if (wire_whole_ > 0 && count > -kExact && count < kExact) return count * wire_whole_;
    return std::llround(static_cast<double>(count) * options_.wire_bytes_per_element);
  }

  // ---- The kernel's mechanisms (Fabric, CollectiveRunner, MessageTiming, RegionReplay,
  // TapeRuns) share its state through what follows; the fibers' calls above go through them. ----
  Accounting& accounting() { return acct_; }
  Fabric& fabric() { return fabric_; }
  /// How every message matched at the collective level is timed (MessageTiming).
  MessageTiming& timing() { return *timing_; }
  NetworkModel& network() { return net_; }
  /// Marks the kernel's shared state (a NullLock: everything runs on the controller's thread).
  NullLock& state_lock() { return state_lock_; }
  /// The run is failing: fibers stop at their next call (Cancelled).
  bool aborting() const { return aborting_; }
  /// The main fiber of rank's tile.
  FiberState& main_fiber(int rank) { return *mains_[static_cast<std::size_t>(rank)]; }
  /// Notes group g for reports (a copy kept the first time its context is seen).
  void note_group(const Group& g) { groups_seen_.try_emplace(g.ctx, g); }
  /// The group with context ctx as reports name it.
  std::string describe_group(std::uint64_t ctx) const;
  /// Delivers completions known in advance (messages timed in closed form) with `deliver`, last
  /// first, until `list` is empty (delivering one may add more). A mismatch a delivery finds (a
  /// later round's message) is the run's failure at that completion's rank (`rank_of`) and time;
  /// the rest are dropped.
  template <typename T, typename Deliver, typename RankOf>
  void deliver_all(std::vector<T>& list, Deliver deliver, RankOf rank_of) {
    while (!list.empty()) {
      const T d = list.back();
      list.pop_back();
      try {
        deliver(d);
      } catch (const CommError& e) {
        message_failed(rank_of(d), d.t, e);
        list.clear();
      }
    }
  }
  /// A message a completion led to does not match: the run fails at `rank` and `t`.
  void message_failed(int rank, SimTime t, const CommError& e);
  /// Blocks f (a fiber of the run) until it is woken: waiting for req (or, in_test, for virtual
  /// time to reach req's end), or at a region mark (req null).
  void block(FiberState& f, std::unique_lock<NullLock>& lk, const ReqState* req, bool in_test);
  /// wait()'s accounting once req is over, for a main fiber whose clock was `before`.
  void finish_wait(FiberState& f, ReqState& req, SimTime before);
  void wake(FiberState& f);
  void complete(ReqState& r, SimTime t);
  /// The latest time any work (anything but a region mark) had an event at; a replayed
  /// region's work counts up to `t` (work_until).
  SimTime last_work() const { return last_work_; }
  void work_until(SimTime t) { last_work_ = std::max(last_work_, t); }
  /// Nothing is under way but the tiles themselves: every tile is alive, no collective, pass,
  /// transfer, flow, timer or failure is pending and no tile has a collective open.
  bool nothing_under_way() const;

 private:
  void arrive_pending(FiberState& f);
  /// Marks req as an open collective of its tile (compute beside it overlaps it).
  void open_collective(FiberState& parent, ReqState& req);
  struct CollectiveEntry {
    std::string_view call;  // kept for the run
    int first_group_rank;
    int seen;
  };

  void fiber_main(FiberState& f, const std::function<void(Communicator&)>& tile_main);
  /// The extra time open collective req of the tile whose clock is `c` takes
  /// (TileClock::transfer_penalty with the device's overlap factor for its group).
  SimTime transfer_penalty(const TileClock& c, const ReqState& req) const;
  void record_error(int rank, const std::exception_ptr& e);
  /// The network model's flows: transfers enter it before it moves on; its next event, with
  /// the collective members that finished early, whose ends fall in virtual time order among
  /// the flows' as they would in the network model.
  class Network final : public EventSource {
   public:
    explicit Network(Kernel& k) : k_(k) {}
    void prepare() override { k_.fabric_.enter_network(); }
    SimTime next_time() const override;
    void fire() override;

   private:
    Kernel& k_;
    mutable SimTime next_;  // what next_time() found, for fire()
  };
  /// Tiles in test() waiting for virtual time to reach their clock.
  class Timers final : public EventSource {
   public:
    explicit Timers(Kernel& k) : k_(k) {}
    SimTime next_time() const override {
      return k_.timers_.empty() ? SimTime::max() : k_.timers_.begin()->first;
    }
    void fire() override;

   private:
    Kernel& k_;
  };
  void controller();
  bool controller_step(std::unique_lock<NullLock>& lk);
  /// Throws the failure that happened first in virtual time (ties: lowest rank), if any.
  void rethrow_first_failure() const;
  std::string deadlock_report() const;

  const Topology& topo_;
  NetworkModel& net_;
  const DeviceModel& device_;
  const EngineOptions& options_;
  Accounting acct_;              // every tile's and flow's counts, and the timeline hash
  Fabric fabric_;                // point-to-point matching and the transfers in the network model
  std::int64_t wire_whole_ = 0;  // wire_bytes_per_element when it is a whole number up to 64
  LibraryAlgorithms algorithms_;
  StackPool main_stacks_;
  StackPool comm_stacks_;

  MathPool* math_ = nullptr;  // during run()

  NullLock state_lock_;
  boost::fibers::condition_variable_any controller_cv_;
  int runnable_ = 0;
  int live_ = 0;
  std::atomic<bool> aborting_{false};
  std::vector<std::unique_ptr<FiberState>> mains_;
  std::vector<FiberState*> blocked_list_;  // fibers currently blocked (unordered)
  std::map<std::pair<std::uint64_t, int>, std::unique_ptr<const collectives::Schedule>>
      group_schedules_;  // group_schedule: by group context and algorithm
  std::multimap<SimTime, FiberState*> timers_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, CollectiveEntry> collectives_;
  std::unique_ptr<CollectiveRunner> runner_;    // collectives, ring passes: the collective level
  std::unique_ptr<MessageTiming> timing_;       // how their matched messages are timed
  std::unique_ptr<RegionReplay> regions_;       // region marks and their replay
  std::unique_ptr<TapeRuns> tapes_;             // tapes the engine issues for waiting fibers
  std::map<std::uint64_t, Group> groups_seen_;  // ctx -> group, for reports
  Network network_{*this};
  Timers timer_events_{*this};
  /// What controller_step steps over, in the order that decides ties: fibers woken by
  /// whole passes, then by closed-form completions and messages decided now (MessageTiming)
  /// run before anything later; held messages enter the network before its transfers; at one
  /// time, the network's events come before timers, and timers before region marks.
  std::vector<EventSource*> sources_;
  SimTime last_work_;  // last_work()

  struct Failure {
    int rank;
    SimTime clock;
    std::string message;
    bool user_error;
  };
  std::vector<Failure> failures_;
};

}  // namespace cocodiff::emu::detail
