// The roofline device model against closed forms: compute-bound and memory-bound ops, per-kind
// efficiencies, the launch overhead, and the device presets of the cluster files.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "core/errors.hpp"
#include "net_models/cluster.hpp"
#include "net_models/device_model.hpp"

namespace cocodiff {
namespace {

const std::filesystem::path kPresets = std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters";

RooflineParams unit() {
  RooflineParams p;
  p.peak_flops_per_s = 1e12;  // 1 FLOP per ps
  p.hbm_bytes_per_s = 1e11;   // 10 ps per byte
  p.launch_overhead = SimTime::from_ns(3000);
  p.compute_efficiency = {1.0, 0.5, 1.0, 1.0, 1.0};  // attention at half the GEMM rate
  p.memory_efficiency = {1.0, 1.0, 0.8, 0.8, 0.25};
  return p;
}

TEST(Roofline, ComputeBoundIsFlopsOverPeakPlusLaunch) {
  const RooflineDevice d(unit());
  // 2e9 FLOPs over 1e6 bytes: 2 ms of compute, 10 us of memory.
  EXPECT_EQ(d.time({OpKind::kGemm, 2e9, 1e6}).ns(), 2'000'000 + 3'000);
  // Attention runs at half the rate: 4 ms.
  EXPECT_EQ(d.time({OpKind::kAttention, 2e9, 1e6}).ns(), 4'000'000 + 3'000);
}

TEST(Roofline, MemoryBoundIsBytesOverBandwidthPlusLaunch) {
  const RooflineDevice d(unit());
  // 1e3 FLOPs, 1e8 bytes: 1 ms at full bandwidth, 1.25 ms at 80%, 4 ms at 25%.
  EXPECT_EQ(d.time({OpKind::kGemm, 1e3, 1e8}).ns(), 1'000'000 + 3'000);
  EXPECT_EQ(d.time({OpKind::kNorm, 1e3, 1e8}).ns(), 1'250'000 + 3'000);
  EXPECT_EQ(d.time({OpKind::kCopy, 0, 1e8}).ns(), 4'000'000 + 3'000);
}

TEST(Roofline, TheSlowerSideBindsAtTheRidgePoint) {
  const RooflineDevice d(unit());
  // Ridge point of a GEMM: 10 FLOPs per byte. Below it memory binds, above it compute.
  EXPECT_EQ(d.time({OpKind::kGemm, 9e8, 1e8}).ns(), 1'003'000);
  EXPECT_EQ(d.time({OpKind::kGemm, 1e9, 1e8}).ns(), 1'003'000);
  EXPECT_EQ(d.time({OpKind::kGemm, 2e9, 1e8}).ns(), 2'003'000);
  // An empty op still pays its launch.
  EXPECT_EQ(d.time({OpKind::kElementwise, 0, 0}).ns(), 3'000);
}

TEST(Roofline, PresetsCarryTheirDevices) {
  struct Want {
    const char* preset;
    double tflops, hbm_gb_s, launch_us;
  };
  for (const Want& w : {Want{"aurora", 273, 1638.4, 5}, Want{"hgx-h100", 989, 3350, 4.124},
                        Want{"hgx-h200", 989, 4800, 3.868}}) {
    SCOPED_TRACE(w.preset);
    const Config cfg =
        Config::parse(std::string("[cluster]\npreset = \"") + w.preset + "\"\n", "run.toml");
    const Cluster c = load_cluster(cfg, kPresets);
    const RooflineParams& p = c.device_params;
    EXPECT_DOUBLE_EQ(p.peak_flops_per_s, w.tflops * 1e12);
    EXPECT_DOUBLE_EQ(p.hbm_bytes_per_s, w.hbm_gb_s * 1e9);
    EXPECT_EQ(p.launch_overhead.ns(), std::llround(w.launch_us * 1000));
    // A large GEMM without a shape runs at peak x efficiency (a preset with kernel grids times
    // only what they do not cover so): one 8192^3 bf16 GEMM.
    const double n = 8192, flops = 2 * n * n * n, bytes = 3 * n * n * 2;
    const double expect_s = std::max(flops / (p.peak_flops_per_s * p.compute_efficiency[0]),
                                     bytes / (p.hbm_bytes_per_s * p.memory_efficiency[0])) +
                            static_cast<double>(std::llround(w.launch_us * 1000)) * 1e-9;
    EXPECT_NEAR(c.device->time({OpKind::kGemm, flops, bytes}).seconds(), expect_s, 1e-9);
  }
}

TEST(RankSpread, RanksTakeTheExpectedNormalOrderStatistics) {
  // Blom's scores: the normal quantiles at (i - 3/8) / (n + 1/4); for two ranks +-0.58946.
  std::vector<double> two = rank_speed_factors(2, 0.1);
  ASSERT_EQ(two.size(), 2u);
  std::sort(two.begin(), two.end());
  EXPECT_NEAR(two[0], 1 - 0.1 * 0.5894558, 1e-6);
  EXPECT_NEAR(two[1], 1 + 0.1 * 0.5894558, 1e-6);
  EXPECT_NEAR(rank_spread_top(2), 0.5894558, 1e-6);
  EXPECT_NEAR(rank_spread_top(4), 1.0491314, 1e-6);
  EXPECT_NEAR(rank_spread_top(8), 1.4342002, 1e-6);
  EXPECT_EQ(rank_spread_top(1), 0.0);
  for (const int n : {3, 4, 7, 96}) {
    const std::vector<double> f = rank_speed_factors(n, 0.02);
    ASSERT_EQ(f.size(), static_cast<size_t>(n));
    double sum = 0;
    for (const double x : f) sum += x;
    EXPECT_NEAR(sum / n, 1.0, 1e-12) << n;  // the mean rank keeps its time
    EXPECT_NEAR(*std::max_element(f.begin(), f.end()), 1 + 0.02 * rank_spread_top(n), 1e-12);
  }
  // The slowest device is not simply the last rank, and one rank alone or no spread: no factors.
  const std::vector<double> eight = rank_speed_factors(8, 0.02);
  EXPECT_NE(std::max_element(eight.begin(), eight.end()) - eight.begin(), 7);
  EXPECT_TRUE(rank_speed_factors(8, 0.0).empty());
  EXPECT_EQ(rank_speed_factors(1, 0.1), std::vector<double>{1.0});
}

TEST(RankSpread, ClusterKeyIsReadAndBounded) {
  const Config ok = Config::parse(
      "[cluster]\npreset = \"hgx-h100\"\n[cluster.device]\n"
      "rank_spread = 0.015\n",
      "run.toml");
  EXPECT_DOUBLE_EQ(load_cluster(ok, kPresets).device->rank_spread(), 0.015);
  const Config bad = Config::parse(
      "[cluster]\npreset = \"hgx-h100\"\n[cluster.device]\n"
      "rank_spread = 0.5\n",
      "run.toml");
  try {
    load_cluster(bad, kPresets);
    FAIL() << "a spread of 0.5 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_spread"), std::string::npos) << e.what();
  }
}

TEST(HostStepFactor, ClusterKeyIsReadAndBounded) {
  const Config ok = Config::parse(
      "[cluster]\npreset = \"hgx-h100\"\n[cluster.device.host]\nstep_factor = 1.4\n", "run.toml");
  EXPECT_DOUBLE_EQ(load_cluster(ok, kPresets).device->host_step_factor(), 1.4);
  const Config none = Config::parse("[cluster]\npreset = \"uniform\"\n", "run.toml");
  EXPECT_DOUBLE_EQ(load_cluster(none, kPresets).device->host_step_factor(), 1.0);
  const Config bad = Config::parse(
      "[cluster]\npreset = \"hgx-h100\"\n[cluster.device.host]\nstep_factor = 0\n", "run.toml");
  try {
    load_cluster(bad, kPresets);
    FAIL() << "a step factor of 0 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("step_factor"), std::string::npos) << e.what();
  }
}

// device.host.scale takes every issue cost (each op's, the default and the collective call's)
// that many times; device.host.range is read as [lowest, highest] and refused out of order.
TEST(HostScale, ScalesEveryIssueCostAndTheRangeIsReadAndBounded) {
  const auto cluster = [](const std::string& host) {
    return load_cluster(
        Config::parse("[cluster]\npreset = \"hgx-h200\"\n[cluster.device.host]\n" + host,
                      "run.toml"),
        kPresets);
  };
  const Cluster base = cluster("");
  const Cluster half = cluster("scale = 0.5\n");
  EXPECT_DOUBLE_EQ(half.device_params.host.scale, 0.5);
  for (const char* label : {"q_rope", "attention", "no_such_op", "q_norm_strided"})
    EXPECT_EQ(half.device->host_issue(label).ns() * 2, base.device->host_issue(label).ns())
        << label;
  EXPECT_EQ(half.device->collective_issue().ns() * 2, base.device->collective_issue().ns());
  // The shipped range (bench/fidelity/steps_fidelity.py); a cluster without one has none.
  EXPECT_DOUBLE_EQ(base.device_params.host.range_low, 0.49);
  EXPECT_DOUBLE_EQ(base.device_params.host.range_high, 1.01);
  EXPECT_FALSE(
      load_cluster(Config::parse("[cluster]\npreset = \"uniform\"\n", "run.toml"), kPresets)
          .device_params.host.has_range());

  const Cluster ranged = cluster("range = [0.5, 1.25]\n");
  EXPECT_TRUE(ranged.device_params.host.has_range());
  EXPECT_DOUBLE_EQ(ranged.device_params.host.range_low, 0.5);
  EXPECT_DOUBLE_EQ(ranged.device_params.host.range_high, 1.25);
  EXPECT_EQ(ranged.device->host_issue("q_rope"), base.device->host_issue("q_rope"));
  for (const char* bad : {"scale = 0\n", "scale = 11\n", "range = [1.2, 0.8]\n",
                          "range = [0.05, 1]\n", "range = [1]\n", "range = [0.5, 1, 2]\n"}) {
    try {
      cluster(bad);
      FAIL() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("device.host."), std::string::npos) << e.what();
    }
  }
}

TEST(KernelStepFactor, ClusterKeyIsReadAndBoundedAndScalesNoTable) {
  const Config ok = Config::parse(
      "[cluster]\npreset = \"hgx-h200\"\n[cluster.device]\nstep_factor = 1.05\n", "run.toml");
  const Cluster fitted = load_cluster(ok, kPresets);
  EXPECT_DOUBLE_EQ(fitted.device->kernel_step_factor(), 1.05);
  // The factor is the engine's, on every charge: the device's own times stay the tables'.
  const Config plain = Config::parse(
      "[cluster]\npreset = \"hgx-h200\"\n[cluster.device]\nstep_factor = 1\n", "run.toml");
  const OpCost gemm{OpKind::kGemm, 1e11, 1e8, "q_proj"};
  EXPECT_EQ(fitted.device->time(gemm), load_cluster(plain, kPresets).device->time(gemm));
  const Config none = Config::parse("[cluster]\npreset = \"uniform\"\n", "run.toml");
  EXPECT_DOUBLE_EQ(load_cluster(none, kPresets).device->kernel_step_factor(), 1.0);
  const Config bad = Config::parse(
      "[cluster]\npreset = \"hgx-h200\"\n[cluster.device]\nstep_factor = 20\n", "run.toml");
  try {
    load_cluster(bad, kPresets);
    FAIL() << "a kernel step factor of 20 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.step_factor"), std::string::npos) << e.what();
  }
}

// An op labelled X_strided reads a strided view: X's time (its table's, else the roofline's)
// times its kind's strided factor, unless it has a table of its own; it is issued as X is.
TEST(StridedViews, TakeTheContiguousOpsTimeTimesTheKindsFactor) {
  RooflineParams p = unit();
  p.strided_factor[static_cast<size_t>(OpKind::kNorm)] = 1.5;
  p.kernels["q_norm"] = KernelTable{{1e6, 1e8}, {10e-6, 100e-6}, "test"};
  p.kernels["k_norm_strided"] = KernelTable{{1e6, 1e8}, {40e-6, 400e-6}, "test"};
  p.host.op_issue = SimTime::from_ns(5000);
  p.host.ops["q_norm"] = SimTime::from_ns(7000);
  const RooflineDevice d(p);
  // q_norm's table at 1e7 FLOPs: 31.623 us (log-log interpolation); strided 1.5x.
  const SimTime contiguous = d.time({OpKind::kNorm, 1e7, 1e6, "q_norm"});
  EXPECT_EQ(contiguous.ns(), 31'623);
  EXPECT_EQ(d.time({OpKind::kNorm, 1e7, 1e6, "q_norm_strided"}).ns(),
            47'435);  // 1.5 x 31,623, rounded
  // A table of its own wins: 4x.
  EXPECT_NEAR(d.time({OpKind::kNorm, 1e7, 1e6, "k_norm_strided"}).ns(), 126'491, 1);
  // Without a table, the roofline (memory bound: 1e6 bytes at 80% of 1e11 B/s = 12.5 us, plus
  // the 3 us launch) times the factor; an elementwise op keeps factor 1.
  EXPECT_EQ(d.time({OpKind::kNorm, 1e3, 1e6, "x_strided"}).ns(), 23'250);
  EXPECT_EQ(d.time({OpKind::kElementwise, 1e3, 1e6, "x_strided"}).ns(),
            d.time({OpKind::kElementwise, 1e3, 1e6, "x"}).ns());
  // Issued as the contiguous op: q_norm's own cost, else the default.
  EXPECT_EQ(d.host_issue("q_norm_strided").ns(), 7000);
  EXPECT_EQ(d.host_issue("k_norm_strided").ns(), 5000);
  EXPECT_EQ(d.host_issue("_strided").ns(), 5000);
}

TEST(HostIssue, AKernelClassCostWinsOverTheLabelAndCompiledIssuesNothing) {
  const auto load = [](const std::string& extra) {
    return load_cluster(Config::parse("[cluster]\npreset = \"hgx-h200\"\n" + extra, "run.toml"),
                        kPresets);
  };
  const Cluster eager =
      load("[cluster.device.host.kernels]\nrms_norm_unfused = 99\nrope_complex = 48\n");
  const DeviceModel& d = *eager.device;
  // The class's cost (diffusers' RMSNorm: 8 calls), whatever the label; the label's otherwise.
  EXPECT_EQ(d.host_issue("q_norm", KernelClass::kRmsNormUnfused).ns(), 99'000);
  EXPECT_EQ(d.host_issue("q_norm", KernelClass::kRmsNorm), d.host_issue("q_norm"));
  EXPECT_EQ(d.host_issue("q_rope", KernelClass::kRopeComplex).ns(), 48'000);
  EXPECT_EQ(d.host_issue("q_rope").ns(), 132'000);
  // Compiled: no op costs issue time, collectives still do.
  const Cluster compiled = load("[cluster.device.host]\nframework = \"compiled\"\n");
  EXPECT_EQ(compiled.device->host_issue("q_rope", KernelClass::kRopeReal).ns(), 0);
  EXPECT_EQ(compiled.device->host_issue("attention").ns(), 0);
  EXPECT_EQ(compiled.device->collective_issue(), eager.device->collective_issue());
  EXPECT_GT(compiled.device->collective_issue().ns(), 0);
  // Bad names are refused naming the key.
  EXPECT_THROW(load("[cluster.device.host.kernels]\nnot_a_kernel = 3\n"), ConfigError);
  EXPECT_THROW(load("[cluster.device.host]\nframework = \"jit\"\n"), ConfigError);
}

TEST(HostIssue, InductorFusesMemoryBoundKernelsAndLaunchesEveryOpAtItsCost) {
  const auto load = [](const std::string& extra) {
    return load_cluster(Config::parse("[cluster]\npreset = \"hgx-h200\"\n" + extra, "run.toml"),
                        kPresets);
  };
  const Cluster eager = load("");
  const Cluster ind = load(
      "[cluster.device.host]\nframework = \"inductor\"\n"
      "[cluster.device.host.inductor]\nfusion = 0.5\nlaunch_us = 10\n");
  OpCost norm{OpKind::kNorm,
              4096.0 * 3072 * 5,
              4096.0 * 3072 * 4,
              "q_norm",
              {KernelClass::kRmsNormUnfused, {4096 * 3072, 128, 0, 0, 0}}};
  OpCost gemm{OpKind::kGemm, 2.0 * 4096 * 3072 * 3072, 3.0 * 4096 * 3072 * 2, "attn_out",
              gemm_shape(4096, 3072, 3072, true)};
  // A memory-bound kernel takes the fused fraction of its eager time; a GEMM keeps its time.
  const std::int64_t eager_norm = eager.device->time(norm).ns();
  ASSERT_GT(eager_norm, 0);
  EXPECT_NEAR(static_cast<double>(ind.device->time(norm).ns()), 0.5 * eager_norm, 1.0);
  EXPECT_EQ(ind.device->time(gemm), eager.device->time(gemm));
  // Every op launches at the wrapper's cost, whatever its class; collectives keep theirs.
  EXPECT_EQ(ind.device->host_issue("q_norm", KernelClass::kRmsNormUnfused).ns(), 10'000);
  EXPECT_EQ(ind.device->host_issue("attn_out", KernelClass::kGemm).ns(), 10'000);
  EXPECT_EQ(ind.device->host_issue("m/transformer_blocks", KernelClass::kHostBlock).ns(), 0);
  EXPECT_EQ(ind.device->collective_issue(), eager.device->collective_issue());
  // The preset's fitted figures apply when the run names only the framework; eager is unfused.
  const Cluster fitted = load("[cluster.device.host]\nframework = \"inductor\"\n");
  EXPECT_LT(fitted.device->time(norm), eager.device->time(norm));
  EXPECT_EQ(eager.device->host_issue("q_norm", KernelClass::kRmsNormUnfused),
            load("[cluster.device.host.inductor]\nfusion = 0.5\nlaunch_us = 10\n")
                .device->host_issue("q_norm", KernelClass::kRmsNormUnfused));
  // One figure without the other, and a fusion outside (0.05, 1], are refused naming the key.
  const auto message = [&](const std::string& extra) {
    try {
      load(extra);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("[cluster.device.host.inductor]\nfusion = 1.5\nlaunch_us = 1\n")
                .find("device.host.inductor.fusion"),
            std::string::npos);
  // On a device with no torch.compile measurement (hgx-h100): one figure alone is refused
  // naming the other, and so is the framework.
  const auto h100 = [&](const std::string& extra) {
    try {
      load_cluster(Config::parse("[cluster]\npreset = \"hgx-h100\"\n" + extra, "run.toml"),
                   kPresets);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(h100("[cluster.device.host.inductor]\nfusion = 0.5\n").find("launch_us"),
            std::string::npos);
  EXPECT_NE(h100("[cluster.device.host]\nframework = \"inductor\"\n").find("torch.compile"),
            std::string::npos);
  EXPECT_EQ(h100("[cluster.device.host]\nframework = \"compiled\"\n"), "");
}

TEST(HostIssue, TheReferenceFrameworkIssuesEachBlockAtItsCountedHostTime) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("device_test_ref_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "reference_host.csv")
      << "model,scope,calls,counted_us\nm1,transformer_blocks,10,100\nm1,outside,4,40\n";
  const auto load = [&](const std::string& extra) {
    return load_cluster(
        Config::parse("[cluster]\npreset = \"hgx-h200\"\n[cluster.device.host]\nreference = \"" +
                          dir.string() + "\"\ncall_overhead_us = 5\n" + extra,
                      "run.toml"),
        kPresets);
  };
  const Cluster ref = load("framework = \"reference\"\nscale = 2.0\n");
  const DeviceModel& d = *ref.device;
  EXPECT_TRUE(d.host_reference());
  // (100 + 10 x 5) us, x 2 (the host's scale); other ops issue at no cost; no device time.
  EXPECT_EQ(d.host_issue("m1/transformer_blocks", KernelClass::kHostBlock).ns(), 300'000);
  EXPECT_EQ(d.host_issue("m1/outside", KernelClass::kHostBlock).ns(), 120'000);
  EXPECT_EQ(d.host_issue("m2/outside", KernelClass::kHostBlock).ns(), 0);
  EXPECT_EQ(d.host_issue("q_proj", KernelClass::kGemm).ns(), 0);
  OpCost host_only;
  host_only.label = "m1/transformer_blocks";
  host_only.shape.kernel = KernelClass::kHostBlock;
  EXPECT_EQ(d.time(host_only).ns(), 0);
  // Eager: the blocks' host ops cost nothing, the ops their labels' costs.
  const Cluster eager = load("");
  EXPECT_FALSE(eager.device->host_reference());
  EXPECT_EQ(eager.device->host_issue("m1/transformer_blocks", KernelClass::kHostBlock).ns(), 0);
  EXPECT_EQ(eager.device->host_issue("q_rope").ns(), 132'000);
  // A malformed profile names its file and line; reference without a profile is refused.
  std::ofstream(dir / "reference_host.csv") << "model,scope,calls,counted_us\nm1,x,ten,1\n";
  try {
    load("framework = \"reference\"\n");
    ADD_FAILURE() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("reference_host.csv:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_cluster(Config::parse("[cluster]\npreset = \"uniform\"\n[cluster.device.host]\n"
                                          "framework = \"reference\"\n",
                                          "run.toml"),
                            kPresets),
               ConfigError);
  std::filesystem::remove_all(dir);
}

TEST(StridedViews, ClusterKeyIsReadAndBounded) {
  const Config ok = Config::parse(
      "[cluster]\npreset = \"hgx-h100\"\n[cluster.device.strided_factor]\nnorm = 1.25\n",
      "run.toml");
  const auto dev = load_cluster(ok, kPresets).device;
  const auto* roof = dynamic_cast<const RooflineDevice*>(dev.get());
  ASSERT_NE(roof, nullptr);
  EXPECT_DOUBLE_EQ(roof->params().strided_factor[static_cast<size_t>(OpKind::kNorm)], 1.25);
  EXPECT_DOUBLE_EQ(roof->params().strided_factor[static_cast<size_t>(OpKind::kGemm)], 1.0);
  const Config bad = Config::parse(
      "[cluster]\npreset = \"hgx-h100\"\n[cluster.device.strided_factor]\nnorm = 0.01\n",
      "run.toml");
  try {
    load_cluster(bad, kPresets);
    FAIL() << "a strided factor of 0.01 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("strided_factor.norm"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cocodiff
