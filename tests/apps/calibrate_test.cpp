// `cocodiff calibrate` end to end: it recovers known software costs from synthetic measurements
// (netbench on the uniform preset with those costs set), and refuses malformed files with exit
// code 2, naming the file and line, writing nothing.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

class Calibrate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cocodiff_calibrate_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  double key(const std::string& toml, const std::string& k) {
    std::smatch m;
    const std::regex re(k + " = ([0-9.e+-]+)");
    EXPECT_TRUE(std::regex_search(toml, m, re)) << toml;
    return m.empty() ? -1 : std::stod(m[1].str());
  }
  fs::path dir_;
};

TEST_F(Calibrate, RecoversKnownCostsFromSyntheticMeasurements) {
  // 30 us per call and 4 us per message, on 4 and 8 ranks, 4 KiB to 1 MiB per rank.
  std::string csv = "op,ranks,bytes,time_us\n";
  for (const char* nodes : {"1", "2"}) {
    const fs::path json = dir_ / (std::string("nb") + nodes + ".json");
    const ChildResult r = run_cocodiff(
        {"netbench", "uniform", "--set", std::string("cluster.nodes=") + nodes, "--set",
         "cluster.library.call_overhead_us=30", "--set", "cluster.library.message_overhead_us=4",
         "--min-bytes", "4096", "--max-bytes", "1048576", "--json", json.string()},
        dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(json);
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const nlohmann::json& row : j["rows"])
      csv += "all_to_all," + std::to_string(j["ranks"].get<int>()) + "," +
             std::to_string(row["bytes"].get<std::int64_t>()) + "," +
             std::to_string(row["time_ns"].get<double>() / 1000.0) + "\n";
  }
  const fs::path data = write("a2a.csv", csv);
  const fs::path out = dir_ / "overlay.toml";
  const ChildResult r = run_cocodiff({"calibrate", data.string(), "--cluster", "uniform", "--set",
                                      "cluster.nodes=2", "--out", out.string()},
                                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("predicted_us"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  EXPECT_NEAR(key(toml, "call_overhead_us"), 30.0, 0.3) << toml;
  EXPECT_NEAR(key(toml, "message_overhead_us"), 4.0, 0.04) << toml;
  EXPECT_NE(toml.find("[cluster.library]"), std::string::npos);
  // The overlay is a cluster config of its own.
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

TEST_F(Calibrate, MalformedFilesExitTwoAndWriteNothing) {
  struct Case {
    std::string name, text, message;
  };
  const std::vector<Case> cases = {
      {"header.csv", "op,size,time\nall_to_all,8,1024,10\n", "header.csv:1: expected the header"},
      {"fields.csv", "op,ranks,bytes,time_us\nall_to_all,8,1024\n",
       "fields.csv:2: expected 4 fields"},
      {"op.csv", "op,ranks,bytes,time_us\nbroadcast,8,1024,3\n", "op.csv:2: expected op"},
      {"time.csv", "op,ranks,bytes,time_us\nall_to_all,8,1024,-3\n",
       "time.csv:2: expected time_us > 0"},
      {"ranks.csv", "op,ranks,bytes,time_us\nall_to_all,0,1024,3\n",
       "ranks.csv:2: expected ranks >= 1"},
      {"big.csv", "op,ranks,bytes,time_us\nall_to_all,64,1024,3\n", "big.csv:2: 64 ranks"},
      {"empty.csv", "", "empty.csv: empty measurements file"},
      {"perf.txt", "# nThread 1 nGpus 1\n#  Rank  0\n#  Rank  1\n", "an nccl-tests file named"},
      {"kind.csv", "op,kind,flops,bytes,time_us\nq_proj,matmul,1e9,1e6,5\n",
       "kind.csv:2: expected kind gemm | attention | norm | elementwise | copy"},
      {"kfields.csv", "op,kind,flops,bytes,time_us\nq_proj,gemm,1e9,5\n",
       "kfields.csv:2: expected 5 fields"},
      {"kzero.csv", "op,kind,flops,bytes,time_us\nq_proj,gemm,0,0,5\n",
       "kzero.csv:2: expected flops or bytes > 0"},
      {"ktime.csv", "op,kind,flops,bytes,time_us\nq_proj,gemm,1e9,1e6,nan\n",
       "ktime.csv:2: expected time_us > 0"},
  };
  for (const Case& c : cases) {
    const fs::path data = write(c.name, c.text);
    const fs::path out = dir_ / "overlay.toml";
    const ChildResult r = run_cocodiff(
        {"calibrate", data.string(), "--cluster", "uniform", "--out", out.string()}, dir_);
    EXPECT_EQ(r.exit_code, 2) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.name;
  }
}

TEST_F(Calibrate, RecoversAKnownRooflineFromSyntheticKernelTimes) {
  // The uniform preset: 1 GFLOP/s and 1 GB/s peaks. Times made with launch 2 us, GEMM at 70%
  // of peak compute (compute-bound points) and norm at 50% of HBM (memory-bound points).
  std::string csv = "op,kind,flops,bytes,time_us\n";
  for (double f : {1e6, 3e6, 1e7, 3e7, 1e8})
    csv += "q_proj,gemm," + std::to_string(f) + "," + std::to_string(f / 1000) + "," +
           std::to_string((f / (1e9 * 0.7) + 2e-6) * 1e6) + "\n";
  for (double b : {1e5, 3e5, 1e6, 3e6, 1e7})
    csv += "q_norm,norm," + std::to_string(b / 4) + "," + std::to_string(b) + "," +
           std::to_string((b / (1e9 * 0.5) + 2e-6) * 1e6) + "\n";
  const fs::path data = write("kernels.csv", csv);
  const fs::path out = dir_ / "overlay.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", data.string(), "--cluster", "uniform", "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("roofline_us"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  EXPECT_NEAR(key(toml, "launch_overhead_ns"), 2000, 20) << toml;
  EXPECT_NEAR(key(toml, "gemm"), 0.7, 0.007) << toml;
  EXPECT_NEAR(key(toml, "norm"), 0.5, 0.005) << toml;
  EXPECT_NE(toml.find("[cluster.device.memory_efficiency]\nnorm = "), std::string::npos) << toml;
  // Each op's points become its table, and the overlay is a cluster config of its own.
  EXPECT_NE(toml.find("[cluster.device.kernels.q_proj]\nflops = [1e+06, 3e+06, 1e+07"),
            std::string::npos)
      << toml;
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

TEST_F(Calibrate, ReadsNcclTestsOutputAsPrinted) {
  const std::string text =
      "# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20\n"
      "#  Rank  0 Group  0 Pid 1 on host device  0 [0x18] NVIDIA H100 80GB HBM3\n"
      "#  Rank  1 Group  0 Pid 2 on host device  1 [0x2a] NVIDIA H100 80GB HBM3\n"
      "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
      "        1024           128     float    none      -1    30.00    0.03    0.02      0\n"
      "        4096           512     float    none      -1    31.00    0.13    0.07      0\n";
  const fs::path data = write("alltoall_perf.txt", text);
  const fs::path out = dir_ / "overlay.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", data.string(), "--cluster", "uniform", "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("all_to_all       2         4096        31.00"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cocodiff::test
