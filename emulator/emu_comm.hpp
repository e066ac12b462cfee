#pragma once
// core::Communicator on the emulator: one object per (tile, group), used by that tile's main
// fiber. A collective is a schedule (emulator/collectives/) that the engine runs at the
// collective level, or message by message on a short-lived fiber per call
// (EngineOptions::collective_ops false), so a non-blocking collective
// progresses while the tile computes.

#include <array>
#include <cmath>
#include <memory>
#include <optional>

#include "core/communicator.hpp"
#include "core/replay.hpp"
#include "emulator/detail/kernel.hpp"

namespace cocodiff::emu {

class EmuComm;

/// One call of a tile's tape (Replay::begin_tape): what it was called on and with.
struct TapeCall {
  enum class Kind : std::uint8_t {
    kCompute,
    kAllToAll,
    kAllToAllv,
    kAllGather,
    kAllReduce,
    kSend,
    kRecv,
    kRingPass,
    kWait
  };
  Kind kind = Kind::kCompute;
  EmuComm* comm = nullptr;
  int req = -1;  // the request the call starts, or the one it waits for (index in the tape)
  std::int64_t count = 0;
  int peer = 0, tag = 0;
  ReduceOp op = ReduceOp::kSum;
  SimTime dt;  // kCompute: the device's time for the cost, whose event `label` names
  OpKind op_kind = OpKind::kElementwise;    // kCompute: the cost's kind
  KernelClass kernel = KernelClass::kNone;  // kCompute: the cost's kernel class (host issue)
  std::string_view label;                   // Kernel::keep_label's copy
  std::string_view call;  // collectives: the call as mismatch checks and reports name it (kept)
  const collectives::Schedule* schedule = nullptr;  // all-to-all, all-gather: the one chosen
  std::unique_ptr<AllToAllvLayout> layout;          // kAllToAllv (the request reads it until done)
  std::unique_ptr<RingPass> pass;                   // kRingPass, its labels Kernel::keep_label's
  detail::PassRows pass_rows;  // kRingPass: its rows kept for the run (Kernel::pass_costs)
};

/// A tile's recorded calls, issued again by EmuComm::play_tape.
class EmuTape final : public Replay::CallTape {
 public:
  std::vector<TapeCall> calls;
  int requests = 0;          // requests the calls start
  std::vector<char> waited;  // per request: waited for within the recording
  /// Every call is one the engine can issue for the tile (Kernel::run_tape): no all-reduce (a
  /// collective fiber runs it), no ring pass of one member (it runs message by message).
  bool engine_runs = true;
  bool usable = true;  // false: see Replay::end_tape
};

class EmuComm final : public Communicator, public Replay {
 public:
  EmuComm(detail::Kernel& kernel, detail::FiberState& self, detail::Group group, int group_rank);

  int rank() const override { return group_rank_; }
  int size() const override { return static_cast<int>(group_->members.size()); }
  const Topology& topology() const override { return kernel_.topology(); }
  int world_rank(int group_rank) const override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void barrier() override;
  void compute(const OpCost& cost) override;
  bool host_reference() const override;
  SimTime now() const override { return self_.clock; }
  void run_math(const std::function<void()>& work) override;
  /// World communicator only (sub-groups return {}): see Replay::begin_region.
  RegionMark begin_region(std::string_view key, bool may_skip) override;
  /// World communicator only (sub-groups return {}): see Replay::pass_region.
  RegionMark pass_region(std::string_view key, bool may_skip, std::string_view next) override;
  /// World communicator only (sub-groups return {}): see Replay::passed_answer.
  RegionMark passed_answer() override;
  /// World communicator only (nothing on sub-groups): see Replay::begin_span.
  void begin_span(std::string_view key, bool may_skip, std::string_view next) override;
  /// The tile's calls on all of its communicators (the main fiber's): see begin_tape.
  bool begin_tape() override;
  std::unique_ptr<CallTape> end_tape() override;
  void play_tape(const CallTape& tape) override;

 protected:
  Request do_iall_to_all(std::span<const float> send, std::span<float> recv, std::int64_t count,
                         std::string_view label) override;
  Request do_iall_to_allv(std::span<const float> send, std::span<float> recv,
                          const AllToAllvLayout& layout, std::string_view label) override;
  Request do_iall_gather(std::span<const float> send, std::span<float> recv, std::int64_t count,
                         std::string_view label) override;
  Request do_iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                         std::string_view label) override;
  Request do_isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                   std::string_view label) override;
  Request do_irecv(std::span<float> data, std::int64_t count, int source, int tag,
                   std::string_view label) override;
  /// At the collective level (Kernel::ring_pass) when EngineOptions::collective_ops, else
  /// message by message.
  void do_ring_pass(const RingPass& pass) override;

 private:
  struct PlayRun;
  /// Issues tape `t`'s calls from `pc` on. Without `run`, on the tile's fiber, waiting where the
  /// calls wait (returns true). With it, for Kernel::run_tape: returns false at the first wait
  /// that is not over (pc then names the next call), true when none is left.
  bool issue_calls(const EmuTape& t, std::size_t& pc, std::vector<detail::ReqPtr>& reqs,
                   detail::TapeRun* run);
  /// A ring pass at the collective level, not waited for (a tape the engine issues).
  detail::ReqPtr start_ring_pass(const RingPass& pass, detail::PassRows kept);

  /// The request handed to the caller; while a tape records, it is the tape's next request.
  Request request(detail::ReqPtr state);
  /// Appends a call of `kind` to the tape being recorded, if any (a buffer with data spoils the
  /// tape), and returns it to be completed; null when no tape records.
  TapeCall* record(TapeCall::Kind kind, std::int64_t count, std::string_view label,
                   std::span<const float> a = {}, std::span<const float> b = {});
  /// Something a tape cannot issue again happened while one records.
  void spoil_tape();
  /// Every call but a compute charge starts here: the tile first arrives at the span mark it
  /// passed, if any (Kernel::arrive). Inside a replayed span (Replay::begin_span) the tile's
  /// calls are free: true, and the call returns at once (its buffers must be sizes only).
  bool skipped(std::span<const float> a = {}, std::span<const float> b = {});

  /// Registers the call for mismatch checks and runs `spec`, whatever its schedule (all-to-all,
  /// all-gather, all-reduce, barrier), at the collective level (EngineOptions::collective_ops)
  /// or message by message on a collective fiber (collectives::run_on_fiber).
  detail::ReqPtr start_collective(std::string_view call, std::string_view label,
                                  const detail::CollectiveSpec& spec);
  /// The schedules this group runs, made once for the group (Kernel::group_schedule).
  const collectives::Schedule* schedule(collectives::AlgorithmId a);
  /// The library's all-to-all for this size (choose_all_to_all), as Kernel::algorithms holds it.
  collectives::AlgorithmId all_to_all_algorithm(std::int64_t wire_bytes_per_peer) const;
  // The collectives as do_* and play_tape issue them; `call` is kept for the run.
  /// An all-to-all or all-gather of `count` elements per member, by `schedule`.
  detail::ReqPtr issue_uniform(const collectives::Schedule* schedule, std::span<const float> send,
                               std::span<float> recv, std::int64_t count, std::string_view label,
                               std::string_view call);
  detail::ReqPtr issue_all_to_allv(std::span<const float> send, std::span<float> recv,
                                   const AllToAllvLayout& layout, std::string_view label);
  detail::ReqPtr issue_all_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                                  std::string_view label, std::string_view call);
  /// `opening` ("all_to_all(") then "count=N)", kept for the run.
  std::string_view call_text(std::string_view opening, std::int64_t count);

  detail::Kernel& kernel_;
  detail::FiberState& self_;
  std::shared_ptr<const detail::Group> group_;  // shared with in-flight collective fibers
  int group_rank_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_pass_ = 0;         // ring passes started on this group
  std::unique_ptr<EmuTape> recording_;  // begin_tape on this communicator: the tape
  std::vector<const collectives::Schedule*> schedules_;  // by algorithm id, filled as asked
};

/// What a collective algorithm sees: one fiber's point-to-point view of one group, with tags
/// private to one collective call.
struct Port {
  detail::Kernel& kernel;
  detail::FiberState& fiber;
  const detail::Group& group;
  int me;             // group rank
  std::uint64_t seq;  // the collective's sequence number on this group
  std::string_view label;
  int wire_round = 0;

  int rank() const { return me; }
  int size() const { return static_cast<int>(group.members.size()); }
  /// Non-blocking point-to-point inside the collective; `step` tells messages of one peer pair
  /// apart (the round number of the algorithm).
  detail::ReqPtr isend(std::span<const float> data, std::int64_t count, int peer, int step);
  detail::ReqPtr irecv(std::span<float> data, std::int64_t count, int peer, int step);
  void wait(const detail::ReqPtr& r) { kernel.wait(fiber, *r); }
  /// The collective library's software costs (free unless the cluster names a library).
  const LibraryModel& library() const { return kernel.options().library; }
  /// Wire bytes of `count` fp32 elements.
  std::int64_t wire_bytes(std::int64_t count) const { return kernel.wire_bytes(count); }
  /// The library's per-call software time, and its time on `local` elements of this member's
  /// own block (Schedule::local_elements), spent by this fiber before its first message.
  void charge_call(std::int64_t local) {
    fiber.clock += library().call_overhead + local_copy_time(library(), wire_bytes(local));
  }
  /// The software time the sender spends on a message of `count` elements before posting it.
  void charge_message(std::int64_t count) {
    fiber.clock += message_software_time(library(), wire_bytes(count));
  }
};

/// Sub-span helper that keeps phantom (empty) buffers empty.
template <typename T>
std::span<T> sub(std::span<T> s, std::int64_t offset, std::int64_t count) {
  if (s.empty()) return s;
  return s.subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(count));
}

}  // namespace cocodiff::emu
