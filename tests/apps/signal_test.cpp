// Ctrl-C and SIGTERM end `cocodiff run` at once with a message, exit code 128 + signal, and no
// file in the --out directory (outputs are written only after a run succeeded).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

// A phantom FLUX.1-dev run on 2 Aurora nodes (24 tiles) with far more steps than a test can wait
// for: it is still running whenever the signal arrives.
ChildResult interrupt_long_run(int sig, const fs::path& dir) {
  fs::remove_all(dir);
  const fs::path out = dir / "out";
  Child c = Child::start(
      {"run", (fs::path(COCODIFF_TEST_DATA) / "good.toml").string(), "--out", out.string(), "--set",
       "model.preset=flux1-dev", "--set", "cluster.preset=aurora", "--set", "cluster.nodes=2",
       "--set", "run.resolution=1024", "--set", "run.steps=100000", "--set", "emulator.workers=2"},
      dir);
  // Wait until the plan is printed: the config is resolved and the emulator is starting.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (c.out_so_far().find("emulator ") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the fibers get going
  const auto sent = std::chrono::steady_clock::now();
  c.signal(sig);
  ChildResult r = c.wait(std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(10));
  EXPECT_FALSE(fs::exists(out) && !fs::is_empty(out)) << "files left in " << out;
  return r;
}

TEST(Signals, SigintExits130WithAMessageAndNoOutputs) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_sigint_" + std::to_string(::getpid()));
  const ChildResult r = interrupt_long_run(SIGINT, dir);
  EXPECT_EQ(r.term_signal, 0) << "killed by the signal instead of handling it";
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_EQ(r.err, "cocodiff: interrupted by SIGINT; stopped, no outputs written\n");
  EXPECT_NE(r.out.find("flux1-dev"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Signals, SigtermExits143) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_sigterm_" + std::to_string(::getpid()));
  const ChildResult r = interrupt_long_run(SIGTERM, dir);
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_EQ(r.err, "cocodiff: interrupted by SIGTERM; stopped, no outputs written\n");
  fs::remove_all(dir);
}

// The terminal closing (SIGHUP) is an interrupt like the others: a message, exit code 129.
TEST(Signals, SighupExits129WithAMessage) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_sighup_" + std::to_string(::getpid()));
  const ChildResult r = interrupt_long_run(SIGHUP, dir);
  EXPECT_EQ(r.term_signal, 0) << "killed by the signal instead of handling it";
  EXPECT_EQ(r.exit_code, 129) << r.err;
  EXPECT_EQ(r.err, "cocodiff: interrupted by SIGHUP; stopped, no outputs written\n");
  fs::remove_all(dir);
}

// Under mpirun (OMPI_COMM_WORLD_RANK set), a rank the launcher ends says so and names itself:
// mpirun sends SIGTERM to every rank when one of them fails.
TEST(Signals, RankEndedByTheLauncherSaysSo) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_launcher_" + std::to_string(::getpid()));
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  const ChildResult r = interrupt_long_run(SIGTERM, dir);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(r.exit_code, 143) << r.err;
  EXPECT_EQ(r.err,
            "cocodiff: rank 3: ended by the launcher (SIGTERM; another rank failed or the job was "
            "stopped); stopped, no outputs written\n");
  fs::remove_all(dir);
}

// A run whose stderr is a log (not a terminal) prints a progress line every few seconds: the
// step, the time elapsed and an estimate of what is left. Short runs print none.
TEST(Signals, ALongRunShowsProgressInALog) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_progress_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Child c = Child::start(
      {"run", (fs::path(COCODIFF_TEST_DATA) / "good.toml").string(), "--out",
       (dir / "out").string(), "--set", "model.preset=flux1-dev", "--set", "cluster.preset=aurora",
       "--set", "cluster.nodes=2", "--set", "run.resolution=1024", "--set", "run.steps=100000",
       "--set", "emulator.workers=2"},
      dir);
  const fs::path err = dir / "child.stderr";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_text(err).find("s left)") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  c.signal(SIGINT);
  const ChildResult r = c.wait(std::chrono::seconds(30));
  EXPECT_EQ(r.exit_code, 130) << r.err;
  const std::regex line(R"(step \d+/100000 \(\d+ s, about \d+ s left\)\n)");
  EXPECT_TRUE(std::regex_search(r.err, line)) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a log gets lines, not a rewritten one";
  fs::remove_all(dir);
}

// An interrupt while the outputs are written (here a trace of hundreds of megabytes) discards
// the staged set within a second and keeps the previous one: exit 128 + signal, never the new
// set, and nothing left beside --out.
TEST(Signals, AnInterruptWhileWritingKeepsThePreviousSet) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_sigwrite_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path out = dir / "work" / "out";
  auto args = [&](int seed) {
    return std::vector<std::string>{"run",
                                    (fs::path(COCODIFF_TEST_DATA) / "good.toml").string(),
                                    "--out",
                                    out.string(),
                                    "-q",
                                    "--set",
                                    "model.preset=flux1-dev",
                                    "--set",
                                    "cluster.preset=aurora",
                                    "--set",
                                    "cluster.nodes=2",
                                    "--set",
                                    "run.resolution=1024",
                                    "--set",
                                    "run.steps=6",
                                    "--set",
                                    "emulator.trace=true",
                                    "--set",
                                    "run.seed=" + std::to_string(seed)};
  };
  ASSERT_EQ(Child::start(args(1), dir / "first").wait(std::chrono::seconds(120)).exit_code, 0);
  const std::string old_report = read_text(out / "report.json");
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    Child c = Child::start(args(2), dir / "second");
    // The staging directory beside --out appears when the write phase starts.
    auto staging = [&] {
      for (const fs::directory_entry& e : fs::directory_iterator(dir / "work"))
        if (e.path().filename().string().rfind(".out.tmp.", 0) == 0) return true;
      return false;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!staging() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(staging()) << "no write phase seen";
    const auto sent = std::chrono::steady_clock::now();
    c.signal(sig);
    const ChildResult r = c.wait(std::chrono::seconds(60));
    EXPECT_LT(std::chrono::steady_clock::now() - sent,
              std::chrono::milliseconds(1500 * COCODIFF_TEST_TIME_SCALE));  // sanitizers: slower
    EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
    EXPECT_NE(r.err.find("stopped, no outputs written (the previous ones kept)"), std::string::npos)
        << r.err;
    EXPECT_EQ(read_text(out / "report.json"), old_report) << "signal " << sig;
    EXPECT_FALSE(staging()) << "a staging directory left beside --out";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cocodiff::test
