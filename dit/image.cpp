#include "dit/image.hpp"

#include <gif_lib.h>
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/atomic_file.hpp"
#include "core/errors.hpp"

namespace cocodiff::dit {

Rgb latent_preview(const Tensor& latent, int height, int width, int upscale) {
  COCO_CHECK(!latent.phantom() && latent.cols() == std::int64_t{height} * width && upscale >= 1,
             "latent_preview: latent " + latent.shape_str());
  const std::int64_t c = latent.rows();
  Rgb img;
  img.width = width * upscale;
  img.height = height * upscale;
  img.pixels.assign(static_cast<size_t>(img.width) * img.height * 3, 0);
  for (int k = 0; k < 3; ++k) {
    // Channel group k: [k*c/3, (k+1)*c/3), at least one channel.
    const std::int64_t lo = std::min<std::int64_t>(k * c / 3, c - 1);
    const std::int64_t hi = std::max<std::int64_t>((k + 1) * c / 3, lo + 1);
    const Vec g = latent.mat().middleRows(lo, hi - lo).colwise().mean();
    const float mn = g.minCoeff(), mx = g.maxCoeff();
    const float scale = mx > mn ? 255.0f / (mx - mn) : 0.0f;
    for (int y = 0; y < img.height; ++y)
      for (int x = 0; x < img.width; ++x) {
        const float v = (g(std::int64_t{y / upscale} * width + x / upscale) - mn) * scale;
        img.pixels[(static_cast<size_t>(y) * img.width + x) * 3 + k] =
            static_cast<std::uint8_t>(std::clamp(v + 0.5f, 0.0f, 255.0f));
      }
  }
  return img;
}

Rgb pixel_image(const Tensor& latent, int height, int width, int upscale) {
  COCO_CHECK(!latent.phantom() && (latent.rows() == 1 || latent.rows() == 3) &&
                 latent.cols() == std::int64_t{height} * width && upscale >= 1,
             "pixel_image: latent " + latent.shape_str());
  Rgb img;
  img.width = width * upscale;
  img.height = height * upscale;
  img.pixels.assign(static_cast<size_t>(img.width) * img.height * 3, 0);
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      for (int k = 0; k < 3; ++k) {
        const std::int64_t ch = latent.rows() == 1 ? 0 : k;
        const float v = latent.mat()(ch, std::int64_t{y / upscale} * width + x / upscale);
        img.pixels[(static_cast<size_t>(y) * img.width + x) * 3 + k] =
            static_cast<std::uint8_t>(std::clamp((v + 1.0f) * 127.5f + 0.5f, 0.0f, 255.0f));
      }
  return img;
}

Tensor pixel_latent(const Rgb& image, int channels) {
  COCO_CHECK((channels == 1 || channels == 3) &&
                 image.pixels.size() == static_cast<size_t>(image.width) * image.height * 3,
             "pixel_latent: channels or pixel buffer size");
  const std::int64_t n = std::int64_t{image.width} * image.height;
  Tensor t = Tensor::zeros(channels, n, false);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* px = &image.pixels[static_cast<size_t>(i) * 3];
    for (int k = 0; k < channels; ++k) {
      const float v = channels == 1 ? (px[0] + px[1] + px[2]) / 3.0f : px[k];
      t.mat()(k, i) = v / 127.5f - 1.0f;
    }
  }
  return t;
}

Tensor inpaint_mask(const Rgb& mask) {
  COCO_CHECK(mask.pixels.size() == static_cast<size_t>(mask.width) * mask.height * 3,
             "inpaint_mask: pixel buffer size");
  const std::int64_t n = std::int64_t{mask.width} * mask.height;
  Tensor t = Tensor::zeros(1, n, false);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint8_t* px = &mask.pixels[static_cast<size_t>(i) * 3];
    t.mat()(0, i) = (px[0] | px[1] | px[2]) != 0 ? 1.0f : 0.0f;
  }
  return t;
}

namespace {

std::uint32_t be32(const std::string& b, size_t at) {
  return (std::uint32_t{static_cast<unsigned char>(b[at])} << 24) |
         (std::uint32_t{static_cast<unsigned char>(b[at + 1])} << 16) |
         (std::uint32_t{static_cast<unsigned char>(b[at + 2])} << 8) |
         std::uint32_t{static_cast<unsigned char>(b[at + 3])};
}

// The PNG's chunks as libpng may read them: every chunk's declared length checked against what
// the file holds (a 44-byte file must not claim a 2 GiB chunk, which libpng would allocate
// before reading it), and the ancillary chunks that carry text, palettes and profiles (tEXt,
// zTXt, iTXt, sPLT, iCCP: compressed ones can inflate without bound) left out: none of them
// changes a pixel of the RGB image read here. InputError naming the file and chunk otherwise.
std::string png_pixels_only(const std::string& bytes, const std::filesystem::path& path) {
  static const std::string kSignature = "\x89PNG\r\n\x1a\n";
  if (bytes.compare(0, kSignature.size(), kSignature) != 0)
    throw InputError(path.string() + ": not a readable PNG (no PNG signature)");
  std::string out = kSignature;
  size_t at = kSignature.size();
  while (at < bytes.size()) {
    if (bytes.size() - at < 12)
      throw InputError(path.string() + ": not a readable PNG (a chunk header at byte " +
                       std::to_string(at) + " is cut off: a truncated file)");
    const std::uint32_t length = be32(bytes, at);
    const std::string type = bytes.substr(at + 4, 4);
    if (length > bytes.size() - at - 12)
      throw InputError(path.string() + ": not a readable PNG (chunk '" + type + "' at byte " +
                       std::to_string(at) + " declares " + std::to_string(length) +
                       " bytes, the file holds " + std::to_string(bytes.size() - at - 12) +
                       " after it)");
    const size_t whole = size_t{length} + 12;
    if (type != "tEXt" && type != "zTXt" && type != "iTXt" && type != "sPLT" && type != "iCCP")
      out.append(bytes, at, whole);
    at += whole;
    if (type == "IEND") break;
  }
  return out;
}

}  // namespace

Rgb read_png(const std::filesystem::path& path, std::optional<PngSize> expect) {
  // The file first: a device or a huge file is refused before libpng reads from it.
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st))
    throw InputError(path.string() + ": no such file (a PNG image)");
  if (!std::filesystem::is_regular_file(st))
    throw InputError(path.string() + ": not a regular file (a PNG image is expected)");
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{256} << 20;
  if (!ec && file_bytes > kMaxFileBytes)
    throw InputError(path.string() + ": " + std::to_string(file_bytes) +
                     " bytes; a PNG read here may hold at most " + std::to_string(kMaxFileBytes));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream whole;
  whole << in.rdbuf();
  if (!in && !in.eof()) throw InputError(path.string() + ": cannot read the PNG");
  const std::string bytes = png_pixels_only(whole.str(), path);
  png_image im{};
  im.version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_memory(&im, bytes.data(), bytes.size()) == 0)
    throw InputError(path.string() + ": not a readable PNG (" + im.message + ")");
  // The header's size, before the pixel buffer is allocated: a few bytes may claim gigabytes.
  const std::string declared = std::to_string(im.width) + " x " + std::to_string(im.height);
  if (expect && (static_cast<std::int64_t>(im.width) != expect->width ||
                 static_cast<std::int64_t>(im.height) != expect->height)) {
    png_image_free(&im);
    throw InputError(path.string() + ": a PNG of " + declared + " pixels, expected " +
                     std::to_string(expect->width) + " x " + std::to_string(expect->height));
  }
  if (static_cast<std::int64_t>(im.width) * im.height > kMaxPngPixels) {
    png_image_free(&im);
    throw InputError(path.string() + ": a PNG of " + declared + " pixels, more than the " +
                     std::to_string(kMaxPngPixels) + " pixels an image read here may have");
  }
  im.format = PNG_FORMAT_RGB;
  Rgb img;
  img.width = static_cast<int>(im.width);
  img.height = static_cast<int>(im.height);
  img.pixels.resize(PNG_IMAGE_SIZE(im));
  if (png_image_finish_read(&im, nullptr, img.pixels.data(), 0, nullptr) == 0) {
    const std::string msg = im.message;
    png_image_free(&im);
    throw InputError(path.string() + ": PNG decode failed (" + msg + ")");
  }
  return img;
}

void write_png(const std::filesystem::path& path, const Rgb& image) {
  COCO_CHECK(image.pixels.size() == static_cast<size_t>(image.width) * image.height * 3,
             "write_png: pixel buffer size");
  std::filesystem::path tmp;
  const int fd = create_exclusive_temp(path, tmp);  // never through a planted symlink
  std::FILE* fp = ::fdopen(fd, "wb");
  if (fp == nullptr) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw InputError(tmp.string() + ": cannot open for writing");
  }
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (png == nullptr || info == nullptr) {
    png_destroy_write_struct(&png, &info);
    std::fclose(fp);
    std::remove(tmp.c_str());
    throw InputError(path.string() + ": libpng initialisation failed");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(fp);
    std::remove(tmp.c_str());
    throw InputError(path.string() + ": libpng write failed");
  }
  png_init_io(png, fp);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width),
               static_cast<png_uint_32>(image.height), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < image.height; ++y)
    png_write_row(png, image.pixels.data() + static_cast<size_t>(y) * image.width * 3);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  if (std::fclose(fp) != 0) {
    std::remove(tmp.c_str());
    throw InputError(path.string() + ": write failed on close (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  if (ec) throw InputError(path.string() + ": cannot rename into place (" + ec.message() + ")");
}

}  // namespace cocodiff::dit

namespace cocodiff::dit {

namespace {

// The palette index of one pixel: gray levels as they are, colours in a 6 x 7 x 6 cube.
std::uint8_t palette_index(const std::uint8_t* p, bool gray) {
  if (gray) return p[0];
  const int r = (p[0] * 5 + 127) / 255, g = (p[1] * 6 + 127) / 255, b = (p[2] * 5 + 127) / 255;
  return static_cast<std::uint8_t>((r * 7 + g) * 6 + b);
}

}  // namespace

void write_gif(const std::filesystem::path& path, const std::vector<Rgb>& frames, int delay_cs) {
  COCO_CHECK(!frames.empty(), "write_gif: no frames");
  const int w = frames[0].width, h = frames[0].height;
  bool gray = true;
  for (const Rgb& f : frames) {
    COCO_CHECK(f.width == w && f.height == h && f.pixels.size() == static_cast<size_t>(w) * h * 3,
               "write_gif: frames of different sizes");
    for (size_t i = 0; i < f.pixels.size() && gray; i += 3)
      gray = f.pixels[i] == f.pixels[i + 1] && f.pixels[i] == f.pixels[i + 2];
  }
  std::vector<GifColorType> colours(256, GifColorType{0, 0, 0});
  for (int i = 0; i < 256; ++i) {
    const auto v = static_cast<GifByteType>(i);
    if (gray) {
      colours[static_cast<size_t>(i)] = {v, v, v};
    } else if (i < 6 * 7 * 6) {
      colours[static_cast<size_t>(i)] = {static_cast<GifByteType>((i / 42) * 255 / 5),
                                         static_cast<GifByteType>((i / 6 % 7) * 255 / 6),
                                         static_cast<GifByteType>((i % 6) * 255 / 5)};
    }
  }
  std::filesystem::path tmp;
  const int fd = create_exclusive_temp(path, tmp);  // never through a planted symlink
  int err = 0;
  GifFileType* gif = EGifOpenFileHandle(fd, &err);
  if (gif == nullptr) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw InputError(path.string() + ": giflib cannot open it (" + GifErrorString(err) + ")");
  }
  ColorMapObject* map = GifMakeMapObject(256, colours.data());
  bool ok = map != nullptr;
  EGifSetGifVersion(gif, true);
  ok = ok && EGifPutScreenDesc(gif, w, h, 8, 0, map) == GIF_OK;
  // NETSCAPE2.0: loop forever.
  static const GifByteType kApp[] = {'N', 'E', 'T', 'S', 'C', 'A', 'P', 'E', '2', '.', '0'};
  static const GifByteType kLoop[] = {1, 0, 0};
  ok = ok && EGifPutExtensionLeader(gif, APPLICATION_EXT_FUNC_CODE) == GIF_OK &&
       EGifPutExtensionBlock(gif, sizeof kApp, kApp) == GIF_OK &&
       EGifPutExtensionBlock(gif, sizeof kLoop, kLoop) == GIF_OK &&
       EGifPutExtensionTrailer(gif) == GIF_OK;
  std::vector<GifByteType> row(static_cast<size_t>(w));
  for (const Rgb& f : frames) {
    if (!ok) break;
    GraphicsControlBlock gcb{DISPOSE_DO_NOT, false, delay_cs, NO_TRANSPARENT_COLOR};
    GifByteType ext[4];
    const size_t len = EGifGCBToExtension(&gcb, ext);
    ok = EGifPutExtension(gif, GRAPHICS_EXT_FUNC_CODE, static_cast<int>(len), ext) == GIF_OK &&
         EGifPutImageDesc(gif, 0, 0, w, h, false, nullptr) == GIF_OK;
    for (int y = 0; y < h && ok; ++y) {
      for (int x = 0; x < w; ++x)
        row[static_cast<size_t>(x)] =
            palette_index(f.pixels.data() + (static_cast<size_t>(y) * w + x) * 3, gray);
      ok = EGifPutLine(gif, row.data(), w) == GIF_OK;
    }
  }
  const int write_err = gif->Error;
  ok = EGifCloseFile(gif, &err) == GIF_OK && ok;
  GifFreeMapObject(map);
  if (!ok) {
    std::remove(tmp.c_str());
    throw InputError(path.string() + ": GIF write failed (" +
                     GifErrorString(write_err != 0 ? write_err : err) + ")");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw InputError(path.string() + ": cannot move the GIF into place");
  }
}

}  // namespace cocodiff::dit
