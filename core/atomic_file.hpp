#pragma once
// Files that appear whole or not at all: written under a temporary name in the same directory,
// flushed, then renamed over the target. An interrupted or failed run leaves no partial output.
// Every temporary is created exclusively (O_EXCL | O_NOFOLLOW, a random name): a file or
// symlink planted where a temporary would go is never written through.
//
//   AtomicFile f("out/report.json");
//   f.stream() << json;
//   f.commit();          // without commit(), the destructor removes the temporary

#include <filesystem>
#include <memory>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>

#include "core/errors.hpp"

namespace cocodiff {

/// Creates a new file beside `target` under a name no other file has ("TARGET.tmp.PID.RANDOM"),
/// exclusively and without following a symlink, mode 0666 less the umask; returns its
/// descriptor and sets `temp` to its path. Throws InputError naming the target when the
/// directory is not writable.
int create_exclusive_temp(const std::filesystem::path& target, std::filesystem::path& temp);

class AtomicFile {
 public:
  /// Opens a temporary beside `target`; throws InputError when the directory is not writable.
  explicit AtomicFile(std::filesystem::path target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  std::ostream& stream() { return out_; }
  const std::filesystem::path& temp_path() const { return temp_; }
  /// Flushes, checks for write errors and renames onto the target.
  void commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  std::unique_ptr<std::streambuf> buf_;  // over the temporary's descriptor (atomic_file.cpp)
  std::ostream out_{nullptr};
  bool committed_ = false;
};

/// The file that marks a directory as an output set of cocodiff (written into every set). Only a
/// directory holding it, or an empty one, is ever replaced by a new set unless the user says so.
inline constexpr const char* kOutputSetMarker = ".cocodiff-output";

/// Refuses (InputError naming it) an output directory that a new set must not replace: one that
/// exists and is not a directory; the working directory or one above it; a non-empty directory
/// without kOutputSetMarker, unless `force` (--force). Commands call it before their work starts,
/// so that a refused --out costs nothing; OutputSet calls it again.
void check_output_target(const std::filesystem::path& target, bool force);

/// A run's output directory written as one set: files go into a staging directory beside the
/// target (".NAME.tmp.PID.RANDOM"), which commit() moves into place in one step (rename, or an
/// atomic exchange with the previous set, which is then removed). A reader of the target sees
/// the old set or the new one, never a mix, and no stale file of an earlier run survives. Only an
/// earlier set (or an empty directory) is replaced, unless `force` (check_output_target).
/// Without commit(), the destructor removes the staging directory. A process killed outright
/// (kill -9) can leave a staging directory beside the target; the next OutputSet for the same
/// target removes those whose process is gone.
///
///   OutputSet set("out");
///   write_file_atomic(set.dir() / "report.json", json);
///   set.commit();
class OutputSet {
 public:
  /// Checks the target (check_output_target) and creates the staging directory; InputError when
  /// the target is refused or the parent is not writable.
  explicit OutputSet(std::filesystem::path target, bool force = false);
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

/// Thrown at an output checkpoint once stop_outputs() was called (an interrupt): the file or set
/// being written is removed on the way out, and the previous one stays.
class OutputsStopped : public Error {
 public:
  explicit OutputsStopped(int signal)
      : Error("outputs stopped by signal " + std::to_string(signal)), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

/// Asks the outputs being written to stop at their next checkpoint (the interrupt watcher calls
/// it): a set not yet moved into place is discarded within a file or a few thousand records.
void stop_outputs(int signal);
/// Throws OutputsStopped once stop_outputs() was called. Long writers (the trace) call it every
/// few thousand records.
void output_stop_check();
/// Whether a checkpoint has thrown OutputsStopped: the outputs being written were discarded (no
/// set is moved into place after that, since every later checkpoint throws too).
bool outputs_stopped();

/// A checkpoint of the output path, between files and before each rename: output_stop_check(),
/// and a test hook: when $COCODIFF_TEST_KILL_AT_WRITE is N, the N-th call (counted from 1 over
/// the process) kills the process with SIGKILL. No kill when the variable is unset.
void output_test_point();

/// Writes `contents` to `target` atomically.
void write_file_atomic(const std::filesystem::path& target, std::string_view contents);

}  // namespace cocodiff
