// The memory estimate and emulator.memory_limit: a run whose estimate exceeds the limit exits 2
// before allocating, naming the estimate, its biggest part and the key, with no output; a
// generous limit runs; `validate` prints the estimate; the estimate bounds the measured peak
// RSS of a real-math run within a stated factor; a failed allocation names what was built.
// Also the fault kinds of --inject-fault (kind=hang is the MPI watchdog's test hook).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "dit/parallel/strategies.hpp"
#include "runner/memory_estimate.hpp"
#include "runner/run_plan.hpp"
#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

const fs::path kData = COCODIFF_TEST_DATA;
const std::string kGood = (kData / "good.toml").string();

class MemoryLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cocodiff_memory_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    out_ = dir_ / "out";
  }
  void TearDown() override {
    ::unsetenv("COCODIFF_TEST_BAD_ALLOC");
    if (!HasFailure()) fs::remove_all(dir_);
  }
  ChildResult run(const std::vector<std::string>& args) { return run_cocodiff(args, dir_ / "log"); }

  fs::path dir_, out_;
};

// A real-math run big enough that weights and activations outweigh the program itself:
// flux1-tiny on 4 ranks, 32 x 32 = 1024 image tokens, one step.
const std::vector<std::string> kRealSets = {"run.math=real", "run.resolution=512",
                                            "emulator.trace=false"};

std::vector<std::string> with_sets(std::vector<std::string> args,
                                   const std::vector<std::string>& sets) {
  for (const std::string& s : sets) {
    args.emplace_back("--set");
    args.push_back(s);
  }
  return args;
}

TEST_F(MemoryLimit, TinyLimitExitsTwoBeforeAllocatingWithNoOutput) {
  for (const char* cmd : {"run", "validate"}) {
    std::vector<std::string> args = {cmd, kGood, "--set", "emulator.memory_limit=1KiB"};
    if (std::string(cmd) == "run") args.insert(args.end(), {"--out", out_.string(), "-q"});
    const ChildResult r = run(args);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
    EXPECT_EQ(r.err.rfind("cocodiff: error: the run needs an estimated ", 0), 0u) << r.err;
    for (const char* piece :
         {"more than emulator.memory_limit = 1.00 KiB", "--set emulator.memory_limit",
          "the biggest part is ", "set emulator.trace = false (the trace takes "})
      EXPECT_NE(r.err.find(piece), std::string::npos) << piece << " in " << r.err;
    EXPECT_EQ(r.out, "") << cmd;
    EXPECT_FALSE(fs::exists(out_)) << "an output directory was created";
  }
  // Before allocating: with the weights' allocation made to fail, the limit still speaks first.
  ::setenv("COCODIFF_TEST_BAD_ALLOC", "weights", 1);
  const ChildResult r =
      run(with_sets({"run", kGood, "--out", out_.string(), "-q"},
                    {"run.math=real", "run.resolution=768", "emulator.memory_limit=20MiB"}));
  ::unsetenv("COCODIFF_TEST_BAD_ALLOC");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the biggest part is activations"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("out of memory while building"), std::string::npos) << r.err;
}

TEST_F(MemoryLimit, GenerousOrNoLimitRuns) {
  for (const char* limit :
       {"emulator.memory_limit=64GiB", "emulator.memory_limit=0",
        "emulator.memory_limit=1000000000000", "emulator.memory_limit=available"}) {
    const ChildResult r = run({"run", kGood, "--out", out_.string(), "-q", "--set", limit});
    EXPECT_EQ(r.exit_code, 0) << limit << ": " << r.err;
    EXPECT_TRUE(fs::exists(out_ / "report.json")) << limit;
  }
}

TEST_F(MemoryLimit, BadLimitValuesNameTheKey) {
  for (const char* bad : {"emulator.memory_limit=lots", "emulator.memory_limit=-5",
                          "emulator.memory_limit=8XB", "emulator.memory_limit=1.5"}) {
    const ChildResult r = run({"validate", kGood, "--set", bad});
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_NE(r.err.find("key 'emulator.memory_limit'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("a size in bytes"), std::string::npos) << r.err;
  }
}

TEST_F(MemoryLimit, ValidatePrintsTheEstimate) {
  const ChildResult r = run({"validate", kGood, "--set", "run.math=real"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("\nmemory     ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  for (const char* piece :
       {"estimated peak, this process", "weights ", "activations ", "fiber stacks ", "program "})
    EXPECT_NE(line.find(piece), std::string::npos) << piece << " in " << line;
  // The run header carries the same line.
  const ChildResult run_r = run({"run", kGood, "--out", out_.string(), "--set", "run.math=real"});
  ASSERT_EQ(run_r.exit_code, 0) << run_r.err;
  EXPECT_NE(run_r.out.find(line), std::string::npos) << run_r.out;
}

// Each strategy declares what a tile of it keeps, and the estimate counts that, per tile, after
// the activations: V-Major's caches for a composition with v_major, none for flat, and a
// user strategy's own declared part (estimate_memory names no strategy).
TEST(MemoryEstimate, StrategiesDeclareTheirOwnParts) {
  const auto part = [](const apps::MemoryEstimate& e, const std::string& name) {
    for (const apps::MemoryPart& p : e.parts)
      if (p.name == name) return p.bytes;
    return std::int64_t{-1};
  };
  const apps::RunPlan flat =
      apps::resolve_run_plan(kGood, {"run.math=real", "run.strategy=\"flat\""});
  const apps::RunPlan vm = apps::resolve_run_plan(
      kGood, {"run.math=real", "run.strategy=\"tapa+v_major\"", "v_major.tiers=[\"die-to-die\"]"});
  EXPECT_EQ(part(apps::estimate_memory(flat, "emulator"), "v_major caches"), -1);
  EXPECT_GT(part(apps::estimate_memory(vm, "emulator"), "v_major caches"), 0);

  auto mine = std::make_shared<dit::StrategyRegistry>();
  mine->add(
      "mine",
      [&](Communicator& comm, const dit::ModelConfig& cfg, const dit::StrategyOptions& o) {
        return dit::make_attention_strategy("flat", comm, cfg, o);
      },
      false,
      [](const dit::StrategyMemoryQuery& q) {
        return std::vector<dit::StrategyMemoryPart>{
            {"mine caches", 1000.0 * q.model->attention_layers()}};
      });
  Config cfg = Config::load(kGood);
  cfg.set("run.math=real");
  cfg.set("run.strategy=\"mine\"");
  const apps::RunPlan plan = apps::resolve_run_plan(std::move(cfg), mine);
  const apps::MemoryEstimate e = apps::estimate_memory(plan, "emulator");
  EXPECT_EQ(part(e, "mine caches"), plan.ranks() * 1000 * plan.model.attention_layers());
  ASSERT_GE(e.parts.size(), 5u);
  EXPECT_EQ(e.parts[3].name, "activations");
  EXPECT_EQ(e.parts[4].name, "mine caches");
  EXPECT_NE(e.summary().find("mine caches"), std::string::npos) << e.summary();
  // Phantom runs keep no tensors: no strategy part.
  Config skip = Config::load(kGood);
  skip.set("run.strategy=\"mine\"");
  EXPECT_EQ(part(apps::estimate_memory(apps::resolve_run_plan(std::move(skip), mine), "emulator"),
                 "mine caches"),
            -1);
}

TEST(MemoryEstimate, PartsFollowTheModel) {
  const apps::RunPlan real = apps::resolve_run_plan(kGood, {"run.math=real"});
  const apps::RunPlan skip = apps::resolve_run_plan(kGood, {});
  const apps::MemoryEstimate r = apps::estimate_memory(real, "emulator");
  const apps::MemoryEstimate s = apps::estimate_memory(skip, "emulator");
  const auto part = [](const apps::MemoryEstimate& e, const std::string& name) {
    for (const apps::MemoryPart& p : e.parts)
      if (p.name == name) return p.bytes;
    ADD_FAILURE() << "no part " << name;
    return std::int64_t{-1};
  };
  ASSERT_EQ(r.parts.front().name, "weights");
  // Real math packs the weights again for the GEMM kernel; phantom math has no math threads.
  EXPECT_EQ(part(r, "packed weights"), r.parts.front().bytes);
  EXPECT_EQ(part(s, "math threads"), 0);
  EXPECT_GT(r.parts.front().bytes, 0);
  EXPECT_EQ(s.parts.front().bytes, 0) << "phantom weights hold shapes only";
  EXPECT_GT(r.total_bytes(), s.total_bytes());
  // Activations grow with the image; V-Major adds caches only with a selective tier in use.
  const apps::RunPlan big = apps::resolve_run_plan(kGood, {"run.math=real", "run.resolution=256"});
  EXPECT_GT(part(apps::estimate_memory(big, "emulator"), "activations"), part(r, "activations"));
  // The MPI estimate counts one copy of the weights per process on the host.
  const apps::MemoryEstimate m = apps::estimate_memory(real, "mpi");
  EXPECT_EQ(m.parts.front().bytes, real.ranks() * r.parts.front().bytes);
  EXPECT_EQ(apps::human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(apps::human_bytes(100), "100 B");
}

// The estimate is an upper bound on the measured peak RSS, at most 2.5x of it (bench/README.md,
// "Memory estimate", for the figures on its configs).
TEST_F(MemoryLimit, EstimateBoundsMeasuredPeakRss) {
  const apps::RunPlan plan = apps::resolve_run_plan(kGood, kRealSets);
  const std::int64_t estimate = apps::estimate_memory(plan, "emulator").total_bytes();
  // The run prints its own peak (VmHWM: getrusage of a child would count this test's memory,
  // copied at fork) beside the estimate.
  const ChildResult r = run(with_sets({"run", kGood, "--out", out_.string()}, kRealSets));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string key = "memory: peak resident ";
  const size_t at = r.out.find(key);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_NE(line.find(", estimated " + apps::human_bytes(estimate)), std::string::npos) << line;
  // "101 MiB" or "98.5 MiB": the run is far above 1 MiB, far below 1 GiB.
  char unit[8] = {};
  double value = 0;
  ASSERT_EQ(std::sscanf(line.c_str() + key.size(), "%lf %7s", &value, unit), 2) << line;
  ASSERT_STREQ(unit, "MiB,") << line;
  const double rss = value * 1024 * 1024;
  // Sanitized builds (time scale > 1) add ASan's shadow memory and allocator to the resident
  // set, which no estimate of the program's own memory should include.
  if (COCODIFF_TEST_TIME_SCALE > 1) GTEST_SKIP() << "sanitized build: " << line;
  EXPECT_GE(static_cast<double>(estimate), rss) << line;
  EXPECT_LE(static_cast<double>(estimate), 2.5 * rss) << line;
}

// A phantom run at a huge resolution still builds its RoPE tables' token positions (their
// shape is the table's): the estimate counts them, so it bounds the measured peak there too.
// flux1-tiny at 32768 px: 2048 x 2048 = 4.2 million image tokens, 1 million per tile.
TEST_F(MemoryLimit, PhantomEstimateBoundsMeasuredPeakRssAtAHugeResolution) {
  const std::vector<std::string> sets = {"run.resolution=32768", "emulator.trace=false"};
  const apps::RunPlan plan = apps::resolve_run_plan(kGood, sets);
  ASSERT_EQ(plan.math, "skip");
  const std::int64_t estimate = apps::estimate_memory(plan, "emulator").total_bytes();
  const ChildResult r = run(with_sets({"run", kGood, "--out", out_.string()}, sets));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string key = "memory: peak resident ";
  const size_t at = r.out.find(key);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  char unit[8] = {};
  double value = 0;
  ASSERT_EQ(std::sscanf(line.c_str() + key.size(), "%lf %7s", &value, unit), 2) << line;
  ASSERT_STREQ(unit, "MiB,") << line;
  if (COCODIFF_TEST_TIME_SCALE > 1) GTEST_SKIP() << "sanitized build: " << line;
  const double rss = value * 1024 * 1024;
  EXPECT_GE(static_cast<double>(estimate), 0.9 * rss) << line;
  EXPECT_LE(static_cast<double>(estimate), 2.5 * rss) << line;
  // Over the limit, the hint does not suggest run.math = "skip" to a run that already skips.
  const ChildResult over = run(
      {"validate", kGood, "--set", "run.resolution=32768", "--set", "emulator.memory_limit=20MiB"});
  EXPECT_EQ(over.exit_code, 2) << over.err;
  EXPECT_NE(over.err.find("the biggest part is token positions"), std::string::npos) << over.err;
  EXPECT_EQ(over.err.find("run.math"), std::string::npos) << over.err;
  const ChildResult real =
      run({"validate", kGood, "--set", "run.math=real", "--set", "emulator.memory_limit=1KiB"});
  EXPECT_NE(real.err.find("use run.math = \"skip\""), std::string::npos) << real.err;
}

// The peak a run prints beside its estimate, in bytes; -1 when the line is missing.
double printed_peak(const std::string& out, std::string& line) {
  const std::string key = "memory: peak resident ";
  const size_t at = out.find(key);
  if (at == std::string::npos) return -1;
  line = out.substr(at, out.find('\n', at) - at);
  char unit[8] = {};
  double value = 0;
  if (std::sscanf(line.c_str() + key.size(), "%lf %7s", &value, unit) != 2) return -1;
  const std::string u = unit;
  return value * (u.rfind("GiB", 0) == 0 ? 1 << 30 : u.rfind("MiB", 0) == 0 ? 1 << 20 : 1 << 10);
}

// Over the configs the benchmarks run (the quickstart's real math with and without the trace,
// on 1 and 4 workers; flux1-tiny on 24 tiles; phantom FLUX.1-dev on 96 tiles; one tile alone),
// shortened to a step or two, the estimate is at least the measured peak and at most 2.5x it.
TEST_F(MemoryLimit, EstimateIsAnUpperBoundOverTheBenchConfigs) {
  if (COCODIFF_TEST_TIME_SCALE > 1) GTEST_SKIP() << "sanitized build: ASan's memory counts";
  const std::string configs = std::string(COCODIFF_SOURCE_DIR) + "/configs/";
  const std::string quick = configs + "quickstart.toml", tiny = configs + "flux1-tiny-24tiles.toml";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {quick, {"run.steps=2", "emulator.workers=1"}},
      {quick, {"run.steps=2", "emulator.workers=4", "emulator.trace=false"}},
      {tiny, {"run.steps=1", "emulator.workers=2"}},
      {tiny,
       {"model.preset=flux1-dev", "run.math=skip", "run.resolution=1024", "cluster.nodes=8",
        "ulysses.uneven_heads=true", "run.steps=1", "emulator.trace_limit=200000"}},
      {quick,
       {"run.steps=2", "emulator.workers=1", "cluster.nodes=1", "cluster.topology.sizes=[1,1]",
        "cluster.nic.rank_nic=[0]", "run.strategy=serial"}},
      // The README's phantom command (a trace of a million events).
      {quick, {"run.math=skip", "model.preset=flux1-dev", "run.resolution=1024", "run.steps=2"}},
  };
  for (const auto& [config, sets] : cases) {
    std::string what = config.substr(config.rfind('/') + 1);
    for (const std::string& s : sets) what += " " + s;
    const ChildResult r = run(with_sets({"run", config, "--out", out_.string()}, sets));
    ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.err;
    std::string line;
    const double rss = printed_peak(r.out, line);
    ASSERT_GT(rss, 0) << what << "\n" << r.out;
    const apps::RunPlan plan = apps::resolve_run_plan(config, sets);
    const double estimate =
        static_cast<double>(apps::estimate_memory(plan, "emulator").total_bytes());
    EXPECT_GE(estimate, rss) << what << ": " << line;
    EXPECT_LE(estimate, 2.5 * rss) << what << ": " << line;
    fs::remove_all(out_);
  }
}

TEST_F(MemoryLimit, FailedAllocationNamesWhatWasBuilt) {
  struct Case {
    const char* phase;
    const char* names;
  };
  for (const Case c : {Case{"weights", "out of memory while building the weights of flux1-tiny"},
                       Case{"tiles", "out of memory while building the activations of rank "}}) {
    ::setenv("COCODIFF_TEST_BAD_ALLOC", c.phase, 1);
    const ChildResult r = run({"run", kGood, "--out", out_.string(), "-q"});
    ::unsetenv("COCODIFF_TEST_BAD_ALLOC");
    EXPECT_EQ(r.exit_code, 2) << c.phase << ": " << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("estimated peak"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out_));
  }
}

// --inject-fault kind=hang stops a rank for the MPI watchdog to find; the emulator, which has
// no wall-clock watchdog, refuses it rather than hang; an unknown kind is named.
using FaultKinds = MemoryLimit;

TEST_F(FaultKinds, HangIsForTheMpiBackendOnly) {
  ChildResult r = run(
      {"run", kGood, "--out", out_.string(), "-q", "--inject-fault", "rank=1,step=1,kind=hang"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--inject-fault kind=hang: only with --backend mpi"), std::string::npos)
      << r.err;
  r = run({"run", kGood, "--out", out_.string(), "-q", "--inject-fault", "rank=1,step=1,kind=x"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("kind must be throw or hang, found 'x'"), std::string::npos) << r.err;
  r = run(
      {"run", kGood, "--out", out_.string(), "-q", "--inject-fault", "rank=1,step=1,kind=throw"});
  // The default kind: the run fails with exit 3 and writes only its failed report.
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("injected fault at step 1"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(out_ / "report.json"));
  EXPECT_FALSE(fs::exists(out_ / "image.png"));
}

// The engine's state grows with the square of the tile count (every pair of the widest
// collective): the estimate bounds the measured peak at 512 and 1,024 tiles too (it once gave
// 163 MiB where 1,024 tiles peaked at 381 MiB).
TEST_F(MemoryLimit, EstimateBoundsThePeakAtThousandsOfTiles) {
  if (COCODIFF_TEST_TIME_SCALE > 1) GTEST_SKIP() << "sanitized build";
  for (const int nodes : {128, 256}) {
    const std::vector<std::string> sets = {
        "model.preset=flux1-dev", "cluster.nodes=" + std::to_string(nodes),
        "run.resolution=2048",    "ulysses.uneven_heads=true",
        "emulator.trace=false",   "emulator.workers=1"};
    const apps::RunPlan plan = apps::resolve_run_plan(kGood, sets);
    const std::int64_t estimate = apps::estimate_memory(plan, "emulator").total_bytes();
    const ChildResult r = run(with_sets({"run", kGood, "--out", out_.string(), "--force"}, sets));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string line;
    const double rss = printed_peak(r.out, line);
    ASSERT_GT(rss, 0) << r.out;
    EXPECT_GE(static_cast<double>(estimate), rss) << plan.ranks() << " tiles: " << line;
    EXPECT_LE(static_cast<double>(estimate), 2.5 * rss) << plan.ranks() << " tiles: " << line;
  }
}

}  // namespace
}  // namespace cocodiff::test
