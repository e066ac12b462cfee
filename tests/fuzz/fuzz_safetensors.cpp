// Fuzz target: the safetensors reader on arbitrary bytes. Opening validates the header; every
// tensor the header lists is then read. Bad input must end in InputError, never in another
// exception, a crash, a sanitizer report or an allocation larger than the file.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/errors.hpp"
#include "dit/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file =
      std::filesystem::temp_directory_path() /
      ("cocodiff_fuzz_" + std::to_string(::getpid()) + ".safetensors");
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const cocodiff::dit::SafetensorsFile f(file);
    for (const auto& [name, entry] : f.entries()) {
      const cocodiff::Tensor t = f.read(name);
      std::int64_t numel = 1;
      for (std::int64_t d : entry.shape) numel *= d;
      if (t.numel() != numel) __builtin_trap();  // the tensor read is the one described
    }
  } catch (const cocodiff::InputError&) {
    // Expected for malformed files.
  }
  return 0;
}
