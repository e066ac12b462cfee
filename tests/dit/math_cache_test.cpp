// The tiles' shared math: packed weights give Eigen's bytes, and are packed once.

#include "dit/math_cache.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "dit/layers.hpp"
#include "dit/local_comm.hpp"

namespace cocodiff::dit {
namespace {

Tensor random(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  Mat m(rows, cols);
  for (std::int64_t i = 0; i < m.size(); ++i) m.data()[i] = n(rng);
  return Tensor::from(std::move(m));
}

bool same_bytes(const Mat& a, const Mat& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(a.size())) == 0;
}

// Shapes of thin shards: depths below and above Eigen's kc block, widths that are and are not
// multiples of its micro-panels, row ranges (one rank's heads) and full weights.
TEST(MathCache, PackedProductHasEigensBytes) {
  MathCache cache;
  struct Case {
    std::int64_t rows, out, in, r0, count;
  };
  const Case cases[] = {{6, 384, 384, 0, 384},      {16, 1152, 384, 128, 256},
                        {2, 7, 13, 0, 7},           {63, 384, 1920, 0, 384},
                        {5, 1536, 384, 0, 1536},    {24, 100, 3000, 3, 90},
                        {3, 4096, 2048, 1024, 2048}};
  unsigned seed = 1;
  for (const Case& c : cases) {
    const Tensor w = random(c.out, c.in, seed++);
    const Tensor x = random(c.rows, c.in, seed++);
    cache.adopt(w);
    Mat want(c.rows, c.count);
    want.noalias() = x.mat() * w.mat().middleRows(c.r0, c.count).transpose();
    for (int rep = 0; rep < 2; ++rep) {
      Mat got = Mat::Constant(c.rows, c.count, 7.0f);  // overwritten
      ASSERT_TRUE(cache.multiply(x.mat(), w, c.r0, c.count, got));
      EXPECT_TRUE(same_bytes(got, want)) << c.rows << "x" << c.in << " * " << c.count;
    }
  }
}

TEST(MathCache, PacksEachWeightOnceAndOnlyAdoptedThinProducts) {
  MathCache cache;
  const Tensor w = random(384, 384, 7), other = random(384, 384, 8);
  cache.adopt(w);
  Mat y = Mat::Zero(6, 384);
  EXPECT_TRUE(cache.multiply(random(6, 384, 9).mat(), w, 0, 384, y));
  const std::int64_t packed = cache.packed_floats();
  EXPECT_GE(packed, 384 * 384);
  for (unsigned s = 10; s < 20; ++s) {
    y.setZero();
    EXPECT_TRUE(cache.multiply(random(6, 384, s).mat(), w, 0, 384, y));
  }
  EXPECT_EQ(cache.packed_floats(), packed);  // no repacking for later shards
  EXPECT_FALSE(cache.multiply(random(6, 384, 3).mat(), other, 0, 384, y));  // not adopted
  Mat one = Mat::Zero(1, 384);
  EXPECT_FALSE(cache.multiply(random(1, 384, 4).mat(), w, 0, 384, one));  // Eigen's GEMV
  Mat tall = Mat::Zero(MathCache::kMaxPackedRows, 384);
  EXPECT_FALSE(cache.multiply(random(MathCache::kMaxPackedRows, 384, 5).mat(), w, 0, 384, tall));
  EXPECT_EQ(cache.packed_floats(), packed);
}

TEST(MathCache, LinearThroughTheCacheEqualsLinearWithout) {
  LocalComm comm;
  MathCache cache;
  const Tensor w = random(96, 64, 11), b = random(1, 96, 12), x = random(10, 64, 13);
  cache.adopt(w);
  const Tensor plain = linear(Exec{comm, false}, x, w, &b, "proj", {16, 80});
  const Tensor cached = linear(Exec{comm, false, &cache}, x, w, &b, "proj", {16, 80});
  EXPECT_TRUE(same_bytes(plain.mat(), cached.mat()));
  EXPECT_GT(cache.packed_floats(), 0);
}

// A unit of shared work runs once for equal inputs; a later tile gets equal bytes and is
// charged the same operations on its own clock; other inputs are computed again.
TEST(MathCache, SharedWorkRunsOnceAndChargesEveryTile) {
  MathCache cache;
  const Tensor w = random(48, 32, 21), c = random(4, 32, 22);
  cache.adopt(w);
  int runs = 0;
  const Tensor* in = &c;  // the input fn reads
  auto fn = [&](const Exec& e) {
    ++runs;
    Tensor y = linear(e, *in, w, nullptr, "proj");
    gelu_tanh(e, y, "gelu");
    return std::vector<Tensor>{std::move(y), layer_norm(e, *in, 1e-6f, "norm")};
  };
  LocalComm first, second, direct;
  const std::vector<Tensor> a = shared_work(Exec{first, false, &cache}, "unit", {&c}, fn);
  const Tensor c_copy = Tensor::from(c.mat());  // equal bytes, another tensor
  in = &c_copy;
  const std::vector<Tensor> b = shared_work(Exec{second, false, &cache}, "unit", {&c_copy}, fn);
  const std::vector<Tensor> d = fn(Exec{direct, false});
  EXPECT_EQ(runs, 2);  // once shared, once directly
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(same_bytes(a[i].mat(), d[i].mat()));
    EXPECT_TRUE(same_bytes(b[i].mat(), d[i].mat()));
  }
  EXPECT_EQ(second.ops(), direct.ops());
  EXPECT_EQ(second.flops(), direct.flops());
  EXPECT_EQ(second.bytes(), direct.bytes());
  EXPECT_EQ(first.ops(), direct.ops());
  EXPECT_EQ(cache.shared_computed(), 1);
  EXPECT_EQ(cache.shared_reused(), 1);

  Tensor other = Tensor::from(c.mat());
  other.mat()(3, 31) += 1.0f;  // one element differs: computed again
  in = &other;
  const std::vector<Tensor> e = shared_work(Exec{second, false, &cache}, "unit", {&other}, fn);
  EXPECT_EQ(runs, 3);
  EXPECT_FALSE(same_bytes(e[0].mat(), d[0].mat()));
  // Without a cache or in phantom mode: always computed.
  in = &c;
  shared_work(Exec{direct, false}, "unit", {&c}, fn);
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(cache.shared_computed(), 2);
}

// A nested unit's charges reach the enclosing unit's record, hit or miss.
TEST(MathCache, NestedSharedWorkIsRecordedByItsEnclosingUnit) {
  MathCache cache;
  const Tensor c = random(4, 16, 31);
  auto inner = [&](const Exec& e) { return std::vector<Tensor>{layer_norm(e, c, 1e-6f, "norm")}; };
  LocalComm warm;
  shared_work(Exec{warm, false, &cache}, "inner", {&c}, inner);  // inner is now a hit
  auto outer = [&](const Exec& e) {
    std::vector<Tensor> h = shared_work(e, "inner", {&c}, inner);
    gelu_tanh(e, h[0], "gelu");
    return h;
  };
  LocalComm a, b;
  shared_work(Exec{a, false, &cache}, "outer", {&c}, outer);
  shared_work(Exec{b, false, &cache}, "outer", {&c}, outer);  // replays both charges
  EXPECT_EQ(a.ops(), 2);
  EXPECT_EQ(b.ops(), 2);
  EXPECT_EQ(a.flops(), b.flops());
}

}  // namespace
}  // namespace cocodiff::dit
