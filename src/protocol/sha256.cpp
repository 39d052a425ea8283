#include "protocol/sha256.hpp"

#include <openssl/evp.h>

#include <utility>

#include "sandbox/blob_store.hpp"

namespace sandbox::detail {

sha256::sha256() noexcept : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = nullptr;
  }
}

sha256::~sha256() { EVP_MD_CTX_free(ctx_); }

sha256::sha256(sha256&& other) noexcept : ctx_(std::exchange(other.ctx_, nullptr)) {}

sha256& sha256::operator=(sha256&& other) noexcept {
  if (this != &other) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

void sha256::update(const void* data, std::size_t n) noexcept {
  if (ctx_ == nullptr || n == 0) return;
  if (EVP_DigestUpdate(ctx_, data, n) != 1) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = nullptr;
  }
}

std::string sha256::hex_digest() noexcept {
  if (ctx_ == nullptr) return {};
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const bool good = EVP_DigestFinal_ex(ctx_, md, &len) == 1 && len == 32;
  EVP_MD_CTX_free(ctx_);
  ctx_ = nullptr;  // a second call returns "" instead of hashing nothing
  if (!good) return {};
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  try {
    out.resize(2 * len);
  } catch (...) {
    return {};
  }
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 0xf];
  }
  return out;
}

std::string sha256_hex(std::string_view bytes) noexcept {
  sha256 h;
  h.update(bytes);
  return h.hex_digest();
}

}  // namespace sandbox::detail

namespace sandbox {

std::string blob_id_of(std::string_view bytes) {
  std::string hex = detail::sha256_hex(bytes);
  if (hex.empty()) return {};
  return "sha256:" + hex;
}

}  // namespace sandbox
