// The shape-keyed kernel grids against closed forms: a grid point returns its measurement,
// between points the log-log interpolation (and its bound: between the neighbours' times), the
// fallbacks (the other bias, a width between two measured ones, the nearest row width), what lies
// outside, two machines' medians, malformed files named by file and line, and a cluster whose
// device times its ops by the grid and reports what the grid does not cover.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/config.hpp"
#include "core/errors.hpp"
#include "net_models/cluster.hpp"
#include "net_models/device_model.hpp"
#include "net_models/kernel_grid.hpp"

namespace cocodiff {
namespace {

constexpr const char* kGemm =
    "m,n,k,dtype,bias,us_median,us_min,us_max,reps\n"
    "1024,3072,3072,bf16,1,40.0,39,41,50\n"
    "4096,3072,3072,bf16,1,160.0,159,161,50\n"
    "1024,12288,3072,bf16,1,120.0,119,121,50\n"
    "4096,12288,3072,bf16,1,600.0,599,601,50\n"
    "1024,3072,3072,fp8,1,10.0,9,11,50\n";  // not bf16: skipped
constexpr const char* kAttention =
    "batch,q_tokens,kv_tokens,heads,head_dim,us_median,us_min,us_max,reps\n"
    "1,1024,1024,4,128,20.0,19,21,50\n"
    "1,4096,4096,4,128,200.0,199,201,50\n"
    "1,1024,1024,8,128,30.0,29,31,50\n"
    "1,4096,4096,8,128,400.0,399,401,50\n"
    "1,4096,512,8,128,55.0,54,56,50\n";
constexpr const char* kMemory =
    "op,shape,dtype,bytes_moved,strided,us_median,us_min,us_max,reps\n"
    "layernorm,1x1024x3072,bf16,0,0,10.0,9,11,50\n"
    "layernorm,1x4096x3072,bf16,0,0,30.0,29,31,50\n"
    "layernorm,1x1024x1152,bf16,0,0,5.0,4,6,50\n"
    "cat_seq,1x512+4096x3072,bf16,0,0,40.0,39,41,50\n"
    "add_bcast,1x1024x3072,bf16,0,0,8.0,7,9,50\n";  // no class of the device model: skipped

KernelGrid grid() {
  KernelGrid g;
  g.add_text(kGemm, "gemm.csv");
  g.add_text(kAttention, "attention.csv");
  g.add_text(kMemory, "memory.csv");
  g.finish();
  return g;
}

double loglog(double x0, double x1, double y0, double y1, double x) {
  return std::exp(std::log(y0) + (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0)) *
                                     (std::log(y1) - std::log(y0)));
}

TEST(KernelGrid, AGridPointReturnsItsMeasurement) {
  const KernelGrid g = grid();
  EXPECT_DOUBLE_EQ(*g.time_s(gemm_shape(4096, 12288, 3072, true)), 600e-6);
  EXPECT_DOUBLE_EQ(*g.time_s(sdpa_shape(1, 4096, 4096, 8, 128)), 400e-6);
  EXPECT_DOUBLE_EQ(*g.time_s(sdpa_shape(1, 4096, 512, 8, 128)), 55e-6);  // measured cross point
  EXPECT_DOUBLE_EQ(*g.time_s(memory_shape(KernelClass::kLayerNorm, 4096 * 3072, 3072)), 30e-6);
  EXPECT_DOUBLE_EQ(*g.time_s(memory_shape(KernelClass::kCatSeq, 4608 * 3072, 3072)), 40e-6);
  EXPECT_EQ(g.skipped_rows(), 2);
}

TEST(KernelGrid, BetweenPointsTheLogLogInterpolationAndItsBound) {
  const KernelGrid g = grid();
  const double t = *g.time_s(gemm_shape(2048, 3072, 3072, true));
  EXPECT_NEAR(t, loglog(1024, 4096, 40e-6, 160e-6, 2048), 1e-12);
  EXPECT_GT(t, 40e-6);
  EXPECT_LT(t, 160e-6);
  // Bilinear over (batch x heads, tokens): between the four corners' times.
  const double a = *g.time_s(sdpa_shape(1, 2048, 2048, 6, 128));
  const double lo = loglog(1024, 4096, 20e-6, 200e-6, 2048);
  const double hi = loglog(1024, 4096, 30e-6, 400e-6, 2048);
  EXPECT_NEAR(a, loglog(4, 8, lo, hi, 6), 1e-12);
  EXPECT_GT(a, 20e-6);
  EXPECT_LT(a, 400e-6);
  // Batch 2 of 4 heads runs as 8 heads.
  EXPECT_DOUBLE_EQ(*g.time_s(sdpa_shape(2, 4096, 4096, 4, 128)), 400e-6);
}

TEST(KernelGrid, FallbacksInsideTheGrid) {
  const KernelGrid g = grid();
  // The other bias variant of a weight shape.
  EXPECT_DOUBLE_EQ(*g.time_s(gemm_shape(1024, 3072, 3072, false)), 40e-6);
  // A width between two measured ones (same k): the throughput interpolated, in log.
  const double r_lo = 3072 / 40e-6, r_hi = 12288 / 120e-6;
  const double t = *g.time_s(gemm_shape(1024, 6144, 3072, true));
  EXPECT_NEAR(t, 6144 / loglog(3072, 12288, r_lo, r_hi, 6144), 1e-12);
  EXPECT_GT(t, 40e-6);
  EXPECT_LT(t, 120e-6);
  // A q != kv shape not measured: the self-attention of sqrt(q kv) tokens.
  EXPECT_DOUBLE_EQ(*g.time_s(sdpa_shape(1, 4096, 1024, 4, 128)),
                   *g.time_s(sdpa_shape(1, 2048, 2048, 4, 128)));
  // A memory kernel's nearest measured row width (1152 is nearer 1536 than 3072 is, in log).
  EXPECT_DOUBLE_EQ(*g.time_s(memory_shape(KernelClass::kLayerNorm, 1024 * 1152, 1536)), 5e-6);
}

TEST(KernelGrid, BeyondTheEndsTheNearestPointsRateFlagged) {
  const KernelGrid g = grid();
  bool beyond = false;
  // Above a series: the work's growth at the last point's rate (GEMM m, memory elements: linear).
  EXPECT_DOUBLE_EQ(*g.time_s(gemm_shape(8192, 3072, 3072, true), &beyond), 320e-6);
  EXPECT_TRUE(beyond);
  EXPECT_DOUBLE_EQ(*g.time_s(memory_shape(KernelClass::kLayerNorm, 8192 * 3072, 3072), &beyond),
                   60e-6);
  EXPECT_TRUE(beyond);
  // Below: the smallest point's time (a launch-bound kernel).
  EXPECT_DOUBLE_EQ(*g.time_s(gemm_shape(16, 3072, 3072, true), &beyond), 40e-6);
  EXPECT_TRUE(beyond);
  // Attention: quadratic in tokens, linear in batch x heads.
  EXPECT_DOUBLE_EQ(*g.time_s(sdpa_shape(1, 8192, 8192, 8, 128), &beyond), 1600e-6);
  EXPECT_TRUE(beyond);
  EXPECT_DOUBLE_EQ(*g.time_s(sdpa_shape(1, 4096, 4096, 16, 128), &beyond), 800e-6);
  EXPECT_TRUE(beyond);
  EXPECT_DOUBLE_EQ(*g.time_s(sdpa_shape(1, 4096, 4096, 8, 128), &beyond), 400e-6);
  EXPECT_FALSE(beyond);
}

TEST(KernelGrid, WhatNoSeriesCoversIsNone) {
  const KernelGrid g = grid();
  EXPECT_FALSE(g.time_s(gemm_shape(1024, 64, 3072, true)));  // no width below to bracket
  EXPECT_FALSE(g.time_s(sdpa_shape(1, 1024, 1024, 4, 64)));  // head_dim never measured
  EXPECT_FALSE(g.time_s(memory_shape(KernelClass::kRopeReal, 1024, 128)));  // class not measured
  EXPECT_FALSE(g.time_s(KernelShape{}));
}

TEST(KernelGrid, TwoMachinesTakeTheMedian) {
  KernelGrid g;
  g.add_text("m,n,k,dtype,bias,us_median\n1024,3072,3072,bf16,1,40\n", "a/gemm.csv");
  g.add_text("m,n,k,dtype,bias,us_median\n1024,3072,3072,bf16,1,50\n", "b/gemm.csv");
  g.finish();
  EXPECT_DOUBLE_EQ(*g.time_s(gemm_shape(1024, 3072, 3072, true)), 45e-6);
  ASSERT_EQ(g.points().size(), 1u);
}

std::string error_of(const std::string& text, const std::string& name) {
  try {
    KernelGrid g;
    g.add_text(text, name);
    g.finish();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(KernelGrid, AMalformedFileIsNamedByFileAndLine) {
  EXPECT_NE(error_of("m,n,k,dtype,bias,us_median\n1,2,3,bf16,1,4\n1,2,x,bf16,1,4\n", "g.csv")
                .find("g.csv:3: expected k as an integer"),
            std::string::npos);
  EXPECT_NE(error_of("m,n,k,dtype,bias,us_median\n1,2,3,bf16,1,-4\n", "g.csv")
                .find("g.csv:2: expected us_median as microseconds > 0"),
            std::string::npos);
  EXPECT_NE(error_of("m,n,k,dtype,bias,us_median\n1,2,3\n", "g.csv").find("g.csv:2: expected 6"),
            std::string::npos);
  EXPECT_NE(error_of("a,b\n1,2\n", "g.csv").find("g.csv:1: expected the header"),
            std::string::npos);
  EXPECT_NE(error_of("m,n,k,us_median\n1,2,3,4\n", "g.csv").find("a column 'dtype'"),
            std::string::npos);
  EXPECT_NE(error_of("op,shape,dtype,us_median\nlayernorm,1xAx3,bf16,4\n", "m.csv")
                .find("m.csv:2: expected shape"),
            std::string::npos);
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("kernel_grid_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
  }
};

// One GPU of a round roofline, as the cluster tests below describe it inline.
const std::string kOneGpu =
    "[cluster]\nnodes = 1\n[cluster.topology]\nlevels = [\"gpu\"]\nsizes = [1]\n"
    "tiers = [\"intra-node\"]\n[cluster.device]\npeak_tflops = 1000\nhbm_gbytes_per_s = 4000\n";

TEST(KernelGrid, AClusterTimesItsOpsByTheGridAndReportsTheRest) {
  const TempDir dir;
  dir.write("gemm.csv", kGemm);
  dir.write("memory.csv", kMemory);
  const Config cfg = Config::parse(kOneGpu + "grid = [\"" + dir.path.string() +
                                       "\"]\n[cluster.device.strided_factor]\nnorm = 2.0\n",
                                   "run.toml");
  const Cluster c = load_cluster(cfg, std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters");
  const DeviceModel& d = *c.device;
  OpCost gemm{OpKind::kGemm, 2.0 * 4096 * 3072 * 3072, 1e6, "q_proj",
              gemm_shape(4096, 3072, 3072, true)};
  EXPECT_EQ(d.time(gemm).ns(), 160'000);
  OpCost norm{OpKind::kNorm, 0, 1e6, "q_norm_strided",
              memory_shape(KernelClass::kLayerNorm, 1024 * 3072, 3072)};
  EXPECT_EQ(d.time(norm).ns(), 20'000);  // 10 us, strided: twice
  EXPECT_TRUE(d.outside_grid(10).empty());
  // Outside: the roofline (efficiency 1 here: 2e12 FLOPs at 1 PFLOP/s = 2 ms), and reported.
  OpCost big{OpKind::kGemm, 2e12, 1e6, "mlp_fc1", gemm_shape(1 << 20, 1, 1, false)};
  EXPECT_EQ(d.time(big).ns(), 2'000'000);
  d.time(big);
  const std::vector<std::string> out = d.outside_grid(10);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], "gemm 1048576x1x1 (mlp_fc1): 2 ops");
}

TEST(KernelGrid, AClusterWithAMissingGridDirectoryNamesTheKey) {
  const Config cfg = Config::parse(
      "[cluster]\nnodes = 1\n[cluster.topology]\nlevels = [\"gpu\"]\nsizes = [1]\n"
      "tiers = [\"intra-node\"]\n[cluster.device]\npeak_tflops = 1000\nhbm_gbytes_per_s = 4000\n"
      "grid = [\"no-such-grid-dir\"]\n",
      "run.toml");
  try {
    load_cluster(cfg, std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("device.grid"), std::string::npos) << m;
    EXPECT_NE(m.find("no-such-grid-dir"), std::string::npos) << m;
  }
}

}  // namespace
// device.grid_scale carries grids measured on another GPU: each kind's grid time times its
// factor (the roofline of what the grids do not cover is not scaled: calibrate fits it to the
// scaled points); a factor without grids is refused, naming the key.
TEST(KernelGrid, AGridScaleTimesTheGridsTimesByKindAndNeedsAGrid) {
  const TempDir dir;
  dir.write("gemm.csv", kGemm);
  dir.write("memory.csv", kMemory);
  const std::string& device = kOneGpu;
  const Config cfg = Config::parse(device + "grid = [\"" + dir.path.string() +
                                       "\"]\n[cluster.device.grid_scale]\ngemm = 1.25\nnorm = 2\n",
                                   "run.toml");
  const Cluster c = load_cluster(cfg, std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters");
  const DeviceModel& d = *c.device;
  OpCost gemm{OpKind::kGemm, 2.0 * 4096 * 3072 * 3072, 1e6, "q_proj",
              gemm_shape(4096, 3072, 3072, true)};
  EXPECT_EQ(d.time(gemm).ns(), 200'000);  // the grid's 160 us x 1.25
  OpCost norm{OpKind::kNorm, 0, 1e6, "q_norm",
              memory_shape(KernelClass::kLayerNorm, 1024 * 3072, 3072)};
  EXPECT_EQ(d.time(norm).ns(), 20'000);  // 10 us x 2
  OpCost big{OpKind::kGemm, 2e12, 1e6, "mlp_fc1", gemm_shape(1 << 20, 1, 1, false)};
  EXPECT_EQ(d.time(big).ns(), 2'000'000);  // outside: the roofline, unscaled
  try {
    load_cluster(Config::parse(device + "[cluster.device.grid_scale]\ngemm = 1.25\n", "run.toml"),
                 std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.grid_scale.gemm"), std::string::npos) << e.what();
  }
  try {
    load_cluster(Config::parse(device + "grid = [\"" + dir.path.string() +
                                   "\"]\n[cluster.device.grid_scale]\ncopy = 9\n",
                               "run.toml"),
                 std::filesystem::path(COCODIFF_CONFIG_DIR) / "clusters");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("device.grid_scale.copy"), std::string::npos) << e.what();
  }
}

}  // namespace cocodiff
