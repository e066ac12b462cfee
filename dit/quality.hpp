#pragma once
// Output quality against a reference run (V-Major's lossy sends are judged by these).
//
//   double e = relative_l2(exact.latent, approx.latent);                 // ||a - b|| / ||a||
//   double p = psnr(exact.latent, approx.latent, data_range(exact.latent));
//   double s = ssim(exact.latent, approx.latent, h, w, data_range(exact.latent));

#include "core/tensor.hpp"

namespace cocodiff::dit {

/// ||test - ref||_2 / ||ref||_2 (0 when both are zero; infinity when only ref is zero).
double relative_l2(const Tensor& ref, const Tensor& test);
/// max(ref) - min(ref): the dynamic range used by psnr/ssim on latents.
double data_range(const Tensor& ref);
/// Peak signal-to-noise ratio in dB: 10 log10(range^2 / MSE); infinity when identical.
double psnr(const Tensor& ref, const Tensor& test, double range);
/// Mean structural similarity: each row of ref/test is one height x width channel image;
/// 7x7 uniform windows (valid region), K1 = 0.01, K2 = 0.03 (scikit-image defaults),
/// averaged over windows and channels.
double ssim(const Tensor& ref, const Tensor& test, int height, int width, double range);

}  // namespace cocodiff::dit
