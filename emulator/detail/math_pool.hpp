#pragma once
// The math threads of one Engine run (EngineOptions::workers - 1 of them): they run the tiles'
// arithmetic (Communicator::run_math) while the tile fibers, which all live on the controller's
// thread, go on. A fiber hand-off never crosses threads, so the engine's bookkeeping costs what
// it costs on one worker; only arithmetic moves, and it gives the same bytes on any thread.
//
//   MathPool pool(workers - 1);        // threads start at the first run(), join when destroyed
//   pool.run(work, fiber.stack);       // from a tile fiber: returns once `work` has run
//
// A fiber queues its work, lets the other ready fibers run (they queue theirs), then runs its
// work itself unless a math thread has taken it meanwhile, in which case it waits for it while
// the other fibers run. With no math thread, run() is a plain call.

#include <boost/fiber/condition_variable.hpp>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "emulator/detail/scheduler.hpp"
#include "emulator/detail/stack_pool.hpp"

namespace cocodiff::emu::detail {

class MathPool {
 public:
  explicit MathPool(int threads);
  MathPool(const MathPool&) = delete;
  MathPool& operator=(const MathPool&) = delete;
  ~MathPool();

  /// Runs `work` on a math thread or on the caller's; returns once it has run and rethrows what
  /// it threw. Called from the fibers' thread only, by a fiber whose stack is `stack` (for
  /// ASan's stack bookkeeping).
  void run(const std::function<void()>& work, const StackBounds& stack);

 private:
  struct Task {
    const std::function<void()>* work = nullptr;
    bool started = false;  // taken by a math thread (or by its own fiber)
    bool done = false;
    std::exception_ptr error;
    boost::fibers::condition_variable_any cv;  // the waiting fiber's
  };
  void serve();

  std::mutex mutex_;
  std::condition_variable cv_;  // math threads wait here for tasks
  std::deque<Task*> queue_;     // tasks not yet taken, oldest first
  bool stop_ = false;
  ThreadWake idle_;  // the math threads' scheduler wake-up: they never run fibers
  int wanted_;       // math threads, started at the first run()
  std::vector<std::thread> threads_;
};

}  // namespace cocodiff::emu::detail
