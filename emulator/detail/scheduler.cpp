#include "emulator/detail/scheduler.hpp"

namespace cocodiff::emu::detail {

using boost::fibers::context;

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
    return ctx;
  }
  if (!local_.empty()) {
    ctx = &local_.front();
    local_.pop_front();
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
  {
    std::lock_guard<std::mutex> lk(queue_.mutex);
    notified_ = true;
  }
  queue_.cv.notify_all();
}

}  // namespace cocodiff::emu::detail
