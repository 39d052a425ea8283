// The egress proxy's parsers (core/egress/parsers.hpp): ClientHello SNI, HTTP request heads,
// authorities and targets, the upstream head and the denial answer — tables, every
// truncation, random mutations. (tests/fuzz/egress_fuzz.cpp replays a corpus through them.)
#include "core/egress/parsers.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "unit/core/egress/egress_test_support.hpp"

namespace {

using namespace sandbox::detail;
using namespace egress_test;

}  // namespace

TEST_CASE("egress: tls_client_hello_sni on valid ClientHellos", "[egress]") {
  const auto hello = client_hello("api.example.com");
  auto r = tls_client_hello_sni(hello);
  CHECK(r.status == sni_status::found);
  CHECK(r.name == "api.example.com");

  // Bytes after the ClientHello's records belong to the tunnel and change nothing.
  auto more = hello;
  more.insert(more.end(), {23, 3, 3, 0, 1, 0xAA});
  CHECK(tls_client_hello_sni(more).name == "api.example.com");

  // The same message cut across two and three records.
  const auto msg = client_hello_message({.sni = "API.Example.COM."});
  for (const auto& cuts :
       std::vector<std::vector<std::size_t>>{{1}, {3}, {4}, {50}, {msg.size() - 1}, {2, 60}}) {
    r = tls_client_hello_sni(tls_records(msg, cuts));
    CHECK(r.status == sni_status::found);
    CHECK(r.name == "API.Example.COM.");  // as sent; the proxy compares case-insensitively
  }

  CHECK(tls_client_hello_sni(client_hello(std::nullopt)).status == sni_status::absent);
  CHECK(tls_client_hello_sni(tls_records(client_hello_message({.extensions = false}))).status ==
        sni_status::absent);
  // Other extensions around the server name are skipped.
  r = tls_client_hello_sni(tls_records(client_hello_message(
      {.sni = "a.example.org", .extra = {{16, {0, 3, 2, 'h', '2'}}, {0xfe0d, {1, 2, 3}}}})));
  CHECK(r.status == sni_status::found);
  CHECK(r.name == "a.example.org");
}

TEST_CASE("egress: tls_client_hello_sni truncated at every byte is need_more", "[egress]") {
  const auto msg = client_hello_message({.sni = "api.example.com"});
  for (const auto& wire : {tls_records(msg), tls_records(msg, {7, 40})}) {
    for (std::size_t n = 0; n < wire.size(); ++n) {
      const auto r = tls_client_hello_sni(std::span(wire.data(), n));
      INFO("prefix " << n << " of " << wire.size());
      CHECK(r.status == sni_status::need_more);
    }
    CHECK(tls_client_hello_sni(wire).status == sni_status::found);
  }
}

TEST_CASE("egress: tls_client_hello_sni refuses malformed ClientHellos", "[egress]") {
  const auto good = client_hello("api.example.com");
  const auto malformed = [](const bytes& b) {
    return tls_client_hello_sni(b).status == sni_status::malformed;
  };
  CHECK(malformed(to_bytes("GET / HTTP/1.1\r\n\r\n")));
  CHECK(malformed(to_bytes("G")));                          // decided on the first byte
  CHECK(malformed({0x80, 0x2e, 0x01, 0x03, 0x01}));         // SSLv2-style hello
  CHECK(malformed({22, 2, 0}));                             // version 2.x
  CHECK(malformed({22, 3, 9}));                             // version 3.9
  CHECK(malformed({22, 3, 1, 0, 0}));                       // empty record
  CHECK(malformed({22, 3, 1, 0x40, 0x01}));                 // record over 2^14
  CHECK(malformed({22, 3, 1, 0, 4, 2}));                    // ServerHello, not ClientHello
  CHECK(malformed({22, 3, 1, 0, 4, 1, 0x00, 0x40, 0x01}));  // ClientHello over 16 KiB

  // A record of another type before the ClientHello is complete.
  {
    auto b = tls_records(client_hello_message({.sni = "a.example.com"}), {10});
    b[5 + 10] = 21;  // the second record becomes an alert
    CHECK(malformed(b));
  }
  // Handshake bytes after the ClientHello in its last record.
  {
    auto msg = client_hello_message({.sni = "a.example.com"});
    msg.push_back(0);
    auto b = tls_records(msg);
    CHECK(malformed(b));
  }
  // Duplicate extension, two host_names, an empty name, an unknown name type, a name with a
  // control byte or a space, a list length that lies, an empty server_name extension.
  const auto with_ext = [](std::vector<std::pair<std::uint16_t, bytes>> extra) {
    return tls_records(client_hello_message({.sni = "a.example.com", .extra = std::move(extra)}));
  };
  CHECK(malformed(with_ext({{0, server_name_extension_data("b.example.com")}})));
  CHECK(malformed(with_ext({{43, {0x02, 0x03, 0x04}}})));
  {
    bytes two{0, 10, 0, 0, 3, 'a', '.', 'b', 0, 0, 1, 'c'};  // list of 2 host_names
    two[1] = static_cast<std::uint8_t>(two.size() - 2);
    CHECK(malformed(tls_records(client_hello_message({.extra = {{0, two}}}))));
  }
  CHECK(malformed(tls_records(client_hello_message({.sni = ""}))));
  CHECK(malformed(tls_records(client_hello_message({.extra = {{0, {0, 4, 1, 0, 1, 'a'}}}}))));
  CHECK(malformed(tls_records(client_hello_message({.sni = std::string("a.exa\x01mple.com")}))));
  CHECK(malformed(tls_records(client_hello_message({.sni = "a.example.com evil"}))));
  CHECK(malformed(tls_records(client_hello_message({.sni = std::string(256, 'a')}))));
  CHECK(malformed(tls_records(client_hello_message({.extra = {{0, {0, 9, 0, 0, 1, 'a'}}}}))));
  CHECK(malformed(tls_records(client_hello_message({.extra = {{0, {}}}}))));
  // Session id over 32 bytes; odd cipher suite length; no compression methods.
  {
    auto msg = client_hello_message({.sni = "a.example.com"});
    msg[4 + 2 + 32] = 33;
    CHECK(malformed(tls_records(msg)));
    msg = client_hello_message({.sni = "a.example.com"});
    msg[4 + 2 + 32 + 1 + 32 + 1] = 3;
    CHECK(malformed(tls_records(msg)));
    msg = client_hello_message({.sni = "a.example.com"});
    msg[4 + 2 + 32 + 1 + 32 + 2 + 4] = 0;
    CHECK(malformed(tls_records(msg)));
  }
  // Records beyond the wire bound: 1-byte fragments of a large ClientHello never end.
  {
    const auto msg =
        client_hello_message({.sni = "a.example.com", .extra = {{21, bytes(4000, 0)}}});
    std::vector<std::size_t> cuts;
    for (std::size_t i = 1; i < msg.size(); ++i) cuts.push_back(i);
    const auto wire = tls_records(msg, cuts);
    REQUIRE(wire.size() > max_client_hello_wire_bytes);
    CHECK(malformed(wire));
    CHECK(tls_client_hello_sni(std::span(wire.data(), max_client_hello_wire_bytes)).status ==
          sni_status::malformed);
  }
  CHECK(tls_client_hello_sni(good).status == sni_status::found);  // the base case is valid
}

TEST_CASE("egress: tls_client_hello_sni survives random mutations", "[egress]") {
  // Each result must be consistent with the result for any prefix: once a prefix is decided
  // (malformed, found, absent), more bytes never change the decision.
  std::mt19937 rng(12345);
  const auto base = tls_records(client_hello_message({.sni = "api.example.com"}), {20});
  for (int i = 0; i < 3000; ++i) {
    auto b = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<std::uint8_t>(rng());
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    const auto full = tls_client_hello_sni(b);
    if (full.status == sni_status::found) CHECK((!full.name.empty() && full.name.size() <= 255));
    const std::size_t cut = b.empty() ? 0 : rng() % b.size();
    const auto part = tls_client_hello_sni(std::span(b.data(), cut));
    if (part.status != sni_status::need_more) {
      CHECK(part.status == full.status);
      CHECK(part.name == full.name);
    }
  }
}

TEST_CASE("egress: parse_http_request_head accepts strict heads", "[egress]") {
  const std::string text =
      "GET http://api.example.com/a?b=1 HTTP/1.1\r\nHost: api.example.com\r\n"
      "X-Empty:\r\nX-Spaces: \t v a l \t \r\nContent-Length: 5\r\n\r\nhello";
  auto [status, head] = parse_http_request_head(text);
  REQUIRE(status == http_head_status::complete);
  CHECK(head.method == "GET");
  CHECK(head.target == "http://api.example.com/a?b=1");
  CHECK(head.version == "HTTP/1.1");
  CHECK(head.head_bytes == text.size() - 5);
  REQUIRE(head.headers.size() == 4);
  CHECK(head.headers[1] == std::pair<std::string, std::string>{"X-Empty", ""});
  CHECK(*head.find("x-spaces") == "v a l");
  CHECK(*head.find("HOST") == "api.example.com");
  CHECK(head.find("Transfer-Encoding") == nullptr);

  // Every strict prefix needs more.
  for (std::size_t n = 0; n < head.head_bytes; ++n) {
    INFO("prefix " << n);
    CHECK(parse_http_request_head(std::string_view(text).substr(0, n)).first ==
          http_head_status::need_more);
  }
  // CONNECT and a head without fields.
  auto c = parse_http_request_head("CONNECT api.example.com:443 HTTP/1.1\r\n\r\n");
  CHECK(c.first == http_head_status::complete);
  CHECK(c.second.target == "api.example.com:443");
  CHECK(c.second.headers.empty());
  // Transfer-Encoding alone parses (the proxy refuses it as unsupported).
  CHECK(parse_http_request_head(
            "POST http://a.example/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            .first == http_head_status::complete);
}

TEST_CASE("egress: parse_http_request_head refuses smuggling and sloppy forms", "[egress]") {
  const std::vector<std::pair<std::string, http_head_status>> table = {
      {"GET http://a.example/ HTTP/1.1\nHost: a.example\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\nHost: a\rexample\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\nX: 1\r\n folded\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\nHost : a.example\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\n Host: a.example\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\nhost: b.example\r\n\r\n",
       http_head_status::malformed},
      {"POST http://a.example/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
       http_head_status::malformed},
      {"POST http://a.example/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
       http_head_status::malformed},
      {"POST http://a.example/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\ncontent-length: 5\r\n\r\n",
       http_head_status::malformed},
      {"POST http://a.example/ HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
       http_head_status::malformed},
      {"POST http://a.example/ HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
       http_head_status::malformed},
      {"POST http://a.example/ HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
       http_head_status::malformed},
      {"POST http://a.example/ HTTP/1.1\r\nContent-Length:\r\n\r\n", http_head_status::malformed},
      {"GET  http://a.example/ HTTP/1.1\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/  HTTP/1.1\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1 \r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ http/1.1\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/11\r\n\r\n", http_head_status::malformed},
      {"G(T http://a.example/ HTTP/1.1\r\n\r\n", http_head_status::malformed},
      {"GET http://a.exa\x7Fmple/ HTTP/1.1\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/\xC3\xA9 HTTP/1.1\r\n\r\n", http_head_status::malformed},
      {"\r\nGET http://a.example/ HTTP/1.1\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\nNoColon\r\n\r\n", http_head_status::malformed},
      {"GET http://a.example/ HTTP/1.1\r\n: v\r\n\r\n", http_head_status::malformed},
  };
  for (const auto& [text, expected] : table) {
    INFO(text);
    CHECK(parse_http_request_head(text).first == expected);
  }
  // A NUL inside a value (the literal above stops at it).
  CHECK(
      parse_http_request_head(std::string("GET http://a.example/ HTTP/1.1\r\nX: a\0b\r\n\r\n", 42))
          .first == http_head_status::malformed);

  // Size bounds: no end within the bound, or too many fields.
  const std::string big = "GET http://a.example/ HTTP/1.1\r\nX: " + std::string(20000, 'a');
  CHECK(parse_http_request_head(big).first == http_head_status::too_large);
  CHECK(parse_http_request_head(big.substr(0, 16384)).first == http_head_status::too_large);
  CHECK(parse_http_request_head(big.substr(0, 16383)).first == http_head_status::need_more);
  CHECK(parse_http_request_head("GET / HTTP/1.1\r\n\r\n", 10).first == http_head_status::too_large);
  std::string many = "GET http://a.example/ HTTP/1.1\r\n";
  for (std::size_t i = 0; i <= max_http_header_fields; ++i)
    many += "X-" + std::to_string(i) + ": v\r\n";
  CHECK(parse_http_request_head(many + "\r\n").first == http_head_status::too_large);
}

TEST_CASE("egress: authorities, absolute targets and the rewritten head", "[egress]") {
  auto a = parse_authority("api.example.com:443", 0);
  REQUIRE(a);
  CHECK(a->host == "api.example.com");
  CHECK(a->port == 443);
  CHECK_FALSE(a->ip_literal);
  CHECK_FALSE(parse_authority("api.example.com", 0));  // CONNECT needs a port
  CHECK(parse_authority("api.example.com", 80)->port == 80);
  CHECK_FALSE(parse_authority("api.example.com:", 80));
  CHECK_FALSE(parse_authority("api.example.com:0", 80));
  CHECK_FALSE(parse_authority("api.example.com:65536", 80));
  CHECK_FALSE(parse_authority("api.example.com:0443x", 80));
  CHECK_FALSE(parse_authority("user@api.example.com:443", 0));
  CHECK_FALSE(parse_authority("api.example.com/x:443", 0));
  CHECK_FALSE(parse_authority("[::1", 0));
  CHECK_FALSE(parse_authority("[fe80::1%25eth0]:443", 0));
  for (const char* literal :
       {"127.0.0.1:443", "[::1]:443", "2130706433:443", "0x7f.1:443", "127.1:443", "evil.0x10:443",
        "1.2.3.4.:443", "[::ffff:7f00:1]:443"}) {
    INFO(literal);
    const auto l = parse_authority(literal, 0);
    REQUIRE(l);
    CHECK(l->ip_literal);
  }
  CHECK(parse_authority("[::1]:8443", 0)->host == "::1");
  CHECK_FALSE(parse_authority("1x.example.com:443", 0)->ip_literal);

  auto t = parse_absolute_target("HTTP://api.example.com:8080/a/b?c=d");
  REQUIRE(t);
  CHECK(t->scheme == "http");
  CHECK(t->authority == "api.example.com:8080");
  CHECK(t->origin_form == "/a/b?c=d");
  CHECK(parse_absolute_target("http://api.example.com")->origin_form == "/");
  CHECK(parse_absolute_target("http://api.example.com?x")->origin_form == "/?x");
  CHECK(parse_absolute_target("https://api.example.com/")->scheme == "https");
  CHECK_FALSE(parse_absolute_target("/just/a/path"));
  CHECK_FALSE(parse_absolute_target("http:/api.example.com/"));
  CHECK_FALSE(parse_absolute_target("http:///path"));
  CHECK_FALSE(parse_absolute_target("http://api.example.com/#frag"));
  CHECK_FALSE(parse_absolute_target("*"));

  const auto [status, head] = parse_http_request_head(
      "POST http://api.example.com/x HTTP/1.1\r\nHost: api.example.com\r\n"
      "Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\n"
      "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\n"
      "Upgrade: websocket\r\nTrailer: X\r\nContent-Length: 3\r\nAccept: */*\r\n\r\n");
  REQUIRE(status == http_head_status::complete);
  CHECK(rewrite_http_request_head(head, "/x") ==
        "POST /x HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nAccept: */*\r\n"
        "Connection: close\r\n\r\n");
}

TEST_CASE("egress: denial responses and displayed hosts", "[egress]") {
  const auto text = egress_denial_response(403, "domain not approved", "evil.example");
  const auto a = parse_answer(text);
  CHECK(a.status == 403);
  CHECK(a.head.starts_with("HTTP/1.1 403 Forbidden\r\n"));
  CHECK(a.head.find("Content-Type: application/json\r\n") != std::string::npos);
  CHECK(a.head.find("Connection: close\r\n") != std::string::npos);
  CHECK(a.head.find("Content-Length: " + std::to_string(text.size() - a.head.size()) + "\r\n") !=
        std::string::npos);
  CHECK(a.body["error"] == "egress_denied");
  CHECK(a.body["reason"] == "domain not approved");
  CHECK(a.body["host"] == "evil.example");
  CHECK(a.body["advice"].get<std::string>().find("do not retry") != std::string::npos);
  CHECK(parse_answer(egress_denial_response(502, "connect failed", "a.example")).body["error"] ==
        "egress_failed");
  CHECK(parse_answer(egress_denial_response(400, "malformed request", "")).status == 400);
  CHECK(parse_answer(egress_denial_response(501, "unsupported request", "")).body["error"] ==
        "unsupported");

  CHECK(display_host("api.example.com") == "api.example.com");
  CHECK(display_host(std::string("a\0b\\c\xFF\"", 7)) == "a\\x00b\\x5cc\\xff\"");
  const auto hostile = display_host(std::string(1000, '\x01'));
  CHECK(hostile.size() <= 253);
  CHECK(hostile.size() % 4 == 0);  // whole escapes only
  CHECK(display_host(std::string(1000, 'a')).size() == 253);
  // A hostile host still gives a valid JSON body.
  CHECK(
      parse_answer(egress_denial_response(403, "domain not approved", "\xC0\"}\n")).body["host"] ==
      "\\xc0\"}\\x0a");
}

TEST_CASE("egress: host names, request starts and Content-Length", "[egress]") {
  CHECK(canonical_host_name("API.Example.COM.") == std::string("api.example.com"));
  CHECK_FALSE(canonical_host_name("*.example.com"));
  CHECK_FALSE(canonical_host_name("exa mple.com"));
  CHECK(same_host("Api.Example.com", "api.example.com."));
  CHECK_FALSE(same_host("api.example.com", "evil.example"));
  CHECK(same_host("[::1]", "[::1]"));  // not names: compared ignoring case
  CHECK(could_start_request('G'));
  CHECK(could_start_request('!'));
  CHECK_FALSE(could_start_request('\x16'));  // a TLS handshake record
  CHECK_FALSE(could_start_request(' '));
  CHECK(parse_content_length("0") == std::uint64_t{0});
  CHECK(parse_content_length("18446744073709551615") == std::uint64_t{18446744073709551615ULL});
  CHECK_FALSE(parse_content_length("18446744073709551616"));
  CHECK_FALSE(parse_content_length(""));
  CHECK_FALSE(parse_content_length("+1"));
  CHECK_FALSE(parse_content_length("1 "));
}
