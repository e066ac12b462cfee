#include "dit/quality.hpp"

#include <cmath>
#include <limits>

#include "core/errors.hpp"

namespace cocodiff::dit {

namespace {
void check_same(const Tensor& a, const Tensor& b, const char* what) {
  COCO_CHECK(!a.phantom() && !b.phantom(), std::string(what) + " on phantom tensors");
  COCO_CHECK(a.rows() == b.rows() && a.cols() == b.cols(),
             std::string(what) + ": " + a.shape_str() + " vs " + b.shape_str());
}
}  // namespace

double relative_l2(const Tensor& ref, const Tensor& test) {
  check_same(ref, test, "relative_l2");
  const double num = (ref.mat() - test.mat()).cast<double>().norm();
  const double den = ref.mat().cast<double>().norm();
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return num / den;
}

double data_range(const Tensor& ref) {
  COCO_CHECK(!ref.phantom() && ref.numel() > 0, "data_range of an empty tensor");
  return static_cast<double>(ref.mat().maxCoeff()) - static_cast<double>(ref.mat().minCoeff());
}

double psnr(const Tensor& ref, const Tensor& test, double range) {
  check_same(ref, test, "psnr");
  const double mse =
      (ref.mat() - test.mat()).cast<double>().squaredNorm() / static_cast<double>(ref.numel());
  if (mse == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(range * range / mse);
}

double ssim(const Tensor& ref, const Tensor& test, int height, int width, double range) {
  check_same(ref, test, "ssim");
  COCO_CHECK(ref.cols() == std::int64_t{height} * width, "ssim: rows must be height x width");
  constexpr int kWin = 7;
  COCO_CHECK(height >= kWin && width >= kWin, "ssim needs images of at least 7x7");
  const double c1 = (0.01 * range) * (0.01 * range);
  const double c2 = (0.03 * range) * (0.03 * range);
  const double np = kWin * kWin;
  const double cov_norm = np / (np - 1);  // sample covariance, as scikit-image
  double total = 0;
  std::int64_t count = 0;
  for (std::int64_t ch = 0; ch < ref.rows(); ++ch) {
    using Img =
        Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
    const Img a(ref.mat().row(ch).data(), height, width);
    const Img b(test.mat().row(ch).data(), height, width);
    for (int y = 0; y + kWin <= height; ++y)
      for (int x = 0; x + kWin <= width; ++x) {
        const Eigen::ArrayXXd wa = a.block(y, x, kWin, kWin).cast<double>().array();
        const Eigen::ArrayXXd wb = b.block(y, x, kWin, kWin).cast<double>().array();
        const double ma = wa.mean(), mb = wb.mean();
        const double va = cov_norm * ((wa * wa).mean() - ma * ma);
        const double vb = cov_norm * ((wb * wb).mean() - mb * mb);
        const double cab = cov_norm * ((wa * wb).mean() - ma * mb);
        total +=
            ((2 * ma * mb + c1) * (2 * cab + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2));
        ++count;
      }
  }
  return total / static_cast<double>(count);
}

}  // namespace cocodiff::dit
