#include "calibrate/host_sync_fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "calibrate/least_squares.hpp"
#include "core/errors.hpp"

namespace cocodiff::calibrate {

namespace {

/// The predictor's step times, each (gpus, step factor, sync slowdown) asked once.
class StepTimes {
 public:
  StepTimes(const StepPredictor& predict, int resolution)
      : predict_(predict), resolution_(resolution) {}
  /// Milliseconds of a flat step on `gpus` GPUs with step factor `a` and sync slowdown `s`.
  double ms(int gpus, double a, double s) {
    const auto [it, fresh] = cache_.try_emplace({gpus, a, s}, 0.0);
    if (fresh) it->second = predict_(gpus, resolution_, a, s);
    return it->second;
  }
  /// How many predictions were made.
  int count() const { return static_cast<int>(cache_.size()); }

 private:
  const StepPredictor& predict_;
  int resolution_;
  std::map<std::tuple<int, double, double>, double> cache_;
};

/// H(n) - 1: the sync slowdown's multiplier on n ranks.
double harmonic_excess(int n) {
  double h = 0;
  for (int k = n; k >= 2; --k) h += 1.0 / k;
  return h;
}

/// The cases fitted: per file and GPU count, the median flat step at the lowest resolution.
void read_cases(const std::vector<StepPoint>& steps, HostSyncFit& f) {
  f.resolution = 0;
  for (const StepPoint& p : steps)
    if (p.strategy == "flat" && p.gpus >= 2 && (f.resolution == 0 || p.resolution < f.resolution))
      f.resolution = p.resolution;
  if (f.resolution == 0)
    throw InputError(
        "calibrate: the steps files hold no flat step of two or more GPUs, which the host's "
        "sync slowdown is fitted to");
  std::map<std::pair<std::string, int>, std::vector<double>> rows;
  for (const StepPoint& p : steps)
    if (p.strategy == "flat" && p.gpus >= 2 && p.resolution == f.resolution)
      rows[{p.source, p.gpus}].push_back(p.median_ms);
  for (auto& [key, ms] : rows) {
    HostSyncCase c;
    c.source = key.first;
    c.gpus = key.second;
    c.rows = static_cast<int>(ms.size());
    c.measured_ms = median(ms);
    f.cases.push_back(c);
  }
}

/// Stage 1: each GPU count's whole factor, as gpus -> (factor, files).
std::map<int, std::pair<double, int>> fit_whole_factors(const HostSyncFit& f, StepTimes& step) {
  // The loss is unimodal in the factor: the step grows with it.
  std::map<int, std::pair<double, int>> whole;
  for (const HostSyncCase& c : f.cases) ++whole[c.gpus].second;
  for (auto& [gpus, cw] : whole) {
    const int n = gpus;
    cw.first = golden_section_min(
        [&](double c) {
          double sum = 0;
          for (const HostSyncCase& k : f.cases)
            if (k.gpus == n) {
              const double e = std::log(step.ms(n, c, 0.0)) - std::log(k.measured_ms);
              sum += e * e;
            }
          return sum;
        },
        0.1, kMaxHostScale, 0.0005);
  }
  return whole;
}

/// Stage 2: c_n = a + b (H(n) - 1), weighted least squares over the counts; (a, b).
std::pair<double, double> fit_factor_line(const std::map<int, std::pair<double, int>>& whole) {
  double a = 1, b = 0;
  if (whole.size() == 1) {
    const auto& [n, cw] = *whole.begin();
    b = std::max(0.0, cw.first - 1);
    a = cw.first - b;  // 1, or the whole factor when it is below 1
    b /= harmonic_excess(n);
  } else {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [n, cw] : whole) {
      const double w = cw.second, x = harmonic_excess(n), y = cw.first;
      sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
    }
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
    a = (sy - b * sx) / sw;
    if (b < 0 || a <= 0) b = 0, a = sy / sw;  // no growth with n: one factor for all
  }
  return {a, b};
}

/// Each case predicted with the fitted figures; the rms error and the machines' range.
void score_cases(HostSyncFit& f, StepTimes& step) {
  double sum = 0;
  for (HostSyncCase& c : f.cases) {
    c.predicted_ms = step.ms(c.gpus, f.step_factor, f.sync_slowdown);
    const double e = std::log(c.predicted_ms) - std::log(c.measured_ms);
    sum += e * e;
  }
  f.rms_log = std::sqrt(sum / static_cast<double>(f.cases.size()));
  std::set<std::string> files;
  double lo = INFINITY, hi = 0;
  for (const HostSyncCase& c : f.cases) {
    files.insert(c.source);
    lo = std::min(lo, c.measured_ms / c.predicted_ms);
    hi = std::max(hi, c.measured_ms / c.predicted_ms);
  }
  f.machines = static_cast<int>(files.size());
  if (f.machines >= 2) {
    f.range_low = std::clamp(std::floor(lo * 100 * (1 + 1e-12)) / 100, 0.1, 10.0);
    f.range_high = std::clamp(std::ceil(hi * 100 * (1 - 1e-12)) / 100, f.range_low, 10.0);
  }
}

}  // namespace

HostSyncFit fit_host_sync(const std::vector<StepPoint>& steps, const StepPredictor& predict) {
  HostSyncFit f;
  read_cases(steps, f);
  StepTimes step(predict, f.resolution);
  const std::map<int, std::pair<double, int>> whole = fit_whole_factors(f, step);
  f.gpu_counts = static_cast<int>(whole.size());
  const auto [a, b] = fit_factor_line(whole);
  const auto round2 = [](double v) { return std::round(v * 100) / 100; };
  f.step_factor = std::clamp(round2(a), 0.1, 10.0);
  f.sync_slowdown = std::clamp(round2(b / a), 0.0, 10.0);
  score_cases(f, step);
  f.predictions = step.count();
  return f;
}

}  // namespace cocodiff::calibrate
