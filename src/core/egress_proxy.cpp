// The host-side egress proxy (src/core/egress_proxy.hpp): pure parsers first, then the Asio
// machinery.
#include "core/egress_proxy.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bitset>
#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <charconv>
#include <nlohmann/json.hpp>

#include "sandbox/egress.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
using asio::ip::tcp;

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
  bool u24(std::uint32_t& v) noexcept { return read(3, v); }
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

// The canonical (lowered, no trailing dot) form of host name `host`, or nullopt when it is not
// a valid name by sandbox/egress.hpp's rules (wildcards are not names).
std::optional<std::string> canonical_host_name(std::string_view host) {
  if (host.starts_with("*")) return std::nullopt;
  return canonical_egress_pattern(host);
}

// ----- addresses

std::optional<std::string> v4_refusal(const asio::ip::address_v4& a) {
  const std::uint32_t v = a.to_uint();
  const auto in = [v](std::uint32_t net, int bits) {
    const std::uint32_t mask = bits == 0 ? 0 : ~std::uint32_t{0} << (32 - bits);
    return (v & mask) == net;
  };
  if (v == 0) return "unspecified";
  if (in(0x00000000, 8)) return "this network";
  if (in(0x7F000000, 8)) return "loopback";
  if (in(0x0A000000, 8) || in(0xAC100000, 12) || in(0xC0A80000, 16)) return "private";
  if (in(0x64400000, 10)) return "shared";
  if (v == 0xA9FEA9FE) return "metadata";  // 169.254.169.254
  if (in(0xA9FE0000, 16)) return "link-local";
  if (in(0xE0000000, 4)) return "multicast";
  if (v == 0xFFFFFFFF) return "broadcast";
  if (in(0xF0000000, 4) || in(0xC0000000, 24)) return "reserved";
  if (in(0xC0000200, 24) || in(0xC6336400, 24) || in(0xCB007100, 24)) return "documentation";
  if (in(0xC6120000, 15)) return "benchmarking";
  return std::nullopt;
}

asio::ip::address_v4 v4_at(const asio::ip::address_v6::bytes_type& b, std::size_t at) {
  return asio::ip::address_v4(
      asio::ip::address_v4::bytes_type{b[at], b[at + 1], b[at + 2], b[at + 3]});
}

std::optional<std::string> v6_refusal(const asio::ip::address_v6& a) {
  const auto b = a.to_bytes();
  const auto prefix_zero = [&](std::size_t n) {
    return std::all_of(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n),
                       [](std::uint8_t x) { return x == 0; });
  };
  if (a.is_unspecified()) return "unspecified";
  if (a.is_loopback()) return "loopback";
  // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated): judged as IPv4.
  if (prefix_zero(10) && b[10] == 0xFF && b[11] == 0xFF) return v4_refusal(v4_at(b, 12));
  if (prefix_zero(12)) return v4_refusal(v4_at(b, 12));
  // ::ffff:0:a.b.c.d (IPv4-translated, RFC 2765).
  if (prefix_zero(8) && b[8] == 0xFF && b[9] == 0xFF && b[10] == 0 && b[11] == 0) {
    return v4_refusal(v4_at(b, 12));
  }
  // 64:ff9b::/96 (NAT64 well-known prefix, RFC 6052): judged as the IPv4 it reaches.
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xFF && b[3] == 0x9B &&
      std::all_of(b.begin() + 4, b.begin() + 12, [](std::uint8_t x) { return x == 0; })) {
    return v4_refusal(v4_at(b, 12));
  }
  // 64:ff9b:1::/48 (local-use NAT64, RFC 8215): where it leads is the operator's choice.
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xFF && b[3] == 0x9B && b[4] == 0x00 &&
      b[5] == 0x01) {
    return "nat64-local";
  }
  if (b[0] == 0x20 && b[1] == 0x02) return v4_refusal(v4_at(b, 2));  // 6to4, RFC 3056
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x00 && b[3] == 0x00) return "teredo";
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0D && b[3] == 0xB8) return "documentation";
  if (b[0] == 0x01 && b[1] == 0x00 &&
      std::all_of(b.begin() + 2, b.begin() + 8, [](std::uint8_t x) { return x == 0; })) {
    return "discard";  // 100::/64
  }
  if (b[0] == 0xFF) return "multicast";
  if (b[0] == 0xFE && (b[1] & 0xC0) == 0x80) return "link-local";
  if (b[0] == 0xFE && (b[1] & 0xC0) == 0xC0) return "site-local";
  if (a == asio::ip::make_address_v6("fd00:ec2::254")) return "metadata";  // AWS IMDS over IPv6
  if ((b[0] & 0xFE) == 0xFC) return "unique-local";
  return std::nullopt;
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
    boost::system::error_code ec;
    (void)asio::ip::make_address_v6(std::string(host), ec);
    if (ec || host.find('%') != std::string_view::npos) return std::nullopt;  // no zone ids
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

std::string egress_denial_response(unsigned status, std::string_view reason,
                                   std::string_view host) {
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
  body["advice"] = advice;
  const std::string text =
      body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + std::string(phrase) + "\r\n";
  out += "Content-Type: application/json\r\n";
  out += "Content-Length: " + std::to_string(text.size()) + "\r\n";
  out += "Connection: close\r\n\r\n";
  out += text;
  return out;
}

std::optional<std::string> address_refusal(const asio::ip::address& a) {
  return a.is_v4() ? v4_refusal(a.to_v4()) : v6_refusal(a.to_v6());
}

// ---------------------------------------------------------------------------------------------
// Resolvers

namespace {

class system_resolver final : public egress_resolver {
 public:
  system_resolver(asio::any_io_executor ex, bool fully_qualified)
      : ex_(std::move(ex)), fully_qualified_(fully_qualified) {}

  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    // One resolver per lookup, so concurrent lookups never cancel each other.
    auto r = std::make_shared<tcp::resolver>(ex_);
    const bool dot = fully_qualified_ && !host.empty() && host.back() != '.';
    r->async_resolve(
        dot ? host + "." : host, "", tcp::resolver::numeric_service,
        [r, done = std::move(done)](boost::system::error_code ec,
                                    const tcp::resolver::results_type& results) {
          answer a;
          for (const auto& e : results) {
            const auto addr = e.endpoint().address();
            if (a.addresses.size() == 16) break;
            if (std::find(a.addresses.begin(), a.addresses.end(), addr) == a.addresses.end()) {
              a.addresses.push_back(addr);
            }
          }
          if (!ec && a.addresses.empty()) ec = asio::error::host_not_found;
          done(ec, std::move(a));
        });
  }

 private:
  asio::any_io_executor ex_;
  bool fully_qualified_;
};

std::string resolver_key(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  return lowered(name);
}

class static_resolver final : public egress_resolver {
 public:
  static_resolver(std::map<std::string, std::vector<asio::ip::address>> names, bool pinned)
      : pinned_(pinned) {
    for (auto& [name, addresses] : names) names_[resolver_key(name)] = std::move(addresses);
  }

  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    const auto it = names_.find(resolver_key(host));
    if (it == names_.end()) {
      done(asio::error::host_not_found, {});
      return;
    }
    done({}, answer{.addresses = it->second, .pinned = pinned_});
  }

 private:
  std::map<std::string, std::vector<asio::ip::address>> names_;
  bool pinned_;
};

}  // namespace

std::shared_ptr<egress_resolver> make_system_resolver(asio::any_io_executor ex,
                                                      bool fully_qualified) {
  return std::make_shared<system_resolver>(std::move(ex), fully_qualified);
}

std::shared_ptr<egress_resolver> make_static_resolver(
    std::map<std::string, std::vector<asio::ip::address>> names, bool pinned) {
  return std::make_shared<static_resolver>(std::move(names), pinned);
}

}  // namespace sandbox::detail

// ---------------------------------------------------------------------------------------------
// The proxy

namespace sandbox::detail {
namespace {

constexpr std::size_t head_buffer_bytes = 16384;   // also the head size bound
constexpr std::size_t relay_buffer_bytes = 16384;  // per direction
constexpr std::uint32_t max_refusing = 8;          // over-limit connections answered at once
constexpr std::size_t max_candidates = 8;          // resolved addresses tried
constexpr std::size_t max_linger_bytes = 65536;    // read and dropped after a refusal
constexpr std::chrono::milliseconds max_linger{2000};
constexpr std::chrono::milliseconds accept_retry{100};
constexpr std::string_view connect_established = "HTTP/1.1 200 Connection established\r\n\r\n";

// Sockets Asio opens are not close-on-exec; the host's spawner closes stray descriptors in
// its children, and this keeps any other fork+exec of the embedding process from leaking them.
void set_cloexec(int fd) noexcept {
  if (fd >= 0) (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

// The record of a connection closed before its request was read.
sandbox::egress_attempt unheard_attempt(std::string reason) {
  sandbox::egress_attempt a;
  a.protocol = "http";
  a.reason = std::move(reason);
  return a;
}

// Host names of a Host field and of a request target are the same host: equal canonical names,
// or (IP literals, which are refused later anyway) equal ignoring case.
bool same_host(std::string_view a, std::string_view b) {
  const auto ca = canonical_host_name(a);
  const auto cb = canonical_host_name(b);
  if (ca && cb) return *ca == *cb;
  return iequals(a, b);
}

}  // namespace

/**
 * One accepted client connection and its one request, from the head to the last byte.
 *
 * Every asynchronous operation is started through `track`, which counts it in `outstanding_`;
 * the attempt is reported once the session is closed and no operation is outstanding, so the
 * byte counts are final. While the session lives its deadline timer always has a wait pending,
 * so closing it (which cancels that wait) always ends in a completion that reports.
 */
class egress_proxy::session : public std::enable_shared_from_this<session> {
 public:
  session(std::shared_ptr<egress_proxy> proxy, std::uint64_t id, tcp::socket client,
          bool over_limit)
      : proxy_(std::move(proxy)),
        id_(id),
        over_limit_(over_limit),
        client_(std::move(client)),
        upstream_(proxy_->strand_),
        timer_(proxy_->strand_) {
    attempt_.protocol = "http";
  }

  void start() {
    buf_.resize(head_buffer_bytes);
    set_phase(phase::head, grant().handshake_timeout);
    wait_timer();
    read_head();
  }

  /// stop(): closes the connection; an attempt still undecided is recorded "proxy stopped".
  void abort() {
    if (phase_ == phase::closed) return;
    if (attempt_.reason.empty()) attempt_.reason = "proxy stopped";
    close();
  }

  /// The run's byte budget is spent: a tunnel or response still relaying ends now.
  void close_tunnel() {
    if (phase_ == phase::relay) close();
  }

 private:
  using clock = std::chrono::steady_clock;
  using error_code = boost::system::error_code;
  enum class phase { head, resolve, connect, reply, hello, relay, deny, linger, closed };

  struct direction {
    bool up = false;        // client → upstream
    bool done = false;      // nothing more to read this way
    bool reading = false;   // a read of the source is in flight
    std::vector<char> buf;  // relay_buffer_bytes
  };

  const egress_grant& grant() const noexcept { return proxy_->grant_; }

  // Wraps a completion handler: counts the operation as outstanding until it completes; once
  // the session is closed the handler body is skipped (unless `Always`, for handlers that
  // must still count bytes) and the attempt is reported when nothing is left outstanding.
  template <bool Always = false, class F>
  auto track(F f) {
    ++outstanding_;
    return [self = shared_from_this(), f = std::move(f)](auto&&... args) mutable {
      --self->outstanding_;
      if (self->phase_ == phase::closed) {
        if constexpr (Always) f(std::forward<decltype(args)>(args)...);
        self->maybe_report();
        return;
      }
      f(std::forward<decltype(args)>(args)...);
    };
  }

  // ----- deadlines: one timer per session, re-armed for the current phase's deadline.

  clock::time_point current_deadline() const {
    return phase_ == phase::relay ? last_activity_ + grant().idle_timeout : deadline_;
  }

  void set_phase(phase p, clock::duration timeout) {
    phase_ = p;
    deadline_ = clock::now() + timeout;
    last_activity_ = clock::now();
    timer_.expires_at(current_deadline());  // cancels the pending wait, which re-arms
  }

  void wait_timer() {
    timer_.async_wait(track([this](error_code) {
      if (clock::now() >= current_deadline()) {
        on_timeout();
        if (phase_ == phase::closed) return;
      }
      timer_.expires_at(current_deadline());
      wait_timer();
    }));
  }

  void on_timeout() {
    switch (phase_) {
      case phase::head:
      case phase::reply:
      case phase::hello:
        return fail("timeout");
      case phase::resolve:
      case phase::connect:
        return deny(504, "timeout");
      case phase::relay:  // idle: the attempt keeps its reason
      case phase::deny:
      case phase::linger:
      case phase::closed:
        return close();
    }
  }

  // ----- the request head

  void read_head() {
    client_.async_read_some(
        asio::buffer(buf_.data() + len_, head_buffer_bytes - len_),
        track([this](error_code ec, std::size_t n) {
          if (phase_ != phase::head) return;
          const std::size_t old = len_;
          len_ += n;
          if (ec) {
            // The client stopped sending before its head was complete. If it only half-closed
            // it can still read why.
            if (len_ > 0 && ec == asio::error::eof) return deny(400, "malformed request");
            return fail("malformed request");
          }
          // Not even the start of a request line (a ClientHello sent without CONNECT, ...).
          if (old == 0 && !is_tchar(buf_[0])) return deny(400, "malformed request");
          // Parse only when a line may have ended or the buffer is full, so a client sending
          // a byte at a time cannot make parsing quadratic.
          const std::string_view fresh(buf_.data() + old, n);
          if (fresh.find('\n') == std::string_view::npos && len_ < head_buffer_bytes) {
            return read_head();
          }
          auto [status, head] =
              parse_http_request_head(std::string_view(buf_.data(), len_), head_buffer_bytes);
          switch (status) {
            case http_head_status::need_more:
              return read_head();
            case http_head_status::malformed:
              return deny(400, "malformed request");
            case http_head_status::too_large:
              return deny(431, "malformed request");
            case http_head_status::complete:
              return on_head(head);
          }
        }));
  }

  // Decides on a complete head. Order: what was asked (recorded), then limits, then the
  // grant, so the record names the host and port even when the answer is a refusal.
  void on_head(const http_request_head& head) {
    head_bytes_ = head.head_bytes;
    connect_ = head.method == "CONNECT";
    attempt_.protocol = connect_ ? "https" : "http";
    std::optional<http_authority> auth;
    std::optional<absolute_target> target;
    if (connect_) {
      auth = parse_authority(head.target, 0);
      if (!auth) {
        asked_host_ = head.target;
        return deny(400, "malformed request");
      }
    } else {
      target = parse_absolute_target(head.target);
      if (!target) return deny(400, "malformed request");
      auth = parse_authority(target->authority, target->scheme == "https" ? 443 : 80);
      if (!auth) {
        asked_host_ = target->authority;
        return deny(400, "malformed request");
      }
    }
    asked_host_ = auth->host;
    attempt_.port = auth->port;
    if (over_limit_) return deny(403, "connection limit");
    if (head.version != "HTTP/1.1" && head.version != "HTTP/1.0") {
      return deny(501, "unsupported request");
    }
    if (!connect_) {
      if (target->scheme != "http") return deny(501, "unsupported request");
      // The origin must see the request the proxy judged: one host, named twice alike.
      const std::string* host_field = head.find("Host");
      const auto host_auth = host_field ? parse_authority(*host_field, 80) : std::nullopt;
      if (!host_auth || !same_host(host_auth->host, auth->host) || host_auth->port != auth->port) {
        return deny(400, "malformed request");
      }
      if (head.find("Transfer-Encoding") != nullptr) return deny(501, "unsupported request");
    }
    if (auth->ip_literal) return deny(403, "direct IP not allowed");
    const auto name = canonical_host_name(auth->host);
    if (!name || !egress_allowed(grant().domains, *name)) return deny(403, "domain not approved");
    const auto& ports = connect_ ? grant().connect_ports : grant().http_ports;
    if (std::find(ports.begin(), ports.end(), auth->port) == ports.end()) {
      return deny(403, "port not approved");
    }
    if (!connect_) {
      const std::string* length = head.find("Content-Length");
      body_left_ = length != nullptr ? parse_decimal(*length).value_or(0) : 0;
      upstream_head_ = rewrite_http_request_head(head, target->origin_form);
    }
    if (proxy_->budget_spent() || proxy_->budget_left_up() < upstream_head_.size()) {
      return deny(403, "byte limit");
    }
    host_name_ = *name;
    resolve();
  }

  // ----- resolving and connecting: on the host, to a validated address, never re-resolved

  void resolve() {
    set_phase(phase::resolve, grant().connect_timeout);
    // Not counted as outstanding: a resolver may take its time, and a closed session does not
    // wait for it (the answer is then ignored).
    auto self = shared_from_this();
    auto strand = proxy_->strand_;
    proxy_->resolver_->async_resolve(host_name_,
                                     [self, strand](error_code ec, egress_resolver::answer a) {
                                       asio::post(strand, [self, ec, a = std::move(a)]() mutable {
                                         self->on_resolved(ec, std::move(a));
                                       });
                                     });
  }

  void on_resolved(error_code ec, egress_resolver::answer a) {
    if (phase_ != phase::resolve) return;  // timed out or stopped meanwhile
    if (ec || a.addresses.empty()) return deny(502, "resolution failed");
    // DNS-rebinding defence: judge each address here and connect only to those judged.
    std::optional<std::string> refusal;
    std::string refused_address;
    candidates_.clear();
    for (const auto& address : a.addresses) {
      if (candidates_.size() == max_candidates) break;
      if (!a.pinned) {
        if (auto why = address_refusal(address)) {
          if (!refusal) {
            refusal = std::move(why);
            refused_address = address.to_string();
          }
          continue;
        }
      }
      candidates_.push_back(address);
    }
    if (candidates_.empty()) {
      attempt_.address = refused_address;
      return deny(403, "address refused: " + refusal.value_or("unspecified"));
    }
    phase_ = phase::connect;  // same deadline: connect_timeout covers both
    connect_to(0);
  }

  void connect_to(std::size_t i) {
    for (; i < candidates_.size(); ++i) {
      const tcp::endpoint endpoint(candidates_[i], attempt_.port);
      attempt_.address = candidates_[i].to_string();
      error_code ec;
      upstream_.close(ec);
      upstream_.open(endpoint.protocol(), ec);
      if (ec) continue;
      set_cloexec(upstream_.native_handle());
      upstream_.async_connect(endpoint, track([this, i](error_code ec) {
                                if (phase_ != phase::connect) return;
                                if (ec) return connect_to(i + 1);
                                on_connected();
                              }));
      return;
    }
    deny(502, "connect failed");
  }

  void on_connected() {
    if (!connect_) {
      // Plain HTTP: the rewritten head and the part of the body already read go first; bytes
      // past Content-Length (a second, pipelined request) are never forwarded.
      attempt_.allowed = true;
      attempt_.reason = "approved";
      const std::size_t extra = len_ - head_bytes_;
      const std::size_t body_now =
          static_cast<std::size_t>(std::min<std::uint64_t>(extra, body_left_));
      body_left_ -= body_now;
      pending_up_ = std::move(upstream_head_);
      pending_up_.append(buf_.data() + head_bytes_, body_now);
      return start_relay();
    }
    set_phase(phase::reply, grant().handshake_timeout);
    asio::async_write(client_, asio::buffer(connect_established),
                      track([this](error_code ec, std::size_t) {
                        if (phase_ != phase::reply) return;
                        if (ec) return fail("not TLS");
                        start_hello();
                      }));
  }

  // ----- CONNECT: the ClientHello must name the CONNECT host before anything goes upstream

  void start_hello() {
    set_phase(phase::hello, grant().handshake_timeout);
    hello_.assign(buf_.begin() + static_cast<std::ptrdiff_t>(head_bytes_),
                  buf_.begin() + static_cast<std::ptrdiff_t>(len_));
    check_hello();
  }

  void check_hello() {
    if (!hello_.empty()) {
      const auto sni = tls_client_hello_sni(hello_);
      switch (sni.status) {
        case sni_status::need_more:
          break;
        case sni_status::malformed:
          return fail("not TLS");
        case sni_status::absent:
          return fail("no SNI");
        case sni_status::found:
          // Exact pattern match = equal names, ignoring case and one trailing dot.
          if (!egress_pattern_matches(host_name_, sni.name)) {
            return fail("SNI does not match CONNECT host");
          }
          attempt_.allowed = true;
          attempt_.reason = "approved";
          pending_up_.assign(hello_.begin(), hello_.end());
          hello_ = {};
          return start_relay();
      }
    }
    const std::size_t old = hello_.size();
    if (old >= max_client_hello_wire_bytes) return fail("not TLS");  // the parser's bound
    hello_.resize(max_client_hello_wire_bytes);
    client_.async_read_some(asio::buffer(hello_.data() + old, hello_.size() - old),
                            track([this, old](error_code ec, std::size_t n) {
                              if (phase_ != phase::hello) return;
                              hello_.resize(old + n);
                              if (ec) return fail("not TLS");
                              check_hello();
                            }));
  }

  // ----- relaying, with the run's byte budget and the idle timeout

  void start_relay() {
    set_phase(phase::relay, {});
    up_.up = true;
    up_.buf.resize(relay_buffer_bytes);
    down_.buf.resize(relay_buffer_bytes);
    if (!pending_up_.empty()) {
      forward(up_, pending_up_.data(), pending_up_.size());
    } else {
      pump(up_);
    }
    pump(down_);
  }

  tcp::socket& source(const direction& d) noexcept { return d.up ? client_ : upstream_; }
  tcp::socket& sink(const direction& d) noexcept { return d.up ? upstream_ : client_; }

  void pump(direction& d) {
    std::size_t want = d.buf.size();
    if (d.up && !connect_) {  // plain HTTP: the request body only, by Content-Length
      if (body_left_ == 0) {
        d.done = true;
        return;
      }
      want = static_cast<std::size_t>(std::min<std::uint64_t>(want, body_left_));
    }
    d.reading = true;
    source(d).async_read_some(asio::buffer(d.buf.data(), want),
                              track([this, &d](error_code ec, std::size_t n) {
                                d.reading = false;
                                if (phase_ != phase::relay) return;
                                if (ec) return on_source_end(d, ec);
                                last_activity_ = clock::now();
                                if (d.up && !connect_) body_left_ -= n;
                                forward(d, d.buf.data(), n);
                              }));
  }

  // Writes `n` bytes of `data` (alive until the write completes) the way of `d`, as far as
  // the run's budget allows.
  void forward(direction& d, const char* data, std::size_t n) {
    const auto granted = static_cast<std::size_t>(proxy_->take_budget(d.up, n));
    if (granted == 0) return over_budget();
    const bool crossed = granted < n;
    asio::async_write(sink(d), asio::buffer(data, granted),
                      track<true>([this, &d, crossed](error_code ec, std::size_t written) {
                        (d.up ? attempt_.bytes_up : attempt_.bytes_down) += written;
                        if (phase_ != phase::relay) return;
                        if (ec) return close();
                        if (crossed) return over_budget();
                        last_activity_ = clock::now();
                        pump(d);
                      }));
  }

  void over_budget() {
    attempt_.allowed = false;
    attempt_.reason = "byte limit";
    close();
    proxy_->close_tunnels();
  }

  void on_source_end(direction& d, error_code ec) {
    if (ec != asio::error::eof) return close();
    d.done = true;
    error_code ignored;
    if (!connect_) {
      // The client closed before its body was complete: the request is cut, so is the rest.
      if (d.up) return close();
      // The response is complete (the origin closed: Connection: close). Tell the client, and
      // give it time to read before the socket goes (closing with unread input would reset).
      upstream_.close(ignored);
      if (up_.reading) return close();  // still reading a body nobody will answer
      return linger();
    }
    // CONNECT: half-close the other side, keep relaying the other way.
    sink(d).shutdown(tcp::socket::shutdown_send, ignored);
    if (up_.done && down_.done) close();
  }

  // ----- refusals and endings

  std::chrono::milliseconds linger_timeout() const {
    return std::min(grant().handshake_timeout, max_linger);
  }

  // Answers the client with `status` (over-limit connections always get 403 "connection
  // limit"), then lingers. Only called when no read of the client is in flight.
  void deny(unsigned status, std::string reason) {
    if (over_limit_) {
      status = 403;
      reason = "connection limit";
    }
    attempt_.allowed = false;
    attempt_.reason = std::move(reason);
    error_code ignored;
    upstream_.close(ignored);
    reply_ = egress_denial_response(status, attempt_.reason, asked_host_);
    set_phase(phase::deny, linger_timeout());
    asio::async_write(client_, asio::buffer(reply_), track([this](error_code ec, std::size_t) {
                        if (phase_ != phase::deny) return;
                        if (ec) return close();
                        linger();
                      }));
  }

  // After the last byte to the client: shut down sending, read and drop what the client still
  // sends (bounded in bytes and time), then close.
  void linger() {
    error_code ignored;
    client_.shutdown(tcp::socket::shutdown_send, ignored);
    set_phase(phase::linger, linger_timeout());
    linger_read();
  }

  void linger_read() {
    client_.async_read_some(asio::buffer(buf_.data(), buf_.size()),
                            track([this](error_code ec, std::size_t n) {
                              if (phase_ != phase::linger) return;
                              lingered_ += n;
                              if (ec || lingered_ >= max_linger_bytes) return close();
                              linger_read();
                            }));
  }

  // Refuses without an HTTP answer (the client no longer speaks HTTP, or is gone).
  void fail(std::string_view reason) {
    attempt_.allowed = false;
    attempt_.reason = reason;
    close();
  }

  void close() {
    if (phase_ == phase::closed) return;
    phase_ = phase::closed;
    error_code ignored;
    client_.close(ignored);
    upstream_.close(ignored);
    timer_.cancel();
    if (outstanding_ == 0) {
      asio::post(proxy_->strand_, [self = shared_from_this()] { self->maybe_report(); });
    }
  }

  void maybe_report() {
    if (phase_ != phase::closed || outstanding_ != 0 || reported_) return;
    reported_ = true;
    attempt_.host = display_host(asked_host_);
    if (over_limit_) {
      attempt_.allowed = false;
      attempt_.reason = "connection limit";
    }
    proxy_->finish_session(id_, over_limit_, std::move(attempt_));
  }

  std::shared_ptr<egress_proxy> proxy_;
  const std::uint64_t id_;
  const bool over_limit_;
  tcp::socket client_;
  tcp::socket upstream_;
  asio::steady_timer timer_;
  phase phase_ = phase::head;
  clock::time_point deadline_;
  clock::time_point last_activity_;
  int outstanding_ = 0;
  bool reported_ = false;
  sandbox::egress_attempt attempt_;

  std::vector<char> buf_;       // the request head (and what followed it); later, lingering
  std::size_t len_ = 0;         // bytes in buf_
  std::size_t head_bytes_ = 0;  // of them, the head
  bool connect_ = false;
  std::string asked_host_;       // as the client wrote it (recorded escaped)
  std::string host_name_;        // canonical
  std::uint64_t body_left_ = 0;  // plain HTTP: request body bytes still to forward
  std::string upstream_head_;
  std::vector<asio::ip::address> candidates_;
  std::string reply_;
  std::vector<std::uint8_t> hello_;
  std::string pending_up_;  // first bytes upstream: the ClientHello, or the head and body start
  direction up_;
  direction down_;
  std::size_t lingered_ = 0;
};

egress_proxy::egress_proxy(private_tag, asio::any_io_executor ex, egress_grant grant,
                           std::shared_ptr<egress_resolver> resolver, attempt_sink on_attempt)
    : strand_(asio::make_strand(ex)),
      acceptor_(strand_),
      retry_timer_(strand_),
      grant_(std::move(grant)),
      resolver_(std::move(resolver)),
      on_attempt_(std::move(on_attempt)) {}

std::shared_ptr<egress_proxy> egress_proxy::start(asio::any_io_executor ex, int listener_fd,
                                                  egress_grant grant,
                                                  std::shared_ptr<egress_resolver> resolver,
                                                  attempt_sink on_attempt) {
  const auto int_option = [listener_fd](int name) {
    int value = 0;
    socklen_t len = sizeof(value);
    return ::getsockopt(listener_fd, SOL_SOCKET, name, &value, &len) == 0 ? value : -1;
  };
  sockaddr_storage local{};
  socklen_t local_len = sizeof(local);
  const bool ok =
      listener_fd >= 0 && resolver != nullptr && int_option(SO_TYPE) == SOCK_STREAM &&
      int_option(SO_ACCEPTCONN) == 1 &&
      ::getsockname(listener_fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0 &&
      (local.ss_family == AF_INET || local.ss_family == AF_INET6);
  if (!ok) {
    if (listener_fd >= 0) ::close(listener_fd);
    return nullptr;
  }
  set_cloexec(listener_fd);
  auto proxy = std::make_shared<egress_proxy>(private_tag{}, std::move(ex), std::move(grant),
                                              std::move(resolver), std::move(on_attempt));
  boost::system::error_code ec;
  proxy->acceptor_.assign(local.ss_family == AF_INET ? tcp::v4() : tcp::v6(), listener_fd, ec);
  if (ec) {
    ::close(listener_fd);
    return nullptr;
  }
  asio::post(proxy->strand_, [proxy] { proxy->accept_next(); });
  return proxy;
}

void egress_proxy::stop() {
  asio::post(strand_, [self = shared_from_this()] { self->do_stop(); });
}

void egress_proxy::stop(std::function<void()> on_stopped) {
  asio::post(strand_, [self = shared_from_this(), f = std::move(on_stopped)]() mutable {
    self->on_stopped_ = std::move(f);
    self->do_stop();
    self->maybe_stopped();
  });
}

void egress_proxy::maybe_stopped() {
  if (!stopped_ || !sessions_.empty() || !on_stopped_) return;
  auto f = std::move(on_stopped_);
  on_stopped_ = nullptr;
  f();
}

void egress_proxy::do_stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  retry_timer_.cancel();
  std::vector<std::shared_ptr<session>> live;
  live.reserve(sessions_.size());
  for (auto& [id, weak] : sessions_) {
    if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->abort();
}

void egress_proxy::accept_next() {
  if (stopped_) return;
  acceptor_.async_accept(
      [self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
        self->on_accept(ec, std::move(socket));
      });
}

void egress_proxy::on_accept(boost::system::error_code ec, tcp::socket socket) {
  if (stopped_) {
    if (!ec) record(unheard_attempt("proxy stopped"));
    return;
  }
  if (ec) {
    if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor ||
        ec == asio::error::invalid_argument || ec == asio::error::not_socket) {
      return;  // the listener is gone
    }
    // EMFILE, ENFILE, ENOBUFS, ECONNABORTED, ...: try again shortly instead of spinning.
    retry_timer_.expires_after(accept_retry);
    retry_timer_.async_wait([self = shared_from_this()](boost::system::error_code wait_ec) {
      if (!wait_ec) self->accept_next();
    });
    return;
  }
  set_cloexec(socket.native_handle());
  const bool over = accepted_ >= grant_.max_connections;
  if (over && refusing_ >= max_refusing) {
    // Too many over-limit clients at once to answer each: close, still on the record.
    boost::system::error_code ignored;
    socket.close(ignored);
    record(unheard_attempt("connection limit"));
    return accept_next();
  }
  if (over) {
    ++refusing_;
  } else {
    ++accepted_;
  }
  const std::uint64_t id = next_id_++;
  auto s = std::make_shared<session>(shared_from_this(), id, std::move(socket), over);
  sessions_.emplace(id, s);
  s->start();
  accept_next();
}

void egress_proxy::finish_session(std::uint64_t id, bool over_limit, sandbox::egress_attempt a) {
  sessions_.erase(id);
  if (over_limit) --refusing_;
  record(std::move(a));
  maybe_stopped();
}

void egress_proxy::record(sandbox::egress_attempt a) {
  if (recorded_ >= max_recorded_egress_attempts) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ++recorded_;
  if (on_attempt_) on_attempt_(std::move(a));
}

std::uint64_t egress_proxy::take_budget(bool up, std::uint64_t n) {
  std::uint64_t& used = up ? used_up_ : used_down_;
  const std::uint64_t max = up ? grant_.max_bytes_up : grant_.max_bytes_down;
  const std::uint64_t granted = std::min(n, max - std::min(used, max));
  used += granted;
  return granted;
}

std::uint64_t egress_proxy::budget_left_up() const noexcept {
  return grant_.max_bytes_up - std::min(used_up_, grant_.max_bytes_up);
}

bool egress_proxy::budget_spent() const noexcept {
  return used_up_ >= grant_.max_bytes_up || used_down_ >= grant_.max_bytes_down;
}

void egress_proxy::close_tunnels() {
  std::vector<std::shared_ptr<session>> live;
  for (auto& [id, weak] : sessions_) {
    if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->close_tunnel();
}

}  // namespace sandbox::detail
