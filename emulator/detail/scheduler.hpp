#pragma once
// A Boost.Fiber scheduling algorithm whose ready queue belongs to one Engine run, shared by that
// run's worker threads (Boost's own shared_work keeps its queue in static storage, which would
// tie every engine of the process together). Tile fibers migrate freely between the workers;
// pinned contexts (each thread's main and dispatcher contexts) stay on their thread.
//
// ThreadSanitizer keeps a shadow call stack per thread and does not see Boost.Context's stack
// switches, so a fiber that enters functions on one worker and returns from them on another
// underflows the second thread's shadow stack. Under TSan every switch is therefore announced
// (__tsan_switch_to_fiber) in pick_next, which Boost calls right before each switch: a migrating
// fiber gets its own TSan fiber, created when first picked and destroyed once it has terminated;
// a thread's pinned contexts share the thread's own TSan fiber (their only unannounced switch,
// dispatcher to main at scheduler shutdown, is then no switch at all for TSan). Without TSan
// none of this is compiled.

#include <boost/fiber/algo/algorithm.hpp>
#include <boost/fiber/context.hpp>
#include <boost/fiber/scheduler.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace cocodiff::emu::detail {

/// The run's shared ready queue.
struct ReadyQueue {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<boost::fibers::context*> fibers;
  std::unordered_map<boost::fibers::context*, void*> tsan_fibers;  // only used under TSan
};

class SharedQueueAlgorithm final : public boost::fibers::algo::algorithm {
 public:
  explicit SharedQueueAlgorithm(ReadyQueue& queue);

  void awakened(boost::fibers::context* ctx) noexcept override;
  boost::fibers::context* pick_next() noexcept override;
  bool has_ready_fibers() const noexcept override;
  void suspend_until(std::chrono::steady_clock::time_point const& tp) noexcept override;
  void notify() noexcept override;

 private:
  void announce_switch(boost::fibers::context* next) noexcept;

  ReadyQueue& queue_;
  [[maybe_unused]] void* thread_fiber_ = nullptr;  // TSan's fiber for this thread's pinned contexts
  boost::fibers::scheduler::ready_queue_type local_;
  bool notified_ = false;  // guarded by queue_.mutex
};

}  // namespace cocodiff::emu::detail
