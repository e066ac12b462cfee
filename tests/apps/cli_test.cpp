// End-to-end errors of the `cocodiff` binary: every bad config, cluster file, flag and --set value
// exits 2 with one message that names the file, the line, the key, what was expected and what was
// found, and leaves nothing in the --out directory.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

const fs::path kData = COCODIFF_TEST_DATA;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("cocodiff_cli_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    out_ = dir_ / "out";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  ChildResult run(std::vector<std::string> args) { return run_cocodiff(args, dir_); }
  /// `cocodiff run CONFIG --out OUT extra...`
  ChildResult run_config(const fs::path& config, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"run", config.string(), "--out", out_.string(), "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  }
  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }

  /// Files left in the --out directory (none must exist after an error).
  std::vector<std::string> out_files() const {
    std::vector<std::string> names;
    std::error_code ec;
    if (fs::is_directory(out_, ec))
      for (const fs::directory_entry& e : fs::directory_iterator(out_))
        names.push_back(e.path().filename().string());
    return names;
  }

  /// Exit code 2, one "cocodiff: error: " line holding every piece, no output files.
  void expect_user_error(const ChildResult& r, const std::vector<std::string>& pieces) {
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("cocodiff: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const std::string& p : pieces) EXPECT_NE(r.err.find(p), std::string::npos) << p;
    EXPECT_EQ(r.out, "");
    EXPECT_TRUE(out_files().empty()) << "left in --out: " << out_files().front();
  }

  fs::path dir_, out_;
};

TEST_F(Cli, GoodConfigRunsAndValidates) {
  const ChildResult r = run_config(kData / "good.toml");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(fs::is_regular_file(out_ / "report.json"));
  const ChildResult v = run({"validate", (kData / "good.toml").string()});
  EXPECT_EQ(v.exit_code, 0) << v.err;
  EXPECT_NE(v.out.find("good.toml: valid"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("flux1-tiny"), std::string::npos) << v.out;
}

TEST_F(Cli, UnknownKeyNamesFileLineAndSuggestsTheKey) {
  const std::string f = (kData / "unknown_key.toml").string();
  expect_user_error(run_config(f), {f + ":8: unknown key 'run.stpes'", "did you mean 'run.steps'?",
                                    "known keys of [run]: "});
  const ChildResult v = run({"validate", f});
  EXPECT_EQ(v.exit_code, 2);
  EXPECT_NE(v.err.find(f + ":8: unknown key 'run.stpes'"), std::string::npos) << v.err;
  EXPECT_EQ(v.out.find("valid"), std::string::npos) << v.out;
}

TEST_F(Cli, WrongTypeNamesExpectedAndFound) {
  const std::string f = (kData / "wrong_type.toml").string();
  expect_user_error(run_config(f), {f + ":6: key 'run.steps': expected an integer in [1, ",
                                    "found string \"four\""});
}

TEST_F(Cli, OutOfRangeNamesTheRange) {
  const std::string f = (kData / "out_of_range.toml").string();
  expect_user_error(run_config(f),
                    {f + ":6: key 'run.steps': expected an integer in [1, 100000], found 0"});
  const std::string g = (kData / "good.toml").string();
  expect_user_error(
      run_config(g, {"--set", "cluster.nodes=0"}),
      {"--set cluster.nodes: key 'cluster.nodes': expected an integer in [1, ", "found 0"});
  expect_user_error(run_config(g, {"--set", "emulator.workers=-3"}),
                    {"--set emulator.workers: key 'emulator.workers': expected an integer in "
                     "[1, 1024], found -3"});
  expect_user_error(
      run_config(g, {"--set", "run.math=fast"}),
      {"--set run.math: key 'run.math': expected one of real | skip, found \"fast\""});
}

TEST_F(Cli, ResolutionMustBeAMultipleOfVaeTimesPatch) {
  const std::string f = (kData / "resolution_not_multiple.toml").string();
  expect_user_error(run_config(f), {f + ":5: key 'run.resolution': expected a multiple of 16 "
                                        "(VAE 8 x patch 2), found 200"});
}

TEST_F(Cli, HeadsMustDivideAmongRanks) {
  const std::string f = (kData / "heads_vs_ranks.toml").string();
  expect_user_error(run_config(f),
                    {f + ":13: key 'cluster.nodes'", "24 heads", "16 ranks", "found 4 nodes"});
  const ChildResult v = run({"validate", f});
  EXPECT_EQ(v.exit_code, 2) << "validate must catch what run would: " << v.out;
}

TEST_F(Cli, TokensMustCoverRanks) {
  const std::string f = (kData / "tokens_vs_ranks.toml").string();
  expect_user_error(run_config(f),
                    {f + ":6: key 'run.resolution'", "24 ranks", "found 32 (4 image tokens)"});
}

TEST_F(Cli, MissingModelPreset) {
  const std::string f = (kData / "no_model_preset.toml").string();
  expect_user_error(run_config(f), {f + ":2: key 'model.preset'", "expected a model preset name",
                                    "found \"flux9-tiny\""});
}

TEST_F(Cli, MissingClusterPresetListsTheKnownOnes) {
  const std::string f = (kData / "no_cluster_preset.toml").string();
  expect_user_error(run_config(f), {f + ":9: key 'cluster.preset'", "aurora, ", "uniform",
                                    "found \"aurora-next\""});
}

TEST_F(Cli, ClusterLinkToNowhere) {
  const std::string c = (kData / "clusters" / "link_to_nowhere.toml").string();
  expect_user_error(run_config(kData / "link_to_nowhere.toml"),
                    {c + ":12: key 'cluster.links.nvlink.pairs'",
                     "found \"2-7\": local rank 7 does not exist (a node has 4 ranks)"});
  // A link class on a level the topology does not have.
  expect_user_error(
      run_config(kData / "good.toml", {"--set", "cluster.links.extra.kind=pair", "--set",
                                       "cluster.links.extra.level=socket", "--set",
                                       "cluster.links.extra.bandwidth_gbytes_per_s=1", "--set",
                                       "cluster.links.extra.latency_ns=1"}),
      {"key 'cluster.links.extra.level': expected a level below the node: tile | "
       "gpu, found \"socket\""});
}

TEST_F(Cli, ClusterZeroBandwidth) {
  const std::string c = (kData / "clusters" / "zero_bandwidth.toml").string();
  expect_user_error(run_config(kData / "zero_bandwidth.toml"),
                    {c + ":13: key 'cluster.links.nvswitch.bandwidth_gbytes_per_s'",
                     "expected a bandwidth > 0 (GB/s per direction), found 0"});
}

TEST_F(Cli, TomlSyntaxErrorNamesLineAndColumn) {
  const std::string f = (kData / "syntax_error.toml").string();
  expect_user_error(run_config(f), {f + ":5:", "TOML syntax error"});
}

TEST_F(Cli, MissingConfigFile) {
  const std::string f = (dir_ / "nope.toml").string();
  expect_user_error(run_config(f), {f + ": no such config file"});
  expect_user_error(run({"validate", f}), {f + ": no such config file"});
}

TEST_F(Cli, UnknownFlagIsAnErrorWithAHint) {
  const ChildResult r = run_config(kData / "good.toml", {"--stpes", "4"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--stpes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("did you mean"), std::string::npos) << r.err;  // nothing close to it
  const ChildResult t = run_config(kData / "good.toml", {"--bakend=mpi"});
  EXPECT_EQ(t.exit_code, 2);
  EXPECT_NE(t.err.find("did you mean '--backend' instead of '--bakend'?"), std::string::npos)
      << t.err;
  EXPECT_TRUE(out_files().empty());
  const ChildResult s = run({"frobnicate"});
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_EQ(
      s.err.rfind("cocodiff: error: unknown command 'frobnicate' (expected run | validate", 0), 0u)
      << s.err;
  EXPECT_NE(s.err.find("--help"), std::string::npos) << s.err;
  const ChildResult b = run_config(kData / "good.toml", {"--backend", "gpu"});
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_NE(b.err.find("gpu"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("emulator"), std::string::npos) << b.err;
}

TEST_F(Cli, BadSetValues) {
  const fs::path g = kData / "good.toml";
  expect_user_error(run_config(g, {"--set", "run.steps"}),
                    {"--set 'run.steps': expected key=value, e.g. --set run.steps=4"});
  expect_user_error(run_config(g, {"--set", "=4"}), {"--set '=4': expected key=value"});
  expect_user_error(run_config(g, {"--set", "run..steps=4"}),
                    {"--set 'run..steps=4': empty key part"});
  // A type mismatch against the config's own value, and against the reader's expectation.
  expect_user_error(run_config(g, {"--set", "run.steps=abc"}),
                    {"--set run.steps: expected integer like the config's integer 1, found "
                     "string \"abc\""});
  expect_user_error(run_config(g, {"--set", "run.cfg_scale=abc"}),
                    {"--set run.cfg_scale: key 'run.cfg_scale': expected a number in [-1, 100], "
                     "found string \"abc\""});
  expect_user_error(run_config(g, {"--set", "run=4"}),
                    {"--set run: that key is a table; set one of its keys instead"});
  expect_user_error(run_config(g, {"--set", "run.steps.x=4"}),
                    {"--set run.steps.x: 'steps' is integer 1, not a table"});
  // An unknown key from the command line is named as such.
  expect_user_error(run_config(g, {"--set", "run.stpes=4"}),
                    {"--set run.stpes: unknown key 'run.stpes'; did you mean 'run.steps'?"});
}

TEST_F(Cli, ValidateDoesNotNeedOut) {
  const ChildResult v = run({"validate", (kData / "good.toml").string(), "--set", "run.steps=2"});
  EXPECT_EQ(v.exit_code, 0) << v.err;
  EXPECT_NE(v.out.find("2 steps"), std::string::npos) << v.out;
  const ChildResult bad = run({"validate", (kData / "good.toml").string(), "--set", "run.x=1"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--set run.x: unknown key 'run.x'"), std::string::npos) << bad.err;
}

// xDiT-style degrees: Ulysses x ring must be the rank count (exit 2 naming the key and the
// product), a valid split runs usp with the ring over the outer levels, and heads that do not
// divide the Ulysses degree get a suggestion (error) or a note naming the idle ranks (uneven).
TEST_F(Cli, ParallelDegrees) {
  const std::string smoke = std::string(COCODIFF_SOURCE_DIR) + "/configs/mpi-smoke.toml";
  expect_user_error(
      run({"validate", smoke, "--ulysses-degree", "3", "--ring-degree", "2"}),
      {"parallel.ulysses_degree", "ulysses 3 x ring 2 = 6", "product is the cluster's 4 ranks"});
  expect_user_error(run({"validate", smoke, "--ring-degree", "3"}), {"parallel.ring_degree"});
  // mpi-smoke names run.strategy = "flat": a ring degree makes it Ulysses x Ring (usp), in
  // xDiT's spelling too; a strategy named on the command line beside a ring is refused.
  for (const auto& [u, r] :
       {std::pair<std::string, std::string>{"--ulysses-degree", "--ring-degree"},
        {"--ulysses_degree", "--ring_degree"}}) {
    const ChildResult ring = run({"validate", smoke, u, "2", r, "2"});
    EXPECT_EQ(ring.exit_code, 0) << ring.err;
    EXPECT_NE(ring.out.find("strategy usp"), std::string::npos) << ring.out;
  }
  expect_user_error(run({"validate", smoke, "--ring_degree", "2", "--set", "run.strategy=tapa"}),
                    {"ring attention runs in the usp strategy"});
  const ChildResult ok = run({"validate", smoke, "--ulysses-degree", "2", "--ring-degree", "2",
                              "--set", "run.strategy=usp"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("strategy usp"), std::string::npos) << ok.out;
  // report.json records the degrees.
  const fs::path out = dir_ / "ring";
  const ChildResult ran = run({"run", smoke, "--ring_degree", "2", "--num_inference_steps", "1",
                               "--set", "run.math=skip", "--out", out.string(), "-q"});
  ASSERT_EQ(ran.exit_code, 0) << ran.err;
  const std::string report = read_text(out / "report.json");
  for (const char* field : {"\"ulysses_degree\": 2", "\"ring_degree\": 2", "\"cfg_degree\": 1",
                            "\"strategy\": \"usp\"", "\"steps\": 1"})
    EXPECT_NE(report.find(field), std::string::npos) << field << "\n" << report;
  expect_user_error(run({"validate", smoke, "--set", "model.heads=2"}),
                    {"Ulysses degree 4", "--ulysses-degree 2 --ring-degree 2"});
  const ChildResult uneven =
      run({"validate", smoke, "--set", "model.heads=2", "--set", "ulysses.uneven_heads=true"});
  EXPECT_EQ(uneven.exit_code, 0) << uneven.err;
  EXPECT_NE(uneven.out.find("ranks 2 to 3 of each group hold none and idle in attention"),
            std::string::npos)
      << uneven.out;
}

// diffusers' and xDiT's spellings: --height and --width (replacing the config's resolution, which
// gives the side not named), --num_inference_steps, --seed.
TEST_F(Cli, XdiTSpellingsOfSizeStepsAndSeed) {
  const std::string smoke = std::string(COCODIFF_SOURCE_DIR) + "/configs/mpi-smoke.toml";
  const ChildResult v = run({"validate", smoke, "--height", "64", "--width", "128",
                             "--num_inference_steps", "3", "--seed", "11"});
  EXPECT_EQ(v.exit_code, 0) << v.err;
  EXPECT_NE(v.out.find("128 x 64 px (width x height)"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("3 steps, seed 11"), std::string::npos) << v.out;
  const ChildResult h = run({"validate", smoke, "--height", "64"});
  EXPECT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find(" x 64 px (width x height)"), std::string::npos) << h.out;
  // The dump holds height and width alone, and runs the same.
  const ChildResult d = run({"validate", smoke, "--height", "64", "--width", "128", "--dump"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_EQ(d.out.find("\nresolution ="), std::string::npos) << d.out;
  const fs::path dumped = write("dumped.toml", d.out);
  const ChildResult again = run({"validate", dumped.string()});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("128 x 64 px (width x height)"), std::string::npos) << again.out;
}

// xDiT's spellings of CFG-parallel, guidance, PipeFusion and the prompt: the first three set
// their keys (PipeFusion on SD3.5 as on FLUX.1), the prompt gets a note.
TEST_F(Cli, XdiTSpellingsOfCfgGuidancePipeFusionAndPrompt) {
  const std::string sd = (kData / "good.toml").string();
  const std::vector<std::string> sd35 = {"--set", "model.preset=sd35-tiny"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), sd35.begin(), sd35.end());
    return a;
  };
  const ChildResult c = run(with({"validate", sd, "--use_cfg_parallel", "--dump"}));
  EXPECT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out.find("cfg_degree = 2"), std::string::npos) << c.out;
  const ChildResult g = run(with({"validate", sd, "--guidance_scale", "3.5", "--dump"}));
  EXPECT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.out.find("cfg_scale = 3.5"), std::string::npos) << g.out;
  EXPECT_EQ(run(with({"validate", sd, "--pipefusion_parallel_degree", "1"})).exit_code, 0);
  const ChildResult pf = run(with({"validate", sd, "--pipefusion_parallel_degree", "2", "--dump"}));
  EXPECT_EQ(pf.exit_code, 0) << pf.err;
  EXPECT_NE(pf.out.find("strategy = 'pipefusion'"), std::string::npos) << pf.out;
  const ChildResult fx = run({"validate", sd, "--pipefusion_parallel_degree", "2",
                              "--num_pipeline_patch", "4", "--warmup_steps", "2", "--dump"});
  EXPECT_EQ(fx.exit_code, 0) << fx.err;
  EXPECT_NE(fx.out.find("strategy = 'pipefusion'"), std::string::npos) << fx.out;
  EXPECT_NE(fx.out.find("pipefusion_degree = 2"), std::string::npos) << fx.out;
  EXPECT_NE(fx.out.find("ulysses_degree = 2"), std::string::npos) << fx.out;
  EXPECT_NE(fx.out.find("patches = 4"), std::string::npos) << fx.out;
  const ChildResult pr = run(with({"validate", sd, "--prompt", "a cat"}));
  EXPECT_EQ(pr.exit_code, 0) << pr.err;
  EXPECT_NE(pr.err.find("--prompt is not encoded"), std::string::npos) << pr.err;
}

// PipeFusion's degree must divide the ranks and leave every stage a block, its patches be 1 to
// the token rows (a video's: every frame's); each refusal names its key, exits 2 and writes
// nothing. A good one runs, and so does a video in a pipeline per CFG branch.
TEST_F(Cli, PipeFusionRefusalsNameTheirKeys) {
  const std::string g = (kData / "good.toml").string();  // flux1-tiny, 4 blocks, 4 ranks, 8 rows
  expect_user_error(run_config(g, {"--pipefusion_parallel_degree", "3"}),
                    {"key 'parallel.pipefusion_degree'", "a divisor of the 4 ranks"});
  expect_user_error(
      run_config(g, {"--pipefusion_parallel_degree", "4", "--set", "model.single_blocks=1"}),
      {"key 'parallel.pipefusion_degree'", "at most the 3 transformer blocks"});
  expect_user_error(
      run_config(g, {"--set", "run.strategy=pipefusion", "--num_pipeline_patch", "9"}),
      {"key 'pipefusion.patches'", "token rows"});
  expect_user_error(
      run_config(g, {"--set", "run.strategy=pipefusion", "--set", "pipefusion.patches=0"}),
      {"key 'pipefusion.patches'"});
  const std::vector<std::string> video = {"--pipefusion_parallel_degree",
                                          "2",
                                          "--set",
                                          "model.preset=wan-tiny",
                                          "--set",
                                          "run.frames=5",
                                          "--use_cfg_parallel"};
  std::vector<std::string> too_many = video;  // 2 latent frames of 8 rows
  for (const char* a : {"--num_pipeline_patch", "17"}) too_many.emplace_back(a);
  expect_user_error(run_config(g, too_many),
                    {"key 'pipefusion.patches'", "1 to the video's 16 token rows"});
  expect_user_error(
      run_config(g, {"--pipefusion_parallel_degree", "2", "--set", "run.strategy=tapa"}),
      {"key 'parallel.pipefusion_degree'", "run.strategy \"tapa\""});
  expect_user_error(run_config(g, {"--pipefusion_parallel_degree", "2", "--set", "run.math=real",
                                   "--set", "step_cache.policy=teacache"}),
                    {"key 'step_cache.policy'", "\"none\" with run.strategy \"pipefusion\""});
  const ChildResult ok = run_config(g, {"--pipefusion_parallel_degree", "2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  const ChildResult clip = run_config(g, video);
  EXPECT_EQ(clip.exit_code, 0) << clip.err;
}

// A PipeFusion run with fewer warm-up steps than steps is lossy: report.json records its
// degrees and its quality against the same run with every step a warm-up step, which is exact.
TEST_F(Cli, PipeFusionReportsItsQualityAgainstItsExactRun) {
  const std::string quick = std::string(COCODIFF_SOURCE_DIR) + "/configs/quickstart.toml";
  const std::vector<std::string> small = {"--set",           "run.steps=6", "--set",
                                          "cluster.nodes=1", "--set",       "emulator.trace=false"};
  auto pipefusion = [&](const std::string& warmup) {
    std::vector<std::string> a = small;
    for (const char* x : {"--pipefusion_parallel_degree", "4", "--warmup_steps"}) a.emplace_back(x);
    a.push_back(warmup);
    return a;
  };
  ASSERT_EQ(run_config(quick, pipefusion("1")).exit_code, 0);
  const std::string lossy = read_text(out_ / "report.json");
  EXPECT_NE(lossy.find("\"degree\": 4"), std::string::npos) << lossy;
  EXPECT_NE(lossy.find("\"ulysses_degree\": 3"), std::string::npos) << lossy;
  EXPECT_NE(lossy.find("pipefusion.warmup_steps = run.steps (exact)"), std::string::npos) << lossy;
  EXPECT_NE(lossy.find("\"bitwise_equal\": false"), std::string::npos) << lossy;
  ASSERT_EQ(run_config(quick, pipefusion("6")).exit_code, 0);
  const std::string exact = read_text(out_ / "report.json");
  EXPECT_EQ(exact.find("\"quality\""), std::string::npos) << exact;  // exact: nothing to report
}

// A model of no blocks, an empty checkpoint name and an empty --out are refused, not run.
TEST_F(Cli, EmptyModelsAndEmptyNamesAreRefused) {
  const std::string g = (kData / "good.toml").string();
  expect_user_error(
      run_config(g, {"--set", "model.double_blocks=0", "--set", "model.single_blocks=0"}),
      {"key 'model.double_blocks'", "at least one transformer block"});
  const ChildResult w = run({"weights", "flux1-tiny", "--check", ""});
  EXPECT_EQ(w.exit_code, 2) << w.err;
  EXPECT_NE(w.err.find("--check: expected a checkpoint file"), std::string::npos) << w.err;
  const ChildResult c = run({"compare", g, "--out", ""});
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find("an output directory name is required"), std::string::npos) << c.err;
  EXPECT_EQ(c.out, "") << "compare ran before refusing";
}

// Errors blame the key that is wrong: a base_seq_len past the preset's max_seq_len, a renamed node
// tier (only where V-Major would use the default tier), a [fabric] without its [nic]; and a run
// started by mpirun without --backend mpi says so instead of running one emulator per rank.
TEST_F(Cli, ErrorsBlameTheKeyThatIsWrong) {
  const std::string g = (kData / "good.toml").string();
  expect_user_error(run_config(g, {"--set", "model.base_seq_len=100000"}),
                    {"key 'model.base_seq_len': expected below model.max_seq_len"});
  EXPECT_EQ(run({"validate", g, "--set", "cluster.topology.node_tier=net"}).exit_code, 0);
  expect_user_error(
      run_config(g, {"--set", "cluster.topology.node_tier=net", "--set", "run.strategy=cocodiff"}),
      {"key 'v_major.tiers'", "set v_major.tiers for strategy \"cocodiff\""});
  const fs::path nonic = write("nonic.toml",
                               "name = \"x\"\nnodes = 2\n[topology]\nlevels = [\"gpu\"]\n"
                               "sizes = [2]\ntiers = [\"intra\"]\n[links.a]\nkind = \"switch\"\n"
                               "level = \"gpu\"\nbandwidth_gbytes_per_s = 100\nlatency_ns = 100\n"
                               "[fabric]\nkind = \"nonblocking\"\nlatency_ns = 100\n");
  const ChildResult n = run({"netbench", nonic.string()});
  EXPECT_EQ(n.exit_code, 2) << n.err;
  EXPECT_NE(n.err.find("a [nic] section beside it"), std::string::npos) << n.err;
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  const ChildResult m = run_config(g);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(m.exit_code, 2) << m.err;
  EXPECT_NE(m.err.find("started by mpirun as 4 ranks, but without --backend mpi"),
            std::string::npos)
      << m.err;
}

// Fewer GPUs per node is one key: the preset's NIC map follows topology.sizes (the first ranks
// keep their NICs) unless the run gives its own, which must then match.
TEST_F(Cli, GpusPerNodeIsOneKey) {
  const std::string g = (kData / "good.toml").string();
  const ChildResult v =
      run({"validate", g, "--set", "cluster.preset=hgx-h200", "--set", "cluster.topology.sizes=[4]",
           "--set", "model.preset=flux1-dev", "--set", "run.resolution=1024"});
  EXPECT_EQ(v.exit_code, 0) << v.err;
  const ChildResult bad =
      run({"validate", g, "--set", "cluster.preset=hgx-h200", "--set", "cluster.topology.sizes=[4]",
           "--set", "cluster.nic.rank_nic=[0,1]"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("one NIC index per local rank (4)"), std::string::npos) << bad.err;
}

// Misspelt cluster keys and presets get a "did you mean", as run keys do.
TEST_F(Cli, MisspeltClusterKeysAndPresetsGetAHint) {
  const std::string g = (kData / "good.toml").string();
  const ChildResult k = run({"validate", g, "--set", "cluster.node=2"});
  EXPECT_EQ(k.exit_code, 2);
  EXPECT_NE(k.err.find("did you mean 'cluster.nodes'?"), std::string::npos) << k.err;
  const ChildResult m = run({"validate", g, "--set", "model.preset=flux1-devv"});
  EXPECT_NE(m.err.find("did you mean 'flux1-dev'?"), std::string::npos) << m.err;
  const ChildResult c = run({"validate", g, "--set", "cluster.preset=auroa"});
  EXPECT_NE(c.err.find("did you mean 'aurora'?"), std::string::npos) << c.err;
}

// validate --dump writes each float as the shortest decimal that reads back exactly (0.6, not
// 0.59999999999999998), and resolves defaults that are sentinels: run.cfg_scale is the model's
// scale, emulator.memory_limit "available" (MemAvailable when the run starts), never -1 or 0.
TEST_F(Cli, DumpWritesShortFloatsAndNoSentinels) {
  const std::string quick = std::string(COCODIFF_SOURCE_DIR) + "/configs/quickstart.toml";
  const ChildResult d = run({"validate", quick, "--dump", "--set", "v_major.threshold=0.6"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(d.out.find("threshold = 0.6\n"), std::string::npos) << d.out;
  EXPECT_FALSE(std::regex_search(d.out, std::regex("[0-9]\\.[0-9]{12,}"))) << d.out;
  EXPECT_EQ(d.out.find("cfg_scale = -1"), std::string::npos) << d.out;
  EXPECT_TRUE(std::regex_search(d.out, std::regex("\ncfg_scale = [0-9]"))) << d.out;
  EXPECT_TRUE(std::regex_search(d.out, std::regex("memory_limit = .available.\n"))) << d.out;
  const fs::path dumped = write("dumped.toml", d.out);
  const ChildResult again = run({"validate", dumped.string()});
  EXPECT_EQ(again.exit_code, 0) << again.err;
}

// Every key a run reads outside the model and cluster presets is documented in the top README
// ("Config keys"), by its full name.
TEST_F(Cli, EveryRunKeyIsDocumented) {
  const std::string tiny = std::string(COCODIFF_SOURCE_DIR) + "/configs/flux1-tiny-24tiles.toml";
  const ChildResult d = run({"validate", tiny, "--dump"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  const std::string readme = read_text(std::string(COCODIFF_SOURCE_DIR) + "/README.md");
  std::string section;
  int keys = 0;
  std::istringstream lines(d.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("[", 0) == 0) section = line.substr(1, line.find(']') - 1);
    const size_t eq = line.find(" = ");
    if (line.empty() || line[0] == '#' || line[0] == '[' || eq == std::string::npos) continue;
    if (section.rfind("model", 0) == 0 || section.rfind("cluster", 0) == 0) continue;
    const std::string key = section + "." + line.substr(0, eq);
    ++keys;
    EXPECT_NE(readme.find("`" + key + "`"), std::string::npos) << key << " is not in README.md";
  }
  EXPECT_GT(keys, 30);
}

// CFG-parallel (--cfg-degree 2): Ulysses x ring must then be half the rank count; a model with
// no unconditional pass, usp (whose ring spans the cluster) and a degree that does not divide
// the ranks are refused naming parallel.cfg_degree; a valid run reports its degree.
TEST_F(Cli, CfgParallelDegree) {
  const std::string smoke = std::string(COCODIFF_SOURCE_DIR) + "/configs/mpi-smoke.toml";
  const std::vector<std::string> fmnist = {
      "--set",
      "model.preset=flux1-fmnist",
      "--set",
      "run.resolution=28",
      "--set",
      "run.weights=" + std::string(COCODIFF_SOURCE_DIR) +
          "/configs/weights/flux1-fmnist/flux1-fmnist.safetensors"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), fmnist.begin(), fmnist.end());
    return run(args);
  };
  // mpi-smoke's flux1-tiny is guidance-distilled: no unconditional pass to run apart.
  expect_user_error(run({"validate", smoke, "--cfg-degree", "2"}),
                    {"parallel.cfg_degree", "no unconditional pass"});
  expect_user_error(with({"validate", smoke, "--cfg-degree", "2", "--ulysses-degree", "4"}),
                    {"parallel.ulysses_degree", "4 ranks / parallel.cfg_degree 2 = 2 ranks"});
  expect_user_error(with({"validate", smoke, "--cfg-degree", "2", "--set", "run.strategy=usp"}),
                    {"parallel.cfg_degree", "usp's ring spans the whole cluster"});
  expect_user_error(with({"validate", smoke, "--cfg-degree", "2", "--set", "cluster.preset=uniform",
                          "--set", "cluster.nodes=1", "--set", "cluster.topology.sizes=[3,1]",
                          "--set", "cluster.nic.rank_nic=[0,0,0]", "--set", "cluster.nic.count=1"}),
                    {"parallel.cfg_degree", "divides the cluster's 3 ranks"});
  expect_user_error(run({"validate", smoke, "--set", "parallel.cfg_degree=3"}),
                    {"parallel.cfg_degree"});
  EXPECT_EQ(run({"validate", smoke, "--cfg-degree", "3"}).exit_code, 2);
  const fs::path out = dir_ / "cfg2";
  const ChildResult ok = with({"run", smoke, "--cfg-degree", "2", "--out", out.string(), "-q"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  std::ifstream in(out / "report.json");
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("\"cfg_degree\": 2"), std::string::npos) << report;
}

// Text sharded over the Ulysses group (parallel.shard_text): a degree that does not divide the
// text is refused naming the key and the degree splits that do; a model without text is
// refused; a run that shards says so in its report.
TEST_F(Cli, TextShardingDegree) {
  const std::string dir = std::string(COCODIFF_SOURCE_DIR) + "/configs/";
  // flux1-tiny's 16 text tokens over 24 tiles (Ulysses 24); Ulysses 2 (ring 12) divides them.
  expect_user_error(
      run({"validate", dir + "flux1-tiny-24tiles.toml", "--set", "parallel.shard_text=true"}),
      {"parallel.shard_text", "16 text tokens of flux1-tiny", "Ulysses degree 24",
       "--ulysses-degree 2 --ring-degree 12"});
  expect_user_error(run_config(dir + "flux1-tiny-24tiles.toml",
                               {"--set", "parallel.shard_text=true", "--set", "run.math=skip"}),
                    {"parallel.shard_text"});
  expect_user_error(run({"validate", dir + "mpi-smoke.toml", "--set", "parallel.shard_text=true",
                         "--set", "model.preset=dit-xl-2-tiny"}),
                    {"parallel.shard_text", "no text stream"});
  const ChildResult ok = run_config(dir + "mpi-smoke.toml", {"--set", "parallel.shard_text=true"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  std::ifstream in(out_ / "report.json");
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("\"shard_text\": true"), std::string::npos) << report;
}

// validate refuses everything run refuses before its first step, with the same message naming
// the file, the line and the key: a class the model does not have, a weights file that is not
// there, a checkpoint of another model, a misspelt key (with the key it resembles and the
// section's keys, those read only when present included).
TEST_F(Cli, ValidateRefusesWhatRunRefuses) {
  const std::string quick = std::string(COCODIFF_SOURCE_DIR) + "/configs/quickstart.toml";
  const std::string tiny = std::string(COCODIFF_SOURCE_DIR) + "/configs/flux1-tiny-24tiles.toml";
  const fs::path copy = write("copy.toml", read_text(quick));  // weights found in the presets
  const struct Case {
    std::string config;
    std::vector<std::string> sets;
    std::vector<std::string> pieces;
  } cases[] = {
      {quick,
       {"run.class_label=11"},
       {"--set run.class_label: key 'run.class_label': expected a class of flux1-fmnist (0 to "
        "9), found 11 (out of range)"}},
      {copy.string(),
       {"run.class_label=10"},
       {"--set run.class_label: key 'run.class_label': expected a class of flux1-fmnist"}},
      {quick,
       {"run.weights=nope.safetensors"},
       {"--set run.weights: key 'run.weights': expected a safetensors checkpoint of "
        "flux1-fmnist",
        "no such file (looked for "}},
      {copy.string(),
       {"model.preset=flux1-tiny", "run.resolution=64", "cluster.nodes=1"},
       {copy.string() + ":12: key 'run.weights': expected a safetensors checkpoint of "
                        "flux1-tiny",
        "which does not fit: "}},
      {tiny,
       {"run.heigth=64"},
       {"--set run.heigth: unknown key 'run.heigth'; did you mean 'run.height'?", "height, ",
        "width", "inpaint_image", "inpaint_mask", "inpaint_rect"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> sets;
    for (const std::string& kv : c.sets) sets.insert(sets.end(), {"--set", kv});
    const ChildResult r = run_config(c.config, sets);
    expect_user_error(r, c.pieces);
    std::vector<std::string> v_args = {"validate", c.config};
    v_args.insert(v_args.end(), sets.begin(), sets.end());
    const ChildResult v = run(v_args);
    EXPECT_EQ(v.exit_code, 2) << v.out;
    EXPECT_EQ(v.err, r.err);
  }
}

// Paths: in a file, relative to the file, then to the presets' directory (a config copied out
// of configs/ still finds its weights); from --set, relative to the working directory, then to
// the presets' directory; an error names both places looked.
TEST_F(Cli, PathsResolveBesideTheFileOrTheWorkingDirectoryThenThePresets) {
  const std::string quick = std::string(COCODIFF_SOURCE_DIR) + "/configs/quickstart.toml";
  const fs::path cwd = dir_ / "cwd";
  fs::create_directories(cwd / "pics");
  const fs::path copy = write("copy.toml", read_text(quick));
  fs::copy_file(std::string(COCODIFF_SOURCE_DIR) + "/tests/e2e/data/fmnist_test_sneaker.png",
                cwd / "pics" / "known.png");
  const auto validate = [&](const std::string& sets) {
    const std::string cmd = "cd " + cwd.string() + " && " + COCODIFF_BIN + " validate " +
                            copy.string() + " " + sets + " > " + (dir_ / "v.out").string() +
                            " 2> " + (dir_ / "v.err").string();
    const int status = std::system(cmd.c_str());
    return std::make_pair(WEXITSTATUS(status), read_text(dir_ / "v.err"));
  };
  const auto [ok, ok_err] = validate("");
  EXPECT_EQ(ok, 0) << ok_err;
  // --set: the working directory's pics/known.png, not one beside the config.
  const auto [inpaint, inpaint_err] =
      validate("--set run.inpaint_image=pics/known.png --set run.inpaint_rect=[4,8,20,10]");
  EXPECT_EQ(inpaint, 0) << inpaint_err;
  // The same path in the file is beside the file: not there, and the error says where it looked.
  std::string text = read_text(quick);
  text.replace(
      text.find("resolution = 28"), 15,
      "resolution = 28\ninpaint_image = \"pics/known.png\"\ninpaint_rect = [4, 8, 20, 10]");
  const fs::path in_file = write("in_file.toml", text);
  const ChildResult r = run({"validate", in_file.string()});
  expect_user_error(r, {in_file.string() + ":16: key 'run.inpaint_image'",
                        "no such file (looked for " + (dir_ / "pics/known.png").string() + " and ",
                        "configs/pics/known.png; a path in a config is relative to its file"});
  const auto [missing, missing_err] = validate("--set run.weights=nope.safetensors");
  EXPECT_EQ(missing, 2);
  EXPECT_NE(missing_err.find("looked for " + (cwd / "nope.safetensors").string() + " and "),
            std::string::npos)
      << missing_err;
  EXPECT_NE(missing_err.find("a --set path is relative to the working directory"),
            std::string::npos)
      << missing_err;
}

// `run` without --out writes into out/<config name>/ of the working directory, not into out/
// itself beside other runs.
TEST_F(Cli, RunWithoutOutUsesADirectoryPerConfig) {
  const fs::path cwd = dir_ / "cwd";
  fs::create_directories(cwd);
  const std::string cmd = "cd " + cwd.string() + " && " + COCODIFF_BIN + " run " +
                          (kData / "good.toml").string() + " -q > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(fs::exists(cwd / "out" / "good" / "report.json"));
  EXPECT_FALSE(fs::exists(cwd / "out" / "report.json"));
}

// A name or path read from a config never carries a control character: a newline in a string
// that reaches gnuplot's script would start a command of its own, and `!` runs a shell.
TEST_F(Cli, ControlCharactersInConfigStringsAreRefused) {
  const fs::path mark = dir_ / "planted";
  const std::string inject = "\"x\\n!touch " + mark.string() + "\\n#\"";
  const std::string g = (kData / "good.toml").string();
  for (const std::string key : {"cluster.name", "model.name"}) {
    expect_user_error(run_config(g, {"--set", key + "=" + inject, "--set", "emulator.trace=true"}),
                      {"key '" + key + "'", "control character 0x0A (a newline)"});
    const ChildResult v = run({"validate", g, "--set", key + "=" + inject});
    EXPECT_EQ(v.exit_code, 2) << v.err;
    EXPECT_NE(v.err.find("key '" + key + "'"), std::string::npos) << v.err;
  }
  expect_user_error(run_config(g, {"--set", "cluster.topology.tiers=[\"a\\nb\", \"c\"]"}),
                    {"key 'cluster.topology.tiers'", "control character 0x0A"});
  EXPECT_FALSE(fs::exists(mark)) << "a config string ran a shell command";
}

// --out never deletes what cocodiff did not write: a directory that is not an earlier output set
// is refused before the run (exit 2, naming it), and replaced only with --force.
TEST_F(Cli, OutRefusesADirectoryThatIsNotAnOutputSet) {
  const std::string g = (kData / "good.toml").string();
  fs::create_directories(out_ / "sub");
  std::ofstream(out_ / "notes.txt") << "mine\n";
  std::ofstream(out_ / "sub" / "data.csv") << "1,2\n";
  for (const std::string cmd : {"run", "compare", "tune"}) {
    std::vector<std::string> args{cmd, g, "--out", out_.string()};
    if (cmd == "tune") args.insert(args.end(), {"--nodes", "1"});
    const ChildResult r = run(args);
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(out_.string() + ": exists and is not an earlier output set of cocodiff"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << cmd << " ran before refusing";
    EXPECT_EQ(read_text(out_ / "notes.txt"), "mine\n");
    EXPECT_EQ(read_text(out_ / "sub" / "data.csv"), "1,2\n");
  }
  // --force replaces it; from then on it is an output set, replaced without --force.
  ASSERT_EQ(run_config(g, {"--force"}).exit_code, 0);
  EXPECT_FALSE(fs::exists(out_ / "notes.txt"));
  EXPECT_TRUE(fs::exists(out_ / "report.json"));
  EXPECT_TRUE(fs::exists(out_ / ".cocodiff-output"));
  EXPECT_EQ(run_config(g).exit_code, 0);
  // A set written before sets were marked (cocodiff's file names only) is replaced too; one
  // that also holds a file of the user's is not.
  const fs::path old_set = dir_ / "old_set";
  fs::create_directories(old_set / "flat");
  for (const char* f : {"report.json", "image.png", "trace.json", "flat/report.json"})
    std::ofstream(old_set / f) << "{}";
  std::ofstream(old_set / "config.toml") << "[run]\n";
  EXPECT_EQ(run({"run", g, "--out", old_set.string(), "-q"}).exit_code, 2);
  EXPECT_TRUE(fs::exists(old_set / "config.toml"));
  fs::remove(old_set / "config.toml");
  EXPECT_EQ(run({"run", g, "--out", old_set.string(), "-q"}).exit_code, 0);
  EXPECT_FALSE(fs::exists(old_set / "flat"));
  // An empty directory is taken as it is.
  const fs::path empty = dir_ / "empty";
  fs::create_directories(empty);
  EXPECT_EQ(run({"run", g, "--out", empty.string(), "-q"}).exit_code, 0);
  EXPECT_TRUE(fs::exists(empty / "report.json"));
}

// validate refuses what the kernel would refuse the run: more tiles than the process's memory
// mappings can give fiber stacks (vm.max_map_count), before anything starts.
TEST_F(Cli, RankCountsPastTheMappingLimitAreRefusedByValidateAndRun) {
  std::ifstream in("/proc/sys/vm/max_map_count");
  long limit = 0;
  if (!(in >> limit) || limit > 70000) GTEST_SKIP() << "vm.max_map_count " << limit;
  const std::string g = (kData / "good.toml").string();
  const std::vector<std::string> sets = {
      "--set", "cluster.nodes=4096",        "--set", "run.resolution=2048",
      "--set", "ulysses.uneven_heads=true", "--set", "emulator.memory_limit=1TiB"};
  std::vector<std::string> v = {"validate", g};
  v.insert(v.end(), sets.begin(), sets.end());
  const ChildResult r = run(v);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("16384 tiles need about 65536 memory mappings"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vm.max_map_count"), std::string::npos) << r.err;
  const ChildResult n = run({"netbench", g, "-g", "16384", "--set", "emulator.memory_limit=1TiB"});
  EXPECT_EQ(n.exit_code, 2) << n.err;
  EXPECT_NE(n.err.find("vm.max_map_count"), std::string::npos) << n.err;
}

// What a command prints on a full disk is an error, not an empty file and exit 0.
TEST_F(Cli, AFullStandardOutputIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string g = (kData / "good.toml").string();
  for (const std::string& args : std::vector<std::string>{" validate " + g + " --dump",
                                                          " weights flux1-tiny", " topo " + g}) {
    const std::string cmd =
        std::string(COCODIFF_BIN) + args + " > /dev/full 2> " + (dir_ / "err.txt").string();
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << cmd << ": " << status;
    EXPECT_NE(read_text(dir_ / "err.txt").find("cannot write standard output"), std::string::npos)
        << cmd << ": " << read_text(dir_ / "err.txt");
  }
}

TEST_F(Cli, OutCannotBeTheWorkingDirectory) {
  const fs::path cwd = dir_ / "cwd";
  fs::create_directories(cwd);
  std::ofstream(cwd / "config.toml") << read_text(kData / "good.toml");
  for (const std::string out : {".", "../cwd", "./"}) {
    const std::string cmd = "cd '" + cwd.string() + "' && " + COCODIFF_BIN +
                            " run config.toml --force -q --out " + out + " 2> err.txt";
    EXPECT_NE(std::system(cmd.c_str()), 0) << cmd;
    const std::string err = read_text(cwd / "err.txt");
    EXPECT_NE(err.find("is the working directory or holds it"), std::string::npos) << err;
    EXPECT_TRUE(fs::exists(cwd / "config.toml"));
  }
}

}  // namespace
}  // namespace cocodiff::test
