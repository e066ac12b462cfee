#pragma once
// A fiber's state as the kernel sees it (a tile's main fiber, or one progressing a collective),
// and the lock that stands where the kernel's state would be locked.

#include <boost/fiber/context.hpp>
#include <cstdint>
#include <string>

#include "core/sim_time.hpp"
#include "emulator/detail/stack_pool.hpp"

namespace cocodiff::emu {
class EmuTape;
}  // namespace cocodiff::emu

namespace cocodiff::emu::detail {

/// Stands where a lock would be, and locks nothing: every fiber of a run and the controller
/// share one thread, so nothing contends for the kernel's state. It marks the sections that use
/// that state, and is what the fibers' condition variables wait with. ThreadSanitizer runs
/// (several workers) would report a thread other than the controller's touching the state.
class NullLock {
 public:
  void lock() noexcept {}
  void unlock() noexcept {}
  bool try_lock() noexcept { return true; }
};

/// Thrown inside fibers when the run is being torn down; caught at the fiber's entry.
struct Cancelled {};

/// One fiber: a tile's main fiber, or a fiber progressing one non-blocking collective.
struct FiberState {
  int rank = 0;
  bool is_main = true;
  SimTime clock;
  /// The fiber's Boost.Fiber context while it is blocked (Kernel::block): Kernel::wake hands
  /// it to the scheduler. Every fiber runs on one thread, so no lock or wait queue is needed.
  boost::fibers::context* ctx = nullptr;
  bool wake = false;
  bool blocked = false;
  std::size_t blocked_index = 0;                // position in Kernel::blocked_list_
  const struct ReqState* waiting_on = nullptr;  // for deadlock reports
  bool waiting_in_test = false;
  bool replayed = false;  // set by the controller when it replays the region this fiber enters
  std::uint64_t region_id = 0;
  /// Inside a replayed span (Replay::begin_span), or a region replayed from the tile's arrival
  /// (Replay::pass_region): the tile's calls are free until its end.
  bool skipping = false;
  bool skipping_region = false;  // the region's: its next mark ends it
  /// A mark the tile has passed and not yet arrived at (RegionReplay::begin): it arrives there
  /// at its next call that is not a compute charge, at its next mark or at its end. -1: none.
  /// With it, what it passed there (a span's or a region's, key, may_skip, next).
  int pending_span = -1;
  bool pending_is_span = false;
  bool pending_may_skip = false;
  std::string pending_key, pending_next;
  EmuTape* tape = nullptr;  // a tile's main fiber: the calls being recorded (begin_tape), or none
  struct TapeRun* tape_run = nullptr;  // blocked in Kernel::run_tape: the calls the engine issues
  StackBounds stack;                   // set when the fiber's stack is allocated
};

}  // namespace cocodiff::emu::detail
