#pragma once
// What the emulated tiles of one process share read-only when they do real math:
//  - weights packed once for the GEMM kernel. Every tile of a sequence-parallel run projects its
//    thin shard (a few rows) through the same weights; Eigen would repack the whole weight for
//    each such product. The cache packs each weight once and runs Eigen's own kernel on the
//    packed panels with Eigen's own blocking, so every product gives exactly Eigen's bytes;
//  - work that is identical on every tile (timestep and text embeddings, adaLN modulation, the
//    replicated text stream): the first tile computes it, every later tile with bitwise equal
//    inputs receives a copy of the outputs and is charged the same operations, in the same
//    order, on its own clock, so its virtual timeline is what computing them would have given.
//
//   const Weights& w = ...;                         // owns the cache
//   const Exec ex{comm, false, &w.math_cache()};    // linear() then uses it for thin products
//   std::vector<Tensor> m = shared_work(ex, "block0.mod", {&c_silu}, [&](const Exec& e) {
//     return modulation(e, w, "block0.mod", c_silu, 6); });
//
// Thread-safe (tiles may run on several worker threads); borrowed through Exec.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "core/tensor.hpp"
#include "dit/exec.hpp"

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
  /// y: [x.rows(), out] (its values on entry are overwritten).
  bool multiply(const Mat& x, const Tensor& w, std::int64_t r0, std::int64_t out, Mat& y);

  /// Packed floats held, for tests and reports.
  std::int64_t packed_floats() const;

  /// Computations of shared work run, and handed out again (for tests and reports).
  std::int64_t shared_computed() const;
  std::int64_t shared_reused() const;

  using SharedFn = std::function<std::vector<Tensor>(const Exec&)>;
  /// The outputs of `fn` on this tile: a copy of those an earlier call of `unit` produced from
  /// bitwise equal inputs (their charges replayed on ex's clock), else fn's own (then kept).
  /// `fn` must be a pure function of `inputs` (and of the weights) that only charges compute.
  std::vector<Tensor> shared(const Exec& ex, const std::string& unit,
                             std::initializer_list<const Tensor*> inputs, const SharedFn& fn);

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

  // One earlier result of a shared unit.
  struct Result {
    std::uint64_t hash = 0;
    std::vector<Mat> inputs;
    std::vector<Tensor> outputs;
    std::vector<RecordedCharge> charges;
  };
  // Results kept per unit: enough for the distinct inputs tiles hold at one time (two CFG
  // passes, groups of tiles whose replicated tensors differ in their last bits).
  static constexpr size_t kResultsPerUnit = 8;

  mutable std::mutex mu_;
  std::unordered_set<const Tensor*> adopted_;
  std::map<Key, std::unique_ptr<Packed>> packs_;
  std::map<std::string, std::vector<std::shared_ptr<const Result>>, std::less<>> results_;
  std::map<std::string, size_t, std::less<>> next_slot_;
  std::int64_t computed_ = 0;
  std::int64_t reused_ = 0;
};

/// MathCache::shared through ex's cache, or fn(ex) when there is none (or in phantom mode).
std::vector<Tensor> shared_work(const Exec& ex, const std::string& unit,
                                std::initializer_list<const Tensor*> inputs,
                                const MathCache::SharedFn& fn);

}  // namespace cocodiff::dit
