// Execution receipts: a host may sign what it observed of each run (Ed25519, RFC 8032), so
// that a result handed on to another party (an audit log, a billing system, another agent)
// can be checked later against the host's public key.
//
// A receipt document (docs/protocol.md, "Execution receipts"):
//
//   {"v":1,"receipt":{…claims…},"kid":"k1","sig":"<base64url, no padding>"}
//
// The signature covers the *signing input*: the document's canonical encoding without its
// `sig` member, `{"v":1,"receipt":<encode_claims(claims)>,"kid":"k1"}`, one line, members
// in the documented order. A verifier decodes the document strictly, re-encodes the signing
// input from the decoded values and checks the signature against those bytes, as for signed
// tickets (sandbox/signed_ticket.hpp); keys are the same kind of files
// (`sandboxctl ticket keygen`).
//
// What a receipt proves, and what it does not: docs/security.md, "Execution receipts".
#pragma once

#include <boost/system/result.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/code.hpp"
#include "sandbox/error.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox {

/// Longest receipt document `receipt_verifier::verify` reads, in bytes.
inline constexpr std::size_t max_receipt_bytes = 1 << 20;

/// A captured stream as a receipt names it: its blob and sizes (never its text).
struct receipt_stream {
  std::string blob;               ///< blob id (empty when nothing was stored)
  std::uint64_t bytes = 0;        ///< bytes in the blob
  std::uint64_t total_bytes = 0;  ///< bytes the program wrote
  bool truncated = false;
  bool operator==(const receipt_stream&) const = default;
};

/// What a receipt attests: the host's own observations of one run.
struct receipt_claims {
  std::string run_id;
  /// When the host signed it, UTC, whole seconds (wire: RFC 3339).
  std::chrono::system_clock::time_point issued_at{};
  std::string tenant;
  /// The ticket the run ran under: after an approval, the derived ticket.
  std::string ticket_id;
  /// That ticket's ancestors, root first, parent last (empty when it is not derived).
  std::vector<std::string> derived_from;
  /// For a run approved by a human (or policy service): SHA-256 (64 hex) of the approval
  /// request the derived ticket answers, `encode(approval_request)` — the exact question
  /// that was approved (`sandbox/approval.hpp`). Unset for a run that needed no approval.
  std::optional<std::string> approval_sha256;
  /// SHA-256 (64 hex) of `encode(request)` as the runtime ran it (`request_digest`, after
  /// an approval narrowed its domains).
  std::string request_sha256;
  sandbox::code code = sandbox::code::internal;
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::string backend;  ///< e.g. "process", "crun 1.8.1"
  sandbox::isolation isolation = sandbox::isolation::process;
  runtime_info runtime;  ///< runtime name and image digest
  run_usage usage;
  std::vector<egress_attempt> egress_attempts;
  std::uint32_t egress_attempts_dropped = 0;
  receipt_stream std_out;  ///< wire name "stdout"
  receipt_stream std_err;  ///< wire name "stderr"
  std::vector<output_file> files_out;
  bool operator==(const receipt_claims&) const = default;
};

/**
 * The claims for a finished run: `ticket` is the ticket it ran under (the derived one after
 * an approval), `request` the request as run, `issued_at` = `now` rounded down to the second.
 */
receipt_claims make_receipt_claims(const run_request& request, const ticket& ticket,
                                   const run_result& result,
                                   std::chrono::system_clock::time_point now);

/// The claims' canonical JSON object, one line (what the signature covers inside the
/// signing input).
std::string encode(const receipt_claims& c);

/// Why `claims` do not describe `result` (the first differing field, e.g. "run_id",
/// "stdout.blob", "files_out[1].blob"), or nullopt when they agree on every field both have.
std::optional<std::string> receipt_mismatch(const receipt_claims& claims, const run_result& result);

/**
 * Signs receipts with one Ed25519 private key. Copyable (copies share the key); thread-safe.
 *
 *   auto s = sandbox::receipt_signer::load("/etc/agent-sandbox/keys/r1.pem").value();
 *   options.receipt_signer = std::make_shared<sandbox::receipt_signer>(s);
 */
class receipt_signer {
 public:
  /// A signer from PEM text. Errors: `invalid_argument` (bad kid, or not an unencrypted
  /// Ed25519 private key).
  static result<receipt_signer> from_pem(std::string kid, std::string_view private_pem);
  /// A signer from a key file (at most 64 KiB); `kid` empty: the file's name without `.pem`.
  /// Errors: as `from_pem`, plus `not_found`, `permission_denied`, `io_error`.
  static result<receipt_signer> load(const std::filesystem::path& private_key_file,
                                     std::string kid = {});

  const std::string& kid() const noexcept;
  /// The matching public key (SubjectPublicKeyInfo PEM), for verifiers.
  std::string public_key_pem() const;
  /// The signed receipt document of `claims`. Errors: `io_error` (OpenSSL failed).
  result<std::string> sign(const receipt_claims& claims) const;

 private:
  struct impl;
  explicit receipt_signer(std::shared_ptr<const impl> p) : impl_(std::move(p)) {}
  std::shared_ptr<const impl> impl_;
};

/**
 * Checks receipt documents against trusted Ed25519 public keys, by key id. Copyable;
 * `verify` is thread-safe; adding keys is not.
 */
class receipt_verifier {
 public:
  receipt_verifier();
  /// Trusts `public_pem` under `kid`. Errors: `invalid_argument`, `already_exists`.
  result<void> add_key(std::string kid, std::string_view public_pem);
  /// Trusts a public key file, or every `<kid>.pub.pem` of a directory; returns how many.
  /// Errors: `invalid_argument`, `already_exists`, `not_found`, `permission_denied`,
  /// `io_error`.
  result<std::size_t> load_keys(const std::filesystem::path& file_or_dir);
  bool empty() const noexcept;

  /**
   * The claims of a receipt document, or an `invalid_request` rejection saying why not
   * ("receipt: …"): larger than `max_receipt_bytes`, not a strict JSON document of the
   * documented form (the message names the field, e.g. "receipt.files_out[0].blob"), an
   * unknown key id, or a signature that does not verify over the re-encoded signing input
   * ("receipt: bad signature (key 'k1')" — any altered value ends here). Never throws.
   */
  boost::system::result<receipt_claims, rejection> verify(std::string_view document) const;

 private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

}  // namespace sandbox
