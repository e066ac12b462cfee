#pragma once
// Model weights by upstream tensor name. Created once per run (seeded random init or a
// safetensors checkpoint) and shared read-only by every rank: all emulated ranks live in one
// process, so ranks hold a `std::shared_ptr<const Weights>`. Phantom weights hold shapes only.
//
//   std::vector<TensorSpec> specs = make_model(model_cfg)->tensor_specs();  // dit/model.hpp
//   std::shared_ptr<const Weights> w = init_weights(specs, /*seed=*/42, /*phantom=*/false);
//   const Tensor& qkv = w->get("blocks.0.attn.qkv.weight");    // [3456, 1152]

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor.hpp"
#include "dit/math_cache.hpp"

namespace cocodiff::dit {

/// How a tensor is initialised when no checkpoint is given.
enum class InitKind : std::uint8_t {
  kLinear,     // N(0, 1/fan_in): keeps activations near unit variance through a projection
  kBias,       // N(0, 0.02^2)
  kNorm,       // 1 + N(0, 0.1^2): a norm's scale, near identity
  kEmbedding,  // N(0, 1): lookup tables
};

/// One tensor of a model: its upstream name and shape. 2-D view: [shape[0], prod(shape[1:])];
/// a 1-D tensor is viewed as [1, shape[0]].
struct TensorSpec {
  std::string name;
  std::vector<std::int64_t> shape;
  InitKind init = InitKind::kLinear;
  std::int64_t rows() const;
  std::int64_t cols() const;
  std::int64_t numel() const { return rows() * cols(); }
  std::string shape_str() const;
};

class Weights {
 public:
  explicit Weights(bool phantom) : phantom_(phantom), cache_(std::make_unique<MathCache>()) {}
  /// Adds a tensor (shape must match spec's 2-D view).
  void add(const TensorSpec& spec, Tensor t);
  /// The tensor of that name; aborts if absent (a model asking for a tensor it never declared).
  const Tensor& get(std::string_view name) const;
  const Tensor* find(std::string_view name) const;
  const TensorSpec& spec(std::string_view name) const;
  bool phantom() const { return phantom_; }
  std::size_t size() const { return tensors_.size(); }
  /// Total parameters.
  std::int64_t parameters() const;
  /// Names in sorted order.
  std::vector<std::string> names() const;
  /// What the tiles computing with these weights share (packed weights); lives as long as they.
  MathCache& math_cache() const { return *cache_; }

 private:
  struct Entry {
    TensorSpec spec;
    Tensor tensor;
  };
  struct NameHash {  // looks names up as string_views without building a string
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  bool phantom_;
  // Every block of every tile looks its weights up by name: hashed, not compared along a tree.
  std::unordered_map<std::string, Entry, NameHash, std::equal_to<>> tensors_;
  std::unique_ptr<MathCache> cache_;  // mutable through a const Weights: thread-safe
};

/// A counter-based normal stream: element i of stream (seed, name) is a pure function of
/// (seed, name, i), so values never depend on call order or rank count.
float seeded_normal_at(std::uint64_t seed, std::string_view name, std::uint64_t i);
/// A [rows, cols] tensor of N(0, stddev^2) values from stream (seed, name); shape only if phantom.
Tensor seeded_normal(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                     std::string_view name, float stddev, bool phantom);
/// Rows [row_begin, row_begin + count) of the seeded_normal(total_rows, cols, ...) tensor.
Tensor seeded_normal_rows(std::int64_t row_begin, std::int64_t count, std::int64_t cols,
                          std::uint64_t seed, std::string_view name, float stddev, bool phantom);

/// The weight stream (seed, name): N(0, stddev^2) floats, element i a pure function of
/// (seed, name, i), made by the vectorised float generator of dit/normal_fill.hpp (elements 2j
/// and 2j+1 come from one draw). Inputs and noise use seeded_normal's double-precision stream.
void seeded_weight_normals(std::uint64_t seed, std::string_view name, float stddev,
                           std::span<float> out);

/// Seeded random weights for `specs` (seeded_weight_normals; norm scales centred on 1); no data
/// allocated when phantom. Blocking; call once.
std::shared_ptr<const Weights> init_weights(const std::vector<TensorSpec>& specs,
                                            std::uint64_t seed, bool phantom);

}  // namespace cocodiff::dit
