#include "calibrate/least_squares.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/errors.hpp"

namespace cocodiff::calibrate {

namespace {

double sum_sq(const std::vector<double>& r) {
  double s = 0;
  for (double v : r) s += v * v;
  return s;
}

}  // namespace

double median(std::vector<double> v) {
  COCO_CHECK(!v.empty(), "the median of no values");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double golden_section_min(const std::function<double(double)>& g, double lo, double hi,
                          double abs_tolerance) {
  const double r = (std::sqrt(5.0) - 1) / 2;
  double a = lo, b = hi, c = b - r * (b - a), d = a + r * (b - a);
  double gc = g(c), gd = g(d);
  for (int i = 0; i < 80 && b - a > std::max(abs_tolerance, 1e-12 * std::max(1.0, std::abs(b)));
       ++i) {
    if (gc < gd) {
      b = d;
      d = c;
      gd = gc;
      c = b - r * (b - a);
      gc = g(c);
    } else {
      a = c;
      c = d;
      gc = gd;
      d = a + r * (b - a);
      gd = g(d);
    }
  }
  return (a + b) / 2;
}

bool solve_linear(std::vector<std::vector<double>> a, std::vector<double> b,
                  std::vector<double>& x) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    if (!(std::abs(a[piv][c]) > 0)) return false;
    std::swap(a[c], a[piv]);
    std::swap(b[c], b[piv]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      if (f == 0) continue;
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  x.assign(n, 0);
  for (size_t c = n; c-- > 0;) {
    double s = b[c];
    for (size_t k = c + 1; k < n; ++k) s -= a[c][k] * x[k];
    x[c] = s / a[c][c];
  }
  return std::all_of(x.begin(), x.end(), [](double v) { return std::isfinite(v); });
}

std::vector<std::vector<double>> jacobian(const ResidualFn& f, const std::vector<LsqParam>& ps,
                                          const std::vector<double>& x,
                                          const std::vector<double>& r0, int& evaluations) {
  std::vector<std::vector<double>> jac(r0.size(), std::vector<double>(ps.size(), 0.0));
  for (size_t j = 0; j < ps.size(); ++j) {
    if (!ps[j].fit) continue;
    std::vector<double> xs = x;
    double h = ps[j].step;
    if (xs[j] + h > ps[j].hi) h = -h;
    xs[j] += h;
    const std::vector<double> r = f(xs);
    ++evaluations;
    COCO_CHECK(r.size() == r0.size(), "residual count changed between evaluations");
    for (size_t i = 0; i < r.size(); ++i) jac[i][j] = (r[i] - r0[i]) / h;
  }
  return jac;
}

std::vector<bool> determined_columns(const std::vector<std::vector<double>>& jac,
                                     const std::vector<bool>& candidates, double tolerance) {
  const size_t k = candidates.size();
  std::vector<bool> keep(k, false);
  std::vector<std::vector<double>> basis;  // orthonormal, of the kept columns
  for (size_t j = 0; j < k; ++j) {
    if (!candidates[j]) continue;
    std::vector<double> v(jac.size());
    for (size_t i = 0; i < jac.size(); ++i) v[i] = jac[i][j];
    const double norm = std::sqrt(sum_sq(v));
    if (!(norm > 0) || !std::isfinite(norm)) continue;
    for (int pass = 0; pass < 2; ++pass) {  // twice: Gram-Schmidt loses orthogonality once
      for (const std::vector<double>& b : basis) {
        double d = 0;
        for (size_t i = 0; i < v.size(); ++i) d += v[i] * b[i];
        for (size_t i = 0; i < v.size(); ++i) v[i] -= d * b[i];
      }
    }
    const double rest = std::sqrt(sum_sq(v));
    if (rest < tolerance * norm) continue;
    for (double& e : v) e /= rest;
    basis.push_back(std::move(v));
    keep[j] = true;
  }
  return keep;
}

namespace {

// The normal equations over the parameters held[p].fit: gradient g = J^T r and a = J^T J.
void normal_equations(const std::vector<std::vector<double>>& jac,
                      const std::vector<double>& residuals, const std::vector<LsqParam>& held,
                      std::vector<double>& g, std::vector<std::vector<double>>& a) {
  const size_t k = held.size();
  g.assign(k, 0.0);
  a.assign(k, std::vector<double>(k, 0.0));
  for (size_t i = 0; i < jac.size(); ++i)
    for (size_t p = 0; p < k; ++p) {
      if (!held[p].fit) continue;
      g[p] += jac[i][p] * residuals[i];
      for (size_t q = 0; q < k; ++q)
        if (held[q].fit) a[p][q] += jac[i][p] * jac[i][q];
    }
}

// The damped step over the free set, dropping parameters that sit on a bound the step pushes
// out of.
std::vector<double> bounded_step(const std::vector<std::vector<double>>& a,
                                 const std::vector<double>& g, const std::vector<LsqParam>& held,
                                 const std::vector<LsqParam>& ps, const std::vector<double>& x,
                                 double lambda) {
  const size_t k = ps.size();
  std::vector<bool> active(k);
  for (size_t j = 0; j < k; ++j) active[j] = held[j].fit;
  std::vector<double> step(k, 0.0);
  for (size_t round = 0; round <= k; ++round) {
    std::vector<size_t> idx;
    for (size_t j = 0; j < k; ++j)
      if (active[j]) idx.push_back(j);
    if (idx.empty()) break;
    std::vector<std::vector<double>> m(idx.size(), std::vector<double>(idx.size()));
    std::vector<double> rhs(idx.size()), d;
    for (size_t p = 0; p < idx.size(); ++p) {
      for (size_t q = 0; q < idx.size(); ++q) m[p][q] = a[idx[p]][idx[q]];
      m[p][p] += lambda * std::max(a[idx[p]][idx[p]], 1e-30);
      rhs[p] = -g[idx[p]];
    }
    if (!solve_linear(m, rhs, d)) break;
    std::fill(step.begin(), step.end(), 0.0);
    bool dropped = false;
    for (size_t p = 0; p < idx.size(); ++p) {
      const size_t j = idx[p];
      step[j] = d[p];
      const bool at_lo = x[j] <= ps[j].lo && d[p] < 0;
      const bool at_hi = x[j] >= ps[j].hi && d[p] > 0;
      if (at_lo || at_hi) {
        active[j] = false;
        dropped = true;
      }
    }
    if (!dropped) break;
  }
  return step;
}

// How one iteration's damped steps ended: a step was taken, none could be, or the fit converged.
enum class StepOutcome { kAccepted, kStuck, kConverged };

// Up to 12 damped steps from res, raising lambda after each that does not lower the sum of
// squares (or that f cannot evaluate); the first that does is taken into res.
StepOutcome damped_step(const ResidualFn& f, const std::vector<LsqParam>& ps,
                        const std::vector<LsqParam>& held,
                        const std::vector<std::vector<double>>& a, const std::vector<double>& g,
                        const LsqOptions& options, double& lambda, LsqResult& res) {
  const size_t k = ps.size();
  bool accepted = false;
  double new_sse = res.sse;
  for (int tries = 0; tries < 12 && !accepted; ++tries) {
    const std::vector<double> step = bounded_step(a, g, held, ps, res.x, lambda);
    std::vector<double> xn = res.x;
    bool moved = false;
    for (size_t j = 0; j < k; ++j) {
      xn[j] = std::clamp(res.x[j] + step[j], ps[j].lo, ps[j].hi);
      moved = moved || xn[j] != res.x[j];
    }
    if (!moved) break;
    std::vector<double> rn;
    try {
      rn = f(xn);
    } catch (const UserError&) {  // a trial outside what the model can time (an overflow)
      lambda *= 4;
      continue;
    }
    ++res.evaluations;
    new_sse = sum_sq(rn);
    if (new_sse < res.sse) {
      accepted = true;
      const double gain = res.sse - new_sse;
      const bool done = gain < options.relative_tolerance * res.sse;
      res.x = xn;
      res.residuals = std::move(rn);
      res.sse = new_sse;
      lambda = std::max(lambda / 3, 1e-12);
      if (done) return StepOutcome::kConverged;
    } else {
      lambda *= 4;
    }
  }
  return accepted ? StepOutcome::kAccepted : StepOutcome::kStuck;
}

}  // namespace

LsqResult least_squares(const ResidualFn& f, const std::vector<LsqParam>& ps,
                        const LsqOptions& options) {
  const size_t k = ps.size();
  LsqResult res;
  res.x.resize(k);
  for (size_t j = 0; j < k; ++j) res.x[j] = std::clamp(ps[j].x, ps[j].lo, ps[j].hi);
  res.residuals = f(res.x);
  ++res.evaluations;
  res.sse = sum_sq(res.residuals);
  std::vector<std::vector<double>> jac = jacobian(f, ps, res.x, res.residuals, res.evaluations);
  std::vector<bool> fit(k);
  for (size_t j = 0; j < k; ++j) fit[j] = ps[j].fit;
  const size_t rows = options.data_rows == 0 ? jac.size() : std::min(options.data_rows, jac.size());
  res.free = determined_columns({jac.begin(), jac.begin() + static_cast<std::ptrdiff_t>(rows)}, fit,
                                options.collinear_tolerance);
  std::vector<LsqParam> held = ps;
  for (size_t j = 0; j < k; ++j) held[j].fit = res.free[j];

  double lambda = 1e-3;
  for (int it = 0; it < options.max_iterations && res.sse > options.absolute_tolerance; ++it) {
    res.iterations = it + 1;
    // Normal equations over the free parameters.
    std::vector<double> g;
    std::vector<std::vector<double>> a;
    normal_equations(jac, res.residuals, held, g, a);
    const StepOutcome outcome = damped_step(f, ps, held, a, g, options, lambda, res);
    if (outcome == StepOutcome::kConverged) return res;
    if (outcome == StepOutcome::kStuck) break;
    jac = jacobian(f, held, res.x, res.residuals, res.evaluations);
  }
  return res;
}

}  // namespace cocodiff::calibrate
