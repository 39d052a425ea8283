// Unit tests of ticket minting, the network grant tag, and the ticket's JSON form.
#include <catch2/catch.hpp>
#include <string>
#include <type_traits>

#include "sandbox/ticket.hpp"

using namespace std::string_literals;
using sandbox::action;
using sandbox::errc;
using sandbox::ticket_issuer;
using sandbox::ticket_spec;

namespace {

/// True when a decode succeeded; otherwise reports its rejection message on failure.
template <class T>
bool decoded(const boost::system::result<T, sandbox::rejection>& r) {
  if (!r.has_value()) UNSCOPED_INFO("rejected: " << r.error().message);
  return r.has_value();
}

ticket_spec spec() { return ticket_spec{.id = "t-1", .tenant = "acme"}; }

std::string ticket_json(const std::string& members) {
  return "{" + members + "}";
}

const std::string valid_members =
    R"("v":1,"id":"t-1","tenant":"acme","actions":["code.execute"],"isolation":"process",)"
    R"("max_timeout_ms":8000,"max_memory_bytes":536870912)";

/// A ticket document with `name` replaced by `value` (or removed when `value` is empty).
std::string ticket_with(const std::string& name, const std::string& value) {
  std::string doc = "{" + valid_members + "}";
  const std::string key = "\"" + name + "\":";
  const auto at = doc.find(key);
  if (at == std::string::npos) {
    doc.insert(doc.size() - 1, "," + key + value);
    return doc;
  }
  auto end = at + key.size();
  int depth = 0;
  while (end < doc.size()) {
    const char c = doc[end];
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') {
      if (depth == 0) break;
      --depth;
    }
    if (c == ',' && depth == 0) break;
    ++end;
  }
  if (value.empty()) {
    // Remove the member and one adjacent comma.
    if (doc[end] == ',') ++end;
    else if (doc[at - 1] == ',') return doc.erase(at - 1, end - at + 1);
    return doc.erase(at, end - at);
  }
  return doc.replace(at + key.size(), end - at - key.size(), value);
}

std::string decode_error(const std::string& json) {
  auto t = ticket_issuer{}.decode(json);
  if (t) return "<decoded>";
  CHECK(t.error().code == sandbox::code::invalid_request);
  return t.error().message;
}

}  // namespace

// Capabilities are types: only an issuer mints a ticket; a network grant is explicit.
static_assert(!std::is_default_constructible_v<sandbox::ticket>);
static_assert(!std::is_constructible_v<sandbox::ticket, ticket_spec>);
static_assert(!std::is_constructible_v<sandbox::ticket, ticket_spec, bool>);
static_assert(!std::is_convertible_v<std::initializer_list<int>, sandbox::network_grant>);
static_assert(std::is_copy_constructible_v<sandbox::ticket>);

TEST_CASE("an issuer mints a ticket from a valid spec", "[ticket]") {
  auto t = ticket_issuer{}.issue(spec());
  REQUIRE(t.has_value());
  CHECK(t->id() == "t-1");
  CHECK(t->tenant() == "acme");
  CHECK(t->allows(action::code_execute));
  CHECK_FALSE(t->allows(action::code_network));
  CHECK(t->isolation() == sandbox::isolation::process);
  CHECK(t->max_timeout() == std::chrono::milliseconds(8000));
  CHECK(t->max_memory_bytes() == 512ULL << 20);
}

TEST_CASE("code.network needs the explicit grant tag", "[ticket]") {
  auto plain = ticket_issuer{}.issue(spec());
  auto networked = ticket_issuer{}.issue(spec(), sandbox::network_grant{});
  REQUIRE(plain.has_value());
  REQUIRE(networked.has_value());
  CHECK_FALSE(plain->allows(action::code_network));
  CHECK(networked->allows(action::code_network));
  CHECK(networked->allows(action::code_execute));
  CHECK_FALSE(*plain == *networked);
  auto s = spec();
  s.execute = false;
  auto no_exec = ticket_issuer{}.issue(s);
  REQUIRE(no_exec.has_value());
  CHECK_FALSE(no_exec->allows(action::code_execute));
}

TEST_CASE("issue refuses malformed ids, tenants and ceilings", "[ticket]") {
  auto refuses = [](const ticket_spec& s) {
    auto plain = ticket_issuer{}.issue(s);
    auto networked = ticket_issuer{}.issue(s, sandbox::network_grant{});
    CHECK_FALSE(plain.has_value());
    CHECK_FALSE(networked.has_value());
    return !plain && plain.error() == sandbox::make_error_code(errc::invalid_argument) &&
           !networked && networked.error() == sandbox::make_error_code(errc::invalid_argument);
  };
  auto accepts = [](const ticket_spec& s) { return ticket_issuer{}.issue(s).has_value(); };

  auto s = spec();
  for (const std::string id : {""s, std::string(129, 'x'), "a\x01"s, "tab\t"s, "nul\0"s,
                                "del\x7f"s, "caf\xc3\xa9"s, "\xff"s}) {
    s.id = id;
    CHECK(refuses(s));
  }
  for (const std::string id : {"x"s, std::string(128, 'x'), "t 1"s, "~!@#$%^&*()"s, "a/b"s}) {
    s.id = id;
    CHECK(accepts(s));
  }

  s = spec();
  for (const std::string tenant : {""s, "-acme"s, ".acme"s, "_acme"s, "ac/me"s, "../x"s,
                                    "ac me"s, std::string(65, 'a'), "acm\xc3\xa9"s, "a\0b"s}) {
    s.tenant = tenant;
    CHECK(refuses(s));
  }
  for (const std::string tenant : {"a"s, "9"s, "acme.corp_1-x"s, std::string(64, 'a')}) {
    s.tenant = tenant;
    CHECK(accepts(s));
  }

  s = spec();
  s.max_timeout = std::chrono::milliseconds(0);
  CHECK(refuses(s));
  s.max_timeout = std::chrono::milliseconds(-1);
  CHECK(refuses(s));
  s.max_timeout = std::chrono::milliseconds(1);
  CHECK(accepts(s));
  s = spec();
  s.max_memory_bytes = 0;
  CHECK(refuses(s));
  s.max_memory_bytes = 1;
  CHECK(accepts(s));

  s = spec();
  for (const std::string digest :
       {""s, "sha256:"s, "latest"s, "sha256:" + std::string(63, 'a'),
        "sha256:" + std::string(65, 'a'), "sha256:" + std::string(64, 'A'),
        "SHA256:" + std::string(64, 'a'), "sha512:" + std::string(64, 'a'),
        "sha256:" + std::string(64, 'a') + " ", " sha256:" + std::string(64, 'a'),
        "sha256:" + std::string(63, 'a') + "g", "sha256:" + std::string(63, 'a') + "\0"s}) {
    s.runtime_digest = digest;
    CHECK(refuses(s));
  }
  s.runtime_digest = "sha256:0123456789abcdef" + std::string(48, 'f');
  CHECK(accepts(s));
  s.runtime_digest.reset();
  CHECK(accepts(s));
}

TEST_CASE("a ticket can pin the runtime image digest", "[ticket][digest]") {
  const std::string digest = "sha256:" + std::string(64, 'd');
  auto unpinned = ticket_issuer{}.issue(spec());
  REQUIRE(unpinned.has_value());
  CHECK_FALSE(unpinned->runtime_digest());
  auto s = spec();
  s.runtime_digest = digest;
  auto pinned = ticket_issuer{}.issue(s);
  auto networked = ticket_issuer{}.issue(s, sandbox::network_grant{});
  REQUIRE(pinned.has_value());
  REQUIRE(networked.has_value());
  CHECK(pinned->runtime_digest() == digest);
  CHECK(networked->runtime_digest() == digest);
  CHECK_FALSE(*pinned == *unpinned);  // the pin is part of the capability
}

TEST_CASE("a ticket decodes from its documented JSON form", "[ticket][json]") {
  auto t = ticket_issuer{}.decode(ticket_json(valid_members));
  REQUIRE(t.has_value());
  CHECK(*t == *ticket_issuer{}.issue(spec()));

  auto full = ticket_issuer{}.decode(
      R"({"id":"t-2","tenant":"acme","actions":["code.network","code.execute"],)"
      R"("isolation":"gvisor","max_timeout_ms":1,"max_memory_bytes":1})");
  REQUIRE(full.has_value());
  CHECK(full->allows(action::code_execute));
  CHECK(full->allows(action::code_network));
  CHECK(full->isolation() == sandbox::isolation::gvisor);
  CHECK(full->max_timeout() == std::chrono::milliseconds(1));

  const std::string digest = "sha256:" + std::string(32, '0') + std::string(32, 'f');
  auto pinned = ticket_issuer{}.decode(ticket_with("runtime_digest", "\"" + digest + "\""));
  REQUIRE(decoded(pinned));
  CHECK(pinned->runtime_digest() == digest);
  CHECK_FALSE(t->runtime_digest());  // absent: no pin

  auto none = ticket_issuer{}.decode(ticket_with("actions", "[]"));
  REQUIRE(none.has_value());
  CHECK_FALSE(none->allows(action::code_execute));
  CHECK_FALSE(none->allows(action::code_network));

  auto net_only = ticket_issuer{}.decode(ticket_with("actions", R"(["code.network"])"));
  REQUIRE(net_only.has_value());
  CHECK_FALSE(net_only->allows(action::code_execute));
  CHECK(net_only->allows(action::code_network));
}

TEST_CASE("tickets round-trip through JSON", "[ticket][json]") {
  const ticket_issuer issuer;
  std::vector<sandbox::ticket> tickets;
  tickets.push_back(*issuer.issue(spec()));
  tickets.push_back(*issuer.issue(spec(), sandbox::network_grant{}));
  for (auto level : {sandbox::isolation::container, sandbox::isolation::gvisor,
                     sandbox::isolation::microvm}) {
    auto s = spec();
    s.isolation = level;
    s.execute = false;
    s.id = std::string(128, '~');
    s.tenant = std::string(64, 'z');
    s.max_timeout = std::chrono::milliseconds(INT64_MAX);
    s.max_memory_bytes = UINT64_MAX;
    tickets.push_back(*issuer.issue(s));
    tickets.push_back(*issuer.issue(s, sandbox::network_grant{}));
    s.runtime_digest = "sha256:" + std::string(64, '0');
    tickets.push_back(*issuer.issue(s));
    tickets.push_back(*issuer.issue(s, sandbox::network_grant{}));
  }
  for (const auto& t : tickets) {
    const std::string text = sandbox::encode(t);
    INFO(text);
    auto back = issuer.decode(text);
    REQUIRE(back.has_value());
    CHECK(*back == t);
    CHECK(sandbox::encode(*back) == text);
  }
  CHECK(sandbox::encode(tickets[1]) ==
        R"({"v":1,"id":"t-1","tenant":"acme","actions":["code.execute","code.network"],)"
        R"("isolation":"process","max_timeout_ms":8000,"max_memory_bytes":536870912})");
  // The pin is written only when set, last.
  auto pinned_spec = spec();
  pinned_spec.runtime_digest = "sha256:" + std::string(64, 'e');
  const auto pinned = *issuer.issue(pinned_spec);
  const std::string pinned_text = sandbox::encode(pinned);
  CHECK(pinned_text ==
        R"({"v":1,"id":"t-1","tenant":"acme","actions":["code.execute"],"isolation":"process",)"
        R"("max_timeout_ms":8000,"max_memory_bytes":536870912,"runtime_digest":"sha256:)" +
            std::string(64, 'e') + R"("})");
  auto back = issuer.decode(pinned_text);
  REQUIRE(decoded(back));
  CHECK(*back == pinned);
  CHECK(back->runtime_digest() == pinned_spec.runtime_digest);
}

TEST_CASE("ticket fields are checked strictly, naming the field", "[ticket][json]") {
  struct field_case {
    std::string name;
    std::string value;  // empty: remove the field
    std::string message;
  };
  const std::string bad_digest = "expected 'sha256:' and 64 lowercase hex digits";
  const field_case cases[] = {
      {"id", "", "id: required field is missing"},
      {"tenant", "", "tenant: required field is missing"},
      {"actions", "", "actions: required field is missing"},
      {"isolation", "", "isolation: required field is missing"},
      {"max_timeout_ms", "", "max_timeout_ms: required field is missing"},
      {"max_memory_bytes", "", "max_memory_bytes: required field is missing"},
      {"v", "2", "v: unsupported protocol version 2 (this library speaks 1)"},
      {"v", "\"1\"", "v: unsupported protocol version (expected the integer 1)"},
      {"id", "1", "id: expected a string"},
      {"id", "\"\"", "id: must be 1 to 128 printable ASCII characters"},
      {"id", "\"a\\nb\"", "id: must be 1 to 128 printable ASCII characters"},
      {"id", "\"" + std::string(129, 'i') + "\"", "id: must be 1 to 128 printable ASCII characters"},
      {"tenant", "null", "tenant: expected a string"},
      {"tenant", "\"../etc\"",
       "tenant: must be 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or digit"},
      {"tenant", "\"acme\\u0000\"",
       "tenant: must be 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or digit"},
      {"actions", "\"code.execute\"", "actions: expected an array"},
      {"actions", "[1]", "actions[0]: expected a string"},
      {"actions", R"(["code.execute","code.root"])", "actions[1]: unknown action 'code.root'"},
      {"actions", R"(["Code.Execute"])", "actions[0]: unknown action 'Code.Execute'"},
      {"actions", R"(["code.execute "])", "actions[0]: unknown action 'code.execute '"},
      {"actions", R"(["code.execute","code.execute"])",
       "actions[1]: duplicate action 'code.execute'"},
      {"actions", R"(["code.network","code.execute","code.network"])",
       "actions[2]: duplicate action 'code.network'"},
      {"isolation", "\"none\"", "isolation: unknown isolation level 'none'"},
      {"isolation", "\"\"", "isolation: unknown isolation level ''"},
      {"isolation", "0", "isolation: expected a string"},
      {"max_timeout_ms", "0", "max_timeout_ms: must be greater than 0"},
      {"max_timeout_ms", "-1", "max_timeout_ms: must be greater than 0"},
      {"max_timeout_ms", "\"8000\"", "max_timeout_ms: expected an integer"},
      {"max_timeout_ms", "8e3", "max_timeout_ms: expected an integer"},
      {"max_memory_bytes", "0", "max_memory_bytes: must be greater than 0"},
      {"max_memory_bytes", "-1", "max_memory_bytes: expected a non-negative integer"},
      {"max_memory_bytes", "18446744073709551616",
       "max_memory_bytes: out of range (at most 18446744073709551615)"},
      {"runtime_digest", "null", "runtime_digest: expected a string"},
      {"runtime_digest", "5", "runtime_digest: expected a string"},
      {"runtime_digest", R"(["sha256:)" + std::string(64, 'a') + R"("])",
       "runtime_digest: expected a string"},
      {"runtime_digest", R"("")", "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("latest")", "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("sha256:)" + std::string(64, 'A') + "\"",
       "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("sha256:)" + std::string(63, 'a') + "\"",
       "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("sha256:)" + std::string(65, 'a') + "\"",
       "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("sha256:)" + std::string(64, 'a') + " \"",
       "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("sha256:)" + std::string(64, 'a') + "\\n\"",
       "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("sha256:)" + std::string(63, 'a') + "\\u0000\"",
       "runtime_digest: " + bad_digest},
      {"runtime_digest", R"("SHA256:)" + std::string(64, 'a') + "\"",
       "runtime_digest: " + bad_digest},
      {"network", "true", "unknown field 'network'"},
      {"expires", "0", "unknown field 'expires'"},
  };
  for (const auto& c : cases) {
    const std::string doc = ticket_with(c.name, c.value);
    INFO(doc);
    CHECK(decode_error(doc) == c.message);
  }
}

TEST_CASE("ticket documents get the same strictness as requests", "[ticket][json]") {
  CHECK(decode_error(R"({"id":"a","id":"b"})") == "duplicate field 'id'");
  CHECK(decode_error("{" + valid_members + R"(,"tenant":"other"})") == "duplicate field 'tenant'");
  CHECK(decode_error(R"({"actions":["code.execute"],"actions":["code.network"]})") ==
        "duplicate field 'actions'");
  CHECK(decode_error("[]") == "expected a JSON object");
  CHECK(decode_error("").rfind("malformed JSON at byte ", 0) == 0);
  CHECK(decode_error("{" + valid_members).rfind("malformed JSON at byte ", 0) == 0);
  CHECK(decode_error("{\"id\":\"\xff\"}") == "id: not valid UTF-8 (byte 8)");
  CHECK(decode_error(std::string(20, '[') + std::string(20, ']')) ==
        "nesting deeper than 16 levels");
}
