#include "net_models/device_model.hpp"

#include <algorithm>

#include "core/errors.hpp"

namespace cocodiff {

RooflineDevice::RooflineDevice(RooflineParams p) : p_(std::move(p)) {
  COCO_CHECK(p_.peak_flops_per_s > 0 && p_.hbm_bytes_per_s > 0, "device peaks must be positive");
}

SimTime RooflineDevice::time(const OpCost& cost) const {
  const size_t k = static_cast<size_t>(cost.kind);
  double compute_s = cost.flops / (p_.peak_flops_per_s * p_.compute_efficiency[k]);
  double memory_s = cost.bytes / (p_.hbm_bytes_per_s * p_.memory_efficiency[k]);
  return SimTime::from_seconds(std::max(compute_s, memory_s)) + p_.launch_overhead;
}

}  // namespace cocodiff
