#pragma once
// A Boost.Fiber scheduling algorithm whose ready queue belongs to one Engine run, shared by that
// run's worker threads (Boost's own shared_work keeps its queue in static storage, which would
// tie every engine of the process together). Tile fibers migrate freely between the workers;
// pinned contexts (each thread's main and dispatcher contexts) stay on their thread.

#include <boost/fiber/algo/algorithm.hpp>
#include <boost/fiber/context.hpp>
#include <boost/fiber/scheduler.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>

namespace cocodiff::emu::detail {

/// The run's shared ready queue.
struct ReadyQueue {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<boost::fibers::context*> fibers;
};

class SharedQueueAlgorithm final : public boost::fibers::algo::algorithm {
 public:
  explicit SharedQueueAlgorithm(ReadyQueue& queue) : queue_(queue) {}

  void awakened(boost::fibers::context* ctx) noexcept override;
  boost::fibers::context* pick_next() noexcept override;
  bool has_ready_fibers() const noexcept override;
  void suspend_until(std::chrono::steady_clock::time_point const& tp) noexcept override;
  void notify() noexcept override;

 private:
  ReadyQueue& queue_;
  boost::fibers::scheduler::ready_queue_type local_;
  bool notified_ = false;  // guarded by queue_.mutex
};

}  // namespace cocodiff::emu::detail
