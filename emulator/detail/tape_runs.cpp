// TapeRuns: a played tape's calls issued by the engine for a fiber that waits once
// (Replay::play_tape).

#include "emulator/detail/tape_runs.hpp"

#include <exception>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

void TapeRuns::start(FiberState& f, TapeRun& run) {
  COCO_CHECK(f.is_main && f.tape_run == nullptr, "a tape run on a tile already running one");
  run.f = &f;
  ++runs_;
  if (run.advance()) return;
  std::unique_lock<NullLock> lk(k_.state_lock());
  f.tape_run = &run;
  // The run lives on this fiber's stack: it is detached however the wait ends (a tear-down
  // throws out of Kernel::block()).
  struct Detach {
    FiberState& f;
    ~Detach() { f.tape_run = nullptr; }
  } const detach{f};
  k_.block(f, lk, run.waiting.get(), false);  // woken when no call is left (run_ready)
  if (run.error) std::rethrow_exception(run.error);
}

bool TapeRuns::wait(TapeRun& run, const ReqPtr& req, bool pass) {
  FiberState& f = *run.f;
  if (req->done) {
    finish_wait(f, *req, pass, f.clock);
    return true;
  }
  run.waiting = req;
  run.pass = pass;
  run.before = f.clock;
  req->waiter = &f;
  // From the controller's side the fiber stays blocked: it now waits for this request (what
  // op_waits_alone and a deadlock report read).
  if (f.tape_run != nullptr) f.waiting_on = req.get();
  return false;
}

bool TapeRuns::run_ready() {
  if (ready_.empty()) return false;
  // Completions these calls cause may make more runs ready: the list grows while it is read.
  for (size_t i = 0; i < ready_.size(); ++i) {
    TapeRun& run = *ready_[i];
    FiberState& f = *run.f;
    const ReqPtr req = std::move(run.waiting);
    f.waiting_on = nullptr;  // issuing calls, as the fiber would be
    finish_wait(f, *req, run.pass, run.before);
    run.pass = false;
    bool done = true;
    try {
      done = run.advance();
    } catch (...) {
      run.error = std::current_exception();  // rethrown on the tile's fiber
    }
    if (done) k_.wake(f);
  }
  ready_.clear();
  return true;
}

void TapeRuns::finish_wait(FiberState& f, ReqState& req, bool pass, SimTime before) {
  if (pass)
    f.clock = req.done_time;  // a ring pass's charges and waits are on the tile's accounting
  else
    k_.finish_wait(f, req, before);
}

}  // namespace cocodiff::emu::detail
