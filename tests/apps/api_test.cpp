// The public facade (include/cocodiff/): a RunSpec and the config file that sets the same keys
// resolve to the same effective configuration and give the same run (virtual time, bytes,
// timeline and output hashes); a wrong field is a ConfigError naming the spec and the key; a
// registered strategy and all-to-all run by name.

#include <gtest/gtest.h>

#include <atomic>
#include <cocodiff/cocodiff.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

// flux1-tiny on one Aurora node cut to 2 GPUs x 2 tiles, as examples/consumer runs it.
RunSpec small_spec(Math math) {
  RunSpec s;
  s.model = "flux1-tiny";
  s.cluster = "aurora";
  s.nodes = 1;
  s.topology_sizes = {2, 2};
  s.rank_nic = {0, 1, 2, 3};
  s.resolution = 128;
  s.steps = 1;
  s.seed = 7;
  s.math = math;
  s.strategy = "flat";
  s.workers = 1;
  return s;
}

// The same run as a config file.
fs::path small_file(const std::string& math) {
  const fs::path file = fs::path(::testing::TempDir()) / ("api_test_" + math + ".toml");
  std::ofstream(file) << "[model]\npreset = \"flux1-tiny\"\n"
                      << "[run]\nresolution = 128\nsteps = 1\nseed = 7\nmath = \"" << math
                      << "\"\nstrategy = \"flat\"\n"
                      << "[cluster]\npreset = \"aurora\"\nnodes = 1\n"
                      << "[cluster.topology]\nsizes = [2, 2]\n"
                      << "[cluster.nic]\nrank_nic = [0, 1, 2, 3]\n"
                      << "[emulator]\nworkers = 1\n";
  return file;
}

void expect_same_run(const RunResult& a, const RunResult& b) {
  EXPECT_EQ(a.virtual_time_s, b.virtual_time_s);
  EXPECT_EQ(a.timeline_sha256, b.timeline_sha256);
  EXPECT_EQ(a.output_sha256, b.output_sha256);
  ASSERT_EQ(a.bytes_by_tier.size(), b.bytes_by_tier.size());
  for (size_t i = 0; i < a.bytes_by_tier.size(); ++i) {
    EXPECT_EQ(a.bytes_by_tier[i].tier, b.bytes_by_tier[i].tier);
    EXPECT_EQ(a.bytes_by_tier[i].bytes, b.bytes_by_tier[i].bytes);
  }
  EXPECT_EQ(a.latent, b.latent);
}

TEST(Api, SpecIsTheFileRunPhantom) {
  const Plan typed = make_plan(small_spec(Math::kSkip));
  const Plan file = load_plan(small_file("skip"));
  EXPECT_EQ(typed.ranks(), 4);
  EXPECT_EQ(typed.effective_config(), file.effective_config());
  const RunResult a = run(typed), b = run(file);
  expect_same_run(a, b);
  EXPECT_GT(a.virtual_time_s, 0);
  EXPECT_TRUE(a.output_sha256.empty());
  EXPECT_TRUE(a.latent.empty());
  EXPECT_EQ(a.timeline_sha256.size(), 64U);
  ASSERT_EQ(a.bytes_by_tier.size(), 3U);  // die-to-die, intra-node, inter-node
  EXPECT_GT(a.bytes_by_tier[1].bytes, 0);
}

TEST(Api, SpecIsTheFileRunReal) {
  const RunResult a = run(make_plan(small_spec(Math::kReal)));
  const RunResult b = run(load_plan(small_file("real")));
  expect_same_run(a, b);
  EXPECT_EQ(a.output_sha256.size(), 64U);
  EXPECT_EQ(a.latent.size(), static_cast<size_t>(a.latent_channels) * a.latent_frames *
                                 a.latent_height * a.latent_width);
  EXPECT_GT(a.latent.size(), 0U);

  const fs::path out = fs::path(::testing::TempDir()) / "api_test_out";
  fs::remove_all(out);
  const fs::path image = write_outputs(make_plan(small_spec(Math::kReal)), a, out);
  EXPECT_EQ(image, out / "image.png");
  EXPECT_TRUE(fs::is_regular_file(out / "report.json"));
  fs::remove_all(out);
}

// The parallel layout and the run's other settings as typed fields: the same effective
// configuration and run as the file with the same keys set.
TEST(Api, LayoutFieldsAreTheFilesKeys) {
  RunSpec usp = small_spec(Math::kSkip);
  usp.strategy = "usp";
  usp.ulysses_degree = 2;
  usp.ring_degree = 2;
  usp.uneven_heads = true;
  usp.shard_text = false;
  usp.cfg_scale = 1.0;
  usp.replay = false;
  usp.sets = {"usp.tapa=true"};
  const Plan a = make_plan(usp);
  const Plan b =
      load_plan(small_file("skip"),
                {"run.strategy=usp", "parallel.ulysses_degree=2", "parallel.ring_degree=2",
                 "ulysses.uneven_heads=true", "parallel.shard_text=false", "run.cfg_scale=1.0",
                 "emulator.replay=false", "usp.tapa=true"});
  EXPECT_EQ(a.effective_config(), b.effective_config());
  expect_same_run(run(a), run(b));

  RunSpec coco = small_spec(Math::kSkip);
  coco.strategy = "cocodiff";
  coco.pipeline_chunks = 4;
  coco.v_major_threshold = 0.1;
  coco.batch_size = 2;
  const Plan c = make_plan(coco);
  const Plan d = load_plan(small_file("skip"), {"run.strategy=cocodiff", "pipeline.chunks=4",
                                                "v_major.threshold=0.1", "run.batch_size=2"});
  EXPECT_EQ(c.effective_config(), d.effective_config());
  expect_same_run(run(c), run(d));

  RunSpec bad = small_spec(Math::kSkip);
  bad.cfg_degree = 3;
  try {
    make_plan(bad);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cfg_degree"), std::string::npos) << e.what();
  }
}

TEST(Api, WrongFieldNamesSpecAndKey) {
  RunSpec s = small_spec(Math::kSkip);
  s.strategy = "no_such_strategy";
  try {
    make_plan(s);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cocodiff::RunSpec"), std::string::npos) << what;
    EXPECT_NE(what.find("run.strategy"), std::string::npos) << what;
    EXPECT_NE(what.find("no_such_strategy"), std::string::npos) << what;
  }
  RunSpec no_model = small_spec(Math::kSkip);
  no_model.model.clear();
  EXPECT_THROW(make_plan(no_model), ConfigError);
}

// A strategy of the program's own, delegating to the built-in flat: the same run as flat.
TEST(Api, ExtensionsRunByName) {
  Extensions ext;
  ext.add_strategy("api_test_flat",
                   [](Communicator& comm, const ModelConfig& cfg, const StrategyOptions& options) {
                     return dit::make_attention_strategy("flat", comm, cfg, options);
                   });
  EXPECT_THROW(ext.add_strategy("flat", nullptr), ConfigError);
  namespace coll = emu::collectives;
  register_all_to_all(
      "api_test_shift", "the shift schedule under another name",
      coll::algorithm(coll::find_algorithm(coll::CollectiveKind::kAllToAll, "shift")).make);
  EXPECT_THROW(register_all_to_all("api_test_shift", "again",
                                   [](const GroupShape&) { return std::unique_ptr<Schedule>(); }),
               ConfigError);

  RunSpec mine = small_spec(Math::kSkip);
  mine.strategy = "api_test_flat";
  mine.all_to_all = "api_test_shift";
  RunSpec ref = small_spec(Math::kSkip);
  ref.all_to_all = "shift";
  EXPECT_THROW(make_plan(mine), ConfigError);  // not without the extensions
  const RunResult a = run(make_plan(mine, &ext));
  const RunResult b = run(make_plan(ref));
  EXPECT_EQ(a.strategy, "api_test_flat");
  EXPECT_EQ(a.virtual_time_s, b.virtual_time_s);
  for (size_t i = 0; i < a.bytes_by_tier.size(); ++i)
    EXPECT_EQ(a.bytes_by_tier[i].bytes, b.bytes_by_tier[i].bytes);
}

// A plan reads a strategy's layout, not its name: a program's strategy that lays out its ranks
// as one Ulysses group runs CFG-parallel as flat does (the same run), one that says nothing of
// its ranks is refused it; a strategy with its own sampling loop is handed the whole run.
TEST(Api, AStrategysLayoutAndSamplingLoopAreReadFromItsEntry) {
  const StrategyFactory flat = [](Communicator& comm, const ModelConfig& cfg,
                                  const StrategyOptions& options) {
    return dit::make_attention_strategy("flat", comm, cfg, options);
  };
  Extensions ext;
  StrategyEntry ulysses;
  ulysses.factory = flat;
  ulysses.layout = {StrategyLayout::Kind::kUlysses, /*cfg_parallel=*/true, /*single_rank=*/true};
  ext.add_strategy("api_test_ulysses", ulysses);
  ext.add_strategy("api_test_own", flat);
  auto loops = std::make_shared<std::atomic<int>>(0);
  StrategyEntry looped;
  looped.factory = flat;
  looped.sampler = [loops](Communicator& comm, const ModelConfig& cfg, const Weights& w,
                           const RunSettings& settings) {
    ++*loops;
    RunSettings as_flat = settings;
    as_flat.strategy = "flat";
    return dit::generate(comm, cfg, w, as_flat);
  };
  ext.add_strategy("api_test_loop", looped);

  // sd35-tiny has true CFG: parallel.cfg_degree = 2 runs its branches on two halves.
  RunSpec halves = small_spec(Math::kReal);
  halves.model = "sd35-tiny";
  halves.cfg_degree = 2;
  RunSpec ref = halves;
  halves.strategy = "api_test_ulysses";
  const RunResult a = run(make_plan(halves, &ext));
  const RunResult b = run(make_plan(ref));
  EXPECT_EQ(a.virtual_time_s, b.virtual_time_s);
  EXPECT_EQ(a.output_sha256, b.output_sha256);
  halves.strategy = "api_test_own";
  try {
    make_plan(halves, &ext);
    ADD_FAILURE() << "a strategy that lays out its own ranks ran CFG-parallel";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cfg_degree"), std::string::npos) << e.what();
  }

  RunSpec mine = small_spec(Math::kReal);
  mine.strategy = "api_test_loop";
  const RunResult c = run(make_plan(mine, &ext));
  const RunResult d = run(make_plan(small_spec(Math::kReal)));
  EXPECT_EQ(loops->load(), 4);  // once on each of the 4 ranks
  EXPECT_EQ(c.output_sha256, d.output_sha256);
  EXPECT_EQ(c.virtual_time_s, d.virtual_time_s);
}

}  // namespace
}  // namespace cocodiff::test
