// The egress proxy's parsers (private to src/): what a client of the proxy sends, read strictly.
//
// A TLS ClientHello's SNI, HTTP/1.1 request heads, authorities and absolute-form targets, the
// head the proxy sends upstream, and the answer it gives on a refusal. Pure: bytes in, values
// out, no I/O and no Asio, bounded work and memory, so they are fuzzed
// (tests/fuzz/egress_fuzz.cpp) and unit-tested (tests/unit/core/egress/parsers_test.cpp). The
// proxy (egress_proxy.hpp) is their only caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sandbox::detail {

// ---------------------------------------------------------------------------------------------
// TLS

/// Largest ClientHello handshake message accepted, header included, in bytes.
inline constexpr std::size_t max_client_hello_bytes = 16384;
/// Most bytes of TLS records (headers included) read while looking for a complete ClientHello;
/// `tls_client_hello_sni` never answers `need_more` for an input this long or longer.
inline constexpr std::size_t max_client_hello_wire_bytes = 18432;

enum class sni_status {
  need_more,  ///< a prefix of a plausible ClientHello: read more bytes
  found,      ///< a complete ClientHello with a host_name server name (in `name`)
  absent,     ///< a complete ClientHello without a host_name (no extensions, or no SNI)
  malformed,  ///< not a TLS ClientHello, or one that breaks RFC 8446 / RFC 6066 rules
};

struct sni_result {
  sni_status status = sni_status::need_more;
  std::string name;  ///< for `found`: the host_name as sent, 1..255 bytes of 0x21..0x7E
};

/**
 * The SNI host_name of the TLS ClientHello at the start of `bytes` (RFC 8446 §4.1.2, §5.1;
 * RFC 6066 §3).
 *
 * Reads handshake records (content type 22, version 3.x, 1..16384 bytes each); the ClientHello
 * may span several records but must fit in `max_client_hello_bytes` and its records in
 * `max_client_hello_wire_bytes`. Strict: the first handshake message must be a ClientHello; no
 * other record type before it is complete; no bytes after it in its last record; the
 * extensions block fills the message exactly; no extension type twice; a server_name list
 * holds exactly host_name entries, at most one. Bytes after the last record of the ClientHello
 * are ignored (they belong to the tunnel). A malformed prefix is `malformed` as soon as it is
 * seen; a prefix of a valid ClientHello is `need_more`. Never reads outside `bytes`.
 */
sni_result tls_client_hello_sni(std::span<const std::uint8_t> bytes);

// ---------------------------------------------------------------------------------------------
// HTTP

enum class http_head_status {
  need_more,  ///< no error so far, the head is not complete
  complete,   ///< a complete, valid head (`head_bytes` long)
  malformed,  ///< breaks the strict grammar below
  too_large,  ///< no complete head within the size or header-count bound
};

/// Most header fields in one request head.
inline constexpr std::size_t max_http_header_fields = 100;

/// A parsed HTTP/1.1 request head. Names keep the client's case; values are trimmed of OWS.
struct http_request_head {
  std::string method, target, version;
  std::vector<std::pair<std::string, std::string>> headers;
  std::size_t head_bytes = 0;  ///< bytes of the head, final CRLF CRLF included

  /// The value of the first header named `name` (case-insensitive), or nullptr.
  const std::string* find(std::string_view name) const;
};

/**
 * Parses the request line and header fields at the start of `buf` (RFC 9112 §2–§5), strictly:
 * every line ends in CRLF (a bare LF, or a CR not followed by LF, is malformed); the request
 * line is `token SP 1*VCHAR SP HTTP/DIGIT.DIGIT` with single spaces; no empty line before it;
 * field names are tokens with no whitespace before the ':'; no obs-fold (a line starting with
 * SP or HTAB); field values hold no control characters but HTAB. Request smuggling forms are
 * malformed: Host or Content-Length twice, Transfer-Encoding with Content-Length, a
 * Content-Length that is not 1*DIGIT within 64 bits. `too_large` when no head is complete
 * within `max_head_bytes` or it has more than `max_http_header_fields` fields. Bytes after the
 * head (a body) are not looked at.
 */
std::pair<http_head_status, http_request_head> parse_http_request_head(
    std::string_view buf, std::size_t max_head_bytes = 16384);

/// The authority of a request: `host[:port]`.
struct http_authority {
  std::string host;         ///< as written (an IPv6 literal without its brackets)
  std::uint16_t port = 0;   ///< explicit port, or the default given to `parse_authority`
  bool ip_literal = false;  ///< a bracketed IPv6 literal, or a host whose last label is a
                            ///< number (decimal, 0x-hex): what URL parsers treat as IPv4
};

/**
 * Parses an RFC 3986 authority `host[:port]` without userinfo. `default_port` 0 means the port
 * is required (CONNECT's authority-form). The port is 1*5 DIGIT in 1..65535. The host is a
 * bracketed IPv6 literal or 1..255 bytes of unreserved / sub-delims / '%' characters (not
 * decoded: a percent-encoded name never matches a pattern). nullopt when malformed.
 */
std::optional<http_authority> parse_authority(std::string_view s, std::uint16_t default_port);

/// An absolute-form request target split in parts (RFC 9112 §3.2.2).
struct absolute_target {
  std::string scheme;       ///< lowered ("http")
  std::string authority;    ///< as written
  std::string origin_form;  ///< path (at least "/") and query: what the origin server gets
};

/// Splits `scheme "://" authority path-abempty [ "?" query ]`; nullopt for any other form (a
/// fragment, no "//", an empty authority, bytes outside VCHAR).
std::optional<absolute_target> parse_absolute_target(std::string_view target);

/**
 * The head the proxy sends upstream for a plain-HTTP request: `head.method SP origin_form SP
 * head.version`, the client's fields minus `Proxy-*` fields, hop-by-hop fields (Connection,
 * Keep-Alive, TE, Trailer, Transfer-Encoding, Upgrade) and fields that Connection names, then
 * `Connection: close`. Field order is kept. Input must come from `parse_http_request_head`.
 */
std::string rewrite_http_request_head(const http_request_head& head, std::string_view origin_form);

/// `host` fit for a record or a message: bytes outside 0x21..0x7E and '\' become `\xNN`, the
/// result is cut to at most 253 bytes (never inside an escape).
std::string display_host(std::string_view host);

/**
 * The complete HTTP response the proxy answers a refusal with: `HTTP/1.1 <status> <phrase>`,
 * `Content-Type: application/json`, `Content-Length`, `Connection: close` and a JSON body
 * `{"error": ..., "reason": reason, "host": host, "advice": ...}` a model can read. `error` is
 * "egress_denied" (403), "egress_failed" (502, 504), "bad_request" (400, 431) or "unsupported"
 * (501). `host` is escaped with `display_host`. An L7 rule's refusal (l7_rules.hpp) adds
 * `"rule"` (non-empty `rule`: the refusing rule's name, or the host's rules comma-separated)
 * before `"advice"`, and its own `advice` (what would be allowed) replaces the default one.
 */
std::string egress_denial_response(unsigned status, std::string_view reason, std::string_view host,
                                   std::string_view rule = {}, std::string_view advice = {});

/// True when `c` can begin an HTTP request line (an RFC 9110 tchar): a client whose first byte
/// is anything else (a ClientHello sent without CONNECT, ...) is not speaking HTTP.
bool could_start_request(char c) noexcept;

/// A Content-Length value (1*DIGIT within 64 bits), or nullopt.
std::optional<std::uint64_t> parse_content_length(std::string_view value) noexcept;

// ---------------------------------------------------------------------------------------------
// Host names

/// The canonical (lowered, no trailing dot) form of host name `host`, or nullopt when it is not
/// a valid name by sandbox/egress.hpp's rules (wildcards are not names).
std::optional<std::string> canonical_host_name(std::string_view host);

/// True when `a` and `b` (a Host field's and a request target's host) are the same host: equal
/// canonical names, or (IP literals, which are refused later anyway) equal ignoring case.
bool same_host(std::string_view a, std::string_view b);

}  // namespace sandbox::detail
