// The egress proxy's parsers (parsers.hpp): strict, bounded, no I/O.
#include "core/egress/parsers.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <charconv>
#include <nlohmann/json.hpp>

#include "sandbox/egress.hpp"

namespace sandbox::detail {
namespace {

// ----- small byte helpers

constexpr char ascii_lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return ascii_lower(x) == ascii_lower(y);
         });
}

std::string lowered(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }
constexpr bool is_alpha(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
constexpr bool is_hex(char c) noexcept {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
// RFC 9110 §5.6.2 tchar.
constexpr bool is_tchar(char c) noexcept {
  return is_digit(c) || is_alpha(c) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}
constexpr bool is_vchar(char c) noexcept {
  const auto b = static_cast<unsigned char>(c);
  return b >= 0x21 && b <= 0x7E;
}
bool is_token(std::string_view s) noexcept {
  return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar);
}

// ----- TLS

// A bounds-checked big-endian reader over a byte span.
class byte_reader {
 public:
  explicit byte_reader(std::span<const std::uint8_t> b) noexcept : b_(b) {}
  std::size_t left() const noexcept { return b_.size() - pos_; }
  bool u8(std::uint32_t& v) noexcept { return read(1, v); }
  bool u16(std::uint32_t& v) noexcept { return read(2, v); }
  bool bytes(std::size_t n, std::span<const std::uint8_t>& out) noexcept {
    if (left() < n) return false;
    out = b_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  bool skip(std::size_t n) noexcept {
    std::span<const std::uint8_t> ignored;
    return bytes(n, ignored);
  }

 private:
  bool read(std::size_t n, std::uint32_t& v) noexcept {
    if (left() < n) return false;
    v = 0;
    for (std::size_t i = 0; i < n; ++i) v = (v << 8) | b_[pos_ + i];
    pos_ += n;
    return true;
  }
  std::span<const std::uint8_t> b_;
  std::size_t pos_ = 0;
};

constexpr std::uint8_t tls_handshake = 22;
constexpr std::uint8_t tls_client_hello = 1;
constexpr std::size_t tls_record_header = 5;
constexpr std::size_t tls_max_fragment = 16384;  // RFC 8446 §5.1: 2^14
constexpr std::uint32_t ext_server_name = 0;

sni_result malformed_hello() { return {sni_status::malformed, {}}; }

// The server name of a complete ClientHello message body (after the 4-byte handshake header).
sni_result parse_client_hello_body(std::span<const std::uint8_t> body) {
  byte_reader r(body);
  std::uint32_t version = 0;
  std::uint32_t len = 0;
  if (!r.u16(version) || (version >> 8) != 3) return malformed_hello();
  if (!r.skip(32)) return malformed_hello();                             // random
  if (!r.u8(len) || len > 32 || !r.skip(len)) return malformed_hello();  // legacy_session_id
  if (!r.u16(len) || len < 2 || len % 2 != 0 || !r.skip(len)) return malformed_hello();
  if (!r.u8(len) || len < 1 || !r.skip(len)) return malformed_hello();  // compression methods
  if (r.left() == 0) return {sni_status::absent, {}};  // no extensions (TLS 1.2 and older)
  if (!r.u16(len) || len != r.left()) return malformed_hello();
  std::bitset<65536> seen;
  std::optional<std::string> name;
  while (r.left() > 0) {
    std::uint32_t type = 0;
    std::span<const std::uint8_t> data;
    if (!r.u16(type) || !r.u16(len) || !r.bytes(len, data)) return malformed_hello();
    if (seen.test(type)) return malformed_hello();  // RFC 8446 §4.2: at most one of each
    seen.set(type);
    if (type != ext_server_name) continue;
    // RFC 6066 §3: ServerNameList server_name_list<1..2^16-1>; host_name is the only type, and
    // other types cannot be skipped (their encoding is unknown), so they are refused.
    byte_reader s(data);
    std::uint32_t list_len = 0;
    if (!s.u16(list_len) || list_len == 0 || list_len != s.left()) return malformed_hello();
    while (s.left() > 0) {
      std::uint32_t name_type = 0;
      std::uint32_t name_len = 0;
      std::span<const std::uint8_t> host;
      if (!s.u8(name_type) || name_type != 0 || name) return malformed_hello();
      if (!s.u16(name_len) || name_len == 0 || name_len > 255 || !s.bytes(name_len, host)) {
        return malformed_hello();
      }
      if (!std::all_of(host.begin(), host.end(),
                       [](std::uint8_t b) { return b >= 0x21 && b <= 0x7E; })) {
        return malformed_hello();
      }
      name.emplace(host.begin(), host.end());
    }
  }
  if (!name) return {sni_status::absent, {}};
  return {sni_status::found, std::move(*name)};
}

// ----- HTTP

// A field line's value with leading and trailing OWS removed.
std::string_view trim_ows(std::string_view v) noexcept {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

bool valid_field_value(std::string_view v) noexcept {
  return std::all_of(v.begin(), v.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b == '\t' || (b >= 0x20 && b != 0x7F);  // VCHAR, SP, HTAB, obs-text
  });
}

bool valid_http_version(std::string_view v) noexcept {
  return v.size() == 8 && v.starts_with("HTTP/") && is_digit(v[5]) && v[6] == '.' && is_digit(v[7]);
}

// 1*DIGIT within 64 bits.
std::optional<std::uint64_t> parse_decimal(std::string_view s) noexcept {
  if (s.empty() || !std::all_of(s.begin(), s.end(), is_digit)) return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// RFC 3986 unreserved / sub-delims / '%' (a reg-name, not decoded).
constexpr bool is_reg_name_char(char c) noexcept {
  return is_digit(c) || is_alpha(c) ||
         std::string_view("-._~!$&'()*+,;=%").find(c) != std::string_view::npos;
}

// True when the last label of `host` (one trailing dot ignored) is a number: decimal digits,
// or 0x followed by hex digits. The WHATWG URL standard parses such hosts as IPv4 ("127.1",
// "0x7f.1", "2130706433"), and so do inet_aton and curl.
bool ends_in_number(std::string_view host) noexcept {
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  const auto dot = host.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? host : host.substr(dot + 1);
  if (last.empty()) return false;
  if (std::all_of(last.begin(), last.end(), is_digit)) return true;
  if (last.size() >= 2 && last[0] == '0' && (last[1] == 'x' || last[1] == 'X')) {
    return std::all_of(last.begin() + 2, last.end(), is_hex);
  }
  return false;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Pure parsing

sni_result tls_client_hello_sni(std::span<const std::uint8_t> bytes) {
  // Pass 1 walks the records without copying: where each fragment is, how many handshake
  // bytes are there, and whether the ClientHello they carry is complete.
  struct fragment {
    std::size_t offset, size;
  };
  std::vector<fragment> fragments;
  std::size_t have = 0;  // handshake bytes available
  std::size_t need = 0;  // handshake bytes of the ClientHello (0: header not seen yet)
  std::array<std::uint8_t, 4> header{};
  std::size_t pos = 0;
  for (;;) {
    // The record header, validated byte by byte as far as it is there.
    const std::size_t avail = bytes.size() - pos;
    if (avail >= 1 && bytes[pos] != tls_handshake) return malformed_hello();
    if (avail >= 2 && bytes[pos + 1] != 3) return malformed_hello();
    if (avail >= 3 && bytes[pos + 2] > 4) return malformed_hello();
    if (pos + tls_record_header > max_client_hello_wire_bytes) return malformed_hello();
    if (avail < tls_record_header) return {sni_status::need_more, {}};
    const std::size_t len = (std::size_t{bytes[pos + 3]} << 8) | bytes[pos + 4];
    // RFC 8446 §5.1: no zero-length handshake fragments, none over 2^14.
    if (len == 0 || len > tls_max_fragment) return malformed_hello();
    const std::size_t end = pos + tls_record_header + len;
    if (end > max_client_hello_wire_bytes) return malformed_hello();
    const std::size_t start = pos + tls_record_header;
    const std::size_t got = std::min(len, bytes.size() - start);
    // Handshake header bytes as they arrive: the type is checked at once, the length as soon
    // as it is known, so garbage is refused early.
    for (std::size_t i = 0; i < got && have + i < header.size(); ++i) {
      header[have + i] = bytes[start + i];
      if (have + i == 0 && header[0] != tls_client_hello) return malformed_hello();
    }
    fragments.push_back({start, got});
    have += got;
    if (need == 0 && have >= header.size()) {
      need = 4 + ((std::size_t{header[1]} << 16) | (std::size_t{header[2]} << 8) | header[3]);
      if (need > max_client_hello_bytes) return malformed_hello();
    }
    if (need != 0) {
      const std::size_t before = have - got;
      if (before + len > need) return malformed_hello();  // bytes after the ClientHello
      if (before + len == need) {
        if (got < len) return {sni_status::need_more, {}};
        break;
      }
    }
    if (got < len) return {sni_status::need_more, {}};
    pos = end;
  }
  // Pass 2: the complete message, contiguous.
  std::vector<std::uint8_t> message;
  message.reserve(need);
  for (const auto& f : fragments) {
    message.insert(message.end(), bytes.begin() + static_cast<std::ptrdiff_t>(f.offset),
                   bytes.begin() + static_cast<std::ptrdiff_t>(f.offset + f.size));
  }
  return parse_client_hello_body(std::span<const std::uint8_t>(message).subspan(4));
}

const std::string* http_request_head::find(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (iequals(n, name)) return &v;
  }
  return nullptr;
}

std::pair<http_head_status, http_request_head> parse_http_request_head(std::string_view buf,
                                                                       std::size_t max_head_bytes) {
  using status = http_head_status;
  http_request_head head;
  const auto fail = [&](status s) { return std::pair{s, http_request_head{}}; };
  const std::string_view in = buf.substr(0, std::min(buf.size(), max_head_bytes));
  bool seen_host = false;
  bool seen_length = false;
  bool seen_te = false;
  std::size_t pos = 0;
  for (bool first = true;; first = false) {
    // One line: up to CRLF. A LF without CR before it, or a CR followed by anything but LF,
    // is malformed (RFC 9112 §2.2 allows servers to accept bare LF; a proxy must not, or it
    // and the origin could see different requests).
    std::size_t eol = pos;
    while (eol < in.size() && in[eol] != '\r' && in[eol] != '\n') ++eol;
    if (eol == in.size()) {
      return buf.size() >= max_head_bytes ? fail(status::too_large) : fail(status::need_more);
    }
    if (in[eol] == '\n') return fail(status::malformed);
    if (eol + 1 == in.size()) {
      return buf.size() >= max_head_bytes ? fail(status::too_large) : fail(status::need_more);
    }
    if (in[eol + 1] != '\n') return fail(status::malformed);
    const std::string_view line = in.substr(pos, eol - pos);
    pos = eol + 2;
    if (first) {
      // request-line = method SP request-target SP HTTP-version
      const auto sp1 = line.find(' ');
      if (sp1 == std::string_view::npos) return fail(status::malformed);
      const auto sp2 = line.find(' ', sp1 + 1);
      if (sp2 == std::string_view::npos) return fail(status::malformed);
      const std::string_view method = line.substr(0, sp1);
      const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
      const std::string_view version = line.substr(sp2 + 1);
      if (!is_token(method) || target.empty() ||
          !std::all_of(target.begin(), target.end(), is_vchar) || !valid_http_version(version)) {
        return fail(status::malformed);
      }
      head.method = method;
      head.target = target;
      head.version = version;
      continue;
    }
    if (line.empty()) break;  // end of the head
    if (line.front() == ' ' || line.front() == '\t') return fail(status::malformed);  // obs-fold
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) return fail(status::malformed);
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = trim_ows(line.substr(colon + 1));
    if (!is_token(name) || !valid_field_value(value)) return fail(status::malformed);
    if (head.headers.size() == max_http_header_fields) return fail(status::too_large);
    // Request smuggling: two readers of this head must agree on where it and its body end.
    if (iequals(name, "Host")) {
      if (seen_host) return fail(status::malformed);
      seen_host = true;
    } else if (iequals(name, "Content-Length")) {
      if (seen_length || !parse_decimal(value)) return fail(status::malformed);
      seen_length = true;
    } else if (iequals(name, "Transfer-Encoding")) {
      seen_te = true;
    }
    head.headers.emplace_back(name, value);
  }
  if (seen_te && seen_length) return fail(status::malformed);
  head.head_bytes = pos;
  return {status::complete, std::move(head)};
}

std::optional<http_authority> parse_authority(std::string_view s, std::uint16_t default_port) {
  http_authority out;
  std::string_view host;
  std::string_view rest;
  if (s.starts_with("[")) {
    const auto close = s.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = s.substr(1, close - 1);
    rest = s.substr(close + 1);
    // An IPv6 literal without a zone id (RFC 3986 has none).
    std::array<unsigned char, 16> parsed{};
    if (host.find('%') != std::string_view::npos ||
        ::inet_pton(AF_INET6, std::string(host).c_str(), parsed.data()) != 1) {
      return std::nullopt;
    }
    out.ip_literal = true;
  } else {
    const auto colon = s.find(':');
    host = s.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view{} : s.substr(colon);
    if (host.empty() || host.size() > 255 ||
        !std::all_of(host.begin(), host.end(), is_reg_name_char)) {
      return std::nullopt;
    }
    out.ip_literal = ends_in_number(host);
  }
  if (rest.empty()) {
    if (default_port == 0) return std::nullopt;
    out.port = default_port;
  } else {
    if (rest.front() != ':') return std::nullopt;
    const std::string_view digits = rest.substr(1);
    const auto port = digits.size() <= 5 ? parse_decimal(digits) : std::nullopt;
    if (!port || *port == 0 || *port > 65535) return std::nullopt;
    out.port = static_cast<std::uint16_t>(*port);
  }
  out.host = host;
  return out;
}

std::optional<absolute_target> parse_absolute_target(std::string_view target) {
  if (target.empty() || !std::all_of(target.begin(), target.end(), is_vchar)) return std::nullopt;
  if (target.find('#') != std::string_view::npos) return std::nullopt;
  const auto sep = target.find("://");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  const std::string_view scheme = target.substr(0, sep);
  // RFC 3986 §3.1: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
  if (!is_alpha(scheme.front()) || !std::all_of(scheme.begin(), scheme.end(), [](char c) {
        return is_alpha(c) || is_digit(c) || c == '+' || c == '-' || c == '.';
      })) {
    return std::nullopt;
  }
  const std::string_view after = target.substr(sep + 3);
  const auto path_at = after.find_first_of("/?");
  const std::string_view authority = after.substr(0, path_at);
  if (authority.empty()) return std::nullopt;
  absolute_target out;
  out.scheme = lowered(scheme);
  out.authority = authority;
  if (path_at == std::string_view::npos) {
    out.origin_form = "/";
  } else if (after[path_at] == '?') {
    out.origin_form = "/" + std::string(after.substr(path_at));
  } else {
    out.origin_form = after.substr(path_at);
  }
  return out;
}

std::string rewrite_http_request_head(const http_request_head& head, std::string_view origin_form) {
  // Fields the Connection header names are hop-by-hop too (RFC 9110 §7.6.1).
  std::vector<std::string> connection_named;
  for (const auto& [name, value] : head.headers) {
    if (!iequals(name, "Connection")) continue;
    std::string_view v = value;
    while (!v.empty()) {
      const auto comma = v.find(',');
      const std::string_view item = trim_ows(v.substr(0, comma));
      if (!item.empty()) connection_named.push_back(lowered(item));
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  static constexpr std::string_view hop_by_hop[] = {"connection", "keep-alive",        "te",
                                                    "trailer",    "transfer-encoding", "upgrade"};
  std::string out;
  out.reserve(head.head_bytes + origin_form.size() + 32);
  out.append(head.method).append(" ").append(origin_form).append(" ").append(head.version);
  out.append("\r\n");
  for (const auto& [name, value] : head.headers) {
    const std::string l = lowered(name);
    if (l.starts_with("proxy-")) continue;
    if (std::find(std::begin(hop_by_hop), std::end(hop_by_hop), l) != std::end(hop_by_hop))
      continue;
    if (std::find(connection_named.begin(), connection_named.end(), l) != connection_named.end()) {
      continue;
    }
    out.append(name).append(": ").append(value).append("\r\n");
  }
  out.append("Connection: close\r\n\r\n");
  return out;
}

std::string display_host(std::string_view host) {
  constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(std::min<std::size_t>(host.size(), max_egress_name_bytes));
  for (char c : host) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x21 && b <= 0x7E && b != '\\') {
      if (out.size() + 1 > max_egress_name_bytes) break;
      out += c;
    } else {
      if (out.size() + 4 > max_egress_name_bytes) break;
      out += "\\x";
      out += digits[b >> 4];
      out += digits[b & 0xF];
    }
  }
  return out;
}

std::string egress_denial_response(unsigned status, std::string_view reason, std::string_view host,
                                   std::string_view rule, std::string_view rule_advice) {
  std::string_view phrase = "Forbidden";
  std::string_view error = "egress_denied";
  std::string_view advice =
      "do not retry by other routes: only the approved domains are reachable, through this proxy";
  switch (status) {
    case 400:
      phrase = "Bad Request";
      error = "bad_request";
      advice =
          "send one well-formed HTTP/1.1 request per connection: CONNECT host:443 for HTTPS, "
          "or an absolute http:// URL with a matching Host header";
      break;
    case 431:
      phrase = "Request Header Fields Too Large";
      error = "bad_request";
      advice = "the request head must stay under 16 KiB and 100 header fields";
      break;
    case 501:
      phrase = "Not Implemented";
      error = "unsupported";
      advice =
          "use CONNECT host:port for HTTPS; plain http:// requests need an absolute URL and a "
          "Content-Length body (no Transfer-Encoding)";
      break;
    case 502:
      phrase = "Bad Gateway";
      error = "egress_failed";
      advice = "the approved host could not be reached; a later retry may work";
      break;
    case 504:
      phrase = "Gateway Timeout";
      error = "egress_failed";
      advice = "the approved host did not answer in time; a later retry may work";
      break;
    default:
      status = 403;
      if (reason == "connection limit" || reason == "byte limit") {
        advice = "this run's network budget is spent: do not retry";
      } else if (reason == "secret_misuse") {
        advice =
            "a secret's placeholder may only be sent where the host puts its value: in the "
            "secret's own header, to the secret's domains; never in a host name, a URL, another "
            "header or a body";
      } else if (reason == "port not approved") {
        advice =
            "only the approved ports are reachable: 443 through CONNECT for HTTPS unless the "
            "grant says otherwise";
      }
      break;
  }
  nlohmann::ordered_json body;
  body["error"] = error;
  body["reason"] = reason;
  body["host"] = display_host(host);
  if (!rule.empty()) body["rule"] = rule;
  body["advice"] = rule_advice.empty() ? advice : rule_advice;
  const std::string text =
      body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + std::string(phrase) + "\r\n";
  out += "Content-Type: application/json\r\n";
  out += "Content-Length: " + std::to_string(text.size()) + "\r\n";
  out += "Connection: close\r\n\r\n";
  out += text;
  return out;
}

bool could_start_request(char c) noexcept { return is_tchar(c); }

std::optional<std::uint64_t> parse_content_length(std::string_view value) noexcept {
  return parse_decimal(value);
}

std::optional<std::string> canonical_host_name(std::string_view host) {
  if (host.starts_with("*")) return std::nullopt;
  return canonical_egress_pattern(host);
}

bool same_host(std::string_view a, std::string_view b) {
  const auto ca = canonical_host_name(a);
  const auto cb = canonical_host_name(b);
  if (ca && cb) return *ca == *cb;
  return iequals(a, b);
}

}  // namespace sandbox::detail
