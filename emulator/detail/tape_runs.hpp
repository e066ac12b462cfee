#pragma once
// Tape runs (Replay::play_tape): a played tape's calls issued by the engine for a tile whose
// fiber waits once, instead of the fiber waking at every wait: from the fiber until the first
// wait that is not over, then from the controller as the requests it waits for complete, at the
// same virtual times.

#include <cstdint>
#include <vector>

#include "emulator/detail/kernel.hpp"

namespace cocodiff::emu::detail {

class TapeRuns {
 public:
  explicit TapeRuns(Kernel& k) : k_(k) {}

  /// Issues `run`'s calls for f's tile: from f until the first wait that is not over, then from
  /// the controller as the requests it waits for complete, as f would after each wakes it (the
  /// same calls at the same virtual times); f is woken once, when none is left. Saves a fiber
  /// switch per wait.
  void start(FiberState& f, TapeRun& run);
  /// In TapeRun::advance: a wait for `req`. True when it is over (the tile's accounting done, as
  /// wait() does); false when the run must wait for it.
  bool wait(TapeRun& run, const ReqPtr& req, bool pass);
  /// The request `run` waits for completed: the controller advances it next (run_ready).
  void ready(TapeRun* run) { ready_.push_back(run); }
  /// Advances the tape runs whose request completed. Returns false when none was.
  bool run_ready();
  /// Tear-down: no run is advanced any more.
  void drop_ready() { ready_.clear(); }
  /// A tile issued recorded calls again (EmuComm::play_tape).
  void played() { ++played_; }
  std::uint64_t played_count() const { return played_; }
  /// start() calls so far (RunResult::tapes_run_by_engine).
  std::uint64_t run_count() const { return runs_; }

 private:
  /// A tape run's wait once req is over: Kernel::finish_wait, or for a ring pass (`pass`) the
  /// clock catching up with its end.
  void finish_wait(FiberState& f, ReqState& req, bool pass, SimTime before);

  Kernel& k_;
  std::vector<TapeRun*> ready_;
  std::uint64_t played_ = 0;
  std::uint64_t runs_ = 0;
};

}  // namespace cocodiff::emu::detail
