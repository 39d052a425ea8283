// Fuzz target for the egress proxy's parsers (core/egress/parsers.hpp) and its address
// classification (libFuzzer interface; tests/fuzz/replay_main.cpp replays a corpus through it
// under g++).
//
// Every input goes through the ClientHello reader and the HTTP head parser, whole and cut short:
// a decision taken on a prefix (malformed, found, absent, complete) must stay the same with more
// bytes; results respect their bounds. A complete head's target goes through the authority and
// target parsers, and its rewritten upstream head must parse again as a complete head without
// any Proxy-* or hop-by-hop field. Hostile bytes as a host still give a valid JSON denial. The
// first 16 bytes, taken as addresses, are judged alike as IPv4 and in their IPv6 forms. Two
// halves of the input, taken as host names, are the same host both ways round or neither.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "core/egress/egress_proxy.hpp"
#include "core/egress/parsers.hpp"
#include "core/egress/terminated_http.hpp"

namespace {

using namespace sandbox::detail;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "egress_fuzz: %s\n", what);
  std::abort();
}

bool printable(std::string_view s) {
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x21 || b > 0x7E) return false;
  }
  return true;
}

bool lower_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto l = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (l(a[i]) != l(b[i])) return false;
  }
  return true;
}

void check_sni(std::span<const std::uint8_t> in) {
  const auto full = tls_client_hello_sni(in);
  if (in.size() >= max_client_hello_wire_bytes && full.status == sni_status::need_more) {
    fail("need_more past the wire bound");
  }
  if (full.status == sni_status::found &&
      (full.name.empty() || full.name.size() > 255 || !printable(full.name))) {
    fail("SNI name out of bounds");
  }
  if (full.status != sni_status::found && !full.name.empty()) fail("name without found");
  for (const std::size_t cut : {in.size() / 2, in.size() > 0 ? in.size() - 1 : 0}) {
    const auto part = tls_client_hello_sni(in.first(cut));
    if (part.status != sni_status::need_more &&
        (part.status != full.status || part.name != full.name)) {
      fail("SNI decision changed with more bytes");
    }
  }
}

void check_rewrite(const http_request_head& head) {
  (void)parse_authority(head.target, 0);
  const auto target = parse_absolute_target(head.target);
  if (!target) return;
  (void)parse_authority(target->authority, 80);
  if (target->origin_form.empty() || target->origin_form[0] != '/') fail("origin-form");
  const std::string up = rewrite_http_request_head(head, target->origin_form);
  const auto [status, again] = parse_http_request_head(up, up.size() + 1);
  // 100 fields, none dropped, plus Connection: close is one over the client-side bound.
  if (status == http_head_status::too_large && head.headers.size() == max_http_header_fields)
    return;
  if (status != http_head_status::complete || again.head_bytes != up.size()) {
    fail("rewritten head does not parse");
  }
  if (again.method != head.method || again.target != target->origin_form) fail("request line");
  bool close = false;
  for (const auto& [name, value] : again.headers) {
    for (std::string_view banned :
         {"keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}) {
      if (lower_equal(name, banned)) fail("hop-by-hop field forwarded");
    }
    if (name.size() >= 6 && lower_equal(std::string_view(name).substr(0, 6), "proxy-")) {
      fail("Proxy-* field forwarded");
    }
    if (lower_equal(name, "connection")) {
      if (close || value != "close") fail("Connection field");
      close = true;
    }
  }
  if (!close) fail("no Connection: close");
}

void check_head(std::string_view in, std::size_t max) {
  const auto [status, head] = parse_http_request_head(in, max);
  if (status == http_head_status::complete) {
    if (head.head_bytes > in.size() || head.head_bytes > max || head.head_bytes < 4 ||
        in.substr(head.head_bytes - 4, 4) != "\r\n\r\n") {
      fail("head_bytes");
    }
    if (head.method.empty() || head.target.empty() || !printable(head.target)) fail("request line");
    if (head.headers.size() > max_http_header_fields) fail("header count");
    for (const auto& [name, value] : head.headers) {
      if (name.empty() || value.find_first_of("\r\n") != std::string::npos) fail("field");
    }
    if (head.find("Transfer-Encoding") && head.find("Content-Length")) fail("TE with CL");
    check_rewrite(head);
  } else if (head.head_bytes != 0 || !head.headers.empty()) {
    fail("partial head returned");
  }
  if (status == http_head_status::need_more && in.size() >= max) fail("need_more past the bound");
  for (const std::size_t cut : {in.size() / 2, in.size() > 0 ? in.size() - 1 : 0}) {
    const auto [part, part_head] = parse_http_request_head(in.substr(0, cut), max);
    if (part == http_head_status::need_more) continue;
    if (part != status) fail("head decision changed with more bytes");
    if (part == http_head_status::complete && part_head.head_bytes != head.head_bytes) {
      fail("head_bytes changed with more bytes");
    }
  }
}

void check_addresses(std::span<const std::uint8_t> in) {
  if (in.size() < 16) return;
  boost::asio::ip::address_v6::bytes_type b6{};
  for (std::size_t i = 0; i < 16; ++i) b6[i] = in[i];
  (void)address_refusal(boost::asio::ip::address_v6(b6));
  const boost::asio::ip::address_v4 v4({in[0], in[1], in[2], in[3]});
  boost::asio::ip::address_v6::bytes_type mapped{};
  mapped[10] = mapped[11] = 0xFF;
  for (std::size_t i = 0; i < 4; ++i) mapped[12 + i] = in[i];
  if (address_refusal(boost::asio::ip::address_v6(mapped)) != address_refusal(v4)) {
    fail("IPv4-mapped judged differently");
  }
}

}  // namespace

// A terminated tunnel's HTTP (terminated_http.hpp): the input as the client's bytes and as the
// origin's, whole and cut in two. Never a crash; what it passes on stays within a bound of
// what came in; the secret's value never reaches the client side; a cut never changes what
// the client's bytes give upstream.
void check_terminated(std::string_view text) {
  static const std::string value = "VALUE-of-the-secret";
  const std::vector<secret_injection> secrets{
      {.placeholder = "sbx-secret-00112233445566778899aabbccddeeff",
       .value = std::make_shared<const std::string>(value),
       .domains = {"api.example.com"},
       .header_name = "Authorization",
       .header_template = "Bearer {value}"}};
  std::string whole_up;
  std::optional<http_refusal> whole_refusal;
  {
    terminated_http t("api.example.com", secrets);
    whole_refusal = t.from_client(text, whole_up);
    std::string down;
    (void)t.from_origin(text, down);
    (void)t.origin_closed(down);
    if (down.find(value) != std::string::npos) fail("value reached the client");
    if (down.size() > 2 * text.size() + 4096) fail("response output unbounded");
  }
  if (whole_up.size() > 2 * text.size() + 4096) fail("request output unbounded");
  terminated_http t("api.example.com", secrets);
  std::string up;
  const std::size_t cut = text.size() / 3;
  auto r = t.from_client(text.substr(0, cut), up);
  if (!r) r = t.from_client(text.substr(cut), up);
  if (!whole_refusal && (r || up != whole_up)) fail("a cut changed the request stream");
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_sni(bytes);
  check_head(text, 16384);
  check_head(text, 64);
  check_addresses(bytes);
  check_terminated(text);
  const std::string_view first = text.substr(0, size / 2), second = text.substr(size / 2);
  if (same_host(first, second) != same_host(second, first)) fail("same_host not symmetric");
  const std::string shown = display_host(text);
  if (shown.size() > 253 || !printable(shown)) fail("display_host");
  const std::string denial = egress_denial_response(403, "domain not approved", text);
  const auto body =
      nlohmann::json::parse(denial.substr(denial.find("\r\n\r\n") + 4), nullptr, false);
  if (!body.is_object() || body["host"] != shown) fail("denial body");
  return 0;
}
