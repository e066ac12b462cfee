#pragma once
// Finished objects kept for their storage.

#include <cstddef>
#include <memory>
#include <vector>

namespace cocodiff::emu::detail {

/// Finished objects kept for their storage (their vectors keep their capacity), taken again
/// instead of allocated; at most 64 are kept.
template <typename T>
class Recycler {
 public:
  std::unique_ptr<T> take() {
    if (free_.empty()) return std::make_unique<T>();
    std::unique_ptr<T> t = std::move(free_.back());
    free_.pop_back();
    return t;
  }
  void give(std::unique_ptr<T> t) {
    if (free_.size() < kKept) free_.push_back(std::move(t));
  }

 private:
  static constexpr std::size_t kKept = 64;
  std::vector<std::unique_ptr<T>> free_;
};

}  // namespace cocodiff::emu::detail
