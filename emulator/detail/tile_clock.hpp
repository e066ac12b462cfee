#pragma once
// TileClock: one tile's timing beside its device clock (the tile fiber's FiberState::clock).
//   host            issues every op and collective call in program order; an op starts on the
//                   device no earlier than the host has issued it (host wait: the device idle)
//   compute stream  the device time of the tile's ops; the part issued while one of the tile's
//                   collectives is open runs slower (overlap) and is counted apart
//   comm stream     the tile's collectives in the order it started them, one after another (as
//                   NCCL runs a communicator's): one the network finished early still waits for
//                   the one before it on the stream
// Accounting charges ops through it, the kernel opens and closes collectives on it, region
// replay moves its host; its totals (compute, exposed communication, host wait) are the tile's
// breakdown in the run's result.
//
//   const SimTime start = clock.issue(f.clock, issue_cost);   // host first
//   clock.add_compute(dt);                                     // dt scaled where overlapping()
//   clock.open(req, f.clock, slot, slots);                     // a collective starts
//   ... req.penalty = clock.transfer_penalty(req, factor); clock.close(req);

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/sim_time.hpp"
#include "emulator/detail/request.hpp"

namespace cocodiff::emu::detail {

class TileClock {
 public:
  // ---- host ----
  /// The host issues a call that costs it `cost`: returns when the device may start it, `ready`
  /// (the device's clock) or, when the host issues it later, then (the difference is host wait).
  SimTime issue(SimTime ready, SimTime cost) {
    host_ += cost;
    if (host_ <= ready) return ready;
    host_wait_ += host_ - ready;
    return host_;
  }
  /// The host blocks until its device has caught up: it issues nothing before `clock`.
  void block_host(SimTime clock) { host_ = std::max(host_, clock); }
  /// When the host has issued everything the tile ran so far.
  SimTime host() const { return host_; }
  /// Moves the host where simulating a replayed region would have taken it.
  void set_host(SimTime t) { host_ = t; }

  // ---- compute stream ----
  /// Whether one of the tile's collectives is open: compute issued now overlaps it.
  bool overlapping() const { return open_collectives_ > 0; }
  /// Open collectives by overlap slot (Accounting::overlap_slot); empty without slots.
  const std::vector<int>& open_by_slot() const { return open_by_slot_; }
  /// An op's device time `dt` (already slowed where overlapping()).
  void add_compute(SimTime dt) {
    compute_ += dt;
    if (open_collectives_ > 0) overlapped_compute_ += dt;
  }

  // ---- communication stream ----
  /// Collective `req` starts at `clock`, next on the stream, in overlap slot req.overlap_slot
  /// (-1: none) of `slots`.
  void open(ReqState& req, SimTime clock, std::size_t slots) {
    req.open = true;
    req.started = clock;
    req.overlap_mark = overlapped_compute_;
    req.stream_seq = ++stream_started_;
    if (req.overlap_slot >= 0) {
      if (open_by_slot_.empty()) open_by_slot_.assign(slots, 0);
      ++open_by_slot_[static_cast<std::size_t>(req.overlap_slot)];
    }
    ++open_collectives_;
  }
  /// The extra time open collective `req` takes, now complete: its transfer beside this tile's
  /// compute runs `factor` times slower (DeviceModel::overlap_transfer_factor), and when the
  /// collective before it on the stream ended later than the network finished it, req's own
  /// transfer (from its start, or that collective's network end if later) starts only then.
  SimTime transfer_penalty(const ReqState& req, double factor) const {
    if (factor == 1.0 && stream_end_ == stream_net_end_) return SimTime{};
    const bool held = req.stream_seq > stream_closed_ && stream_end_ > req.started;
    const SimTime from = held ? std::min(std::max(req.started, stream_net_end_), req.done_time)
                              : std::min(req.started, req.done_time);
    // The part of its own transfer that ran beside compute: at most the compute issued while
    // it was open, at most the transfer's span.
    const SimTime overlapped =
        std::min(overlapped_compute_ - req.overlap_mark, req.done_time - from);
    const SimTime own =
        SimTime::from_ns(std::llround(static_cast<double>(overlapped.ns()) * (factor - 1.0)));
    if (!held) return own;
    const SimTime carried = stream_end_ + (req.done_time - from);
    return std::max(carried, req.done_time) - req.done_time + own;
  }
  /// Its owner has seen `req` complete (with req.penalty): off the stream.
  void close(ReqState& req) {
    if (!req.open) return;
    req.open = false;
    --open_collectives_;
    if (req.overlap_slot >= 0) --open_by_slot_[static_cast<std::size_t>(req.overlap_slot)];
    if (req.stream_seq > stream_closed_) {
      stream_closed_ = req.stream_seq;
      stream_net_end_ = req.done_time;
      stream_end_ = req.done_time + req.penalty;
    }
  }
  int open_collectives() const { return open_collectives_; }
  int open_p2p() const { return open_p2p_; }
  /// A point-to-point request of the tile was posted / completed.
  void p2p_posted() { ++open_p2p_; }
  void p2p_done() { --open_p2p_; }
  /// No collective and no point-to-point request of the tile is open: the tile has no flow in
  /// the network, and none can start before it posts again.
  bool nothing_open() const { return open_p2p_ == 0 && open_collectives_ == 0; }
  /// The device waited `dt` for communication.
  void expose(SimTime dt) { exposed_ += dt; }

  // ---- totals ----
  SimTime compute() const { return compute_; }
  SimTime exposed() const { return exposed_; }
  SimTime host_wait() const { return host_wait_; }
  /// Adds a replayed region's totals.
  void add_totals(SimTime compute, SimTime exposed, SimTime host_wait) {
    compute_ += compute;
    exposed_ += exposed;
    host_wait_ += host_wait;
  }

 private:
  SimTime host_, host_wait_;
  SimTime compute_, overlapped_compute_;
  SimTime exposed_;
  int open_collectives_ = 0;
  int open_p2p_ = 0;
  std::vector<int> open_by_slot_;
  // The stream: collectives started, the latest closed (number stream_closed_), which the
  // network finished at stream_net_end_ and the stream at stream_end_.
  std::uint64_t stream_started_ = 0, stream_closed_ = 0;
  SimTime stream_net_end_, stream_end_;
};

}  // namespace cocodiff::emu::detail
