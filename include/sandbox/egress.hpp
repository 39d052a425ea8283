// Egress allowlists: the host names a network run may reach through the host's egress proxy.
//
// A request that needs the network names its domains (`run_request.egress`); a ticket that
// grants `code.network` carries the domains it allows; the proxy lets a connection through
// only when its host name matches one of the run's granted patterns. Everything else —
// direct IP addresses, other names, DNS from inside — stays refused.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sandbox {

/// Longest host name accepted, in bytes (RFC 1035 §2.3.4, without the trailing dot).
inline constexpr std::size_t max_egress_name_bytes = 253;
/// Most patterns in one request's or ticket's egress list.
inline constexpr std::size_t max_egress_patterns = 32;

/**
 * The canonical form of an egress pattern, or `std::nullopt` when `pattern` is not one.
 *
 * A pattern is an exact host name (`api.example.com`) or a wildcard `*.` followed by a host
 * name (`*.example.com`: every name strictly under example.com, at any depth, but not
 * example.com itself). A host name here is at least two labels of `[A-Za-z0-9-]`, each 1..63
 * bytes, not starting or ending with `-`, at most 253 bytes in all, with a last label that is
 * not all digits (so no IPv4 literal, and never a bare top-level domain such as `*.com`).
 * Internationalized names must be given in their ASCII (`xn--`) form. One trailing dot
 * (`example.com.`) is accepted and dropped; letters are lowered (names are case-insensitive,
 * RFC 4343). No IP literals, ports, schemes, paths or whitespace.
 */
std::optional<std::string> canonical_egress_pattern(std::string_view pattern);

/**
 * True when host name `host` (as a client sent it: any case, at most one trailing dot) is
 * allowed by canonical pattern `pattern`: equal to it, or, for `*.suffix`, ending in
 * `.suffix` with at least one more label. A `host` that is not a valid host name (an IP
 * literal, empty labels, bytes outside `[A-Za-z0-9-]`) matches nothing.
 */
bool egress_pattern_matches(std::string_view pattern, std::string_view host);

/// True when `host` matches any of the canonical `patterns`.
bool egress_allowed(std::span<const std::string> patterns, std::string_view host);

/// True when every name `inner` allows is also allowed by `outer` (both canonical): `inner`
/// equals a pattern of `outer`, or is an exact name or a narrower wildcard under one of
/// `outer`'s wildcards. Used to prove a derived ticket never allows more than its parent.
bool egress_subset(std::span<const std::string> inner, std::span<const std::string> outer);

/// The pattern naming exactly the names both canonical patterns `a` and `b` allow (one of
/// them: two patterns either share no name or one is within the other), or `std::nullopt`
/// when they share none.
std::optional<std::string> egress_intersection(std::string_view a, std::string_view b);

// ---------------------------------------------------------------------------------------------
// L7 rules: which requests a network run may send to a host, finer than the domain.

/// Most L7 rules in one ticket.
inline constexpr std::size_t max_egress_rules = 32;
/// Most path prefixes in one rule.
inline constexpr std::size_t max_egress_rule_paths = 32;
/// Longest path prefix of a rule, in bytes.
inline constexpr std::size_t max_egress_rule_path_bytes = 256;
/// The HTTP methods a rule may allow (upper case, as sent).
inline constexpr std::array<std::string_view, 7> egress_rule_methods = {
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};

/**
 * One L7 egress rule of a ticket (`ticket_spec::egress_rules`; wire: docs/protocol.md).
 *
 * A request of a network run to a host that matches at least one rule's `host` must match
 * one of those rules: its method is in `methods` and its path (the request target up to `?`)
 * starts with one of `paths` — a prefix ending in `/` matches any path under it, one that
 * does not matches itself exactly or at a segment boundary (`/v1/rates` matches `/v1/rates`
 * and `/v1/rates/eu`, never `/v1/ratesX`). Hosts no rule names are reachable at the domain
 * level, as without rules. Budgets, when set, count over the whole run: `max_requests`
 * requests admitted under the rule, `max_bytes` bytes of request and response bodies relayed
 * under it; a request past either is refused `budget_exhausted`, a response that would cross
 * `max_bytes` is cut there. The proxy enforces rules on plain `http://` requests and, by
 * terminating TLS with the run's CA, inside HTTPS.
 */
struct egress_rule {
  /// 1..64 characters of `[a-z0-9-]`, unique in its ticket: what refusals and records name.
  std::string name;
  /// An egress pattern (`canonical_egress_pattern`); kept canonical.
  std::string host;
  /// 1..7 distinct methods of `egress_rule_methods`.
  std::vector<std::string> methods;
  /// 1..`max_egress_rule_paths` distinct path prefixes: each starts with `/`, at most
  /// `max_egress_rule_path_bytes` of printable ASCII, without `%`, `?`, `#`, `\`, and
  /// without a segment that is `.` or starts with `..` or `.;`.
  std::vector<std::string> paths;
  std::optional<std::uint64_t> max_requests;  ///< > 0 when set; unset: no request budget
  std::optional<std::uint64_t> max_bytes;     ///< > 0 when set; unset: no byte budget
  bool operator==(const egress_rule&) const = default;
};

/// True for a rule name: 1..64 characters of `[a-z0-9-]`.
bool is_valid_egress_rule_name(std::string_view name) noexcept;

/// The first problem with `rule`, as "<field>: <reason>" with fields named as in its JSON
/// form ("name", "host", "methods[1]", "paths[0]", "max_bytes"), or `std::nullopt`.
/// Canonicalizes `rule.host`.
std::optional<std::string> check_egress_rule(egress_rule& rule);

/// True when `path` (a request's path, without its query) is matched by rule path `prefix`
/// (see `egress_rule`). Compares bytes as they are: nothing is decoded or normalized.
bool egress_path_matches(std::string_view prefix, std::string_view path) noexcept;

/// True when every request `inner` allows is allowed by `outer` too: its host within
/// `outer`'s, its methods among `outer`'s, each of its paths under one of `outer`'s, and each
/// of `outer`'s budgets kept at most as large.
bool egress_rule_within(const egress_rule& inner, const egress_rule& outer);

}  // namespace sandbox
