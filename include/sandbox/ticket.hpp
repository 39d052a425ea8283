// Capability tickets: *whether* code may run, for which tenant, at what isolation level, and
// with which ceilings. The sandbox decides what the code can touch while it runs; the ticket
// decides whether it runs at all.
//
// A `ticket` cannot be built from parts by ordinary code: only a `ticket_issuer` mints one.
// Dangerous grants (network) need an explicit tag type, so they are visible at the call site
// (the pattern of Sandbox2's `allowlists/*.h`). What a ticket does not grant is denied.
#pragma once

#include <boost/system/result.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sandbox/code.hpp"
#include "sandbox/error.hpp"
#include "sandbox/protocol.hpp"

namespace sandbox {

/// Actions a ticket may grant. Wire strings: "code.execute", "code.network".
enum class action : std::uint8_t {
  code_execute,  ///< run code at all
  code_network,  ///< let the code reach the network (through the host's egress proxy)
};

/// Wire string of `a`, e.g. "code.execute".
constexpr std::string_view to_string(action a) noexcept {
  return a == action::code_execute ? std::string_view{"code.execute"}
                                   : std::string_view{"code.network"};
}

/// Tag that must be passed to `ticket_issuer::issue` to grant `code.network`. Its constructor
/// is explicit so a grant cannot come from `{}`.
struct network_grant {
  explicit network_grant() = default;
};

/// What an issuer is asked to mint. Plain data; carries no authority by itself.
struct ticket_spec {
  std::string id;      ///< 1..128 printable ASCII characters, unique per issuer
  std::string tenant;  ///< see `is_valid_tenant`
  bool execute = true; ///< grant `code.execute`
  /// Minimum isolation level for runs under this ticket.
  sandbox::isolation isolation = sandbox::isolation::process;
  std::chrono::milliseconds max_timeout{8000};      ///< ceiling for `run_request.timeout`
  std::uint64_t max_memory_bytes = 512ULL << 20;    ///< ceiling for `memory_limit_bytes`
  /**
   * Optional pin of the runtime image: its manifest digest, `sha256:` and 64 lowercase hex
   * digits (`is_valid_blob_id` syntax; anything else makes `issue` fail). Absent (the
   * default): runs use whatever image the host has installed.
   *
   * When set, every run under this ticket must use exactly that image, whatever the request
   * says: admission answers `digest_mismatch` when the installed image of the request's
   * runtime has another digest (the host rolled its image forward or back since the ticket
   * was issued), and when the request pins a different `runtime_digest` of its own. So a
   * run approved or checkpointed against one image never silently runs on another. A runtime
   * serves only its current image (the one resolved when the `runtime` was created), so the
   * pin selects nothing: it only refuses to run on anything else.
   *
   *     ticket_spec{.id = "t-1", .tenant = "acme",
   *                 .runtime_digest = result.runtime.digest}  // the image the first run used
   */
  std::optional<std::string> runtime_digest;
  bool operator==(const ticket_spec&) const = default;
};

/// True for a tenant name of 1..64 characters from `[A-Za-z0-9._-]`, starting with a letter
/// or digit. Tenant names become directory names in stores, so nothing else is accepted.
constexpr bool is_valid_tenant(std::string_view t) noexcept {
  if (t.empty() || t.size() > 64) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(t.front())) return false;
  for (char c : t) {
    if (!alnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

/// An immutable capability. Copyable; comparable. Obtain one from a `ticket_issuer`.
class ticket {
 public:
  const std::string& id() const noexcept { return spec_.id; }
  const std::string& tenant() const noexcept { return spec_.tenant; }
  /// True when the ticket grants `a`.
  bool allows(action a) const noexcept {
    return a == action::code_execute ? spec_.execute : network_;
  }
  /// Minimum isolation level for runs under this ticket.
  sandbox::isolation isolation() const noexcept { return spec_.isolation; }
  std::chrono::milliseconds max_timeout() const noexcept { return spec_.max_timeout; }
  std::uint64_t max_memory_bytes() const noexcept { return spec_.max_memory_bytes; }
  /// The pinned runtime image digest (see `ticket_spec::runtime_digest`), or `std::nullopt`
  /// when the ticket accepts whatever image is installed. Valid syntax whenever set.
  const std::optional<std::string>& runtime_digest() const noexcept { return spec_.runtime_digest; }
  bool operator==(const ticket&) const = default;

 private:
  friend class ticket_issuer;
  ticket(ticket_spec spec, bool network) : spec_(std::move(spec)), network_(network) {}
  ticket_spec spec_;
  bool network_ = false;
};

/// Mints tickets. Whoever holds an issuer decides what runs; keep it with the code that
/// authorizes tool calls, never with code that handles model output.
class ticket_issuer {
 public:
  /// Mints a ticket granting `code.execute` (when `spec.execute`) and nothing else.
  /// Returns `errc::invalid_argument` for a malformed id or tenant, non-positive ceilings,
  /// or a `runtime_digest` that is set but not `sha256:` and 64 lowercase hex digits.
  result<ticket> issue(const ticket_spec& spec) const;
  /// Mints a ticket that also grants `code.network`.
  result<ticket> issue(const ticket_spec& spec, network_grant) const;

  /**
   * Decodes a ticket from JSON (see docs/protocol.md), e.g.
   * `{"v":1,"id":"t-1","tenant":"acme","actions":["code.execute"],"isolation":"process",
   *   "max_timeout_ms":8000,"max_memory_bytes":536870912}`, optionally with
   * `"runtime_digest":"sha256:<64 lowercase hex>"`.
   * This *trusts its input*: use it only for ticket files the local operator controls (the
   * CLI does). Unknown fields, wrong types, unknown actions and a malformed `runtime_digest`
   * are `invalid_request` with a message naming the field.
   */
  boost::system::result<ticket, rejection> decode(std::string_view json) const;
};

/// Encodes a ticket as JSON (the form `ticket_issuer::decode` reads); `runtime_digest` is
/// written only when the ticket pins one.
std::string encode(const ticket& t);

}  // namespace sandbox
