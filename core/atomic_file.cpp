#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/errors.hpp"

namespace cocodiff {

namespace {
std::atomic<unsigned> g_counter{0};  // distinct temporaries for files written at the same time
}

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  temp_ = target_;
  temp_ += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_counter++);
  out_.open(temp_, std::ios::binary | std::ios::trunc);
  if (!out_)
    throw InputError(target_.string() + ": cannot create file (is the directory writable?)");
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    out_.close();
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
  }
}

void AtomicFile::commit() {
  out_.flush();
  if (!out_) throw InputError(target_.string() + ": write failed (disk full?)");
  out_.close();
  output_test_point();
  std::error_code ec;
  std::filesystem::rename(temp_, target_, ec);
  if (ec)
    throw InputError(target_.string() + ": cannot rename temporary into place: " + ec.message());
  committed_ = true;
}

void output_test_point() {
  static const long kill_at = [] {
    const char* v = std::getenv("COCODIFF_TEST_KILL_AT_WRITE");
    return v == nullptr ? 0L : std::strtol(v, nullptr, 10);
  }();
  static std::atomic<long> calls{0};
  if (kill_at > 0 && ++calls == kill_at) ::kill(::getpid(), SIGKILL);
}

namespace {

/// ".NAME.tmp." for the target's staging directories (hidden, beside it).
std::string staging_prefix(const std::filesystem::path& target) {
  return "." + target.filename().string() + ".tmp.";
}

/// Removes staging directories of `target` left by processes that no longer exist.
void remove_stale_staging(const std::filesystem::path& target) {
  std::error_code ec;
  const std::filesystem::path parent =
      target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path();
  const std::string prefix = staging_prefix(target);
  for (const auto& e : std::filesystem::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() ||
        (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
      std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace

OutputSet::OutputSet(std::filesystem::path target) : target_(std::move(target)) {
  while (!target_.empty() && !target_.has_filename()) target_ = target_.parent_path();  // "out/"
  if (target_.empty()) throw InputError("an output directory name is required");
  std::error_code ec;
  if (!target_.parent_path().empty()) {
    std::filesystem::create_directories(target_.parent_path(), ec);
    if (ec)
      throw InputError(target_.string() + ": cannot create output directory: " + ec.message());
  }
  if (std::filesystem::exists(target_, ec) && !std::filesystem::is_directory(target_, ec))
    throw InputError(target_.string() + ": exists and is not a directory");
  remove_stale_staging(target_);
  staging_ = target_.parent_path() / (staging_prefix(target_) + std::to_string(::getpid()) + "." +
                                      std::to_string(g_counter++));
  std::filesystem::create_directory(staging_, ec);
  if (ec) throw InputError(target_.string() + ": cannot create output directory: " + ec.message());
}

OutputSet::~OutputSet() {
  if (!committed_) {
    std::error_code ec;
    std::filesystem::remove_all(staging_, ec);
  }
}

void OutputSet::commit() {
  output_test_point();
  // No target yet: a plain rename. Otherwise exchange the two directories in one step (Linux
  // renameat2), then remove the previous set, now under the staging name.
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) == 0) {
    committed_ = true;
    output_test_point();
    return;
  }
  if (errno != EEXIST)
    throw InputError(target_.string() +
                     ": cannot move the outputs into place: " + std::strerror(errno));
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0)
    throw InputError(target_.string() +
                     ": cannot move the outputs into place: " + std::strerror(errno));
  output_test_point();
  std::error_code ec;
  std::filesystem::remove_all(staging_, ec);  // the previous set
  committed_ = true;
  output_test_point();
}

void write_file_atomic(const std::filesystem::path& target, std::string_view contents) {
  AtomicFile f(target);
  f.stream().write(contents.data(), static_cast<std::streamsize>(contents.size()));
  f.commit();
}

}  // namespace cocodiff
