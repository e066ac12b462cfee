// Latent previews and the PNG writer.

#include <gif_lib.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/errors.hpp"
#include "dit/image.hpp"

namespace cocodiff::dit {
namespace {

TEST(Image, PreviewScalesEachChannelGroupToFullRange) {
  Mat l(3, 4);      // 3 channels, 2x2 latent
  l << 0, 1, 2, 3,  // red ramps up
      5, 5, 5, 5,   // green constant -> 0
      4, 3, 2, 1;   // blue ramps down
  const Rgb img = latent_preview(Tensor::from(l), 2, 2, 2);
  ASSERT_EQ(img.width, 4);
  ASSERT_EQ(img.height, 4);
  auto px = [&](int y, int x, int k) { return img.pixels[(y * 4 + x) * 3 + k]; };
  EXPECT_EQ(px(0, 0, 0), 0);
  EXPECT_EQ(px(3, 3, 0), 255);  // latent cell (1, 1) upscaled x2
  EXPECT_EQ(px(1, 1, 0), 0);    // still cell (0, 0)
  EXPECT_EQ(px(0, 2, 0), 85);   // 1/3 of the range
  EXPECT_EQ(px(2, 2, 1), 0);
  EXPECT_EQ(px(0, 0, 2), 255);
}

// run.inpaint_mask's convention: any nonzero channel means "generate", only black means "keep".
TEST(Image, InpaintMaskIsOneWhereAnyChannelIsNonzero) {
  Rgb m;
  m.width = 4;
  m.height = 1;
  m.pixels = {0, 0, 0, 255, 255, 255, 1, 0, 0, 0, 0, 7};
  const Tensor t = inpaint_mask(m);
  ASSERT_EQ(t.rows(), 1);
  ASSERT_EQ(t.cols(), 4);
  EXPECT_EQ(t.mat()(0, 0), 0.0f);
  EXPECT_EQ(t.mat()(0, 1), 1.0f);
  EXPECT_EQ(t.mat()(0, 2), 1.0f);
  EXPECT_EQ(t.mat()(0, 3), 1.0f);
}

// pixel_latent inverts pixel_image: gray levels 0, 128, 255 map to -1, 128/127.5 - 1, 1 and back.
TEST(Image, PixelLatentRoundTripsThroughPixelImage) {
  Rgb g;
  g.width = 3;
  g.height = 1;
  g.pixels = {0, 0, 0, 128, 128, 128, 255, 255, 255};
  const Tensor l = pixel_latent(g, 1);
  ASSERT_EQ(l.rows(), 1);
  EXPECT_EQ(l.mat()(0, 0), -1.0f);
  EXPECT_EQ(l.mat()(0, 2), 1.0f);
  EXPECT_EQ(pixel_image(l, 1, 3).pixels, g.pixels);
  // Three channels keep each colour.
  Rgb c = g;
  c.pixels = {255, 0, 0, 0, 255, 0, 0, 0, 255};
  const Tensor l3 = pixel_latent(c, 3);
  ASSERT_EQ(l3.rows(), 3);
  EXPECT_EQ(pixel_image(l3, 1, 3).pixels, c.pixels);
}

TEST(Image, WritePngProducesAValidHeaderAndNoTempFile) {
  Rgb img;
  img.width = 5;
  img.height = 3;
  img.pixels.assign(5 * 3 * 3, 128);
  const std::filesystem::path p = std::filesystem::temp_directory_path() / "cocodiff_test.png";
  write_png(p, img);
  EXPECT_FALSE(std::filesystem::exists(p.string() + ".tmp"));
  std::ifstream in(p, std::ios::binary);
  const std::vector<unsigned char> b((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GT(b.size(), 24u);
  const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_TRUE(std::equal(sig, sig + 8, b.begin()));
  EXPECT_EQ(std::string(b.begin() + 12, b.begin() + 16), "IHDR");
  EXPECT_EQ(b[19], 5);  // width, big-endian
  EXPECT_EQ(b[23], 3);  // height
  EXPECT_THROW(write_png("/nonexistent-dir/x.png", img), InputError);
}

// Three gray frames and two colour ones read back with giflib: their sizes, a looping
// animation, each frame's delay, and their pixels (gray exactly, colour to the cube's step).
TEST(Image, WriteGifIsALoopingAnimationOfEveryFrame) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / "cocodiff_test.gif";
  std::vector<Rgb> gray(3);
  for (int f = 0; f < 3; ++f) {
    gray[f].width = 4;
    gray[f].height = 2;
    for (int i = 0; i < 8; ++i) gray[f].pixels.insert(gray[f].pixels.end(), 3, 30 * f + i);
  }
  write_gif(p, gray, 10);
  int err = 0;
  GifFileType* g = DGifOpenFileName(p.c_str(), &err);
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(DGifSlurp(g), GIF_OK);
  EXPECT_EQ(g->SWidth, 4);
  EXPECT_EQ(g->SHeight, 2);
  ASSERT_EQ(g->ImageCount, 3);
  // giflib keeps the extensions before an image with that image (the loop: with the first).
  bool loops = false;
  const SavedImage& first = g->SavedImages[0];
  for (int i = 0; i < first.ExtensionBlockCount; ++i)
    loops |=
        first.ExtensionBlocks[i].ByteCount == 11 &&
        std::string(reinterpret_cast<char*>(first.ExtensionBlocks[i].Bytes), 11) == "NETSCAPE2.0";
  EXPECT_TRUE(loops);
  for (int f = 0; f < 3; ++f) {
    GraphicsControlBlock gcb;
    ASSERT_EQ(DGifSavedExtensionToGCB(g, f, &gcb), GIF_OK);
    EXPECT_EQ(gcb.DelayTime, 10);
    const SavedImage& im = g->SavedImages[f];
    for (int i = 0; i < 8; ++i)
      EXPECT_EQ(g->SColorMap->Colors[im.RasterBits[i]].Red, 30 * f + i) << f << " " << i;
  }
  DGifCloseFile(g, &err);
  std::vector<Rgb> colour(2, Rgb{1, 1, {250, 10, 128}});
  write_gif(p, colour, 5);
  g = DGifOpenFileName(p.c_str(), &err);
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(DGifSlurp(g), GIF_OK);
  const GifColorType c = g->SColorMap->Colors[g->SavedImages[1].RasterBits[0]];
  EXPECT_NEAR(c.Red, 250, 26);
  EXPECT_NEAR(c.Green, 10, 22);
  EXPECT_NEAR(c.Blue, 128, 26);
  DGifCloseFile(g, &err);
  std::filesystem::remove(p);
  EXPECT_THROW(write_gif("/nonexistent-dir/x.gif", gray, 10), InputError);
}

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string chunk(const std::string& type, std::uint32_t declared, const std::string& data) {
  std::string c;
  for (int k = 3; k >= 0; --k) c.push_back(static_cast<char>((declared >> (8 * k)) & 0xff));
  return c + type + data + std::string(4, '\0');  // CRC: not checked for ancillary chunks
}

// A few bytes that declare a huge text chunk are refused at once (libpng would allocate what
// the chunk claims before reading it); text chunks that the file does hold are skipped.
TEST(Image, AncillaryChunksCostNothing) {
  Rgb img;
  img.width = 4;
  img.height = 2;
  img.pixels.assign(4 * 2 * 3, 77);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("cocodiff_png_chunks_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  write_png(dir / "ok.png", img);
  const std::string good = read_bytes(dir / "ok.png");
  const size_t after_ihdr = 8 + 12 + 13;
  for (const std::string type : {"tEXt", "zTXt", "iTXt", "sPLT"}) {
    const std::string huge = good.substr(0, after_ihdr) + chunk(type, 0x7fffffffu, "Comment\0x");
    std::ofstream(dir / "huge.png", std::ios::binary) << huge;
    try {
      (void)read_png(dir / "huge.png");
      ADD_FAILURE() << type << ": a chunk of 2^31-1 bytes in a small file was read";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("chunk '" + type + "'"), std::string::npos) << e.what();
    }
    const std::string text = "Comment" + std::string(1, '\0') + "hello";
    const std::string held = good.substr(0, after_ihdr) +
                             chunk(type, static_cast<std::uint32_t>(text.size()), text) +
                             good.substr(after_ihdr);
    std::ofstream(dir / "text.png", std::ios::binary) << held;
    EXPECT_EQ(read_png(dir / "text.png").pixels, img.pixels) << type;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cocodiff::dit
