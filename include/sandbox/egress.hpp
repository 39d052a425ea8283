// Egress allowlists: the host names a network run may reach through the host's egress proxy.
//
// A request that needs the network names its domains (`run_request.egress`); a ticket that
// grants `code.network` carries the domains it allows; the proxy lets a connection through
// only when its host name matches one of the run's granted patterns. Everything else —
// direct IP addresses, other names, DNS from inside — stays refused.
#pragma once

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

}  // namespace sandbox
