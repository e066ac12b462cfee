#include "emulator/detail/scheduler.hpp"

#if defined(__SANITIZE_THREAD__)
#define COCODIFF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define COCODIFF_TSAN 1
#endif
#endif
#if defined(COCODIFF_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace cocodiff::emu::detail {

using boost::fibers::context;

SharedQueueAlgorithm::SharedQueueAlgorithm(ReadyQueue& queue) : queue_(queue) {
#if defined(COCODIFF_TSAN)
  thread_fiber_ = __tsan_get_current_fiber();  // constructed on the thread's main context
#endif
}

void SharedQueueAlgorithm::announce_switch([[maybe_unused]] context* next) noexcept {
#if defined(COCODIFF_TSAN)
  const auto pinned = boost::fibers::type::pinned_context;
  context* self = context::active();
  void* target = thread_fiber_;
  void* finished = nullptr;
  {
    std::lock_guard<std::mutex> lk(queue_.mutex);
    if (!next->is_context(pinned)) {
      auto [it, fresh] = queue_.tsan_fibers.try_emplace(next, nullptr);
      if (fresh) it->second = __tsan_create_fiber(0);
      target = it->second;
    }
    // A terminated fiber is linked into its scheduler's terminated queue before its last switch.
    if (!self->is_context(pinned) && self->terminated_is_linked()) {
      auto it = queue_.tsan_fibers.find(self);
      if (it != queue_.tsan_fibers.end()) {
        finished = it->second;
        queue_.tsan_fibers.erase(it);
      }
    }
  }
  if (target != __tsan_get_current_fiber()) __tsan_switch_to_fiber(target, 0);
  if (finished != nullptr) __tsan_destroy_fiber(finished);  // no longer the current fiber
#endif
}

void SharedQueueAlgorithm::awakened(context* ctx) noexcept {
  if (ctx->is_context(boost::fibers::type::pinned_context)) {
    ctx->ready_link(local_);
    return;
  }
  ctx->detach();
  {
    std::lock_guard<std::mutex> lk(queue_.mutex);
    queue_.fibers.push_back(ctx);
  }
  queue_.cv.notify_all();
}

context* SharedQueueAlgorithm::pick_next() noexcept {
  context* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lk(queue_.mutex);
    if (!queue_.fibers.empty()) {
      ctx = queue_.fibers.front();
      queue_.fibers.pop_front();
    }
  }
  if (ctx != nullptr) {
    context::active()->attach(ctx);
    announce_switch(ctx);
    return ctx;
  }
  if (!local_.empty()) {
    ctx = &local_.front();
    local_.pop_front();
    announce_switch(ctx);
  }
  return ctx;
}

bool SharedQueueAlgorithm::has_ready_fibers() const noexcept {
  if (!local_.empty()) return true;
  std::lock_guard<std::mutex> lk(queue_.mutex);
  return !queue_.fibers.empty();
}

void SharedQueueAlgorithm::suspend_until(std::chrono::steady_clock::time_point const& tp) noexcept {
  std::unique_lock<std::mutex> lk(queue_.mutex);
  auto ready = [this] { return notified_ || !queue_.fibers.empty(); };
  if (tp == std::chrono::steady_clock::time_point::max())
    queue_.cv.wait(lk, ready);
  else
    queue_.cv.wait_until(lk, tp, ready);
  notified_ = false;
}

void SharedQueueAlgorithm::notify() noexcept {
  // Called from other threads too: once the lock is released this algorithm's thread may wake,
  // finish and destroy it, so only the run's queue (which outlives every worker) is used after.
  ReadyQueue& queue = queue_;
  {
    std::lock_guard<std::mutex> lk(queue.mutex);
    notified_ = true;
  }
  queue.cv.notify_all();
}

}  // namespace cocodiff::emu::detail
