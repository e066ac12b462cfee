// `cocodiff run` end to end: report fields, outputs on disk, determinism across worker counts,
// and phantom mode charging the same virtual time as real math.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Result {
  int exit_code;
  std::string output;
};

Result sh(const std::string& cmd) {
  Result r{-1, ""};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) r.output += buf;
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("cocodiff_e2e_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

nlohmann::json run_quickstart(const fs::path& out, const std::string& sets) {
  const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                          "/quickstart.toml --set run.steps=1 " + sets + " --out " + out.string() +
                          " -q";
  Result r = sh(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  std::ifstream in(out / "report.json");
  return nlohmann::json::parse(in);
}

TEST(Run, ReportHasEveryFieldAndOutputsExist) {
  const fs::path out = temp_dir("fields");
  nlohmann::json r = run_quickstart(out, "");
  for (const char* key : {"backend", "strategy", "model", "ranks", "nodes", "math", "steps",
                          "resolution", "tokens", "virtual_time_s", "wall_time_s", "output_sha256",
                          "timeline_sha256", "bytes_by_tier", "breakdown"})
    EXPECT_TRUE(r.contains(key)) << key;
  EXPECT_EQ(r["ranks"], 24);
  EXPECT_EQ(r["nodes"], 2);
  EXPECT_EQ(r["tokens"], 576);
  EXPECT_EQ(r["output_sha256"].get<std::string>().size(), 64u);
  // Every tile's clock is compute plus exposed communication.
  const nlohmann::json& b = r["breakdown"];
  EXPECT_NEAR(b["compute_s"].get<double>() + b["exposed_comm_s"].get<double>(),
              r["virtual_time_s"].get<double>(), 1e-9);
  for (const char* tier : {"die-to-die", "intra-node", "inter-node"})
    EXPECT_GT(r["bytes_by_tier"][tier].get<double>(), 0) << tier;
  EXPECT_TRUE(fs::exists(out / "image.png"));
  EXPECT_TRUE(fs::exists(out / "trace.json"));
  for (const fs::directory_entry& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "leftover " << e.path();
  fs::remove_all(out);
}

// A lossy run (V-Major at threshold 0.5 across the quickstart's 2 nodes, selective from step
// 1) reports its quality against the same run at threshold 0; an exact one reports none.
TEST(Run, LossyRunReportsItsQualityAgainstTheExactRun) {
  const fs::path out = temp_dir("quality");
  const std::string lossy =
      "--set run.steps=2 --set run.strategy=cocodiff --set v_major.warmup_steps=1";
  nlohmann::json r = run_quickstart(out, lossy + " --set v_major.threshold=0.5");
  ASSERT_TRUE(r.contains("quality")) << r.dump(2);
  const nlohmann::json& q = r["quality"];
  EXPECT_NE(q["reference"].get<std::string>().find("threshold = 0"), std::string::npos);
  EXPECT_EQ(q["bitwise_equal"], false);
  EXPECT_GT(q["latent_relative_l2"].get<double>(), 0.0);
  EXPECT_LT(q["latent_relative_l2"].get<double>(), 0.5);
  EXPECT_GT(q["latent_psnr_db"].get<double>(), 10.0);
  EXPECT_GT(q["latent_ssim"].get<double>(), 0.5);
  EXPECT_LE(q["preview_ssim"].get<double>(), 1.0);
  EXPECT_GT(r["strategy_stats"]["v_major"]["tiers"]["inter-node"]["bytes_saved"].get<double>(),
            0.0);
  // The exact run's bytes are those of the same strategy at threshold 0.
  const fs::path exact_out = temp_dir("quality_exact");
  nlohmann::json e = run_quickstart(exact_out, lossy + " --set v_major.threshold=0");
  EXPECT_FALSE(e.contains("quality"));
  EXPECT_NE(e["output_sha256"], r["output_sha256"]);
  fs::remove_all(out);
  fs::remove_all(exact_out);
}

TEST(Run, SameBytesAndTimelineForOneAndTwoWorkers) {
  const fs::path a = temp_dir("w1"), b = temp_dir("w2");
  nlohmann::json r1 = run_quickstart(a, "--set emulator.workers=1");
  nlohmann::json r2 = run_quickstart(b, "--set emulator.workers=2");
  EXPECT_EQ(r1["output_sha256"], r2["output_sha256"]);
  EXPECT_EQ(r1["timeline_sha256"], r2["timeline_sha256"]);
  EXPECT_EQ(r1["virtual_time_s"], r2["virtual_time_s"]);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Run, PhantomChargesTheSameVirtualTimeAsRealMath) {
  const fs::path a = temp_dir("real"), b = temp_dir("skip");
  nlohmann::json real = run_quickstart(a, "--set emulator.trace=false");
  nlohmann::json skip = run_quickstart(b, "--set emulator.trace=false --set run.math=skip");
  EXPECT_EQ(real["virtual_time_s"], skip["virtual_time_s"]);
  EXPECT_EQ(real["timeline_sha256"], skip["timeline_sha256"]);
  EXPECT_EQ(real["bytes_by_tier"], skip["bytes_by_tier"]);
  EXPECT_TRUE(skip["output_sha256"].is_null());
  EXPECT_FALSE(fs::exists(b / "image.png"));
  fs::remove_all(a);
  fs::remove_all(b);
}

}  // namespace

namespace {

TEST(Run, InjectedFaultIsReportedWithItsRankAndLeavesNoOutputs) {
  const fs::path out = temp_dir("fault");
  const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                          "/quickstart.toml --set run.steps=3 --inject-fault rank=5,step=1 --out " +
                          out.string() + " -q";
  Result r = sh(cmd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("rank 5: injected fault at step 1"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
  Result bad = sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                  "/quickstart.toml --inject-fault rank=24,step=0 --out " + out.string());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("rank 24 does not exist; the run has 24 ranks"), std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
