// `cocodiff run` end to end: report fields, outputs on disk, determinism across worker counts,
// and phantom mode charging the same virtual time as real math.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The default worker count of a real-math run: the machine's hardware threads.
int hardware_threads() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

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
                          "/flux1-tiny-24tiles.toml --set run.steps=1 " + sets + " --out " +
                          out.string() + " -q";
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
                          "timeline_sha256", "bytes_by_tier", "breakdown", "memory_estimate_bytes"})
    EXPECT_TRUE(r.contains(key)) << key;
  // The estimate the run printed before it started: at least the program's own 16 MiB.
  EXPECT_GT(r["memory_estimate_bytes"].get<std::int64_t>(), std::int64_t{16} << 20);
  EXPECT_EQ(r["ranks"], 24);
  EXPECT_EQ(r["nodes"], 2);
  // A real-math run takes every hardware thread unless asked: those beyond the first run the
  // tiles' arithmetic.
  EXPECT_EQ(r["workers"], hardware_threads());
  EXPECT_EQ(r["regions_replayed"], 0);  // real math is simulated, never replayed
  EXPECT_EQ(r["tokens"], 576);
  EXPECT_EQ(r["output_sha256"].get<std::string>().size(), 64u);
  // Every tile's clock is compute plus exposed communication (aurora models no host).
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

// On a device with a host (hgx-h200: eager PyTorch's issue costs), a tile's clock is compute,
// exposed communication and the time its device waited for its host; a host-bound FLUX.1-dev
// step at 1024^2 waits for it, on every strategy, and the summary line says so. Without a host
// (aurora) it never waits.
TEST(Run, ReportSplitsTheClockIntoComputeCommunicationAndHostWait) {
  const fs::path out = temp_dir("host_wait");
  for (const char* strategy : {"flat", "flat+v_first", "flat+pipeline", "cocodiff"}) {
    for (int gpus : {2, 4}) {
      std::string nics;
      for (int g = 0; g < gpus; ++g) nics += (g ? "," : "") + std::to_string(g);
      nlohmann::json r = run_quickstart(
          out, std::string("--set model.preset=flux1-dev --set run.resolution=1024 ") +
                   "--set run.math=skip --set cluster.preset=hgx-h200 --set cluster.nodes=1 " +
                   "--set 'cluster.topology.sizes=[" + std::to_string(gpus) + "]' " +
                   "--set 'cluster.nic.rank_nic=[" + nics + "]' --set run.strategy=" + strategy);
      const nlohmann::json& b = r["breakdown"];
      const double host = b["host_wait_s"].get<double>();
      EXPECT_GT(host, 0.1 * r["virtual_time_s"].get<double>()) << strategy << " " << gpus;
      EXPECT_NEAR(b["compute_s"].get<double>() + b["exposed_comm_s"].get<double>() + host,
                  r["virtual_time_s"].get<double>(), 1e-9)
          << strategy << " " << gpus;
      EXPECT_DOUBLE_EQ(b["host_wait_fraction"].get<double>(),
                       host / r["virtual_time_s"].get<double>());
    }
  }
  const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                          "/flux1-tiny-24tiles.toml --set run.steps=1 --set run.math=skip " +
                          "--set cluster.preset=hgx-h200 --set cluster.nodes=1 " +
                          "--set model.preset=flux1-dev --set run.resolution=1024 --out " +
                          (out / "summary").string();
  const Result r = sh(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", waiting for its host "), std::string::npos) << r.output;
  nlohmann::json none = run_quickstart(out, "--set run.math=skip");
  EXPECT_EQ(none["breakdown"]["host_wait_s"].get<double>(), 0.0);
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

// Every strategy: with more than one worker, tiles hand their products, attention and whole
// sections (MLPs, FLUX single-block sides) to math threads; the bytes and the timeline stay
// those of one worker.
TEST(Run, SameBytesAndTimelineForOneTwoAndFourWorkers) {
  for (const std::string strategy :
       {"--set run.strategy=flat", "--set run.strategy=tapa", "--set run.strategy=v_first",
        "--set run.strategy=pipeline", "--set run.strategy=v_major", "--set run.strategy=cocodiff",
        "--set run.strategy=usp --ring-degree 2"}) {
    SCOPED_TRACE(strategy);
    const fs::path a = temp_dir("w1");
    nlohmann::json r1 = run_quickstart(a, strategy + " --set emulator.workers=1");
    EXPECT_EQ(r1["workers"], 1);
    for (int w : {2, 4}) {
      const fs::path b = temp_dir("w" + std::to_string(w));
      nlohmann::json r =
          run_quickstart(b, strategy + " --set emulator.workers=" + std::to_string(w));
      EXPECT_EQ(r["workers"], w);
      EXPECT_EQ(r1["output_sha256"], r["output_sha256"]) << w;
      EXPECT_EQ(r1["timeline_sha256"], r["timeline_sha256"]) << w;
      EXPECT_EQ(r1["virtual_time_s"], r["virtual_time_s"]) << w;
      fs::remove_all(b);
    }
    fs::remove_all(a);
  }
}

// Where a block's exchanges outlast what the tiles compute after it (Wan 2.1 14B at 720p with
// 81 frames on 64 Aurora nodes: no block mark is quiescent where the tiles pass it), blocks are
// judged where their tiles arrive, at their first call, and replayed from there, their calls
// free. V-Major's refresh every other step makes steps of two keys: blocks simulated and then
// replayed inside replayed steps are simulated again under the same id. With replay on and off
// the run is the same: timeline, virtual time, bytes, and every rank's strategy statistics, the
// layers of every replayed block counted.
TEST(Run, ReplayedVideoBlocksGiveTheSimulatedRunAndItsStatistics) {
  auto wan = [](const fs::path& out, bool replay) {
    const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                            "/wan-video.toml --set cluster.nodes=64 --set run.steps=6"
                            " --set model.double_blocks=4 --set v_major.refresh_every=2"
                            " --set emulator.trace=false --set emulator.workers=1"
                            " --set emulator.replay=" +
                            (replay ? "true" : "false") + " --out " + out.string() + " -q";
    Result r = sh(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    std::ifstream in(out / "report.json");
    return nlohmann::json::parse(in);
  };
  const fs::path a = temp_dir("wan_off"), b = temp_dir("wan_on");
  const nlohmann::json off = wan(a, false), on = wan(b, true);
  EXPECT_EQ(off["regions_replayed"], 0);
  EXPECT_GE(on["regions_replayed"].get<int>(), 10);
  for (const char* key : {"timeline_sha256", "virtual_time_s", "bytes_by_tier", "flows"})
    EXPECT_EQ(on[key], off[key]) << key;
  const nlohmann::json& s0 = off["strategy_stats"];
  const nlohmann::json& s1 = on["strategy_stats"];
  // Every tile's 6 steps of two passes of 4 blocks.
  EXPECT_EQ(s0["v_first"]["wan_self"]["layers"], 768 * 6 * 2 * 4);
  EXPECT_EQ(s1["v_first"]["wan_self"]["layers"], s0["v_first"]["wan_self"]["layers"]);
  for (const char* mean : {"v_proj_s", "qk_prep_s", "v_phase1_s", "v_transfer_s", "v_exposed_s"}) {
    const double x = s0["v_first"]["wan_self"][mean].get<double>();
    EXPECT_NEAR(s1["v_first"]["wan_self"][mean].get<double>(), x, 1e-9 * x) << mean;
  }
  EXPECT_EQ(s1["v_major"]["tiers"], s0["v_major"]["tiers"]);
  EXPECT_EQ(s1["v_major"]["cache_bytes_total"], s0["v_major"]["cache_bytes_total"]);
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

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The TOML of a dump without its comment lines (the summary names the config file).
std::string without_comments(const std::string& text) {
  std::string out, line;
  std::istringstream in(text);
  while (std::getline(in, line))
    if (line.rfind('#', 0) != 0) out += line + "\n";
  return out;
}

// validate --dump prints every key with its effective value (defaults, preset values, the
// resolved degrees, absolute paths) as TOML: run on the dump, from another directory, gives the
// original run's bytes and timeline, and the dump of the dump is the dump.
TEST(Run, ValidateDumpIsTheFullyResolvedConfigAndRunsTheSameRun) {
  const fs::path dir = temp_dir("dump");
  fs::create_directories(dir);
  const std::string bin = COCODIFF_BIN;
  const std::string config = std::string(COCODIFF_CONFIG_DIR) + "/flux1-tiny-24tiles.toml";
  const std::string sets =
      " --set run.steps=2 --set run.resolution=128 --set run.strategy=usp --ring-degree 2";
  Result d = sh(bin + " validate " + config + sets + " --dump > " + (dir / "d.toml").string());
  ASSERT_EQ(d.exit_code, 0) << d.output;
  const std::string dump = read_all(dir / "d.toml");
  const std::string workers = "workers = " + std::to_string(hardware_threads());
  for (const std::string& want :
       {std::string("[emulator]"), workers, std::string("replay = true"),
        std::string("[cluster.links.mdfi]"), std::string("heads = 24"),
        std::string("ring_degree = 2"), std::string("ulysses_degree = 12"),
        std::string("[v_major]"), std::string("threshold = 0.0"), std::string("ring_levels = 1")})
    EXPECT_NE(dump.find(want), std::string::npos) << want << "\n" << dump;
  Result again = sh(bin + " validate " + (dir / "d.toml").string() + " --dump > " +
                    (dir / "d2.toml").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(without_comments(read_all(dir / "d2.toml")), without_comments(dump));
  Result a = sh(bin + " run " + config + sets + " -q --out " + (dir / "a").string());
  Result b = sh("cd / && " + bin + " run " + (dir / "d.toml").string() + " -q --out " +
                (dir / "b").string());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const nlohmann::json ra = nlohmann::json::parse(read_all(dir / "a" / "report.json"));
  const nlohmann::json rb = nlohmann::json::parse(read_all(dir / "b" / "report.json"));
  EXPECT_TRUE(ra["output_sha256"].is_string());
  EXPECT_EQ(ra["strategy"], "usp");
  for (const char* key : {"output_sha256", "virtual_time_s", "timeline_sha256", "bytes_by_tier"})
    EXPECT_EQ(ra[key], rb[key]) << key;
  fs::remove_all(dir);
}

// PNG width and height from the IHDR chunk (bytes 16..23, big-endian).
std::pair<int, int> png_size(const fs::path& p) {
  const std::string b = read_all(p);
  if (b.size() < 24) return {0, 0};
  auto be32 = [&](size_t i) {
    return (static_cast<unsigned char>(b[i]) << 24) | (static_cast<unsigned char>(b[i + 1]) << 16) |
           (static_cast<unsigned char>(b[i + 2]) << 8) | static_cast<unsigned char>(b[i + 3]);
  };
  return {static_cast<int>(be32(16)), static_cast<int>(be32(20))};
}

// run.height / run.width: a rectangle (64 x 128 px: a 4 x 8 token grid of flux1-tiny on 4
// tiles), reported and drawn in its shape; run.resolution with either is refused, as is a side
// that is not a multiple of VAE x patch.
TEST(Run, HeightAndWidthMakeANonSquareImage) {
  const fs::path dir = temp_dir("rect_cfg"), out = temp_dir("rect");
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "rect.toml");
    f << "[model]\npreset = \"flux1-tiny\"\n[run]\nsteps = 1\nseed = 7\n"
         "[cluster]\npreset = \"aurora\"\nnodes = 1\n[cluster.topology]\nsizes = [2, 2]\n"
         "[cluster.nic]\nrank_nic = [0, 1, 2, 3]\n";
  }
  const std::string base = std::string(COCODIFF_BIN) + " run " + (dir / "rect.toml").string() +
                           " -q --out " + out.string();
  Result r = sh(base + " --set run.height=64 --set run.width=128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json rep = nlohmann::json::parse(read_all(out / "report.json"));
  EXPECT_EQ(rep["height"], 64);
  EXPECT_EQ(rep["width"], 128);
  EXPECT_TRUE(rep["resolution"].is_null());
  EXPECT_EQ(rep["tokens"], 32);
  // latent 8 x 16: image.png at that size, preview.png drawn 16x larger (256 wide, 128 high).
  EXPECT_EQ(png_size(out / "image.png"), std::make_pair(16, 8));
  EXPECT_EQ(png_size(out / "preview.png"), std::make_pair(256, 128));
  fs::remove_all(out);
  Result both = sh(base + " --set run.resolution=64 --set run.height=64 --set run.width=128");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.output.find("key 'run.resolution': expected either run.resolution (a square) "
                             "or run.height and run.width, not both"),
            std::string::npos)
      << both.output;
  Result one = sh(base + " --set run.height=64");
  EXPECT_EQ(one.exit_code, 2);
  EXPECT_NE(one.output.find("key 'run.width': expected run.height and run.width together"),
            std::string::npos)
      << one.output;
  Result odd = sh(base + " --set run.height=64 --set run.width=120");
  EXPECT_EQ(odd.exit_code, 2);
  EXPECT_NE(odd.output.find("key 'run.width': expected a multiple of 16"), std::string::npos)
      << odd.output;
  EXPECT_FALSE(fs::exists(out));
  fs::remove_all(dir);
}

// run.frames: a video of the tiny Wan (9 frames: 3 latent frames of 8 x 8 latent pixels, 48
// tokens on 4 tiles) writes each latent frame and its frames top to bottom, and reports frames
// and tokens; xDiT's run.num_frames is the same key; frames the VAE cannot take, frames for an
// image model and both spellings at once exit 2 naming the key, writing nothing.
TEST(Run, FramesMakeAVideoWithAFramePerLatentFrame) {
  const fs::path dir = temp_dir("video_cfg"), out = temp_dir("video"), out2 = temp_dir("video2");
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "video.toml");
    f << "[model]\npreset = \"wan-tiny\"\n[run]\nsteps = 1\nseed = 7\nresolution = 64\n"
         "[cluster]\npreset = \"aurora\"\nnodes = 1\n[cluster.topology]\nsizes = [2, 2]\n"
         "[cluster.nic]\nrank_nic = [0, 1, 2, 3]\n";
  }
  const std::string base =
      std::string(COCODIFF_BIN) + " run " + (dir / "video.toml").string() + " -q --out ";
  Result r = sh(base + out.string() + " --set run.frames=9");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json rep = nlohmann::json::parse(read_all(out / "report.json"));
  EXPECT_EQ(rep["frames"], 9);
  EXPECT_EQ(rep["latent_frames"], 3);
  EXPECT_EQ(rep["tokens"], 48);
  EXPECT_EQ(png_size(out / "image.png"), std::make_pair(8, 24));  // 3 frames of 8 x 8
  for (int k = 0; k < 3; ++k)
    EXPECT_TRUE(fs::exists(out / ("frame_" + std::to_string(k) + ".png")));
  EXPECT_FALSE(fs::exists(out / "frame_3.png"));
  EXPECT_EQ(read_all(out / "video.gif").substr(0, 6), "GIF89a");
  Result alias = sh(base + out2.string() + " --set run.num_frames=9");
  ASSERT_EQ(alias.exit_code, 0) << alias.output;
  EXPECT_EQ(nlohmann::json::parse(read_all(out2 / "report.json"))["output_sha256"],
            rep["output_sha256"]);
  fs::remove_all(out);
  fs::remove_all(out2);
  for (const auto& [sets, key] : std::vector<std::pair<std::string, std::string>>{
           {" --set run.frames=8", "key 'run.frames': expected 1 + a multiple of 4"},
           {" --set run.frames=9 --set run.num_frames=9", "key 'run.num_frames'"},
           {" --set run.frames=5 --set model.preset=\\\"flux1-tiny\\\"",
            "key 'run.frames': expected 1 for flux1-tiny"}}) {
    Result bad = sh(base + out.string() + sets);
    EXPECT_EQ(bad.exit_code, 2) << sets << "\n" << bad.output;
    EXPECT_NE(bad.output.find(key), std::string::npos) << sets << "\n" << bad.output;
    EXPECT_FALSE(fs::exists(out)) << sets;
  }
  fs::remove_all(dir);
}

// run.batch_size = 2 (--batch-size 2): the same images as two single runs seeded 7 and 8, for
// flat and cocodiff; the report sums their virtual times and lists each image.
TEST(Run, BatchOfTwoEqualsTwoSingleRunsWithTheNextSeeds) {
  const fs::path dir = temp_dir("batch");
  const std::string loud = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                           "/mpi-smoke.toml --set run.steps=1 --set run.resolution=128";
  const std::string base = loud + " -q";
  for (const char* strategy : {"flat", "cocodiff"}) {
    const std::string s = std::string(" --set run.strategy=") + strategy;
    const fs::path b = dir / (std::string(strategy) + "_b"), one = dir / "one", two = dir / "two";
    // Without -q: the run prints its summary (a batch names no single critical tile) and
    // exits 0.
    const Result batch = sh(loud + s + " --batch-size 2 --out " + b.string());
    ASSERT_EQ(batch.exit_code, 0) << batch.output;
    EXPECT_NE(batch.output.find("sum over 2 images' critical tiles"), std::string::npos)
        << batch.output;
    EXPECT_EQ(batch.output.find("internal error"), std::string::npos) << batch.output;
    ASSERT_EQ(sh(base + s + " --set run.seed=7 --out " + one.string()).exit_code, 0);
    ASSERT_EQ(sh(base + s + " --set run.seed=8 --out " + two.string()).exit_code, 0);
    const nlohmann::json rb = nlohmann::json::parse(read_all(b / "report.json"));
    const nlohmann::json r1 = nlohmann::json::parse(read_all(one / "report.json"));
    const nlohmann::json r2 = nlohmann::json::parse(read_all(two / "report.json"));
    EXPECT_EQ(rb["batch_size"], 2);
    ASSERT_EQ(rb["images"].size(), 2u);
    EXPECT_EQ(rb["images"][0]["seed"], 7);
    EXPECT_EQ(rb["images"][1]["seed"], 8);
    EXPECT_EQ(rb["images"][1]["critical_rank"], r2["breakdown"]["critical_rank"]) << strategy;
    EXPECT_EQ(rb["images"][0]["output_sha256"], r1["output_sha256"]) << strategy;
    EXPECT_EQ(rb["images"][1]["output_sha256"], r2["output_sha256"]) << strategy;
    EXPECT_EQ(rb["images"][1]["timeline_sha256"], r2["timeline_sha256"]) << strategy;
    EXPECT_NEAR(rb["virtual_time_s"].get<double>(),
                r1["virtual_time_s"].get<double>() + r2["virtual_time_s"].get<double>(), 1e-9);
    EXPECT_EQ(read_all(b / "image_1.png"), read_all(two / "image.png")) << strategy;
    EXPECT_EQ(read_all(b / "image_0.png"), read_all(one / "image.png")) << strategy;
    fs::remove_all(one);
    fs::remove_all(two);
  }
  fs::remove_all(dir);
}

// --inject-fault: exit code 3 (not 1, an internal error) and report.json alone, with status
// "failed" and the fault's kind, rank and step.
TEST(Run, InjectedFaultWritesAFailedReportNamingItsRankAndExits3) {
  const fs::path out = temp_dir("fault");
  const std::string cmd =
      std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
      "/flux1-tiny-24tiles.toml --set run.steps=3 --inject-fault rank=5,step=1 --out " +
      out.string() + " -q";
  Result r = sh(cmd);
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 5: injected fault at step 1"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(out / "report.json")) << r.output;
  std::ifstream in(out / "report.json");
  const nlohmann::json rep = nlohmann::json::parse(in);
  EXPECT_EQ(rep["status"], "failed");
  EXPECT_EQ(rep["failure"]["kind"], "fault");
  EXPECT_EQ(rep["failure"]["rank"], 5);
  EXPECT_EQ(rep["failure"]["step"], 1);
  EXPECT_TRUE(rep["output_sha256"].is_null());
  EXPECT_FALSE(fs::exists(out / "image.png"));
  EXPECT_FALSE(fs::exists(out / "trace.json"));
  fs::remove_all(out);
  Result bad = sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                  "/flux1-tiny-24tiles.toml --inject-fault rank=24,step=1 --out " + out.string());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("rank 24 does not exist; the run has 24 ranks"), std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(out));
  // Steps count from 1, as the progress line does: step 0 and step 4 of 3 do not exist.
  for (const char* step : {"0", "4"}) {
    Result none =
        sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
           "/flux1-tiny-24tiles.toml --set run.steps=3 --inject-fault rank=1,step=" + step +
           " --out " + out.string());
    EXPECT_EQ(none.exit_code, 2) << none.output;
    EXPECT_NE(none.output.find("the run has 3 steps (1 to 3, counted as the progress line counts "
                               "them)"),
              std::string::npos)
        << none.output;
  }
  // The last step is step 3.
  const Result last = sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                         "/flux1-tiny-24tiles.toml --set run.math=skip --set run.steps=3 " +
                         "--inject-fault rank=0,step=3 --out " + out.string() + " -q");
  EXPECT_EQ(last.exit_code, 3) << last.output;
  EXPECT_NE(last.output.find("rank 0: injected fault at step 3"), std::string::npos) << last.output;
  fs::remove_all(out);
}

}  // namespace

namespace {

// The quickstart runs the shipped trained weights (configs/weights/flux1-fmnist) on 24 tiles:
// the checkpoint loads by its upstream names and the run reproduces pinned output bytes on its
// own strategy (flat), on tapa and on cocodiff (both give flat's bytes on this run). The bytes
// depend on the SIMD instructions Eigen's kernels are built with (COCODIFF_NATIVE: -march=native
// sets the packet width and whether multiply-adds are fused), so one pin is kept per kind of
// build machine measured: the one this test was written on and an AVX2+FMA AMD EPYC (znver3).
// Whichever it is, the three strategies give the same bytes.
TEST(Run, ShippedWeightsOn24TilesReproduceThePinnedOutput) {
  const std::vector<std::string> pinned = {
      "8f5a9bc8aaf7d28f323202d2b8f3b2e2bfcf86c72ae833ecf4e323ef933aa8c0",   // the first
      "e951f8f152c9a8dd50ac92431d51beac4640c3712f089701970a2d83c5fc4e73"};  // znver3
  std::string first;
  for (const std::string strategy : {"", "tapa", "cocodiff"}) {
    SCOPED_TRACE(strategy.empty() ? "flat" : strategy);
    const fs::path out = temp_dir("shipped");
    const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                            "/quickstart.toml --out " + out.string() + " -q" +
                            (strategy.empty() ? "" : " --set run.strategy=" + strategy);
    Result r = sh(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    std::ifstream in(out / "report.json");
    const nlohmann::json rep = nlohmann::json::parse(in);
    EXPECT_EQ(rep["ranks"], 24);
    EXPECT_EQ(rep["tokens"], 196);
    const std::string sha = rep["output_sha256"].get<std::string>();
    EXPECT_NE(std::find(pinned.begin(), pinned.end(), sha), pinned.end()) << sha;
    if (first.empty()) first = sha;
    EXPECT_EQ(sha, first);
    EXPECT_TRUE(fs::exists(out / "image.png"));
    fs::remove_all(out);
  }
}

// trace.json on every strategy: the complete slices of each track are disjoint (Perfetto draws
// a track's slices only when they nest; the overlap these strategies make is on tracks of their
// own), every transfer is a send and a receive joined by an arrow, and there are as many sends
// as the report's flows. A trace cut at emulator.trace_limit says so on the console.
TEST(Run, TraceTracksNeverOverlapOnAnyStrategy) {
  for (const char* strategy :
       {"flat", "tapa", "v_first", "pipeline", "v_major", "cocodiff", "usp", "pipefusion"}) {
    SCOPED_TRACE(strategy);
    const fs::path out = temp_dir(std::string("trace_") + strategy);
    const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                            "/flux1-tiny-24tiles.toml --set run.math=skip --set run.steps=2" +
                            " --set v_major.warmup_steps=1 --set v_major.threshold=0.5" +
                            " --set run.strategy=" + strategy + " --out " + out.string() + " -q";
    const Result r = sh(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("truncated"), std::string::npos) << r.output;
    const nlohmann::json report = nlohmann::json::parse(read_all(out / "report.json"));
    const nlohmann::json trace = nlohmann::json::parse(read_all(out / "trace.json"));
    std::map<std::pair<int, int>, std::vector<std::pair<std::int64_t, std::int64_t>>> tracks;
    std::map<std::int64_t, int> arrow_ends;
    std::uint64_t sends = 0, recvs = 0;
    // Times in ns: ts and dur are microseconds with three decimals.
    const auto ns = [](const nlohmann::json& v) {
      return static_cast<std::int64_t>(std::llround(v.get<double>() * 1e3));
    };
    for (const nlohmann::json& e : trace["traceEvents"]) {
      if (e["ph"] == "X") {
        const std::int64_t b = ns(e["ts"]);
        tracks[{e["pid"].get<int>(), e["tid"].get<int>()}].emplace_back(b, b + ns(e["dur"]));
        sends += e["cat"] == "flow" ? 1 : 0;
        recvs += e["cat"] == "recv" ? 1 : 0;
      } else if (e["ph"] == "s" || e["ph"] == "f") {
        arrow_ends[e["id"].get<std::int64_t>()] += e["ph"] == "s" ? 1 : 2;
      }
    }
    std::size_t overlaps = 0;
    for (auto& [track, spans] : tracks) {
      std::sort(spans.begin(), spans.end());
      for (size_t i = 1; i < spans.size(); ++i)
        if (spans[i].first < spans[i - 1].second) ++overlaps;
    }
    EXPECT_EQ(overlaps, 0u);
    // By default the trace holds the last step (emulator.trace_steps = 1), and says so.
    const nlohmann::json& window = report["trace_window"];
    EXPECT_EQ(window["steps"], nlohmann::json::array({1, 1})) << report.dump();
    EXPECT_GT(window["from_virtual_s"].get<double>(), 0);
    EXPECT_NEAR(trace["otherData"]["from_us"].get<double>(),
                window["from_virtual_s"].get<double>() * 1e6, 1e-3);
    EXPECT_LT(window["flows"].get<std::uint64_t>(), report["flows"].get<std::uint64_t>());
    EXPECT_EQ(sends, window["flows"].get<std::uint64_t>());
    EXPECT_EQ(recvs, sends);
    EXPECT_EQ(arrow_ends.size(), sends);
    for (const auto& [id, ends] : arrow_ends) ASSERT_EQ(ends, 3) << "arrow " << id;
    fs::remove_all(out);
  }
  // emulator.trace_steps = 0: every step, every flow of the report.
  {
    const fs::path out = temp_dir("trace_all");
    const Result all = sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                          "/flux1-tiny-24tiles.toml --set run.math=skip --set run.steps=2" +
                          " --set emulator.trace_steps=0 --out " + out.string() + " -q");
    ASSERT_EQ(all.exit_code, 0) << all.output;
    const nlohmann::json report = nlohmann::json::parse(read_all(out / "report.json"));
    const nlohmann::json trace = nlohmann::json::parse(read_all(out / "trace.json"));
    std::uint64_t sends = 0;
    for (const nlohmann::json& e : trace["traceEvents"])
      sends += e["ph"] == "X" && e["cat"] == "flow" ? 1 : 0;
    EXPECT_EQ(sends, report["flows"].get<std::uint64_t>());
    EXPECT_EQ(report["trace_window"]["steps"], nlohmann::json::array({0, 1}));
    fs::remove_all(out);
  }
  const fs::path out = temp_dir("trace_cut");
  const Result cut = sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                        "/flux1-tiny-24tiles.toml --set run.math=skip --set run.steps=1" +
                        " --set emulator.trace_limit=1000 --out " + out.string() + " -q");
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  EXPECT_NE(cut.output.find("cocodiff: warning: the trace is truncated: trace.json and "
                            "timeline.png hold the first events only (emulator.trace_limit = "
                            "1000; the run had "),
            std::string::npos)
      << cut.output;
  fs::remove_all(out);
}

// Pipelined exchanges over more ranks than heads and tokens (80 tiles, 24 heads, 196 tokens in
// 4 chunks): members with no tokens in a chunk or no heads run the same collective as the
// others (they called all_to_all where the rest called all_to_allv), and the output is flat's.
TEST(Run, PipelinedChunksOverEmptyMembersGiveFlatsOutput) {
  const fs::path dir = temp_dir("empty_members");
  const std::string base = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                           "/quickstart.toml --set run.steps=2 --set emulator.trace=false "
                           "--set cluster.nodes=8 --set cluster.topology.sizes=[2,5] "
                           "--set cluster.nic.rank_nic=[0,1,2,3,0,1,4,5,6,7] "
                           "--set parallel.ulysses_degree=80 --set parallel.ring_degree=1 "
                           "--set pipeline.chunks=4 --set ulysses.uneven_heads=true -q";
  std::string flat;
  for (const std::string s : {"flat", "flat+v_first+pipeline", "tapa+v_first+pipeline"}) {
    for (const std::string math : {"real", "skip"}) {
      Result r = sh(base + " --set run.strategy=" + s + " --set run.math=" + math + " --out " +
                    (dir / "out").string());
      ASSERT_EQ(r.exit_code, 0) << s << " " << math << "\n" << r.output;
      if (math == "skip") continue;  // phantom: the collectives agree, no values to compare
      std::ifstream in(dir / "out" / "report.json");
      const std::string sha = nlohmann::json::parse(in)["output_sha256"].get<std::string>();
      if (flat.empty()) flat = sha;
      EXPECT_EQ(sha, flat) << s;
    }
  }
  fs::remove_all(dir);
}

// The share of V blocks a phantom V-Major run sends by default is measured, not assumed: the
// shipped trained models (the image quickstart and the video model, each with cocodiff at the
// default threshold) send that share of their blocks in real math.
TEST(Run, ThePhantomVMajorDefaultIsTheShareTheTrainedModelsSend) {
  const fs::path dir = temp_dir("v_major_default");
  const std::string cfg = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR;
  const std::vector<std::string> runs = {
      cfg + "/quickstart.toml",
      cfg +
          "/video.toml --set parallel.ulysses_degree=24 --set parallel.ring_degree=1 "
          "--set ulysses.uneven_heads=true"};
  for (const std::string& run : runs) {
    const std::string base = run + " --set run.strategy=cocodiff --set emulator.trace=false -q";
    Result real = sh(base + " --out " + (dir / "real").string());
    ASSERT_EQ(real.exit_code, 0) << run << "\n" << real.output;
    std::ifstream rin(dir / "real" / "rates.json");
    const double measured = nlohmann::json::parse(rin)["v_major"]["active_fraction"].get<double>();
    Result ph = sh(base + " --set run.math=skip --out " + (dir / "phantom").string());
    ASSERT_EQ(ph.exit_code, 0) << run << "\n" << ph.output;
    std::ifstream pin(dir / "phantom" / "report.json");
    const nlohmann::json v = nlohmann::json::parse(pin)["strategy_stats"]["v_major"];
    EXPECT_NEAR(v["phantom_active_fraction"].get<double>(), measured, 0.01) << run;
    EXPECT_NEAR(v["tiers"]["inter-node"]["active_block_fraction"].get<double>(), measured, 0.01)
        << run;
  }
  fs::remove_all(dir);
}

// A class label the model does not have is a config error (exit 2), with nothing written.
// A real run with a step cache writes the steps it skipped to rates.json; a phantom run named
// to it skips the same steps and moves the same bytes; the ways to misuse the file exit 2.
TEST(Run, StepCacheRatesFeedAPhantomRunOfTheSameBytes) {
  const fs::path dir = temp_dir("rates");
  const std::string base = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                           "/quickstart.toml --set run.steps=8 --set emulator.trace=false "
                           "--set step_cache.policy=teacache -q";
  Result real = sh(base + " --out " + (dir / "real").string());
  ASSERT_EQ(real.exit_code, 0) << real.output;
  std::ifstream rin(dir / "real" / "report.json");
  const nlohmann::json r = nlohmann::json::parse(rin);
  ASSERT_TRUE(fs::exists(dir / "real" / "rates.json"));
  const nlohmann::json& sc = r["step_cache"];
  EXPECT_EQ(sc["policy"], "teacache");
  EXPECT_EQ(sc["threshold"], 0.4);
  EXPECT_FALSE(sc["skipped_steps"].empty());
  EXPECT_EQ(r["measured_rates"]["step_cache"]["skipped"], sc["skipped_steps"]);
  const std::string rates = (dir / "real" / "rates.json").string();
  Result ph = sh(base + " --set run.math=skip --set run.measured_rates=" + rates + " --out " +
                 (dir / "phantom").string());
  ASSERT_EQ(ph.exit_code, 0) << ph.output;
  std::ifstream pin(dir / "phantom" / "report.json");
  const nlohmann::json p = nlohmann::json::parse(pin);
  EXPECT_EQ(p["step_cache"]["skipped_steps"], sc["skipped_steps"]);
  EXPECT_EQ(p["bytes_by_tier"], r["bytes_by_tier"]);
  EXPECT_EQ(p["virtual_time_s"], r["virtual_time_s"]);
  EXPECT_EQ(p["measured_rates_from"]["model"], "flux1-fmnist");
  EXPECT_FALSE(fs::exists(dir / "phantom" / "rates.json"));  // a phantom run measures nothing
  // At another step count the measured skips land on the same places of the schedule: step j
  // of 15 takes the decision of step round(j x 7 / 14) of the 8 measured; step 0 always runs.
  Result ph15 =
      sh(base + " --set run.math=skip --set run.steps=15 --set run.measured_rates=" + rates +
         " --out " + (dir / "phantom15").string());
  ASSERT_EQ(ph15.exit_code, 0) << ph15.output;
  std::ifstream p15in(dir / "phantom15" / "report.json");
  const nlohmann::json p15 = nlohmann::json::parse(p15in);
  const std::vector<int> measured = sc["skipped_steps"].get<std::vector<int>>();
  std::vector<int> expected;
  for (int j = 1; j < 15; ++j)
    if (std::find(measured.begin(), measured.end(), (j * 7 + 7) / 14) != measured.end())
      expected.push_back(j);
  EXPECT_EQ(p15["step_cache"]["skipped_steps"].get<std::vector<int>>(), expected);
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(std::find(expected.begin(), expected.end(), 14), expected.end());  // the last runs
  // Misuse: no rates in a phantom run, rates in a real run, another policy, not a rates file.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {" --set run.math=skip", "a phantom run has no values to decide which steps to skip"},
      {" --set run.measured_rates=" + rates, "no measured rates in a real-math run"},
      {" --set run.math=skip --set step_cache.policy=first_block --set run.measured_rates=" + rates,
       "step_cache measured with policy \"teacache\""},
      {" --set run.math=skip --set run.measured_rates=" + (dir / "real" / "image.png").string(),
       "not JSON"}};
  for (const auto& [sets, message] : bad) {
    const fs::path out = dir / "bad";
    Result b = sh(base + sets + " --out " + out.string());
    EXPECT_EQ(b.exit_code, 2) << sets << "\n" << b.output;
    EXPECT_NE(b.output.find(message), std::string::npos) << sets << "\n" << b.output;
    EXPECT_FALSE(fs::exists(out)) << sets;
  }
  fs::remove_all(dir);
}

TEST(Run, ResidualExchangesBeatFp8OnTheTrainedModel) {
  // The quickstart's trained model: a step's change of the exchanged activations is small, so
  // 4-bit residuals send less than FP8 and lose less, against the exact run the report names.
  const fs::path dir = temp_dir("residual");
  const std::string base = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                           "/quickstart.toml --set emulator.trace=false -q";
  std::map<std::string, nlohmann::json> rep;
  for (const char* c : {"none", "fp8", "residual"}) {
    Result r = sh(base + " --set compress.all_to_all=" + c + " --out " + (dir / c).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream in(dir / c / "report.json");
    rep[c] = nlohmann::json::parse(in);
  }
  const auto total = [](const nlohmann::json& r) {
    std::int64_t t = 0;
    for (const auto& [tier, b] : r["bytes_by_tier"].items()) t += b.get<std::int64_t>();
    return t;
  };
  EXPECT_LT(total(rep["residual"]), total(rep["fp8"]));
  EXPECT_LT(total(rep["fp8"]), total(rep["none"]));
  const double psnr_fp8 = rep["fp8"]["quality"]["latent_psnr_db"].get<double>();
  const double psnr_res = rep["residual"]["quality"]["latent_psnr_db"].get<double>();
  EXPECT_GT(psnr_res, psnr_fp8 + 10) << psnr_res << " dB against " << psnr_fp8;
  EXPECT_FALSE(rep["residual"]["quality"]["bitwise_equal"].get<bool>());
  // A phantom run of the same shape moves the same bytes in the same virtual time.
  Result ph = sh(base + " --set compress.all_to_all=residual --set run.math=skip --out " +
                 (dir / "phantom").string());
  ASSERT_EQ(ph.exit_code, 0) << ph.output;
  std::ifstream pin(dir / "phantom" / "report.json");
  const nlohmann::json p = nlohmann::json::parse(pin);
  EXPECT_EQ(p["bytes_by_tier"], rep["residual"]["bytes_by_tier"]);
  EXPECT_EQ(p["virtual_time_s"], rep["residual"]["virtual_time_s"]);
  fs::remove_all(dir);
}

TEST(Run, ClassLabelOutOfRangeExitsTwoAndWritesNothing) {
  const fs::path out = temp_dir("bad_class");
  const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                          "/quickstart.toml --set run.class_label=10 --out " + out.string();
  Result r = sh(cmd);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--set run.class_label: key 'run.class_label': expected a class of "
                          "flux1-fmnist (0 to 9), found 10 (out of range)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(out / "report.json"));
  EXPECT_FALSE(fs::exists(out / "image.png"));
  fs::remove_all(out);
}

}  // namespace

namespace {

// The fp32 tensor "latent" of a latent.safetensors file.
std::vector<float> read_latent(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, ' ');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const nlohmann::json h = nlohmann::json::parse(header);
  const std::uint64_t b = h["latent"]["data_offsets"][0], e = h["latent"]["data_offsets"][1];
  std::vector<float> v((e - b) / 4);
  in.seekg(static_cast<std::streamoff>(8 + n + b));
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(e - b));
  return v;
}

// Inpainting on every strategy: outside run.inpaint_rect the final image is the known picture
// (a held-back Fashion-MNIST test image), exactly: the sampler's blend at sigma 0 keeps it.
TEST(Run, InpaintingKeepsTheKnownRegionOnEveryStrategy) {
  const std::string data = std::string(COCODIFF_SOURCE_DIR) + "/tests/e2e/data/";
  for (const char* strategy : {"flat", "tapa", "cocodiff", "usp"}) {
    const fs::path out = temp_dir(std::string("inpaint_") + strategy);
    const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                            "/quickstart.toml --set run.steps=2 --set run.class_label=7" +
                            " --set run.inpaint_image=" + data + "fmnist_test_sneaker.png" +
                            " --set run.inpaint_rect=[4,8,20,10] --set run.save_latent=true" +
                            " --set emulator.trace=false --set run.strategy=" + strategy +
                            " --out " + out.string() + " -q";
    Result r = sh(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    const std::vector<float> a = read_latent(out / "latent.safetensors");
    const std::vector<float> known = read_latent(fs::path(data) / "fmnist_test_sneaker.latent");
    ASSERT_EQ(a.size(), 28u * 28u);
    ASSERT_EQ(known.size(), a.size());
    int kept = 0, changed = 0;
    for (int y = 0; y < 28; ++y)
      for (int x = 0; x < 28; ++x) {
        const size_t i = static_cast<size_t>(y) * 28 + x;
        const bool inside = x >= 4 && x < 24 && y >= 8 && y < 18;
        if (!inside) {
          EXPECT_EQ(a[i], known[i]) << strategy << " pixel " << x << "," << y;
          ++kept;
        } else if (a[i] != known[i]) {
          ++changed;
        }
      }
    EXPECT_EQ(kept, 28 * 28 - 200);
    EXPECT_GT(changed, 100) << strategy;  // the rectangle is generated, not copied
    fs::remove_all(out);
  }
}

// A 28 x 28 run writes a 28 x 28 image.png (and a 252 x 252 preview.png): the picture itself,
// which inpainting takes back as its known image.
TEST(Run, ImageIsWrittenAtItsOwnSizeAndFeedsInpainting) {
  const fs::path first = temp_dir("native"), second = temp_dir("native_again");
  const std::string base = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                           "/quickstart.toml --set run.steps=1 --set emulator.trace=false -q";
  Result r = sh(base + " --out " + first.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(png_size(first / "image.png"), std::make_pair(28, 28));
  EXPECT_EQ(png_size(first / "preview.png"), std::make_pair(252, 252));
  r = sh(base + " --set run.inpaint_image=" + (first / "image.png").string() +
         " --set run.inpaint_rect=[0,0,14,28] --out " + second.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(png_size(second / "image.png"), std::make_pair(28, 28));
  fs::remove_all(first);
  fs::remove_all(second);
}

// Bad inpainting inputs exit 2 with nothing written.
TEST(Run, BadInpaintingInputsExitTwoAndWriteNothing) {
  const std::string data = std::string(COCODIFF_SOURCE_DIR) + "/tests/e2e/data/";
  const std::string base = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                           "/quickstart.toml --set run.steps=1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--set run.inpaint_image=" + data + "wrong_size_27.png --set run.inpaint_rect=[0,0,4,4]",
       "expected a 28 x 28 PNG (run.resolution)"},
      {"--set run.inpaint_image=" + data +
           "fmnist_test_sneaker.png --set "
           "run.inpaint_rect=[20,0,10,4]",
       "[x, y, width, height] inside the 28 x 28 image"},
      {"--set run.inpaint_image=" + data + "fmnist_test_sneaker.png",
       "run.inpaint_image with run.inpaint_rect or run.inpaint_mask"},
      {"--set run.inpaint_image=" + data + "missing.png --set run.inpaint_rect=[0,0,4,4]",
       "missing.png\": no such file (looked for " + data + "missing.png;"},
  };
  for (const auto& [sets, message] : cases) {
    const fs::path out = temp_dir("bad_inpaint");
    Result r = sh(base + sets + " --out " + out.string());
    EXPECT_EQ(r.exit_code, 2) << sets << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << sets;
  }
}

// run.inpaint_mask: a PNG whose white pixels are the region of run.inpaint_rect gives the
// rectangle's output bytes (final latent and image), on the flat and cocodiff strategies.
// tests/e2e/data/mask_*.png were written by bench/paper/data/export_fmnist_test.py's PNG writer.
TEST(Run, InpaintMaskGivesTheRectanglesBytes) {
  const std::string data = std::string(COCODIFF_SOURCE_DIR) + "/tests/e2e/data/";
  for (const char* strategy : {"flat", "cocodiff"}) {
    std::string sha[2];
    for (int i = 0; i < 2; ++i) {
      const fs::path out = temp_dir(std::string("mask_") + strategy + std::to_string(i));
      const std::string region =
          i == 0 ? " --set run.inpaint_rect=[4,8,20,10]"
                 : " --set run.inpaint_mask=" + data + "mask_rect_4_8_20_10.png";
      const std::string cmd = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                              "/quickstart.toml --set run.steps=2 --set run.class_label=7" +
                              " --set run.inpaint_image=" + data + "fmnist_test_sneaker.png" +
                              region +
                              " --set emulator.trace=false --set run.strategy=" + strategy +
                              " --out " + out.string() + " -q";
      Result r = sh(cmd);
      ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
      std::ifstream in(out / "report.json");
      sha[i] = nlohmann::json::parse(in)["output_sha256"].get<std::string>();
      std::ifstream png(out / "image.png", std::ios::binary);
      sha[i] += std::string(std::istreambuf_iterator<char>(png), {});
      fs::remove_all(out);
    }
    EXPECT_EQ(sha[0], sha[1]) << strategy;
  }
}

// Bad masks exit 2 naming the key, with nothing written.
TEST(Run, BadInpaintMasksExitTwoAndWriteNothing) {
  const std::string data = std::string(COCODIFF_SOURCE_DIR) + "/tests/e2e/data/";
  const std::string base = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                           "/quickstart.toml --set run.steps=1 --set run.inpaint_image=" + data +
                           "fmnist_test_sneaker.png ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--set run.inpaint_mask=" + data + "mask_wrong_size_28x27.png",
       "key 'run.inpaint_mask': expected a 28 x 28 PNG (run.resolution)"},
      {"--set run.inpaint_mask=" + data + "mask_corrupt.png",
       "key 'run.inpaint_mask': expected a 28 x 28 PNG"},
      {"--set run.inpaint_mask=" + data + "mask_not_png.png", "not a readable PNG"},
      {"--set run.inpaint_mask=" + data + "mask_black.png",
       "a mask with at least one nonzero (white) pixel"},
      {"--set run.inpaint_mask=" + data +
           "mask_rect_4_8_20_10.png --set run.inpaint_rect=[4,8,20,10]",
       "found both run.inpaint_mask and run.inpaint_rect"},
  };
  for (const auto& [sets, message] : cases) {
    const fs::path out = temp_dir("bad_mask");
    Result r = sh(base + sets + " --out " + out.string());
    EXPECT_EQ(r.exit_code, 2) << sets << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << sets;
  }
  // A mask without a known picture.
  const fs::path out = temp_dir("bad_mask_alone");
  Result r = sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                "/quickstart.toml --set run.steps=1 --set run.inpaint_mask=" + data +
                "mask_rect_4_8_20_10.png --out " + out.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("found run.inpaint_mask alone"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out));
}

// run.motion belongs to a model conditioned on motions (wan-fmnist): one of its motions, named in
// report.json beside the item's class; another name, or the key for a model without motions, is
// refused naming the key (exit 2, nothing written).
TEST(Run, MotionIsOneOfTheModelsMotionsAndOnlyForAModelWithThem) {
  const std::string video = std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                            "/video.toml --set run.math=skip --set run.steps=1 -q";
  const fs::path out = temp_dir("motion");
  const Result up = sh(video + " --set run.motion=\\\"up\\\" --out " + out.string());
  ASSERT_EQ(up.exit_code, 0) << up.output;
  std::ifstream in(out / "report.json");
  const nlohmann::json r = nlohmann::json::parse(in);
  EXPECT_EQ(r["motion"], "up");
  EXPECT_EQ(r["class_label"], 9);
  EXPECT_EQ(r["frames"], 8);
  fs::remove_all(out);
  const Result bad = sh(video + " --set run.motion=\\\"sideways\\\" --out " + out.string());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("run.motion"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("right"), std::string::npos) << bad.output;
  const Result image = sh(std::string(COCODIFF_BIN) + " run " + COCODIFF_CONFIG_DIR +
                          "/quickstart.toml --set run.math=skip --set run.motion=\\\"up\\\" -q" +
                          " --out " + out.string());
  EXPECT_EQ(image.exit_code, 2) << image.output;
  EXPECT_NE(image.output.find("run.motion"), std::string::npos) << image.output;
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
