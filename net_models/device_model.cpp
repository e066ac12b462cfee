#include "net_models/device_model.hpp"

#include <algorithm>
#include <boost/math/distributions/normal.hpp>
#include <cmath>
#include <numeric>

#include "core/errors.hpp"

namespace cocodiff {

bool HostParams::any() const {
  if (op_issue > SimTime{} || collective_issue > SimTime{} || inductor_launch > SimTime{})
    return true;
  for (const SimTime k : kernels)
    if (k > SimTime{}) return true;
  if (!reference.empty()) return true;
  return std::any_of(ops.begin(), ops.end(), [](const auto& o) { return o.second > SimTime{}; });
}

RooflineDevice::RooflineDevice(RooflineParams p) : p_(std::move(p)), has_host_(p_.host.any()) {
  COCO_CHECK(p_.peak_flops_per_s > 0 && p_.hbm_bytes_per_s > 0, "device peaks must be positive");
  COCO_CHECK(p_.overlap_compute_factor >= 1, "overlap compute factor must be >= 1");
  COCO_CHECK(p_.overlap_transfer_factor >= 1, "overlap transfer factor must be >= 1");
  for (const auto& [ranks, f] : p_.overlap_by_group)
    COCO_CHECK(ranks >= 2 && f.compute >= 1 && f.transfer >= 1,
               "overlap factors of a group: 2 ranks or more, factors >= 1");
  COCO_CHECK(p_.rank_spread >= 0 && p_.rank_spread <= 0.2, "rank spread must be in [0, 0.2]");
  COCO_CHECK(p_.step_factor >= 0.1 && p_.step_factor <= 10,
             "kernel step factor must be in [0.1, 10]");
  for (const double w : p_.overlap_kind_weight)
    COCO_CHECK(w >= 0 && w <= 100, "overlap kind weights must be in [0, 100]");
  for (const double s : p_.strided_factor)
    COCO_CHECK(s >= 0.1 && s <= 100, "strided factors must be in [0.1, 100]");
  for (const double s : p_.grid_scale)
    COCO_CHECK(s >= 0.2 && s <= 5, "grid scale factors must be in [0.2, 5]");
  for (const auto& [name, t] : p_.kernels) {
    COCO_CHECK(!t.flops.empty() && t.flops.size() == t.time_s.size(), "kernel table " + name);
    for (size_t i = 0; i < t.flops.size(); ++i)
      COCO_CHECK(t.flops[i] > 0 && t.time_s[i] > 0 && (i == 0 || t.flops[i] > t.flops[i - 1]),
                 "kernel table " + name + ": FLOPs ascending and times positive");
  }
}

double RooflineDevice::overlap_compute_factor_for(int ranks) const {
  const auto it = p_.overlap_by_group.find(ranks);
  return it == p_.overlap_by_group.end() ? p_.overlap_compute_factor : it->second.compute;
}

double RooflineDevice::overlap_transfer_factor_for(int ranks) const {
  const auto it = p_.overlap_by_group.find(ranks);
  return it == p_.overlap_by_group.end() ? p_.overlap_transfer_factor : it->second.transfer;
}

std::vector<int> RooflineDevice::overlap_groups() const {
  std::vector<int> g;
  for (const auto& entry : p_.overlap_by_group) g.push_back(entry.first);
  return g;
}

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double blom_score(int i, int n) {  // the i-th smallest of n (0-based)
  const boost::math::normal_distribution<double> normal;
  return boost::math::quantile(normal, (i + 1 - 0.375) / (n + 0.25));
}

}  // namespace

double rank_spread_top(int ranks) { return ranks > 1 ? blom_score(ranks - 1, ranks) : 0.0; }

double host_issue_scale(double step, double per_rank, double sync, int ranks_per_node, int ranks) {
  double harmonic = 0.0;  // H(ranks), summed from the smallest term
  for (int i = ranks; i >= 1; --i) harmonic += 1.0 / i;
  // One rank alone issues at its ops' measured costs: the step factor is a multi-rank host's.
  return (ranks > 1 ? step : 1.0) *
         (1.0 + per_rank * (ranks_per_node - 1) + sync * (harmonic - 1.0));
}

std::vector<double> rank_speed_factors(int ranks, double spread) {
  if (spread == 0.0 || ranks < 1) return {};
  std::vector<std::uint64_t> key(static_cast<size_t>(ranks));
  std::vector<int> order(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    key[static_cast<size_t>(r)] = splitmix64(static_cast<std::uint64_t>(r));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return key[static_cast<size_t>(a)] < key[static_cast<size_t>(b)];
  });
  std::vector<double> f(static_cast<size_t>(ranks));
  for (int i = 0; i < ranks; ++i)
    f[static_cast<size_t>(order[static_cast<size_t>(i)])] =
        std::max(0.1, 1.0 + spread * (ranks > 1 ? blom_score(i, ranks) : 0.0));
  return f;
}

bool KernelTable::interpolate(double f, double& time_s_out) const {
  if (flops.empty() || !(f >= flops.front() && f <= flops.back())) return false;
  const auto hi = std::lower_bound(flops.begin(), flops.end(), f);
  const auto i = static_cast<size_t>(hi - flops.begin());
  if (flops[i] == f) {
    time_s_out = time_s[i];
    return true;
  }
  const double x0 = std::log(flops[i - 1]), x1 = std::log(flops[i]);
  const double y0 = std::log(time_s[i - 1]), y1 = std::log(time_s[i]);
  time_s_out = std::exp(y0 + (y1 - y0) * (std::log(f) - x0) / (x1 - x0));
  return true;
}

namespace {
/// The op a `X_strided` label names (X), or an empty view.
std::string_view strided_base(std::string_view label) {
  if (label.size() <= kStridedSuffix.size() || !label.ends_with(kStridedSuffix)) return {};
  return label.substr(0, label.size() - kStridedSuffix.size());
}
}  // namespace

void RooflineDevice::note_outside(const OpCost& cost) const {
  std::string what(kernel_class_name(cost.shape.kernel));
  if (what.empty()) what = op_kind_name(cost.kind);
  const auto& d = cost.shape.dims;
  const int n = cost.shape.kernel == KernelClass::kGemm   ? 3
                : cost.shape.kernel == KernelClass::kSdpa ? 5
                                                          : 2;
  for (int i = 0; i < n && cost.shape.kernel != KernelClass::kNone; ++i)
    what += (i == 0 ? " " : "x") + std::to_string(d[static_cast<size_t>(i)]);
  if (!cost.label.empty()) what += " (" + std::string(cost.label) + ")";
  const std::lock_guard<std::mutex> lock(outside_mu_);
  ++outside_[what];
}

std::vector<std::string> RooflineDevice::outside_grid(size_t limit) const {
  const std::lock_guard<std::mutex> lock(outside_mu_);
  std::vector<std::string> out;
  for (const auto& [what, count] : outside_) {
    if (out.size() == limit) break;
    out.push_back(what + ": " + std::to_string(count) + (count == 1 ? " op" : " ops"));
  }
  return out;
}

namespace {

/// A kernel torch.compile's inductor fuses into its neighbours: any measured class but the
/// GEMMs and attention it calls out to (cuBLAS, SDPA).
bool fused_by_inductor(KernelClass k) {
  return k != KernelClass::kNone && k != KernelClass::kGemm && k != KernelClass::kSdpa &&
         k != KernelClass::kHostBlock;
}

}  // namespace

SimTime RooflineDevice::time(const OpCost& cost) const {
  const SimTime t = eager_time(cost);
  if (p_.host.framework != HostParams::Framework::kInductor ||
      !fused_by_inductor(cost.shape.kernel) || p_.host.inductor_fusion == 1.0)
    return t;
  return SimTime::from_ns(std::llround(static_cast<double>(t.ns()) * p_.host.inductor_fusion));
}

SimTime RooflineDevice::eager_time(const OpCost& cost) const {
  if (cost.shape.kernel == KernelClass::kHostBlock) return {};  // host work only
  if (p_.grid != nullptr) {
    // Timed by shape: the grid's time, a strided view's times its kind's factor; the roofline
    // at the fitted efficiencies for what the grid does not cover.
    double t = 0;
    bool beyond = false;
    if (const auto g = p_.grid->time_s(cost.shape, &beyond)) {
      t = *g * p_.grid_scale[static_cast<size_t>(kernel_class_kind(cost.shape.kernel))];
      if (beyond) note_outside(cost);
    } else {
      if (cost.shape.kernel != KernelClass::kNone) note_outside(cost);
      t = roofline(cost).seconds();
    }
    if (!strided_base(cost.label).empty()) t *= p_.strided_factor[static_cast<size_t>(cost.kind)];
    return SimTime::from_seconds(t, "an operation's time from device.grid");
  }
  if (const std::string_view base = strided_base(cost.label);
      !base.empty() && p_.kernels.find(cost.label) == p_.kernels.end()) {
    // A strided view's op: the contiguous op's time, times its kind's factor.
    OpCost contiguous = cost;
    contiguous.label = base;
    const double f = p_.strided_factor[static_cast<size_t>(cost.kind)];
    const SimTime t = eager_time(contiguous);
    return f == 1.0 ? t : SimTime::from_ns(std::llround(static_cast<double>(t.ns()) * f));
  }
  if (!p_.kernels.empty()) {
    auto it = p_.kernels.find(cost.label);
    if (it == p_.kernels.end()) it = p_.kernels.find(op_kind_name(cost.kind));
    if (it != p_.kernels.end() && !it->second.flops.empty()) {
      const KernelTable& table = it->second;
      double t = 0;
      if (table.interpolate(cost.flops, t)) return SimTime::from_seconds(t);
      if (cost.flops > 0) {
        // Outside the measured range: the roofline, scaled by the table's ratio to the
        // roofline at the nearest measured end (the op scaled to that end's FLOPs, its bytes in
        // proportion). A kernel measured 10x slower than its roofline stays 10x slower past
        // the last point instead of snapping back to the ideal.
        const bool below = cost.flops < table.flops.front();
        const double f_end = below ? table.flops.front() : table.flops.back();
        const double t_end = below ? table.time_s.front() : table.time_s.back();
        const OpCost at_end{cost.kind, f_end, cost.bytes * f_end / cost.flops, cost.label};
        const double roof_end = roofline(at_end).seconds();
        if (roof_end > 0)
          return SimTime::from_seconds(roofline(cost).seconds() * t_end / roof_end,
                                       "an operation's time extrapolated from device.kernels");
      }
    }
  }
  return roofline(cost);
}

SimTime RooflineDevice::host_issue(std::string_view label, KernelClass kernel) const {
  switch (p_.host.framework) {
    case HostParams::Framework::kCompiled:
      return {};
    case HostParams::Framework::kInductor:
      return kernel == KernelClass::kHostBlock ? SimTime{} : p_.host.inductor_launch;
    case HostParams::Framework::kReference: {
      if (kernel != KernelClass::kHostBlock) return {};
      const auto it = p_.host.reference.find(label);
      return it == p_.host.reference.end() ? SimTime{} : it->second;
    }
    case HostParams::Framework::kEager:
      if (kernel == KernelClass::kHostBlock) return {};
      break;
  }
  if (const SimTime k = p_.host.kernels[static_cast<size_t>(kernel)];
      kernel != KernelClass::kNone && k > SimTime{})
    return k;
  auto it = p_.host.ops.find(label);
  if (it == p_.host.ops.end()) {
    // A strided view's op is issued as the contiguous one is.
    const std::string_view base = strided_base(label);
    if (!base.empty()) it = p_.host.ops.find(base);
  }
  return it == p_.host.ops.end() ? p_.host.op_issue : it->second;
}

SimTime RooflineDevice::roofline(const OpCost& cost) const {
  const size_t k = static_cast<size_t>(cost.kind);
  double compute_s = cost.flops / (p_.peak_flops_per_s * p_.compute_efficiency[k]);
  double memory_s = cost.bytes / (p_.hbm_bytes_per_s * p_.memory_efficiency[k]);
  // The bound that sets the time names the key to blame if the span overflows virtual time.
  if (compute_s >= memory_s)
    return SimTime::from_seconds(compute_s, "an operation's compute time at device.peak_tflops") +
           p_.launch_overhead;
  return SimTime::from_seconds(memory_s, "an operation's memory time at device.hbm_gbytes_per_s") +
         p_.launch_overhead;
}

}  // namespace cocodiff
