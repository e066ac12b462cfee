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

/// A checkpoint: one .safetensors file, or a sharded one given by its index
/// (`*.safetensors.index.json`: {"weight_map": {tensor name: shard file name}}, the shards
/// beside the index), read as one set of tensors.
class SafetensorsCheckpoint {
 public:
  /// Opens the file or the index and every shard it names. InputError naming the file for a
  /// bad index (not JSON, no weight_map, a shard missing) or a tensor the index places in a
  /// shard that does not hold it.
  explicit SafetensorsCheckpoint(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return path_; }
  /// Every tensor name with its entry, sorted by name.
  std::map<std::string, const SafetensorsEntry*> entries() const;
  const SafetensorsEntry* find(const std::string& name) const;
  /// Reads one tensor as fp32 (see SafetensorsFile::read) from the shard that holds it.
  Tensor read(const std::string& name) const;

 private:
  std::filesystem::path path_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t> shard_of_;  // tensor name -> index in shards_
};

/// What a checkpoint lacks or has too much of, against a model's tensors.
struct CheckpointCheck {
  std::vector<TensorSpec> missing;       // expected, absent
  std::vector<std::string> extra;        // present, not expected (sorted)
  std::vector<std::string> wrong_shape;  // "name: shape [..], expected [..]"
  bool ok() const { return missing.empty() && wrong_shape.empty(); }
  /// Every problem, one per line ("missing ...", "wrong shape ...", "extra ...").
  std::string describe() const;
  /// The problems in a few lines: counts, then missing tensors grouped by module (block indices
  /// and the last two name parts as '*': "transformer_blocks.*.attn.* (x152)"), each pattern once,
  /// at most `max_patterns` of them, then the mis-shaped ones, likewise.
  std::string summary(std::size_t max_patterns = 8) const;
};
/// Compares a checkpoint's tensors with `specs` (all problems at once, no tensor data read).
CheckpointCheck check_checkpoint(const SafetensorsCheckpoint& ckpt,
                                 const std::vector<TensorSpec>& specs);

/// Loads every tensor of `specs` by name from a file or a sharded index; InputError listing every
/// missing tensor and every wrong shape at once. Tensors the model does not use are ignored.
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
