#include "dit/sampler.hpp"

#include <cmath>

#include "core/errors.hpp"

namespace cocodiff::dit {

double shift_sigma(double sigma, double shift) { return shift * sigma / (1 + (shift - 1) * sigma); }

double dynamic_shift_mu(const ModelConfig& cfg, std::int64_t image_tokens) {
  const double m = (cfg.max_shift - cfg.base_shift) / (cfg.max_seq_len - cfg.base_seq_len);
  const double b = cfg.base_shift - m * cfg.base_seq_len;
  return static_cast<double>(image_tokens) * m + b;
}

double time_shift(double mu, double sigma) {
  if (sigma <= 0) return 0;
  return std::exp(mu) / (std::exp(mu) + (1.0 / sigma - 1.0));
}

std::vector<double> sigma_schedule(const ModelConfig& cfg, int steps, std::int64_t image_tokens) {
  COCO_CHECK(steps >= 1, "sigma_schedule needs at least one step");
  std::vector<double> s;
  const double mu = dynamic_shift_mu(cfg, image_tokens);
  for (int i = 0; i < steps; ++i) {
    // linspace(1, 1/N, N)
    double sigma = steps == 1 ? 1.0 : 1.0 + (1.0 / steps - 1.0) * i / (steps - 1);
    if (cfg.dynamic_shift)
      sigma = time_shift(mu, sigma);
    else if (cfg.shift != 1.0)
      sigma = shift_sigma(sigma, cfg.shift);
    s.push_back(sigma);
  }
  s.push_back(0.0);
  return s;
}

// euler_step: x[n, F] += (sigma_next - sigma) * v[n, F]
void euler_step(const Exec& ex, Tensor& x, const Tensor& v, double sigma, double sigma_next) {
  COCO_CHECK(x.rows() == v.rows() && x.cols() == v.cols(), "euler_step shapes");
  if (!ex.phantom) x.mat() += static_cast<float>(sigma_next - sigma) * v.mat();
  ex.charge(OpKind::kElementwise, 2.0 * static_cast<double>(x.numel()),
            3.0 * static_cast<double>(x.numel()), "euler_step");
}

// cfg_combine: y[n, F] = u + s (c - u);  rescaled: y *= |c|_row / |y|_row
Tensor cfg_combine(const Exec& ex, const Tensor& cond, const Tensor& uncond, double scale,
                   bool rescale) {
  COCO_CHECK(cond.rows() == uncond.rows() && cond.cols() == uncond.cols(), "cfg shapes");
  Tensor y = Tensor::zeros(cond.rows(), cond.cols(), ex.phantom);
  if (!ex.phantom) {
    y.mat() = uncond.mat() + static_cast<float>(scale) * (cond.mat() - uncond.mat());
    if (rescale) {
      const Eigen::VectorXf cn = cond.mat().rowwise().norm();
      const Eigen::VectorXf yn = y.mat().rowwise().norm();
      y.mat().array().colwise() *= (cn.array() / yn.array().max(1e-12f));
    }
  }
  ex.charge(OpKind::kElementwise, (rescale ? 9.0 : 3.0) * static_cast<double>(y.numel()),
            3.0 * static_cast<double>(y.numel()), "cfg_combine");
  return y;
}

void inpaint_blend(const Exec& ex, Tensor& x, const Tensor& mask, const Tensor& known,
                   const Tensor& noise, double sigma) {
  COCO_CHECK(mask.rows() == x.rows() && known.rows() == x.rows() && noise.rows() == x.rows(),
             "inpaint shapes");
  if (!ex.phantom) {
    const float s = static_cast<float>(sigma);
    const Eigen::ArrayXXf noised = (1.0f - s) * known.mat().array() + s * noise.mat().array();
    x.mat().array() = mask.mat().array() * x.mat().array() + (1.0f - mask.mat().array()) * noised;
  }
  ex.charge(OpKind::kElementwise, 6.0 * static_cast<double>(x.numel()),
            5.0 * static_cast<double>(x.numel()), "inpaint_blend");
}

}  // namespace cocodiff::dit
