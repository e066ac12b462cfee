#pragma once
// Bounded nonlinear least squares (Levenberg-Marquardt with a forward-difference Jacobian) for
// the calibration fits: minimise sum_i r_i(x)^2 over x within per-parameter bounds, where r is
// any function of a handful of parameters (here: log predicted / measured time, the prediction
// coming from a simulation). Parameters the residuals cannot tell apart are found first
// (determined_columns) and held where they are.
//
//   std::vector<LsqParam> ps = {{"call_us", 10, 0, 1e6, 0.05}, {"log_bw", 0, -9, 9, 1e-3}};
//   LsqResult r = least_squares([&](const std::vector<double>& x) { return residuals(x); }, ps);
//   r.x;  r.sse;  r.free;   // free[j]: parameter j was determined by the data and fitted

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace cocodiff::calibrate {

struct LsqParam {
  std::string name;
  double x = 0;           // the start, in the fit's own coordinates
  double lo = 0, hi = 0;  // bounds (inclusive)
  double step = 1e-3;     // forward-difference step (absolute, in the same coordinates)
  bool fit = true;        // false: held at x
};

struct LsqOptions {
  int max_iterations = 60;
  /// Stop when an accepted step lowers the sum of squares by less than this fraction of it.
  double relative_tolerance = 1e-10;
  /// Stop when the sum of squares is below this (an exact fit).
  double absolute_tolerance = 1e-18;
  /// A column whose part outside the span of the columns before it is below this fraction of
  /// its norm is not determined (determined_columns).
  double collinear_tolerance = 0.02;
  /// Rows of the residual vector that are data (the first ones): only these decide which
  /// parameters are determined; the rest are priors. 0: every row.
  std::size_t data_rows = 0;
};

struct LsqResult {
  std::vector<double> x;
  std::vector<double> residuals;
  double sse = 0;
  int iterations = 0;
  int evaluations = 0;
  std::vector<bool> free;  // per parameter: fitted (determined by the residuals)
};

using ResidualFn = std::function<std::vector<double>(const std::vector<double>& x)>;

/// Jacobian of f at x (n rows, one column per parameter), by forward differences of each
/// parameter's step (taken backwards at an upper bound). Columns of held parameters are zero.
std::vector<std::vector<double>> jacobian(const ResidualFn& f, const std::vector<LsqParam>& ps,
                                          const std::vector<double>& x,
                                          const std::vector<double>& r0, int& evaluations);

/// Greedy in column order: a column is kept when, after removing its projection on the kept
/// columns, at least `tolerance` of its norm remains (and it is not zero). So of several
/// parameters the residuals cannot tell apart, the first in order is kept.
std::vector<bool> determined_columns(const std::vector<std::vector<double>>& jac,
                                     const std::vector<bool>& candidates, double tolerance);

/// Minimises |f(x)|^2 over the parameters with fit = true and determined at the start (see
/// determined_columns), from their start values, within their bounds. f may throw; it is not
/// called with x outside the bounds.
LsqResult least_squares(const ResidualFn& f, const std::vector<LsqParam>& ps,
                        const LsqOptions& options = {});

/// The minimum of a unimodal g on [lo, hi] by golden-section search, stopped when the bracket
/// is at most `abs_tolerance` wide (or 1e-12 of its end, or after 80 steps): the bracket's
/// middle.
double golden_section_min(const std::function<double(double)>& g, double lo, double hi,
                          double abs_tolerance = 0);

/// The median of v: its middle value, or the mean of the middle two for an even count. v must
/// not be empty.
double median(std::vector<double> v);

/// Solves a x = b for a small dense symmetric positive-definite-ish a (Gaussian elimination,
/// partial pivoting); false when singular.
bool solve_linear(std::vector<std::vector<double>> a, std::vector<double> b,
                  std::vector<double>& x);

}  // namespace cocodiff::calibrate
