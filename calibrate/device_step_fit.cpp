#include "calibrate/device_step_fit.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "calibrate/least_squares.hpp"

namespace cocodiff::calibrate {

DeviceStepFit fit_device_step(const std::vector<StepPoint>& steps,
                              const DeviceStepPredictor& predict, double current) {
  DeviceStepFit f;
  f.step_factor = current;
  for (const StepPoint& p : steps) f.resolution = std::max(f.resolution, p.resolution);
  std::map<std::string, std::vector<double>> rows;  // by file
  for (const StepPoint& p : steps)
    if (p.strategy == "flat" && p.gpus == 1 && p.resolution == f.resolution)
      rows[p.source].push_back(p.median_ms);
  if (rows.empty()) return f;
  for (auto& [source, ms] : rows) {
    DeviceStepCase c;
    c.source = source;
    c.rows = static_cast<int>(ms.size());
    c.measured_ms = median(ms);
    f.cases.push_back(c);
  }
  std::map<double, double> cache;
  const auto step_ms = [&](double factor) {
    const auto [it, fresh] = cache.try_emplace(factor, 0.0);
    if (fresh) it->second = predict(f.resolution, factor);
    return it->second;
  };
  const auto loss = [&](double factor) {
    double sum = 0;
    for (const DeviceStepCase& c : f.cases) {
      const double e = std::log(step_ms(factor)) - std::log(c.measured_ms);
      sum += e * e;
    }
    return sum;
  };
  const double up = current * 1.1;
  f.sensitivity = std::log(step_ms(up) / step_ms(current)) / std::log(1.1);
  if (f.sensitivity >= 0.5) {
    f.fitted = true;
    const double best =
        golden_section_min(loss, kMinKernelStepFactor, kMaxKernelStepFactor, 0.0005);
    f.step_factor = std::round(best * 1000) / 1000;
  }
  for (DeviceStepCase& c : f.cases) c.predicted_ms = step_ms(f.step_factor);
  f.rms_log = std::sqrt(loss(f.step_factor) / static_cast<double>(f.cases.size()));
  f.predictions = static_cast<int>(cache.size());
  return f;
}

}  // namespace cocodiff::calibrate
