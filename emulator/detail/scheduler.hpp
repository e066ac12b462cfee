#pragma once
// The Boost.Fiber scheduling algorithm of an Engine run's threads. Every tile fiber lives on the
// controller's thread and never leaves it (the other workers only run arithmetic, MathPool), so
// each thread keeps its ready fibers in a queue of its own, with no lock and no hand-over
// between threads. A fiber woken from another thread (a math thread that finished its work)
// reaches it through Boost's remote-ready queue, which calls awakened() on the fiber's own
// thread; the run's ThreadWake only carries that thread's wake-up (notify, suspend_until).
//
// ThreadSanitizer keeps a shadow call stack per thread and does not see Boost.Context's stack
// switches, so a fiber that enters functions, switches away and later returns from them would
// unbalance the thread's shadow stack. Under TSan every switch is therefore announced
// (__tsan_switch_to_fiber) in pick_next, which Boost calls right before each switch: a fiber
// gets its own TSan fiber, created when first picked and destroyed once it has terminated; a
// thread's pinned contexts share the thread's own TSan fiber (their only unannounced switch,
// dispatcher to main at scheduler shutdown, is then no switch at all for TSan). Without TSan
// none of this is compiled.

#include <boost/fiber/algo/algorithm.hpp>
#include <boost/fiber/context.hpp>
#include <boost/fiber/scheduler.hpp>
#include <condition_variable>
#include <mutex>
#include <unordered_map>

namespace cocodiff::emu::detail {

/// A thread's wake-up from other threads, shared with the threads that wake it.
struct ThreadWake {
  std::mutex mutex;
  std::condition_variable cv;
  std::unordered_map<boost::fibers::context*, void*> tsan_fibers;  // only used under TSan
};

class ThreadQueueAlgorithm final : public boost::fibers::algo::algorithm {
 public:
  explicit ThreadQueueAlgorithm(ThreadWake& wake);

  void awakened(boost::fibers::context* ctx) noexcept override;
  boost::fibers::context* pick_next() noexcept override;
  bool has_ready_fibers() const noexcept override;
  void suspend_until(std::chrono::steady_clock::time_point const& tp) noexcept override;
  void notify() noexcept override;

 private:
  void announce_switch(boost::fibers::context* next) noexcept;

  ThreadWake& wake_;
  [[maybe_unused]] void* thread_fiber_ = nullptr;  // TSan's fiber for this thread's pinned contexts
  boost::fibers::scheduler::ready_queue_type local_;
  bool notified_ = false;  // guarded by wake_.mutex
};

}  // namespace cocodiff::emu::detail
