#include "dit/weights.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/errors.hpp"
#include "dit/normal_fill.hpp"

namespace cocodiff::dit {

std::int64_t TensorSpec::rows() const { return shape.size() == 1 ? 1 : shape.at(0); }

std::int64_t TensorSpec::cols() const {
  if (shape.size() == 1) return shape[0];
  std::int64_t c = 1;
  for (size_t i = 1; i < shape.size(); ++i) c *= shape[i];
  return c;
}

std::string TensorSpec::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void Weights::add(const TensorSpec& spec, Tensor t) {
  COCO_CHECK(t.rows() == spec.rows() && t.cols() == spec.cols(),
             "Weights::add " + spec.name + ": " + t.shape_str() + " vs " + spec.shape_str());
  COCO_CHECK(t.phantom() == phantom_, "Weights::add " + spec.name + ": phantom mismatch");
  auto [it, inserted] = tensors_.insert_or_assign(spec.name, Entry{spec, std::move(t)});
  if (!phantom_) cache_->adopt(it->second.tensor);
}

const Tensor* Weights::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.tensor;
}

const Tensor& Weights::get(std::string_view name) const {
  const Tensor* t = find(name);
  COCO_CHECK(t != nullptr, "no weight named " + std::string(name));
  return *t;
}

const TensorSpec& Weights::spec(std::string_view name) const {
  auto it = tensors_.find(name);
  COCO_CHECK(it != tensors_.end(), "no weight named " + std::string(name));
  return it->second.spec;
}

std::int64_t Weights::parameters() const {
  std::int64_t n = 0;
  for (const auto& [name, e] : tensors_) n += e.spec.numel();
  return n;
}

std::vector<std::string> Weights::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

std::uint64_t stream_key(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the name
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return splitmix64(splitmix64(seed) ^ h);
}

// Uniform in (0, 1] from 53 random bits.
double uniform(std::uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

// Element i: Box-Muller on the counter pair (2i, 2i+1) of the stream.
float normal_from_key(std::uint64_t key, std::uint64_t i) {
  const double u1 = uniform(splitmix64(key + 2 * i));
  const double u2 = uniform(splitmix64(key + 2 * i + 1));
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace

float seeded_normal_at(std::uint64_t seed, std::string_view name, std::uint64_t i) {
  return normal_from_key(stream_key(seed, name), i);
}

Tensor seeded_normal_rows(std::int64_t row_begin, std::int64_t count, std::int64_t cols,
                          std::uint64_t seed, std::string_view name, float stddev, bool phantom) {
  Tensor t = Tensor::zeros(count, cols, phantom);
  if (phantom) return t;
  const std::uint64_t key = stream_key(seed, name);
  float* d = t.mat().data();
  const std::uint64_t first = static_cast<std::uint64_t>(row_begin * cols);
  for (std::int64_t i = 0; i < count * cols; ++i)
    d[i] = stddev * normal_from_key(key, first + static_cast<std::uint64_t>(i));
  return t;
}

void seeded_weight_normals(std::uint64_t seed, std::string_view name, float stddev,
                           std::span<float> out) {
  const std::uint64_t key = stream_key(seed, name);
  const auto n = static_cast<std::int64_t>(out.size());
  fill_normal_pairs(out.data(), key, 0, n / 2, stddev);
  if (n % 2 != 0) {  // the last pair's first value
    float pair[2];
    fill_normal_pairs(pair, key, static_cast<std::uint64_t>(n / 2), 1, stddev);
    out[out.size() - 1] = pair[0];
  }
}

Tensor seeded_normal(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                     std::string_view name, float stddev, bool phantom) {
  return seeded_normal_rows(0, rows, cols, seed, name, stddev, phantom);
}

std::shared_ptr<const Weights> init_weights(const std::vector<TensorSpec>& specs,
                                            std::uint64_t seed, bool phantom) {
  auto w = std::make_shared<Weights>(phantom);
  for (const TensorSpec& s : specs) {
    float stddev = 1.0f;
    switch (s.init) {
      case InitKind::kLinear:
        stddev = 1.0f / std::sqrt(static_cast<float>(s.cols()));
        break;
      case InitKind::kBias:
        stddev = 0.02f;
        break;
      case InitKind::kNorm:
        stddev = 0.1f;
        break;
      case InitKind::kEmbedding:
        stddev = 1.0f;
        break;
    }
    Tensor t = Tensor::uninitialized(s.rows(), s.cols(), phantom);
    if (!phantom) {
      seeded_weight_normals(seed, s.name, stddev,
                            std::span<float>(t.mat().data(), static_cast<size_t>(t.numel())));
      if (s.init == InitKind::kNorm) t.mat().array() += 1.0f;
    }
    w->add(s, std::move(t));
  }
  return w;
}

}  // namespace cocodiff::dit
