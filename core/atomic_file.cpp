#include "core/atomic_file.hpp"

#include <unistd.h>

#include <atomic>

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
  std::error_code ec;
  std::filesystem::rename(temp_, target_, ec);
  if (ec)
    throw InputError(target_.string() + ": cannot rename temporary into place: " + ec.message());
  committed_ = true;
}

void write_file_atomic(const std::filesystem::path& target, std::string_view contents) {
  AtomicFile f(target);
  f.stream().write(contents.data(), static_cast<std::streamsize>(contents.size()));
  f.commit();
}

}  // namespace cocodiff
