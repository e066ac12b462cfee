#pragma once
// Row-major fp32 tensors over Eigen, with a phantom (shape-only) form for `math = "skip"`.
//
//   Tensor x = Tensor::zeros(tokens, hidden, phantom);   // no allocation when phantom
//   if (!x.phantom()) x.mat() = a.mat() * w.mat().transpose();
//   comm.all_to_all(x.data(), y.data(), count);           // empty spans move sizes only

#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <string>

#include "core/errors.hpp"

namespace cocodiff {

/// Activations and weights: row-major like PyTorch checkpoints.
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vec = Eigen::Matrix<float, 1, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<Mat>;
using ConstMatMap = Eigen::Map<const Mat>;

/// A 2-D fp32 tensor (rows x cols) that either holds data or only its shape (phantom).
class Tensor {
 public:
  Tensor() = default;
  /// Zero-filled tensor; phantom tensors allocate nothing.
  static Tensor zeros(std::int64_t rows, std::int64_t cols, bool phantom);
  /// Uninitialised tensor, for an output whose every element is written before it is read.
  static Tensor uninitialized(std::int64_t rows, std::int64_t cols, bool phantom);
  /// Wraps existing data.
  static Tensor from(Mat m);

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t numel() const { return rows_ * cols_; }
  bool phantom() const { return phantom_; }
  std::string shape_str() const;

  /// The data; aborts on a phantom tensor.
  Mat& mat() {
    COCO_CHECK(!phantom_, "mat() on a phantom tensor");
    return m_;
  }
  const Mat& mat() const {
    COCO_CHECK(!phantom_, "mat() on a phantom tensor");
    return m_;
  }
  /// Flat view of the data; empty when phantom (the communicator then moves sizes only).
  std::span<float> data() {
    return phantom_ ? std::span<float>() : std::span<float>(m_.data(), m_.size());
  }
  std::span<const float> data() const {
    return phantom_ ? std::span<const float>() : std::span<const float>(m_.data(), m_.size());
  }

 private:
  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  bool phantom_ = false;
  Mat m_;
};

inline Tensor Tensor::zeros(std::int64_t rows, std::int64_t cols, bool phantom) {
  Tensor t;
  t.rows_ = rows;
  t.cols_ = cols;
  t.phantom_ = phantom;
  if (!phantom) t.m_ = Mat::Zero(rows, cols);
  return t;
}

inline Tensor Tensor::uninitialized(std::int64_t rows, std::int64_t cols, bool phantom) {
  Tensor t;
  t.rows_ = rows;
  t.cols_ = cols;
  t.phantom_ = phantom;
  if (!phantom) t.m_.resize(rows, cols);
  return t;
}

inline Tensor Tensor::from(Mat m) {
  Tensor t;
  t.rows_ = m.rows();
  t.cols_ = m.cols();
  t.m_ = std::move(m);
  return t;
}

inline std::string Tensor::shape_str() const {
  return "[" + std::to_string(rows_) + " x " + std::to_string(cols_) +
         (phantom_ ? ", phantom]" : "]");
}

}  // namespace cocodiff
