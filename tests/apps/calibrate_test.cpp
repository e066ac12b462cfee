// `cocodiff calibrate` end to end: it recovers known link, library and protocol figures from
// synthetic measurements (netbench's own times under those figures, written as nccl-tests logs
// or CSV), writes a complete cluster file that runs and netbench read back, reads real-format
// nccl-tests logs, turns eager PyTorch ops and interference into a device's tables and host
// costs (as the shipped GPU presets hold them), and refuses malformed or implausible files with
// exit code 2, naming the file and line, writing nothing.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <toml++/toml.h>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "dit/layers.hpp"
#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

const fs::path kData = fs::path(COCODIFF_TEST_DATA) / "calibrate";
const std::string kTwoNodes = (kData / "two_nodes.toml").string();

// The figures the synthetic measurements are made with (two_nodes.toml holds others).
const std::vector<std::string> kTrueLibrary = {
    "cluster.library.call_overhead_us=25", "cluster.library.message_overhead_us=3",
    "cluster.library.eager_max_bytes=32768", "cluster.library.rendezvous_overhead_us=6",
    "cluster.library.eager_copy_gbytes_per_s=15"};
constexpr const char* kEagerHeader = "op,label,tokens,heads,k,n,flops,device_us,host_us\n";
constexpr const char* kStepsHeader =
    "strategy,gpus,resolution,image_tokens,median_ms,min_ms,max_ms,host_issue_ms,transport,"
    "timed_steps\n";
const std::vector<std::string> kTrueIntra = {"cluster.links.nvswitch.bandwidth_gbytes_per_s=80",
                                             "cluster.links.nvswitch.latency_ns=700"};
// The inter-node tier scaled as a whole: bandwidths x 0.4, latencies x 1.6.
const std::vector<std::string> kTrueInter = {
    "cluster.nic.bandwidth_gbytes_per_s=20", "cluster.nic.attach_bandwidth_gbytes_per_s=25.6",
    "cluster.nic.latency_ns=800", "cluster.nic.attach_latency_ns=400",
    "cluster.fabric.latency_ns=1600"};

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
  // The value of `key = ...` in the TOML table [table] of a written file.
  static double value(const std::string& toml, const std::string& table, const std::string& key) {
    const size_t at = toml.find("\n[" + table + "]\n");
    EXPECT_NE(at, std::string::npos) << table << "\n" << toml;
    if (at == std::string::npos) return -1;
    const size_t end = toml.find("\n[", at + 1);
    const std::string body = toml.substr(at, end == std::string::npos ? end : end - at);
    std::smatch m;
    EXPECT_TRUE(std::regex_search(body, m, std::regex("\n" + key + " = ([-0-9.e+]+)")))
        << key << "\n"
        << body;
    return m.empty() ? -1 : std::stod(m[1].str());
  }
  // netbench's rows (bytes, time in us) for `op` on `ranks` ranks of each of `nodes` nodes.
  // CSV of all-gathers on 2 and 4 ranks of one node, 4 KiB-16 MiB, timed by netbench on the
  // cluster with `truth` set.
  std::string all_gather_csv(const std::vector<std::string>& truth) {
    std::string csv = "op,ranks,nodes,bytes,time_us\n";
    for (int ranks : {2, 4})
      for (const auto& [bytes, us] : netbench("all_gather", ranks, 1, truth, "4K", "16M"))
        csv += "all_gather," + std::to_string(ranks) + ",1," + std::to_string(bytes) + "," +
               std::to_string(us) + "\n";
    return csv;
  }

  std::vector<std::pair<std::int64_t, double>> netbench(const std::string& op, int ranks, int nodes,
                                                        const std::vector<std::string>& sets,
                                                        const std::string& min = "1K",
                                                        const std::string& max = "64M") {
    std::string rank_nic;
    for (int r = 0; r < ranks; ++r) rank_nic += (r ? "," : "") + std::to_string(r);
    std::vector<std::string> args = {
        "netbench", kTwoNodes,
        "--op",     op,
        "--rounds", "library",
        "-b",       min,
        "-e",       max,
        "-f",       "4",
        "--nodes",  std::to_string(nodes),
        "--set",    "cluster.topology.sizes=[" + std::to_string(ranks) + "]",
        "--set",    "cluster.nic.rank_nic=[" + rank_nic + "]"};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    const fs::path json = dir_ / "netbench.json";
    args.push_back("--json");
    args.push_back(json.string());
    const ChildResult r = run_cocodiff(args, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(json);
    const nlohmann::json j = nlohmann::json::parse(in);
    std::vector<std::pair<std::int64_t, double>> rows;
    for (const nlohmann::json& row : j["rows"])
      rows.emplace_back(row["bytes"].get<std::int64_t>(), row["time_ns"].get<double>() / 1000);
    return rows;
  }
  // nccl-tests' printed output for rows of `op` on `ranks` ranks over `nodes` hosts.
  static std::string nccl_tests_log(const std::string& perf, int ranks, int nodes,
                                    const std::vector<std::pair<std::int64_t, double>>& rows) {
    std::string s =
        "# nccl-tests version 2.18.3 nccl-headers=22807 nccl-library=22807\n"
        "# Collective test starting: " +
        perf +
        "\n"
        "# nThread 1 nGpus 1 minBytes 1024 maxBytes 67108864 step: 4(factor) warmup "
        "iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n";
    char line[256];
    for (int r = 0; r < ranks; ++r) {
      std::snprintf(line, sizeof line,
                    "#  Rank %2d Group  0 Pid %6d on node%02d device %2d [0000:%02x:00] NVIDIA "
                    "H100 80GB HBM3\n",
                    r, 1000 + r, r / (ranks / nodes), r % (ranks / nodes), 0x18 + r);
      s += line;
    }
    s += "#\n#       size         count      type   redop    root     time   algbw   busbw "
         "#wrong     time   algbw   busbw #wrong\n";
    for (const auto& [bytes, us] : rows) {
      std::snprintf(line, sizeof line,
                    "%12lld %13lld     float    none      -1 %8.2f %7.2f %7.2f      0 %8.2f %7.2f "
                    "%7.2f      0\n",
                    static_cast<long long>(bytes), static_cast<long long>(bytes / 4), us,
                    bytes / us / 1e3, bytes / us / 1e3, us, bytes / us / 1e3, bytes / us / 1e3);
      s += line;
    }
    return s + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 1.0\n#\n";
  }

  // CSV of netbench's all-to-all and all-gather on 2 and 4 ranks of one node under `truth`.
  std::string one_node_sweeps(const std::vector<std::string>& truth) {
    std::string csv = "op,ranks,nodes,bytes,time_us\n";
    for (const char* op : {"all_to_all", "all_gather"})
      for (int ranks : {2, 4})
        for (const auto& [bytes, us] : netbench(op, ranks, 1, truth))
          csv += std::string(op) + "," + std::to_string(ranks) + ",1," + std::to_string(bytes) +
                 "," + std::to_string(us) + "\n";
    return csv;
  }

  // Within 1% of the switch and library figures the per-pair tests' sweeps are made with: link 80
  // GB/s, pair 50 GB/s, latency 700 ns, 25 us a call, 3 us a message.
  static void expect_switch_figures(const std::string& toml, const std::string& out) {
    EXPECT_NEAR(value(toml, "links.nvswitch", "bandwidth_gbytes_per_s"), 80, 0.8) << out;
    EXPECT_NEAR(value(toml, "links.nvswitch", "pair_bandwidth_gbytes_per_s"), 50, 0.5) << out;
    EXPECT_NEAR(value(toml, "links.nvswitch", "latency_ns"), 700, 7) << out;
    EXPECT_NEAR(value(toml, "library", "call_overhead_us"), 25, 0.25) << out;
    EXPECT_NEAR(value(toml, "library", "message_overhead_us"), 3, 0.03) << out;
  }
  fs::path dir_;
};

std::vector<std::string> concat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST_F(Calibrate, RecoversIntraNodeFiguresAndProtocolFromNcclTestsLogs) {
  // One node: all-to-all and all-gather on 2 and 4 ranks, 1 KiB to 64 MiB, as nccl-tests prints
  // them (the op only in the log, not in the file name).
  const std::vector<std::string> truth = concat({kTrueLibrary, kTrueIntra});
  std::vector<std::string> files;
  for (const auto& [op, perf] : {std::pair<std::string, std::string>{"all_to_all", "alltoall_perf"},
                                 {"all_gather", "all_gather_perf"}})
    for (int ranks : {2, 4}) {
      const fs::path f = write("sweep" + std::to_string(files.size()) + ".log",
                               nccl_tests_log(perf, ranks, 1, netbench(op, ranks, 1, truth)));
      files.push_back(f.string());
    }
  const fs::path out = dir_ / "fit.toml";
  std::vector<std::string> args = {"calibrate"};
  args.insert(args.end(), files.begin(), files.end());
  args.insert(args.end(), {"--cluster", kTwoNodes, "--out", out.string()});
  const ChildResult r = run_cocodiff(args, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("measured_us  predicted_us"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_to_all         4     1"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  // Within 1% of the figures the logs were made with (the cluster file starts far from them).
  EXPECT_NEAR(value(toml, "links.nvswitch", "bandwidth_gbytes_per_s"), 80, 0.8) << r.out;
  EXPECT_NEAR(value(toml, "links.nvswitch", "latency_ns"), 700, 7) << r.out;
  EXPECT_NEAR(value(toml, "library", "call_overhead_us"), 25, 0.25) << r.out;
  EXPECT_NEAR(value(toml, "library", "message_overhead_us"), 3, 0.03) << r.out;
  EXPECT_NEAR(value(toml, "library", "rendezvous_overhead_us"), 6, 0.06) << r.out;
  EXPECT_NEAR(value(toml, "library", "eager_copy_gbytes_per_s"), 15, 0.15) << r.out;
  EXPECT_EQ(value(toml, "library", "eager_max_bytes"), 32768) << r.out;
  // The other tier was not crossed: its figures are the cluster file's.
  EXPECT_EQ(value(toml, "nic", "bandwidth_gbytes_per_s"), 50) << toml;
}

// A switch with a per-pair bandwidth: on 2 ranks an all-to-all's transfer alone moves at the
// pair's rate; on 4, three transfers from each rank share its link. The fit tells the two apart.
TEST_F(Calibrate, RecoversASwitchsPerPairBandwidthApartFromItsLinks) {
  const std::vector<std::string> truth = {
      "cluster.library.call_overhead_us=25", "cluster.library.message_overhead_us=3",
      "cluster.links.nvswitch.bandwidth_gbytes_per_s=80", "cluster.links.nvswitch.latency_ns=700",
      "cluster.links.nvswitch.pair_bandwidth_gbytes_per_s=50"};
  // The ring all-gather's steps tell the latency from the call's cost.
  const fs::path f = write("sweep.csv", one_node_sweeps(truth));
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", f.string(), "--cluster", kTwoNodes, "--set",
       "cluster.links.nvswitch.pair_bandwidth_gbytes_per_s=150", "--out", out.string()},
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("intra-node per-pair bandwidth"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  expect_switch_figures(toml, r.out);
}

// A ring kernel's time on its own block (library.local_copy_gbytes_per_s): an all-gather on 2
// ranks sends one block and copies one; on 4 it sends three and still copies one. With the
// all-to-all (whose own block is free) the fit tells it from the per-pair and link bandwidths.
TEST_F(Calibrate, RecoversARingKernelsOwnBlockRateApartFromItsBandwidths) {
  const std::vector<std::string> truth = {"cluster.library.call_overhead_us=25",
                                          "cluster.library.message_overhead_us=3",
                                          "cluster.links.nvswitch.bandwidth_gbytes_per_s=80",
                                          "cluster.links.nvswitch.latency_ns=700",
                                          "cluster.links.nvswitch.pair_bandwidth_gbytes_per_s=50",
                                          "cluster.library.local_copy_gbytes_per_s=40"};
  const fs::path f = write("sweep.csv", one_node_sweeps(truth));
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r =
      run_cocodiff({"calibrate", f.string(), "--cluster", kTwoNodes, "--set",
                    "cluster.links.nvswitch.pair_bandwidth_gbytes_per_s=150", "--set",
                    "cluster.library.local_copy_gbytes_per_s=100", "--out", out.string()},
                   dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ring kernel's own-block rate"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  EXPECT_NEAR(value(toml, "library", "local_copy_gbytes_per_s"), 40, 0.4) << r.out;
  expect_switch_figures(toml, r.out);
}

// Points timed in one run are apart as nccl-tests' are: a small call after a long one still
// pays its host's issue cost (the host waited for the device at the barrier between them).
TEST_F(Calibrate, APointsPredictionDoesNotDependOnThePointsBeforeIt) {
  const std::string header = "op,ranks,nodes,bytes,time_us\n";
  const std::string small = "all_gather,2,1,1024,40\n";
  const fs::path alone = write("alone.csv", header + small);
  const fs::path after = write("after.csv", header + "all_to_all,2,1,1073741824,20000\n" + small);
  std::vector<std::string> predicted;
  for (const fs::path& f : {alone, after}) {
    std::vector<std::string> args = {"calibrate",      f.string(), "--cluster",
                                     "hgx-h100",       "--set",    "cluster.nodes=1",
                                     "--no-protocol",  "--out",    (dir_ / "fit.toml").string(),
                                     "--accept-error", "10"};  // every figure held: no fit
    for (const char* k : {"links.nvlink.bandwidth_gbytes_per_s", "links.nvlink.latency_ns",
                          "library.call_overhead_us", "library.message_overhead_us",
                          "device.host.collective_issue_us"}) {
      args.emplace_back("--keep");
      args.emplace_back(k);
    }
    const ChildResult r = run_cocodiff(args, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m,
                                  std::regex("\nall_gather +2 +1 +1024 +\\S+ +40\\.00 +([0-9.]+)")))
        << r.out;
    predicted.push_back(m[1].str());
  }
  EXPECT_EQ(predicted[0], predicted[1]);
  EXPECT_GE(std::stod(predicted[0]), 50.2);  // hgx-h100's host issue cost per call
}

TEST_F(Calibrate, RecoversInterNodeFiguresFromCsvOfEveryOp) {
  // Two nodes of 1 and of 2 ranks: sendrecv, reduce_scatter, all_to_all and all_reduce cross
  // the inter-node tier (NICs, fabric), in the GPU measurement CSV's format.
  const std::vector<std::string> lib = {"cluster.library.call_overhead_us=25",
                                        "cluster.library.message_overhead_us=3"};
  const std::vector<std::string> truth = concat({lib, kTrueIntra, kTrueInter});
  std::string csv = "op,ranks,nodes,bytes,time_us,transport\n";
  for (const std::string op : {"sendrecv", "reduce_scatter", "all_to_all", "all_reduce"})
    for (int per_node : {1, 2}) {
      if (op == "all_reduce" && per_node == 1) continue;
      for (const auto& [bytes, us] : netbench(op, per_node, 2, truth))
        csv += op + "," + std::to_string(2 * per_node) + ",2," + std::to_string(bytes) + "," +
               std::to_string(us) + ",ib\n";
    }
  const fs::path data = write("gpu.csv", csv);
  const fs::path out = dir_ / "fit.toml";
  std::vector<std::string> args = {"calibrate",     data.string(), "--cluster", kTwoNodes,
                                   "--no-protocol", "--out",       out.string()};
  for (const std::string& s : kTrueIntra) args.insert(args.end(), {"--set", s});
  const ChildResult r = run_cocodiff(args, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string toml = read_text(out);
  EXPECT_NEAR(value(toml, "nic", "bandwidth_gbytes_per_s"), 20, 0.2) << r.out;
  EXPECT_NEAR(value(toml, "nic", "attach_bandwidth_gbytes_per_s"), 25.6, 0.256) << r.out;
  EXPECT_NEAR(value(toml, "nic", "latency_ns"), 800, 8) << r.out;
  EXPECT_NEAR(value(toml, "fabric", "latency_ns"), 1600, 16) << r.out;
  EXPECT_NEAR(value(toml, "library", "call_overhead_us"), 25, 0.25) << r.out;
  EXPECT_NEAR(value(toml, "library", "message_overhead_us"), 3, 0.03) << r.out;
  EXPECT_NE(r.out.find("reduce_scatter     4     2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sendrecv           2     2"), std::string::npos) << r.out;
}

TEST_F(Calibrate, WritesACompleteClusterThatRunsAndNetbenchReproduce) {
  // Fitted with --set values: the file keeps them, names no preset, and netbench on it prints
  // the times calibrate predicted.
  const std::vector<std::string> truth = {"cluster.links.nvswitch.bandwidth_gbytes_per_s=80",
                                          "cluster.library.call_overhead_us=25"};
  const std::string csv = all_gather_csv(truth);
  const fs::path data = write("ag.csv", csv);
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", data.string(), "--cluster", kTwoNodes, "--set", "cluster.nodes=1", "--set",
       "cluster.device.peak_tflops=123", "--no-protocol", "--out", out.string()},
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string toml = read_text(out);
  EXPECT_EQ(toml.find("\npreset = "), std::string::npos) << toml;
  EXPECT_EQ(value(toml, "device", "peak_tflops"), 123) << toml;
  EXPECT_NE(toml.find("\nnodes = 1\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("\nname = \"fit\"\n"), std::string::npos) << toml;
  // A run config beside it names it as its preset.
  write("run.toml",
        "[model]\npreset = \"flux1-tiny\"\n[run]\nresolution = 64\nsteps = 1\nmath = \"skip\"\n"
        "[cluster]\npreset = \"fit.toml\"\n");
  const ChildResult v = run_cocodiff({"validate", (dir_ / "run.toml").string()}, "/");
  EXPECT_EQ(v.exit_code, 0) << v.err;
  // netbench on 4 ranks of the file's node prints calibrate's predictions.
  std::map<std::int64_t, std::string> predicted;
  const std::regex row("\nall_gather +4 +1 +([0-9]+) +- +[0-9.]+ +([0-9.]+) ");
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), row);
       it != std::sregex_iterator(); ++it)
    predicted[std::stoll((*it)[1].str())] = (*it)[2].str();
  ASSERT_EQ(predicted.size(), 7u) << r.out;
  const ChildResult nb = run_cocodiff({"netbench", out.string(), "--op", "all_gather", "--rounds",
                                       "library", "-b", "4K", "-e", "16M", "-f", "4"},
                                      dir_);
  ASSERT_EQ(nb.exit_code, 0) << nb.err;
  for (const auto& [bytes, us] : predicted)
    EXPECT_TRUE(std::regex_search(nb.out, std::regex("\n +" + std::to_string(bytes) +
                                                     " +[0-9]+ +bfloat16 +none +-1 +" + us + " ")))
        << bytes << " bytes: calibrate predicted " << us << " us\n"
        << nb.out;
}

// --keep holds a figure that other measurements fixed: the file keeps the cluster's value, the
// summary says it was held, the other figures fit around it; a key that is no figure of the fit
// is refused by name.
TEST_F(Calibrate, KeepHoldsAFigureAndRefusesOneTheFitCannotMove) {
  const std::vector<std::string> truth = {"cluster.links.nvswitch.bandwidth_gbytes_per_s=80",
                                          "cluster.library.call_overhead_us=25"};
  const std::string csv = all_gather_csv(truth);
  const fs::path data = write("keep.csv", csv);
  const fs::path out = dir_ / "keep.toml";
  const ChildResult r =
      run_cocodiff({"calibrate", data.string(), "--cluster", kTwoNodes, "--set", "cluster.nodes=1",
                    "--set", "cluster.library.call_overhead_us=7", "--keep",
                    "library.call_overhead_us", "--no-protocol", "--out", out.string()},
                   dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("library.call_overhead_us                 = 7            (was 7) held "
                       "(--keep)"),
            std::string::npos)
      << r.out;
  const std::string toml = read_text(out);
  EXPECT_EQ(value(toml, "library", "call_overhead_us"), 7) << toml;
  // The bandwidth still fits (the held call cost is wrong, so it cannot fit exactly).
  EXPECT_NE(r.out.find("links.nvswitch.bandwidth_gbytes_per_s"), std::string::npos) << r.out;
  EXPECT_NE(value(toml, "links.nvswitch", "bandwidth_gbytes_per_s"), 0) << toml;

  const fs::path bad = dir_ / "bad.toml";
  const ChildResult k =
      run_cocodiff({"calibrate", data.string(), "--cluster", kTwoNodes, "--set", "cluster.nodes=1",
                    "--keep", "library.nonsense", "--out", bad.string()},
                   dir_);
  EXPECT_EQ(k.exit_code, 2) << k.out;
  EXPECT_NE(k.err.find("--keep library.nonsense: not a figure these points fit (they fit: "),
            std::string::npos)
      << k.err;
  EXPECT_NE(k.err.find("library.call_overhead_us"), std::string::npos) << k.err;
  EXPECT_FALSE(fs::exists(bad));
}

TEST_F(Calibrate, ReadsRealNcclTestsLogsWithHostnames) {
  // Two tests in one log (alltoall_perf on 2 nodes x 4 GPUs, sendrecv_perf on 2 nodes x 1),
  // with a launcher line, NCCL's own lines and N/A in #wrong.
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff({"calibrate", (kData / "alltoall_2nodes.log").string(),
                                      "--cluster", kTwoNodes, "--out", out.string()},
                                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("all_to_all         8     2          1024 -                 51.11"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("49.75"), std::string::npos) << "in-place column\n" << r.out;
  EXPECT_NE(r.out.find("sendrecv           2     2      33554432 -               1537.30"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("alltoall_2nodes.log:23"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("alltoall_2nodes.log:48 (in-place)"), std::string::npos) << r.out;
  // Made by the model with its NICs at 22 GB/s, plus noise: the fit finds them, and no warning.
  const std::string toml = read_text(out);
  EXPECT_NEAR(value(toml, "nic", "bandwidth_gbytes_per_s"), 22, 1.1) << r.out;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

// A fit that cannot follow its points, or that explains them with a link faster than the
// cluster's hardware, is refused: exit 2, no cluster file, the reason named.
TEST_F(Calibrate, AFitPastItsErrorOrAboveTheDatasheetIsRefused) {
  const fs::path out = dir_ / "fit.toml";
  // Points 6,000 times apart at one size: no figures follow both.
  const fs::path wild = write("wild.csv",
                              "op,ranks,nodes,bytes,time_us\n"
                              "all_gather,8,2,1024,0.001\n"
                              "all_gather,8,2,2048,1000000000\n"
                              "all_gather,8,2,4096,0.001\n");
  const ChildResult r = run_cocodiff(
      {"calibrate", wild.string(), "--cluster", kTwoNodes, "--out", out.string()}, dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("more than --accept-error 1"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // An inter-node all-gather at a tenth of the NIC's time: only a NIC ten times the cluster's
  // line rate explains it.
  std::string fast = "op,ranks,nodes,bytes,time_us\n";
  for (const long long b : {1LL << 24, 1LL << 26, 1LL << 28})
    fast += "all_gather,8,2," + std::to_string(b) + "," +
            std::to_string(static_cast<double>(b) / 220e9 * 1e6 * 0.875) + "\n";
  const fs::path f = write("fast.csv", fast);
  const ChildResult q =
      run_cocodiff({"calibrate", f.string(), "--cluster", kTwoNodes, "--out", out.string()}, dir_);
  EXPECT_EQ(q.exit_code, 2) << q.err << q.out;
  EXPECT_NE(q.err.find("bandwidth_gbytes_per_s"), std::string::npos) << q.err;
  EXPECT_NE(q.err.find("faster than the hardware the cluster describes"), std::string::npos)
      << q.err;
  EXPECT_FALSE(fs::exists(out));
}

// `mpirun --tag-output` puts "[1,0]<stdout>:" before every line: the log reads as without it.
TEST_F(Calibrate, ReadsLogsTaggedByTheLauncher) {
  std::istringstream plain(read_text(kData / "alltoall_2nodes.log"));
  std::string tagged;
  for (std::string line; std::getline(plain, line);) tagged += "[1,0]<stdout>:" + line + "\n";
  const fs::path log = write("tagged.log", tagged);
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", log.string(), "--cluster", kTwoNodes, "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("all_to_all         8     2          1024 -                 51.11"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("sendrecv           2     2      33554432 -               1537.30"),
            std::string::npos)
      << r.out;
  // The file runs the nodes its points ran on, where the cluster's own file says one.
  const fs::path h100 = dir_ / "h100.toml";
  const ChildResult h = run_cocodiff({"calibrate", log.string(), "--cluster", "hgx-h100", "--ops",
                                      "sendrecv", "--out", h100.string()},
                                     dir_);  // the 2-node sendrecv points alone: a quick fit
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(read_text(h100).find("\nnodes = 2\n"), std::string::npos) << read_text(h100);
}

TEST_F(Calibrate, OldNcclTestsLogsNameTheirOpByBinaryOrFileName) {
  const std::string body =
      "# nThread 1 nGpus 2 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20\n"
      "#  Rank  0 Group  0 Pid 7 on host device  0 [0x18] NVIDIA H100 80GB HBM3\n"
      "#  Rank  1 Group  0 Pid 7 on host device  1 [0x2a] NVIDIA H100 80GB HBM3\n"
      "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
      "        1024           128     float    none      -1    30.00    0.03    0.02      0\n"
      "        4096           512     float    none      -1    31.00    0.13    0.07      0\n";
  const fs::path a = write("run1.log", "$ ./build/all_gather_perf -b 1K -e 4K -g 2\n" + body);
  const fs::path b = write("allreduce.txt", body);
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", a.string(), b.string(), "--cluster", kTwoNodes, "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("all_gather         2     1          4096"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_reduce         2     1          4096"), std::string::npos) << r.out;
}

TEST_F(Calibrate, ReadsNetbenchOutputAndJson) {
  const ChildResult nb =
      run_cocodiff({"netbench", kTwoNodes, "--op", "reduce_scatter", "--set", "cluster.nodes=1",
                    "-b", "64K", "-e", "1M", "--json", (dir_ / "nb.json").string()},
                   dir_);
  ASSERT_EQ(nb.exit_code, 0) << nb.err;
  const fs::path text = write("nb.txt", nb.out);
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff({"calibrate", text.string(), (dir_ / "nb.json").string(),
                                      "--cluster", kTwoNodes, "--out", out.string()},
                                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("reduce_scatter     4     1        262144"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nb.json: rows[0]"), std::string::npos) << r.out;
}

TEST_F(Calibrate, MalformedFilesExitTwoAndWriteNothing) {
  struct Case {
    std::string name, text, message;
  };
  const std::string nccl =
      "# Collective test starting: alltoall_perf\n# nThread 1 nGpus 1\n"
      "#  Rank  0 Group  0 Pid 1 on a device  0 [0x18] H100\n";
  const std::vector<Case> cases = {
      {"header.csv", "op,size,time\nall_to_all,8,1024\n", "header.csv:1: expected a header naming"},
      {"fields.csv", "op,ranks,bytes,time_us\nall_to_all,8,1024\n",
       "fields.csv:2: expected 4 fields"},
      {"op.csv", "op,ranks,bytes,time_us\nbroadcast,8,1024,3\n", "op.csv:2: expected op"},
      {"time.csv", "op,ranks,bytes,time_us\nall_to_all,8,1024,-3\n",
       "time.csv:2: expected time_us"},
      {"ranks.csv", "op,ranks,bytes,time_us\nall_to_all,0,1024,3\n", "ranks.csv:2: expected ranks"},
      {"nodes.csv", "op,ranks,nodes,bytes,time_us\nall_to_all,4,8,1024,3\n",
       "nodes.csv:2: expected nodes"},
      {"split.csv", "op,ranks,nodes,bytes,time_us\nall_to_all,6,4,1024,3\n",
       "split.csv:2: expected ranks divisible by nodes"},
      {"big.csv", "op,ranks,bytes,time_us\nall_to_all,64,1024,3\n", "big.csv:2: 64 ranks"},
      {"wide.csv", "op,ranks,nodes,bytes,time_us\nall_to_all,10,2,1024,3\n",
       "wide.csv:2: 5 ranks per node"},
      {"lone.csv", "op,ranks,bytes,time_us\nsendrecv,1,1024,3\n",
       "lone.csv:2: expected at least 2 ranks for sendrecv"},
      {"empty.csv", "", "empty.csv: empty measurements file"},
      {"perf.txt",
       "# nThread 1 nGpus 1\n#  Rank  0 on h device 0\n     1024  256  float  none  -1  "
       "3.0  0.3  0.3  0\n",
       "perf.txt:1: expected a \"# Collective test starting: NAME_perf\" line"},
      {"bcast.log", "# Collective test starting: broadcast_perf\n",
       "bcast.log:1: expected a test of all_to_all"},
      {"norank.log",
       "# Collective test starting: alltoall_perf\n     1024  256  float  none  -1  "
       "3.0  0.3  0.3  0\n",
       "norank.log:1: expected \"#  Rank N ... on HOST\" lines"},
      {"twice.log", nccl + "#  Rank  0 Group  0 Pid 2 on b device  0 [0x18] H100\n",
       "twice.log:4: expected each rank listed once"},
      {"row.log", nccl + "     1024  256  float  none  -1  fast  0.3  0.3  0\n",
       "row.log:4: expected an out-of-place time in us"},
      // Rows meant as data that are not whole ones are errors, not lines dropped in silence.
      {"digits.log",
       nccl + "     12345678901234567890123  256  float  none  -1  3.0  0.3  0.3  0\n",
       "digits.log:4: expected a data row of nccl-tests"},
      {"cut.log", nccl + "     1024  256  float  none  -1  3.0\n",
       "cut.log:4: expected a data row of nccl-tests"},
      {"half.log", nccl + "     4096.5  256  float  none  -1  3.0  0.3  0.3  0\n",
       "half.log:4: expected a data row of nccl-tests"},
      {"wrong.log", nccl + "     1024  256  float  none  -1  3.0  0.3  0.3  1024\n",
       "wrong.log:4: expected #wrong 0 or N/A"},
      {"kind.csv", "op,kind,flops,bytes,time_us\nq_proj,matmul,1e9,1e6,5\n",
       "kind.csv:2: expected kind gemm | attention | norm | elementwise | copy"},
      {"kfields.csv", "op,kind,flops,bytes,time_us\nq_proj,gemm,1e9,5\n",
       "kfields.csv:2: expected 5 fields"},
      {"kzero.csv", "op,kind,flops,bytes,time_us\nq_proj,gemm,0,0,5\n",
       "kzero.csv:2: expected flops or bytes > 0"},
      {"ktime.csv", "op,kind,flops,bytes,time_us\nq_proj,gemm,1e9,1e6,nan\n",
       "ktime.csv:2: expected time_us"},
      {"nb.json",
       "{\"op\": \"all_to_all\", \"ranks\": 4, \"nodes\": 1, \"rows\": [{\"bytes\": 8}]}",
       "nb.json: rows[0]: expected a key \"time_ns\""},
      {"eager.csv", std::string(kEagerHeader) + "linear,q_proj,64,24,3072,3072,1e9,,\n",
       "eager.csv:2: expected device_us or host_us"},
      {"efields.csv", std::string(kEagerHeader) + "linear,q_proj,64,24,3072,1e9,,5\n",
       "efields.csv:2: expected 9 fields"},
      {"elabel.csv", std::string(kEagerHeader) + "linear,q proj,64,24,3072,3072,1e9,4,\n",
       "elabel.csv:2: expected a label"},
      {"inter.json", "{\"world\": 4, \"gemm_x_with_a2a_16MiB_us\": 5, \"gemm_x_alone_us\": 4}",
       "inter.json: expected a key \"all_to_all_16MiB_alone_us\""},
      {"inter2.json",
       "{\"gemm_x_with_a2a_16MiB_us\": -5, \"gemm_x_alone_us\": 4, \"all_to_all_16MiB_alone_us\": "
       "9, "
       "\"all_to_all_16MiB_with_gemm_x_us\": 9}",
       "inter2.json: gemm_x_with_a2a_16MiB_us: expected a time in us"},
      {"old.json",
       "{\"world\": 2, \"cases\": {\"2x2048\": {\"gpus\": 2, \"step_ms\": 500, "
       "\"rest_ms_min\": 460, \"rest_ms_max\": 470, \"host_late_ms_max\": 0}}}",
       "old.json: case 2x2048: expected a key \"segment_wait_ms\", found none (a breakdown file "
       "from before"},
      {"half.json",
       "{\"world\": 2, \"cases\": {\"2x2048\": {\"gpus\": 2.5, \"step_ms\": 500, "
       "\"rest_ms_min\": 460, \"rest_ms_max\": 470, \"segment_wait_ms\": 3, "
       "\"host_late_ms_max\": 0}}}",
       "half.json: case 2x2048: gpus: expected a whole number"},
      {"steps.csv", std::string(kStepsHeader) + "flat,2,1024,4096,130,120,140,100,nvlink\n",
       "steps.csv:2: expected 10 fields"},
      {"sorder.csv", std::string(kStepsHeader) + "flat,2,1024,4096,120,130,140,100,nvlink,4\n",
       "sorder.csv:2: expected min_ms <= median_ms <= max_ms"},
      {"sres.csv", std::string(kStepsHeader) + "flat,2,1000,3906,130,120,140,100,nvlink,4\n",
       "sres.csv:2: expected a resolution divisible by 16"},
      {"sgpus.csv", std::string(kStepsHeader) + "flat,0,1024,4096,130,120,140,100,nvlink,4\n",
       "sgpus.csv:2: expected gpus"},
      {"sflat.csv", std::string(kStepsHeader) + "v_first,2,1024,4096,130,120,140,100,nvlink,4\n",
       "calibrate: the steps files hold no flat step of two or more GPUs"},
      {"one.json",
       "{\"world\": 1, \"cases\": {\"1x2048\": {\"gpus\": 1, \"step_ms\": 500, "
       "\"rest_ms_min\": 460, \"rest_ms_max\": 470, \"segment_wait_ms\": 0, "
       "\"host_late_ms_max\": 0}}}",
       "one.json: expected a case of two or more GPUs"},
      {"chunk1.json",
       "{\"cases\": [{\"ranks\": 2, \"resolution\": 2048, \"chunks\": 2, \"norm_us\": 5}]}",
       "chunk1.json: case 1: expected a key \"norm_contig_us\", found none"},
      {"chunk2.json", "{\"cases\": []}", "chunk2.json: cases: expected a case, found none"},
      {"chunk3.json",
       "{\"cases\": [{\"ranks\": 2, \"resolution\": 2048, \"chunks\": 2.5, \"norm_us\": 5, "
       "\"norm_contig_us\": 4}]}",
       "chunk3.json: case 1: chunks: expected a whole number"},
      {"chunk4.json",
       "{\"cases\": [{\"ranks\": 2, \"resolution\": 2048, \"chunks\": 2, \"norm_us\": 5, "
       "\"norm_contig_us\": -4}]}",
       "chunk4.json: case 1: norm_contig_us: expected a number in"},
  };
  for (const Case& c : cases) {
    const fs::path data = write(c.name, c.text);
    const fs::path out = dir_ / "fit.toml";
    const ChildResult r = run_cocodiff({"calibrate", data.string(), "--cluster", kTwoNodes, "--set",
                                        "cluster.nodes=1", "--out", out.string()},
                                       dir_);
    EXPECT_EQ(r.exit_code, 2) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << c.name;
  }
}

// Issue 37, defect 2: huge ranks crashed (SIGSEGV) or wrapped to one rank; absurd sizes and
// times were accepted or failed without file and line.
TEST_F(Calibrate, ImplausibleValuesAreRefusedNamingFileAndLine) {
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"all_to_all,2147483648,4096,5",
       "expected ranks (an integer in [1, 1048576]), found "
       "\"2147483648\""},
      {"all_to_all,4294967297,4096,5", "found \"4294967297\""},
      {"all_to_all,4,4611686018427387904,5", "expected bytes (an integer in [1, 1099511627776])"},
      {"all_to_all,4,9e18,5", "found \"9e18\""},
      {"all_to_all,4,4096,1e-300",
       "expected time_us (a number in [0.001, 1e+09]), found "
       "\"1e-300\""},
      {"all_to_all,4,4096,1e300", "found \"1e300\""},
      {"all_to_all,4,4096,inf", "found \"inf\""},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const fs::path data =
        write("p" + std::to_string(i) + ".csv", "op,ranks,bytes,time_us\n" + rows[i].first + "\n");
    const fs::path out = dir_ / "fit.toml";
    const ChildResult r = run_cocodiff(
        {"calibrate", data.string(), "--cluster", kTwoNodes, "--out", out.string()}, dir_);
    EXPECT_EQ(r.exit_code, 2) << rows[i].first << ": " << r.err;
    EXPECT_NE(r.err.find(data.string() + ":2: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(rows[i].second), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
}

// Issue 37, defect 7: `calibrate /dev/zero` read 3.1 GB before refusing.
TEST_F(Calibrate, EndlessAndHugeFilesAreRefusedAtOnce) {
  const fs::path out = dir_ / "fit.toml";
  const auto t0 = std::chrono::steady_clock::now();
  const ChildResult z =
      run_cocodiff({"calibrate", "/dev/zero", "--cluster", kTwoNodes, "--out", out.string()}, dir_);
  EXPECT_EQ(z.exit_code, 2) << z.err;
  EXPECT_NE(z.err.find("/dev/zero:1: expected a line of at most 4096 characters"),
            std::string::npos)
      << z.err;
  // A sparse 100 MiB file: refused by its size, before it is read.
  const fs::path huge = dir_ / "huge.csv";
  write("huge.csv", "op,ranks,bytes,time_us\n");
  fs::resize_file(huge, std::uintmax_t{100} << 20);
  const ChildResult h = run_cocodiff(
      {"calibrate", huge.string(), "--cluster", kTwoNodes, "--out", out.string()}, dir_);
  EXPECT_EQ(h.exit_code, 2) << h.err;
  EXPECT_NE(h.err.find("expected a measurements file of at most 64 MiB, found 104857600 bytes"),
            std::string::npos)
      << h.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_FALSE(fs::exists(out));
}

// Issue 37, defect 8: op labels were written unquoted as TOML keys.
TEST_F(Calibrate, KernelLabelsThatAreNotBareKeysAreRefused) {
  for (const std::string label : {"q proj", "q.proj", "q]x", "q\"x", "q=x"}) {
    const fs::path data =
        write("k.csv", "op,kind,flops,bytes,time_us\n" + label + ",gemm,1e9,1e6,5\n");
    const fs::path out = dir_ / "fit.toml";
    const ChildResult r = run_cocodiff(
        {"calibrate", data.string(), "--cluster", kTwoNodes, "--out", out.string()}, dir_);
    EXPECT_EQ(r.exit_code, 2) << label << ": " << r.err;
    EXPECT_NE(
        r.err.find("k.csv:2: expected an op label of at most 64 letters, digits, '_' and '-'"),
        std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(out));
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
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", data.string(), "--cluster", "uniform", "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("roofline_us"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  EXPECT_NEAR(value(toml, "device", "launch_overhead_ns"), 2000, 20) << toml;
  EXPECT_NEAR(value(toml, "device.compute_efficiency", "gemm"), 0.7, 0.007) << toml;
  EXPECT_NEAR(value(toml, "device.memory_efficiency", "norm"), 0.5, 0.005) << toml;
  // Each op's points become its table, and the file is a cluster of its own.
  EXPECT_NE(toml.find("[device.kernels.q_proj]\nflops = [1e+06, 3e+06, 1e+07, 3e+07, 1e+08]"),
            std::string::npos)
      << toml;
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

// Grids by shape: synthetic GEMM, attention and memory-bound times made by a known roofline
// of the FLOPs and bytes cocodiff charges for each shape (dit::charged_cost): calibrate recovers
// its per-kind efficiencies within 1%, names the grids' directory as device.grid, and prints every
// point measured / held out / roofline.
TEST_F(Calibrate, RecoversKnownPerClassEfficienciesFromSyntheticGrids) {
  // The uniform preset at 100 TFLOP/s and 1 TB/s (GEMMs and attention compute-bound, the rest
  // memory-bound); launch 3 us.
  const double peak = 1e14, hbm = 1e12, launch = 3e-6;
  const double eff_gemm = 0.62, eff_att = 0.41, eff_norm = 0.55, eff_elem = 0.35, eff_copy = 0.8;
  const auto us = [&](const KernelShape& s) {
    const OpCost c = dit::charged_cost(s);
    const double ec = s.kernel == KernelClass::kGemm ? eff_gemm : eff_att;
    const double em = c.kind == OpKind::kNorm          ? eff_norm
                      : c.kind == OpKind::kElementwise ? eff_elem
                                                       : eff_copy;
    const double t = c.kind == OpKind::kGemm || c.kind == OpKind::kAttention ? c.flops / (peak * ec)
                                                                             : c.bytes / (hbm * em);
    return std::to_string((t + launch) * 1e6);
  };
  std::string gemm = "m,n,k,dtype,bias,us_median,us_min,us_max,reps\n";
  for (int m : {256, 1024, 4096})
    for (int n : {512, 2048})
      gemm += std::to_string(m) + "," + std::to_string(n) + ",4096,bf16,1," +
              us(gemm_shape(m, n, 4096, true)) + ",0,0,1\n";
  std::string att = "batch,q_tokens,kv_tokens,heads,head_dim,us_median,us_min,us_max,reps\n";
  for (int s : {512, 1024, 2048})
    for (int h : {4, 8})
      att += "1," + std::to_string(s) + "," + std::to_string(s) + "," + std::to_string(h) +
             ",128," + us(sdpa_shape(1, s, s, h, 128)) + ",0,0,1\n";
  std::string mem = "op,shape,dtype,bytes_moved,strided,us_median,us_min,us_max,reps\n";
  for (int t : {1024, 4096, 16384}) {
    const std::int64_t e = std::int64_t{t} * 3072;
    mem += "layernorm,1x" + std::to_string(t) + "x3072,bf16,0,0," +
           us(memory_shape(KernelClass::kLayerNorm, e, 3072)) + ",0,0,1\n";
    mem += "modulate_eager,1x" + std::to_string(t) + "x3072,bf16,0,0," +
           us(memory_shape(KernelClass::kModulateEager, e, 3072)) + ",0,0,1\n";
    mem += "copy,1x" + std::to_string(t) + "x3072,bf16,0,0," +
           us(memory_shape(KernelClass::kCopy, e, 3072)) + ",0,0,1\n";
  }
  fs::create_directories(dir_ / "grid");
  const fs::path g = write("grid/gemm.csv", gemm), a = write("grid/attention.csv", att),
                 mm = write("grid/memory.csv", mem);
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r =
      run_cocodiff({"calibrate", g.string(), a.string(), mm.string(), "--cluster", "uniform",
                    "--set", "cluster.device.peak_tflops=100", "--set",
                    "cluster.device.hbm_gbytes_per_s=1000", "--out", out.string()},
                   dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("held_out_us"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gemm                  1024x2048x4096x1"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  EXPECT_NEAR(value(toml, "device", "launch_overhead_ns"), 3000, 30) << toml;
  EXPECT_NEAR(value(toml, "device.compute_efficiency", "gemm"), eff_gemm, 0.01 * eff_gemm);
  EXPECT_NEAR(value(toml, "device.compute_efficiency", "attention"), eff_att, 0.01 * eff_att);
  EXPECT_NEAR(value(toml, "device.memory_efficiency", "norm"), eff_norm, 0.01 * eff_norm);
  EXPECT_NEAR(value(toml, "device.memory_efficiency", "elementwise"), eff_elem, 0.01 * eff_elem);
  EXPECT_NEAR(value(toml, "device.memory_efficiency", "copy"), eff_copy, 0.01 * eff_copy);
  EXPECT_NE(toml.find("grid = [\"grid\"]"), std::string::npos) << toml;
  // The file runs: a grid point's op takes the grid's time.
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

TEST_F(Calibrate, AMalformedGridFileExitsTwoNamingFileAndLine) {
  const fs::path g = write("gemm.csv",
                           "m,n,k,dtype,bias,us_median,us_min,us_max,reps\n"
                           "256,512,1024,bf16,1,12.5,0,0,1\n"
                           "256,512,ten,bf16,1,12.5,0,0,1\n");
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r =
      run_cocodiff({"calibrate", g.string(), "--cluster", "uniform", "--out", out.string()}, dir_);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("gemm.csv:3: expected k as an integer"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Calibrate, EagerOpsAndInterferenceBecomeTheDevicesTablesAndHostCosts) {
  // Two machines' host times (medians: 15 a projection, 11 a norm), device times of two shapes,
  // and an interference file: what a device preset with a host is made from.
  const fs::path a = write("kernels.csv", std::string(kEagerHeader) +
                                              "linear,q_proj,64,24,3072,3072,1e9,,14\n"
                                              "rms_norm,q_norm,64,24,128,24,1e5,,10\n"
                                              "norm_modulate,norm1,64,24,3072,3072,1e5,,30\n"
                                              "linear,q_proj,256,24,3072,3072,4e9,9,\n"
                                              "linear,q_proj,1024,24,3072,3072,1.6e10,30,\n"
                                              "all_to_all,all_to_all,8192,4,0,0,,,50\n");
  const fs::path b = write("host_other.csv", std::string(kEagerHeader) +
                                                 "linear,q_proj,64,24,3072,3072,1e9,,16\n"
                                                 "rms_norm,q_norm,64,24,128,24,1e5,,12\n");
  // Beside the all-to-all a GEMM runs 1.25x, an attention 1.05x (a fifth of the GEMM's
  // slowdown) and Q/K norm+RoPE 1.15x (three fifths); beside a smaller one, 1.5x (not used).
  const fs::path inter = write("interference.json",
                               "{\"world\": 4, \"gemm_g_alone_us\": 400, "
                               "\"gemm_g_with_a2a_256MiB_us\": 500, "
                               "\"all_to_all_256MiB_alone_us\": 600, "
                               "\"all_to_all_256MiB_with_gemm_g_us\": 900, "
                               "\"attention_sdpa_alone_us\": 1000, "
                               "\"attention_sdpa_with_a2a_256MiB_us\": 1050, "
                               "\"all_to_all_256MiB_with_attention_sdpa_us\": 700, "
                               "\"qk_norm_rope_alone_us\": 200, "
                               "\"qk_norm_rope_with_a2a_256MiB_us\": 230, "
                               "\"all_to_all_256MiB_with_qk_norm_rope_us\": 650, "
                               "\"all_to_all_16MiB_alone_us\": 60, "
                               "\"qk_norm_rope_with_a2a_16MiB_us\": 300, "
                               "\"all_to_all_16MiB_with_qk_norm_rope_us\": 70}");
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff({"calibrate", a.string(), b.string(), inter.string(),
                                      "--cluster", "hgx-h100", "--out", out.string()},
                                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("host: op_issue_us = 15"), std::string::npos) << r.out;
  const std::string toml = read_text(out);
  const toml::table written = toml::parse(toml);
  const toml::array* k_flops = written["device"]["kernels"]["k_proj"]["flops"].as_array();
  const toml::array* k_us = written["device"]["kernels"]["k_proj"]["time_us"].as_array();
  ASSERT_TRUE(k_flops != nullptr && k_us != nullptr) << toml;
  ASSERT_EQ(k_flops->size(), 2u);
  EXPECT_DOUBLE_EQ(k_flops->at(1).value<double>().value(), 1.6e10);
  EXPECT_DOUBLE_EQ(k_us->at(0).value<double>().value(), 9);
  EXPECT_DOUBLE_EQ(k_us->at(1).value<double>().value(), 30);
  EXPECT_EQ(written["device"]["kernels"]["k_proj"]["source"].value<std::string>().value_or(""),
            "linear q_proj, linear_heads q_proj_heads of " + a.string() + ", " + b.string() +
                " (device time; cocodiff calibrate " +
                toml.substr(toml.find("calibrate on ") + 13, 10) + ")");
  EXPECT_DOUBLE_EQ(value(toml, "device.host.ops", "v_proj"), 15);
  EXPECT_DOUBLE_EQ(value(toml, "device.host.ops", "norm_out"), 11);
  EXPECT_DOUBLE_EQ(value(toml, "device.host.ops", "modulate"), 19);
  EXPECT_DOUBLE_EQ(value(toml, "device.host", "collective_issue_us"), 50);
  EXPECT_DOUBLE_EQ(value(toml, "device", "overlap_compute_factor"), 1.25);
  EXPECT_DOUBLE_EQ(value(toml, "device", "overlap_transfer_factor"), 1.5);
  EXPECT_NEAR(value(toml, "device.overlap_kind_weight", "attention"), 0.2, 1e-9);
  EXPECT_NEAR(value(toml, "device.overlap_kind_weight", "norm"), 0.6, 1e-9);
  EXPECT_NEAR(value(toml, "device.overlap_kind_weight", "elementwise"), 0.6, 1e-9);
  // A label no file measured keeps the preset's cost.
  EXPECT_NE(r.out.find("no issue time measured for"), std::string::npos) << r.out;
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

TEST_F(Calibrate, AKindsWeightHeldWithKeepStaysTheClusters) {
  const fs::path inter = write("interference.json",
                               "{\"world\": 2, \"gemm_g_alone_us\": 400, "
                               "\"gemm_g_with_a2a_256MiB_us\": 500, "
                               "\"all_to_all_256MiB_alone_us\": 600, "
                               "\"all_to_all_256MiB_with_gemm_g_us\": 900, "
                               "\"qk_norm_rope_alone_us\": 200, "
                               "\"qk_norm_rope_with_a2a_256MiB_us\": 240, "
                               "\"all_to_all_256MiB_with_qk_norm_rope_us\": 650}");
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff({"calibrate", inter.string(), "--cluster", "uniform", "--keep",
                                      "device.overlap_kind_weight.norm", "--out", out.string()},
                                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("device.overlap_kind_weight.norm = 0.8 measured, held at the cluster's"),
            std::string::npos)
      << r.out;
  const toml::table fit = toml::parse_file(out.string());
  EXPECT_FALSE(fit["device"]["overlap_kind_weight"]["norm"]);
  EXPECT_DOUBLE_EQ(fit["device"]["overlap_kind_weight"]["elementwise"].value<double>().value_or(0),
                   0.8);
  // A weight no interference file gives: exit 2 naming the key, nothing written.
  const fs::path none = dir_ / "none.toml";
  const ChildResult e =
      run_cocodiff({"calibrate", inter.string(), "--cluster", "uniform", "--keep",
                    "device.overlap_kind_weight.attention", "--out", none.string()},
                   dir_);
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_NE(e.err.find("--keep device.overlap_kind_weight.attention: not a figure"),
            std::string::npos)
      << e.err;
  EXPECT_FALSE(fs::exists(none));
}

TEST_F(Calibrate, InterferenceOnSeveralGroupSizesGivesEachGroupItsFactors) {
  // 4 GPUs: GEMM 1.25x, all-to-all 1.5x (the device's); 2 GPUs: 1.1x and 1.75x (2-GPU groups').
  const auto file = [&](const char* name, int world, double gemm_with, double a2a_with) {
    return write(name, "{\"world\": " + std::to_string(world) +
                           ", \"gemm_g_alone_us\": 400, \"gemm_g_with_a2a_256MiB_us\": " +
                           std::to_string(gemm_with) +
                           ", \"all_to_all_256MiB_alone_us\": 600, "
                           "\"all_to_all_256MiB_with_gemm_g_us\": " +
                           std::to_string(a2a_with) + "}");
  };
  const fs::path four = file("interference_4.json", 4, 500, 900);
  const fs::path two = file("interference_2.json", 2, 440, 1050);
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", two.string(), four.string(), "--cluster", "uniform", "--out", out.string()},
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string toml = read_text(out);
  EXPECT_DOUBLE_EQ(value(toml, "device", "overlap_compute_factor"), 1.25);
  EXPECT_DOUBLE_EQ(value(toml, "device", "overlap_transfer_factor"), 1.5);
  EXPECT_DOUBLE_EQ(value(toml, "device.overlap_by_group.2", "compute_factor"), 1.1);
  EXPECT_DOUBLE_EQ(value(toml, "device.overlap_by_group.2", "transfer_factor"), 1.75);
  EXPECT_NE(r.out.find("interference on 2 GPUs"), std::string::npos) << r.out;
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
  // A world that is not a number of GPUs: exit 2 naming the file and the key, nothing written.
  const fs::path bad = write("interference_bad.json",
                             "{\"world\": \"four\", \"gemm_g_alone_us\": 400, "
                             "\"gemm_g_with_a2a_256MiB_us\": 500, "
                             "\"all_to_all_256MiB_alone_us\": 600, "
                             "\"all_to_all_256MiB_with_gemm_g_us\": 900}");
  const fs::path none = dir_ / "none.toml";
  const ChildResult e = run_cocodiff(
      {"calibrate", bad.string(), "--cluster", "uniform", "--out", none.string()}, dir_);
  EXPECT_EQ(e.exit_code, 2);
  EXPECT_NE(e.err.find("interference_bad.json: world"), std::string::npos) << e.err;
  EXPECT_FALSE(fs::exists(none));
}

TEST_F(Calibrate, RecoversAKnownRankSpreadFromBreakdowns) {
  // Waits made with a spread of 0.015: the mean rank waits 0.015 x z_max(W) x its work a step
  // (z_max: Blom's largest score, 0.5894558 for 2 ranks, 1.0491314 for 4). A host-bound case
  // (its GPU waits 20 ms of a 200 ms step for its host) is printed and not used.
  const auto json_case = [](const char* key, int gpus, double step, double work, double wait,
                            double late) {
    return "\"" + std::string(key) + "\": {\"gpus\": " + std::to_string(gpus) +
           ", \"step_ms\": " + std::to_string(step) +
           ", \"rest_ms_min\": " + std::to_string(work - 1) +
           ", \"rest_ms_max\": " + std::to_string(work + 1) +
           ", \"segment_wait_ms\": " + std::to_string(wait) +
           ", \"host_late_ms_max\": " + std::to_string(late) + "}";
  };
  const double s = 0.015;
  const fs::path a = write("breakdown_nvlink.json",
                           "{\"world\": 4, \"cases\": {" +
                               json_case("2x2048", 2, 500, 460, s * 0.5894558 * 460, 0) + ", " +
                               json_case("4x2048", 4, 270, 240, s * 1.0491314 * 240, 0.01) + ", " +
                               json_case("4x1024", 4, 200, 100, 50, 20) + "}}");
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r =
      run_cocodiff({"calibrate", a.string(), "--cluster", "hgx-h100", "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(value(read_text(out), "device", "rank_spread"), s, 0.01 * s);
  EXPECT_NE(r.out.find("host-bound (GPU waits 20.00 ms for its host): not used"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("warning: one spread misses"), std::string::npos) << r.out;
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

// A chunks file: device.strided_factor.norm is the median ratio of the norm on strided slices
// to the norm on contiguous copies over the cases of two or more groups (the whole tensor's case
// is printed, not used).
TEST_F(Calibrate, FitsTheStridedFactorFromAChunksFile) {
  const auto json_case = [](int chunks, double strided, double contig) {
    return "{\"ranks\": 2, \"resolution\": 2048, \"rank_tokens\": 8192, \"heads\": 12, "
           "\"chunks\": " +
           std::to_string(chunks) + ", \"norm_us\": " + std::to_string(strided) +
           ", \"norm_contig_us\": " + std::to_string(contig) + "}";
  };
  const fs::path a = write("chunks.json", "{\"cases\": [" + json_case(1, 100, 100) + ", " +
                                              json_case(2, 120, 100) + ", " + json_case(2, 65, 50) +
                                              ", " + json_case(4, 160, 100) + "]}");
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r =
      run_cocodiff({"calibrate", a.string(), "--cluster", "hgx-h100", "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const toml::table fit = toml::parse_file(out.string());
  EXPECT_DOUBLE_EQ(fit.at_path("device.strided_factor.norm").value<double>().value_or(0), 1.3);
  EXPECT_NE(r.out.find("(whole: not used)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device.strided_factor.norm = 1.3 (median of 3 cases)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("warning: the cases' ratios range 1.200-1.600"), std::string::npos) << r.out;
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

// Steps made by the emulator with a known host step factor (1.3) and sync slowdown (1.7) and a
// known kernels' step factor (1.06) on two "machines" (files), flat and V-First on 1, 2 and 4
// GPUs at 1024^2 and 2048^2, one step measured in three launches: calibrate fits the kernels'
// factor to the flat 1-GPU step at the largest resolution (2048^2), then the host's to the flat
// steps of 2 or more GPUs at the smallest (1024^2), and recovers all three within 1%.
TEST_F(Calibrate, RecoversKnownHostAndKernelStepFactorsAndSyncSlowdownFromSyntheticSteps) {
  const double truth = 1.7, truth_factor = 1.3, truth_kernels = 1.06;
  const auto step_ms = [&](int gpus, int res, const std::string& strategy) {
    std::string nics;
    for (int r = 0; r < gpus; ++r) nics += (r ? "," : "") + std::to_string(r);
    const fs::path out = dir_ / ("run-" + std::to_string(gpus) + "-" + std::to_string(res));
    const ChildResult r =
        run_cocodiff({"run",
                      (fs::path(COCODIFF_SOURCE_DIR) / "configs" / "quickstart.toml").string(),
                      "--out",
                      out.string(),
                      "-q",
                      "--set",
                      "run.math=skip",
                      "--set",
                      "model.preset=flux1-dev",
                      "--set",
                      "run.resolution=" + std::to_string(res),
                      "--set",
                      "run.steps=2",
                      "--set",
                      "cluster.preset=hgx-h100",
                      "--set",
                      "cluster.nodes=1",
                      "--set",
                      "cluster.topology.sizes=[" + std::to_string(gpus) + "]",
                      "--set",
                      "cluster.nic.count=" + std::to_string(gpus),
                      "--set",
                      "cluster.nic.rank_nic=[" + nics + "]",
                      "--set",
                      "run.strategy=" + strategy,
                      "--set",
                      "emulator.trace=false",
                      "--set",
                      "cluster.device.host.sync_slowdown=" + std::to_string(truth),
                      "--set",
                      "cluster.device.host.step_factor=" + std::to_string(truth_factor),
                      "--set",
                      "cluster.device.step_factor=" + std::to_string(truth_kernels)},
                     dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(out / "report.json");
    return nlohmann::json::parse(in)["virtual_time_s"].get<double>() / 2 * 1e3;
  };
  const auto row = [&](const std::string& strategy, int gpus, int res, double ms) {
    return strategy + "," + std::to_string(gpus) + "," + std::to_string(res) + "," +
           std::to_string((res / 16) * (res / 16)) + "," + std::to_string(ms) + "," +
           std::to_string(ms * 0.9) + "," + std::to_string(ms * 1.1) + "," +
           std::to_string(ms * 0.95) + ",nvlink,4\n";
  };
  const double f2 = step_ms(2, 1024, "flat"), f4 = step_ms(4, 1024, "flat");
  // The second launch of a step 10% slower, the third 10% faster: their median is the step.
  const fs::path a = write("a_steps_nvlink.csv",
                           std::string(kStepsHeader) + row("flat", 2, 1024, f2) +
                               row("flat", 2, 1024, f2 * 1.1) + row("flat", 2, 1024, f2 / 1.1) +
                               row("v_first", 2, 1024, 3 * f2) + row("flat", 2, 2048, 5 * f2));
  const fs::path b =
      write("b_steps_nvlink.csv", std::string(kStepsHeader) + row("flat", 4, 1024, f4) +
                                      row("flat", 1, 1024, f4 / 3) + row("flat", 4, 2048, 9 * f4) +
                                      row("flat", 1, 2048, step_ms(1, 2048, "flat")));
  const fs::path out = dir_ / "fit.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", a.string(), b.string(), "--cluster", "hgx-h100", "--out", out.string()}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string fit = read_text(out);
  EXPECT_NEAR(value(fit, "device.host", "sync_slowdown"), truth, 0.01 * truth) << r.out;
  EXPECT_NEAR(value(fit, "device.host", "step_factor"), truth_factor, 0.01 * truth_factor) << r.out;
  EXPECT_EQ(value(fit, "device.host", "per_rank_slowdown"), 0.0);
  EXPECT_NEAR(value(fit, "device", "step_factor"), truth_kernels, 0.01 * truth_kernels) << r.out;
  EXPECT_NE(r.out.find("# steps: 1 flat 1-GPU steps at 2048^2 (device-bound)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("# steps: 2 flat steps of 2 or more GPUs at 1024^2"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("warning: the fitted host misses"), std::string::npos) << r.out;
  // A complete cluster file.
  const ChildResult topo = run_cocodiff({"topo", out.string()}, dir_);
  EXPECT_EQ(topo.exit_code, 0) << topo.err;
}

// The shipped GPU presets' kernel tables, host issue costs and overlap factors are what
// calibrate writes from the measurements they name, to the digits the presets keep (4
// significant digits for device times, 3 for host costs, one decimal for the overlap factors).
TEST_F(Calibrate, ShippedGpuPresetsAreWhatCalibrateWritesFromTheirMeasurements) {
  const fs::path m = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "measurements";
  const fs::path presets = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "clusters";
  const std::vector<std::pair<std::string, std::vector<fs::path>>> cases = {
      {"hgx-h100",
       {m / "h100x4" / "kernels.csv", m / "h100x4-repeat" / "host_nvlink.csv",
        m / "h100x4" / "interference_nvlink.json", m / "h100x2" / "interference_nvlink.json",
        m / "h100x4-spread" / "breakdown_nvlink.json",
        m / "h100x2-spread" / "breakdown_nvlink.json", m / "h100x4" / "steps_nvlink.csv",
        m / "h100x4-repeat" / "steps_nvlink.csv", m / "h100x4-spread" / "steps_nvlink.csv",
        m / "h100x2-spread" / "steps_nvlink.csv", m / "h200-chunks" / "chunks.json",
        m / "h100x1-models" / "gemm.csv", m / "h100x1-models" / "attention.csv",
        m / "h100x1-models" / "memory.csv"}},
      {"hgx-h200",
       {m / "h200x2" / "kernels.csv", m / "h200x2" / "interference_nvlink.json",
        m / "h200x4-interference" / "interference_nvlink.json", m / "h200x2" / "steps_nvlink.csv",
        m / "h200x4" / "steps_nvlink.csv", m / "h200x2-breakdown" / "breakdown_nvlink.json",
        m / "h200x4-breakdown" / "breakdown_nvlink.json", m / "h200-chunks" / "chunks.json",
        m / "h200x1-models" / "gemm.csv", m / "h200x1-models" / "attention.csv",
        m / "h200x1-models" / "memory.csv", m / "h200x1-models2" / "gemm.csv",
        m / "h200x1-models2" / "attention.csv", m / "h200x1-models2" / "memory.csv"}}};
  for (const auto& [preset, files] : cases) {
    SCOPED_TRACE(preset);
    const fs::path out = dir_ / (preset + "-fit.toml");
    std::vector<std::string> args = {"calibrate"};
    for (const fs::path& f : files) args.push_back(f.string());
    for (const std::string& a :
         {std::string("--cluster"), preset, std::string("--out"), out.string()})
      args.push_back(a);
    // Over NVLink the kinds' weights are measured and held at 1 (the presets say why).
    for (const char* kind : {"attention", "norm", "elementwise"}) {
      args.emplace_back("--keep");
      args.push_back(std::string("device.overlap_kind_weight.") + kind);
    }
    const ChildResult r = run_cocodiff(args, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const toml::table fit = toml::parse_file(out.string());
    const toml::table shipped = toml::parse_file((presets / (preset + ".toml")).string());
    // A preset timed by shape names the grids the fit read and keeps no kernel table; its
    // roofline (for what the grids do not cover) is the fit's.
    const toml::table empty;
    if (const toml::array* sgrid = shipped["device"]["grid"].as_array()) {
      const toml::array* fgrid = fit["device"]["grid"].as_array();
      ASSERT_TRUE(fgrid != nullptr);
      ASSERT_EQ(fgrid->size(), sgrid->size());
      for (size_t i = 0; i < sgrid->size(); ++i)
        EXPECT_EQ(
            fs::weakly_canonical(presets / sgrid->at(i).value<std::string>().value()),
            fs::weakly_canonical(out.parent_path() / fgrid->at(i).value<std::string>().value()));
      EXPECT_FALSE(fit["device"]["kernels"]);
      // The reference host's directory too, relative to the written file like the grids'.
      if (const auto sref = shipped["device"]["host"]["reference"].value<std::string>()) {
        const auto fref = fit["device"]["host"]["reference"].value<std::string>();
        ASSERT_TRUE(fref.has_value());
        EXPECT_TRUE(fs::path(*fref).is_relative()) << *fref;
        EXPECT_EQ(fs::weakly_canonical(presets / *sref),
                  fs::weakly_canonical(out.parent_path() / *fref));
      }
      for (const char* kind : {"gemm", "attention", "norm", "elementwise", "copy"})
        EXPECT_EQ(shipped["device"]["grid_scale"][kind].value<double>().value_or(1),
                  fit["device"]["grid_scale"][kind].value<double>().value_or(1))
            << "grid_scale." << kind;
      EXPECT_FALSE(shipped["device"]["kernels"]);
      EXPECT_NEAR(shipped["device"]["launch_overhead_ns"].value<double>().value_or(-1),
                  fit["device"]["launch_overhead_ns"].value<double>().value(), 0.5);
      for (const char* table : {"compute_efficiency", "memory_efficiency"}) {
        const toml::table& f = *fit["device"][table].as_table();
        for (const auto& [kind, node] : f) {
          const double v = node.value<double>().value();
          EXPECT_NEAR(shipped["device"][table][kind.str()].value<double>().value_or(-1), v,
                      5e-4 * v)
              << table << "." << kind.str();
        }
      }
    }
    const toml::table& fk = fit["device"]["kernels"].as_table() != nullptr
                                ? *fit["device"]["kernels"].as_table()
                                : empty;
    const toml::table& sk = shipped["device"]["kernels"].as_table() != nullptr
                                ? *shipped["device"]["kernels"].as_table()
                                : empty;
    EXPECT_EQ(fk.size(), sk.size());
    for (const auto& [label, node] : fk) {
      SCOPED_TRACE(std::string(label.str()));
      const toml::array* sf = sk[label.str()]["flops"].as_array();
      const toml::array* st = sk[label.str()]["time_us"].as_array();
      ASSERT_TRUE(sf != nullptr && st != nullptr);
      const toml::array& ff = *node.as_table()->get("flops")->as_array();
      const toml::array& ft = *node.as_table()->get("time_us")->as_array();
      ASSERT_EQ(sf->size(), ff.size());
      for (size_t i = 0; i < ff.size(); ++i) {
        EXPECT_NEAR(sf->at(i).value<double>().value(), ff[i].value<double>().value(),
                    5e-6 * ff[i].value<double>().value());
        EXPECT_NEAR(st->at(i).value<double>().value(), ft[i].value<double>().value(),
                    5e-4 * ft[i].value<double>().value());
      }
    }
    const toml::table& fh = *fit["device"]["host"]["ops"].as_table();
    const toml::table& sh = *shipped["device"]["host"]["ops"].as_table();
    EXPECT_EQ(fh.size(), sh.size());
    for (const auto& [label, node] : fh) {
      const double v = node.value<double>().value();
      EXPECT_NEAR(sh[label.str()].value<double>().value_or(-1), v, 5e-3 * v) << label.str();
    }
    for (const char* key : {"op_issue_us", "collective_issue_us"}) {
      const double v = fit["device"]["host"][key].value<double>().value();
      EXPECT_NEAR(shipped["device"]["host"][key].value<double>().value_or(-1), v, 5e-3 * v) << key;
    }
    for (const char* key : {"overlap_compute_factor", "overlap_transfer_factor"})
      EXPECT_NEAR(shipped["device"][key].value<double>().value_or(-1),
                  fit["device"][key].value<double>().value(), 0.05)
          << key;
    // Groups with interference of their own (2 GPUs for hgx-h100), the same.
    const toml::table* fg = fit["device"]["overlap_by_group"].as_table();
    const toml::table* sg = shipped["device"]["overlap_by_group"].as_table();
    ASSERT_EQ(fg == nullptr, sg == nullptr);
    if (fg != nullptr) {
      EXPECT_EQ(fg->size(), sg->size());
      for (const auto& [ranks, node] : *fg)
        for (const char* key : {"compute_factor", "transfer_factor"})
          EXPECT_NEAR((*sg)[ranks.str()][key].value<double>().value_or(-1),
                      (*node.as_table())[key].value<double>().value(), 0.05)
              << ranks.str() << " " << key;
    }
    // The kinds' shares of the compute factor: held at 1 (--keep) in both.
    for (const char* kind : {"attention", "norm", "elementwise"})
      EXPECT_NEAR(shipped["device"]["overlap_kind_weight"][kind].value<double>().value_or(1),
                  fit["device"]["overlap_kind_weight"][kind].value<double>().value_or(1), 0.005)
          << kind;
    // A head group's norm on its strided slice (chunks.json, measured on H200).
    EXPECT_DOUBLE_EQ(shipped["device"]["strided_factor"]["norm"].value<double>().value_or(0),
                     fit["device"]["strided_factor"]["norm"].value<double>().value_or(-1));
    // The ranks' spread where a breakdown was measured (3 significant digits), else none.
    EXPECT_NEAR(shipped["device"]["rank_spread"].value<double>().value_or(0),
                fit["device"]["rank_spread"].value<double>().value_or(0), 5e-5);
    // The host's step factor and sync slowdown, fitted to the flat 1024^2 steps to the fit's
    // resolution (0.01; the presets' tables are rounded, which may move the fit by a step of it).
    for (const char* key : {"step_factor", "sync_slowdown"})
      EXPECT_NEAR(shipped["device"]["host"][key].value<double>().value_or(-1),
                  fit["device"]["host"][key].value<double>().value_or(0), 0.015)
          << key;
    // The kernels' step factor, fitted to the flat 1-GPU 2048^2 steps (to 0.001; the rounded
    // tables may move it by a step of that).
    EXPECT_NEAR(shipped["device"]["step_factor"].value<double>().value_or(-1),
                fit["device"]["step_factor"].value<double>().value_or(0), 0.0015);
  }
}

// --grid-reference carries the H200's grids to the H100 by the same eager ops measured on both
// (the geometric mean of their ratios by kind): the factors, and a cluster file that runs.
TEST_F(Calibrate, GridReferenceCarriesTheH200GridsToTheH100) {
  const fs::path m = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "measurements";
  const fs::path out = dir_ / "carried.toml";
  const ChildResult r = run_cocodiff(
      {"calibrate", (m / "h100x4" / "kernels.csv").string(),
       (m / "h200x1-models" / "gemm.csv").string(),
       (m / "h200x1-models" / "attention.csv").string(),
       (m / "h200x1-models" / "memory.csv").string(), "--grid-reference",
       (m / "h200x2" / "kernels.csv").string(), "--cluster", "hgx-h100", "--out", out.string()},
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const toml::table fit = toml::parse_file(out.string());
  const std::map<std::string, double> want = {{"gemm", 1.0884},
                                              {"attention", 1.0024},
                                              {"norm", 1.0127},
                                              {"elementwise", 1.0935},
                                              {"copy", 0.8975}};
  for (const auto& [kind, v] : want)
    EXPECT_EQ(fit["device"]["grid_scale"][kind].value<double>().value_or(-1), v) << kind;
  EXPECT_NE(r.out.find("# device.grid_scale.gemm = 1.0884"), std::string::npos) << r.out;
  EXPECT_EQ(run_cocodiff({"topo", out.string()}, dir_).exit_code, 0);
}

// --grid-reference carries grids: without grid files, or with a reference of no common op, it
// is refused (exit 2, naming the option) and no cluster file is written.
TEST_F(Calibrate, GridReferenceNeedsGridsAndOpsInCommon) {
  const fs::path m = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "measurements";
  const fs::path out = dir_ / "carried.toml";
  const ChildResult a = run_cocodiff(
      {"calibrate", (m / "h100x4" / "kernels.csv").string(), "--grid-reference",
       (m / "h200x2" / "kernels.csv").string(), "--cluster", "hgx-h100", "--out", out.string()},
      dir_);
  EXPECT_EQ(a.exit_code, 2);
  EXPECT_NE(a.err.find("--grid-reference"), std::string::npos) << a.err;
  EXPECT_NE(a.err.find("grid files"), std::string::npos) << a.err;
  EXPECT_FALSE(fs::exists(out));
  const fs::path other = dir_ / "other_ops.csv";
  std::ofstream(other) << "op,label,tokens,heads,k,n,flops,device_us,host_us\n"
                          "linear,q_proj,7,24,3072,3072,1e9,5.0,\n";
  const ChildResult b =
      run_cocodiff({"calibrate", (m / "h100x4" / "kernels.csv").string(),
                    (m / "h200x1-models" / "gemm.csv").string(), "--grid-reference", other.string(),
                    "--cluster", "hgx-h100", "--out", out.string()},
                   dir_);
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.err.find("same shape"), std::string::npos) << b.err;
  EXPECT_FALSE(fs::exists(out));
}

// configs/clusters/h100-shm.toml and h200-shm.toml are what the commands in their headers write:
// the shared-memory sweeps give the link's (and on 4 GPUs the per-pair) bandwidth and the
// library's costs; the interference and breakdown files the device's factors and spread.
TEST_F(Calibrate, ShippedSharedMemoryPresetsAreWhatCalibrateWritesFromTheirMeasurements) {
  const fs::path root(COCODIFF_SOURCE_DIR);
  const fs::path m = fs::path("configs") / "measurements";
  struct Case {
    std::string preset, base;
    std::vector<fs::path> files;
    std::vector<std::string> sets;  // --set values beyond cluster.nodes=1
    std::vector<const char*> keys;
  };
  const std::vector<const char*> common = {"links.nvlink.bandwidth_gbytes_per_s",
                                           "links.nvlink.latency_ns",
                                           "library.call_overhead_us",
                                           "library.message_overhead_us",
                                           "device.host.collective_issue_us",
                                           "device.overlap_compute_factor",
                                           "device.overlap_transfer_factor",
                                           "device.rank_spread",
                                           "device.overlap_kind_weight.attention",
                                           "device.overlap_kind_weight.norm",
                                           "device.overlap_kind_weight.elementwise",
                                           "device.strided_factor.norm"};
  std::vector<const char*> h100_keys = common;
  for (const char* k :
       {"links.nvlink.pair_bandwidth_gbytes_per_s", "device.overlap_by_group.2.compute_factor",
        "device.overlap_by_group.2.transfer_factor"})
    h100_keys.push_back(k);
  std::vector<const char*> h200_keys = h100_keys;  // the same figures, from 2- and 4-GPU hosts
  const std::vector<Case> cases = {
      {"h100-shm",
       "hgx-h100",
       {m / "h100x4" / "collectives_shm.csv", m / "h100x2" / "collectives_shm.csv",
        m / "h100x4-spread" / "breakdown_shm.json", m / "h100x2-spread" / "breakdown_shm.json",
        m / "h100x4" / "interference_shm.json",
        m / "h100x2-interference" / "interference_shm.json"},
       {"cluster.links.nvlink.pair_bandwidth_gbytes_per_s=300"},
       h100_keys},
      {"h200-shm",
       "hgx-h200",
       {m / "h200x2" / "collectives_shm.csv", m / "h200x4" / "collectives_shm.csv",
        m / "h200x2-breakdown" / "breakdown_shm.json",
        m / "h200x4-breakdown" / "breakdown_shm.json",
        m / "h200x2-interference" / "interference_shm.json",
        m / "h200x4-interference" / "interference_shm.json"},
       {"cluster.links.nvlink.pair_bandwidth_gbytes_per_s=300"},
       h200_keys}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    const fs::path out = dir_ / (c.preset + "-fit.toml");
    std::vector<std::string> args = {"calibrate"};
    for (const fs::path& f : c.files) args.push_back((root / f).string());
    for (const char* a : {"--cluster", c.base.c_str(), "--set", "cluster.nodes=1", "--loss",
                          "soft_l1", "--ops", "all_to_all,all_gather"})
      args.emplace_back(a);
    for (const std::string& set : c.sets) {
      args.emplace_back("--set");
      args.push_back(set);
    }
    args.push_back("--out");
    args.push_back(out.string());
    const ChildResult r = run_cocodiff(args, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const fs::path shipped_path = root / "configs" / "clusters" / (c.preset + ".toml");
    const std::string header = read_text(shipped_path);
    for (const fs::path& f : c.files) EXPECT_NE(header.find(f.string()), std::string::npos) << f;
    for (const std::string& set : c.sets)
      EXPECT_NE(header.find("--set " + set), std::string::npos) << set;
    const toml::table fit = toml::parse_file(out.string());
    const toml::table shipped = toml::parse_file(shipped_path.string());
    EXPECT_EQ(shipped["name"].value<std::string>().value_or(""), c.preset);
    for (const char* key : c.keys) {
      const std::optional<double> f = fit.at_path(key).value<double>();
      const std::optional<double> s = shipped.at_path(key).value<double>();
      ASSERT_TRUE(f.has_value() && s.has_value()) << key;
      EXPECT_NEAR(*s, *f, 1e-2 * *f) << key;
    }
  }
}

}  // namespace
}  // namespace cocodiff::test
