// `cocodiff tune`: the time it predicts for a recommendation is what `cocodiff run` of the
// printed command reports (several models, clusters, CFG and text sharding in the search);
// pruning and stopping never drop the best point or change the front against the exhaustive
// search; bad input ends with exit 2 and no output.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "dit/parallel/strategies.hpp"
#include "tests/apps/subprocess.hpp"
#include "tune/tune.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;
using apps::TuneOptions;
using apps::TunePoint;
using apps::TuneResult;

fs::path scratch(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("cocodiff_tune_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The words of a printed command line (single-quoted words as the shell reads them).
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string w;
  bool quoted = false, any = false;
  for (char c : line) {
    if (c == '\'') {
      quoted = !quoted;
      any = true;
    } else if (c == ' ' && !quoted) {
      if (any) words.push_back(w);
      w.clear();
      any = false;
    } else {
      w += c;
      any = true;
    }
  }
  if (any) words.push_back(w);
  return words;
}

// Runs a printed `cocodiff run ...` command; returns its report's virtual time.
double run_printed(const std::string& command, const fs::path& dir) {
  std::vector<std::string> args = shell_words(command);
  EXPECT_GE(args.size(), 3u);
  EXPECT_EQ(args[0], "cocodiff");
  args.erase(args.begin());  // the binary under test runs the rest
  args.insert(args.end(), {"--out", (dir / "run").string(), "-q"});
  const ChildResult r = run_cocodiff(args, dir);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.err;
  std::ifstream in(dir / "run" / "report.json");
  return nlohmann::json::parse(in)["virtual_time_s"].get<double>();
}

const std::string kGood = std::string(COCODIFF_TEST_DATA) + "/good.toml";

TuneOptions small_search(std::vector<std::string> sets, std::vector<int> nodes,
                         std::vector<int> gpus) {
  TuneOptions o;
  o.config = kGood;
  o.sets = std::move(sets);
  o.nodes = std::move(nodes);
  o.gpus_per_node = std::move(gpus);
  o.jobs = 2;
  return o;
}

// The best point and the fewest-GPU point of the front, on three models (guidance-distilled
// FLUX, batch-CFG SD3.5 with CFG-parallel and text sharding in the search, true-CFG Qwen-Image)
// and three clusters: `cocodiff run` of the printed command reports exactly the predicted time.
TEST(Tune, PredictedTimeIsWhatTheRunCommandReports) {
  const fs::path dir = scratch("reproduce");
  struct Case {
    std::vector<std::string> sets;
    std::vector<int> nodes, gpus;
  };
  const std::vector<Case> cases = {
      {{"cluster.preset=aurora", "run.steps=2"}, {1, 2}, {1, 2}},
      {{"model.preset=sd35-tiny", "cluster.preset=hgx-h100", "run.steps=2"}, {1, 2}, {2, 4}},
      {{"model.preset=qwen-image-tiny", "cluster.preset=hgx-h200", "run.steps=2",
        "model.text_tokens=8"},
       {1},
       {2, 8}},
  };
  std::set<std::string> strategies;
  bool cfg_parallel = false, text_sharded = false;
  for (const Case& c : cases) {
    const TuneResult r = apps::tune(small_search(c.sets, c.nodes, c.gpus));
    ASSERT_FALSE(r.ranking.empty());
    for (const TunePoint& p : r.points) {
      cfg_parallel = cfg_parallel || p.cfg > 1;
      text_sharded = text_sharded || p.shard_text;
    }
    const TuneOptions o = small_search(c.sets, c.nodes, c.gpus);
    for (size_t i : {r.ranking.front(), r.pareto.front()}) {
      const TunePoint& p = r.points[i];
      strategies.insert(p.strategy);
      EXPECT_EQ(run_printed(apps::run_command(o, p), dir), p.time_s)
          << r.model << " on " << r.cluster << ": " << p.shape() << " " << p.describe();
    }
  }
  EXPECT_TRUE(cfg_parallel) << "no CFG-parallel point searched";
  EXPECT_TRUE(text_sharded) << "no text-sharded point searched";
  fs::remove_all(dir);
}

// A PipeFusion point's stage count, as its search reports it (tune.json's pipefusion_degree).
int stages(const TunePoint& p) {
  for (const auto& [key, value] : p.report)
    if (key == "pipefusion_degree") return static_cast<int>(value);
  return 0;
}

// PipeFusion's stage counts are searched for FLUX.1 (every step whole: exact), with and
// without CFG-parallel where the model has it, and a point's printed command reports its time.
TEST(Tune, PipeFusionStagesAreSearchedAndTheirCommandsReproduceThem) {
  const fs::path dir = scratch("pipefusion");
  TuneOptions o = small_search({"cluster.preset=aurora", "run.steps=2"}, {1}, {2});
  o.prune = false;  // every point to its end
  const TuneResult r = apps::tune(o);
  std::set<int> degrees;
  const TunePoint* timed = nullptr;
  for (const TunePoint& p : r.points) {
    if (p.strategy != "pipefusion") continue;
    EXPECT_EQ(p.status, TunePoint::Status::kRun) << p.describe();
    EXPECT_EQ(p.ulysses * stages(p) * p.cfg, p.ranks) << p.describe();
    degrees.insert(stages(p));
    if (timed == nullptr || stages(p) > stages(*timed)) timed = &p;
  }
  EXPECT_EQ(degrees, (std::set<int>{2, 4})) << "4 ranks, 4 blocks";  // flux1-tiny
  ASSERT_NE(timed, nullptr);
  EXPECT_EQ(run_printed(apps::run_command(o, *timed), dir), timed->time_s) << timed->describe();
  // The trained model has an unconditional pass: its halves run a pipeline each.
  o.sets = {"cluster.preset=aurora", "run.steps=2", "model.preset=flux1-fmnist",
            "run.resolution=28"};
  bool cfg_parallel = false;
  for (const TunePoint& p : apps::tune(o).points)
    cfg_parallel = cfg_parallel || (p.strategy == "pipefusion" && p.cfg == 2);
  EXPECT_TRUE(cfg_parallel);
  fs::remove_all(dir);
}

// A program's own strategy with a search (StrategyRegistry::add_search): tune explores its
// points beside the built-ins', prints them as the search describes them and times them as any
// other. This one runs flat Ulysses under its own name, so each of its points takes exactly the
// time of its shape's flat baseline.
TEST(Tune, AProgramsStrategySearchIsExploredBesideTheBuiltIns) {
  auto reg = std::make_shared<dit::StrategyRegistry>();
  reg->add("flat_again",
           [](Communicator& c, const dit::ModelConfig& m, const dit::StrategyOptions& opt) {
             return dit::make_attention_strategy("flat", c, m, opt);
           });
  const dit::StrategySearch search = [](const dit::SearchShape& s, const dit::SearchEmit& emit) {
    dit::SearchPoint p;
    p.strategy = "flat_again";
    p.ulysses = s.ranks;
    p.uneven_heads = s.model->heads % s.ranks != 0;
    p.detail = " (a program's)";
    p.wave = 0;
    p.report = {{"program_marker", 7}};
    emit(p);
  };
  EXPECT_THROW(reg->add_search("not_added", search), ConfigError);
  reg->add_search("flat_again", search);
  EXPECT_THROW(reg->add_search("flat_again", search), ConfigError);
  TuneOptions o = small_search({"cluster.preset=aurora", "run.steps=2"}, {1, 2}, {2});
  o.prune = false;
  o.host_range = false;
  o.strategies = reg;
  const TuneResult r = apps::tune(o);
  int mine = 0;
  for (const TunePoint& p : r.points) {
    if (p.strategy != "flat_again") continue;
    ++mine;
    ASSERT_EQ(p.status, TunePoint::Status::kRun) << p.error;
    EXPECT_EQ(p.describe().rfind("flat_again (a program's)", 0), 0u) << p.describe();
    const TunePoint* flat = r.flat_of(p);
    ASSERT_NE(flat, nullptr) << p.describe();
    EXPECT_EQ(p.time_s, flat->time_s) << p.shape();
  }
  EXPECT_EQ(mine, 2) << "one point on each of the two shapes";
  int marked = 0;
  const nlohmann::ordered_json j = apps::tune_json(o, r);
  for (const auto& e : j["ranking"])
    if (e.value("program_marker", 0) == 7) ++marked;
  EXPECT_EQ(marked, 2);
  // Without the program's strategies, the search is the built-ins' alone.
  o.strategies = nullptr;
  for (const TunePoint& p : apps::tune(o).points) EXPECT_NE(p.strategy, "flat_again");
}

// On a grid where the compute bound prunes (a model whose compute dominates) and slow runs are
// stopped, the search finds the exhaustive search's best point and front.
TEST(Tune, PruningNeverDropsTheBestPoint) {
  for (const char* objective : {"latency", "gpu-seconds"}) {
    TuneOptions o =
        small_search({"model.preset=flux1-dev", "model.double_blocks=2", "model.single_blocks=2",
                      "run.resolution=1024", "run.steps=6", "cluster.preset=aurora"},
                     {1, 2}, {1, 3});
    o.objective = objective;
    o.jobs = 1;  // what is stopped depends on which runs have finished: one at a time
    o.prune = false;
    const TuneResult all = apps::tune(o);
    ASSERT_EQ(all.count(TunePoint::Status::kRun), static_cast<int>(all.points.size()));
    o.prune = true;
    const TuneResult pruned = apps::tune(o);
    if (std::string(objective) == "latency") {
      EXPECT_GT(
          pruned.count(TunePoint::Status::kPruned) + pruned.count(TunePoint::Status::kStopped), 0)
          << "nothing pruned or stopped: the test shows nothing";
    }
    EXPECT_FALSE(pruned.bound_broken);
    ASSERT_FALSE(pruned.ranking.empty());
    const TunePoint& a = all.points[all.ranking.front()];
    const TunePoint& b = pruned.points[pruned.ranking.front()];
    EXPECT_EQ(apps::run_command(o, a), apps::run_command(o, b)) << objective;
    EXPECT_EQ(a.time_s, b.time_s) << objective;
    // The front is the exhaustive one, every point of it (a point is pruned or stopped only
    // when a point with no more GPUs is faster).
    std::vector<std::string> front_all, front_pruned;
    for (size_t i : all.pareto) front_all.push_back(apps::run_command(o, all.points[i]));
    for (size_t i : pruned.pareto) front_pruned.push_back(apps::run_command(o, pruned.points[i]));
    EXPECT_EQ(front_all, front_pruned) << objective;
    // The baseline is always timed: every point run has its speedup over flat on its GPUs.
    for (size_t i : pruned.ranking)
      EXPECT_NE(pruned.flat_of(pruned.points[i]), nullptr)
          << pruned.points[i].shape() << " " << pruned.points[i].describe();
    // Every point run has a time at least its bound (what makes pruning safe).
    for (const TunePoint& p : all.points) EXPECT_GE(p.max_compute_s, p.bound_s) << p.describe();
  }
}

// A host-bound FLUX.1-dev step on H200s (512^2) whose host is twice the preset's, with a host
// range [0.25, 1.5] of it: the best configurations are timed again with hosts of scale 0.5 and
// 3, faster and slower than the config's, and each
// time is what `cocodiff run` of the printed command with that device.host.scale reports.
// Without the range (or with --no-host-range) nothing more is run.
TEST(Tune, TheBestConfigurationsAreTimedWithTheFastestAndSlowestHostsMeasured) {
  const fs::path dir = scratch("hosts");
  const std::vector<std::string> sets = {
      "model.preset=flux1-dev",     "model.double_blocks=2", "model.single_blocks=2",
      "run.resolution=512",         "run.steps=1",           "cluster.preset=hgx-h200",
      "cluster.device.host.scale=2"};
  std::vector<std::string> ranged = sets;
  ranged.push_back("cluster.device.host.range=[0.25,1.5]");
  const TuneOptions o = small_search(ranged, {1}, {1, 2, 4});
  const TuneResult r = apps::tune(o);
  ASSERT_FALSE(r.ranking.empty());
  // The config's own host (scale 2) taken to the range's ends.
  EXPECT_DOUBLE_EQ(r.host_low, 0.5);
  EXPECT_DOUBLE_EQ(r.host_high, 3.0);
  ASSERT_TRUE(r.best_at_low && r.best_at_high);
  size_t timed = 0;
  for (size_t k = 0; k < r.ranking.size(); ++k) {
    const TunePoint& p = r.points[r.ranking[k]];
    EXPECT_EQ(p.host_range_s.has_value(),
              k < apps::kHostRangePoints ||
                  std::find(r.pareto.begin(), r.pareto.end(), r.ranking[k]) != r.pareto.end())
        << k;
    if (!p.host_range_s) continue;
    ++timed;
    EXPECT_LT(p.host_range_s->first, p.time_s) << p.describe();
    EXPECT_GT(p.host_range_s->second, p.time_s) << p.describe();
  }
  EXPECT_GE(timed, std::min<size_t>(apps::kHostRangePoints, r.ranking.size()));
  const TunePoint& best = r.points[r.ranking.front()];
  for (const auto& [scale, time] : {std::make_pair(0.5, best.host_range_s->first),
                                    std::make_pair(3.0, best.host_range_s->second)}) {
    const std::string command =
        apps::run_command(o, best) + " --set cluster.device.host.scale=" + std::to_string(scale);
    EXPECT_EQ(run_printed(command, dir), time) << command;
  }
  const std::string table = apps::tune_table(o, r);
  EXPECT_NE(table.find("hosts_s"), std::string::npos) << table;
  EXPECT_NE(table.find("(device.host.scale 0.50 and 3.00), " + std::to_string(timed) +
                       " configurations (the ten best and the front) rank "),
            std::string::npos)
      << table;
  const nlohmann::ordered_json j = apps::tune_json(o, r);
  EXPECT_EQ(j["host_range"]["scales"][0].get<double>(), 0.5);
  EXPECT_TRUE(j["ranking"][0].contains("time_per_image_s_host_range"));

  TuneOptions off = o;
  off.host_range = false;
  const TuneResult none = apps::tune(off);
  EXPECT_EQ(none.host_high, 0.0);
  for (const TunePoint& p : none.points) EXPECT_FALSE(p.host_range_s);
  // A cluster without a range (good.toml's uniform one) runs nothing more.
  const TuneResult plain = apps::tune(small_search({"run.steps=1"}, {1}, {1, 2}));
  EXPECT_EQ(plain.host_high, 0.0);
  for (const TunePoint& p : plain.points) EXPECT_FALSE(p.host_range_s);
  EXPECT_EQ(apps::tune_table(off, none).find("hosts_s"), std::string::npos);
  EXPECT_EQ(none.points[none.ranking.front()].time_s, best.time_s);
  fs::remove_all(dir);
}

class TuneCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch(::testing::UnitTest::GetInstance()->current_test_info()->name());
    out_ = dir_ / "out";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  ChildResult tune(std::vector<std::string> extra) {
    std::vector<std::string> args = {"tune", kGood, "--out", out_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cocodiff(args, dir_);
  }
  // Exit code 2, one error line naming every piece, and nothing written.
  void expect_refused(const ChildResult& r, const std::vector<std::string>& pieces) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("cocodiff: error: "), std::string::npos) << r.err;
    for (const std::string& p : pieces) EXPECT_NE(r.err.find(p), std::string::npos) << p << r.err;
    EXPECT_FALSE(fs::exists(out_)) << "tune wrote " << out_;
  }
  fs::path dir_, out_;
};

TEST_F(TuneCli, WritesTableJsonAndPlotAndPrintsTheCommand) {
  const ChildResult r = tune({"--nodes", "1,2", "--set", "run.steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Pareto front"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cocodiff run " + kGood), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("vs_flat"), std::string::npos) << r.out;
  std::ifstream in(out_ / "tune.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["model"], "flux1-tiny");
  EXPECT_GT(j["counts"]["run"].get<int>(), 0);
  EXPECT_FALSE(j["pareto"].empty());
  EXPECT_TRUE(j["ranking"][0].contains("speedup_vs_flat"));
  for (const auto& row : j["ranking"])  // the baseline is timed by default
    EXPECT_FALSE(row["speedup_vs_flat"].is_null()) << row.dump();
  EXPECT_TRUE(fs::exists(out_ / "tune.txt"));
  EXPECT_TRUE(fs::exists(out_ / "pareto.png")) << r.err;
}

// Any --jobs works: no more runs side by side than points (and kMaxTuneJobs), the same answer.
TEST_F(TuneCli, AHugeJobCountWorksAndGivesTheSameAnswer) {
  ASSERT_EQ(tune({"--nodes", "1", "--set", "run.steps=1", "--jobs", "1"}).exit_code, 0);
  const nlohmann::json one = nlohmann::json::parse(read_text(out_ / "tune.json"));
  const ChildResult r = tune({"--nodes", "1", "--set", "run.steps=1", "--jobs", "100000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json many = nlohmann::json::parse(read_text(out_ / "tune.json"));
  EXPECT_EQ(one["ranking"][0]["command"], many["ranking"][0]["command"]);
}

TEST_F(TuneCli, BadInputIsRefusedWithNothingWritten) {
  // 64 image tokens cannot cover 16 nodes of 4 tiles, whatever the layout.
  expect_refused(tune({"--nodes", "64,128"}), {"no point fits the cluster", "image token"});
  expect_refused(tune({"--budget-s", "0.000001"}), {"--budget-s", "too small for one run"});
  expect_refused(tune({"--objective", "cheapest"}), {"--objective"});
  expect_refused(tune({"--gpus-per-node", "3"}), {"--gpus-per-node", "2 GPUs"});
  expect_refused(tune({"--nodes", "0"}), {"--nodes"});
  expect_refused(tune({"--nodes", "1,x"}), {"--nodes"});
  expect_refused(tune({"--lossy", "-3"}), {"--lossy"});
}

// --lossy: V-Major thresholds are measured on the trained model first (here its quickstart run
// cut to 6 steps); a bound none keeps is refused; one that some keep admits lossy points that
// say where their bound was measured, and the printed command reproduces their time.
TEST(Tune, LossyBoundsAreMeasuredOnTheTrainedModel) {
  TuneOptions o = small_search({"run.steps=4", "v_major.warmup_steps=1"}, {2}, {2});
  o.quality_sets = {"run.steps=6", "v_major.warmup_steps=1"};
  o.lossy_psnr_db = 500;
  try {
    apps::tune(o);
    FAIL() << "--lossy 500 admitted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--lossy 500"), std::string::npos) << what;
    EXPECT_NE(what.find("no V-Major threshold keeps that PSNR"), std::string::npos) << what;
    EXPECT_NE(what.find("quickstart.toml"), std::string::npos) << what;
  }
  o.lossy_psnr_db = 20;
  const TuneResult r = apps::tune(o);
  ASSERT_FALSE(r.quality.empty());
  int lossy = 0;
  for (size_t i : r.ranking) {
    const TunePoint& p = r.points[i];
    if (!p.lossy) continue;
    ++lossy;
    EXPECT_GE(p.lossy->psnr_db, 20.0);
    EXPECT_LT(p.lossy->active_fraction, 1.0);
    if (lossy == 1) {
      const fs::path dir = scratch("lossy");
      EXPECT_EQ(run_printed(apps::run_command(o, p), dir), p.time_s) << p.describe();
      fs::remove_all(dir);
    }
  }
  EXPECT_GT(lossy, 0) << "no lossy point ran";
  EXPECT_NE(apps::tune_table(o, r, 100).find("cannot measure quality"), std::string::npos);
  EXPECT_NE(
      apps::tune_json(o, r)["quality"]["note"].get<std::string>().find("cannot measure quality"),
      std::string::npos);
}

}  // namespace
}  // namespace cocodiff::test
