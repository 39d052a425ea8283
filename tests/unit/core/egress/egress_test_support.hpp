// Test support for the egress room's tests (tests/unit/core/egress/): a hand-made TLS
// ClientHello and the parse of a proxy's HTTP answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace egress_test {

using bytes = std::vector<std::uint8_t>;

inline bytes to_bytes(std::string_view s) { return bytes(s.begin(), s.end()); }
inline std::string to_string(const bytes& b) { return std::string(b.begin(), b.end()); }

// ---------------------------------------------------------------------------------------------
// A hand-made TLS ClientHello (RFC 8446 §4.1.2), enough for an SNI check.

inline void put16(bytes& b, std::size_t v) {
  b.push_back(static_cast<std::uint8_t>(v >> 8));
  b.push_back(static_cast<std::uint8_t>(v));
}

struct hello_spec {
  std::optional<std::string> sni;  // host_name; none: no server_name extension
  bool extensions = true;          // false: no extensions block at all (TLS 1.2 style)
  std::vector<std::pair<std::uint16_t, bytes>> extra;  // more extensions, after the others
};

inline bytes server_name_extension_data(const std::string& name) {
  bytes entry{0};  // host_name
  put16(entry, name.size());
  entry.insert(entry.end(), name.begin(), name.end());
  bytes data;
  put16(data, entry.size());
  data.insert(data.end(), entry.begin(), entry.end());
  return data;
}

// The handshake message: type 1, 24-bit length, body.
inline bytes client_hello_message(const hello_spec& spec) {
  bytes body{0x03, 0x03};
  body.insert(body.end(), 32, 0x11);  // random
  body.push_back(32);                 // legacy_session_id
  body.insert(body.end(), 32, 0x22);
  put16(body, 4);  // cipher suites
  body.insert(body.end(), {0x13, 0x01, 0x13, 0x02});
  body.insert(body.end(), {0x01, 0x00});  // compression: null
  if (spec.extensions) {
    std::vector<std::pair<std::uint16_t, bytes>> exts;
    exts.push_back({43, {0x02, 0x03, 0x04}});  // supported_versions: TLS 1.3
    if (spec.sni) exts.push_back({0, server_name_extension_data(*spec.sni)});
    for (const auto& e : spec.extra) exts.push_back(e);
    bytes block;
    for (const auto& [type, data] : exts) {
      put16(block, type);
      put16(block, data.size());
      block.insert(block.end(), data.begin(), data.end());
    }
    put16(body, block.size());
    body.insert(body.end(), block.begin(), block.end());
  }
  bytes msg{1, static_cast<std::uint8_t>(body.size() >> 16),
            static_cast<std::uint8_t>(body.size() >> 8), static_cast<std::uint8_t>(body.size())};
  msg.insert(msg.end(), body.begin(), body.end());
  return msg;
}

// `msg` in handshake records, cut after each offset in `cuts`.
inline bytes tls_records(const bytes& msg, std::vector<std::size_t> cuts = {}) {
  cuts.push_back(msg.size());
  bytes out;
  std::size_t from = 0;
  for (std::size_t to : cuts) {
    out.insert(out.end(), {22, 3, 1});
    put16(out, to - from);
    out.insert(out.end(), msg.begin() + static_cast<std::ptrdiff_t>(from),
               msg.begin() + static_cast<std::ptrdiff_t>(to));
    from = to;
  }
  return out;
}

inline bytes client_hello(std::optional<std::string> sni) {
  return tls_records(client_hello_message({.sni = std::move(sni)}));
}

struct http_answer {
  int status = 0;
  std::string head;
  nlohmann::json body;  // null unless JSON
};

// Parses a complete response (as read to EOF).
inline http_answer parse_answer(const std::string& text) {
  http_answer a;
  const auto end = text.find("\r\n\r\n");
  if (text.size() < 12 || end == std::string::npos) return a;
  a.status = std::stoi(text.substr(9, 3));
  a.head = text.substr(0, end + 4);
  a.body = nlohmann::json::parse(text.substr(end + 4), nullptr, false);
  return a;
}

}  // namespace egress_test
