#pragma once
// What the emulated tiles of one process share read-only when they do real math: weights packed
// once for the GEMM kernel. Every tile of a sequence-parallel run projects its thin shard (a few
// rows) through the same weights; Eigen would repack the whole weight for each such product.
// The cache packs each weight once and runs Eigen's own kernel on the packed panels with Eigen's
// own blocking, so every product gives exactly the bytes Eigen's would.
//
//   const Weights& w = ...;                         // owns the cache
//   const Exec ex{comm, false, &w.math_cache()};    // linear() then uses it for thin products
//
// Thread-safe (tiles may run on several worker threads); borrowed through Exec.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "core/tensor.hpp"

namespace cocodiff::dit {

class MathCache {
 public:
  /// Products with fewer rows than this use packed weights (above it Eigen's own packing is a
  /// small share of the product's work and the packed copy would only cost memory).
  static constexpr std::int64_t kMaxPackedRows = 64;

  MathCache();
  MathCache(const MathCache&) = delete;
  MathCache& operator=(const MathCache&) = delete;
  ~MathCache();

  /// Marks `w` as a weight that lives as long as this cache (only those are packed).
  void adopt(const Tensor& w);

  /// y = x W[r0 : r0 + out]^T, bitwise equal to Eigen's `y.noalias() = x * W.middleRows(r0,
  /// out).transpose()`. Returns false (y untouched) when the product is not one the cache serves:
  /// W not adopted, or x with a single row, too many rows, or a size Eigen computes lazily.
  /// y: [x.rows(), out], zero on entry.
  bool multiply(const Mat& x, const Tensor& w, std::int64_t r0, std::int64_t out, Mat& y);

  /// Packed floats held, for tests and reports.
  std::int64_t packed_floats() const;

 private:
  // The lhs blocks of one weight row range for one (mc, kc) blocking, in Eigen's loop order
  // (i2 outer, k2 inner), block b at offsets[b] in data.
  struct Packed {
    std::vector<float, Eigen::aligned_allocator<float>> data;
    std::vector<std::int64_t> offsets;
  };
  using Key = std::tuple<const Tensor*, std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
  const Packed& packed(const Tensor& w, std::int64_t r0, std::int64_t out, std::int64_t mc,
                       std::int64_t kc);

  mutable std::mutex mu_;
  std::unordered_set<const Tensor*> adopted_;
  std::map<Key, std::unique_ptr<Packed>> packs_;
};

}  // namespace cocodiff::dit
