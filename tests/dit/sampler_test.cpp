// Sigma schedules, Euler steps, CFG, inpainting, and the quality metrics.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dit/local_comm.hpp"
#include "dit/model_config.hpp"
#include "dit/quality.hpp"
#include "dit/sampler.hpp"

namespace cocodiff::dit {
namespace {

TEST(Sampler, LinearScheduleWithoutShift) {
  ModelConfig m;
  m.shift = 1.0;
  const std::vector<double> s = sigma_schedule(m, 4, 4096);
  ASSERT_EQ(s.size(), 5u);
  EXPECT_DOUBLE_EQ(s[0], 1.0);
  EXPECT_DOUBLE_EQ(s[1], 0.75);
  EXPECT_DOUBLE_EQ(s[3], 0.25);
  EXPECT_DOUBLE_EQ(s[4], 0.0);
}

TEST(Sampler, Sd3StaticShift) {
  ModelConfig m;
  m.shift = 3.0;
  const std::vector<double> s = sigma_schedule(m, 2, 4096);  // linspace(1, 0.5, 2)
  EXPECT_DOUBLE_EQ(s[0], 1.0);
  EXPECT_DOUBLE_EQ(s[1], 3 * 0.5 / (1 + 2 * 0.5));  // 0.75
}

TEST(Sampler, FluxResolutionDependentShift) {
  ModelConfig m;
  m.dynamic_shift = true;  // base 0.5 @ 256 tokens, max 1.15 @ 4096
  EXPECT_NEAR(dynamic_shift_mu(m, 256), 0.5, 1e-12);
  EXPECT_NEAR(dynamic_shift_mu(m, 4096), 1.15, 1e-12);
  const std::vector<double> s = sigma_schedule(m, 2, 4096);
  EXPECT_NEAR(s[1], std::exp(1.15) / (std::exp(1.15) + 1.0), 1e-12);
  // Larger images shift further towards high noise.
  EXPECT_GT(sigma_schedule(m, 4, 16384)[2], sigma_schedule(m, 4, 1024)[2]);
}

TEST(Sampler, EulerCfgAndInpaint) {
  LocalComm comm;
  const Exec ex{comm, false};
  Mat x(1, 2), v(1, 2);
  x << 1, 2;
  v << 4, -4;
  Tensor xt = Tensor::from(x);
  euler_step(ex, xt, Tensor::from(v), 1.0, 0.75);
  EXPECT_FLOAT_EQ(xt.mat()(0, 0), 0.0f);
  EXPECT_FLOAT_EQ(xt.mat()(0, 1), 3.0f);
  Mat c(1, 2), u(1, 2);
  c << 3, 4;
  u << 1, 0;
  const Tensor g = cfg_combine(ex, Tensor::from(c), Tensor::from(u), 2.0, false);
  EXPECT_FLOAT_EQ(g.mat()(0, 0), 5.0f);
  EXPECT_FLOAT_EQ(g.mat()(0, 1), 8.0f);
  const Tensor r = cfg_combine(ex, Tensor::from(c), Tensor::from(u), 2.0, true);
  EXPECT_NEAR(r.mat().row(0).norm(), 5.0f, 1e-5);  // rescaled to |cond| = 5
  EXPECT_NEAR(r.mat()(0, 1) / r.mat()(0, 0), 8.0f / 5.0f, 1e-5);
  Mat mask(1, 2), known(1, 2), noise(1, 2);
  mask << 1, 0;
  known << 10, 20;
  noise << -1, -2;
  Tensor xi = Tensor::from(x);
  inpaint_blend(ex, xi, Tensor::from(mask), Tensor::from(known), Tensor::from(noise), 0.25);
  EXPECT_FLOAT_EQ(xi.mat()(0, 0), 1.0f);               // generated
  EXPECT_FLOAT_EQ(xi.mat()(0, 1), 0.75f * 20 - 0.5f);  // re-noised known
}

TEST(Quality, MetricsOnKnownCases) {
  Mat a(1, 4), b(1, 4);
  a << 0, 1, 2, 3;
  b << 0, 1, 2, 4;
  const Tensor ta = Tensor::from(a), tb = Tensor::from(b);
  EXPECT_DOUBLE_EQ(relative_l2(ta, ta), 0.0);
  EXPECT_NEAR(relative_l2(ta, tb), 1.0 / std::sqrt(14.0), 1e-12);
  EXPECT_DOUBLE_EQ(data_range(ta), 3.0);
  EXPECT_NEAR(psnr(ta, tb, 3.0), 10 * std::log10(9.0 / 0.25), 1e-9);
  EXPECT_EQ(psnr(ta, ta, 3.0), std::numeric_limits<double>::infinity());
  // SSIM: identical images give 1, a contrast-inverted one is negative.
  Mat img(2, 100);
  for (int i = 0; i < 200; ++i) img.data()[i] = static_cast<float>((i * 37) % 11);
  const Tensor ti = Tensor::from(img);
  EXPECT_NEAR(ssim(ti, ti, 10, 10, 10.0), 1.0, 1e-12);
  const Tensor inv = Tensor::from(Mat((10.0f - img.array()).matrix()));
  EXPECT_LT(ssim(ti, inv, 10, 10, 10.0), 0.0);
  Mat noisy = img;
  noisy(0, 55) += 3;
  const double s = ssim(ti, Tensor::from(noisy), 10, 10, 10.0);
  EXPECT_GT(s, 0.5);
  EXPECT_LT(s, 1.0);
}

}  // namespace
}  // namespace cocodiff::dit
