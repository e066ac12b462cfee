#pragma once
// Roofline device model: time = max(flops / (peak * eff_kind), bytes / (hbm * eff_kind)) + launch.

#include <array>
#include <string>

#include "core/op_cost.hpp"
#include "core/sim_time.hpp"

namespace cocodiff {

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  /// Virtual time one tile needs for `cost`.
  virtual SimTime time(const OpCost& cost) const = 0;
  virtual std::string name() const = 0;
};

struct RooflineParams {
  std::string name = "device";
  double peak_flops_per_s = 1e12;
  double hbm_bytes_per_s = 1e11;
  SimTime launch_overhead;
  /// Achieved fraction of peak compute, per OpKind.
  std::array<double, kNumOpKinds> compute_efficiency{1, 1, 1, 1, 1};
  /// Achieved fraction of HBM bandwidth, per OpKind.
  std::array<double, kNumOpKinds> memory_efficiency{1, 1, 1, 1, 1};
};

class RooflineDevice final : public DeviceModel {
 public:
  explicit RooflineDevice(RooflineParams p);
  SimTime time(const OpCost& cost) const override;
  std::string name() const override { return p_.name; }
  const RooflineParams& params() const { return p_; }

 private:
  RooflineParams p_;
};

}  // namespace cocodiff
