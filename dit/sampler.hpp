#pragma once
// Flow-matching Euler sampling (the SD3 / FLUX / Qwen-Image default): x_{i+1} = x_i +
// (sigma_{i+1} - sigma_i) v(x_i, sigma_i), sigmas from 1 down to 0 (linear 1 -> 1/N, shifted
// where the model shifts), classifier-free guidance and inpainting as the pipelines do them.
//
//   std::vector<double> s = sigma_schedule(cfg, 28, cfg.image_tokens(1024));  // 29 values
//   euler_step(ex, x, v, s[i], s[i + 1]);

#include <cstdint>
#include <vector>

#include "core/tensor.hpp"
#include "dit/exec.hpp"
#include "dit/model_config.hpp"

namespace cocodiff::dit {

/// Static shift (SD3): s' = shift s / (1 + (shift - 1) s).
double shift_sigma(double sigma, double shift);
/// FLUX's resolution-dependent mu: linear in the image token count between
/// (base_seq_len, base_shift) and (max_seq_len, max_shift).
double dynamic_shift_mu(const ModelConfig& cfg, std::int64_t image_tokens);
/// Exponential time shift: s' = e^mu / (e^mu + (1/s - 1)).
double time_shift(double mu, double sigma);
/// steps + 1 sigmas: linspace(1, 1/steps, steps) shifted as the model does, then a final 0.
std::vector<double> sigma_schedule(const ModelConfig& cfg, int steps, std::int64_t image_tokens);

/// x += (sigma_next - sigma) v.   x, v: [n, F].
void euler_step(const Exec& ex, Tensor& x, const Tensor& v, double sigma, double sigma_next);

/// Classifier-free guidance: uncond + scale (cond - uncond). With `rescale` (Qwen-Image true
/// CFG) each token's result is scaled back to the norm of its conditional prediction.
Tensor cfg_combine(const Exec& ex, const Tensor& cond, const Tensor& uncond, double scale,
                   bool rescale);

/// Inpainting after a step to noise level sigma: x = mask x + (1 - mask) noised(known) with
/// noised(known) = (1 - sigma) known + sigma noise. mask 1 = generate, 0 = keep known.
void inpaint_blend(const Exec& ex, Tensor& x, const Tensor& mask, const Tensor& known,
                   const Tensor& noise, double sigma);

}  // namespace cocodiff::dit
