// The safetensors reader against hostile files: every prefix of a good file, every single-byte
// corruption of its header, and headers that claim terabytes. Each must end in InputError (or
// load), never in another exception, and never allocate more than the file could justify.
// Allocations are measured by replacing the global operator new in this test binary.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>

#include "core/errors.hpp"
#include "core/tensor.hpp"
#include "dit/safetensors.hpp"

namespace {
std::atomic<std::size_t> g_largest_new{0};

void* counted_new(std::size_t n) {
  std::size_t cur = g_largest_new.load();
  while (n > cur && !g_largest_new.compare_exchange_weak(cur, n)) {
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted_new(n); }
void* operator new[](std::size_t n) { return counted_new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace cocodiff::dit {
namespace {

namespace fs = std::filesystem;

class SafetensorsLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cocodiff_st_limits_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path put(const std::string& bytes) {
    const fs::path p = dir_ / "x.safetensors";
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    return p;
  }
  static std::string raw(const std::string& header, std::size_t data_bytes) {
    std::string s;
    for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(header.size() >> (8 * i)));
    return s + header + std::string(data_bytes, '\0');
  }
  // Opens `bytes` and reads every tensor. "ok", or the InputError message; any other exception
  // propagates and fails the test. Records the largest single allocation meanwhile (the file
  // stream itself allocates an 8 KiB buffer).
  std::string load(const std::string& bytes, std::size_t* largest = nullptr) {
    const fs::path p = put(bytes);
    g_largest_new = 0;
    std::string result = "ok";
    try {
      const SafetensorsFile f(p);
      for (const auto& [name, e] : f.entries()) f.read(name);
    } catch (const InputError& e) {
      result = e.what();
    }
    if (largest != nullptr) *largest = g_largest_new.load();
    return result;
  }

  fs::path dir_;
};

TEST_F(SafetensorsLimits, EveryPrefixOfAGoodFileIsRejected) {
  Mat m(3, 5);
  m.setConstant(1.5f);
  const Tensor t = Tensor::from(m);
  const fs::path good = dir_ / "good.safetensors";
  write_safetensors(good, {{"a", {3, 5}, &t}, {"b", {15}, &t}}, StDtype::kBF16);
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(load(bytes), "ok");
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::size_t largest = 0;
    const std::string e = load(bytes.substr(0, n), &largest);
    EXPECT_NE(e, "ok") << "prefix of " << n << " bytes loaded";
    EXPECT_LE(largest, bytes.size() + (64 << 10)) << "prefix of " << n << " bytes";
  }
}

TEST_F(SafetensorsLimits, EverySingleByteCorruptionOfTheHeaderIsHandled) {
  const std::string good =
      raw(R"({"w":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},"__metadata__":{}})", 12);
  ASSERT_EQ(load(good), "ok");
  int rejected = 0;
  for (std::size_t i = 0; i < good.size() - 12; ++i) {
    for (const char c : {'\0', '"', '9', '-', '}', 'x', '\xff'}) {
      std::string bad = good;
      bad[i] = c;
      std::size_t largest = 0;
      if (load(bad, &largest) != "ok") ++rejected;
      EXPECT_LE(largest, std::size_t{64} << 20) << "byte " << i << " = " << int(c);
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST_F(SafetensorsLimits, TerabyteClaimsFailBeforeAllocating) {
  std::size_t largest = 0;
  // A header length of 1 TiB.
  std::string liar(8, '\0');
  liar[5] = 1;  // 2^40
  EXPECT_NE(load(liar + "{}", &largest).find("header claims 1099511627776 bytes"),
            std::string::npos);
  EXPECT_LT(largest, std::size_t{1} << 20);
  // A tensor of 1 TiB whose offsets say so; the file has 16 data bytes.
  EXPECT_NE(load(raw(R"({"x":{"dtype":"F32","shape":[262144,1048576],)"
                     R"("data_offsets":[0,1099511627776]}})",
                     16),
                 &largest)
                .find("tensor 'x': shape larger than the file"),
            std::string::npos);
  EXPECT_LT(largest, std::size_t{1} << 20);
  // Offsets that claim 1 TiB for a small shape.
  EXPECT_NE(load(raw(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,1099511627776]}})", 8),
                 &largest)
                .find("outside the 8-byte data section"),
            std::string::npos);
  EXPECT_LT(largest, std::size_t{1} << 20);
  // A shape whose element count overflows 64 bits.
  EXPECT_NE(load(raw(R"({"x":{"dtype":"BF16","shape":[4294967296,4294967296,4294967296],)"
                     R"("data_offsets":[0,8]}})",
                     8),
                 &largest)
                .find("shape larger than the file"),
            std::string::npos);
  EXPECT_LT(largest, std::size_t{1} << 20);
}

TEST_F(SafetensorsLimits, MalformedEntries) {
  EXPECT_NE(load(raw(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8))
                .find("tensor 'x': unsupported dtype F64 (expected F32, F16 or BF16)"),
            std::string::npos);
  EXPECT_NE(load(raw(R"({"x":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4))
                .find("tensor 'x': dtype is not a string"),
            std::string::npos);
  EXPECT_NE(load(raw(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4))
                .find("shape entries must be non-negative integers"),
            std::string::npos);
  EXPECT_NE(load(raw(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4))
                .find("data_offsets [4, 0) outside"),
            std::string::npos);
  EXPECT_NE(load(raw(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4))
                .find("data_offsets must be two non-negative integers"),
            std::string::npos);
  EXPECT_NE(load(raw(R"({"x":[1,2]})", 0)).find("expected {dtype, shape, data_offsets}"),
            std::string::npos);
  EXPECT_NE(load(raw("[]", 0)).find("header is not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace cocodiff::dit
