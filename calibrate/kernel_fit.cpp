#include "calibrate/kernel_fit.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "calibrate/least_squares.hpp"

namespace cocodiff::calibrate {

namespace {

double kernel_time_s(const RooflineParams& d, const KernelFit& f, const KernelPoint& p) {
  const auto k = static_cast<size_t>(p.kind);
  return std::max(p.flops / (d.peak_flops_per_s * f.eff_c[k]),
                  p.bytes / (d.hbm_bytes_per_s * f.eff_m[k])) +
         f.launch_s;
}

/// Whether `p` is compute-bound under `t`'s efficiencies.
bool compute_bound(const RooflineParams& d, const KernelFit& t, const KernelPoint& p) {
  const auto k = static_cast<size_t>(p.kind);
  return p.flops / (d.peak_flops_per_s * t.eff_c[k]) >= p.bytes / (d.hbm_bytes_per_s * t.eff_m[k]);
}

/// Sum of squared log errors under `t`, each point timed on the term of its class alone.
double class_error(const RooflineParams& d, const std::vector<KernelPoint>& pts,
                   const std::vector<bool>& cls, const KernelFit& t) {
  double sq = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    const KernelPoint& p = pts[i];
    const auto k = static_cast<size_t>(p.kind);
    const double s = (cls[i] ? p.flops / (d.peak_flops_per_s * t.eff_c[k])
                             : p.bytes / (d.hbm_bytes_per_s * t.eff_m[k])) +
                     t.launch_s;
    const double e = std::log(s / (p.time_us * 1e-6));
    sq += e * e;
  }
  return sq;
}

/// Coordinate descent on the launch overhead and the fitted efficiencies, under fixed classes.
void descend(const RooflineParams& d, const std::vector<KernelPoint>& pts,
             const std::vector<bool>& cls, double max_launch_s, KernelFit& f) {
  auto error = [&](const KernelFit& t) { return class_error(d, pts, cls, t); };
  const double lo = std::log(1e-4), hi = 0;
  for (int sweep = 0; sweep < 60; ++sweep) {
    const double before = error(f);
    f.launch_s = golden_section_min(
        [&](double x) {
          KernelFit t = f;
          t.launch_s = x;
          return error(t);
        },
        0, max_launch_s);
    for (size_t k = 0; k < f.eff_c.size(); ++k) {
      for (const bool compute : {true, false}) {
        if (!(compute ? f.fitted_c : f.fitted_m)[k]) continue;
        const double x = golden_section_min(
            [&](double log_eff) {
              KernelFit t = f;
              (compute ? t.eff_c : t.eff_m)[k] = std::exp(log_eff);
              return error(t);
            },
            lo, hi);
        (compute ? f.eff_c : f.eff_m)[k] = std::exp(x);
      }
    }
    if (before - error(f) < 1e-14) break;
  }
}

/// Each point's time under the fit and the rms error of log time.
void score_points(const RooflineParams& d, const std::vector<KernelPoint>& pts, KernelFit& f) {
  double sq = 0;
  for (const KernelPoint& p : pts) {
    const double s = kernel_time_s(d, f, p);
    f.predicted_us.push_back(s * 1e6);
    const double e = std::log(s / (p.time_us * 1e-6));
    sq += e * e;
  }
  f.rms_log = std::sqrt(sq / static_cast<double>(pts.size()));
}

/// Each op's measured table: its points by FLOPs, equal FLOPs averaged in log time.
void measured_tables(const std::vector<KernelPoint>& pts, KernelFit& f) {
  std::map<std::string, std::map<double, std::vector<double>>> by_op;
  for (const KernelPoint& p : pts)
    if (p.flops > 0) by_op[p.op][p.flops].push_back(std::log(p.time_us));
  for (const auto& [op, by_flops] : by_op) {
    KernelTableFit& t = f.tables[op];
    for (const auto& [fl, logs] : by_flops) {
      double s = 0;
      for (double l : logs) s += l;
      t.flops.push_back(fl);
      t.time_us.push_back(std::exp(s / static_cast<double>(logs.size())));
    }
  }
}

}  // namespace

// Least squares on log time by coordinate descent on the launch overhead and each kind's
// efficiencies (searched in log space within (0, 1], the range a preset accepts). Each point is
// classed compute- or memory-bound, first under the preset's efficiencies, and fitted on that
// term alone; then re-classed under the fit, until the classes hold. (A kind whose points all
// have one arithmetic intensity cannot tell the two bounds apart: the class the preset gives
// decides.) An efficiency no point is bound by keeps the preset's value.
KernelFit fit_kernels(const RooflineParams& d, const std::vector<KernelPoint>& pts) {
  KernelFit f;
  f.eff_c = d.compute_efficiency;
  f.eff_m = d.memory_efficiency;
  f.launch_s = d.launch_overhead.seconds();
  double min_s = pts.front().time_us * 1e-6;
  for (const KernelPoint& p : pts) min_s = std::min(min_s, p.time_us * 1e-6);
  f.launch_s = std::min(f.launch_s, 0.5 * min_s);
  std::vector<bool> cls(pts.size());
  for (size_t i = 0; i < pts.size(); ++i) cls[i] = compute_bound(d, f, pts[i]);
  for (int round = 0; round < 10; ++round) {
    f.fitted_c = {};
    f.fitted_m = {};
    for (size_t i = 0; i < pts.size(); ++i)
      (cls[i] ? f.fitted_c : f.fitted_m)[static_cast<size_t>(pts[i].kind)] = true;
    descend(d, pts, cls, 0.999 * min_s, f);
    bool changed = false;
    for (size_t i = 0; i < pts.size(); ++i) {
      const bool c = compute_bound(d, f, pts[i]);
      changed = changed || c != cls[i];
      cls[i] = c;
    }
    if (!changed) break;
  }
  score_points(d, pts, f);
  measured_tables(pts, f);
  return f;
}

}  // namespace cocodiff::calibrate
