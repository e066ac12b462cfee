// Fuzz target: the sharded checkpoint's index (dit::SafetensorsCheckpoint on a
// *.safetensors.index.json) on arbitrary bytes, with two valid shards beside it (a.safetensors
// holds "w" and "v", b.safetensors holds "u"), so that an index that names them reaches the
// shard loading and every tensor read. Bad input must end in InputError, never in another
// exception, a crash, a sanitizer report or a hang.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "core/errors.hpp"
#include "core/tensor.hpp"
#include "dit/safetensors.hpp"

namespace {

namespace fs = std::filesystem;

// The scratch directory of this process, with its two shards written once; removed at exit.
struct Scratch {
  fs::path dir;
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

const fs::path& scratch() {
  static const Scratch s{[] {
    const fs::path d =
        fs::temp_directory_path() / ("cocodiff_fuzz_index_" + std::to_string(::getpid()));
    fs::create_directories(d);
    const cocodiff::Tensor w = cocodiff::Tensor::zeros(2, 3, false);
    const cocodiff::Tensor u = cocodiff::Tensor::zeros(1, 4, false);
    cocodiff::dit::write_safetensors(d / "a.safetensors", {{"w", {2, 3}, &w}, {"v", {1, 4}, &u}});
    cocodiff::dit::write_safetensors(d / "b.safetensors", {{"u", {4}, &u}});
    return d;
  }()};
  return s.dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fs::path index = scratch() / "model.safetensors.index.json";
  {
    std::ofstream out(index, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) __builtin_trap();
  }
  try {
    const cocodiff::dit::SafetensorsCheckpoint c(index);
    for (const auto& [name, entry] : c.entries()) {
      const cocodiff::Tensor t = c.read(name);
      std::int64_t numel = 1;
      for (std::int64_t d : entry->shape) numel *= d;
      if (t.numel() != numel) __builtin_trap();  // the tensor read is the one described
    }
  } catch (const cocodiff::InputError&) {
    // Expected for malformed indexes.
  }
  return 0;
}
