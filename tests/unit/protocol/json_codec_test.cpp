// Unit tests of the strict JSON codec for run_request and run_result: every field's types,
// defaults and bounds, malformed documents, duplicate keys, nesting, sizes, round trips.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "sandbox/json.hpp"

using namespace std::string_literals;
using sandbox::decode_options;
using sandbox::decode_run_request;
using sandbox::decode_run_result;

namespace {

/// True when a decode succeeded; otherwise reports its rejection message on failure.
template <class T>
bool decoded(const boost::system::result<T, sandbox::rejection>& r) {
  if (!r.has_value()) UNSCOPED_INFO("rejected: " << r.error().message);
  return r.has_value();
}

const std::string blob_a = "sha256:" + std::string(64, 'a');
const std::string blob_b = "sha256:" + std::string(64, 'b');

/// The message of a request decode that must fail with invalid_request.
std::string request_error(std::string_view json, const decode_options& options = {}) {
  auto r = decode_run_request(json, options);
  if (r) return "<decoded>";
  CHECK(r.error().code == sandbox::code::invalid_request);
  return r.error().message;
}

/// Same for a result.
std::string result_error(std::string_view json) {
  auto r = decode_run_result(json);
  if (r) return "<decoded>";
  CHECK(r.error().code == sandbox::code::invalid_request);
  return r.error().message;
}

/// A minimal valid request with `extra` members appended.
std::string request_with(const std::string& extra) {
  return R"j({"runtime":"python3","source":"print(1)")j" + (extra.empty() ? "" : "," + extra) + "}";
}

/// A minimal valid result with `extra` members appended.
std::string result_with(const std::string& extra) {
  return R"({"code":"ok")" + (extra.empty() ? "" : "," + extra) + "}";
}

/// True when `message` is safe to show: valid UTF-8 JSON-encodable text without controls.
bool is_clean(const std::string& message) {
  if (!sandbox::is_valid_utf8(message)) return false;
  for (char c : message) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

sandbox::run_request full_request() {
  return sandbox::run_request{
      .runtime = "python3",
      .source = "import sys\nprint('h\xc3\xa9', file=sys.stderr)\n\0tail"s,
      .timeout = std::chrono::milliseconds(1234),
      .network = true,
      .files_in = {{.name = "data.csv", .blob = blob_a},
                   {.name = "\xf0\x9f\x98\x80", .blob = blob_b}},
      .files_out = {.max_files = 3, .max_bytes = 4096},
      .memory_limit_bytes = 64ULL << 20,
      .env = {{"A", "1"}, {"B_2", "two words\n"}},
      .runtime_digest = blob_b,
  };
}

sandbox::run_result full_result() {
  sandbox::run_result r;
  r.code = sandbox::code::seccomp_violation;
  r.message = "forbidden system call";
  r.exit_code = -1;
  r.signal = 31;
  r.std_out = {.summary = "1\n", .blob = blob_a, .bytes = 2, .total_bytes = 2, .truncated = false};
  r.std_err = {.summary = "x\\xff",
               .blob = blob_b,
               .bytes = 1 << 20,
               .total_bytes = 5ULL << 30,
               .truncated = true};
  r.files_out = {{.name = "out.txt", .blob = blob_a, .bytes = 10}};
  r.files_dropped = {{.name_display = "bad\\x0a", .reason = sandbox::drop_reason::bad_name},
                     {.name_display = "link", .reason = sandbox::drop_reason::not_regular_file},
                     {.name_display = "c", .reason = sandbox::drop_reason::count_limit},
                     {.name_display = "b", .reason = sandbox::drop_reason::bytes_limit},
                     {.name_display = "q", .reason = sandbox::drop_reason::quota_exceeded}};
  r.usage = {.setup = std::chrono::milliseconds(12),
             .wall = std::chrono::milliseconds(345),
             .cpu = std::chrono::milliseconds(300),
             .peak_memory_bytes = 12345678};
  r.oom_kills = 2;
  r.timeout_clamped = true;
  r.memory_clamped = true;
  r.timeout = std::chrono::milliseconds(8000);
  r.memory_limit_bytes = 512ULL << 20;
  r.isolation = sandbox::isolation::gvisor;
  r.runtime = {.name = "python3", .digest = blob_b};
  r.egress_attempts = {{.protocol = "dns",
                        .host = "example.com",
                        .address = "",
                        .port = 53,
                        .allowed = false,
                        .reason = "network disabled"},
                       {.protocol = "tcp",
                        .host = "",
                        .address = "93.184.216.34",
                        .port = 65535,
                        .allowed = true,
                        .reason = ""},
                       {.protocol = "https",
                        .host = "api.example.com",
                        .address = "93.184.216.34",
                        .port = 443,
                        .allowed = false,
                        .reason = "rule_refused",
                        .method = "POST",
                        .path = "/v1/rates/eu",
                        .rule = "rates-read,quote"}};
  r.egress_attempts_dropped = 7;
  r.violation = "ptrace";
  r.run_id = "run-0001";
  return r;
}

}  // namespace

// --- requests: happy paths ----------------------------------------------------------------

TEST_CASE("a minimal request takes the protocol defaults", "[json][request]") {
  auto r = decode_run_request(request_with(""));
  REQUIRE(r.has_value());
  CHECK(r->v == 1);
  CHECK(r->runtime == "python3");
  CHECK(r->source == "print(1)");
  CHECK(r->timeout == std::chrono::milliseconds(2000));
  CHECK_FALSE(r->network);
  CHECK(r->files_in.empty());
  CHECK(r->files_out == sandbox::output_limits{});
  CHECK(r->files_out.max_files == 16);
  CHECK(r->files_out.max_bytes == 8 * 1024 * 1024);
  CHECK(r->memory_limit_bytes == 256ULL * 1024 * 1024);
  CHECK(r->env.empty());
  CHECK_FALSE(r->runtime_digest);
  CHECK(*r == sandbox::run_request{.runtime = "python3", .source = "print(1)"});
}

TEST_CASE("a request with every field decodes", "[json][request]") {
  const std::string doc = R"({"v":1,"runtime":"node","source":"x","timeout_ms":500,)"
                          R"("network":true,"files_in":[{"name":"a","blob":")" +
                          blob_a +
                          R"("}],"files_out":{"max_files":2,"max_bytes":7},)"
                          R"("memory_limit_bytes":123,"env":{"K":"v"},"runtime_digest":")" +
                          blob_b + R"("})";
  auto r = decode_run_request(doc);
  REQUIRE(r.has_value());
  CHECK(r->runtime == "node");
  CHECK(r->timeout == std::chrono::milliseconds(500));
  CHECK(r->network);
  REQUIRE(r->files_in.size() == 1);
  CHECK(r->files_in[0] == sandbox::input_file{.name = "a", .blob = blob_a});
  CHECK(r->files_out == sandbox::output_limits{.max_files = 2, .max_bytes = 7});
  CHECK(r->memory_limit_bytes == 123);
  CHECK(r->env == std::map<std::string, std::string>{{"K", "v"}});
  CHECK(r->runtime_digest == blob_b);
}

TEST_CASE("files_out may give one cap; the other keeps its default", "[json][request]") {
  auto r = decode_run_request(request_with(R"("files_out":{"max_files":1})"));
  REQUIRE(r.has_value());
  CHECK(r->files_out == sandbox::output_limits{.max_files = 1});
  r = decode_run_request(request_with(R"("files_out":{})"));
  REQUIRE(r.has_value());
  CHECK(r->files_out == sandbox::output_limits{});
}

TEST_CASE("the decoder leaves semantic checks to admission", "[json][request]") {
  // These are all type-correct; admission refuses them (admission_test.cpp).
  auto r = decode_run_request(request_with(
      R"("timeout_ms":-1,"memory_limit_bytes":0,"files_in":[{"name":"../x","blob":"nope"}],)"
      R"("env":{"LD_PRELOAD":"x"},"runtime_digest":"sha256:XYZ")"));
  REQUIRE(r.has_value());
  CHECK(r->timeout == std::chrono::milliseconds(-1));
  CHECK(r->files_in[0].name == "../x");
  CHECK(r->runtime_digest == "sha256:XYZ");
  CHECK(decoded(decode_run_request(R"({"runtime":"","source":""})")));
  // An over-long source is admission's source_too_large, not a decode error.
  auto big =
      decode_run_request(R"({"runtime":"python3","source":")" + std::string(40000, 'x') + R"("})");
  REQUIRE(big.has_value());
  CHECK(big->source.size() == 40000);
}

TEST_CASE("escaped strings decode to their bytes", "[json][request]") {
  auto r = decode_run_request(R"({"runtime":"py\u0000","source":"\ud83d\ude00\n\"\\\/"})");
  REQUIRE(r.has_value());
  CHECK(r->runtime == "py\0"s);
  CHECK(r->source == "\xf0\x9f\x98\x80\n\"\\/");
  auto name =
      decode_run_request(request_with(R"("files_in":[{"name":"\u0065\u0301","blob":"b"}])"));
  REQUIRE(name.has_value());
  CHECK(name->files_in[0].name == "e\xcc\x81");
}

TEST_CASE("encode writes every field in the documented form", "[json][request]") {
  const sandbox::run_request r{.runtime = "python3", .source = "print(1)"};
  CHECK(sandbox::encode(r) ==
        R"j({"v":1,"runtime":"python3","source":"print(1)","timeout_ms":2000,"network":false,)j"
        R"("files_in":[],"files_out":{"max_files":16,"max_bytes":8388608},)"
        R"("memory_limit_bytes":268435456,"env":{}})");
  auto with_digest = r;
  with_digest.runtime_digest = blob_a;
  CHECK(sandbox::encode(with_digest).find(R"("runtime_digest":")" + blob_a + "\"") !=
        std::string::npos);
}

TEST_CASE("requests round-trip through JSON", "[json][request]") {
  std::vector<sandbox::run_request> values{
      {},
      {.runtime = "python3", .source = "print(1)"},
      full_request(),
      {.runtime = "x",
       .source = "",
       .timeout = std::chrono::milliseconds(-5),
       .files_out = {.max_files = 0, .max_bytes = 0},
       .memory_limit_bytes = 0},
      {.runtime = "x",
       .source = std::string("\x01\x1f\x7f\0", 4),
       .timeout = std::chrono::milliseconds(INT64_MAX),
       .files_out = {.max_files = UINT32_MAX, .max_bytes = UINT64_MAX},
       .memory_limit_bytes = UINT64_MAX},
      {.runtime = "x", .source = "y", .timeout = std::chrono::milliseconds(INT64_MIN)},
  };
  for (const auto& value : values) {
    const std::string text = sandbox::encode(value);
    INFO(text);
    CHECK(sandbox::is_valid_utf8(text));
    auto back = decode_run_request(text);
    REQUIRE(back.has_value());
    CHECK(*back == value);
    CHECK(sandbox::encode(*back) == text);
  }
}

// --- requests: field errors ----------------------------------------------------------------

TEST_CASE("required request fields must be present", "[json][request]") {
  CHECK(request_error(R"({"source":"x"})") == "runtime: required field is missing");
  CHECK(request_error(R"({"runtime":"x"})") == "source: required field is missing");
  CHECK(request_error("{}") == "runtime: required field is missing");
  CHECK(request_error(request_with(R"("files_in":[{"blob":"b"}])")) ==
        "files_in[0].name: required field is missing");
  CHECK(request_error(request_with(R"("files_in":[{"name":"a"}])")) ==
        "files_in[0].blob: required field is missing");
}

TEST_CASE("each request field refuses the wrong type, naming it", "[json][request]") {
  struct type_case {
    std::string member;
    std::string message;
  };
  const type_case cases[] = {
      {R"("timeout_ms":"100")", "timeout_ms: expected an integer"},
      {R"("timeout_ms":1.5)", "timeout_ms: expected an integer"},
      {R"("timeout_ms":1000.0)", "timeout_ms: expected an integer"},
      {R"("timeout_ms":1e3)", "timeout_ms: expected an integer"},
      {R"("timeout_ms":true)", "timeout_ms: expected an integer"},
      {R"("timeout_ms":null)", "timeout_ms: expected an integer"},
      {R"("timeout_ms":9223372036854775808)",
       "timeout_ms: out of range (-9223372036854775808 to 9223372036854775807)"},
      {R"("timeout_ms":-9223372036854775809)",
       "timeout_ms: out of range (-9223372036854775808 to 9223372036854775807)"},
      {R"("network":"true")", "network: expected true or false"},
      {R"("network":1)", "network: expected true or false"},
      {R"("network":null)", "network: expected true or false"},
      {R"("files_in":{})", "files_in: expected an array"},
      {R"("files_in":null)", "files_in: expected an array"},
      {R"("files_in":[1])", "files_in[0]: expected an object"},
      {R"("files_in":[{"name":"a","blob":"b"},{"name":"c","blob":"d"},{"name":"e","blob":5}])",
       "files_in[2].blob: expected a string"},
      {R"("files_in":[{"name":["a"],"blob":"b"}])", "files_in[0].name: expected a string"},
      {R"("files_in":[{"name":"a","blob":"b","size":1}])", "files_in[0]: unknown field 'size'"},
      {R"("files_out":[])", "files_out: expected an object"},
      {R"("files_out":16)", "files_out: expected an object"},
      {R"("files_out":{"max_files":-1})", "files_out.max_files: expected a non-negative integer"},
      {R"("files_out":{"max_files":1.5})", "files_out.max_files: expected a non-negative integer"},
      {R"("files_out":{"max_files":"16"})", "files_out.max_files: expected a non-negative integer"},
      {R"("files_out":{"max_files":4294967296})",
       "files_out.max_files: out of range (at most 4294967295)"},
      {R"("files_out":{"max_bytes":18446744073709551616})",
       "files_out.max_bytes: out of range (at most 18446744073709551615)"},
      {R"("files_out":{"max_bytes":-1})", "files_out.max_bytes: expected a non-negative integer"},
      {R"("files_out":{"max_count":1})", "files_out: unknown field 'max_count'"},
      {R"("memory_limit_bytes":-1)", "memory_limit_bytes: expected a non-negative integer"},
      {R"("memory_limit_bytes":"1G")", "memory_limit_bytes: expected a non-negative integer"},
      {R"("memory_limit_bytes":2.5e8)", "memory_limit_bytes: expected a non-negative integer"},
      {R"("memory_limit_bytes":99999999999999999999)",
       "memory_limit_bytes: out of range (at most 18446744073709551615)"},
      {R"("env":[])", "env: expected an object"},
      {R"("env":"A=1")", "env: expected an object"},
      {R"("env":{"A":1})", "env['A']: expected a string"},
      {R"("env":{"A":"1","B":null})", "env['B']: expected a string"},
      {R"("env":{"bad\nname":false})", "env['bad\\x0aname']: expected a string"},
      {R"("runtime_digest":null)", "runtime_digest: expected a string"},
      {R"("runtime_digest":5)", "runtime_digest: expected a string"},
      {R"("foo":1)", "unknown field 'foo'"},
      {R"("Runtime":"x")", "unknown field 'Runtime'"},
      {R"("timeout":100)", "unknown field 'timeout'"},
      {R"("files_out_max":1)", "unknown field 'files_out_max'"},
      {R"("a\nb":1)", "unknown field 'a\\x0ab'"},
      {R"("":1)", "unknown field ''"},
  };
  for (const auto& c : cases) {
    INFO(c.member);
    CHECK(request_error(request_with(c.member)) == c.message);
  }
  CHECK(request_error(R"({"runtime":5,"source":"x"})") == "runtime: expected a string");
  CHECK(request_error(R"({"runtime":null,"source":"x"})") == "runtime: expected a string");
  CHECK(request_error(R"({"runtime":"x","source":[]})") == "source: expected a string");
  CHECK(request_error(R"({"runtime":"x","source":{"a":1}})") == "source: expected a string");
}

TEST_CASE("the protocol version must be exactly 1", "[json][request]") {
  CHECK(decoded(decode_run_request(request_with(R"("v":1)"))));
  CHECK(request_error(request_with(R"("v":2)")) ==
        "v: unsupported protocol version 2 (this library speaks 1)");
  CHECK(request_error(request_with(R"("v":0)")) ==
        "v: unsupported protocol version 0 (this library speaks 1)");
  CHECK(request_error(request_with(R"("v":-0)")) ==
        "v: unsupported protocol version 0 (this library speaks 1)");
  for (const char* v : {R"("v":"1")", R"("v":1.0)", R"("v":-1)", R"("v":null)", R"("v":true)",
                        R"("v":[1])", R"("v":1e0)"}) {
    INFO(v);
    CHECK(request_error(request_with(v)) ==
          "v: unsupported protocol version (expected the integer 1)");
  }
  // The version is judged before unknown fields: a v2 document says so, not "unknown field".
  CHECK(request_error(R"({"v":2,"runtime":"x","source":"y","new_v2_field":1})") ==
        "v: unsupported protocol version 2 (this library speaks 1)");
}

TEST_CASE("large and odd values in the right type decode", "[json][request]") {
  auto r = decode_run_request(
      request_with(R"("files_out":{"max_files":4294967295,"max_bytes":18446744073709551615},)"
                   R"("memory_limit_bytes":-0)"));
  REQUIRE(r.has_value());
  CHECK(r->files_out.max_files == 4294967295U);
  CHECK(r->files_out.max_bytes == UINT64_MAX);
  CHECK(r->memory_limit_bytes == 0);
  auto names = decode_run_request(
      request_with(R"("files_in":[{"name":")" + std::string(4096, 'n') + R"(","blob":"b"}])"));
  REQUIRE(names.has_value());
  CHECK(names->files_in[0].name.size() == 4096);
}

TEST_CASE("a long unknown field name is quoted short", "[json][request]") {
  const std::string key(4096, 'k');
  const std::string message = request_error(request_with("\"" + key + "\":1"));
  CHECK(message == "unknown field '" + std::string(64, 'k') + "...'");
}

// --- documents: syntax, encoding, duplicates, depth, size ----------------------------------

TEST_CASE("malformed JSON is refused with a position, never echoing input", "[json][syntax]") {
  const char* docs[] = {
      "",
      " ",
      "{",
      "}",
      R"({"runtime":})",
      R"({"runtime":"x",})",
      R"({"runtime":"x" "source":"y"})",
      R"({'runtime':'x'})",
      R"({runtime:"x"})",
      R"({"runtime":"x","source":"y"} x)",
      R"({"runtime":"x","source":"y"}{})",
      R"(/* c */{"runtime":"x","source":"y"})",
      R"({"runtime":"x","source":"y"} // c)",
      R"({"runtime":"x","source":"y","timeout_ms":NaN})",
      R"({"runtime":"x","source":"y","timeout_ms":Infinity})",
      R"({"runtime":"x","source":"y","timeout_ms":0x10})",
      R"({"runtime":"x","source":"y","timeout_ms":010})",
      R"({"runtime":"x","source":"y","timeout_ms":+1})",
      R"({"runtime":"x","source":"y","timeout_ms":1.})",
      R"({"runtime":"x","source":"line
break"})",
      R"({"runtime":"x","source":"tab	inside"})",
      R"({"runtime":"x","source":"\x41"})",
      R"({"runtime":"x","source":"\u12"})",
      R"({"runtime":"x","source":"\ud800"})",
      R"({"runtime":"x","source":"\udc00"})",
      R"({"runtime":"x","source":"\ud800\u0041"})",
      R"({"runtime":SECRET_TOKEN_123})",
  };
  for (const char* d : docs) {
    INFO(d);
    const std::string message = request_error(d);
    // Inside a field the message starts with its path (`source: malformed JSON at ...`).
    CHECK(message.find("malformed JSON at byte ") != std::string::npos);
    CHECK(message.find("SECRET") == std::string::npos);
    CHECK(message.find("json.exception") == std::string::npos);
    CHECK(is_clean(message));
  }
  // A raw NUL ends the input for nlohmann's lexer: whatever follows must not be ignored.
  CHECK(request_error(R"({"runtime":"x","source":"y"})" + "\0"s) ==
        "malformed JSON at byte 29: NUL byte");
  CHECK(request_error(R"({"runtime":"x","source":"y"})" + "\0{\"evil\":1}"s) ==
        "malformed JSON at byte 29: NUL byte");
  CHECK(request_error(R"({"runtime":"x","source":"y)" + "\0"s + R"("})") ==
        "source: malformed JSON at byte 27: NUL byte");
  CHECK(request_error("\0"s) == "malformed JSON at byte 1: NUL byte");
  // nlohmann refuses floats that overflow a double; its message would quote the number.
  CHECK(request_error(request_with(R"("timeout_ms":1e400)")) ==
        "timeout_ms: malformed JSON at byte 59: number overflow");
  CHECK(request_error(R"({"runtime":SECRET})") ==
        "runtime: malformed JSON at byte 12: syntax error while parsing value - invalid literal");
}

TEST_CASE("top-level values other than an object are refused", "[json][syntax]") {
  for (const char* d : {"[]", "null", "1", "\"x\"", "true", "[{\"runtime\":\"x\"}]"}) {
    INFO(d);
    CHECK(request_error(d) == "expected a JSON object");
    CHECK(result_error(d) == "expected a JSON object");
  }
}

TEST_CASE("invalid UTF-8 anywhere is refused", "[json][utf8]") {
  const std::string bad[] = {
      "\xff",
      "\xc0\xaf",          // overlong '/'
      "\xe0\x80\xaf",      // overlong, 3 bytes
      "\xed\xa0\x80",      // raw surrogate
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "\xe2\x82",          // truncated
  };
  for (const auto& b : bad) {
    const std::string in_value = R"({"runtime":"x","source":")" + b + R"("})";
    CHECK(request_error(in_value) == "source: not valid UTF-8 (byte 26)");
    const std::string in_key = "{\"" + b + R"(":1,"runtime":"x","source":"y"})";
    CHECK(request_error(in_key) == "document is not valid UTF-8 (byte 3)");
    const std::string outside = R"({"runtime":"x","source":"y"})" + b;
    CHECK(request_error(outside) == "document is not valid UTF-8 (byte 29)");
  }
  CHECK(request_error("\xef\xbb\xbf" + request_with("")) ==
        "malformed JSON at byte 1: byte order mark not allowed");
}

TEST_CASE("faults inside a field name the field, however deep", "[json][syntax][utf8]") {
  // A model must be able to tell which of its values was refused (protocol.md: every
  // message starts with the field path). Only the whole document's own faults have none.
  const std::string entry_ok = R"({"name":"ok","blob":"b"})";
  auto files_doc = [&](const std::string& bad_entry) {
    return R"({"runtime":"x","source":"y","files_in":[)" + entry_ok + "," + bad_entry + "]}";
  };
  struct fault {
    std::string doc;
    std::string message;
  };
  const fault faults[] = {
      {files_doc(R"({"name":"a)"
                 "\xff"
                 R"(","blob":"b"})"),
       "files_in[1].name: not valid UTF-8 (byte 76)"},
      {files_doc(R"({"name":"a)"
                 "\0"s
                 R"(","blob":"b"})"),
       "files_in[1].name: malformed JSON at byte 76: NUL byte"},
      {files_doc(R"({"name":"\ud800","blob":"b"})"),
       "files_in[1].name: malformed JSON at byte 81: syntax error while parsing value - "
       "invalid string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"},
      {files_doc(R"({"name":"x","blob":"b\x"})"),
       "files_in[1].blob: malformed JSON at byte 88: syntax error while parsing value - "
       "invalid string: forbidden character after backslash"},
      // In a key, or between members: the enclosing object.
      {files_doc(R"({"na)"
                 "\xff"
                 R"(me":"x","blob":"b"})"),
       "files_in[1]: not valid UTF-8 (byte 70)"},
      {files_doc(R"({"name":"x" "blob":"b"})"),
       "files_in[1]: malformed JSON at byte 83: syntax error while parsing object - "
       "unexpected string literal; expected '}'"},
      // Between elements: the next element.
      {R"({"runtime":"x","source":"y","files_in":[)" + entry_ok + " x]}",
       "files_in[1]: malformed JSON at byte 66: syntax error while parsing array - invalid "
       "literal"},
      // A fault of its own before the bad byte comes first.
      {R"({"runtime":"x",,"source":")"
       "\xff"
       R"("})",
       "malformed JSON at byte 16: syntax error while parsing object key - unexpected ','; "
       "expected string literal"},
  };
  for (const auto& f : faults) {
    INFO(sandbox::escape_for_display(f.doc));
    CHECK(request_error(f.doc) == f.message);
  }
}

TEST_CASE("duplicate keys are refused, however they are spelled", "[json][duplicates]") {
  CHECK(request_error(R"({"runtime":"a","runtime":"b","source":"x"})") ==
        "duplicate field 'runtime'");
  // The same key after unescaping: a lenient parser would take one or the other.
  CHECK(request_error(R"({"runtime":"a","\u0072untime":"b","source":"x"})") ==
        "duplicate field 'runtime'");
  CHECK(request_error(R"({"source":"a","runtime":"x","source":"b"})") ==
        "duplicate field 'source'");
  CHECK(request_error(R"({"v":1,"v":1,"runtime":"x","source":"y"})") == "duplicate field 'v'");
  CHECK(request_error(request_with(R"("env":{"A":"1","A":"2"})")) == "env: duplicate field 'A'");
  CHECK(request_error(request_with(
            R"("files_in":[{"name":"a","blob":"b"},{"name":"a","blob":"b","name":"c"}])")) ==
        "files_in[1]: duplicate field 'name'");
  CHECK(request_error(request_with(R"("files_out":{"max_files":1,"max_files":100000})")) ==
        "files_out: duplicate field 'max_files'");
  CHECK(request_error(request_with(R"("unknown":{"x":1,"x":2})")) ==
        "unknown: duplicate field 'x'");
  CHECK(request_error(R"({"a\u0000b":1,"a\u0000b":2})") == "duplicate field 'a\\x00b'");
  CHECK(result_error(R"({"code":"ok","code":"timeout"})") == "duplicate field 'code'");
  // Keys that differ only in Unicode normalization are different keys (and both unknown).
  CHECK(request_error(request_with(R"("\u00e9":1,"e\u0301":2)")) == "unknown field 'e\xcc\x81'");
}

TEST_CASE("nesting deeper than max_depth is refused", "[json][depth]") {
  auto nested = [](std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  CHECK(request_error(nested(16)) == "expected a JSON object");
  CHECK(request_error(nested(17)) == "nesting deeper than 16 levels");
  CHECK(request_error(nested(100000)) == "nesting deeper than 16 levels");
  CHECK(request_error(std::string(100000, '[')) == "nesting deeper than 16 levels");
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += R"({"a":)";
  CHECK(request_error(objects) == "nesting deeper than 16 levels");
  // Depth inside an unknown field counts too (and is found before the field is).
  CHECK(request_error(request_with("\"x\":" + nested(15))) == "unknown field 'x'");
  CHECK(request_error(request_with("\"x\":" + nested(16))) == "nesting deeper than 16 levels");
  // A custom limit: files_in entries are at depth 3.
  const std::string doc = request_with(R"("files_in":[{"name":"a","blob":"b"}])");
  CHECK(decoded(decode_run_request(doc, {.max_depth = 3})));
  CHECK(request_error(doc, {.max_depth = 2}) == "nesting deeper than 2 levels");
  CHECK(request_error(doc, {.max_depth = 0}) == "nesting deeper than 0 levels");
}

TEST_CASE("messages stay short however deep and long the field path is", "[json][depth]") {
  // 15 levels of 64-byte keys, then a duplicate: the path is cut, the problem kept.
  std::string doc;
  for (int i = 0; i < 15; ++i) doc += "{\"" + std::string(64, static_cast<char>('a' + i)) + "\":";
  doc += R"({"x":1,"x":2})" + std::string(15, '}');
  const std::string message = request_error(doc);
  CHECK(message.size() < 200);
  CHECK(message.rfind(std::string(64, 'a') + "." + std::string(64, 'b') + ".", 0) == 0);
  CHECK(message.find("...: duplicate field 'x'") != std::string::npos);
  CHECK(is_clean(message));
}

TEST_CASE("documents over max_document_bytes are refused before parsing", "[json][size]") {
  const std::string doc = request_with("");
  CHECK(decoded(decode_run_request(doc, {.max_document_bytes = doc.size()})));
  CHECK(request_error(doc, {.max_document_bytes = doc.size() - 1}) ==
        "document is larger than " + std::to_string(doc.size() - 1) + " bytes");
  // Default: 8 MiB.
  const std::string huge = R"({"runtime":"x","source":")" + std::string(8 << 20, 'a') + R"("})";
  CHECK(request_error(huge) == "document is larger than 8388608 bytes");
  CHECK(result_error(R"({"code":"ok","message":")" + std::string(8 << 20, 'a') + R"("})") ==
        "document is larger than 8388608 bytes");
}

TEST_CASE("100,000 files_in entries decode without trouble", "[json][size]") {
  std::string doc = R"({"runtime":"python3","source":"x","files_in":[)";
  for (int i = 0; i < 100000; ++i) {
    if (i != 0) doc += ',';
    doc += R"({"name":"f","blob":"b"})";
  }
  doc += "]}";
  auto r = decode_run_request(doc);
  REQUIRE(decoded(r));  // the count is admission's rule (admission_test.cpp)
  CHECK(r->files_in.size() == 100000);
  doc.back() = ',';
  doc += "}";
  CHECK(request_error(doc).rfind("malformed JSON at byte ", 0) == 0);
}

// --- results -----------------------------------------------------------------------------

TEST_CASE("a minimal result needs only a code", "[json][result]") {
  auto r = decode_run_result(result_with(""));
  REQUIRE(r.has_value());
  sandbox::run_result expected;
  expected.code = sandbox::code::ok;
  CHECK(*r == expected);
  CHECK(result_error("{}") == "code: required field is missing");
}

TEST_CASE("results round-trip through JSON", "[json][result]") {
  sandbox::run_result rejected;
  rejected.code = sandbox::code::action_denied;
  rejected.message = "ticket does not grant code.execute";
  rejected.run_id = "r1";
  sandbox::run_result extremes;
  extremes.exit_code = INT32_MIN;
  extremes.signal = INT32_MAX;
  extremes.usage.wall = std::chrono::milliseconds(INT64_MAX);
  extremes.oom_kills = UINT32_MAX;
  extremes.egress_attempts_dropped = UINT32_MAX;
  extremes.memory_limit_bytes = UINT64_MAX;
  extremes.violation = "";
  extremes.backend = std::string(128, 'b');
  sandbox::run_result contained;
  contained.backend = "runsc 0.0~20221219.0";
  for (const auto& value : {sandbox::run_result{}, full_result(), rejected, extremes, contained}) {
    const std::string text = sandbox::encode(value);
    INFO(text);
    CHECK(text.find('\n') == std::string::npos);  // one line
    auto back = decode_run_result(text);
    REQUIRE(back.has_value());
    CHECK(*back == value);
    CHECK(sandbox::encode(*back) == text);
  }
}

TEST_CASE("an egress attempt's L7 members are written only when set", "[json][result]") {
  const auto j = nlohmann::json::parse(sandbox::encode(full_result()));
  const auto& attempts = j["egress_attempts"];
  REQUIRE(attempts.size() == 3);
  CHECK_FALSE(attempts[0].contains("method"));
  CHECK_FALSE(attempts[0].contains("path"));
  CHECK_FALSE(attempts[0].contains("rule"));
  CHECK(attempts[2]["method"] == "POST");
  CHECK(attempts[2]["path"] == "/v1/rates/eu");
  CHECK(attempts[2]["rule"] == "rates-read,quote");
  auto bad = decode_run_result(R"({"code":"ok","egress_attempts":[{"rule":7}]})");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().message == "egress_attempts[0].rule: expected a string");
}

TEST_CASE("a result's backend is a bounded string", "[json][result]") {
  sandbox::run_result r;
  r.backend = std::string(129, 'b');
  auto bad = decode_run_result(sandbox::encode(r));
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().message.find("backend") != std::string::npos);
  std::string text = sandbox::encode(sandbox::run_result{});
  text.replace(text.find("\"backend\":\"\""), 12, "\"backend\":7");
  auto wrong = decode_run_result(text);
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().message.find("backend") != std::string::npos);
}

TEST_CASE("every code round-trips by its wire string", "[json][result]") {
  for (std::size_t i = 0; i < sandbox::code_names.size(); ++i) {
    sandbox::run_result r;
    r.code = static_cast<sandbox::code>(i);
    const std::string text = sandbox::encode(r);
    CHECK(text.find("\"code\":\"" + std::string(sandbox::code_names[i]) + "\"") !=
          std::string::npos);
    auto back = decode_run_result(text);
    REQUIRE(back.has_value());
    CHECK(back->code == r.code);
  }
}

TEST_CASE("encode writes the documented result fields", "[json][result]") {
  const std::string text = sandbox::encode(sandbox::run_result{});
  CHECK(text == R"({"v":1,"code":"internal","message":"","exit_code":null,"signal":null,)"
                R"("stdout":{"summary":"","blob":"","bytes":0,"total_bytes":0,"truncated":false},)"
                R"("stderr":{"summary":"","blob":"","bytes":0,"total_bytes":0,"truncated":false},)"
                R"("files_out":[],"files_dropped":[],)"
                R"("usage":{"setup_ms":0,"wall_ms":0,"cpu_ms":0,"peak_memory_bytes":0},)"
                R"("oom_kills":0,"timeout_clamped":false,"memory_clamped":false,"timeout_ms":0,)"
                R"("memory_limit_bytes":0,"isolation":"process","runtime":{"name":"","digest":""},)"
                R"("egress_attempts":[],"egress_attempts_dropped":0,"violation":null,"run_id":"",)"
                R"("queue":null,"queue_wait_ms":0,"backend":"","approval":null})");
}

TEST_CASE("encoding invalid UTF-8 still gives valid JSON", "[json][result]") {
  sandbox::run_result r;
  r.message = "bad \xff byte";
  r.files_out = {{.name = "\xc0\xaf", .blob = blob_a, .bytes = 1}};
  const std::string text = sandbox::encode(r);
  CHECK(sandbox::is_valid_utf8(text));
  auto back = decode_run_result(text);
  REQUIRE(back.has_value());
  CHECK(back->message == "bad \xef\xbf\xbd byte");  // U+FFFD
}

TEST_CASE("each result field refuses the wrong type, naming it", "[json][result]") {
  struct type_case {
    std::string member;
    std::string message;
  };
  const type_case cases[] = {
      {R"("v":3)", "v: unsupported protocol version 3 (this library speaks 1)"},
      {R"("message":1)", "message: expected a string"},
      {R"("exit_code":"0")", "exit_code: expected an integer or null"},
      {R"("exit_code":1.5)", "exit_code: expected an integer"},
      {R"("exit_code":2147483648)", "exit_code: out of range (-2147483648 to 2147483647)"},
      {R"("exit_code":-2147483649)", "exit_code: out of range (-2147483648 to 2147483647)"},
      {R"("signal":false)", "signal: expected an integer or null"},
      {R"("stdout":"x")", "stdout: expected an object"},
      {R"("stdout":{"bytes":-1})", "stdout.bytes: expected a non-negative integer"},
      {R"("stderr":{"truncated":"yes"})", "stderr.truncated: expected true or false"},
      {R"("stderr":{"summary":null})", "stderr.summary: expected a string"},
      {R"("stderr":{"lines":1})", "stderr: unknown field 'lines'"},
      {R"("files_out":{})", "files_out: expected an array"},
      {R"("files_out":[{"name":"a","blob":"b"}])", "files_out[0].bytes: required field is missing"},
      {R"("files_out":[{"name":"a","blob":"b","bytes":-1}])",
       "files_out[0].bytes: expected a non-negative integer"},
      {R"("files_out":[{"name":"a","blob":"b","bytes":1,"mode":420}])",
       "files_out[0]: unknown field 'mode'"},
      {R"("files_dropped":[{"name_display":"a","reason":"weird"}])",
       "files_dropped[0].reason: unknown drop reason 'weird'"},
      {R"("files_dropped":[{"name_display":"a"}])",
       "files_dropped[0].reason: required field is missing"},
      {R"("files_dropped":[{"reason":"bad_name"}])",
       "files_dropped[0].name_display: required field is missing"},
      {R"("usage":{"wall_ms":-1})", "usage.wall_ms: expected a non-negative integer"},
      {R"("usage":{"cpu_ms":0.5})", "usage.cpu_ms: expected a non-negative integer"},
      {R"("usage":{"setup_ms":9223372036854775808})",
       "usage.setup_ms: out of range (at most 9223372036854775807)"},
      {R"("usage":{"peak_memory_bytes":"1"})",
       "usage.peak_memory_bytes: expected a non-negative integer"},
      {R"("usage":{"rss":1})", "usage: unknown field 'rss'"},
      {R"("oom_kills":4294967296)", "oom_kills: out of range (at most 4294967295)"},
      {R"("timeout_clamped":0)", "timeout_clamped: expected true or false"},
      {R"("memory_clamped":"false")", "memory_clamped: expected true or false"},
      {R"("timeout_ms":-1)", "timeout_ms: expected a non-negative integer"},
      {R"("memory_limit_bytes":-1)", "memory_limit_bytes: expected a non-negative integer"},
      {R"("isolation":"vm")", "isolation: unknown isolation level 'vm'"},
      {R"("isolation":"Process")", "isolation: unknown isolation level 'Process'"},
      {R"("isolation":1)", "isolation: expected a string"},
      {R"("runtime":"python3")", "runtime: expected an object"},
      {R"("runtime":{"name":"p","version":"3"})", "runtime: unknown field 'version'"},
      {R"("runtime":{"digest":5})", "runtime.digest: expected a string"},
      {R"("egress_attempts":[{"port":65536}])",
       "egress_attempts[0].port: out of range (at most 65535)"},
      {R"("egress_attempts":[{},{"allowed":"no"}])",
       "egress_attempts[1].allowed: expected true or false"},
      {R"("egress_attempts":[{"pid":1}])", "egress_attempts[0]: unknown field 'pid'"},
      {R"("egress_attempts_dropped":-3)",
       "egress_attempts_dropped: expected a non-negative integer"},
      {R"("violation":5)", "violation: expected a string or null"},
      {R"("violation":["ptrace"])", "violation: expected a string or null"},
      {R"("run_id":null)", "run_id: expected a string"},
      {R"("stack":"...")", "unknown field 'stack'"},
  };
  for (const auto& c : cases) {
    INFO(c.member);
    CHECK(result_error(result_with(c.member)) == c.message);
  }
  CHECK(result_error(R"({"code":"boom"})") == "code: unknown code 'boom'");
  CHECK(result_error(R"({"code":"OK"})") == "code: unknown code 'OK'");
  CHECK(result_error(R"({"code":1})") == "code: expected a string");
}

TEST_CASE("optional result fields accept null where documented", "[json][result]") {
  auto r = decode_run_result(result_with(R"("exit_code":null,"signal":null,"violation":null)"));
  REQUIRE(r.has_value());
  CHECK_FALSE(r->exit_code);
  CHECK_FALSE(r->signal);
  CHECK_FALSE(r->violation);
  r = decode_run_result(result_with(R"("exit_code":0,"signal":9,"violation":"ptrace")"));
  REQUIRE(r.has_value());
  CHECK(r->exit_code == 0);
  CHECK(r->signal == 9);
  CHECK(r->violation == "ptrace");
}

// --- sessions (the service daemon's session_open request and session_close answer) ---------

TEST_CASE("a session request decodes strictly and round-trips", "[json][session]") {
  auto r = sandbox::decode_session_request(R"({"tool":"mcp-everything"})");
  REQUIRE(decoded(r));
  CHECK(r->tool == "mcp-everything");
  CHECK_FALSE(r->max_lifetime.has_value());
  CHECK_FALSE(r->idle_timeout.has_value());

  sandbox::session_request full{.tool = "cat",
                                .max_lifetime = std::chrono::milliseconds(60000),
                                .idle_timeout = std::chrono::milliseconds(5)};
  auto back = sandbox::decode_session_request(sandbox::encode(full));
  REQUIRE(decoded(back));
  CHECK(*back == full);

  auto error = [](std::string_view json) {
    auto d = sandbox::decode_session_request(json);
    if (d) return "<decoded>"s;
    CHECK(d.error().code == sandbox::code::invalid_request);
    return d.error().message;
  };
  CHECK(error(R"({})") == "tool: required field is missing");
  CHECK(error(R"({"tool":7})") == "tool: expected a string");
  CHECK(error(R"({"tool":"cat","binary":"/bin/sh"})") == "unknown field 'binary'");
  CHECK(error(R"({"tool":"cat","idle_timeout_ms":"5"})").rfind("idle_timeout_ms: ", 0) == 0);
  // Durations ≤ 0 under their wire names (the schema's minimum 1), whatever the value.
  for (const char* v : {"0", "-1", "-9223372036854775808"}) {
    CHECK(error(R"({"tool":"cat","max_lifetime_ms":)"s + v + "}") ==
          "max_lifetime_ms: must be > 0");
    CHECK(error(R"({"tool":"cat","idle_timeout_ms":)"s + v + "}") ==
          "idle_timeout_ms: must be > 0");
  }
  sandbox::session_request negative{.tool = "cat", .idle_timeout = std::chrono::milliseconds(-5)};
  CHECK(error(sandbox::encode(negative)) == "idle_timeout_ms: must be > 0");
  CHECK(error(R"({"tool":"cat","max_lifetime_ms":1e400})") != "<decoded>");
  CHECK(error(R"({"tool":"cat","v":2})") != "<decoded>");
  CHECK(error(R"({"tool":"cat","tool":"sh"})") != "<decoded>");
  CHECK(error("[1]") != "<decoded>");
}

TEST_CASE("a session result encodes every field and decodes back", "[json][session]") {
  sandbox::session_result r;
  r.end = sandbox::session_end::idle_timeout;
  r.result.code = sandbox::code::timeout;
  r.result.message = "the session was idle";
  r.result.signal = 9;
  r.result.std_out.total_bytes = 12;
  r.bytes_to_server = 34;
  r.bytes_from_server = 12;
  const std::string text = sandbox::encode(r);
  const auto j = nlohmann::json::parse(text);
  CHECK(j["end"] == "idle_timeout");
  CHECK(j["result"]["code"] == "timeout");
  CHECK(j["bytes_to_server"] == 34);
  CHECK(j["bytes_from_server"] == 12);
  auto back = sandbox::decode_session_result(text);
  REQUIRE(decoded(back));
  CHECK(*back == r);

  auto error = [](std::string_view json) {
    auto d = sandbox::decode_session_result(json);
    if (d) return "<decoded>"s;
    CHECK(d.error().code == sandbox::code::invalid_request);
    return d.error().message;
  };
  auto doc = j;
  doc["end"] = "vanished";
  CHECK(error(doc.dump()) == "end: unknown session end 'vanished'");
  doc = j;
  doc["result"]["code"] = "nope";
  CHECK(error(doc.dump()).rfind("result: ", 0) == 0);
  doc = j;
  doc["bytes_to_server"] = -1;
  CHECK(error(doc.dump()).rfind("bytes_to_server: ", 0) == 0);
  doc = j;
  doc.erase("end");
  CHECK(error(doc.dump()) == "end: required field is missing");
  doc = j;
  doc["extra"] = 1;
  CHECK(error(doc.dump()) == "unknown field 'extra'");
}
