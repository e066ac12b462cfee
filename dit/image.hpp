#pragma once
// Latent previews: a false-colour RGB view of a latent (not a VAE decode: the VAE is out of
// scope) and a PNG writer (libpng; written to a temporary file, then renamed into place).
//
//   Rgb img = latent_preview(out.latent, out.latent_height, out.latent_width, /*upscale=*/4);
//   write_png("preview.png", img);

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "core/tensor.hpp"

namespace cocodiff::dit {

struct Rgb {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  // row-major, 3 bytes per pixel
};

/// Channels split into three equal groups (red, green, blue), each group's mean per pixel,
/// scaled to [0, 255] by the group's min and max; each latent cell becomes upscale^2 pixels.
Rgb latent_preview(const Tensor& latent, int height, int width, int upscale = 1);

/// The image of a pixel-space latent (1 gray or 3 RGB channels in [-1, 1]): value v becomes
/// round((v + 1) * 127.5) clamped to [0, 255]; each cell becomes upscale^2 pixels.
Rgb pixel_image(const Tensor& latent, int height, int width, int upscale = 1);

/// The pixel-space latent of an image (inverse of pixel_image): 1 channel (the mean of R, G, B)
/// or 3, each pixel value p becoming p / 127.5 - 1 in [-1, 1]. Returns [channels, height*width].
Tensor pixel_latent(const Rgb& image, int channels);

/// An inpainting mask from a mask image: 1 (regenerate) where any of a pixel's R, G, B is
/// nonzero (white), 0 (keep) where the pixel is black. Returns [1, height*width].
Tensor inpaint_mask(const Rgb& mask);

/// A PNG's size in pixels.
struct PngSize {
  int width = 0;
  int height = 0;
};

/// Reads an 8-bit PNG of any colour type as RGB. InputError naming the file on failure. The
/// size its header declares is checked before any pixel buffer is allocated: against `expect`
/// when given (InputError "a PNG of W x H pixels, expected ..."), and always against
/// kMaxPngPixels.
Rgb read_png(const std::filesystem::path& path, std::optional<PngSize> expect = std::nullopt);

/// The largest image read_png decodes (4096 x 4096, 48 MiB of RGB), whatever its header claims.
inline constexpr std::int64_t kMaxPngPixels = std::int64_t{1} << 24;

/// Writes an 8-bit RGB PNG atomically (temp file + rename). InputError on failure.
void write_png(const std::filesystem::path& path, const Rgb& image);

/// Writes `frames` (one size) as an animated GIF that loops, each frame shown `delay_cs`
/// hundredths of a second (giflib), atomically. Gray frames keep 256 gray levels; colour frames
/// are mapped to a 6 x 7 x 6 colour cube.
void write_gif(const std::filesystem::path& path, const std::vector<Rgb>& frames, int delay_cs);

}  // namespace cocodiff::dit
