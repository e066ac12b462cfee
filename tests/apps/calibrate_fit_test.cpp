// The collective fit as a library (calibrate/collective_fit.hpp): points made by the
// emulator's own timing on a cluster with known figures are fitted from other figures, and the
// known ones come back; on a cluster whose device has a host, calls timed back to back overlap
// the host's issue with the call before, and both the host's cost and the library's come back.
// The eager-op fit (calibrate/eager_fit.hpp) turns known device and host times into the
// preset's tables exactly. The step fits (host_sync_fit.hpp, device_step_fit.hpp) recover the
// factors that made closed-form steps.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "calibrate/cluster_file.hpp"
#include "calibrate/collective_fit.hpp"
#include "calibrate/device_step_fit.hpp"
#include "calibrate/eager_fit.hpp"
#include "calibrate/grid_scale_fit.hpp"
#include "calibrate/host_sync_fit.hpp"
#include "calibrate/least_squares.hpp"
#include "core/errors.hpp"

namespace cocodiff::calibrate {
namespace {

namespace fs = std::filesystem;

const fs::path kPresets = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "clusters";
const fs::path kCluster = fs::path(COCODIFF_TEST_DATA) / "calibrate" / "two_nodes.toml";

FitCluster fit_cluster(const std::vector<std::string>& sets) {
  Config cfg = load_cluster_config(kCluster.string(), kPresets);
  for (const std::string& s : sets) cfg.set(s);
  return {complete_cluster_table(cfg, kPresets), kCluster.string(), kPresets, 1};
}

double value_of(const CollectiveFit& f, const std::string& key) {
  for (const FittedValue& v : f.values)
    if (v.key == key) return v.value;
  ADD_FAILURE() << key << " not fitted";
  return -1;
}

// The one median every fit takes (host costs, the strided factor, repeated steps, error tables).
// A measured NVLink step of `file` (its second line).
StepPoint step_point(const std::string& file, const std::string& strategy, int gpus, int res,
                     double ms) {
  StepPoint p;
  p.where = file + ":2";
  p.source = file;
  p.strategy = strategy;
  p.gpus = gpus;
  p.resolution = res;
  p.median_ms = ms;
  p.transport = "nvlink";
  return p;
}

TEST(CalibrateFit, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(calibrate::median({3.0}), 3.0);
  EXPECT_EQ(calibrate::median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(calibrate::median({4.0, 1.0, 3.0, 10.0}), 3.5);
}

TEST(CalibrateFit, RecoversHostAndLibraryCostsFromBackToBackCalls) {
  const std::vector<std::string> host = {"cluster.device.host.per_rank_slowdown=0.2"};
  std::vector<std::string> truth = host;
  truth.insert(truth.end(),
               {"cluster.device.host.collective_issue_us=30", "cluster.library.call_overhead_us=10",
                "cluster.links.nvswitch.bandwidth_gbytes_per_s=80"});
  std::vector<std::string> start = host;
  start.insert(start.end(), {"cluster.device.host.collective_issue_us=50",
                             "cluster.library.call_overhead_us=40"});
  std::vector<CollectivePoint> points;
  for (const apps::BenchOp op : {apps::BenchOp::kAllToAll, apps::BenchOp::kAllGather})
    for (const int ranks : {2, 4})
      for (std::int64_t bytes = 1024; bytes <= (std::int64_t{64} << 20); bytes *= 4) {
        CollectivePoint p;
        p.where = "synthetic:" + std::to_string(points.size() + 1);
        p.op = op;
        p.ranks = ranks;
        p.nodes = 1;
        p.bytes = bytes;
        p.time_us = 1;
        points.push_back(p);
      }
  CollectiveFitOptions options;
  options.warmup = 1;
  options.iters = 2;
  options.fit_protocol = false;
  const std::vector<double> us = predict_collectives(fit_cluster(truth), points, options);
  for (size_t i = 0; i < points.size(); ++i) points[i].time_us = us[i];
  // Back to back, the small calls take the host's issue (30 us, measured with every rank
  // issuing: the per-rank slowdown of op issue costs does not scale it), not the library's
  // 10 us plus the messages: the host binds.
  EXPECT_NEAR(points[0].time_us, 30.0, 0.5);

  const FitCluster from = fit_cluster(start);
  const Cluster c = load_cluster_table(from.table, from.source, from.preset_dir, 1);
  const CollectiveFit f = fit_collectives(from, link_knobs(c, from.table), points, options);
  EXPECT_NEAR(value_of(f, "device.host.collective_issue_us"), 30, 0.3);
  EXPECT_NEAR(value_of(f, "library.call_overhead_us"), 10, 0.1);
  EXPECT_NEAR(value_of(f, "links.nvswitch.bandwidth_gbytes_per_s"), 80, 0.8);
  EXPECT_LT(f.rms_log, 1e-3);
  // Each figure names the region of the sweep that sets it: the bandwidth the largest
  // messages, the host's issue the smallest calls (which it binds); no region is claimed twice.
  std::string bandwidth, issue;
  for (const FittedValue& v : f.values) {
    if (v.key == "links.nvswitch.bandwidth_gbytes_per_s") bandwidth = v.determined_by;
    if (v.key == "device.host.collective_issue_us") issue = v.determined_by;
  }
  EXPECT_NE(bandwidth.find("-67108864 bytes"), std::string::npos) << bandwidth;
  EXPECT_EQ(issue.rfind("1024", issue.find(" bytes")), issue.find(", ") + 2) << issue;
  int owned = 0;
  for (const FittedValue& v : f.values) {
    ASSERT_FALSE(v.determined_by.empty()) << v.key;
    if (v.determined_by.find("no point") == std::string::npos) owned += std::stoi(v.determined_by);
  }
  EXPECT_LE(owned, static_cast<int>(points.size()));
}

EagerOpPoint eager(const std::string& op, const std::string& label, double flops, double device_us,
                   double host_us) {
  EagerOpPoint p;
  p.where = "test";
  p.op = op;
  p.label = label;
  p.flops = flops;
  p.device_us = device_us;
  p.host_us = host_us;
  return p;
}

TEST(CalibrateFit, EagerOpsGiveDeviceTablesHostCostsAndOverlapFactors) {
  std::vector<EagerOpPoint> ops = {
      // Two points of one FLOP count (two machines): their geometric mean; a second count.
      eager("linear", "q_proj", 1e9, 4, -1), eager("linear", "q_proj", 1e9, 16, -1),
      eager("linear", "q_proj", 4e9, 20, -1),
      // The per-head projection shares q_proj's table.
      eager("linear_heads", "q_proj_heads", 2e9, 10, -1), eager("sdpa", "attention", 5e9, 30, -1),
      // Host times: medians over machines (14, 15, 16 -> 15; 10 and 12 -> 11).
      eager("linear", "q_proj", 1e6, -1, 14), eager("linear", "q_proj", 1e6, -1, 16),
      eager("linear", "q_proj", 1e6, -1, 15), eager("rms_norm", "q_norm", 1e5, -1, 10),
      eager("rms_norm", "q_norm", 1e5, -1, 12), eager("norm_modulate", "norm1", 1e5, -1, 30),
      eager("rope", "q_rope", 1e5, -1, 80), eager("all_to_all", "all_to_all", 0, -1, 48),
      eager("all_gather", "all_gather", 0, -1, 52)};
  InterferencePoint small, big, attention;
  small.kernel = big.kernel = "gemm_4096";
  attention.kernel = "attention_sdpa";
  small.bytes = 16 << 20;
  big.bytes = attention.bytes = 256 << 20;
  big.where = "big";
  small.kernel_alone_us = big.kernel_alone_us = attention.kernel_alone_us = 100;
  small.a2a_alone_us = big.a2a_alone_us = attention.a2a_alone_us = 200;
  small.kernel_with_us = 110;
  small.a2a_with_us = 220;
  big.kernel_with_us = 125;
  big.a2a_with_us = 300;
  attention.kernel_with_us = 190;
  attention.a2a_with_us = 500;
  const EagerFit f = fit_eager(ops, {small, attention, big});

  ASSERT_EQ(f.tables.count("q_proj"), 1u);
  const KernelTableFit& q = f.tables.at("q_proj");
  ASSERT_EQ(q.flops, (std::vector<double>{1e9, 2e9, 4e9}));
  EXPECT_NEAR(q.time_us[0], 8, 1e-12);  // sqrt(4 x 16)
  EXPECT_NEAR(q.time_us[1], 10, 1e-12);
  EXPECT_NEAR(q.time_us[2], 20, 1e-12);
  // K and V are projected as Q is; the attention has its own table; nothing measured, none.
  EXPECT_EQ(f.tables.at("k_proj").time_us, q.time_us);
  EXPECT_EQ(f.tables.at("v_proj").flops, q.flops);
  ASSERT_EQ(f.tables.at("attention").time_us.size(), 1u);
  EXPECT_NEAR(f.tables.at("attention").time_us[0], 30, 1e-12);
  EXPECT_EQ(f.tables.count("mlp_fc1"), 0u);

  EXPECT_DOUBLE_EQ(f.host_ops.at("q_proj"), 15);
  EXPECT_DOUBLE_EQ(f.host_ops.at("mlp_fc2"), 15);  // every projection is one F.linear
  EXPECT_DOUBLE_EQ(f.host_ops.at("k_norm"), 11);
  EXPECT_DOUBLE_EQ(f.host_ops.at("norm2"), 11);
  EXPECT_DOUBLE_EQ(f.host_ops.at("modulate"), 19);  // LayerNorm+modulate less the norm
  EXPECT_DOUBLE_EQ(f.host_ops.at("k_rope"), 80);
  EXPECT_DOUBLE_EQ(f.collective_issue_us, 50);
  EXPECT_EQ(f.host_ops.count("attention"), 0u);  // sdpa's host time was not measured
  EXPECT_NE(std::find(f.missing.begin(), f.missing.end(), "sdpa"), f.missing.end());
  // 13 projections at 15, 8 norms at 11, 2 RoPEs at 80, the modulation at 19: median 15.
  EXPECT_DOUBLE_EQ(f.op_issue_us, 15);

  // The largest all-to-all beside a GEMM (the attention's point is not a GEMM).
  EXPECT_DOUBLE_EQ(f.overlap_compute, 1.25);
  EXPECT_DOUBLE_EQ(f.overlap_transfer, 1.5);
  EXPECT_EQ(f.interference_from, "big");

  // A LayerNorm+modulate measured below the norm alone cannot be split.
  ops.push_back(eager("norm_modulate", "norm1", 1e5, -1, 1));
  ops.push_back(eager("norm_modulate", "norm1", 1e5, -1, 1));
  EXPECT_THROW(fit_eager(ops, {}), InputError);
}

// A closed-form host: a flat step on n GPUs takes base(n) x a (1 + s (H(n) - 1)), H the harmonic
// number. The fit takes the flat steps of 2 or more GPUs at the smallest resolution, each file's
// median, and recovers a and s to the fit's resolution from three GPU counts; from one count it
// keeps a at 1 and puts the whole factor on s. The predictor is asked once per (gpus, a, s).
TEST(CalibrateFit, HostStepFactorAndSyncSlowdownFromClosedFormSteps) {
  const double truth_a = 1.6, truth_s = 0.45;
  const auto harmonic = [](int n) {
    double h = 0;
    for (int k = 1; k <= n; ++k) h += 1.0 / k;
    return h;
  };
  int calls = 0;
  const calibrate::StepPredictor predict = [&](int gpus, int res, double a, double s) {
    ++calls;
    EXPECT_EQ(res, 512);
    return (100.0 + 10 * gpus) * a * (1 + s * (harmonic(gpus) - 1));
  };
  std::vector<calibrate::StepPoint> steps;
  const auto add = [&](const std::string& file, const std::string& strategy, int gpus, int res,
                       double ms) { steps.push_back(step_point(file, strategy, gpus, res, ms)); };
  const auto truth_ms = [&](int gpus) {
    return (100.0 + 10 * gpus) * truth_a * (1 + truth_s * (harmonic(gpus) - 1));
  };
  add("a.csv", "flat", 2, 512, truth_ms(2) * 1.3);  // three launches: the median is the truth
  add("a.csv", "flat", 2, 512, truth_ms(2));
  add("a.csv", "flat", 2, 512, truth_ms(2) / 1.3);
  add("a.csv", "flat", 4, 512, truth_ms(4));
  add("a.csv", "flat", 1, 512, 1.0);      // one GPU: not used
  add("a.csv", "pipeline", 4, 512, 1e3);  // not flat: not used
  add("b.csv", "flat", 3, 512, truth_ms(3));
  add("b.csv", "flat", 3, 1024, 5 * truth_ms(3));  // a larger resolution: not used
  const calibrate::HostSyncFit f = calibrate::fit_host_sync(steps, predict);
  EXPECT_EQ(f.resolution, 512);
  EXPECT_EQ(f.gpu_counts, 3);
  ASSERT_EQ(f.cases.size(), 3u);
  EXPECT_EQ(f.cases[0].rows, 3);
  EXPECT_NEAR(f.step_factor, truth_a, 0.01);
  EXPECT_NEAR(f.sync_slowdown, truth_s, 0.01);
  EXPECT_LT(f.rms_log, 5e-3);
  for (const calibrate::HostSyncCase& c : f.cases)
    EXPECT_NEAR(c.predicted_ms, c.measured_ms, 5e-3 * c.measured_ms) << c.source << " " << c.gpus;
  EXPECT_EQ(calls, f.predictions);

  // One GPU count: the whole factor a (1 + s (H(2) - 1)) on s, a kept at 1.
  const std::vector<calibrate::StepPoint> two(steps.begin(), steps.begin() + 3);
  const calibrate::HostSyncFit g = calibrate::fit_host_sync(two, predict);
  EXPECT_EQ(g.gpu_counts, 1);
  EXPECT_EQ(g.step_factor, 1.0);
  EXPECT_NEAR(g.sync_slowdown, (truth_a * (1 + truth_s * 0.5) - 1) / 0.5, 0.01);

  std::vector<calibrate::StepPoint> none(steps.begin() + 4, steps.begin() + 6);
  EXPECT_THROW(calibrate::fit_host_sync(none, predict), InputError);

  // Hosts that differ by machine: the range brackets every case's measured / predicted, rounded
  // outwards to 0.01, from two or more files; one file gives none.
  EXPECT_EQ(f.machines, 2);
  add("slow.csv", "flat", 2, 512, truth_ms(2) * 1.37);
  add("fast.csv", "flat", 4, 512, truth_ms(4) * 0.62);
  const calibrate::HostSyncFit h = calibrate::fit_host_sync(steps, predict);
  EXPECT_EQ(h.machines, 4);
  double lo = 10, hi = 0;
  for (const calibrate::HostSyncCase& c : h.cases) {
    lo = std::min(lo, c.measured_ms / c.predicted_ms);
    hi = std::max(hi, c.measured_ms / c.predicted_ms);
  }
  EXPECT_LT(lo, 0.7);
  EXPECT_GT(hi, 1.2);
  EXPECT_LE(h.range_low, lo);
  EXPECT_GT(h.range_low, lo - 0.01);
  EXPECT_GE(h.range_high, hi);
  EXPECT_LT(h.range_high, hi + 0.01);
  EXPECT_NEAR(h.range_low * 100, std::round(h.range_low * 100), 1e-9);
  EXPECT_NEAR(h.range_high * 100, std::round(h.range_high * 100), 1e-9);
  EXPECT_EQ(g.machines, 1);
  EXPECT_EQ(g.range_low, 0.0);
  EXPECT_EQ(g.range_high, 0.0);
}

// A device-bound 1-GPU step of 150 ms of host time and 700 ms of kernels: the kernels' step
// factor that made it comes back; only flat 1-GPU steps at the files' largest resolution count,
// each file's once (the median of its launches). A host-bound step fits nothing.
TEST(CalibrateFit, KernelStepFactorFromDeviceBoundOneGpuSteps) {
  const double truth = 1.047;
  int calls = 0;
  const DeviceStepPredictor predict = [&](int res, double factor) {
    ++calls;
    EXPECT_EQ(res, 2048);
    return std::max(150.0, 20.0 + 700.0 * factor);
  };
  std::vector<StepPoint> steps;
  const auto add = [&](const std::string& file, const std::string& strategy, int gpus, int res,
                       double ms) { steps.push_back(step_point(file, strategy, gpus, res, ms)); };
  const double ms = 20.0 + 700.0 * truth;
  add("a.csv", "flat", 1, 2048, ms * 1.2);  // three launches: the median is the truth
  add("a.csv", "flat", 1, 2048, ms);
  add("a.csv", "flat", 1, 2048, ms / 1.2);
  add("b.csv", "flat", 1, 2048, ms);
  add("b.csv", "flat", 1, 1024, 1.0);     // a smaller resolution: not used
  add("b.csv", "flat", 2, 2048, 1.0);     // two GPUs: not used
  add("b.csv", "v_first", 1, 2048, 1e4);  // not flat: not used
  const DeviceStepFit f = fit_device_step(steps, predict, 1.0);
  EXPECT_TRUE(f.fitted);
  EXPECT_EQ(f.resolution, 2048);
  ASSERT_EQ(f.cases.size(), 2u);
  EXPECT_EQ(f.cases[0].rows, 3);
  EXPECT_NEAR(f.step_factor, truth, 0.0011);
  EXPECT_NEAR(f.sensitivity, std::log((20 + 770.0) / 720) / std::log(1.1), 1e-9);
  for (const DeviceStepCase& c : f.cases)
    EXPECT_NEAR(c.predicted_ms, c.measured_ms, 1e-3 * c.measured_ms) << c.source;
  EXPECT_EQ(calls, f.predictions);

  // The model's step is the host's 800 ms at any factor near 1: nothing is fitted.
  const DeviceStepFit g = fit_device_step(
      steps, [](int, double factor) { return std::max(800.0, 700.0 * factor); }, 1.0);
  EXPECT_FALSE(g.fitted);
  EXPECT_EQ(g.step_factor, 1.0);
  EXPECT_EQ(g.cases.size(), 2u);

  // No flat 1-GPU step at the largest resolution: no case, the cluster's factor.
  const std::vector<StepPoint> none(steps.begin() + 4, steps.end());
  const DeviceStepFit h = fit_device_step(none, predict, 1.3);
  EXPECT_FALSE(h.fitted);
  EXPECT_TRUE(h.cases.empty());
  EXPECT_EQ(h.step_factor, 1.3);
}

// Grids carried to another GPU: each kind's factor is the geometric mean of its ops' time ratios
// here over the reference's at the same shapes (least squares on log time); a shape only one side
// measured is left out (listed), an op no kind is known for too, and nothing in common is an
// error.
TEST(CalibrateFit, GridScaleIsTheGeometricMeanOfTheRatiosByKindAtTheSameShapes) {
  const auto at = [](const std::string& op, std::int64_t tokens, double us) {
    EagerOpPoint p = eager(op, op + "_label", 1e9, us, -1);
    p.dims = {tokens, 24, 3072, 3072};
    p.where = op + ":" + std::to_string(tokens);
    return p;
  };
  const std::vector<EagerOpPoint> ref = {at("linear", 256, 10), at("linear", 4096, 100),
                                         at("rms_norm", 256, 5), at("rope", 256, 8),
                                         at("rope", 256, 12)};  // two machines: median 10
  const std::vector<EagerOpPoint> mine = {
      at("linear", 256, 10),    at("linear", 4096, 120),  // ratios 1 and 1.2
      at("rms_norm", 256, 7.5), at("rope", 256, 11),      // 1.5, 1.1
      at("sdpa", 256, 3),                                 // no reference at this shape
      at("frobnicate", 256, 1)};                          // no kind
  const GridScaleFit f = fit_grid_scale(mine, ref);
  EXPECT_NEAR(f.scale[static_cast<size_t>(OpKind::kGemm)], std::sqrt(1.0 * 1.2), 1e-12);
  EXPECT_NEAR(f.scale[static_cast<size_t>(OpKind::kNorm)], 1.5, 1e-12);
  EXPECT_NEAR(f.scale[static_cast<size_t>(OpKind::kElementwise)], 1.1, 1e-12);
  EXPECT_FALSE(f.fitted[static_cast<size_t>(OpKind::kAttention)]);
  EXPECT_EQ(f.scale[static_cast<size_t>(OpKind::kAttention)], 1.0);
  EXPECT_EQ(f.ops.at("linear").points, 2);
  EXPECT_NEAR(f.ops.at("linear").min_ratio, 1.0, 1e-12);
  EXPECT_NEAR(f.ops.at("linear").max_ratio, 1.2, 1e-12);
  EXPECT_EQ(f.unmatched, (std::vector<std::string>{"sdpa:256", "frobnicate:256"}));
  EXPECT_THROW(fit_grid_scale({at("sdpa", 256, 3)}, ref), InputError);
}

}  // namespace
}  // namespace cocodiff::calibrate
