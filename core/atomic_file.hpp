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

/// Writes `contents` to `target` atomically.
void write_file_atomic(const std::filesystem::path& target, std::string_view contents);

}  // namespace cocodiff
