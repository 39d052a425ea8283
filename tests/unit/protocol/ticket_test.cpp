// Unit tests of ticket minting, the network grant tag, and the ticket's JSON form.
#include "sandbox/ticket.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

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

/// `spec()` for a network ticket: the same, allowing one domain.
ticket_spec net_spec() {
  auto s = spec();
  s.egress = {"api.example.com"};
  return s;
}

std::string ticket_json(const std::string& members) { return "{" + members + "}"; }

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
    if (doc[end] == ',')
      ++end;
    else if (doc[at - 1] == ',')
      return doc.erase(at - 1, end - at + 1);
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
  auto networked = ticket_issuer{}.issue(net_spec(), sandbox::network_grant{});
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
    auto n = s;
    n.egress = {"api.example.com"};
    auto networked = ticket_issuer{}.issue(n, sandbox::network_grant{});
    CHECK_FALSE(plain.has_value());
    CHECK_FALSE(networked.has_value());
    return !plain && plain.error() == sandbox::make_error_code(errc::invalid_argument) &&
           !networked && networked.error() == sandbox::make_error_code(errc::invalid_argument);
  };
  auto accepts = [](const ticket_spec& s) { return ticket_issuer{}.issue(s).has_value(); };

  auto s = spec();
  for (const std::string id : {""s, std::string(129, 'x'), "a\x01"s, "tab\t"s, "nul\0"s, "del\x7f"s,
                               "caf\xc3\xa9"s, "\xff"s}) {
    s.id = id;
    CHECK(refuses(s));
  }
  for (const std::string id : {"x"s, std::string(128, 'x'), "t 1"s, "~!@#$%^&*()"s, "a/b"s}) {
    s.id = id;
    CHECK(accepts(s));
  }

  s = spec();
  for (const std::string tenant : {""s, "-acme"s, ".acme"s, "_acme"s, "ac/me"s, "../x"s, "ac me"s,
                                   std::string(65, 'a'), "acm\xc3\xa9"s, "a\0b"s}) {
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
  s.egress = {"api.example.com"};
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
      R"("isolation":"gvisor","max_timeout_ms":1,"max_memory_bytes":1,"egress":["a.example"]})");
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

  std::string net_only_doc = ticket_with("egress", R"(["x.example"])");
  net_only_doc.replace(net_only_doc.find(R"(["code.execute"])"), 16, R"(["code.network"])");
  auto net_only = ticket_issuer{}.decode(net_only_doc);
  REQUIRE(net_only.has_value());
  CHECK_FALSE(net_only->allows(action::code_execute));
  CHECK(net_only->allows(action::code_network));
}

TEST_CASE("tickets round-trip through JSON", "[ticket][json]") {
  const ticket_issuer issuer;
  std::vector<sandbox::ticket> tickets;
  tickets.push_back(*issuer.issue(spec()));
  tickets.push_back(*issuer.issue(net_spec(), sandbox::network_grant{}));
  for (auto level :
       {sandbox::isolation::container, sandbox::isolation::gvisor, sandbox::isolation::microvm}) {
    auto s = spec();
    s.isolation = level;
    s.execute = false;
    s.id = std::string(128, '~');
    s.tenant = std::string(64, 'z');
    s.max_timeout = std::chrono::milliseconds(INT64_MAX);
    s.max_memory_bytes = UINT64_MAX;
    tickets.push_back(*issuer.issue(s));
    auto n = s;
    n.egress = {"*.example.com", "api.other.example"};
    tickets.push_back(*issuer.issue(n, sandbox::network_grant{}));
    s.runtime_digest = "sha256:" + std::string(64, '0');
    tickets.push_back(*issuer.issue(s));
    n.runtime_digest = s.runtime_digest;
    tickets.push_back(*issuer.issue(n, sandbox::network_grant{}));
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
        R"("isolation":"process","max_timeout_ms":8000,"max_memory_bytes":536870912,)"
        R"("egress":["api.example.com"]})");
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
      {"id", "\"" + std::string(129, 'i') + "\"",
       "id: must be 1 to 128 printable ASCII characters"},
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

// --- egress, expiry, derivation ---------------------------------------------------------

namespace {

using sys_clock = std::chrono::system_clock;
using namespace std::chrono_literals;

sys_clock::time_point at(int y, unsigned m, unsigned d, int hh = 0, int mm = 0, int ss = 0) {
  return sys_clock::time_point(std::chrono::sys_days{std::chrono::year{y} / m / d} +
                               std::chrono::hours(hh) + std::chrono::minutes(mm) +
                               std::chrono::seconds(ss));
}

const std::string digest_a = "sha256:" + std::string(64, 'a');

sandbox::approval_request approval_for(const sandbox::ticket& parent) {
  sandbox::approval_request a;
  a.ticket_id = parent.id();
  a.tenant = parent.tenant();
  a.domains = {"api.example.com", "*.cdn.example"};
  a.timeout = std::chrono::milliseconds(2000);
  a.memory_limit_bytes = 256ULL << 20;
  a.files_in = {{.name = "data.csv", .sha256 = std::string(64, 'c'), .bytes = 12}};
  a.source_sha256 = std::string(64, 'e');
  a.source_bytes = 9;
  a.isolation = sandbox::isolation::container;
  a.runtime = {"python3", digest_a};
  return a;
}

/// `doc` with the JSON member `name` of its top-level object replaced (or removed).
std::string with_member(const std::string& doc, const std::string& name, const std::string& value) {
  auto j = nlohmann::ordered_json::parse(doc);
  if (value.empty()) {
    j.erase(name);
  } else {
    j[name] = nlohmann::ordered_json::parse(value);
  }
  return j.dump();
}

}  // namespace

TEST_CASE("a network ticket lists its domains, canonical", "[ticket][egress]") {
  const ticket_issuer issuer;
  auto s = spec();
  CHECK_FALSE(issuer.issue(s, sandbox::network_grant{}).has_value());  // no domains: refused
  s.egress = {"API.Example.com.", "*.CDN.example", "api.example.com"};
  auto t = issuer.issue(s, sandbox::network_grant{});
  REQUIRE(t.has_value());
  CHECK(t->egress() == std::vector<std::string>{"api.example.com", "*.cdn.example"});
  CHECK(t->spec().egress == t->egress());
  CHECK_FALSE(issuer.issue(s).has_value());  // domains without code.network: refused
  for (const std::string bad : {"", "*", "*.com", "1.2.3.4", "example.com:443",
                                "http://example.com", "a..b", "-a.example", "ex ample.com"}) {
    s.egress = {"ok.example", bad};
    INFO(bad);
    CHECK(issuer.issue(s, sandbox::network_grant{}).error() ==
          sandbox::make_error_code(errc::invalid_argument));
  }
  s.egress.clear();
  for (int i = 0; i < 32; ++i) s.egress.push_back("h" + std::to_string(i) + ".example");
  CHECK(issuer.issue(s, sandbox::network_grant{}).has_value());
  s.egress.push_back("H0.example.");  // a duplicate after canonicalization: still 32
  CHECK(issuer.issue(s, sandbox::network_grant{}).has_value());
  s.egress.push_back("h32.example");
  CHECK_FALSE(issuer.issue(s, sandbox::network_grant{}).has_value());

  // JSON: required with code.network, refused without, named on every fault.
  const std::string net = ticket_with("actions", R"(["code.execute","code.network"])");
  CHECK(decode_error(net) == "egress: required (non-empty) with code.network");
  CHECK(decode_error(with_member(net, "egress", "[]")) ==
        "egress: required (non-empty) with code.network");
  CHECK(decode_error(with_member(net, "egress", R"(["a.example","a b"])")) ==
        "egress[1]: not a host name or '*.' wildcard pattern: 'a b'");
  CHECK(decode_error(with_member(net, "egress", R"("a.example")")) == "egress: expected an array");
  CHECK(decode_error(with_member(net, "egress", "[1]")) == "egress[0]: expected a string");
  CHECK(decode_error(ticket_with("egress", R"(["a.example"])")) ==
        "egress: only a ticket granting code.network may list domains");
  auto decoded_net = ticket_issuer{}.decode(with_member(net, "egress", R"(["A.example."])"));
  REQUIRE(decoded(decoded_net));
  CHECK(decoded_net->egress() == std::vector<std::string>{"a.example"});
}

TEST_CASE("RFC 3339 times: exactly YYYY-MM-DDTHH:MM:SSZ", "[ticket][expiry]") {
  CHECK(sandbox::format_rfc3339(sys_clock::time_point{}) == "1970-01-01T00:00:00Z");
  CHECK(sandbox::format_rfc3339(at(2026, 11, 30, 12) + 999ms) == "2026-11-30T12:00:00Z");
  CHECK(sandbox::parse_rfc3339("2026-11-30T12:00:00Z") == at(2026, 11, 30, 12));
  CHECK(sandbox::parse_rfc3339("2024-02-29T23:59:59Z") == at(2024, 2, 29, 23, 59, 59));
  CHECK(sandbox::parse_rfc3339("2199-12-31T23:59:59Z") == at(2199, 12, 31, 23, 59, 59));
  CHECK_FALSE(sandbox::parse_rfc3339("2200-01-01T00:00:00Z"));  // beyond what tickets hold
  CHECK_FALSE(sandbox::parse_rfc3339("9999-12-31T23:59:59Z"));
  for (const std::string bad :
       {"", "2026-11-30T12:00:00", "2026-11-30t12:00:00Z", "2026-11-30T12:00:00z",
        "2026-11-30 12:00:00Z", "2026-11-30T12:00:00.5Z", "2026-11-30T12:00:00+00:00",
        "2026-02-29T00:00:00Z", "2026-13-01T00:00:00Z", "2026-00-10T00:00:00Z",
        "2026-11-31T00:00:00Z", "2026-11-30T24:00:00Z", "2026-11-30T12:60:00Z",
        "2026-11-30T12:00:60Z", "1969-12-31T23:59:59Z", "+026-11-30T12:00:00Z",
        "2026-1-30T12:00:00Z", "１９７０-01-01T00:00:00Z"}) {
    INFO(bad);
    CHECK_FALSE(sandbox::parse_rfc3339(bad));
  }
  for (auto t : {at(1970, 1, 1), at(2000, 2, 29, 1, 2, 3), at(2026, 11, 30, 12)}) {
    CHECK(sandbox::parse_rfc3339(sandbox::format_rfc3339(t)) == t);
  }
}

TEST_CASE("a ticket may expire: whole seconds, exclusive", "[ticket][expiry]") {
  auto s = spec();
  s.expires_at = at(2026, 11, 30, 12) + 750ms;
  auto t = ticket_issuer{}.issue(s);
  REQUIRE(t.has_value());
  CHECK(t->expires_at() == at(2026, 11, 30, 12));  // rounded down
  CHECK_FALSE(t->is_expired(at(2026, 11, 30, 11, 59, 59)));
  CHECK(t->is_expired(at(2026, 11, 30, 12)));
  CHECK_FALSE(ticket_issuer{}.issue(spec())->is_expired(sys_clock::time_point::max()));
  s.expires_at = sys_clock::time_point{} - 1s;
  CHECK_FALSE(ticket_issuer{}.issue(s).has_value());
  s.expires_at = at(2200, 1, 1);
  CHECK_FALSE(ticket_issuer{}.issue(s).has_value());

  const std::string doc = ticket_with("expires_at", R"("2026-11-30T12:00:00Z")");
  auto d = ticket_issuer{}.decode(doc);
  REQUIRE(decoded(d));
  CHECK(d->expires_at() == at(2026, 11, 30, 12));
  CHECK(sandbox::encode(*d) == doc);
  CHECK(decode_error(ticket_with("expires_at", "1796040000000")) ==
        "expires_at: expected a string");
  CHECK(decode_error(ticket_with("expires_at", R"("2026-11-30T12:00:00.000Z")")) ==
        "expires_at: expected RFC 3339 UTC time 'YYYY-MM-DDTHH:MM:SSZ', got "
        "'2026-11-30T12:00:00.000Z'");
  CHECK(decode_error(ticket_with("expires_at", "null")) == "expires_at: expected a string");
}

TEST_CASE("derive mints a narrow, short-lived network ticket", "[ticket][derive][approval]") {
  const ticket_issuer issuer;
  auto ps = spec();
  ps.max_timeout = 5000ms;
  ps.max_memory_bytes = 1ULL << 30;
  const auto parent = *issuer.issue(ps);
  const auto approval = approval_for(parent);
  const auto now = at(2026, 11, 30, 12);
  auto d = issuer.derive(parent, approval, {.now = now});
  REQUIRE(d.has_value());
  CHECK(d->is_derived());
  CHECK(d->parent_id() == "t-1");
  CHECK(d->ancestors() == std::vector<std::string>{"t-1"});
  CHECK(d->id().size() == 18);
  CHECK(d->id().rfind("d-", 0) == 0);
  CHECK(d->tenant() == "acme");
  CHECK(d->allows(action::code_execute));
  CHECK(d->allows(action::code_network));
  CHECK(d->egress() == approval.domains);
  CHECK(d->isolation() == sandbox::isolation::container);  // max(process, container)
  CHECK(d->max_timeout() == 2000ms);                       // min(parent, approved run)
  CHECK(d->max_memory_bytes() == 256ULL << 20);
  CHECK(d->runtime_digest() == digest_a);
  CHECK(d->expires_at() == now + 10min);
  CHECK(d->approval() == approval);
  CHECK_FALSE(sandbox::check_derivation(parent, *d, now));
  CHECK_FALSE(parent.parent_id());
  CHECK(issuer.derive(parent, approval, {.now = now})->id() != d->id());  // random ids

  // Options: fewer domains, another TTL, an id; the parent's expiry caps the child's.
  auto narrow = issuer.derive(parent, approval,
                              {.now = now,
                               .ttl = 60s,
                               .id = "approved-1",
                               .domains = std::vector<std::string>{"img.cdn.example"}});
  REQUIRE(narrow.has_value());
  CHECK(narrow->egress() == std::vector<std::string>{"img.cdn.example"});
  CHECK(narrow->expires_at() == now + 60s);
  CHECK(narrow->id() == "approved-1");
  ps.expires_at = now + 30s;
  ps.isolation = sandbox::isolation::gvisor;
  const auto short_parent = *issuer.issue(ps);
  auto capped = issuer.derive(short_parent, approval, {.now = now});
  REQUIRE(capped.has_value());
  CHECK(capped->expires_at() == now + 30s);
  CHECK(capped->isolation() == sandbox::isolation::gvisor);  // never weaker than the parent

  // Refusals.
  auto refused = [&](const sandbox::ticket& p, const sandbox::approval_request& a,
                     sandbox::derive_options o) {
    auto r = issuer.derive(p, a, std::move(o));
    return !r && r.error() == sandbox::make_error_code(errc::invalid_argument);
  };
  auto other = approval;
  other.ticket_id = "t-2";
  CHECK(refused(parent, other, {.now = now}));
  other = approval;
  other.tenant = "other";
  CHECK(refused(parent, other, {.now = now}));
  other = approval;
  other.domains.clear();
  CHECK(refused(parent, other, {.now = now}));
  other = approval;
  other.domains = {"API.example.com"};  // an approval request carries canonical patterns
  CHECK(refused(parent, other, {.now = now}));
  other = approval;
  other.runtime.digest = "latest";
  CHECK(refused(parent, other, {.now = now}));
  other = approval;
  other.isolation = sandbox::isolation::process;
  CHECK(refused(parent, other, {.now = now}));
  CHECK(refused(parent, approval, {.now = now, .ttl = 0s}));
  CHECK(refused(parent, approval, {.now = now, .ttl = 3601s}));
  CHECK_FALSE(refused(parent, approval, {.now = now, .ttl = 3600s}));
  CHECK(refused(parent, approval, {.now = now, .id = std::string(129, 'x')}));
  CHECK(
      refused(parent, approval, {.now = now, .domains = std::vector<std::string>{"evil.example"}}));
  CHECK(refused(parent, approval, {.now = now, .domains = std::vector<std::string>{}}));
  CHECK(refused(parent, approval,
                {.now = now, .domains = std::vector<std::string>{"*.example.com"}}));
  CHECK(refused(short_parent, approval, {.now = now + 30s}));  // parent expired
  auto no_exec_spec = spec();
  no_exec_spec.execute = false;
  CHECK(refused(*issuer.issue(no_exec_spec), approval, {.now = now}));
  auto pinned_spec = spec();
  pinned_spec.runtime_digest = "sha256:" + std::string(64, 'b');
  const auto pinned = *issuer.issue(pinned_spec);
  CHECK(refused(pinned, approval_for(pinned), {.now = now}));  // another image than the pin

  // Chains: at most max_ticket_ancestors.
  sandbox::ticket link = parent;
  for (std::size_t i = 0; i < sandbox::max_ticket_ancestors; ++i) {
    auto next = issuer.derive(link, approval_for(link), {.now = now});
    REQUIRE(next.has_value());
    CHECK(next->ancestors().size() == i + 1);
    CHECK_FALSE(sandbox::check_derivation(link, *next, now));
    link = *next;
  }
  CHECK(refused(link, approval_for(link), {.now = now}));
}

TEST_CASE("derived tickets round-trip through JSON", "[ticket][derive][json]") {
  const ticket_issuer issuer;
  const auto parent = *issuer.issue(spec());
  const auto d =
      *issuer.derive(parent, approval_for(parent), {.now = at(2026, 11, 30, 12), .id = "d-1"});
  const std::string text = sandbox::encode(d);
  CHECK(text == R"({"v":1,"id":"d-1","tenant":"acme","actions":["code.execute","code.network"],)"
                R"("isolation":"container","max_timeout_ms":2000,"max_memory_bytes":268435456,)"
                R"("runtime_digest":")" +
                    digest_a +
                    R"(","egress":["api.example.com","*.cdn.example"],)"
                    R"("expires_at":"2026-11-30T12:10:00Z","derived_from":["t-1"],)"
                    R"("approval":{"ticket_id":"t-1","tenant":"acme",)"
                    R"("domains":["api.example.com","*.cdn.example"],"timeout_ms":2000,)"
                    R"("memory_limit_bytes":268435456,"files_in":[{"name":"data.csv","sha256":")" +
                    std::string(64, 'c') + R"(","bytes":12}],"source_sha256":")" +
                    std::string(64, 'e') +
                    R"(","source_bytes":9,"isolation":"container",)"
                    R"("runtime":{"name":"python3","digest":")" +
                    digest_a + R"("}}})");
  auto back = issuer.decode(text);
  REQUIRE(decoded(back));
  CHECK(*back == d);
  CHECK(back->approval() == d.approval());

  // The derived-ticket members are checked like every other, naming the field.
  CHECK(decode_error(with_member(text, "derived_from", "")) ==
        "approval: only a derived ticket carries an approval");
  CHECK(decode_error(with_member(text, "derived_from", "[]")) ==
        "derived_from: must not be empty (leave it out for a ticket that is not derived)");
  CHECK(decode_error(with_member(text, "derived_from", R"(["t-0"])")) ==
        "approval.ticket_id: is not the parent (derived_from's last)");
  CHECK(decode_error(with_member(text, "derived_from", R"(["a","b","c","d","t-1"])")) ==
        "derived_from: more than 4 ancestors");
  CHECK(decode_error(with_member(text, "derived_from", R"([""])")) ==
        "derived_from[0]: must be 1 to 128 printable ASCII characters");
  auto j = nlohmann::ordered_json::parse(text);
  j["approval"]["domains"] = {"API.example.com"};
  CHECK(decode_error(j.dump()) ==
        "approval.domains[0]: not a canonical egress pattern: 'API.example.com'");
  j = nlohmann::ordered_json::parse(text);
  j["approval"]["extra"] = 1;
  CHECK(decode_error(j.dump()) == "approval: unknown field 'extra'");
  j = nlohmann::ordered_json::parse(text);
  j["approval"]["files_in"][0]["sha256"] = "sha256:" + std::string(64, 'c');
  CHECK(decode_error(j.dump()) == "approval.files_in[0].sha256: expected 64 lowercase hex digits");
  j = nlohmann::ordered_json::parse(text);
  j["approval"]["tenant"] = "other";
  CHECK(decode_error(j.dump()) == "approval.tenant: is not the ticket's tenant");
  j = nlohmann::ordered_json::parse(text);
  j["approval"].erase("runtime");
  CHECK(decode_error(j.dump()) == "approval.runtime: required field is missing");
}

TEST_CASE("check_derivation: a child is never broader than its parent", "[ticket][derive]") {
  const ticket_issuer issuer;
  auto ps = spec();
  ps.expires_at = at(2026, 11, 30, 13);
  const auto parent = *issuer.issue(ps);
  const auto now = at(2026, 11, 30, 12);
  const auto good = *issuer.derive(parent, approval_for(parent), {.now = now, .id = "d-1"});
  const std::string text = sandbox::encode(good);
  auto problem = [&](const std::string& doc) -> std::string {
    auto child = ticket_issuer{}.decode(doc);
    REQUIRE(decoded(child));
    return sandbox::check_derivation(parent, *child, now).value_or("<valid>");
  };
  CHECK(problem(text) == "<valid>");
  CHECK(problem(with_member(text, "isolation", R"("process")")) ==
        "isolation: below 'container' for a network ticket");
  CHECK(problem(with_member(text, "max_timeout_ms", "8001")) ==
        "max_timeout_ms: above the parent's");
  CHECK(problem(with_member(text, "max_memory_bytes", "536870913")) ==
        "max_memory_bytes: above the parent's");
  CHECK(problem(with_member(text, "expires_at", "")) == "expires_at: a derived ticket must expire");
  CHECK(problem(with_member(text, "expires_at", R"("2026-11-30T13:00:01Z")")) ==
        "expires_at: later than the parent's");
  CHECK(problem(with_member(text, "egress", R"(["api.example.com","evil.example"])")) ==
        "egress: 'evil.example' was not approved");
  CHECK(problem(with_member(text, "egress", R"(["*.example.com"])")) ==
        "egress: '*.example.com' was not approved");
  CHECK(problem(with_member(text, "egress", R"(["img.cdn.example"])")) == "<valid>");
  CHECK(problem(with_member(text, "runtime_digest", "")) ==
        "runtime_digest: an approved ticket must pin the image");
  CHECK(problem(with_member(text, "runtime_digest", "\"sha256:" + std::string(64, 'b') + "\"")) ==
        "runtime_digest: not the image the approval is for");
  // Gaining code.network without an approval.
  auto no_approval = with_member(text, "approval", "");
  CHECK(problem(no_approval) == "actions: grants code.network without an approval");
  // Another parent, another tenant.
  CHECK(problem(with_member(with_member(text, "approval", ""), "derived_from", R"(["t-9"])")) ==
        "derived_from: the ticket is not derived from 't-1'");
  auto j = nlohmann::ordered_json::parse(text);
  j["tenant"] = "other";
  j["approval"]["tenant"] = "other";
  CHECK(problem(j.dump()) == "tenant: differs from the parent's");
  // Expiry far away (checked against `now`).
  auto far = issuer.derive(*issuer.issue(spec()), approval_for(parent), {.now = now});
  REQUIRE(far.has_value());
  CHECK(sandbox::check_derivation(*issuer.issue(spec()), *far, now - 51min).value_or("") ==
        "expires_at: more than 3600 s from now");
  // A parent with code.network: the child narrows its domains without an approval.
  auto ns = net_spec();
  ns.egress = {"*.example.com"};
  const auto net_parent = *issuer.issue(ns, sandbox::network_grant{});
  auto child_doc =
      with_member(with_member(text, "approval", ""), "egress", R"(["api.example.com"])");
  auto child = ticket_issuer{}.decode(child_doc);
  REQUIRE(decoded(child));
  CHECK_FALSE(sandbox::check_derivation(net_parent, *child, now));
  child = ticket_issuer{}.decode(with_member(child_doc, "egress", R"(["other.example"])"));
  REQUIRE(decoded(child));
  CHECK(sandbox::check_derivation(net_parent, *child, now).value_or("") ==
        "egress: 'other.example' is not allowed by the parent");
  // A parent without code.execute.
  auto ne = spec();
  ne.execute = false;
  CHECK(sandbox::check_derivation(*issuer.issue(ne), good, now).value_or("") ==
        "actions: grants code.execute, which the parent does not");
}
