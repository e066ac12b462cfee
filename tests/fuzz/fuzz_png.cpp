// Fuzz target: the PNG reader (dit::read_png) on a real file, as a run reads an inpainting
// image and mask: with the run's size expected (28 x 28) and with none (the reader's own pixel
// cap), then the pixels turned into a mask and a pixel-space latent. The size a header declares
// must be checked before any pixel buffer is allocated: a few bytes claiming 30000 x 30000
// pixels must not cost gigabytes (libFuzzer's -rss_limit_mb and -malloc_limit_mb catch that).
// Bad input must end in an InputError; anything else (another exception, a crash, a sanitizer
// report, a huge allocation) is a finding.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/errors.hpp"
#include "dit/image.hpp"

namespace {

// A file of this process's own under the temporary directory, removed at exit.
const std::filesystem::path& scratch_file() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path d = std::filesystem::temp_directory_path() /
                              ("cocodiff_fuzz_png_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                      ("cocodiff_fuzz_png_" + std::to_string(::getpid())),
                                  ec);
    });
    return d;
  }();
  static const std::filesystem::path file = dir / "image.png";
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path& file = scratch_file();
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) __builtin_trap();
  }
  try {
    const cocodiff::dit::Rgb img = cocodiff::dit::read_png(file, cocodiff::dit::PngSize{28, 28});
    if (img.width != 28 || img.height != 28 || img.pixels.size() != 28 * 28 * 3) __builtin_trap();
    (void)cocodiff::dit::inpaint_mask(img);
    (void)cocodiff::dit::pixel_latent(img, 1);
  } catch (const cocodiff::InputError&) {
  }
  try {
    const cocodiff::dit::Rgb img = cocodiff::dit::read_png(file);
    if (img.width < 1 || img.height < 1 ||
        std::int64_t{img.width} * img.height > cocodiff::dit::kMaxPngPixels ||
        img.pixels.size() != static_cast<std::size_t>(img.width) * img.height * 3)
      __builtin_trap();
    (void)cocodiff::dit::pixel_latent(img, 3);
  } catch (const cocodiff::InputError&) {
  }
  return 0;
}
