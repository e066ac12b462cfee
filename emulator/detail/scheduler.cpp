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

ThreadQueueAlgorithm::ThreadQueueAlgorithm(ThreadWake& wake) : wake_(wake) {
#if defined(COCODIFF_TSAN)
  thread_fiber_ = __tsan_get_current_fiber();  // constructed on the thread's main context
#endif
}

void ThreadQueueAlgorithm::announce_switch([[maybe_unused]] context* next) noexcept {
#if defined(COCODIFF_TSAN)
  const auto pinned = boost::fibers::type::pinned_context;
  context* self = context::active();
  void* target = thread_fiber_;
  void* finished = nullptr;
  {
    std::lock_guard<std::mutex> lk(wake_.mutex);
    if (!next->is_context(pinned)) {
      auto [it, fresh] = wake_.tsan_fibers.try_emplace(next, nullptr);
      if (fresh) it->second = __tsan_create_fiber(0);
      target = it->second;
    }
    // A terminated fiber is linked into its scheduler's terminated queue before its last switch.
    if (!self->is_context(pinned) && self->terminated_is_linked()) {
      auto it = wake_.tsan_fibers.find(self);
      if (it != wake_.tsan_fibers.end()) {
        finished = it->second;
        wake_.tsan_fibers.erase(it);
      }
    }
  }
  if (target != __tsan_get_current_fiber()) __tsan_switch_to_fiber(target, 0);
  if (finished != nullptr) __tsan_destroy_fiber(finished);  // no longer the current fiber
#endif
}

void ThreadQueueAlgorithm::awakened(context* ctx) noexcept {
  ctx->ready_link(local_);  // always on ctx's own thread: nothing migrates
}

context* ThreadQueueAlgorithm::pick_next() noexcept {
  if (local_.empty()) return nullptr;
  context* ctx = &local_.front();
  local_.pop_front();
  announce_switch(ctx);
  return ctx;
}

bool ThreadQueueAlgorithm::has_ready_fibers() const noexcept { return !local_.empty(); }

void ThreadQueueAlgorithm::suspend_until(std::chrono::steady_clock::time_point const& tp) noexcept {
  std::unique_lock<std::mutex> lk(wake_.mutex);
  auto ready = [this] { return notified_; };
  if (tp == std::chrono::steady_clock::time_point::max())
    wake_.cv.wait(lk, ready);
  else
    wake_.cv.wait_until(lk, tp, ready);
  notified_ = false;
}

void ThreadQueueAlgorithm::notify() noexcept {
  // Called from other threads too: once the lock is released this algorithm's thread may wake,
  // finish and destroy it, so only the run's ThreadWake (which outlives every worker) is used
  // after.
  ThreadWake& wake = wake_;
  {
    std::lock_guard<std::mutex> lk(wake.mutex);
    notified_ = true;
  }
  wake.cv.notify_all();
}

}  // namespace cocodiff::emu::detail
