// `cocodiff compare` end to end: one table, compare.json with one entry per strategy, speedup
// over flat, and quality against the exact run (real math): TAPA is bitwise flat, a lossy V-Major
// is not.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

// A host-bound model on the reference host: one DiT-XL/2 forward at 256^2 on one H200 takes its
// 28 blocks' and the outside's counted host time (configs/measurements/h200x1-hostprofile/
// reference_host.csv, hgx-h200's 4.6 us a call), the device's work behind it, and its compute.
TEST(Compare, TheReferenceHostTimesEachBlockOfAHostBoundModel) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_reference_host_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path config = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "quickstart.toml";
  double vt[2] = {0, 0}, compute = 0;
  for (const int ref : {0, 1}) {
    const fs::path out = dir / (ref ? "ref" : "eager");
    std::vector<std::string> args = {"run", config.string(), "--out", out.string(), "-q"};
    for (const char* s : {"model.preset=dit-xl-2", "cluster.preset=hgx-h200", "cluster.nodes=1",
                          "cluster.topology.sizes=[1]", "cluster.nic.rank_nic=[0]",
                          "run.strategy=serial", "run.math=skip", "run.steps=1",
                          "run.resolution=256", "run.cfg_scale=1", "emulator.trace=false"}) {
      args.emplace_back("--set");
      args.emplace_back(s);
    }
    if (ref) {
      args.emplace_back("--set");
      args.emplace_back("cluster.device.host.framework=reference");
    }
    const ChildResult r = run_cocodiff(args, dir);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(out / "report.json");
    const nlohmann::json rep = nlohmann::json::parse(in);
    vt[ref] = rep["virtual_time_s"].get<double>();
    if (ref) compute = rep["breakdown"]["compute_s"].get<double>();
  }
  // 28 x (674.9 + 62 x 4.6) + (450 + 39 x 4.6) us of host; the device runs behind it.
  const double host = (28 * (674.9 + 62 * 4.6) + (450 + 39 * 4.6)) * 1e-6;
  EXPECT_GE(vt[1], host);
  EXPECT_LE(vt[1], host + compute);
  EXPECT_GT(vt[1], 2 * vt[0]);  // this project's FLUX op costs issue DiT's ops far faster
  fs::remove_all(dir);
}

TEST(Compare, TableAndJsonWithSpeedupAndQuality) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_compare_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path config = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "flux1-tiny-24tiles.toml";
  const ChildResult r = run_cocodiff(
      {"compare", config.string(), "--strategies", "tapa,cocodiff", "--set", "run.resolution=192",
       "--set", "run.steps=3", "--set", "v_major.warmup_steps=1", "--set", "v_major.threshold=2",
       "--set", "emulator.workers=2", "--out", (dir / "out").string()},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("speedup"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", strategies flat, tapa, cocodiff\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[3/3] cocodiff"), std::string::npos) << r.err;  // progress lines
  std::ifstream in(dir / "out" / "compare.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  const nlohmann::json& e = doc["entries"];
  ASSERT_EQ(e.size(), 3u);  // flat (the reference, run on demand), tapa, cocodiff
  EXPECT_EQ(e[0]["strategy"], "flat");
  EXPECT_TRUE(e[0]["reference_only"].get<bool>());
  EXPECT_DOUBLE_EQ(e[0]["speedup_vs_flat"].get<double>(), 1.0);
  EXPECT_GT(e[1]["speedup_vs_flat"].get<double>(), 1.0);  // TAPA beats flat across 2 nodes
  EXPECT_TRUE(e[1]["quality"]["bitwise_equal"].get<bool>());
  EXPECT_EQ(e[1]["quality"]["latent_relative_l2"].get<double>(), 0.0);
  // Threshold 2: after the warm-up step, blocks are only sent when they changed by more than
  // twice their size, so the output drifts and inter-node bytes drop.
  EXPECT_FALSE(e[2]["quality"]["bitwise_equal"].get<bool>());
  EXPECT_GT(e[2]["quality"]["latent_relative_l2"].get<double>(), 0.0);
  EXPECT_LT(e[2]["bytes_by_tier"]["inter-node"].get<double>(),
            e[1]["bytes_by_tier"]["inter-node"].get<double>());
  EXPECT_TRUE(e[2]["strategy_stats"].contains("v_major"));
  EXPECT_TRUE(e[2]["strategy_stats"].contains("v_first"));
  EXPECT_EQ(r.out.find("host_wait_s"), std::string::npos) << r.out;  // aurora models no host
  // On a device with a host, a column says how long the critical tile waited for it.
  const ChildResult h = run_cocodiff(
      {"compare", config.string(), "--strategies", "v_first", "--set", "run.math=skip", "--set",
       "run.steps=1", "--set", "model.preset=flux1-dev", "--set", "run.resolution=1024", "--set",
       "cluster.preset=hgx-h200", "--set", "cluster.nodes=1", "--out", (dir / "host").string()},
      dir);
  ASSERT_EQ(h.exit_code, 0) << h.out << h.err;
  EXPECT_NE(h.out.find("host_wait_s"), std::string::npos) << h.out;
  fs::remove_all(dir);
}

// Data-dependent accelerations beside the strategies: each technique on each listed strategy,
// with its bytes and its quality against the exact run, and --lossy naming the fastest entry
// that keeps the PSNR asked for.
TEST(Compare, TechniquesRunOnEveryStrategyAndLossyNamesTheFastestThatKeepsItsPsnr) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_compare_tech_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path config = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "quickstart.toml";
  const ChildResult r = run_cocodiff({"compare", config.string(), "--strategies", "flat,tapa",
                                      "--techniques", "residual,teacache=0.4", "--lossy", "30",
                                      "--set", "run.steps=8", "--out", (dir / "out").string()},
                                     dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(dir / "out" / "compare.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  const nlohmann::json& e = doc["entries"];
  ASSERT_EQ(e.size(), 6u);
  const std::vector<std::string> want = {
      "flat", "tapa", "flat+residual", "tapa+residual", "flat+teacache=0.4", "tapa+teacache=0.4"};
  double best_time = 1e30;
  std::string best;
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i]["entry"], want[i]);
    const nlohmann::json& q = e[i]["quality"];
    const bool keeps = q["preview_psnr_db"].is_string() || q["preview_psnr_db"].get<double>() >= 30;
    if (keeps && e[i]["virtual_time_s"].get<double>() < best_time) {
      best_time = e[i]["virtual_time_s"].get<double>();
      best = want[i];
    }
  }
  const auto total = [](const nlohmann::json& x) {
    double t = 0;
    for (const auto& [tier, b] : x["bytes_by_tier"].items()) t += b.get<double>();
    return t;
  };
  EXPECT_LT(total(e[3]), total(e[1]));  // residuals send less than TAPA's exact exchanges
  EXPECT_FALSE(e[3]["quality"]["bitwise_equal"].get<bool>());
  EXPECT_FALSE(e[5]["step_cache"]["skipped_steps"].empty());  // TeaCache skipped steps
  EXPECT_LT(e[5]["virtual_time_s"].get<double>(), e[1]["virtual_time_s"].get<double>());
  EXPECT_EQ(doc["lossy"]["fastest"], best);
  EXPECT_NE(r.out.find("fastest with a preview of at least 30.0 dB PSNR: " + best),
            std::string::npos)
      << r.out;
  // A technique it does not know, and --lossy on phantom math, are refused before any run.
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--techniques", "int2"},
        std::vector<std::string>{"--lossy", "30", "--set", "run.math=skip"}}) {
    std::vector<std::string> args = {"compare", config.string(), "--out", (dir / "bad").string()};
    args.insert(args.end(), bad.begin(), bad.end());
    const ChildResult b = run_cocodiff(args, dir);
    EXPECT_EQ(b.exit_code, 2) << b.err;
    EXPECT_NE(b.err.find(bad[0]), std::string::npos) << b.err;
    EXPECT_EQ(b.err.find("done in"), std::string::npos) << b.err;  // nothing ran
    EXPECT_FALSE(fs::exists(dir / "bad"));
  }
  fs::remove_all(dir);
}

// What V-Major did, per entry: the V bytes it saved and the fraction of blocks it sent. With
// every block active (phantom_active_fraction = 1) it saves nothing and sends its block masks on
// top: the table shows a negative saving, a note says so, and another says that v_major is
// slower than tapa, one of its own mechanisms, alone.
TEST(Compare, ShowsWhatVMajorSavedAndWhenAMechanismLoses) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_compare_vmajor_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path config = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "flux1-tiny-24tiles.toml";
  const ChildResult r =
      run_cocodiff({"compare", config.string(), "--strategies", "tapa,v_major", "--set",
                    "run.math=skip", "--set", "run.steps=2", "--set", "v_major.warmup_steps=1",
                    "--set", "v_major.phantom_active_fraction=1", "--out", (dir / "out").string()},
                   dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("V_saved_GB  active"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("100.0%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: v_major: V-Major at v_major.threshold = 0.02 saved nothing: it "
                       "sent "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(" is slower than tapa alone ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("v_major cost more than they save here"), std::string::npos) << r.out;
  // A lossless entry shows no V-Major figures.
  std::istringstream lines(r.out);
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("tapa ", 0) == 0) {
      EXPECT_NE(l.find(" -       -"), std::string::npos) << l;
    }
  }
  fs::remove_all(dir);
}

// The notes say why V-Major did what it did: a warm-up that covers every step (V in full, at any
// threshold), and a lossy threshold's quality; no figure prints as -0.0000.
TEST(Compare, VMajorNotesNameTheWarmUpAndTheQualityLost) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_compare_notes_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string quick =
      (fs::path(COCODIFF_SOURCE_DIR) / "configs" / "quickstart.toml").string();
  const ChildResult warm = run_cocodiff({"compare", quick, "--strategies", "cocodiff", "--set",
                                         "run.steps=2", "--out", (dir / "a").string()},
                                        dir);
  ASSERT_EQ(warm.exit_code, 0) << warm.err;
  EXPECT_NE(warm.out.find("V-Major's warm-up (v_major.warmup_steps = 2) covers all 2 steps"),
            std::string::npos)
      << warm.out;
  EXPECT_EQ(warm.out.find("raise v_major.threshold"), std::string::npos) << warm.out;
  EXPECT_EQ(warm.out.find("-0.0000"), std::string::npos) << warm.out;
  const ChildResult lossy = run_cocodiff({"compare", quick, "--strategies", "cocodiff", "--set",
                                          "v_major.threshold=0.3", "--out", (dir / "b").string()},
                                         dir);
  ASSERT_EQ(lossy.exit_code, 0) << lossy.err;
  EXPECT_NE(lossy.out.find("note: cocodiff: V-Major at v_major.threshold = 0.3 is lossy"),
            std::string::npos)
      << lossy.out;
  fs::remove_all(dir);
}

// Progress through a pipe: whole lines (a step line every few seconds, a line when an entry is
// done), none rewritten with \r, so entries running side by side never run together.
TEST(Compare, ProgressThroughAPipeIsWholeLines) {
  const std::string config =
      (fs::path(COCODIFF_SOURCE_DIR) / "configs" / "flux1-tiny-24tiles.toml").string();
  const fs::path out =
      fs::temp_directory_path() / ("cocodiff_compare_pipe_" + std::to_string(::getpid()));
  const std::string cmd = std::string(COCODIFF_BIN) + " compare " + config +
                          " --strategies tapa --set run.math=skip --set run.steps=3 --out " +
                          out.string() + " 2>&1 >/dev/null | cat";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string err;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) err.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << err;
  EXPECT_EQ(err.find('\r'), std::string::npos) << err;
  std::vector<std::string> lines;
  std::istringstream in(err);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  // Each entry says once when it is done (step lines come every few seconds: none in a run of
  // well under one).
  for (const char* entry : {" flat ", " tapa "}) {
    const auto done = std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.find(entry) != std::string::npos && l.find(" done in ") != std::string::npos;
    });
    EXPECT_EQ(done, 1) << entry << "\n" << err;
  }
  fs::remove_all(out);
}

// compare runs its strategies side by side (one worker each): every entry is the report that
// `cocodiff run` gives for that strategy alone, timeline included.
TEST(Compare, SideBySideRunsEqualSeparateRuns) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_compare_par_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path config = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "quickstart.toml";
  const std::vector<std::string> sets = {"--set",       "run.math=skip", "--set",
                                         "run.steps=3", "--set",         "emulator.workers=1"};
  std::vector<std::string> args = {"compare", config.string(), "--strategies", "tapa,cocodiff,usp"};
  args.insert(args.end(), sets.begin(), sets.end());
  args.insert(args.end(), {"--out", (dir / "out").string()});
  const ChildResult r = run_cocodiff(args, dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(dir / "out" / "compare.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  const nlohmann::json& e = doc["entries"];
  ASSERT_EQ(e.size(), 4u);
  for (const nlohmann::json& entry : e) {
    const std::string s = entry["strategy"].get<std::string>();
    std::vector<std::string> one = {"run",   config.string(),       "--set", "run.strategy=" + s,
                                    "--set", "emulator.trace=false"};
    one.insert(one.end(), sets.begin(), sets.end());
    one.insert(one.end(), {"--out", (dir / s).string(), "-q"});
    const ChildResult rr = run_cocodiff(one, dir);
    ASSERT_EQ(rr.exit_code, 0) << rr.out << rr.err;
    std::ifstream rin(dir / s / "report.json");
    const nlohmann::json rep = nlohmann::json::parse(rin);
    EXPECT_EQ(entry["timeline_sha256"], rep["timeline_sha256"]) << s;
    EXPECT_EQ(entry["virtual_time_s"], rep["virtual_time_s"]) << s;
    EXPECT_EQ(entry["bytes_by_tier"], rep["bytes_by_tier"]) << s;
  }
  fs::remove_all(dir);
}

// PipeFusion beside flat on the trained model: its quality against flat (lossy, stale K/V after
// its warm-up step), and the techniques on every other strategy, none on it.
TEST(Compare, PipeFusionReportsItsQualityAndTakesNoTechnique) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_compare_pf_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path config = fs::path(COCODIFF_SOURCE_DIR) / "configs" / "quickstart.toml";
  const ChildResult r = run_cocodiff(
      {"compare", config.string(), "--strategies", "flat,pipefusion", "--techniques", "fp8",
       "--set", "run.steps=4", "--set", "cluster.nodes=1", "--out", (dir / "out").string()},
      dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(dir / "out" / "compare.json");
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<std::string> names;
  for (const nlohmann::json& e : doc["entries"])
    names.push_back(e["strategy"].get<std::string>() +
                    (e["technique"].is_null() ? "" : "+" + e["technique"].get<std::string>()));
  EXPECT_EQ(names, (std::vector<std::string>{"flat", "pipefusion", "flat+fp8"}));
  const nlohmann::json& pf = doc["entries"][1];
  EXPECT_EQ(pf["pipefusion"]["degree"], 4) << pf.dump();  // 12 tiles, 5 blocks: 4 x 3
  const double psnr = pf["quality"]["preview_psnr_db"].get<double>();
  EXPECT_GT(psnr, 20.0);
  EXPECT_LT(psnr, 80.0);  // lossy: not the exact run
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cocodiff::test
