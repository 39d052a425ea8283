// L7 egress rules at request time (core/egress/l7_rules.hpp) and inside a terminated tunnel
// (terminated_http.hpp): methods and path prefixes, budgets, and the path-safety refusals,
// tested as families — a variant one byte away from a refused target is refused the same way.
#include "core/egress/l7_rules.hpp"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/egress/terminated_http.hpp"

using namespace sandbox::detail;
using sandbox::egress_rule;

namespace {

egress_rule rates_read(std::optional<std::uint64_t> max_requests = std::nullopt,
                       std::optional<std::uint64_t> max_bytes = std::nullopt) {
  return egress_rule{.name = "rates-read",
                     .host = "api.example.com",
                     .methods = {"GET", "HEAD"},
                     .paths = {"/v1/rates/", "/v1/lanes"},
                     .max_requests = max_requests,
                     .max_bytes = max_bytes};
}

egress_rule quote_write() {
  return egress_rule{
      .name = "quote-write", .host = "*.example.com", .methods = {"POST"}, .paths = {"/v1/quote"}};
}

// Every way of writing `hex` (two hex digits) in upper and lower case.
std::vector<std::string> cases(const std::string& hex) {
  std::vector<std::string> out;
  for (int mask = 0; mask < 4; ++mask) {
    std::string h = hex;
    for (int i = 0; i < 2; ++i) {
      const char c = h[static_cast<std::size_t>(i)];
      if (c >= 'a' && c <= 'f' && (mask & (1 << i))) h[static_cast<std::size_t>(i)] = c - 32;
      if (c >= 'A' && c <= 'F' && (mask & (1 << i))) h[static_cast<std::size_t>(i)] = c + 32;
    }
    if (std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  }
  return out;
}

// Targets under the allowed prefix that must all be refused `unsafe_path`: each construct at
// several places, each encoded byte in every case.
std::vector<std::string> unsafe_family() {
  std::vector<std::string> out;
  const std::vector<std::string> places = {"/v1/rates/{}", "/v1/rates/{}/admin", "/v1/rates/x{}y",
                                           "/v1/rates/eu/{}/../x"};
  const auto at = [&](const std::string& piece) {
    for (const auto& p : places) {
      std::string t = p;
      t.replace(t.find("{}"), 2, piece);
      out.push_back(t);
    }
  };
  // Dot segments, with and without path parameters, and in the last segment.
  for (const std::string seg :
       {"/..", "/.", "/../", "/./", "/..;", "/..;x/", "/.;/", "/...", "/..%3b", "/..%3B"}) {
    out.push_back("/v1/rates" + seg);
    out.push_back("/v1/rates/eu" + seg + "/admin");
  }
  // Percent-encoded '.', '/', '\', '%', NUL and other controls, overlong UTF-8 lead bytes.
  for (const std::string hex :
       {"2e", "2f", "5c", "25", "00", "01", "0a", "0d", "09", "1f", "7f", "c0", "c1"}) {
    for (const auto& h : cases(hex)) {
      at("%" + h);
      at("%" + h + "%" + h);
      at(".%" + h);
      at("%" + h + ".");
    }
  }
  // Malformed percent-encodings.
  for (const std::string bad : {"%", "%2", "%zz", "%2g", "%g2", "%u002e", "%%"}) at(bad);
  // Backslashes, raw control and non-ASCII bytes, fragments, anywhere in the target.
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if ((b >= 0x21 && b <= 0x7E) && c != '\\' && c != '#') continue;
    at(std::string(1, c));
    out.push_back("/v1/rates/eu?q=" + std::string(1, c));
  }
  return out;
}

}  // namespace

TEST_CASE("l7 rules: hosts without rules are not judged", "[egress][egress_rules]") {
  l7_rules rules({rates_read()});
  CHECK(rules.applies("api.example.com"));
  CHECK_FALSE(rules.applies("other.example.com"));
  const auto v = rules.admit("other.example.com", "DELETE", "/anything/../x", std::nullopt);
  CHECK_FALSE(v.ruled);
  CHECK(v.allowed);
  CHECK(l7_rules({}).empty());
}

TEST_CASE("l7 rules: method and path prefix, else rule_refused naming the host's rules",
          "[egress][egress_rules]") {
  l7_rules rules({rates_read(), quote_write()});
  const auto allowed = [&](std::string_view method, std::string_view target) {
    const auto v = rules.admit("api.example.com", method, target, 0);
    CHECK(v.ruled);
    return v.allowed;
  };
  CHECK(allowed("GET", "/v1/rates/eu"));
  CHECK(allowed("HEAD", "/v1/rates/"));
  CHECK(allowed("GET", "/v1/rates/eu?from=NLRTM&to=%2Fx"));  // the query is not the path
  CHECK(allowed("GET", "/v1/lanes"));
  CHECK(allowed("GET", "/v1/lanes/2"));
  CHECK(allowed("POST", "/v1/quote"));
  CHECK_FALSE(allowed("GET", "/v1/rates"));
  CHECK_FALSE(allowed("GET", "/v1/lanesX"));
  CHECK_FALSE(allowed("GET", "/v1/quote"));
  CHECK_FALSE(allowed("POST", "/v1/rates/eu"));
  CHECK_FALSE(allowed("get", "/v1/rates/eu"));
  CHECK_FALSE(allowed("OPTIONS", "*"));
  CHECK_FALSE(allowed("GET", "/V1/RATES/eu"));

  const auto v = rules.admit("api.example.com", "POST", "/v1/rates/eu", 10);
  CHECK(v.reason == "rule_refused");
  CHECK(v.status == 403);
  CHECK(v.rule_names == "rates-read,quote-write");
  CHECK(v.advice.find("rule 'rates-read' allows GET, HEAD /v1/rates/, /v1/lanes") !=
        std::string::npos);
  CHECK(v.advice.find("rule 'quote-write' allows POST /v1/quote") != std::string::npos);
  CHECK(v.advice.find("no rule for this host allows POST /v1/rates/eu") != std::string::npos);
  const auto ok = rules.admit("api.example.com", "GET", "/v1/rates/eu", 0);
  CHECK(ok.rule == 0);
  CHECK(ok.rule_names == "rates-read");
  // Only the host's own rules are named.
  const auto other = rules.admit("www.example.com", "GET", "/v1/rates/eu", 0);
  CHECK(other.reason == "rule_refused");
  CHECK(other.rule_names == "quote-write");
}

TEST_CASE("l7 rules: budgets count requests and bytes over the run", "[egress][egress_rules]") {
  l7_rules rules({rates_read(3, 100)});
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(rules.admit("api.example.com", "GET", "/v1/rates/eu", 0).allowed);
  }
  auto v = rules.admit("api.example.com", "GET", "/v1/rates/eu", 0);
  CHECK_FALSE(v.allowed);
  CHECK(v.reason == "budget_exhausted");
  CHECK(v.rule_names == "rates-read");
  CHECK(v.advice.find("3 requests and 100 bytes per run") != std::string::npos);
  // A refused request to an unallowed path is still rule_refused.
  CHECK(rules.admit("api.example.com", "POST", "/v1/rates/eu", 0).reason == "rule_refused");

  // Bytes: a known body is reserved up front; a response takes what is left.
  l7_rules bytes({rates_read(std::nullopt, 100)});
  CHECK(bytes.admit("api.example.com", "GET", "/v1/rates/a", 60).allowed);
  CHECK(bytes.admit("api.example.com", "GET", "/v1/rates/a", 41).reason == "budget_exhausted");
  CHECK(bytes.take_bytes(0, 30) == 30);
  CHECK(bytes.take_bytes(0, 30) == 10);  // cut at the limit
  CHECK(bytes.take_bytes(0, 1) == 0);
  CHECK(bytes.admit("api.example.com", "GET", "/v1/rates/a", 0).reason == "budget_exhausted");
  // Huge bodies never overflow the count.
  l7_rules huge({rates_read(std::nullopt, UINT64_MAX)});
  CHECK(huge.admit("api.example.com", "GET", "/v1/rates/a", UINT64_MAX - 1).allowed);
  CHECK_FALSE(huge.admit("api.example.com", "GET", "/v1/rates/a", 2).allowed);
  // Without a byte budget, bytes are unlimited.
  l7_rules unlimited({rates_read()});
  CHECK(unlimited.take_bytes(0, 1ULL << 40) == 1ULL << 40);

  // A second rule allowing the same request takes over when the first is spent.
  auto spare = rates_read(1);
  spare.name = "spare";
  l7_rules two({rates_read(1), spare});
  CHECK(two.admit("api.example.com", "GET", "/v1/rates/x", 0).rule_names == "rates-read");
  CHECK(two.admit("api.example.com", "GET", "/v1/rates/x", 0).rule_names == "spare");
  v = two.admit("api.example.com", "GET", "/v1/rates/x", 0);
  CHECK(v.reason == "budget_exhausted");
  CHECK(v.rule_names == "rates-read");
}

TEST_CASE("l7 rules: unsafe paths are refused as families", "[egress][egress_rules]") {
  const auto family = unsafe_family();
  REQUIRE(family.size() > 300);
  for (const auto& target : family) {
    CAPTURE(target);
    CHECK(unsafe_target(target));
    l7_rules rules({rates_read()});
    const auto v = rules.admit("api.example.com", "GET", target, 0);
    CHECK(v.ruled);
    CHECK_FALSE(v.allowed);
    CHECK(v.reason == "unsafe_path");
    CHECK(v.rule_names == "rates-read");
    CHECK(v.advice.find("rule 'rates-read' allows GET, HEAD") != std::string::npos);
  }
  // Their safe neighbours, one byte away, pass.
  for (const std::string target :
       {"/v1/rates/eu", "/v1/rates/a..b", "/v1/rates/x..", "/v1/rates/.well-known", "/v1/rates/a.b",
        "/v1/rates/%20", "/v1/rates/%41", "/v1/rates/%2d", "/v1/rates/%3b", "/v1/rates/%c3%a4",
        "/v1/rates/;x", "/v1/rates/eu?x=%2e%2e%2f..%5c", "/v1/rates//x"}) {
    CAPTURE(target);
    CHECK_FALSE(unsafe_target(target));
    l7_rules rules({rates_read()});
    CHECK(rules.admit("api.example.com", "GET", target, 0).allowed);
  }
  // Not origin-form: absolute-form and authority-form never match a rule path.
  for (const std::string target :
       {"http://api.example.com/v1/rates/", "api.example.com:443", "//evil.example/v1/rates/"}) {
    CAPTURE(target);
    l7_rules rules({rates_read()});
    CHECK_FALSE(rules.admit("api.example.com", "GET", target, 0).allowed);
  }
}

TEST_CASE("l7 rules: random targets are allowed only under a prefix, plainly",
          "[egress][egress_rules]") {
  // A property over mutations of allowed and refused targets: whatever is allowed starts with
  // an allowed prefix, and holds no '%' encoding of '.', '/', '\' nor a dot segment.
  std::mt19937 rng(20261130);
  const std::string alphabet = "/.%2eEfF5cC;?#\\a\x01\x7f\xc0";
  const std::vector<std::string> seeds = {"/v1/rates/eu", "/v1/rates/../admin", "/v1/lanes",
                                          "/v1/rates/%2e%2e/x"};
  l7_rules rules({rates_read()});
  for (int i = 0; i < 20000; ++i) {
    std::string t = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % (t.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        case 1:
          if (at < t.size()) t[at] = c;
          break;
        default:
          if (at < t.size()) t.erase(at, 1);
      }
    }
    const auto v = rules.admit("api.example.com", "GET", t, 0);
    if (!v.allowed) continue;
    CAPTURE(t);
    const std::string_view path = target_path(t);
    CHECK(
        (path.starts_with("/v1/rates/") || path == "/v1/lanes" || path.starts_with("/v1/lanes/")));
    CHECK(path.find("/../") == std::string_view::npos);
    CHECK(path.find("/./") == std::string_view::npos);
    CHECK_FALSE(path.ends_with("/.."));
    CHECK_FALSE(path.ends_with("/."));
    for (const char* enc : {"%2e", "%2E", "%2f", "%2F", "%5c", "%5C", "%25"}) {
      CHECK(path.find(enc) == std::string_view::npos);
    }
    CHECK(t.find('\\') == std::string::npos);
  }
}

TEST_CASE("l7 rules: records show the target escaped and bounded", "[egress][egress_rules]") {
  CHECK(display_target("/v1/rates/eu") == "/v1/rates/eu");
  CHECK(display_target(std::string("/a\0b\\c d", 8)) == "/a\\x00b\\x5cc\\x20d");
  const auto long_one = display_target(std::string(300, 'a'));
  CHECK(long_one.size() == max_recorded_target_bytes);
  const auto escaped = display_target(std::string(300, '\x01'));
  CHECK(escaped.size() <= max_recorded_target_bytes);
  CHECK(escaped.size() % 4 == 0);  // never cut inside an escape
  CHECK(target_path("/a/b?c=/d") == "/a/b");
}

// ---------------------------------------------------------------------------------------------
// Inside a terminated tunnel

namespace {

std::string request(std::string_view method, std::string_view target, std::string_view extra = "") {
  return std::string(method) + " " + std::string(target) +
         " HTTP/1.1\r\nHost: api.example.com\r\n" + std::string(extra) + "\r\n";
}

}  // namespace

TEST_CASE("terminated http: L7 rules judge every request of a tunnel", "[egress][egress_rules]") {
  l7_rules rules({rates_read(2)});
  terminated_http t("api.example.com", {}, &rules);
  std::string out;
  // Two requests on one kept-alive connection: both admitted, both listed.
  REQUIRE_FALSE(t.from_client(request("GET", "/v1/rates/eu") + request("HEAD", "/v1/lanes"), out));
  CHECK(out == request("GET", "/v1/rates/eu") + request("HEAD", "/v1/lanes"));
  auto judged = t.take_judged();
  REQUIRE(judged.size() == 2);
  CHECK(judged[0].method == "GET");
  CHECK(judged[0].path == "/v1/rates/eu");
  CHECK(judged[0].rule == "rates-read");
  CHECK(judged[0].allowed);
  CHECK(judged[1].method == "HEAD");
  CHECK(t.take_judged().empty());
  // The third: the request budget is spent.
  out.clear();
  auto r = t.from_client(request("GET", "/v1/rates/eu"), out);
  REQUIRE(r);
  CHECK(r->status == 403);
  CHECK(r->reason == "budget_exhausted");
  CHECK(r->rule == "rates-read");
  CHECK(r->advice.find("2 requests per run") != std::string::npos);
  CHECK(out.empty());
  judged = t.take_judged();
  REQUIRE(judged.size() == 1);
  CHECK_FALSE(judged[0].allowed);
  CHECK(judged[0].reason == "budget_exhausted");

  // Refused: another method, another path, an unsafe path; nothing goes upstream.
  for (const auto& [req, reason] : std::vector<std::pair<std::string, std::string>>{
           {request("POST", "/v1/rates/eu", "Content-Length: 2\r\n") + "{}", "rule_refused"},
           {request("GET", "/v1/admin"), "rule_refused"},
           {request("GET", "/v1/rates/%2e%2e/admin"), "unsafe_path"},
           {request("GET", "/v1/rates/..;/admin"), "unsafe_path"},
           {request("OPTIONS", "*"), "rule_refused"},
       }) {
    CAPTURE(req);
    l7_rules fresh({rates_read()});
    terminated_http u("api.example.com", {}, &fresh);
    std::string up;
    auto refusal = u.from_client(req, up);
    REQUIRE(refusal);
    CHECK(refusal->reason == reason);
    CHECK(refusal->rule == "rates-read");
    CHECK(up.empty());
    CHECK(u.can_answer_refusal());
  }
  // Absolute-form inside the tunnel stays malformed, whatever the rules.
  l7_rules fresh({rates_read()});
  terminated_http u("api.example.com", {}, &fresh);
  std::string up;
  auto refusal = u.from_client(request("GET", "https://api.example.com/v1/rates/eu"), up);
  REQUIRE(refusal);
  CHECK(refusal->reason == "malformed request");
  // A host without rules is not judged.
  terminated_http unruled("other.example.com", {}, &fresh);
  up.clear();
  REQUIRE_FALSE(unruled.from_client("DELETE /x HTTP/1.1\r\nHost: other.example.com\r\n\r\n", up));
  CHECK(unruled.take_judged().empty());
}

TEST_CASE("terminated http: a rule's byte budget cuts bodies both ways", "[egress][egress_rules]") {
  // A response crossing the budget: what fits is handed over, then the exchange fails.
  l7_rules rules({rates_read(std::nullopt, 10)});
  terminated_http t("api.example.com", {}, &rules);
  std::string up;
  REQUIRE_FALSE(t.from_client(request("GET", "/v1/rates/eu"), up));
  std::string out;
  auto r =
      t.from_origin("HTTP/1.1 200 OK\r\nContent-Length: 25\r\n\r\n0123456789abcdefghijklmno", out);
  REQUIRE(r);
  CHECK(r->reason == "budget_exhausted");
  CHECK(r->rule == "rates-read");
  CHECK(out.find("0123456789") != std::string::npos);
  CHECK(out.find("abc") == std::string::npos);
  CHECK(out.find("0\r\n\r\n") == std::string::npos);  // never a clean end
  // The next request finds the budget spent.
  up.clear();
  auto next = t.from_client(request("GET", "/v1/rates/eu"), up);
  REQUIRE(next);

  // A chunked request body is counted as it goes and refused where it crosses.
  l7_rules post_rules({egress_rule{.name = "upload",
                                   .host = "api.example.com",
                                   .methods = {"POST"},
                                   .paths = {"/v1/upload"},
                                   .max_bytes = 8}});
  terminated_http p("api.example.com", {}, &post_rules);
  up.clear();
  auto body = p.from_client(request("POST", "/v1/upload", "Transfer-Encoding: chunked\r\n") +
                                "5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n",
                            up);
  REQUIRE(body);
  CHECK(body->reason == "budget_exhausted");
  CHECK(up.empty());  // held and judged whole: nothing went
  // A Content-Length body larger than the budget is refused before it is read.
  terminated_http q("api.example.com", {}, &post_rules);
  up.clear();
  auto big = q.from_client(request("POST", "/v1/upload", "Content-Length: 9\r\n"), up);
  REQUIRE(big);
  CHECK(big->reason == "budget_exhausted");
  // One that fits passes, and its response's body counts too.
  l7_rules fit_rules({egress_rule{.name = "upload",
                                  .host = "api.example.com",
                                  .methods = {"POST"},
                                  .paths = {"/v1/upload"},
                                  .max_bytes = 8}});
  terminated_http f("api.example.com", {}, &fit_rules);
  up.clear();
  REQUIRE_FALSE(
      f.from_client(request("POST", "/v1/upload", "Content-Length: 5\r\n") + "hello", up));
  CHECK(up.ends_with("hello"));
  out.clear();
  REQUIRE_FALSE(f.from_origin("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc", out));
  CHECK(out.ends_with("3\r\nabc\r\n0\r\n\r\n"));
  CHECK(fit_rules.take_bytes(0, 5) == 0);  // 5 + 3 used
}
