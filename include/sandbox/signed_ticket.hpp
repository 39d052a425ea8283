// Signed tickets: tickets that cross a process boundary (to the service daemon, or stored
// for resuming a run after its approval) travel as signed documents, Ed25519 (RFC 8032).
//
// A signed ticket document (docs/protocol.md, "Signed tickets"):
//
//   {"v":1,"ticket":{…the ticket JSON…},"kid":"k1","sig":"<base64url, no padding>"}
//
// and for a derived ticket also `"parent":{…the parent's signed document…}` after `ticket`,
// so the whole derivation chain comes along and every link is checked. The signature covers
// the *signing input*: the document's canonical encoding without its `sig` member,
// `{"v":1,"ticket":<encode(ticket)>[,"parent":<canonical parent document>],"kid":"k1"}`, one
// line, members in that order. A verifier decodes the document strictly, re-encodes the
// signing input from the decoded values, and checks the signature against those bytes: the
// ticket it returns is exactly the one whose encoding was signed, whatever whitespace or
// escapes the document used.
//
// Keys have ids (`kid`) so they can be rotated: a verifier holds several public keys by id;
// sign with the new key, keep the old public key until its tickets have expired, then drop
// it. Key files: `<kid>.pem` (PKCS#8 private key, mode 0600) and `<kid>.pub.pem`
// (SubjectPublicKeyInfo public key), as `write_ed25519_key_files` writes them.
#pragma once

#include <boost/system/result.hpp>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/error.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox {

/// Longest signed ticket document `ticket_verifier::verify` reads, in bytes.
inline constexpr std::size_t max_signed_ticket_bytes = 256 * 1024;

/// True for a key id: 1..64 characters from `[A-Za-z0-9._-]`, starting with a letter or
/// digit (a key id names key files).
constexpr bool is_valid_key_id(std::string_view kid) noexcept { return is_valid_tenant(kid); }

/// An Ed25519 key pair as PEM text.
struct ed25519_key_pem {
  std::string private_pem;  ///< PKCS#8, "-----BEGIN PRIVATE KEY-----"; keep it secret
  std::string public_pem;   ///< SubjectPublicKeyInfo, "-----BEGIN PUBLIC KEY-----"
};

/// A fresh Ed25519 key pair from OpenSSL's random generator. Errors: `io_error` (OpenSSL
/// failed).
result<ed25519_key_pem> generate_ed25519_key();

/// Writes a fresh key pair to `<dir>/<kid>.pem` (mode 0600) and `<dir>/<kid>.pub.pem` (mode
/// 0644), never replacing or following an existing entry. Errors: `invalid_argument` (kid
/// syntax), `already_exists`, `not_found` (no such directory), `permission_denied`,
/// `io_error`.
result<void> write_ed25519_key_files(const std::filesystem::path& dir, std::string_view kid);

/**
 * Signs tickets with one Ed25519 private key. Copyable (copies share the key); thread-safe.
 *
 *   auto signer = sandbox::ticket_signer::load("/etc/agent-sandbox/keys/k1.pem").value();
 *   std::string doc = signer.sign(ticket).value();   // send this to the daemon
 */
class ticket_signer {
 public:
  /// A signer from PEM text. Errors: `invalid_argument` (bad kid, or not an Ed25519 private
  /// key; an encrypted key is refused, never prompted for).
  static result<ticket_signer> from_pem(std::string kid, std::string_view private_pem);
  /// A signer from a key file (at most 64 KiB). `kid` empty: the file's name without `.pem`
  /// (`k1.pem` → "k1"). Errors: as `from_pem`, plus `not_found`, `permission_denied`,
  /// `io_error`.
  static result<ticket_signer> load(const std::filesystem::path& private_key_file,
                                    std::string kid = {});

  /// The key id written into documents.
  const std::string& kid() const noexcept;
  /// The matching public key (SubjectPublicKeyInfo PEM), for verifiers.
  std::string public_key_pem() const;

  /// The signed document of a ticket that is not derived. Errors: `invalid_argument` for a
  /// derived ticket (sign it with its parent's document), `io_error` (OpenSSL failed).
  result<std::string> sign(const ticket& t) const;
  /// The signed document of a derived ticket, embedding `parent_document` (its parent's
  /// signed document, re-encoded canonically). The parent's signature is not checked here
  /// (a verifier does), but its structure is: `invalid_argument` when the document does not
  /// decode, its ticket is not `t`'s parent, or `t` breaks a derivation rule that does not
  /// depend on the time (`check_derivation`; expiry against the clock is the verifier's).
  result<std::string> sign(const ticket& t, std::string_view parent_document) const;

 private:
  struct impl;
  explicit ticket_signer(std::shared_ptr<const impl> p) : impl_(std::move(p)) {}
  std::shared_ptr<const impl> impl_;
};

/**
 * Checks signed ticket documents against trusted Ed25519 public keys, by key id. Copyable;
 * `verify` is thread-safe; adding keys is not (set the verifier up before sharing it).
 *
 *   sandbox::ticket_verifier v;
 *   v.load_keys("/etc/agent-sandbox/trusted").value();     // every <kid>.pub.pem there
 *   auto t = v.verify(doc, std::chrono::system_clock::now());
 *   if (!t) return sandbox::rejected_result(t.error());     // action_denied, with why
 */
class ticket_verifier {
 public:
  ticket_verifier();

  /// Trusts `public_pem` under `kid`. Errors: `invalid_argument` (bad kid, not an Ed25519
  /// public key), `already_exists` (the kid is taken).
  result<void> add_key(std::string kid, std::string_view public_pem);
  /// Trusts one public key file (at most 64 KiB). `kid` empty: the file's name without
  /// `.pub.pem` (or `.pem`). Errors: as `add_key`, plus `not_found`, `permission_denied`,
  /// `io_error`.
  result<void> load_key(const std::filesystem::path& public_key_file, std::string kid = {});
  /// Trusts a key file, or every `<kid>.pub.pem` of a directory (other entries ignored).
  /// Returns how many keys were added; errors as `load_key` (nothing is added from a
  /// directory with a bad key file), `not_found` for a directory without any key.
  result<std::size_t> load_keys(const std::filesystem::path& file_or_dir);

  /// True when no key is trusted (then every document is refused).
  bool empty() const noexcept;
  /// The trusted key ids, sorted.
  std::vector<std::string> key_ids() const;

  /**
   * The ticket of a signed document, or an `action_denied` rejection saying why not
   * ("signed ticket: …"): more than `max_signed_ticket_bytes`, not a strict JSON document of
   * the documented form (the message names the field), an unknown key id, a signature that
   * does not verify (tampered), a derived ticket without its parent's document (or a parent
   * document on a ticket that is not derived), a link that is not a valid derivation of its
   * parent (`check_derivation` at `now`), or any ticket of the chain expired at `now`
   * ("signed ticket: expired"). Every link of the chain must be signed by a trusted key.
   * Never throws or crashes on hostile input.
   */
  boost::system::result<ticket, rejection> verify(std::string_view document,
                                                  std::chrono::system_clock::time_point now) const;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

/// True when `json` is a JSON object with a `"sig"` member at its top level (a signed
/// document rather than a bare ticket); false for anything else, malformed text included.
bool is_signed_ticket_document(std::string_view json);

}  // namespace sandbox
