#include "core/hash.hpp"

#include <openssl/evp.h>

#include "core/errors.hpp"

namespace cocodiff {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  COCO_CHECK(ctx_->md != nullptr && EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) == 1,
             "SHA-256 init");
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_->md); }

void Sha256::update(std::span<const std::byte> data) {
  COCO_CHECK(EVP_DigestUpdate(ctx_->md, data.data(), data.size()) == 1, "SHA-256 update");
}

std::string Sha256::hex() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  COCO_CHECK(EVP_DigestFinal_ex(ctx_->md, out, &len) == 1, "SHA-256 final");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < len; ++i) {
    s += kHex[out[i] >> 4];
    s += kHex[out[i] & 15];
  }
  return s;
}

std::string sha256_hex(std::span<const float> data) {
  Sha256 h;
  h.update(std::as_bytes(data));
  return h.hex();
}

}  // namespace cocodiff
