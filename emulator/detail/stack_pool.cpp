#include "emulator/detail/stack_pool.hpp"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "core/errors.hpp"
#include "emulator/engine.hpp"

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

// vm.max_map_count: the most memory mappings one process may hold (0 when unknown).
std::int64_t max_map_count() {
  std::ifstream in("/proc/sys/vm/max_map_count");
  std::int64_t n = 0;
  return in >> n ? n : 0;
}

// The memory mappings this process holds now.
std::int64_t mappings_now() {
  std::ifstream in("/proc/self/maps");
  std::int64_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

std::string raise_hint() {
  return "raise it (sysctl -w vm.max_map_count=" + std::to_string(std::int64_t{1} << 20) +
         ", as root) or run fewer tiles";
}

std::string stack_error(const std::string& what, std::size_t stacks) {
  return "fiber stacks: cannot " + what + " stack " + std::to_string(stacks + 1) + " (" +
         std::strerror(errno) +
         "); the kernel allows a process vm.max_map_count = " + std::to_string(max_map_count()) +
         " memory mappings: " + raise_hint();
}

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
    if (base == MAP_FAILED) throw ResourceError(stack_error("map", all_.size()));
    if (::mprotect(base, page_size(), PROT_NONE) != 0) {
      ::munmap(base, mapped_);
      throw ResourceError(stack_error("protect the guard page of", all_.size()));
    }
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

namespace cocodiff::emu {

std::int64_t fiber_stack_mappings(int ranks) { return 4 * std::int64_t{ranks}; }

void check_fiber_stack_limit(int ranks) {
  static const std::int64_t limit = detail::max_map_count();  // read once a process
  if (limit <= 0) return;  // unknown: the pool reports a failed mapping itself
  const std::int64_t need = fiber_stack_mappings(ranks);
  // Far below the limit the process's own mappings cannot matter: no read of /proc/self/maps on
  // every run (calibrate and tune run thousands of small ones).
  if (need < limit / 4) return;
  const std::int64_t have = detail::mappings_now();
  constexpr std::int64_t kSpare = 4096;  // the heap's, the libraries' and the threads' mappings
  if (have + need + kSpare <= limit) return;
  throw ResourceError(std::to_string(ranks) + " tiles need about " + std::to_string(need) +
                      " memory mappings for their fiber stacks (a stack and its guard page for "
                      "each tile's two fibers), and this process holds " +
                      std::to_string(have) +
                      " already; the kernel allows a process "
                      "vm.max_map_count = " +
                      std::to_string(limit) + ": " + detail::raise_hint());
}

}  // namespace cocodiff::emu
