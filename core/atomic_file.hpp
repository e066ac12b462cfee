#pragma once
// Files that appear whole or not at all: written under a temporary name in the same directory,
// flushed, then renamed over the target. An interrupted or failed run leaves no partial output.
//
//   AtomicFile f("out/report.json");
//   f.stream() << json;
//   f.commit();          // without commit(), the destructor removes the temporary

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace cocodiff {

class AtomicFile {
 public:
  /// Opens a temporary beside `target`; throws InputError when the directory is not writable.
  explicit AtomicFile(std::filesystem::path target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  std::ofstream& stream() { return out_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  /// Flushes, checks for write errors and renames onto the target.
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  std::ofstream out_;
  bool committed_ = false;
};

/// A run's output directory written as one set: files go into a staging directory beside the
/// target (".NAME.tmp.PID"), which commit() moves into place in one step (rename, or an atomic
/// exchange with the previous set, which is then removed). A reader of the target sees the old
/// set or the new one, never a mix, and no stale file of an earlier run survives. Without
/// commit(), the destructor removes the staging directory. A process killed outright (kill -9)
/// can leave a staging directory beside the target; the next OutputSet for the same target
/// removes those whose process is gone.
///
///   OutputSet set("out");
///   write_file_atomic(set.dir() / "report.json", json);
///   set.commit();
class OutputSet {
 public:
  /// Creates the staging directory; InputError when the parent is not writable.
  explicit OutputSet(std::filesystem::path target);
  ~OutputSet();
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;

  /// Where the set's files are written before commit().
  const std::filesystem::path& dir() const { return staging_; }
  /// Moves the set into place; InputError (the target untouched) when that fails.
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path staging_;
  bool committed_ = false;
};

/// Test hook for the output path: when $COCODIFF_TEST_KILL_AT_WRITE is N, the N-th call (counted
/// from 1 over the process) kills the process with SIGKILL. No effect when the variable is unset.
void output_test_point();

/// Writes `contents` to `target` atomically.
void write_file_atomic(const std::filesystem::path& target, std::string_view contents);

}  // namespace cocodiff
