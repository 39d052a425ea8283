// Unit tests of admission: every rule, its boundary, its message, and the order of checks.
#include "sandbox/admission.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <variant>

#include "protocol/text_util.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/json.hpp"

using namespace std::string_literals;
using namespace std::chrono_literals;
using sandbox::admit;
using sandbox::admitted;
using sandbox::code;
using sandbox::host_catalog;
using sandbox::isolation;
using sandbox::rejection;
using sandbox::run_request;
using sandbox::ticket_spec;

namespace {

/// True when a decode succeeded; otherwise reports its rejection message on failure.
template <class T>
bool decoded(const boost::system::result<T, sandbox::rejection>& r) {
  if (!r.has_value()) UNSCOPED_INFO("rejected: " << r.error().message);
  return r.has_value();
}

const std::string python_digest = "sha256:" + std::string(64, 'a');
const std::string other_digest = "sha256:" + std::string(64, 'b');
const std::string blob = "sha256:" + std::string(64, 'c');

sandbox::ticket make_ticket(ticket_spec s = {.id = "t-1", .tenant = "acme"}, bool network = false) {
  sandbox::ticket_issuer issuer;
  // A network ticket names its domains; these tests' network requests ask for this one.
  if (network && s.egress.empty()) s.egress = {"api.example.com"};
  auto t = network ? issuer.issue(s, sandbox::network_grant{}) : issuer.issue(s);
  REQUIRE(t.has_value());
  return *t;
}

host_catalog catalog() {
  return host_catalog{.levels = {isolation::process, isolation::container},
                      .runtimes = {{"python3", python_digest}, {"node", std::nullopt}}};
}

sandbox::policy policy() {
  sandbox::policy p;
  p.allowed_env = {"MY_VAR",
                   "PATH",
                   "HOME",
                   "LANG",
                   "LD_PRELOAD",
                   "SANDBOX_INPUT_DIR",
                   "HTTP_PROXY",
                   "X" + std::string(127, 'x'),
                   "X" + std::string(128, 'x')};
  for (int i = 0; i < 40; ++i) p.allowed_env.insert("V" + std::to_string(i));
  return p;
}

run_request request() { return run_request{.runtime = "python3", .source = "print(1)"}; }

/// Admits with the defaults above, overriding what the test needs.
std::variant<admitted, rejection> run_admit(const run_request& r,
                                            const sandbox::ticket& t = make_ticket(),
                                            const sandbox::policy& p = policy(),
                                            const host_catalog& c = catalog()) {
  return admit(r, t, p, c);
}

admitted accepted(const std::variant<admitted, rejection>& v) {
  if (const auto* rej = std::get_if<rejection>(&v)) {
    FAIL("rejected: " << sandbox::to_string(rej->code) << ": " << rej->message);
  }
  return std::get<admitted>(v);
}

rejection refused(const std::variant<admitted, rejection>& v) {
  if (std::holds_alternative<admitted>(v)) FAIL("admitted, expected a rejection");
  return std::get<rejection>(v);
}

/// The invalid_request message, or a marker when the code differs.
std::string invalid(const std::variant<admitted, rejection>& v) {
  if (std::holds_alternative<admitted>(v)) return "<admitted>";
  const auto& r = std::get<rejection>(v);
  if (r.code != code::invalid_request) return "<" + std::string(sandbox::to_string(r.code)) + ">";
  return r.message;
}

run_request with_files(std::vector<sandbox::input_file> files) {
  auto r = request();
  r.files_in = std::move(files);
  return r;
}

}  // namespace

TEST_CASE("a plain request is admitted and normalized", "[admission]") {
  const auto a = accepted(run_admit(request()));
  CHECK(a.request == request());
  CHECK(a.tenant == "acme");
  CHECK(a.ticket_id == "t-1");
  CHECK(a.isolation == isolation::process);
  CHECK(a.runtime == sandbox::runtime_info{"python3", python_digest});
  CHECK_FALSE(a.timeout_clamped);
  CHECK_FALSE(a.memory_clamped);
  CHECK_FALSE(a.files_out_clamped);
}

TEST_CASE("admission refuses a version other than 1", "[admission]") {
  auto r = request();
  r.v = 2;
  CHECK(invalid(run_admit(r)) == "v: unsupported protocol version 2 (this library speaks 1)");
  r.v = 0;
  CHECK(invalid(run_admit(r)) == "v: unsupported protocol version 0 (this library speaks 1)");
}

TEST_CASE("admission refuses an empty runtime", "[admission]") {
  auto r = request();
  r.runtime.clear();
  CHECK(invalid(run_admit(r)) == "runtime: must not be empty");
}

TEST_CASE("timeouts: <= 0 refused, above the ceiling clamped", "[admission][timeout]") {
  auto r = request();
  for (auto t : {0ms, -1ms, std::chrono::milliseconds(INT64_MIN)}) {
    r.timeout = t;
    CHECK(invalid(run_admit(r)) == "timeout_ms: must be greater than 0");
  }
  r.timeout = 1ms;
  auto a = accepted(run_admit(r));
  CHECK(a.request.timeout == 1ms);
  CHECK_FALSE(a.timeout_clamped);
  r.timeout = 8000ms;
  a = accepted(run_admit(r));
  CHECK(a.request.timeout == 8000ms);
  CHECK_FALSE(a.timeout_clamped);
  r.timeout = 8001ms;
  a = accepted(run_admit(r));
  CHECK(a.request.timeout == 8000ms);
  CHECK(a.timeout_clamped);
  r.timeout = std::chrono::milliseconds(INT64_MAX);
  a = accepted(run_admit(r));
  CHECK(a.request.timeout == 8000ms);
  CHECK(a.timeout_clamped);
  // The lower of the ticket's and the policy's ceilings wins.
  r.timeout = 6000ms;
  a = accepted(run_admit(r, make_ticket({.id = "t", .tenant = "a", .max_timeout = 5000ms})));
  CHECK(a.request.timeout == 5000ms);
  CHECK(a.timeout_clamped);
  auto p = policy();
  p.max_timeout = 3000ms;
  a = accepted(run_admit(r, make_ticket(), p));
  CHECK(a.request.timeout == 3000ms);
  CHECK(a.timeout_clamped);
}

TEST_CASE("memory: below the minimum refused, above the ceiling clamped", "[admission][memory]") {
  auto r = request();
  r.memory_limit_bytes = (32ULL << 20) - 1;
  CHECK(invalid(run_admit(r)) == "memory_limit_bytes: below the minimum of 33554432");
  r.memory_limit_bytes = 0;
  CHECK(invalid(run_admit(r)) == "memory_limit_bytes: below the minimum of 33554432");
  r.memory_limit_bytes = 32ULL << 20;
  auto a = accepted(run_admit(r));
  CHECK(a.request.memory_limit_bytes == 32ULL << 20);
  CHECK_FALSE(a.memory_clamped);
  r.memory_limit_bytes = 512ULL << 20;  // the ticket's default ceiling
  a = accepted(run_admit(r));
  CHECK_FALSE(a.memory_clamped);
  r.memory_limit_bytes = (512ULL << 20) + 1;
  a = accepted(run_admit(r));
  CHECK(a.request.memory_limit_bytes == 512ULL << 20);
  CHECK(a.memory_clamped);
  // Policy ceiling (1 GiB) below a generous ticket.
  r.memory_limit_bytes = UINT64_MAX;
  a = accepted(
      run_admit(r, make_ticket({.id = "t", .tenant = "a", .max_memory_bytes = 4ULL << 30})));
  CHECK(a.request.memory_limit_bytes == 1ULL << 30);
  CHECK(a.memory_clamped);
}

TEST_CASE("files_in: at most 16 entries", "[admission][files_in]") {
  std::vector<sandbox::input_file> files;
  for (int i = 0; i < 16; ++i) files.push_back({.name = "f" + std::to_string(i), .blob = blob});
  CHECK(accepted(run_admit(with_files(files))).request.files_in.size() == 16);
  files.push_back({.name = "f16", .blob = blob});
  CHECK(invalid(run_admit(with_files(files))) == "files_in: 17 entries, more than the limit of 16");
  // The count is judged before any entry: bad entries do not change the message.
  files[0].name = "../x";
  CHECK(invalid(run_admit(with_files(files))) == "files_in: 17 entries, more than the limit of 16");
}

TEST_CASE("100,000 files_in entries from JSON are refused quickly", "[admission][files_in]") {
  std::string doc = R"({"runtime":"python3","source":"x","files_in":[)";
  for (int i = 0; i < 100000; ++i) {
    if (i != 0) doc += ',';
    doc += R"({"name":"../../etc/passwd","blob":"x"})";
  }
  doc += "]}";
  auto r = sandbox::decode_run_request(doc);
  REQUIRE(r.has_value());
  CHECK(invalid(run_admit(*r)) == "files_in: 100000 entries, more than the limit of 16");
}

TEST_CASE("files_in names: each bad kind is refused with its reason", "[admission][files_in]") {
  struct name_case {
    std::string name;
    std::string reason;
  };
  const name_case cases[] = {
      {"", "is empty"},
      {".", "is '.' or '..'"},
      {"..", "is '.' or '..'"},
      {"../etc/passwd", "contains '/'"},
      {"/etc/passwd", "contains '/'"},
      {"a/b", "contains '/'"},
      {"..\\..\\x", ""},  // backslashes are ordinary characters on Linux
      {"a\0b"s, "contains a control character (U+0000)"},
      {"a\nb", "contains a control character (U+000A)"},
      {"\xff", "is not valid UTF-8"},
      {"\xc0\xae\xc0\xae", "is not valid UTF-8"},  // overlong ".."
      {"\xc0\xaf", "is not valid UTF-8"},          // overlong "/"
      {"\xed\xa0\x80", "is not valid UTF-8"},      // surrogate
      {"e\xcc\x81", "is not (provably) in Unicode normalization form C: contains U+0301"},
      {std::string(255, 'n'), ""},
      {std::string(256, 'n'), "is longer than 255 bytes"},
      {std::string(4096, 'n'), "is longer than 255 bytes"},
      {"%2e%2e%2fetc", ""},  // percent signs are ordinary characters
  };
  for (const auto& c : cases) {
    INFO(sandbox::escape_for_display(c.name));
    // Third position: the index in the message must be the entry's.
    auto r = with_files(
        {{.name = "a", .blob = blob}, {.name = "b", .blob = blob}, {.name = c.name, .blob = blob}});
    if (c.reason.empty()) {
      CHECK(invalid(run_admit(r)) == "<admitted>");
    } else {
      CHECK(invalid(run_admit(r)) == "files_in[2].name: " + c.reason);
    }
  }
}

TEST_CASE("files_in names must be unique, also under normalization", "[admission][files_in]") {
  CHECK(invalid(run_admit(with_files({{.name = "a", .blob = blob},
                                      {.name = "b", .blob = blob},
                                      {.name = "a", .blob = blob}}))) ==
        "files_in[2].name: duplicate of files_in[0].name");
  // "é" precomposed (NFC) and decomposed: the decomposed one is refused, so two names that
  // are equal under normalization never both reach the sandbox.
  CHECK(invalid(run_admit(with_files(
            {{.name = "caf\xc3\xa9", .blob = blob}, {.name = "cafe\xcc\x81", .blob = blob}}))) ==
        "files_in[1].name: is not (provably) in Unicode normalization form C: contains U+0301");
  CHECK(invalid(run_admit(with_files(
            {{.name = "cafe\xcc\x81", .blob = blob}, {.name = "caf\xc3\xa9", .blob = blob}}))) ==
        "files_in[0].name: is not (provably) in Unicode normalization form C: contains U+0301");
  // Å: U+00C5 (NFC) vs U+212B ANGSTROM SIGN (normalizes to U+00C5).
  CHECK(invalid(run_admit(with_files(
            {{.name = "\xc3\x85", .blob = blob}, {.name = "\xe2\x84\xab", .blob = blob}}))) ==
        "files_in[1].name: is not (provably) in Unicode normalization form C: contains U+212B");
  // Case differs: different files on Linux.
  CHECK(invalid(run_admit(with_files(
            {{.name = "A", .blob = blob}, {.name = "a", .blob = blob}}))) == "<admitted>");
}

TEST_CASE("files_in blob ids must be sha256 + 64 lowercase hex", "[admission][files_in]") {
  const std::string hex(64, 'e');
  const std::string bad[] = {
      "",
      "sha256:",
      "sha256:" + hex.substr(1),         // 63 digits
      "sha256:" + hex + "e",             // 65 digits
      "sha256:" + std::string(64, 'E'),  // uppercase
      "SHA256:" + hex,
      "sha512:" + hex,
      "sha256-" + hex,
      " sha256:" + hex,
      "sha256:" + hex + "\n",
      "sha256:" + hex.substr(2) + "%65",  // percent-encoded digit (same length)
      "sha256%3a" + hex,
      "sha256:" + hex.substr(1) + "g",
      "../blobs/sha256:" + hex,
      "sha256:../" + hex.substr(3),
      "sha256:" + hex.substr(1) + "\0"s,
      hex,
  };
  for (const auto& b : bad) {
    INFO(sandbox::escape_for_display(b));
    CHECK(invalid(run_admit(with_files({{.name = "x", .blob = blob}, {.name = "y", .blob = b}}))) ==
          "files_in[1].blob: not a blob id (expected 'sha256:' and 64 lowercase hex digits)");
  }
  CHECK(invalid(run_admit(with_files({{.name = "x", .blob = "sha256:" + hex}}))) == "<admitted>");
}

TEST_CASE("files_out above the policy is clamped, never refused", "[admission][files_out]") {
  auto r = request();
  r.files_out = {.max_files = 256, .max_bytes = 64ULL << 20};
  auto a = accepted(run_admit(r));
  CHECK(a.request.files_out == r.files_out);
  CHECK_FALSE(a.files_out_clamped);
  r.files_out = {.max_files = 257, .max_bytes = 1};
  a = accepted(run_admit(r));
  CHECK(a.request.files_out == sandbox::output_limits{.max_files = 256, .max_bytes = 1});
  CHECK(a.files_out_clamped);
  r.files_out = {.max_files = 1, .max_bytes = (64ULL << 20) + 1};
  a = accepted(run_admit(r));
  CHECK(a.request.files_out == sandbox::output_limits{.max_files = 1, .max_bytes = 64ULL << 20});
  CHECK(a.files_out_clamped);
  r.files_out = {.max_files = 0, .max_bytes = 0};  // "return nothing" is fine
  a = accepted(run_admit(r));
  CHECK(a.request.files_out == r.files_out);
  CHECK_FALSE(a.files_out_clamped);
}

TEST_CASE("env: only allowed, well-formed, unreserved names", "[admission][env]") {
  auto with_env = [](std::map<std::string, std::string> env) {
    auto r = request();
    r.env = std::move(env);
    return r;
  };
  CHECK(invalid(run_admit(with_env({{"MY_VAR", "1"}}))) == "<admitted>");
  CHECK(invalid(run_admit(with_env({{"OTHER", "1"}}))) ==
        "env['OTHER']: not allowed by the policy");
  CHECK(invalid(run_admit(with_env({{"my_var", "1"}}))) ==
        "env['my_var']: not allowed by the policy");
  for (const char* reserved : {"PATH", "HOME", "LANG", "LD_PRELOAD", "SANDBOX_INPUT_DIR",
                               "HTTP_PROXY", "LD_LIBRARY_PATH", "SANDBOX_", "https_proxy",
                               "Http_Proxy", "hTTPs_pROXY", "FTP_PROXY", "no_Proxy", "_proxy"}) {
    INFO(reserved);
    CHECK(invalid(run_admit(with_env({{reserved, "x"}}))) ==
          "env['" + std::string(reserved) + "']: reserved name, set by the sandbox");
  }
  for (const std::string bad : {""s, "1A"s, "A-B"s, "A B"s, "A=B"s, "A\0B"s, "\xc3\xa9"s, "$A"s}) {
    INFO(sandbox::escape_for_display(bad));
    CHECK(invalid(run_admit(with_env({{bad, "x"}}))) ==
          "env[" + sandbox::detail::quote_for_message(bad) +
              "]: not a valid name (expected [A-Za-z_][A-Za-z0-9_]*)");
  }
  const std::string name128 = "X" + std::string(127, 'x');
  const std::string name129 = "X" + std::string(128, 'x');
  CHECK(invalid(run_admit(with_env({{name128, "x"}}))) == "<admitted>");
  CHECK(invalid(run_admit(with_env({{name129, "x"}}))) ==
        "env['" + name129.substr(0, 64) + "...']: name longer than 128 bytes");
  CHECK(invalid(run_admit(with_env({{"MY_VAR", "a\0b"s}}))) == "env['MY_VAR']: value contains NUL");
  CHECK(invalid(run_admit(with_env({{"MY_VAR", std::string(4096, 'v')}}))) == "<admitted>");
  CHECK(invalid(run_admit(with_env({{"MY_VAR", std::string(4097, 'v')}}))) ==
        "env['MY_VAR']: value longer than 4096 bytes");
  std::map<std::string, std::string> many;
  for (int i = 0; i < 32; ++i) many["V" + std::to_string(i)] = "x";
  CHECK(invalid(run_admit(with_env(many))) == "<admitted>");
  many["V32"] = "x";
  CHECK(invalid(run_admit(with_env(many))) == "env: 33 entries, more than the limit of 32");
}

TEST_CASE("runtime_digest must be sha256 syntax when set", "[admission][digest]") {
  auto r = request();
  for (const std::string bad : {""s, "sha256:"s, "sha256:" + std::string(64, 'A'), "latest"s,
                                "sha256:" + std::string(63, 'a')}) {
    r.runtime_digest = bad;
    CHECK(invalid(run_admit(r)) ==
          "runtime_digest: expected 'sha256:' and 64 lowercase hex digits");
  }
  r.runtime_digest = python_digest;
  CHECK(accepted(run_admit(r)).runtime.digest == python_digest);
  r.runtime_digest = other_digest;
  const auto rej = refused(run_admit(r));
  CHECK(rej.code == code::digest_mismatch);
  CHECK(rej.message == "runtime_digest: does not match the installed image of 'python3'");
}

TEST_CASE("a ticket's runtime_digest pins the image every run must use", "[admission][digest]") {
  const auto pinned_to = [](const std::string& digest) {
    return make_ticket({.id = "t-1", .tenant = "acme", .runtime_digest = digest});
  };
  auto r = request();
  SECTION("the pin equals the installed image: admitted, with or without a request pin") {
    const auto a = accepted(run_admit(r, pinned_to(python_digest)));
    CHECK(a.runtime.digest == python_digest);
    CHECK_FALSE(a.request.runtime_digest);  // the request is not rewritten
    r.runtime_digest = python_digest;
    CHECK(accepted(run_admit(r, pinned_to(python_digest))).runtime.digest == python_digest);
    // Network tickets carry the pin too.
    r.network = true;
    r.egress = {"api.example.com"};
    const auto net = make_ticket({.id = "t-1", .tenant = "acme", .runtime_digest = python_digest},
                                 /*network=*/true);
    CHECK(accepted(run_admit(r, net)).isolation == isolation::container);
  }
  SECTION("the host rolled its image: digest_mismatch naming ticket.runtime_digest") {
    const auto rej = refused(run_admit(r, pinned_to(other_digest)));
    CHECK(rej.code == code::digest_mismatch);
    CHECK(rej.message == "ticket.runtime_digest: does not match the installed image of 'python3'");
    // Whatever the request says: its own pin of the installed image does not override.
    r.runtime_digest = python_digest;
    CHECK(refused(run_admit(r, pinned_to(other_digest))).message ==
          "ticket.runtime_digest: does not match the installed image of 'python3'");
    // Nor does a request pin equal to the ticket's.
    r.runtime_digest = other_digest;
    CHECK(refused(run_admit(r, pinned_to(other_digest))).message ==
          "ticket.runtime_digest: does not match the installed image of 'python3'");
    // Rolled back, or another runtime's image: the same.
    host_catalog rolled = catalog();
    rolled.runtimes["python3"] = other_digest;
    r.runtime_digest.reset();
    CHECK(refused(run_admit(r, pinned_to(python_digest), policy(), rolled)).code ==
          code::digest_mismatch);
    CHECK(accepted(run_admit(r, pinned_to(other_digest), policy(), rolled)).runtime.digest ==
          other_digest);
  }
  SECTION("a request pin other than the ticket's: digest_mismatch") {
    r.runtime_digest = other_digest;
    const auto rej = refused(run_admit(r, pinned_to(python_digest)));
    CHECK(rej.code == code::digest_mismatch);
    CHECK(rej.message == "runtime_digest: does not match ticket.runtime_digest");
  }
  SECTION("messages never carry a digest or a host path") {
    r.runtime_digest = other_digest;
    for (const auto& t : {pinned_to(other_digest), pinned_to(python_digest)}) {
      const auto message = refused(run_admit(r, t)).message;
      CHECK(message.find("sha256") == std::string::npos);
      CHECK(message.find('/') == std::string::npos);
    }
  }
  SECTION("earlier steps still come first") {
    // 5 before 6: an absent image is runtime_unavailable, not a mismatch.
    r.runtime = "node";
    CHECK(refused(run_admit(r, pinned_to(python_digest))).code == code::runtime_unavailable);
    // 1 before 6: a malformed request pin is invalid_request, not a mismatch.
    r.runtime = "python3";
    r.runtime_digest = "sha256:" + std::string(64, 'A');
    CHECK(invalid(run_admit(r, pinned_to(other_digest))) ==
          "runtime_digest: expected 'sha256:' and 64 lowercase hex digits");
  }
}

TEST_CASE("source: 32 KiB accepted, one byte more is source_too_large", "[admission][source]") {
  auto r = request();
  r.source = std::string(32768, 's');
  CHECK(accepted(run_admit(r)).request.source.size() == 32768);  // never truncated
  r.source = std::string(32769, 's');
  const auto rej = refused(run_admit(r));
  CHECK(rej.code == code::source_too_large);
  CHECK(rej.message == "source: 32769 bytes, over the limit of 32768");
}

TEST_CASE("the ticket must grant code.execute, and code.network for network",
          "[admission][ticket]") {
  auto no_exec = make_ticket({.id = "t", .tenant = "a", .execute = false});
  auto rej = refused(run_admit(request(), no_exec));
  CHECK(rej.code == code::action_denied);
  CHECK(rej.message == "ticket does not grant code.execute");

  auto r = request();
  r.network = true;
  r.egress = {"api.example.com"};
  rej = refused(run_admit(r));
  CHECK(rej.code == code::action_denied);
  CHECK(rej.message == "network: ticket does not grant code.network");

  auto a = accepted(run_admit(r, make_ticket({.id = "t", .tenant = "a"}, true)));
  CHECK(a.isolation == isolation::container);  // network raises the level
  CHECK(a.request.network);
}

TEST_CASE("unknown runtimes are invalid_request; missing levels or images unavailable",
          "[admission][runtime]") {
  auto r = request();
  r.runtime = "ruby";
  CHECK(invalid(run_admit(r)) == "runtime: unknown runtime 'ruby'");
  r.runtime = "py\nthon";
  CHECK(invalid(run_admit(r)) == "runtime: unknown runtime 'py\\x0athon'");

  r.runtime = "node";  // configured, image absent
  auto rej = refused(run_admit(r));
  CHECK(rej.code == code::runtime_unavailable);
  CHECK(rej.message == "runtime: the image of 'node' is not installed");

  rej = refused(run_admit(request(),
                          make_ticket({.id = "t", .tenant = "a", .isolation = isolation::gvisor})));
  CHECK(rej.code == code::runtime_unavailable);
  CHECK(
      rej.message.starts_with("isolation: no backend at level 'gvisor' or stronger on this host"));
  CHECK(rej.message.find("sandboxctl doctor") != std::string::npos);

  // A network run needs container or stronger, even under a process-level ticket.
  auto net = request();
  net.network = true;
  net.egress = {"api.example.com"};
  rej = refused(
      run_admit(net, make_ticket({.id = "t", .tenant = "a"}, true), policy(),
                host_catalog{.levels = {isolation::process}, .runtimes = catalog().runtimes}));
  CHECK(rej.code == code::runtime_unavailable);
  CHECK(rej.message ==
        "isolation: no backend at level 'container' or stronger on this host (a level serves "
        "runs once the host enables it in its configuration, \"backends\", and its self-test "
        "passes: sandboxctl doctor says which)");

  rej = refused(run_admit(request(), make_ticket(), policy(),
                          host_catalog{.levels = {}, .runtimes = catalog().runtimes}));
  CHECK(rej.code == code::runtime_unavailable);
}

TEST_CASE("the weakest registered level at or above the minimum is chosen", "[admission][level]") {
  const host_catalog unsorted{
      .levels = {isolation::microvm, isolation::gvisor, isolation::container},
      .runtimes = catalog().runtimes};
  auto level = [&](isolation min, bool network) {
    auto r = request();
    r.network = network;
    if (network) r.egress = {"api.example.com"};
    return accepted(run_admit(r, make_ticket({.id = "t", .tenant = "a", .isolation = min}, network),
                              policy(), unsorted))
        .isolation;
  };
  CHECK(level(isolation::process, false) == isolation::container);  // never weaker than min
  CHECK(level(isolation::process, true) == isolation::container);
  CHECK(level(isolation::container, false) == isolation::container);
  CHECK(level(isolation::gvisor, false) == isolation::gvisor);
  CHECK(level(isolation::gvisor, true) == isolation::gvisor);
  CHECK(level(isolation::microvm, true) == isolation::microvm);
  const host_catalog gaps{.levels = {isolation::process, isolation::gvisor},
                          .runtimes = catalog().runtimes};
  auto net = request();
  net.network = true;
  net.egress = {"api.example.com"};
  CHECK(accepted(run_admit(net, make_ticket({.id = "t", .tenant = "a"}, true), policy(), gaps))
            .isolation == isolation::gvisor);
  CHECK(accepted(run_admit(request(), make_ticket(), policy(), gaps)).isolation ==
        isolation::process);
}

TEST_CASE("checks run in the documented order", "[admission][order]") {
  const auto no_exec = make_ticket({.id = "t", .tenant = "a", .execute = false});
  const auto high = make_ticket({.id = "t", .tenant = "a", .isolation = isolation::microvm});

  // 1 before 2: an invalid request with an oversized source is invalid_request.
  auto r = request();
  r.source = std::string(40000, 's');
  r.timeout = 0ms;
  CHECK(invalid(run_admit(r, no_exec)) == "timeout_ms: must be greater than 0");
  // 2 before 3.
  r.timeout = 100ms;
  CHECK(refused(run_admit(r, no_exec)).code == code::source_too_large);
  // 3 before 4: no code.execute beats an unknown runtime.
  r = request();
  r.runtime = "ruby";
  CHECK(refused(run_admit(r, no_exec)).code == code::action_denied);
  // 4 before 5: an unknown runtime beats a missing backend.
  CHECK(invalid(run_admit(r, high)) == "runtime: unknown runtime 'ruby'");
  // 5 before 6: a missing backend beats a digest mismatch.
  r = request();
  r.runtime_digest = other_digest;
  CHECK(refused(run_admit(r, high)).code == code::runtime_unavailable);
  CHECK(refused(run_admit(r)).code == code::digest_mismatch);
  // Within 6: the ticket's pin against the installed image, then the request's pin against
  // the ticket's, then against the installed image.
  const auto pinned_other =
      make_ticket({.id = "t-1", .tenant = "acme", .runtime_digest = other_digest});
  const auto pinned_python =
      make_ticket({.id = "t-1", .tenant = "acme", .runtime_digest = python_digest});
  r.runtime_digest = "sha256:" + std::string(64, 'e');
  CHECK(refused(run_admit(r, pinned_other)).message.rfind("ticket.runtime_digest: ", 0) == 0);
  CHECK(refused(run_admit(r, pinned_python)).message ==
        "runtime_digest: does not match ticket.runtime_digest");
  CHECK(refused(run_admit(r)).message ==
        "runtime_digest: does not match the installed image of 'python3'");
  // Within step 1, field order: version, runtime, timeout, memory, files_in, env, digest.
  r = request();
  r.v = 7;
  r.runtime.clear();
  CHECK(invalid(run_admit(r)).rfind("v: ", 0) == 0);
  r.v = 1;
  r.timeout = 0ms;
  CHECK(invalid(run_admit(r)) == "runtime: must not be empty");
  r.runtime = "python3";
  r.memory_limit_bytes = 1;
  CHECK(invalid(run_admit(r)) == "timeout_ms: must be greater than 0");
  r.timeout = 1ms;
  r.files_in = {{.name = "/", .blob = blob}};
  CHECK(invalid(run_admit(r)).rfind("memory_limit_bytes: ", 0) == 0);
  r.memory_limit_bytes = 64ULL << 20;
  r.env = {{"PATH", "/"}};
  CHECK(invalid(run_admit(r)) == "files_in[0].name: contains '/'");
  r.files_in.clear();
  r.runtime_digest = "x";
  CHECK(invalid(run_admit(r)) == "env['PATH']: reserved name, set by the sandbox");
  r.env.clear();
  CHECK(invalid(run_admit(r)).rfind("runtime_digest: ", 0) == 0);
}

TEST_CASE("rejected_result carries only the code, message and run id", "[admission]") {
  const rejection rej{code::source_too_large, "source: 32769 bytes, over the limit of 32768"};
  const auto r = sandbox::rejected_result(rej, "run-7");
  sandbox::run_result expected;
  expected.code = code::source_too_large;
  expected.message = rej.message;
  expected.run_id = "run-7";
  CHECK(r == expected);
  CHECK(sandbox::rejected_result(rej).run_id.empty());
  auto back = sandbox::decode_run_result(sandbox::encode(r));
  REQUIRE(back.has_value());
  CHECK(*back == r);
}

TEST_CASE("JSON and C++ requests get the same admission messages", "[admission][json]") {
  auto from_json = [](const std::string& members) {
    auto r = sandbox::decode_run_request(R"({"runtime":"python3","source":"x",)" + members + "}");
    REQUIRE(r.has_value());
    return invalid(run_admit(*r));
  };
  CHECK(from_json(R"("timeout_ms":0)") == "timeout_ms: must be greater than 0");
  CHECK(from_json(R"("timeout_ms":-1)") == "timeout_ms: must be greater than 0");
  CHECK(from_json(R"("files_in":[{"name":"a\u0000","blob":"x"}])") ==
        "files_in[0].name: contains a control character (U+0000)");
  CHECK(from_json(R"("env":{"LD_PRELOAD":"/x.so"})") ==
        "env['LD_PRELOAD']: reserved name, set by the sandbox");
  CHECK(from_json(R"("runtime_digest":"sha256:XYZ")") ==
        "runtime_digest: expected 'sha256:' and 64 lowercase hex digits");
}

TEST_CASE("admission: a ticket whose memory ceiling is below the policy minimum is refused",
          "[admission]") {
  sandbox::ticket_issuer issuer;
  sandbox::policy policy;
  sandbox::host_catalog catalog{.levels = {sandbox::isolation::process},
                                .runtimes = {{"python3", "sha256:" + std::string(64, 'a')}}};
  sandbox::run_request req{.runtime = "python3", .source = "print(1)"};
  for (std::uint64_t ceiling : {std::uint64_t{1}, policy.min_memory_bytes - 1}) {
    auto t = issuer.issue({.id = "t", .tenant = "acme", .max_memory_bytes = ceiling}).value();
    auto v = sandbox::admit(req, t, policy, catalog);
    REQUIRE(std::holds_alternative<sandbox::rejection>(v));
    CHECK(std::get<sandbox::rejection>(v).code == sandbox::code::action_denied);
    CHECK(std::get<sandbox::rejection>(v).message.find("max_memory_bytes") != std::string::npos);
  }
  auto ok = issuer.issue({.id = "t", .tenant = "acme", .max_memory_bytes = policy.min_memory_bytes})
                .value();
  auto v = sandbox::admit(req, ok, policy, catalog);
  REQUIRE(std::holds_alternative<sandbox::admitted>(v));
  CHECK(std::get<sandbox::admitted>(v).request.memory_limit_bytes == policy.min_memory_bytes);
}

// --- egress, expiry, approvals ----------------------------------------------------------

namespace {

using sys_clock = std::chrono::system_clock;

const sys_clock::time_point noon =
    sys_clock::time_point(std::chrono::sys_days{std::chrono::year{2026} / 11 / 30} + 12h);

run_request net_request(std::vector<std::string> egress = {"api.example.com"}) {
  auto r = request();
  r.network = true;
  r.egress = std::move(egress);
  return r;
}

sandbox::ticket net_ticket(std::vector<std::string> egress) {
  return make_ticket({.id = "t", .tenant = "a", .egress = std::move(egress)}, true);
}

}  // namespace

TEST_CASE("egress: required with network, refused without, canonicalized", "[admission][egress]") {
  auto r = request();
  r.egress = {"api.example.com"};
  CHECK(invalid(run_admit(r)) == "egress: only a request with network may list domains");
  r = net_request({});
  CHECK(invalid(run_admit(r, net_ticket({"api.example.com"}))) ==
        "egress: a request with network must list its domains");
  r = net_request({"api.example.com", "http://x.example"});
  CHECK(invalid(run_admit(r, net_ticket({"api.example.com"}))) ==
        "egress[1]: not a host name or '*.' wildcard pattern: 'http://x.example'");
  r = net_request({"10.0.0.1"});
  CHECK(invalid(run_admit(r, net_ticket({"api.example.com"}))) ==
        "egress[0]: not a host name or '*.' wildcard pattern: '10.0.0.1'");
  r = net_request({"a\nb.example"});
  CHECK(invalid(run_admit(r, net_ticket({"api.example.com"}))) ==
        "egress[0]: not a host name or '*.' wildcard pattern: 'a\\x0ab.example'");

  // Canonical form, duplicates dropped, order kept; the limit counts distinct patterns.
  r = net_request({"API.Example.COM.", "*.cdn.example", "api.example.com"});
  const auto a = accepted(run_admit(r, net_ticket({"api.example.com", "*.CDN.example"})));
  CHECK(a.request.egress == std::vector<std::string>{"api.example.com", "*.cdn.example"});
  std::vector<std::string> many(100, "api.example.com");
  CHECK(accepted(run_admit(net_request(many), net_ticket({"api.example.com"}))).request.egress ==
        std::vector<std::string>{"api.example.com"});
  many.clear();
  for (int i = 0; i < 33; ++i) many.push_back("h" + std::to_string(i) + ".example.com");
  CHECK(invalid(run_admit(net_request(many), net_ticket({"*.example.com"}))) ==
        "egress: 33 distinct patterns, more than the limit of 32");
  many.pop_back();
  CHECK(accepted(run_admit(net_request(many), net_ticket({"*.example.com"}))).request.egress ==
        many);
}

TEST_CASE("egress: only what the ticket allows", "[admission][egress]") {
  const auto t = net_ticket({"api.example.com", "*.cdn.example"});
  CHECK(accepted(run_admit(net_request({"api.example.com"}), t)).request.network);
  CHECK(accepted(run_admit(net_request({"img.cdn.example", "*.eu.cdn.example"}), t)).isolation ==
        isolation::container);
  for (const auto& [asked, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"api.example.com", "evil.example"}, "'evil.example'"},
           {{"cdn.example"}, "'cdn.example'"},  // the wildcard is strictly below
           {{"*.example.com"}, "'*.example.com'"},
           {{"x.api.example.com"}, "'x.api.example.com'"},
           {{"*.cdn.example", "EVIL.example", "b.example"}, "'evil.example'"}}) {
    const auto rej = refused(run_admit(net_request(asked), t));
    CHECK(rej.code == code::action_denied);
    CHECK(rej.message == "egress: " + named + " is not allowed by the ticket");
  }
}

TEST_CASE("an expired ticket grants nothing", "[admission][expiry]") {
  auto s = ticket_spec{.id = "t", .tenant = "a", .expires_at = noon};
  const auto t = make_ticket(s);
  CHECK(accepted(admit(request(), t, policy(), catalog(), noon - 1s)).tenant == "a");
  for (auto now : {noon, noon + 1s, noon + 24h}) {
    const auto rej = refused(admit(request(), t, policy(), catalog(), now));
    CHECK(rej.code == code::action_denied);
    CHECK(rej.message == "ticket expired");
  }
  // Before the other grants (an expired ticket is not asked what it grants), after the
  // request's own syntax and size.
  s.execute = false;
  CHECK(refused(admit(request(), make_ticket(s), policy(), catalog(), noon)).message ==
        "ticket expired");
  auto bad = request();
  bad.timeout = 0ms;
  CHECK(invalid(admit(bad, t, policy(), catalog(), noon)) == "timeout_ms: must be greater than 0");
  // A ticket without expiry never expires.
  CHECK(accepted(admit(request(), make_ticket(), policy(), catalog(), sys_clock::time_point::max()))
            .ticket_id == "t-1");
}

TEST_CASE("admit_pending_approval judges everything but the network grant",
          "[admission][approval]") {
  const auto plain = make_ticket({.id = "t", .tenant = "a"});
  auto r = net_request({"API.example.com", "api.example.com"});
  CHECK(refused(admit(r, plain, policy(), catalog(), noon)).message ==
        "network: ticket does not grant code.network");
  const auto a = accepted(sandbox::admit_pending_approval(r, plain, policy(), catalog(), noon));
  CHECK(a.isolation == isolation::container);
  CHECK(a.request.egress == std::vector<std::string>{"api.example.com"});
  CHECK(a.ticket_id == "t");
  // Every other refusal is still refused, with its own code.
  auto no_level = catalog();
  no_level.levels = {isolation::process};
  CHECK(refused(sandbox::admit_pending_approval(r, plain, policy(), no_level, noon)).code ==
        code::runtime_unavailable);
  CHECK(refused(sandbox::admit_pending_approval(
                    r, make_ticket({.id = "t", .tenant = "a", .execute = false}), policy(),
                    catalog(), noon))
            .message == "ticket does not grant code.execute");
  CHECK(refused(sandbox::admit_pending_approval(
                    r, make_ticket({.id = "t", .tenant = "a", .expires_at = noon}), policy(),
                    catalog(), noon))
            .message == "ticket expired");
  CHECK(invalid(sandbox::admit_pending_approval(net_request({"bad host"}), plain, policy(),
                                                catalog(), noon)) ==
        "egress[0]: not a host name or '*.' wildcard pattern: 'bad host'");
  // Not a pending approval: exactly admit.
  CHECK(sandbox::admit_pending_approval(request(), plain, policy(), catalog(), noon) ==
        admit(request(), plain, policy(), catalog(), noon));
  const auto granted = net_ticket({"*.example.com"});
  CHECK(refused(sandbox::admit_pending_approval(net_request({"x.other"}), granted, policy(),
                                                catalog(), noon))
            .message == "egress: 'x.other' is not allowed by the ticket");
}

TEST_CASE("a ticket derived from an approval admits only the approved run",
          "[admission][approval]") {
  const sandbox::ticket_issuer issuer;
  const auto parent = make_ticket({.id = "t", .tenant = "a"});
  auto r = net_request({"api.example.com"});
  r.files_in = {{.name = "data.csv", .blob = blob}};
  sandbox::approval_request q;
  q.ticket_id = "t";
  q.tenant = "a";
  q.domains = {"api.example.com"};
  q.timeout = r.timeout;
  q.memory_limit_bytes = r.memory_limit_bytes;
  q.files_in = {{.name = "data.csv", .sha256 = blob.substr(7), .bytes = 3}};
  q.source_sha256 = sandbox::blob_id_of(r.source).substr(7);
  q.source_bytes = r.source.size();
  q.runtime = {"python3", python_digest};
  const auto d = *issuer.derive(parent, q, {.now = noon});
  CHECK(accepted(admit(r, d, policy(), catalog(), noon + 1min)).ticket_id == d.id());
  CHECK(refused(admit(r, d, policy(), catalog(), noon + 10min)).message == "ticket expired");
  auto other = r;
  other.source += " ";
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).message ==
        "source: not the source the ticket's approval is for");
  other = r;
  other.source = std::string(r.source.size(), 'x');  // same size, other bytes
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).code == code::action_denied);
  other = r;
  other.files_in[0].name = "other.csv";
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).message ==
        "files_in[0]: not the input the ticket's approval is for");
  other = r;
  other.files_in[0].blob = other_digest;
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).code == code::action_denied);
  other = r;
  other.files_in.clear();
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).message ==
        "files_in: not the inputs the ticket's approval is for");
  other = r;
  other.runtime = "node";
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).message ==
        "runtime: the ticket's approval is for runtime 'python3'");
  other = r;
  other.egress = {"api.example.com", "more.example"};
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).message ==
        "egress: 'more.example' is not allowed by the ticket");
  // The environment is part of what was approved: values steer code as inputs do.
  other = r;
  other.env = {{"MY_VAR", "https://api.example.com/exfil?data=secret"}};
  CHECK(refused(admit(other, d, policy(), catalog(), noon)).message ==
        "env: not the environment the ticket's approval is for");
  {
    auto q2 = q;
    q2.env = {{"MY_VAR", "https://api.example.com/benign"}};
    const auto d2 = *issuer.derive(parent, q2, {.now = noon});
    auto with_env = r;
    with_env.env = q2.env;
    CHECK(accepted(admit(with_env, d2, policy(), catalog(), noon)).ticket_id == d2.id());
    with_env.env["MY_VAR"] = "https://api.example.com/exfil?data=secret";
    CHECK(refused(admit(with_env, d2, policy(), catalog(), noon)).message ==
          "env: not the environment the ticket's approval is for");
    with_env.env = {};
    CHECK(refused(admit(with_env, d2, policy(), catalog(), noon)).code == code::action_denied);
  }
  // The pin: a host that rolled its image refuses the approved run.
  auto rolled = catalog();
  rolled.runtimes["python3"] = other_digest;
  CHECK(refused(admit(r, d, policy(), rolled, noon)).code == code::digest_mismatch);
}
