// Private: Ed25519 keys, signing and verification through OpenSSL 3's EVP interface, shared
// by signed tickets (signed_ticket.cpp) and execution receipts (receipt.cpp). Not installed.
#pragma once

#include <openssl/evp.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/error.hpp"

namespace sandbox::detail {

/// Longest key file read, in bytes.
inline constexpr std::size_t max_key_file_bytes = 64 * 1024;
/// Size of an Ed25519 signature, in bytes.
inline constexpr std::size_t ed25519_signature_bytes = 64;

struct pkey_deleter {
  void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_deleter>;

/// The `errc` for a failed file call's errno (ENOENT → not_found, EACCES → permission_denied…).
boost::system::error_code key_file_error(int err);

/// Reads a small regular file (a key file): at most `max_key_file_bytes` (`too_large`).
result<std::string> read_key_file(const std::filesystem::path& path);

/// An Ed25519 private key from PKCS#8 PEM; null for anything else (an encrypted key is
/// refused, never prompted for).
pkey_ptr read_private_pem(std::string_view pem);
/// An Ed25519 public key from SubjectPublicKeyInfo PEM; null for anything else.
pkey_ptr read_public_pem(std::string_view pem);
/// PEM text of a memory BIO, or nullopt.
std::optional<std::string> public_pem_of(EVP_PKEY* k);
/// PEM text of a private key (PKCS#8), or nullopt.
std::optional<std::string> private_pem_of(EVP_PKEY* k);

/// The raw 64-byte signature of `message`, or nullopt when OpenSSL fails.
std::optional<std::string> ed25519_sign(EVP_PKEY* k, std::string_view message);
/// True when `sig` is a valid signature of `message` under `k`.
bool ed25519_verify(EVP_PKEY* k, std::string_view message, std::string_view sig);

/// "k1" from ".../k1.pub.pem" (or ".../k1.pem"; `strip_pub` also strips ".pub").
std::string kid_from_file_name(const std::filesystem::path& p, bool strip_pub);

/// A private Ed25519 key and its key id: what ticket and receipt signers hold.
struct ed25519_signing_key {
  std::string kid;
  pkey_ptr key;
};

/// The key of PEM text `private_pem` under `kid` (`is_valid_key_id`). Errors:
/// `invalid_argument` (a bad key id, or not an Ed25519 private key).
result<ed25519_signing_key> make_signing_key(std::string kid, std::string_view private_pem);

/// The key in `file`; an empty `kid` is taken from the file name ("k1.pem" → "k1"). Errors:
/// those of `read_key_file` and `make_signing_key`.
result<ed25519_signing_key> load_signing_key(const std::filesystem::path& file, std::string kid);

/**
 * Trusted Ed25519 public keys by key id. Copies share the key objects but not the map:
 * adding a key to one copy leaves the others as they were. Lookups are thread-safe; adding
 * keys is not.
 */
class ed25519_keyring {
 public:
  /// Trusts `public_pem` under `kid`. Errors: `invalid_argument` (bad kid, not an Ed25519
  /// public key), `already_exists`.
  result<void> add_key(std::string kid, std::string_view public_pem);
  /// Trusts one public key file; `kid` empty: the file's name without `.pub.pem` / `.pem`.
  result<void> load_key(const std::filesystem::path& file, std::string kid = {});
  /// Trusts a key file, or every `<kid>.pub.pem` of a directory (all or nothing); returns
  /// how many keys were added. `not_found` for a directory without any key.
  result<std::size_t> load_keys(const std::filesystem::path& file_or_dir);
  /// The key of `kid`, or null.
  EVP_PKEY* find(std::string_view kid) const;
  bool empty() const noexcept { return keys_.empty(); }
  /// The key ids, sorted.
  std::vector<std::string> key_ids() const;

 private:
  std::map<std::string, std::shared_ptr<EVP_PKEY>, std::less<>> keys_;
};

}  // namespace sandbox::detail
