#pragma once
// Fiber stacks for one engine: fixed size, a guard page below each, reused across fibers so that
// the short-lived fibers of non-blocking collectives cost no mmap.
//
// AddressSanitizer does not see Boost.Context's stack switches (Debian's Boost is built with
// fcontext and no sanitizer hooks). Left alone it keeps the bounds of the thread's own stack
// while a fiber runs, so an exception thrown on a fiber stack cannot clear the redzones of the
// frames it unwinds (google/sanitizers#189), and the redzones of frames that never returned
// (a finished fiber's entry frames) stay poisoned when the stack, or its address range after
// munmap, is used again. Both give false stack-buffer-overflow reports. So every fiber learns
// its stack bounds when its stack is allocated and declares them to ASan whenever it (re)gains
// control (on_stack), and the pool clears a stack's shadow before reusing or unmapping it.
// Without ASan these calls compile to nothing.

#include <boost/context/stack_context.hpp>
#include <cstddef>
#include <mutex>
#include <vector>

namespace cocodiff::emu::detail {

/// The usable range of one stack (bottom = lowest address).
struct StackBounds {
  const void* bottom = nullptr;
  std::size_t size = 0;
};

/// Tells AddressSanitizer that the code now running is on `b`; a no-op without ASan, or when
/// `b` is empty.
void asan_on_stack(const StackBounds& b) noexcept;

/// The calling thread's own stack (empty without ASan: nothing needs it then).
StackBounds asan_thread_stack() noexcept;

class StackPool {
 public:
  explicit StackPool(std::size_t usable_bytes);
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  /// A stack; its usable range is written to `bounds` when that is not null.
  boost::context::stack_context allocate(StackBounds* bounds = nullptr);
  void deallocate(boost::context::stack_context& sctx) noexcept;
  std::size_t usable_bytes() const { return usable_; }

 private:
  std::size_t usable_;
  std::size_t mapped_;
  std::mutex mutex_;
  std::vector<void*> free_;  // base addresses (guard page first)
  std::vector<void*> all_;
};

/// The StackAllocator Boost.Fiber copies into each fiber: a borrowed pool, and where the fiber
/// keeps its stack bounds.
class PooledStack {
 public:
  PooledStack(StackPool& pool, StackBounds& bounds) : pool_(&pool), bounds_(&bounds) {}
  boost::context::stack_context allocate() { return pool_->allocate(bounds_); }
  void deallocate(boost::context::stack_context& sctx) noexcept { pool_->deallocate(sctx); }

 private:
  StackPool* pool_;
  StackBounds* bounds_;
};

}  // namespace cocodiff::emu::detail
