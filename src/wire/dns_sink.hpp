// The DNS sink's packet handling (private to src/; RFC 1035 §4.1).
//
// Every run's resolver configuration points at 127.0.0.1:53 inside the run's own network
// namespace, where sandbox-init binds a UDP socket that the host serves. The host logs the name
// asked for (an egress attempt) and answers REFUSED, so lookups fail fast and nothing is ever
// resolved — except the run's own names (localhost, its hostname), answered with loopback and
// not logged, as its /etc/hosts would. These functions are pure and bounded: a malformed or
// hostile packet yields nothing, never a crash or an over-read.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace sandbox::detail {

/// The first question's name of a DNS query ("example.com"), or nullopt when the packet is
/// not a well-formed query. Labels with bytes outside [A-Za-z0-9_-] are escaped as `\xNN`;
/// compression pointers are refused (queries do not use them); at most 255 bytes.
std::optional<std::string> dns_query_name(std::span<const std::uint8_t> packet);

/// A REFUSED response to `query` (same id, the question echoed, no records); empty when the
/// query is malformed.
std::vector<std::uint8_t> dns_refused_response(std::span<const std::uint8_t> query);

/// The answer to a query for one of the run's own names, which never leaves the run and is
/// not egress: `localhost` and names under `.localhost` (RFC 6761 §6.3), `ip6-localhost`, and
/// the run's hostname `sandbox` (set by sandbox-init). They get what the run's /etc/hosts
/// gives them — A 127.0.0.1 (not for ip6-localhost), AAAA ::1 (not for `sandbox`) — so they
/// resolve even in an image without /etc/hosts (glibc then asks DNS). The reverse names of
/// loopback addresses (`d.c.b.127.in-addr.arpa`, ::1's under `ip6.arpa`) get PTR
/// `localhost` (`gethostbyaddr("127.0.0.1")`, `socket.getfqdn()`). Other types and classes:
/// no records (NOERROR). Empty for any other name and for malformed queries.
std::vector<std::uint8_t> dns_local_response(std::span<const std::uint8_t> query);

}  // namespace sandbox::detail
