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
// L7 rules (l7_rules.hpp): the input's first line as a rule path prefix (checked like a
// ticket's) and as a request target judged by fixed rules — whatever a rule admits starts with
// one of its prefixes and holds no dot segment, no encoded '.', '/', '\' or '%', no backslash
// nor control byte; the input as a ruled tunnel's client bytes, whole and cut, judges the
// same requests the same way, its records bounded and printable.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "core/egress/egress_proxy.hpp"
#include "core/egress/l7_rules.hpp"
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

std::vector<sandbox::egress_rule> fuzz_rules() {
  return {
      sandbox::egress_rule{.name = "rates-read",
                           .host = "api.example.com",
                           .methods = {"GET", "HEAD"},
                           .paths = {"/v1/rates/", "/v1/lanes"},
                           .max_requests = 3,
                           .max_bytes = 64},
      sandbox::egress_rule{
          .name = "quote", .host = "*.example.com", .methods = {"POST"}, .paths = {"/v1/quote"}}};
}

void check_admitted_target(std::string_view target) {
  const std::string_view path = target_path(target);
  const bool under = path.starts_with("/v1/rates/") || path == "/v1/lanes" ||
                     path.starts_with("/v1/lanes/") || path == "/v1/quote" ||
                     path.starts_with("/v1/quote/");
  if (!under) fail("a rule admitted a path outside its prefixes");
  for (const char c : target) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x21 || b > 0x7E || c == '\\' || c == '#') fail("a rule admitted a raw unsafe byte");
  }
  for (std::string_view enc : {"%2e", "%2E", "%2f", "%2F", "%5c", "%5C", "%25", "%00"}) {
    if (path.find(enc) != std::string_view::npos) fail("a rule admitted an encoded unsafe byte");
  }
  if (path.find("/./") != std::string_view::npos || path.find("/../") != std::string_view::npos ||
      path.ends_with("/.") || path.ends_with("/..") ||
      path.find("/..;") != std::string_view::npos) {
    fail("a rule admitted a dot segment");
  }
}

void check_rules(std::string_view text) {
  const std::string_view line = text.substr(0, text.find('\n'));
  // As a rule's path prefix: checked; a valid one matches itself and what extends it.
  sandbox::egress_rule candidate{
      .name = "r", .host = "api.example.com", .methods = {"GET"}, .paths = {std::string(line)}};
  if (!sandbox::check_egress_rule(candidate)) {
    if (!sandbox::egress_path_matches(line, line)) fail("a prefix does not match itself");
    if (!sandbox::egress_path_matches(line, std::string(line) + "/x")) fail("prefix extension");
    if (unsafe_target(line)) fail("a valid prefix is an unsafe path");
  }
  // As a target.
  for (const std::string_view method : {"GET", "POST", "DELETE"}) {
    l7_rules rules(fuzz_rules());
    const auto v = rules.admit("api.example.com", method, line, std::nullopt);
    if (!v.ruled) fail("a ruled host was not judged");
    if (v.allowed) {
      check_admitted_target(line);
      if (unsafe_target(line)) fail("an unsafe target was admitted");
    } else if (v.reason != "rule_refused" && v.reason != "unsafe_path" &&
               v.reason != "budget_exhausted") {
      fail("unknown rule refusal");
    }
    if (v.advice.size() > 600) fail("advice unbounded");
    const std::string shown = display_target(line);
    if (shown.size() > max_recorded_target_bytes || !printable(shown)) fail("display_target");
  }
  // As a ruled tunnel's client bytes: cut or whole, the same requests are judged alike.
  l7_rules whole_rules(fuzz_rules());
  terminated_http whole("api.example.com", {}, &whole_rules);
  std::string up;
  const auto whole_refusal = whole.from_client(text, up);
  const auto judged = whole.take_judged();
  for (const auto& j : judged) {
    if (j.method.size() > max_recorded_target_bytes || j.path.size() > max_recorded_target_bytes ||
        (!j.method.empty() && !printable(j.method)) || (!j.path.empty() && !printable(j.path))) {
      fail("judged request record");
    }
    if (j.allowed != j.reason.empty()) fail("judged verdict");
  }
  if (whole_refusal && whole_refusal->status == 403 && whole_refusal->reason != "secret_misuse" &&
      whole_refusal->rule.empty()) {
    fail("a rule's refusal names no rule");
  }
  l7_rules cut_rules(fuzz_rules());
  terminated_http cut("api.example.com", {}, &cut_rules);
  std::string cut_up;
  const std::size_t at = text.size() / 2;
  auto r = cut.from_client(text.substr(0, at), cut_up);
  auto cut_judged = cut.take_judged();
  if (!r) {
    r = cut.from_client(text.substr(at), cut_up);
    for (auto& j : cut.take_judged()) cut_judged.push_back(std::move(j));
  }
  if (!whole_refusal) {
    if (r || cut_up != up) fail("a cut changed a ruled request stream");
    if (cut_judged.size() != judged.size()) fail("a cut changed the judged requests");
    for (std::size_t i = 0; i < judged.size(); ++i) {
      if (cut_judged[i].path != judged[i].path || cut_judged[i].allowed != judged[i].allowed ||
          cut_judged[i].rule != judged[i].rule) {
        fail("a cut changed a request's verdict");
      }
    }
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_sni(bytes);
  check_head(text, 16384);
  check_head(text, 64);
  check_addresses(bytes);
  check_terminated(text);
  check_rules(text);
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
