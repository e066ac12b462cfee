// A run's outputs are one set: a kill -9 at any point of the write phase (injected through
// $COCODIFF_TEST_KILL_AT_WRITE) leaves the --out directory holding the complete previous set or
// the complete new one, never a mix and never a temporary file; stale files of an earlier run are
// gone once a new set is in place; the next run removes what a killed one left beside --out.

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "dit/image.hpp"
#include "tests/apps/subprocess.hpp"

namespace cocodiff::test {
namespace {

namespace fs = std::filesystem;

const fs::path kData = COCODIFF_TEST_DATA;

using FileSet = std::map<std::string, std::string>;  // name -> bytes

const std::string kMarker = ".cocodiff-output";  // every set holds it

/// The set's files but its marker.
FileSet read_set(const fs::path& dir) {
  FileSet s;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().filename() != kMarker) s[e.path().filename().string()] = read_text(e.path());
  return s;
}

/// The set without the files whose bytes vary from run to run (report.json holds wall times).
FileSet stable(FileSet s) {
  s.erase("report.json");
  return s;
}

class OutputSet : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cocodiff_outset_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    ::unsetenv("COCODIFF_TEST_KILL_AT_WRITE");
    if (!HasFailure()) fs::remove_all(dir_);
  }
  ChildResult run(int seed, const fs::path& out) {
    return run_cocodiff({"run", (kData / "good.toml").string(), "--out", out.string(), "-q",
                         "--set", "run.math=real", "--set", "emulator.trace=false", "--set",
                         "run.seed=" + std::to_string(seed)},
                        dir_ / "log");
  }
  fs::path dir_;
};

TEST_F(OutputSet, AKillAtEveryWritePointLeavesTheOldSetOrTheNewOne) {
  // The two complete sets, each written into a directory of its own.
  ASSERT_EQ(run(42, dir_ / "ref_old").exit_code, 0);
  ASSERT_EQ(run(7, dir_ / "ref_new").exit_code, 0);
  fs::copy_file(kData / "good.toml", dir_ / "ref_old" / "stale.txt");  // an earlier run's file
  const FileSet old_set = read_set(dir_ / "ref_old"), new_set = read_set(dir_ / "ref_new");
  ASSERT_NE(stable(old_set), stable(new_set));

  const fs::path out = dir_ / "work" / "out";
  int kills = 0, saw_old = 0, saw_new = 0;
  for (int point = 1; point < 40; ++point) {
    // The old set in place again; what killed runs left beside it stays, for the last run.
    fs::remove_all(out);
    fs::create_directories(dir_ / "work");
    fs::copy(dir_ / "ref_old", out);
    ::setenv("COCODIFF_TEST_KILL_AT_WRITE", std::to_string(point).c_str(), 1);
    const ChildResult r = run(7, out);
    ::unsetenv("COCODIFF_TEST_KILL_AT_WRITE");
    const FileSet now = read_set(out);
    for (const auto& [name, bytes] : now)
      EXPECT_EQ(name.find(".tmp"), std::string::npos) << "temporary in --out: " << name;
    if (r.term_signal != SIGKILL) {  // past the last write point: the run completed
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(stable(now), stable(new_set));
      EXPECT_EQ(now.count("stale.txt"), 0u);
      // Nothing beside --out but the set itself: the staging directories that the killed runs
      // left are gone.
      std::vector<std::string> beside;
      for (const fs::directory_entry& e : fs::directory_iterator(dir_ / "work"))
        beside.push_back(e.path().filename().string());
      EXPECT_EQ(beside, std::vector<std::string>{"out"});
      break;
    }
    ++kills;
    const int seed = nlohmann::json::parse(now.at("report.json")).at("seed").get<int>();
    if (seed == 42) {
      EXPECT_EQ(now, old_set) << "kill at write point " << point;
      ++saw_old;
    } else {
      EXPECT_EQ(seed, 7);
      EXPECT_EQ(stable(now), stable(new_set)) << "kill at write point " << point;
      EXPECT_EQ(now.count("stale.txt"), 0u);
      ++saw_new;
    }
  }
  EXPECT_GE(kills, 4);  // every file, and the switch itself
  EXPECT_GE(saw_old, 3);
  EXPECT_GE(saw_new, 1);
}

// `compare --outputs` writes one set too: compare.json and every OUT/STRATEGY/. Every file of
// the set, read back, names one seed: the previous run's or the new one's.
class CompareSet : public OutputSet {
 protected:
  ChildResult compare(int seed, const fs::path& out, std::uint64_t file_size_limit = 0) {
    return run_cocodiff({"compare", (kData / "good.toml").string(), "--strategies", "flat,tapa",
                         "--outputs", "--out", out.string(), "--set", "emulator.trace=false",
                         "--set", "run.seed=" + std::to_string(seed)},
                        dir_ / "log", file_size_limit);
  }
  /// The seed every file of the set at `out` names; -1 when they disagree or a file is missing.
  static int seed_of_set(const fs::path& out) {
    std::vector<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(out))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    if (names != std::vector<std::string>{kMarker, "compare.json", "flat", "tapa"}) return -1;
    const nlohmann::json doc = nlohmann::json::parse(read_text(out / "compare.json"));
    const std::string set = doc.at("sets").back().get<std::string>();  // "run.seed=N"
    const int seed = std::stoi(set.substr(set.find('=') + 1));
    for (const char* s : {"flat", "tapa"}) {
      if (read_set(out / s).size() != 1) return -1;  // report.json alone (phantom, no trace)
      const nlohmann::json r = nlohmann::json::parse(read_text(out / s / "report.json"));
      if (r.at("seed").get<int>() != seed) return -1;
    }
    return seed;
  }
};

TEST_F(CompareSet, AKillAtEveryWritePointLeavesTheOldSetOrTheNewOne) {
  const fs::path ref = dir_ / "ref_old";
  ASSERT_EQ(compare(42, ref).exit_code, 0);
  ASSERT_EQ(seed_of_set(ref), 42);
  const fs::path out = dir_ / "work" / "out";
  int kills = 0, saw_old = 0, saw_new = 0;
  for (int point = 1; point < 40; ++point) {
    fs::remove_all(out);
    fs::create_directories(dir_ / "work");
    fs::copy(ref, out, fs::copy_options::recursive);
    ::setenv("COCODIFF_TEST_KILL_AT_WRITE", std::to_string(point).c_str(), 1);
    const ChildResult r = compare(7, out);
    ::unsetenv("COCODIFF_TEST_KILL_AT_WRITE");
    const int seed = seed_of_set(out);
    if (r.term_signal != SIGKILL) {  // past the last write point: the compare completed
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(seed, 7);
      std::vector<std::string> beside;
      for (const fs::directory_entry& e : fs::directory_iterator(dir_ / "work"))
        beside.push_back(e.path().filename().string());
      EXPECT_EQ(beside, std::vector<std::string>{"out"});
      break;
    }
    ++kills;
    EXPECT_TRUE(seed == 42 || seed == 7) << "kill at write point " << point << ": a mixed set";
    saw_old += seed == 42;
    saw_new += seed == 7;
  }
  EXPECT_GE(kills, 6);  // each strategy's files, compare.json and the switch
  EXPECT_GE(saw_old, 5);
  EXPECT_GE(saw_new, 1);
}

// A disk that fills while the set is written (every file capped below compare.json's size,
// which holds both strategies' reports): exit 2 naming the file, and the previous set whole.
TEST_F(CompareSet, AFullDiskLeavesThePreviousSet) {
  const fs::path out = dir_ / "out";
  ASSERT_EQ(compare(42, out).exit_code, 0);
  const std::uintmax_t report = std::max(fs::file_size(out / "flat" / "report.json"),
                                         fs::file_size(out / "tapa" / "report.json"));
  const std::uintmax_t whole = fs::file_size(out / "compare.json");
  ASSERT_GT(whole, report + report / 4);
  const ChildResult r = compare(7, out, (report + whole) / 2);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("compare.json"), std::string::npos) << r.err;
  EXPECT_EQ(seed_of_set(out), 42);
  std::vector<std::string> beside;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_))
    if (e.path().filename() != "log") beside.push_back(e.path().filename().string());
  EXPECT_EQ(beside, std::vector<std::string>{"out"});
}

// A symlink planted where a temporary would go is never written through: temporaries are made
// exclusively (O_EXCL | O_NOFOLLOW) under names that cannot be guessed. The names the writer once
// used (TARGET.tmp.PID.N), planted as links to a victim file, leave the victim untouched.
TEST(AtomicFiles, APlantedSymlinkIsNeverWrittenThrough) {
  const fs::path dir =
      fs::temp_directory_path() / ("cocodiff_symlink_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path victim = dir / "victim.txt";
  std::ofstream(victim) << "precious\n";
  const fs::path target = dir / "fit.toml";
  for (int n = 0; n < 64; ++n)
    fs::create_symlink(
        victim, target.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(n));
  fs::create_symlink(victim, dir / "image.png.tmp");
  for (int k = 0; k < 8; ++k) write_file_atomic(target, "[fit]\n");
  dit::Rgb img;
  img.width = img.height = 2;
  img.pixels.assign(12, 9);
  dit::write_png(dir / "image.png", img);
  std::filesystem::path temp;
  const int fd = create_exclusive_temp(target, temp);
  ASSERT_GE(fd, 0);
  ::close(fd);
  EXPECT_FALSE(fs::is_symlink(temp));
  EXPECT_EQ(read_text(victim), "precious\n");
  EXPECT_EQ(read_text(target), "[fit]\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cocodiff::test
