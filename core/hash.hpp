#pragma once
// SHA-256 digests (OpenSSL) for report.json's output_sha256 and timeline_sha256.

#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace cocodiff {

/// Incremental SHA-256.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::span<const std::byte> data);
  void update(std::string_view s) {
    update(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  /// Finishes the digest: 64 lowercase hex characters.
  std::string hex();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

/// One-shot digest of a float buffer's bytes.
std::string sha256_hex(std::span<const float> data);

}  // namespace cocodiff
