// `cocodiff netbench` and `cocodiff topo` end to end on the uniform preset (8 ranks: 2 tiles x
// 2 GPUs x 2 nodes; every transfer alone costs alpha = 2 us + m / 10 GB/s, rounded up to the
// nanosecond, and every rank has its own NIC, so nothing contends): the nccl-tests row against
// the closed forms of flat pairwise and of TAPA (one all-to-all per level), and the topology
// listing.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

constexpr int kRanks = 8;
constexpr double kAlphaNs = 2000;
constexpr double kBytesPerNs = 10;  // 10 GB/s

// One transfer of m bytes alone, in ns, rounded up as the engine rounds each flow's time.
double transfer_ns(double m) { return kAlphaNs + std::ceil(m / kBytesPerNs); }

class Netbench : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cocodiff_netbench_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  /// netbench on `uniform` at one size; returns the JSON row.
  nlohmann::json row(const std::string& algo, std::int64_t bytes) {
    const fs::path json = dir_ / (algo + ".json");
    const std::string b = std::to_string(bytes);
    const ChildResult r = run_cocodiff({"netbench", "uniform", "--algo", algo, "--min-bytes", b,
                                        "--max-bytes", b, "--json", json.string()},
                                       dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("#wrong"), std::string::npos) << r.out;
    const nlohmann::json j = nlohmann::json::parse(read_text(json));
    EXPECT_EQ(j["ranks"], kRanks);
    EXPECT_EQ(j["rows"].size(), 1u);
    return j["rows"][0];
  }
  fs::path dir_;
};

TEST_F(Netbench, FlatIsPMinusOneRoundsWithExactBytesPerTier) {
  // 8192 bytes per rank = 512 elements (2 wire bytes each) to each of 8 ranks: 1 KiB messages.
  const nlohmann::json r = row("flat", 8192);
  const double m = 1024;
  EXPECT_EQ(r["count_per_peer"], 512);
  EXPECT_EQ(r["time_ns"].get<double>(), (kRanks - 1) * transfer_ns(m));
  // Each rank sends 1 message die-to-die, 2 inside its node, 4 to the other node.
  EXPECT_EQ(r["bytes_by_tier"]["die-to-die"], kRanks * 1 * 1024);
  EXPECT_EQ(r["bytes_by_tier"]["intra-node"], kRanks * 2 * 1024);
  EXPECT_EQ(r["bytes_by_tier"]["inter-node"], kRanks * 4 * 1024);
  EXPECT_EQ(r["flows"], kRanks * (kRanks - 1));
  const double algbw = 8192.0 / r["time_ns"].get<double>();  // bytes per ns = GB/s
  EXPECT_NEAR(r["algbw_gbytes_per_s"].get<double>(), algbw, 1e-9);
  EXPECT_NEAR(r["busbw_gbytes_per_s"].get<double>(), algbw * (kRanks - 1) / kRanks, 1e-9);
}

TEST_F(Netbench, TapaIsOneHalfExchangePerLevel) {
  // Three levels of 2: each phase sends half of the rank's 8192 bytes to its one peer.
  const nlohmann::json r = row("tapa", 8192);
  EXPECT_EQ(r["time_ns"].get<double>(), 3 * transfer_ns(4096));
  for (const char* tier : {"die-to-die", "intra-node", "inter-node"})
    EXPECT_EQ(r["bytes_by_tier"][tier], kRanks * 4096) << tier;
  EXPECT_EQ(r["flows"], 3 * kRanks);
  // Fewer, larger messages: TAPA beats flat's 7 rounds here.
  EXPECT_LT(r["time_ns"].get<double>(), row("flat", 8192)["time_ns"].get<double>());
}

TEST_F(Netbench, SizesDoubleFromMinToMax) {
  const fs::path json = dir_ / "sweep.json";
  const ChildResult r = run_cocodiff(
      {"netbench", "uniform", "--min-bytes", "1K", "--max-bytes", "16K", "--json", json.string()},
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_text(json));
  ASSERT_EQ(j["rows"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const double bytes = 1024.0 * static_cast<double>(1 << i);
    EXPECT_EQ(j["rows"][i]["bytes"].get<double>(), bytes);
    EXPECT_EQ(j["rows"][i]["time_ns"].get<double>(), (kRanks - 1) * transfer_ns(bytes / kRanks));
  }
}

TEST_F(Netbench, BadSizesAreAUserError) {
  const ChildResult r =
      run_cocodiff({"netbench", "uniform", "--min-bytes", "64K", "--max-bytes", "1K"}, dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--min-bytes <= --max-bytes"), std::string::npos) << r.err;
}

TEST_F(Netbench, TopoListsTiersLinksRoutesAndDevice) {
  const ChildResult r = run_cocodiff({"topo", "uniform"}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* piece :
       {"8 = tile x2 [die-to-die] * gpu x2 [intra-node] * node x2 [inter-node]", "link classes",
        "nic-attach", "10.0 GB/s", "0 -> 1", "0 -> 4", "n0.gpu0.tile0 -nic-attach-> n0.nic0",
        "device unit device (roofline)", "launch overhead"})
    EXPECT_NE(r.out.find(piece), std::string::npos) << piece << "\n" << r.out;
  // Aurora: 12 tiles per node over MDFI and Xe Link, 8 NICs.
  const ChildResult a = run_cocodiff({"topo", "aurora"}, dir_);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("tile x2 [die-to-die] * gpu x6 [intra-node]"), std::string::npos) << a.out;
}

// nccl-tests' interface: -b/-e/-f, the other collectives, --nodes and the "# Avg bus bandwidth"
// line. sendrecv on `uniform` is a ring shift in which every rank's NIC carries one message each
// way: m bytes take alpha + m / 10 GB/s, and busbw = algbw.
TEST_F(Netbench, NcclTestsFlagsOpsAndSummary) {
  const fs::path json = dir_ / "sr.json";
  const ChildResult r = run_cocodiff({"netbench", "uniform", "--op", "sendrecv", "-b", "1K", "-e",
                                      "64K", "-f", "8", "--workers", "1", "--json", json.string()},
                                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(json));
  ASSERT_EQ(j["rows"].size(), 3u);  // 1K, 8K, 64K
  double sum = 0;
  for (size_t i = 0; i < 3; ++i) {
    const double bytes = 1024.0 * std::pow(8.0, static_cast<double>(i));
    const nlohmann::json& row = j["rows"][i];
    EXPECT_EQ(row["bytes"].get<double>(), bytes);
    EXPECT_EQ(row["time_ns"].get<double>(), transfer_ns(bytes));
    EXPECT_DOUBLE_EQ(row["busbw_gbytes_per_s"].get<double>(),
                     row["algbw_gbytes_per_s"].get<double>());
    sum += row["busbw_gbytes_per_s"].get<double>();
  }
  EXPECT_NEAR(j["avg_busbw_gbytes_per_s"].get<double>(), sum / 3, 1e-9);
  EXPECT_NE(r.out.find("# Avg bus bandwidth    : "), std::string::npos) << r.out;

  for (const char* op : {"all_gather", "all_reduce"}) {
    const ChildResult c = run_cocodiff(
        {"netbench", "uniform", "--op", op, "-b", "64K", "-e", "64K", "--nodes", "1"}, dir_);
    EXPECT_EQ(c.exit_code, 0) << op << c.err;
    EXPECT_NE(c.out.find("1 node(s), 4 ranks"), std::string::npos) << op << c.out;
    EXPECT_NE(c.out.find("# Avg bus bandwidth"), std::string::npos) << op << c.out;
  }
  const ChildResult bad =
      run_cocodiff({"netbench", "uniform", "--op", "all_gather", "--algo", "tapa"}, dir_);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--algo tapa is an all-to-all algorithm"), std::string::npos) << bad.err;
}

// reduce_scatter is a ring: p-1 steps, each rank sending one block of bytes/p to its neighbour
// (a ring shift, which nothing on `uniform` contends), and busbw = algbw x (p-1)/p.
TEST_F(Netbench, ReduceScatterIsARingOfPMinusOneBlockShifts) {
  const fs::path json = dir_ / "rs.json";
  const ChildResult r = run_cocodiff({"netbench", "uniform", "--op", "reduce_scatter", "-b", "8K",
                                      "-e", "64K", "-f", "8", "--json", json.string()},
                                     dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_text(json));
  ASSERT_EQ(j["rows"].size(), 2u);  // 8K, 64K
  for (size_t i = 0; i < 2; ++i) {
    const double bytes = 8192.0 * std::pow(8.0, static_cast<double>(i));
    const nlohmann::json& row = j["rows"][i];
    EXPECT_EQ(row["bytes"].get<double>(), bytes);
    EXPECT_EQ(row["count_per_peer"].get<double>(), bytes / kRanks / 2);
    EXPECT_EQ(row["time_ns"].get<double>(), (kRanks - 1) * transfer_ns(bytes / kRanks));
    EXPECT_EQ(row["flows"], kRanks * (kRanks - 1));
    const double algbw = bytes / row["time_ns"].get<double>();
    EXPECT_NEAR(row["algbw_gbytes_per_s"].get<double>(), algbw, 1e-9);
    EXPECT_NEAR(row["busbw_gbytes_per_s"].get<double>(), algbw * (kRanks - 1) / kRanks, 1e-9);
  }
  EXPECT_NE(r.out.find("busbw = algbw x 0.875"), std::string::npos) << r.out;
}

// The table is nccl-tests' own: a parser of its format (rows of size, count, type, redop, root,
// then time, algbw, busbw, #wrong out of place and in place; "#  Rank" header lines) reads every
// row with the JSON's times, and `cocodiff calibrate` reads the printed output as nccl-tests
// output. nccl-tests' flags: -g (ranks, as nodes), -n and -w (iterations: virtual time repeats,
// so the mean is one call's time), -i (a step in bytes), -c (accepted).
TEST_F(Netbench, OutputIsReadByAnNcclTestsParser) {
  const fs::path json = dir_ / "a2a.json";
  const ChildResult r =
      run_cocodiff({"netbench", "uniform", "-g", "8", "-b", "8K", "-e", "24K", "-i", "8K", "-n",
                    "3", "-w", "2", "-c", "1", "--json", json.string()},
                   dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(read_text(json));
  ASSERT_EQ(j["rows"].size(), 3u);  // 8K, 16K, 24K
  struct Parsed {
    long long size, count;
    std::string type, redop;
    int root;
    double time[2], algbw[2], busbw[2];
    std::string wrong[2];
  };
  std::vector<Parsed> rows;
  int ranks = 0;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("#  Rank", 0) == 0) ++ranks;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream w(line);
    Parsed p;
    w >> p.size >> p.count >> p.type >> p.redop >> p.root;
    for (int k = 0; k < 2; ++k) w >> p.time[k] >> p.algbw[k] >> p.busbw[k] >> p.wrong[k];
    ASSERT_FALSE(w.fail()) << line;
    std::string extra;
    EXPECT_FALSE(w >> extra) << "more than 13 columns: " << line;
    rows.push_back(p);
  }
  EXPECT_EQ(ranks, kRanks);
  ASSERT_EQ(rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& row = j["rows"][i];
    EXPECT_EQ(rows[i].size, 8192 * static_cast<long long>(i + 1));
    EXPECT_EQ(rows[i].size, row["bytes"].get<long long>());
    EXPECT_EQ(rows[i].count, rows[i].size / 2);  // bfloat16 elements
    EXPECT_EQ(rows[i].type, "bfloat16");
    EXPECT_EQ(rows[i].redop, "none");
    EXPECT_EQ(rows[i].root, -1);
    // Three timed calls back to back, each the closed form of one.
    EXPECT_EQ(row["time_ns"].get<double>(),
              (kRanks - 1) * transfer_ns(static_cast<double>(rows[i].size) / kRanks));
    EXPECT_NEAR(rows[i].time[0], row["time_ns"].get<double>() / 1e3, 0.005);
    EXPECT_NEAR(rows[i].busbw[0], row["busbw_gbytes_per_s"].get<double>(), 0.005);
    EXPECT_EQ(rows[i].time[1], rows[i].time[0]);
    EXPECT_EQ(rows[i].wrong[0], "N/A");
  }
  EXPECT_NE(r.out.find("warmup iters: 2 iters: 3"), std::string::npos) << r.out;

  // calibrate takes the printed output as nccl-tests output (a file named after the test).
  std::ofstream(dir_ / "alltoall_perf.txt") << r.out;
  const ChildResult c =
      run_cocodiff({"calibrate", (dir_ / "alltoall_perf.txt").string(), "--cluster", "uniform",
                    "--out", (dir_ / "fit.toml").string()},
                   dir_);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  for (const Parsed& p : rows) {
    char t[32];
    std::snprintf(t, sizeof t, "%.2f", p.time[0]);
    EXPECT_TRUE(std::regex_search(
        c.out, std::regex("all_to_all +8 +2 +" + std::to_string(p.size) + " +- +" + t + " +" + t)))
        << t << "\n"
        << c.out;
  }
  // -g must be whole nodes of the cluster (4 ranks each).
  const ChildResult g = run_cocodiff({"netbench", "uniform", "-g", "6"}, dir_);
  EXPECT_EQ(g.exit_code, 2);
  EXPECT_NE(g.err.find("-g 6: expected a multiple of the cluster's 4 ranks per node"),
            std::string::npos)
      << g.err;
  // all_reduce says what it runs.
  const ChildResult ar =
      run_cocodiff({"netbench", "uniform", "--op", "all_reduce", "-b", "1K", "-e", "1K"}, dir_);
  EXPECT_NE(ar.out.find("# all_reduce runs one flat ring over all 8 ranks"), std::string::npos)
      << ar.out;
}

// netbench's defaults are what calibrate says its predictions are (the library's schedule, and
// -w 1 -n 2 on a device with a host); it takes nccl-tests' -d, -G and op names, ends as
// nccl-tests does, and refuses sweeps and counts that would run for hours, naming the flag.
TEST_F(Netbench, DefaultsFlagsAndBoundsAreNcclTestsAndCalibrates) {
  const std::vector<std::string> size = {"-b", "1M", "-e", "1M"};
  auto bench = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"netbench", "hgx-h100", "--nodes", "2"};
    a.insert(a.end(), size.begin(), size.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return run_cocodiff(a, dir_);
  };
  const ChildResult plain = bench({});
  const ChildResult as_calibrate = bench({"--rounds", "library", "-w", "1", "-n", "2"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(as_calibrate.exit_code, 0) << as_calibrate.err;
  auto table_row = [](const std::string& out) {
    const size_t at = out.find("\n     1048576");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at + 1) - at);
  };
  EXPECT_FALSE(table_row(plain.out).empty()) << plain.out;
  EXPECT_EQ(table_row(plain.out), table_row(as_calibrate.out));
  EXPECT_NE(plain.out.find("warmup iters: 1 iters: 2"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("# Collective test concluded: alltoall_perf"), std::string::npos)
      << plain.out;
  const ChildResult named = bench({"--op", "alltoall", "-d", "float", "-G", "10"});
  EXPECT_EQ(named.exit_code, 0) << named.err;
  EXPECT_NE(named.out.find("    float "), std::string::npos) << named.out;
  for (const auto& [args, piece] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"netbench", "uniform", "-i", "1", "-b", "1", "-e", "1G"}, "rows a sweep"},
           {{"netbench", "uniform", "-w", "100000000"}, "--warmup-iters"},
           {{"netbench", "uniform", "-e", "-1"}, "-b and -e: at most"},
           {{"netbench", "uniform", "-d", "fp7"}, "-d fp7"}}) {
    const ChildResult r = run_cocodiff(args, dir_);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(piece), std::string::npos) << piece << ": " << r.err;
  }
}

}  // namespace
}  // namespace cocodiff::test
