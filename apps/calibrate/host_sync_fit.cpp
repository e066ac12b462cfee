#include "apps/calibrate/host_sync_fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "apps/calibrate/least_squares.hpp"
#include "core/errors.hpp"

namespace cocodiff::calibrate {

HostSyncFit fit_host_sync(const std::vector<StepPoint>& steps, const StepPredictor& predict) {
  HostSyncFit f;
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
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    HostSyncCase c;
    c.source = key.first;
    c.gpus = key.second;
    c.rows = static_cast<int>(n);
    c.measured_ms = n % 2 == 1 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    f.cases.push_back(c);
  }

  std::map<std::pair<int, double>, double> cache;
  const auto step_ms = [&](int gpus, double s) {
    const auto [it, fresh] = cache.try_emplace({gpus, s}, 0.0);
    if (fresh) it->second = predict(gpus, f.resolution, s);
    return it->second;
  };
  const auto loss = [&](double s) {
    double sum = 0;
    for (const HostSyncCase& c : f.cases) {
      const double e = std::log(step_ms(c.gpus, s)) - std::log(c.measured_ms);
      sum += e * e;
    }
    return sum;
  };
  // The loss is unimodal in s (each step grows with it).
  f.sync_slowdown = std::round(golden_section_min(loss, 0, kMaxSyncSlowdown, 0.01) * 100) / 100;
  f.rms_log = std::sqrt(loss(f.sync_slowdown) / static_cast<double>(f.cases.size()));
  for (HostSyncCase& c : f.cases) c.predicted_ms = step_ms(c.gpus, f.sync_slowdown);
  f.predictions = static_cast<int>(cache.size());
  return f;
}

}  // namespace cocodiff::calibrate
