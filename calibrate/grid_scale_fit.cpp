#include "calibrate/grid_scale_fit.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include "core/errors.hpp"

namespace cocodiff::calibrate {

namespace {

std::optional<OpKind> kind_of(const std::string& op) {
  static const std::map<std::string, OpKind, std::less<>> kKinds = {
      {"linear", OpKind::kGemm},
      {"linear_heads", OpKind::kGemm},
      {"adaln", OpKind::kGemm},
      {"sdpa", OpKind::kAttention},
      {"rms_norm", OpKind::kNorm},
      {"norm_modulate", OpKind::kNorm},
      {"rope", OpKind::kElementwise},
      {"gelu", OpKind::kElementwise},
      {"gated_residual", OpKind::kElementwise},
      {"pack", OpKind::kCopy},
      {"unpack", OpKind::kCopy},
      {"concat", OpKind::kCopy}};
  const auto it = kKinds.find(op);
  if (it == kKinds.end()) return std::nullopt;
  return it->second;
}

using Key = std::tuple<std::string, std::string, std::array<std::int64_t, 4>>;

}  // namespace

GridScaleFit fit_grid_scale(const std::vector<EagerOpPoint>& mine,
                            const std::vector<EagerOpPoint>& reference) {
  // The reference's time of each shape: the median of its points (several machines).
  std::map<Key, std::vector<double>> ref_times;
  for (const EagerOpPoint& p : reference)
    if (p.device_us > 0) ref_times[{p.op, p.label, p.dims}].push_back(p.device_us);
  std::map<Key, double> ref;
  for (auto& [key, v] : ref_times) {
    std::sort(v.begin(), v.end());
    ref[key] = v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  GridScaleFit f;
  std::array<double, kNumOpKinds> sum_log{};
  std::array<int, kNumOpKinds> count{};
  for (const EagerOpPoint& p : mine) {
    if (!(p.device_us > 0)) continue;
    const std::optional<OpKind> kind = kind_of(p.op);
    const auto it = ref.find({p.op, p.label, p.dims});
    if (!kind || it == ref.end()) {
      f.unmatched.push_back(p.where);
      continue;
    }
    const double ratio = p.device_us / it->second;
    GridScaleFit::OpRatios& o = f.ops[p.op];
    o.kind = *kind;
    o.min_ratio = o.points == 0 ? ratio : std::min(o.min_ratio, ratio);
    o.max_ratio = o.points == 0 ? ratio : std::max(o.max_ratio, ratio);
    ++o.points;
    o.mine_us += p.device_us;
    o.reference_us += it->second;
    const auto k = static_cast<size_t>(*kind);
    sum_log[k] += std::log(ratio);
    ++count[k];
  }
  if (f.ops.empty())
    throw InputError(
        "calibrate: --grid-reference: no op with a device time was measured at the same shape "
        "(op, label, tokens, heads, k, n) in the fitted files and in the reference");
  for (size_t k = 0; k < f.scale.size(); ++k)
    if (count[k] > 0) {
      f.scale[k] = std::exp(sum_log[k] / count[k]);
      f.fitted[k] = true;
    }
  return f;
}

}  // namespace cocodiff::calibrate
