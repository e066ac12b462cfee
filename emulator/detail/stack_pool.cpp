#include "emulator/detail/stack_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <new>

#include "core/errors.hpp"

namespace cocodiff::emu::detail {

namespace {
std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }
}  // namespace

StackPool::StackPool(std::size_t usable_bytes) {
  const std::size_t page = page_size();
  usable_ = (usable_bytes + page - 1) / page * page;
  mapped_ = usable_ + page;
}

StackPool::~StackPool() {
  for (void* p : all_) ::munmap(p, mapped_);
}

boost::context::stack_context StackPool::allocate() {
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
  return sctx;
}

void StackPool::deallocate(boost::context::stack_context& sctx) noexcept {
  void* base = static_cast<char*>(sctx.sp) - sctx.size;
  std::lock_guard<std::mutex> lk(mutex_);
  free_.push_back(base);
}

}  // namespace cocodiff::emu::detail
