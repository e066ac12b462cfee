#pragma once
// safetensors checkpoints: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "BF16", "shape": [3072, 64], "data_offsets": [begin, end]}, ...}, then the
// raw data. Every offset is validated against the file size before anything is allocated.
//
//   SafetensorsFile f("flux1-dev.safetensors");          // InputError if malformed
//   Tensor w = f.read("x_embedder.weight");              // bf16/fp16/f32 -> fp32, [3072, 64]
//   auto weights = load_safetensors_weights(path, model->tensor_specs());
//   write_safetensors("out.safetensors", {{"latent", {16, 128, 128}, &latent}});

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "dit/weights.hpp"

namespace cocodiff::dit {

enum class StDtype : std::uint8_t { kF32, kF16, kBF16 };
std::string st_dtype_name(StDtype d);

struct SafetensorsEntry {
  StDtype dtype = StDtype::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets inside the data section
  std::uint64_t end = 0;
};

class SafetensorsFile {
 public:
  /// Opens and validates the header. InputError (naming the file and tensor) for a truncated
  /// file, bad JSON, an unsupported dtype, or offsets that disagree with shapes or file size.
  explicit SafetensorsFile(std::filesystem::path path);
  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  /// Reads one tensor as fp32, viewed 2-D ([shape[0], prod(rest)], a 1-D tensor as [1, n]).
  Tensor read(const std::string& name) const;

 private:
  std::filesystem::path path_;
  std::uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
};

/// Loads every tensor of `specs` by name; InputError for a missing tensor or a wrong shape.
/// Tensors in the file that the model does not use are ignored.
std::shared_ptr<const Weights> load_safetensors_weights(const std::filesystem::path& path,
                                                        const std::vector<TensorSpec>& specs);

struct SafetensorsTensor {
  std::string name;
  std::vector<std::int64_t> shape;  // product must equal the tensor's numel
  const Tensor* tensor = nullptr;
};
/// Writes tensors (fp32 or bf16 on disk) to a temporary file, then renames it into place.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<SafetensorsTensor>& tensors,
                       StDtype dtype = StDtype::kF32);
/// Writes all weights under their names and upstream shapes.
void write_safetensors(const std::filesystem::path& path, const Weights& weights,
                       StDtype dtype = StDtype::kF32);

}  // namespace cocodiff::dit
