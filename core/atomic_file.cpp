#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ext/stdio_filebuf.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/errors.hpp"

namespace cocodiff {

namespace {

using FdBuf = __gnu_cxx::stdio_filebuf<char>;  // a streambuf over a descriptor (libstdc++)

/// A random suffix: the temporaries' names cannot be guessed and planted in advance.
std::string random_suffix() {
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08x%08x%04x", rd(), rd(), counter++ & 0xffffu);
  return buf;
}

std::string tmp_name(const std::string& base) {
  return base + ".tmp." + std::to_string(::getpid()) + "." + random_suffix();
}

}  // namespace

int create_exclusive_temp(const std::filesystem::path& target, std::filesystem::path& temp) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    temp = target.parent_path() / tmp_name(target.filename().string());
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    if (errno != EEXIST)
      throw InputError(target.string() + ": cannot create file (" + std::strerror(errno) +
                       "; is the directory writable?)");
  }
  throw InputError(target.string() + ": cannot create a temporary file beside it");
}

AtomicFile::AtomicFile(std::filesystem::path target) : target_(std::move(target)) {
  const int fd = create_exclusive_temp(target_, temp_);
  buf_ = std::make_unique<FdBuf>(fd, std::ios::out | std::ios::binary);
  out_.rdbuf(buf_.get());
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    buf_.reset();  // closes the descriptor
    std::error_code ec;
    std::filesystem::remove(temp_, ec);
  }
}

void AtomicFile::commit() {
  out_.flush();
  if (!out_) throw InputError(target_.string() + ": write failed (disk full?)");
  const bool closed = static_cast<FdBuf*>(buf_.get())->close() != nullptr;
  if (!closed) throw InputError(target_.string() + ": write failed on close (disk full?)");
  output_test_point();
  std::error_code ec;
  std::filesystem::rename(temp_, target_, ec);
  if (ec)
    throw InputError(target_.string() + ": cannot rename temporary into place: " + ec.message());
  committed_ = true;
}

namespace {
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_stopped{false};

// The test hook alone: the points after a set's rename, where the set is in place already.
void kill_test_point();
}  // namespace

void stop_outputs(int signal) { g_stop_signal = signal; }

void output_stop_check() {
  if (const int sig = g_stop_signal.load(); sig != 0) {
    g_stopped = true;
    throw OutputsStopped(sig);
  }
}

bool outputs_stopped() { return g_stopped.load(); }

void output_test_point() {
  kill_test_point();
  output_stop_check();
}

namespace {
void kill_test_point() {
  static const long kill_at = [] {
    const char* v = std::getenv("COCODIFF_TEST_KILL_AT_WRITE");
    return v == nullptr ? 0L : std::strtol(v, nullptr, 10);
  }();
  static std::atomic<long> calls{0};
  if (kill_at > 0 && ++calls == kill_at) ::kill(::getpid(), SIGKILL);
}
}  // namespace

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

bool is_within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

// A file name an output set of cocodiff holds (run, compare, tune).
bool is_output_file_name(const std::string& n) {
  static const char* const kNames[] = {
      "report.json",        "image.png",    "preview.png",   "trace.json", "timeline.png",
      "latent.safetensors", "compare.json", "tune.json",     "tune.txt",   "pareto.png",
      "rates.json",         "video.gif",    kOutputSetMarker};
  for (const char* k : kNames)
    if (n == k) return true;
  // image_N.png: a batch's images; frame_N.png: a video's frames.
  for (const std::string prefix : {"image_", "frame_"})
    if (n.size() > prefix.size() + 4 && n.rfind(prefix, 0) == 0 &&
        n.compare(n.size() - 4, 4, ".png") == 0 &&
        n.find_first_not_of("0123456789", prefix.size()) == n.size() - 4)
      return true;
  return false;
}

// Whether `dir` holds nothing but what cocodiff writes into an output set: its files, and
// (compare --outputs) directories of them; with a report.json, compare.json or tune.json. The
// sets written before sets carried kOutputSetMarker are replaced as the marked ones are.
bool is_unmarked_output_set(const std::filesystem::path& dir) {
  std::error_code ec;
  bool report = false;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory(ec)) {
      for (const auto& f : std::filesystem::directory_iterator(e.path(), ec))
        if (f.is_directory(ec) || !is_output_file_name(f.path().filename().string())) return false;
      continue;
    }
    if (!is_output_file_name(n)) return false;
    report = report || n == "report.json" || n == "compare.json" || n == "tune.json";
  }
  return !ec && report;
}

}  // namespace

void check_output_target(const std::filesystem::path& target_in, bool force) {
  std::filesystem::path target = target_in;
  while (!target.empty() && !target.has_filename()) target = target.parent_path();  // "out/"
  if (target.empty()) throw InputError("an output directory name is required");
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(target, ec))) return;
  if (!std::filesystem::is_directory(target, ec))
    throw InputError(target.string() + ": exists and is not a directory");
  const std::filesystem::path t = std::filesystem::weakly_canonical(target, ec);
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (!ec && is_within(cwd, t))
    throw InputError(target_in.string() +
                     ": is the working directory or holds it; an output set replaces its whole "
                     "directory, so name a subdirectory (for example --out out/run)");
  if (force || std::filesystem::exists(target / kOutputSetMarker, ec) ||
      is_unmarked_output_set(target))
    return;
  if (std::filesystem::is_empty(target, ec) && !ec) return;
  throw InputError(target_in.string() +
                   ": exists and is not an earlier output set of cocodiff (it has no " +
                   kOutputSetMarker +
                   "), and a new set replaces everything in its directory: choose another "
                   "--out, or pass --force to replace it");
}

OutputSet::OutputSet(std::filesystem::path target, bool force) : target_(std::move(target)) {
  while (!target_.empty() && !target_.has_filename()) target_ = target_.parent_path();  // "out/"
  if (target_.empty()) throw InputError("an output directory name is required");
  std::error_code ec;
  if (!target_.parent_path().empty()) {
    std::filesystem::create_directories(target_.parent_path(), ec);
    if (ec)
      throw InputError(target_.string() + ": cannot create output directory: " + ec.message());
  }
  check_output_target(target_, force);
  remove_stale_staging(target_);
  // Created exclusively: a directory or symlink planted under the staging name is never used.
  for (int attempt = 0;; ++attempt) {
    staging_ = target_.parent_path() / tmp_name("." + target_.filename().string());
    if (::mkdir(staging_.c_str(), 0777) == 0) break;
    if (errno != EEXIST || attempt == 63)
      throw InputError(target_.string() +
                       ": cannot create output directory: " + std::strerror(errno));
  }
  try {
    write_file_atomic(staging_ / kOutputSetMarker,
                      "An output set of cocodiff: a later command with this --out replaces the "
                      "whole directory.\n");
  } catch (...) {
    std::filesystem::remove_all(staging_, ec);
    throw;
  }
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
    kill_test_point();
    return;
  }
  if (errno != EEXIST)
    throw InputError(target_.string() +
                     ": cannot move the outputs into place: " + std::strerror(errno));
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0)
    throw InputError(target_.string() +
                     ": cannot move the outputs into place: " + std::strerror(errno));
  committed_ = true;
  kill_test_point();
  std::error_code ec;
  std::filesystem::remove_all(staging_, ec);  // the previous set
  kill_test_point();
}

void write_file_atomic(const std::filesystem::path& target, std::string_view contents) {
  AtomicFile f(target);
  f.stream().write(contents.data(), static_cast<std::streamsize>(contents.size()));
  f.commit();
}

}  // namespace cocodiff
