// Incremental SHA-256 (OpenSSL EVP) with lowercase hex output; the one hash behind blob ids
// and OCI digests (private to src/).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

struct evp_md_ctx_st;

namespace sandbox::detail {

/**
 * Incremental SHA-256. Feed bytes with `update`, then call `hex_digest` once.
 *
 *   sha256 h;
 *   h.update("abc");
 *   std::string hex = h.hex_digest();  // "ba7816bf…"
 *
 * Never throws. If OpenSSL fails (allocation), `ok()` turns false and `hex_digest` returns
 * an empty string, which never equals a real digest. Not thread-safe; move-only.
 */
class sha256 {
 public:
  sha256() noexcept;
  ~sha256();
  sha256(sha256&& other) noexcept;
  sha256& operator=(sha256&& other) noexcept;
  sha256(const sha256&) = delete;
  sha256& operator=(const sha256&) = delete;

  /// Adds `n` bytes at `data` to the hash.
  void update(const void* data, std::size_t n) noexcept;
  /// Adds `bytes` to the hash.
  void update(std::string_view bytes) noexcept { update(bytes.data(), bytes.size()); }

  /// Finishes the hash: 64 lowercase hex digits, or "" after a failure or a second call.
  std::string hex_digest() noexcept;

  /// False once OpenSSL failed; the digest is then unusable.
  bool ok() const noexcept { return ctx_ != nullptr; }

 private:
  evp_md_ctx_st* ctx_ = nullptr;
};

/// Lowercase hex SHA-256 of `bytes` ("" only if OpenSSL fails).
std::string sha256_hex(std::string_view bytes) noexcept;

}  // namespace sandbox::detail
