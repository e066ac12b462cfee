#include "emulator/detail/math_pool.hpp"

#include <algorithm>
#include <boost/fiber/operations.hpp>

namespace cocodiff::emu::detail {

MathPool::MathPool(int threads) : wanted_(threads) {}

MathPool::~MathPool() {
  {
    const std::lock_guard<std::mutex> lk(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void MathPool::serve() {
  // The thread's fiber scheduler is the engine's (its switches are announced to TSan); it is
  // only used to wake fibers of the controller's thread.
  boost::fibers::use_scheduling_algorithm<ThreadQueueAlgorithm>(idle_);
  std::unique_lock<std::mutex> lk(mutex_);
  while (true) {
    cv_.wait(lk, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stop_, and nothing left
    Task* t = queue_.front();
    queue_.pop_front();
    t->started = true;
    lk.unlock();
    try {
      (*t->work)();
    } catch (...) {
      t->error = std::current_exception();
    }
    lk.lock();
    t->done = true;
    // Under the lock: the woken fiber cannot return (and destroy *t) before it is released.
    t->cv.notify_one();
  }
}

void MathPool::run(const std::function<void()>& work, const StackBounds& stack) {
  if (wanted_ <= 0) {
    work();
    return;
  }
  // Started on first use: a run without arithmetic to hand over (phantom) starts none.
  while (static_cast<int>(threads_.size()) < wanted_) threads_.emplace_back([this] { serve(); });
  Task t;
  t.work = &work;
  {
    const std::lock_guard<std::mutex> lk(mutex_);
    queue_.push_back(&t);
  }
  cv_.notify_one();
  // Let the other ready tiles queue their work too, so that the math threads have some.
  boost::this_fiber::yield();
  asan_on_stack(stack);
  std::unique_lock<std::mutex> lk(mutex_);
  if (!t.started) {  // no math thread took it: run it here
    queue_.erase(std::find(queue_.begin(), queue_.end(), &t));
    t.started = true;
    lk.unlock();
    work();
    return;
  }
  t.cv.wait(lk, [&t] { return t.done; });
  asan_on_stack(stack);
  lk.unlock();
  if (t.error) std::rethrow_exception(t.error);
}

}  // namespace cocodiff::emu::detail
