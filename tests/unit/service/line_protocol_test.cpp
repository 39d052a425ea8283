// Unit tests of the daemon's line protocol (service/line_protocol.hpp): every refusal of a
// request line with its exact answer (code, message, which id it carries), what each
// operation reads, the answer lines, and the strict base64 of `data_b64`.
#include "service/line_protocol.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <variant>

#include "protocol/base64url.hpp"
#include "sandbox/json.hpp"
#include "sandbox/signed_ticket.hpp"
#include "sandbox/ticket.hpp"
#include "unit/test_files.hpp"

namespace svc = sandbox::service;
using nlohmann::json;
using svc::request_kind;

namespace {

const svc::service_limits limits{};
const std::set<std::string> none_in_flight;

/// The answer a line is refused with (fails the test when it is not refused).
json refusal(std::string_view line, const std::set<std::string>& in_flight = none_in_flight) {
  auto r = svc::read_request_line(line, limits, in_flight);
  REQUIRE(std::holds_alternative<svc::answer>(r));
  const auto& text = std::get<svc::answer>(r).line;
  REQUIRE(!text.empty());
  CHECK(text.back() == '\n');
  CHECK(text.find('\n') == text.size() - 1);  // exactly one line
  return json::parse(text);
}

/// The request a line is read as (fails the test when it is refused).
svc::request_line request(std::string_view line) {
  auto r = svc::read_request_line(line, limits, none_in_flight);
  if (auto* a = std::get_if<svc::answer>(&r)) FAIL("refused: " << a->line);
  REQUIRE(std::holds_alternative<svc::request_line>(r));
  return std::get<svc::request_line>(std::move(r));
}

/// An error answer's id, code and message.
void check_error(const json& a, const json& id, const std::string& code,
                 const std::string& message) {
  CHECK(a.at("id") == id);
  CHECK(a.at("error").at("code") == code);
  CHECK(a.at("error").at("message") == message);
}

template <class T>
json refused_by(const std::variant<T, svc::answer>& r) {
  REQUIRE(std::holds_alternative<svc::answer>(r));
  return json::parse(std::get<svc::answer>(r).line);
}

std::string plain_ticket() {
  auto t = sandbox::ticket_issuer{}.issue({.id = "t-1", .tenant = "acme"});
  REQUIRE(t.has_value());
  return sandbox::encode(*t);
}

}  // namespace

TEST_CASE("line protocol: blank lines carry no request", "[service][line_protocol]") {
  for (std::string_view line : {"", " ", "\t \r", "\r"}) {
    CHECK(std::holds_alternative<svc::blank_line>(
        svc::read_request_line(line, limits, none_in_flight)));
  }
}

TEST_CASE("line protocol: a line that does not parse is answered with its leading id",
          "[service][line_protocol]") {
  SECTION("malformed JSON") {
    auto a = refusal(R"({"id":"r1","ticket":)");
    CHECK(a.at("id") == "r1");
    CHECK(a.at("error").at("code") == "invalid_request");
    // The strict parser names where it stopped: inside the line's `ticket`.
    CHECK(a.at("error").at("message").get<std::string>().starts_with(
        "ticket: malformed JSON at byte 21: "));
  }
  SECTION("unless that id is in flight") {
    auto a = refusal(R"({"id":"r1","ticket":)", {"r1"});
    CHECK(a.at("id").is_null());
  }
  SECTION("two ids: neither is the line's own") {
    auto a = refusal(R"({"id":"a","id":"b","ticket":{},"request":{}})");
    check_error(a, nullptr, "invalid_request", "duplicate field 'id'");
  }
  SECTION("too deep: the message names the documents' limit") {
    const std::size_t depth = sandbox::decode_options{}.max_depth;
    std::string deep =
        R"({"id":"d","request":)" + std::string(depth + 1, '[') + std::string(depth + 1, ']') + "}";
    auto a = refusal(deep);
    CHECK(a.at("id") == "d");
    CHECK(a.at("error").at("message") ==
          "nesting deeper than " + std::to_string(depth) + " levels (a document in the line; " +
              std::to_string(depth + 1) + " counting the line itself)");
  }
  SECTION("not an object") {
    check_error(refusal(R"(["id"])"), nullptr, "invalid_request", "expected a JSON object");
  }
}

TEST_CASE("line protocol: the id is required, a string of 1 to max_id_bytes bytes",
          "[service][line_protocol]") {
  check_error(refusal(R"({"ticket":{},"request":{}})"), nullptr, "invalid_request",
              "id: required field is missing");
  check_error(refusal(R"({"id":7,"ticket":{},"request":{}})"), nullptr, "invalid_request",
              "id: expected a string");
  check_error(refusal(R"({"id":"","ticket":{},"request":{}})"), nullptr, "invalid_request",
              "id: expected 1 to 128 bytes");
  check_error(refusal(R"({"id":")" + std::string(129, 'x') + R"(","ticket":{},"request":{}})"),
              nullptr, "invalid_request", "id: expected 1 to 128 bytes");
  CHECK(request(R"({"id":")" + std::string(128, 'x') + R"(","service_stats":{}})").id.size() ==
        128);
}

TEST_CASE("line protocol: the envelope holds the id and one operation, nothing else",
          "[service][line_protocol]") {
  SECTION("an unknown member is answered under the line's id, unless it is in flight") {
    check_error(refusal(R"({"id":"u","blob_get":{},"extra":1})"), "u", "invalid_request",
                "unknown field 'extra'");
    // Found by the service fuzz target: the id in flight was echoed with this error.
    check_error(refusal(R"({"id":"u","blob_get":{},"extra":1})", {"u"}), nullptr, "invalid_request",
                "id: a request with id 'u' is still in flight");
    check_error(refusal(R"({"id":"u","ticket":{},"request":{},"record":1})", {"u"}), nullptr,
                "invalid_request", "id: a request with id 'u' is still in flight");
    check_error(refusal(R"({"id":"u","ticket":{},"request":{},"zzz":1})"), "u", "invalid_request",
                "unknown field 'zzz'");
  }
  SECTION("two operations") {
    check_error(refusal(R"({"id":"two","blob_put":{},"session_open":{}})"), "two",
                "invalid_request", "unknown field 'blob_put'");
  }
  SECTION("a run needs its ticket and request; record is a boolean") {
    check_error(refusal(R"({"id":"r","request":{}})"), "r", "invalid_request",
                "ticket: required field is missing");
    check_error(refusal(R"({"id":"r","ticket":{}})"), "r", "invalid_request",
                "request: required field is missing");
    check_error(refusal(R"({"id":"r","ticket":{},"request":{},"record":1})"), "r",
                "invalid_request", "record: expected true or false");
  }
  SECTION("an id in flight is refused with id null") {
    check_error(refusal(R"({"id":"busy","ticket":{},"request":{}})", {"busy"}), nullptr,
                "invalid_request", "id: a request with id 'busy' is still in flight");
    check_error(refusal(R"({"id":"busy","session_close":{"session":"s"}})", {"busy"}), nullptr,
                "invalid_request", "id: a request with id 'busy' is still in flight");
  }
}

TEST_CASE("line protocol: each operation is recognized with its body", "[service][line_protocol]") {
  auto run = request(R"({"id":"1","ticket":{"a":1},"request":{"b":2},"record":true})");
  CHECK(run.kind == request_kind::run);
  CHECK(run.record);
  CHECK(run.body.at("ticket") == json{{"a", 1}});
  CHECK_FALSE(request(R"({"id":"1","ticket":{},"request":{}})").record);

  const std::pair<const char*, request_kind> ops[] = {
      {"blob_put", request_kind::blob_put},
      {"blob_get", request_kind::blob_get},
      {"replay", request_kind::replay},
      {"session_open", request_kind::session_open},
      {"session_write", request_kind::session_write},
      {"session_close_stdin", request_kind::session_close_stdin},
      {"session_close", request_kind::session_close},
      {"service_stats", request_kind::service_stats},
  };
  for (const auto& [name, kind] : ops) {
    INFO(name);
    auto r = request(std::string(R"({"id":"x",")") + name + R"(":{"k":"v"}})");
    CHECK(r.id == "x");
    CHECK(r.kind == kind);
    CHECK(r.body == json{{"k", "v"}});
  }
}

TEST_CASE("line protocol: blob_put and blob_get read their members strictly",
          "[service][line_protocol]") {
  auto put = [](const std::string& body) {
    return svc::read_blob_put(request(R"({"id":"p","blob_put":)" + body + "}"), limits);
  };
  auto ok = put(R"({"tenant":"acme","data_b64":"aGk="})");
  REQUIRE(std::holds_alternative<svc::blob_put_line>(ok));
  CHECK(std::get<svc::blob_put_line>(ok).tenant == "acme");
  CHECK(std::get<svc::blob_put_line>(ok).data == "hi");
  check_error(refused_by(put(R"({"tenant":"acme"})")), "p", "invalid_request",
              "blob_put.data_b64: required field is missing");
  check_error(refused_by(put(R"({"tenant":"acme","data_b64":"aGk"})")), "p", "invalid_request",
              "blob_put.data_b64: not valid base64 (RFC 4648, padded)");
  check_error(refused_by(put(R"({"tenant":"no such","data_b64":""})")), "p", "invalid_request",
              "blob_put.tenant: invalid tenant name");
  check_error(refused_by(put(R"({"tenant":"acme","data_b64":")" +
                             std::string((limits.max_blob_put_bytes / 3 + 2) * 4, 'A') + "\"}")),
              "p", "too_large", "blob_put.data_b64: more than 786432 bytes");
  check_error(refused_by(put("[]")), "p", "invalid_request", "blob_put: expected an object");

  auto get = [](const std::string& body) {
    return svc::read_blob_get(request(R"({"id":"g","blob_get":)" + body + "}"));
  };
  const std::string blob = "sha256:" + std::string(64, 'a');
  auto got = get(R"({"tenant":"acme","blob":")" + blob + "\"}");
  REQUIRE(std::holds_alternative<svc::blob_get_line>(got));
  CHECK(std::get<svc::blob_get_line>(got).blob == blob);
  check_error(refused_by(get(R"({"tenant":"acme","blob":"sha256:x"})")), "g", "invalid_request",
              "blob_get.blob: expected sha256: and 64 lowercase hex digits");
  check_error(refused_by(get(R"({"tenant":"acme","blob":")" + blob + R"(","x":1})")), "g",
              "invalid_request", "blob_get: unknown field 'x'");
}

TEST_CASE("line protocol: session lines read their members strictly", "[service][line_protocol]") {
  auto write = [](const std::string& body) {
    return svc::read_session_write(request(R"({"id":"w","session_write":)" + body + "}"));
  };
  auto text = write(R"({"session":"s1","text":"print(1)\n"})");
  REQUIRE(std::holds_alternative<svc::session_write_line>(text));
  CHECK(std::get<svc::session_write_line>(text).session == "s1");
  CHECK(std::get<svc::session_write_line>(text).data == "print(1)\n");
  auto bytes = write(R"({"session":"s1","data_b64":"AAE="})");
  REQUIRE(std::holds_alternative<svc::session_write_line>(bytes));
  CHECK(std::get<svc::session_write_line>(bytes).data == std::string("\0\1", 2));
  check_error(refused_by(write(R"({"session":"s1","text":"a","data_b64":""})")), "w",
              "invalid_request", "session_write: expected exactly one of data_b64 and text");
  check_error(refused_by(write(R"({"session":"s1"})")), "w", "invalid_request",
              "session_write: expected exactly one of data_b64 and text");
  check_error(refused_by(write(R"({"text":"a"})")), "w", "invalid_request",
              "session_write.session: required field is missing");

  auto close = svc::read_session_ref(request(R"({"id":"c","session_close":{"session":"s9"}})"));
  REQUIRE(std::holds_alternative<std::string>(close));
  CHECK(std::get<std::string>(close) == "s9");
  check_error(refused_by(svc::read_session_ref(
                  request(R"({"id":"c","session_close_stdin":{"session":"s","x":0}})"))),
              "c", "invalid_request", "session_close_stdin: unknown field 'x'");

  CHECK_FALSE(svc::read_service_stats(request(R"({"id":"st","service_stats":{}})")));
  auto stats = svc::read_service_stats(request(R"({"id":"st","service_stats":{"a":1}})"));
  REQUIRE(stats);
  check_error(json::parse(stats->line), "st", "invalid_request",
              "service_stats: unknown field 'a'");
}

TEST_CASE("line protocol: tickets and requests of runs are read, refusals are results",
          "[service][line_protocol]") {
  const sandbox::ticket_verifier no_keys;
  const std::string ticket = plain_ticket();
  auto run = svc::read_run(request(R"({"id":"r","ticket":)" + ticket +
                                   R"x(,"request":{"runtime":"python3","source":"print(1)"}})x"),
                           no_keys);
  REQUIRE(std::holds_alternative<svc::run_line>(run));
  CHECK(std::get<svc::run_line>(run).ticket.tenant() == "acme");
  CHECK(std::get<svc::run_line>(run).request.source == "print(1)");

  auto bad_request = refused_by(svc::read_run(
      request(R"({"id":"r","ticket":)" + ticket + R"(,"request":{"runtime":1}})"), no_keys));
  CHECK(bad_request.at("id") == "r");
  CHECK(bad_request.at("result").at("code") == "invalid_request");
  CHECK(bad_request.at("result").at("message").get<std::string>().starts_with("request: "));

  auto bad_ticket = refused_by(svc::read_run(
      request(R"({"id":"r","ticket":{"v":1},"request":{"runtime":"python3","source":""}})"),
      no_keys));
  CHECK(bad_ticket.at("result").at("message").get<std::string>().starts_with("ticket: "));

  SECTION("with trusted keys, only a signed document that verifies is a ticket") {
    sandbox::test::temp_dir dir;
    REQUIRE(sandbox::write_ed25519_key_files(dir.path, "k1").has_value());
    sandbox::ticket_verifier keys;
    REQUIRE(keys.load_keys(dir.path / "k1.pub.pem").has_value());
    auto unsigned_ticket = svc::read_ticket(json::parse(ticket), keys);
    REQUIRE_FALSE(unsigned_ticket.has_value());
    CHECK(unsigned_ticket.error().code == sandbox::code::action_denied);
    CHECK(unsigned_ticket.error().message ==
          "ticket: unsigned ticket: this daemon accepts only signed tickets");
    auto signer = sandbox::ticket_signer::load(dir.path / "k1.pem");
    REQUIRE(signer.has_value());
    auto t = sandbox::ticket_issuer{}.issue({.id = "t-2", .tenant = "acme"});
    REQUIRE(t.has_value());
    auto doc = signer->sign(*t);
    REQUIRE(doc.has_value());
    auto verified = svc::read_ticket(json::parse(*doc), keys);
    REQUIRE(verified.has_value());
    CHECK(verified->id() == "t-2");
  }
  SECTION("session_open: the ticket's rejection code, the request's invalid_request") {
    auto open = [&](const std::string& t, const std::string& r) {
      return svc::read_session_open(
          request(R"({"id":"o","session_open":{"ticket":)" + t + R"(,"request":)" + r + "}}"),
          no_keys);
    };
    auto ok = open(ticket, R"({"tool":"mcp"})");
    REQUIRE(std::holds_alternative<svc::session_open_line>(ok));
    CHECK(std::get<svc::session_open_line>(ok).request.tool == "mcp");
    auto a = refused_by(open(ticket, R"({"tool":7})"));
    CHECK(a.at("error").at("code") == "invalid_request");
    CHECK(a.at("error").at("message").get<std::string>().starts_with("session_open.request: "));
    auto b = refused_by(open(R"({"v":1})", R"({"tool":"mcp"})"));
    CHECK(b.at("error").at("message").get<std::string>().starts_with("session_open.ticket: "));
    check_error(refused_by(open(ticket, R"({"tool":"mcp"},"x":1)")), "o", "invalid_request",
                "session_open: unknown field 'x'");
  }
}

TEST_CASE("line protocol: leading_id reads only a plain id at the very start",
          "[service][line_protocol]") {
  CHECK(svc::leading_id(R"({"id":"abc","x":[)") == "abc");
  CHECK(svc::leading_id(" \t{ \"id\" :\n \"sp ace\"") == "sp ace");
  CHECK_FALSE(svc::leading_id(R"({"x":1,"id":"abc"})"));
  CHECK_FALSE(svc::leading_id(R"({"id":"a\"b"})"));  // escapes: not read without parsing
  CHECK_FALSE(svc::leading_id(R"({"id":""})"));
  CHECK_FALSE(svc::leading_id(R"({"id":"unterminated)"));
  CHECK_FALSE(svc::leading_id("{\"id\":\"\xff\"}"));
  CHECK(svc::leading_id(R"({"id":")" + std::string(128, 'i') + "\"") == std::string(128, 'i'));
  CHECK_FALSE(svc::leading_id(R"({"id":")" + std::string(129, 'i') + "\""));
  CHECK_FALSE(svc::leading_id(R"({"id":"abcd"})", 3));
}

TEST_CASE("line protocol: answer lines", "[service][line_protocol]") {
  CHECK(svc::answer_line("a\"b", "written", "3") == "{\"id\":\"a\\\"b\",\"written\":3}\n");
  CHECK(svc::answer_line(std::nullopt, "x", "true") == "{\"id\":null,\"x\":true}\n");
  CHECK(svc::error_line("e", "capacity", "too many") ==
        "{\"id\":\"e\",\"error\":{\"code\":\"capacity\",\"message\":\"too many\"}}\n");
  CHECK(svc::line_too_long_line(std::nullopt, 10) ==
        "{\"id\":null,\"error\":{\"code\":\"invalid_request\",\"message\":\"line is longer "
        "than 10 bytes\"}}\n");
  CHECK(svc::session_stdout_event("s1", "hi") == "{\"session\":\"s1\",\"stdout\":\"aGk=\"}\n");
  CHECK(svc::session_eof_event("s1") == "{\"session\":\"s1\",\"eof\":true}\n");
  CHECK(svc::quote_id("a\nb") == "'a\\x0ab'");
  CHECK(svc::quote_id("\u202egnp") == "'\\u202egnp'");

  sandbox::run_request req;
  req.runtime = "python3";
  req.source = "print(1)";
  auto t = sandbox::ticket_issuer{}.issue({.id = "t-1", .tenant = "acme"});
  REQUIRE(t.has_value());
  sandbox::run_result r;
  r.run_id = "run-1";
  auto line = svc::result_with_record_line("i", r, req, *t);
  REQUIRE(line.back() == '\n');
  auto j = json::parse(line);
  CHECK(j.at("id") == "i");
  CHECK(j.at("result").at("run_id") == "run-1");
  CHECK(j.at("record").at("result") == j.at("result"));
}

TEST_CASE("line protocol: base64 is RFC 4648's, padded, and strict", "[service][line_protocol]") {
  // RFC 4648 §10.
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},
      {"f", "Zg=="},
      {"fo", "Zm8="},
      {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="},
      {"fooba", "Zm9vYmE="},
      {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, encoded] : vectors) {
    CHECK(sandbox::detail::base64_encode(plain) == encoded);
    CHECK(sandbox::detail::base64_decode(encoded) == std::string(plain));
  }
  const std::string all = [] {
    std::string s;
    for (int i = 0; i < 256; ++i) s += static_cast<char>(i);
    return s;
  }();
  const auto encoded = sandbox::detail::base64_encode(all);
  CHECK(encoded.find_first_of("-_") == std::string::npos);
  CHECK(encoded.find_first_of("+/") != std::string::npos);
  CHECK(sandbox::detail::base64_decode(encoded) == all);
  for (const char* bad : {"Zg", "Zg=", "Zh==", "Zm9=", "Z===", "====", "Zg==Zg==", "Zm 9v",
                          "Zm9v\n", "Zm-v", "Zm_v", "=Zm9"}) {
    INFO(bad);
    CHECK_FALSE(sandbox::detail::base64_decode(bad));
  }
}
