// Capability tickets: *whether* code may run, for which tenant, at what isolation level, and
// with which ceilings. The sandbox decides what the code can touch while it runs; the ticket
// decides whether it runs at all.
//
// A `ticket` cannot be built from parts by ordinary code: only a `ticket_issuer` mints one.
// Dangerous grants (network) need an explicit tag type, so they are visible at the call site
// (the pattern of Sandbox2's `allowlists/*.h`). What a ticket does not grant is denied.
//
// A ticket may expire (`expires_at`), and may be *derived*: minted by
// `ticket_issuer::derive` from a parent ticket and an approval request (sandbox/approval.hpp),
// never broader than either. Tickets that cross a process boundary are signed
// (sandbox/signed_ticket.hpp).
#pragma once

#include <boost/system/result.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/code.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/error.hpp"
#include "sandbox/protocol.hpp"

namespace sandbox {

/// Actions a ticket may grant. Wire strings: "code.execute", "code.network", "tool.run".
enum class action : std::uint8_t {
  code_execute,  ///< run code at all
  code_network,  ///< let the code reach the network (through the host's egress proxy)
  tool_run,      ///< run the registered tools named in `ticket_spec::tools`
};

/// Wire string of `a`, e.g. "code.execute".
constexpr std::string_view to_string(action a) noexcept {
  switch (a) {
    case action::code_execute:
      return "code.execute";
    case action::code_network:
      return "code.network";
    case action::tool_run:
      return "tool.run";
  }
  return "code.execute";
}

/// Tag that must be passed to `ticket_issuer::issue` to grant `code.network`. Its constructor
/// is explicit so a grant cannot come from `{}`.
struct network_grant {
  explicit network_grant() = default;
};

/// What an issuer is asked to mint. Plain data; carries no authority by itself.
struct ticket_spec {
  std::string id;       ///< 1..128 printable ASCII characters, unique per issuer
  std::string tenant;   ///< see `is_valid_tenant`
  bool execute = true;  ///< grant `code.execute`
  /// Minimum isolation level for runs under this ticket.
  sandbox::isolation isolation = sandbox::isolation::process;
  std::chrono::milliseconds max_timeout{8000};    ///< ceiling for `run_request.timeout`
  std::uint64_t max_memory_bytes = 512ULL << 20;  ///< ceiling for `memory_limit_bytes`
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
  /**
   * The domains a network ticket allows: egress patterns (sandbox/egress.hpp,
   * `canonical_egress_pattern`: exact host names or `*.suffix` wildcards), at most
   * `max_egress_patterns` after canonicalization. `issue(spec, network_grant{})` needs it
   * non-empty; `issue(spec)` needs it empty (a ticket without `code.network` allows no
   * domain). The ticket keeps the canonical forms (lower case, no trailing dot), in order,
   * duplicates dropped. A network request must name only domains this list covers
   * (`egress_subset`), else `action_denied`.
   */
  std::vector<std::string> egress;
  /**
   * When the ticket stops granting anything (exclusive: at `expires_at` it is expired),
   * between 1970 and the end of 2199 (else `issue` fails). Absent (the default): it never
   * expires. The ticket keeps whole seconds (rounded down), the precision of its JSON form
   * (`"expires_at":"2026-11-30T12:00:00Z"`). Admission answers `action_denied` ("ticket
   * expired") from then on.
   */
  std::optional<std::chrono::system_clock::time_point> expires_at;
  /**
   * The registered tools runs under this ticket may pick (`run_request::tool`): tool names
   * (`is_valid_registry_name`) or `"*"` for every tool of the host's registry, at most 64
   * entries, duplicates dropped. Non-empty exactly when the ticket grants `tool.run`
   * (wire: `"actions":[…,"tool.run"]` and `"tools":[…]`). Empty (the default): no tool.
   */
  std::vector<std::string> tools;
  /**
   * Workload profile (`policy::profiles`) of runs under this ticket that are not tool runs
   * with a profile of their own; empty (the default): the policy's per-run values. Chosen by
   * whoever issues the ticket, never by a request. A derived ticket keeps its parent's
   * (`check_derivation`). A run under a ticket naming a profile the host does not have is
   * `invalid_request` ("ticket.profile: …").
   */
  std::string profile;
  /**
   * Host-held secrets runs under this ticket may name (`run_request::secrets`;
   * sandbox/secrets.hpp): secret names (`is_valid_secret_name`), at most `max_secrets`,
   * duplicates dropped (wire: `"secrets":["rates-api"]`). Only the names: the values stay
   * with the host, which also decides where each may be sent. A run uses them only with the
   * network (the ticket's own `code.network`, or an approval, which may narrow them). Empty
   * (the default): none.
   */
  std::vector<std::string> secrets;
  /**
   * L7 rules (sandbox/egress.hpp, `egress_rule`): which requests runs under this ticket may
   * send to the hosts the rules name — methods and path prefixes, with optional per-rule
   * budgets — finer than `egress`, which still decides which hosts are reachable at all.
   * Only with `code.network`; at most `max_egress_rules`, names unique, each `host` sharing
   * at least one name with `egress` (`egress_intersection`), each rule valid by
   * `check_egress_rule` (hosts kept canonical). Wire: `"egress_rules":[{"name":"rates-read",
   * "host":"api.example.com","methods":["GET"],"paths":["/v1/rates/"],"max_requests":10}]`.
   * A run's HTTPS tunnels are terminated (the run's own CA) whenever a rule applies to one of
   * its domains. Empty (the default): domain-level egress only.
   */
  std::vector<egress_rule> egress_rules;
  bool operator==(const ticket_spec&) const = default;
};

/// Longest derivation chain: a ticket has at most this many ancestors.
inline constexpr std::size_t max_ticket_ancestors = 4;

/// Longest time-to-live of a derived ticket: its expiry is at most this far from the moment
/// it is checked (`check_derivation`).
inline constexpr std::chrono::seconds max_derived_ttl{3600};

/// Formats `t` (rounded down to the second) as RFC 3339 UTC, e.g. "2026-11-30T12:00:00Z".
std::string format_rfc3339(std::chrono::system_clock::time_point t);

/// Parses exactly `YYYY-MM-DDTHH:MM:SSZ` (upper-case `T` and `Z`, no fraction, no offset,
/// years 1970..2199, a real calendar date); `std::nullopt` for anything else.
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text);

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

namespace detail {
struct ticket_access;  // src/core: decoding and verification build tickets too
}

/// An immutable capability. Copyable; comparable. Obtain one from a `ticket_issuer` (or a
/// `ticket_verifier`, for a signed ticket document).
class ticket {
 public:
  const std::string& id() const noexcept { return spec_.id; }
  const std::string& tenant() const noexcept { return spec_.tenant; }
  /// True when the ticket grants `a`.
  bool allows(action a) const noexcept {
    switch (a) {
      case action::code_execute:
        return spec_.execute;
      case action::code_network:
        return network_;
      case action::tool_run:
        return !spec_.tools.empty();
    }
    return false;
  }
  /// True when the ticket grants `tool.run` for the tool named `name` (listed, or `"*"`).
  bool allows_tool(std::string_view name) const noexcept {
    for (const auto& t : spec_.tools) {
      if (t == "*" || t == name) return true;
    }
    return false;
  }
  /// The tools the ticket lets runs pick (see `ticket_spec::tools`).
  const std::vector<std::string>& tools() const noexcept { return spec_.tools; }
  /// The host-held secrets the ticket grants, by name (see `ticket_spec::secrets`).
  const std::vector<std::string>& secrets() const noexcept { return spec_.secrets; }
  /// True when the ticket grants the secret named `name`.
  bool allows_secret(std::string_view name) const noexcept {
    for (const auto& s : spec_.secrets) {
      if (s == name) return true;
    }
    return false;
  }
  /// The L7 rules of the ticket's network grant (see `ticket_spec::egress_rules`).
  const std::vector<egress_rule>& egress_rules() const noexcept { return spec_.egress_rules; }
  /// The ticket's workload profile name (see `ticket_spec::profile`); empty: none.
  const std::string& profile() const noexcept { return spec_.profile; }
  /// Minimum isolation level for runs under this ticket.
  sandbox::isolation isolation() const noexcept { return spec_.isolation; }
  std::chrono::milliseconds max_timeout() const noexcept { return spec_.max_timeout; }
  std::uint64_t max_memory_bytes() const noexcept { return spec_.max_memory_bytes; }
  /// The pinned runtime image digest (see `ticket_spec::runtime_digest`), or `std::nullopt`
  /// when the ticket accepts whatever image is installed. Valid syntax whenever set.
  const std::optional<std::string>& runtime_digest() const noexcept { return spec_.runtime_digest; }
  /// The domains a network run may reach (canonical patterns; see `ticket_spec::egress`).
  /// Empty exactly when the ticket does not grant `code.network`.
  const std::vector<std::string>& egress() const noexcept { return spec_.egress; }
  /// When the ticket expires (whole seconds), or `std::nullopt` when it never does.
  const std::optional<std::chrono::system_clock::time_point>& expires_at() const noexcept {
    return spec_.expires_at;
  }
  /// True when the ticket has an expiry and `now` is at or past it.
  bool is_expired(std::chrono::system_clock::time_point now) const noexcept {
    return spec_.expires_at && now >= *spec_.expires_at;
  }
  /// Ids of the tickets this one was derived from, the root first and the parent last; empty
  /// for a ticket minted by `issue` (at most `max_ticket_ancestors`).
  const std::vector<std::string>& ancestors() const noexcept { return ancestors_; }
  /// The parent's id for a derived ticket, else `std::nullopt`.
  std::optional<std::string> parent_id() const {
    if (ancestors_.empty()) return std::nullopt;
    return ancestors_.back();
  }
  /// True for a ticket minted by `ticket_issuer::derive`.
  bool is_derived() const noexcept { return !ancestors_.empty(); }
  /// For a ticket derived from an approval: the approval request it answers. Runs under the
  /// ticket must be exactly that run (runtime, source and inputs; admission checks), at the
  /// approved domains or fewer.
  const std::optional<approval_request>& approval() const noexcept { return approval_; }
  /// The spec the ticket was minted from (canonical egress, expiry in whole seconds).
  const ticket_spec& spec() const noexcept { return spec_; }
  bool operator==(const ticket&) const = default;

 private:
  friend class ticket_issuer;
  friend struct detail::ticket_access;
  ticket(ticket_spec spec, bool network) : spec_(std::move(spec)), network_(network) {}
  ticket_spec spec_;
  bool network_ = false;
  std::vector<std::string> ancestors_;
  std::optional<approval_request> approval_;
};

/// What `ticket_issuer::derive` is told besides the parent and the approval request.
struct derive_options {
  /// The moment of derivation; the epoch (the default) means `system_clock::now()`.
  std::chrono::system_clock::time_point now{};
  /// How long the derived ticket lives: 1 s .. `max_derived_ttl`; default 10 minutes. Its
  /// expiry is `now + ttl` rounded down to the second, or the parent's expiry if earlier.
  std::chrono::seconds ttl{600};
  /// The derived ticket's id (1..128 printable ASCII); empty (the default): "d-" and 16
  /// random lowercase hex digits.
  std::string id;
  /// The domains approved: canonical patterns, each within the request's `domains`
  /// (`egress_subset`), non-empty. `std::nullopt` (the default): all the requested domains.
  std::optional<std::vector<std::string>> domains;
  /// The secrets approved, by name: each among the approval's `secrets` (and so granted by
  /// the parent). `std::nullopt` (the default): all the approval's; an empty list: none.
  std::optional<std::vector<std::string>> secrets;
  /// The L7 rules of the derived ticket (`ticket_spec::egress_rules`). `std::nullopt` (the
  /// default): the parent's rules that apply to the approved domains. Given, they must narrow
  /// the parent's (see `check_derivation`): an approver may add rules for hosts the parent
  /// left unruled, and narrow, never drop, the parent's.
  std::optional<std::vector<egress_rule>> egress_rules;
};

/// Mints tickets. Whoever holds an issuer decides what runs; keep it with the code that
/// authorizes tool calls, never with code that handles model output.
class ticket_issuer {
 public:
  /// Mints a ticket granting `code.execute` (when `spec.execute`), `tool.run` for
  /// `spec.tools` (when non-empty), and nothing else. Returns `errc::invalid_argument` for a
  /// malformed id or tenant, non-positive ceilings, a `runtime_digest` that is set but not
  /// `sha256:` and 64 lowercase hex digits, a `tools` entry that is neither a tool name nor
  /// `"*"` (or more than 64), or a malformed `profile`.
  result<ticket> issue(const ticket_spec& spec) const;
  /// Mints a ticket granting `code.execute` (when `spec.execute`) and `code.network` for the
  /// domains in `spec.egress`. Returns `errc::invalid_argument` as `issue(spec)` does, and
  /// also for an empty `egress`, an entry that is not an egress pattern, or more than
  /// `max_egress_patterns` distinct ones. (`issue(spec)` refuses a non-empty `egress`.)
  result<ticket> issue(const ticket_spec& spec, network_grant) const;

  /**
   * Mints the ticket that answers `approval` (sandbox/approval.hpp) for a run under
   * `parent`: the parent's id recorded (`ancestors()` = the parent's ancestors + its id),
   * the same tenant and `code.execute`, `code.network` for exactly the approved domains
   * (`options.domains`, default all of `approval.domains`; never more), isolation
   * max(parent's, `container`), ceilings min(parent's, the approval's timeout and memory
   * limit), `runtime_digest` pinned to `approval.runtime.digest`, expiry
   * min(now + `options.ttl`, parent's expiry), the parent's `profile`, no `tools`, the
   * approved `secrets` (`options.secrets`, default all of the approval's; each must be
   * granted by the parent), the L7 rules (`options.egress_rules`, default the parent's that
   * share a name with the approved domains; given ones must narrow the parent's as
   * `check_derivation` says), and `approval()` = `approval`.
   *
   *     auto derived = issuer.derive(parent, *result.approval);  // a human said yes
   *     rt.async_run(request, *derived, handler);                // resume
   *
   * Returns `errc::invalid_argument` when `approval` is not for `parent` (ticket id or
   * tenant differ), the parent does not grant `code.execute` or is expired at `now`, the
   * chain would exceed `max_ticket_ancestors`, the approval is malformed (no or invalid
   * domains, a timeout or memory limit of 0, a runtime digest that is not `sha256:` and 64
   * lowercase hex, hashes that are not 64 lowercase hex), `options.domains` is empty or
   * not within the requested ones, `options.secrets` names one the approval does not, a
   * secret of the approval is not granted by the parent, `options.egress_rules` is invalid or
   * does not narrow the parent's, `options.ttl` is out of range, or `options.id` is
   * malformed.
   */
  result<ticket> derive(const ticket& parent, const approval_request& approval,
                        derive_options options = {}) const;

  /**
   * Decodes a ticket from JSON (see docs/protocol.md), e.g.
   * `{"v":1,"id":"t-1","tenant":"acme","actions":["code.execute"],"isolation":"process",
   *   "max_timeout_ms":8000,"max_memory_bytes":536870912}`, optionally with
   * `"runtime_digest":"sha256:<64 lowercase hex>"`, `"egress":["api.example.com"]` (required
   * with `code.network`, refused without), `"egress_rules":[…]` (L7 rules, only with
   * `code.network`), `"expires_at":"2026-11-30T12:00:00Z"`, and for a
   * derived ticket `"derived_from":["<root id>",…,"<parent id>"]` and `"approval":{…}`.
   * This *trusts its input*: use it only for ticket files the local operator controls (the
   * CLI does); a ticket from anyone else comes signed (`ticket_verifier`). Unknown fields,
   * wrong types, unknown actions, a malformed `runtime_digest`, egress pattern, L7 rule
   * (`egress_rules[1].paths[0]: …`) or expiry are `invalid_request` with a message naming
   * the field.
   */
  boost::system::result<ticket, rejection> decode(std::string_view json) const;
};

/// Encodes a ticket as JSON (the form `ticket_issuer::decode` reads): one line, members in
/// the documented order; `runtime_digest`, `egress`, `expires_at`, `derived_from`,
/// `approval`, `tools`, `profile`, `secrets` and `egress_rules` are written only when set.
/// Deterministic: equal tickets encode to equal bytes (the bytes a signature covers,
/// sandbox/signed_ticket.hpp).
std::string encode(const ticket& t);

/**
 * Why `child` is not a valid derivation of `parent` at `now`, or `std::nullopt` when it is.
 * The rules (docs/protocol.md, "Derived tickets"):
 *
 * 1. `child.ancestors()` is `parent.ancestors()` followed by `parent.id()`;
 * 2. same tenant; `code.execute` only if the parent grants it; isolation at least the
 *    parent's; `max_timeout` and `max_memory_bytes` at most the parent's; the parent's
 *    `runtime_digest` pin, when set, kept; the parent's `profile` exactly (profiles are
 *    named limit sets whose sizes only the host knows, so a child never switches to a larger
 *    one); every tool in `tools` granted by the parent (`"*"` only under a parent with `"*"`);
 *    every secret in `secrets` granted by the parent and, for a child answering an
 *    approval, named by the approval;
 * 3. an expiry, no later than the parent's (when it has one) and at most `max_derived_ttl`
 *    after `now`;
 * 4. the network grant: a child with `code.network` under a parent with it allows no domain
 *    the parent does not (`egress_subset`); a child that gains `code.network` must answer an
 *    approval (`approval()` set) — and whenever `approval()` is set: it names the parent
 *    (`ticket_id`) and the tenant, the child's domains are non-empty and within the
 *    approval's `domains`, its isolation is at least `container`, and its `runtime_digest`
 *    is set and equals the approval's `runtime.digest`;
 * 5. the L7 rules only narrow: each child rule whose host shares a name with a parent rule's
 *    is within one parent rule (`egress_rule_within`: host, methods, paths, budgets); a
 *    child rule for a host no parent rule names only adds a restriction; and every name the
 *    child's egress allows that a parent rule covered is covered by a child rule too (a
 *    host never loses its rules).
 *
 * The message is short and names the rule, e.g. "egress: 'evil.example' was not approved".
 * Expiry of the child itself (`is_expired`) is not judged here.
 */
std::optional<std::string> check_derivation(const ticket& parent, const ticket& child,
                                            std::chrono::system_clock::time_point now);

}  // namespace sandbox
