#pragma once
// Fiber stacks for one engine: fixed size, a guard page below each, reused across fibers so that
// the short-lived fibers of non-blocking collectives cost no mmap.

#include <boost/context/stack_context.hpp>
#include <cstddef>
#include <mutex>
#include <vector>

namespace cocodiff::emu::detail {

class StackPool {
 public:
  explicit StackPool(std::size_t usable_bytes);
  ~StackPool();
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;

  boost::context::stack_context allocate();
  void deallocate(boost::context::stack_context& sctx) noexcept;
  std::size_t usable_bytes() const { return usable_; }

 private:
  std::size_t usable_;
  std::size_t mapped_;
  std::mutex mutex_;
  std::vector<void*> free_;  // base addresses (guard page first)
  std::vector<void*> all_;
};

/// The StackAllocator Boost.Fiber copies into each fiber: a borrowed pool.
class PooledStack {
 public:
  explicit PooledStack(StackPool& pool) : pool_(&pool) {}
  boost::context::stack_context allocate() { return pool_->allocate(); }
  void deallocate(boost::context::stack_context& sctx) noexcept { pool_->deallocate(sctx); }

 private:
  StackPool* pool_;
};

}  // namespace cocodiff::emu::detail
