// Fuzz target: the safetensors reader on arbitrary bytes. Opening validates the header; every
// tensor the header lists is then read. Bad input must end in InputError, never in another
// exception, a crash, a sanitizer report or an allocation larger than the file.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/errors.hpp"
#include "dit/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // An anonymous in-memory file (memfd): nothing is left on disk, even after a crash.
  static const int fd = ::memfd_create("cocodiff_fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) __builtin_trap();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    __builtin_trap();
  const std::filesystem::path file = "/proc/self/fd/" + std::to_string(fd);
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
