#include "emulator/detail/stack_pool.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <new>

#include "core/errors.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define COCODIFF_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COCODIFF_ASAN 1
#endif
#endif
#if defined(COCODIFF_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace cocodiff::emu::detail {

namespace {
std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

void asan_unpoison([[maybe_unused]] void* p, [[maybe_unused]] std::size_t n) noexcept {
#if defined(COCODIFF_ASAN)
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#endif
}
}  // namespace

void asan_on_stack([[maybe_unused]] const StackBounds& b) noexcept {
#if defined(COCODIFF_ASAN)
  if (b.size == 0) return;
  // A switch to the stack we are already on: ASan only records the new bounds (no fake stack
  // is kept: CI runs with detect_stack_use_after_return=0).
  __sanitizer_start_switch_fiber(nullptr, b.bottom, b.size);
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

StackBounds asan_thread_stack() noexcept {
  StackBounds b;
#if defined(COCODIFF_ASAN)
  pthread_attr_t attr;
  if (::pthread_getattr_np(::pthread_self(), &attr) != 0) return b;
  void* addr = nullptr;
  std::size_t size = 0;
  if (::pthread_attr_getstack(&attr, &addr, &size) == 0) b = {addr, size};
  ::pthread_attr_destroy(&attr);
#endif
  return b;
}

StackPool::StackPool(std::size_t usable_bytes) {
  const std::size_t page = page_size();
  usable_ = (usable_bytes + page - 1) / page * page;
  mapped_ = usable_ + page;
}

StackPool::~StackPool() {
  const std::size_t page = page_size();
  for (void* p : all_) {
    asan_unpoison(static_cast<char*>(p) + page, usable_);
    ::munmap(p, mapped_);
  }
}

boost::context::stack_context StackPool::allocate(StackBounds* bounds) {
  void* base = nullptr;
  {
    std::lock_guard<std::mutex> lk(mutex_);
    if (!free_.empty()) {
      base = free_.back();
      free_.pop_back();
    }
  }
  if (base == nullptr) {
    base = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw std::bad_alloc();
    COCO_CHECK(::mprotect(base, page_size(), PROT_NONE) == 0, "guard page");
    std::lock_guard<std::mutex> lk(mutex_);
    all_.push_back(base);
  }
  boost::context::stack_context sctx;
  sctx.size = mapped_;
  sctx.sp = static_cast<char*>(base) + mapped_;
  if (bounds != nullptr) *bounds = {static_cast<char*>(base) + page_size(), usable_};
  return sctx;
}

void StackPool::deallocate(boost::context::stack_context& sctx) noexcept {
  void* base = static_cast<char*>(sctx.sp) - sctx.size;
  asan_unpoison(static_cast<char*>(base) + page_size(), usable_);
  std::lock_guard<std::mutex> lk(mutex_);
  free_.push_back(base);
}

}  // namespace cocodiff::emu::detail
