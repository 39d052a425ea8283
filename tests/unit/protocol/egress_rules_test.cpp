// L7 egress rules as tickets carry them (sandbox/egress.hpp, `egress_rule`;
// `ticket_spec::egress_rules`): each field's check, path prefixes, the JSON form and its
// round trip, derivation that may only narrow, and admission handing a run its rules.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "sandbox/admission.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/ticket.hpp"

using namespace std::chrono_literals;
using sandbox::check_egress_rule;
using sandbox::egress_rule;
using sandbox::ticket_issuer;
using sandbox::ticket_spec;
using sys_clock = std::chrono::system_clock;

namespace {

egress_rule rates_read() {
  return egress_rule{.name = "rates-read",
                     .host = "api.example.com",
                     .methods = {"GET"},
                     .paths = {"/v1/rates/"},
                     .max_requests = 10,
                     .max_bytes = 1 << 20};
}

ticket_spec ruled_spec(std::vector<egress_rule> rules = {rates_read()}) {
  ticket_spec s{.id = "t-1", .tenant = "acme"};
  s.egress = {"api.example.com", "*.cdn.example"};
  s.egress_rules = std::move(rules);
  return s;
}

/// The problem `check_egress_rule` finds with `r` ("<valid>" for none).
std::string rule_problem(egress_rule r) { return check_egress_rule(r).value_or("<valid>"); }

/// A network ticket document whose `egress_rules` is `rules` (JSON).
std::string doc_with_rules(const std::string& rules) {
  return R"({"v":1,"id":"t-1","tenant":"acme","actions":["code.execute","code.network"],)"
         R"("isolation":"container","max_timeout_ms":8000,"max_memory_bytes":536870912,)"
         R"("egress":["api.example.com"],"egress_rules":)" +
         rules + "}";
}

std::string decode_problem(const std::string& doc) {
  auto t = ticket_issuer{}.decode(doc);
  if (t) return "<decoded>";
  CHECK(t.error().code == sandbox::code::invalid_request);
  return t.error().message;
}

const sys_clock::time_point noon =
    sys_clock::time_point(std::chrono::sys_days{std::chrono::year{2026} / 11 / 30} + 12h);
const std::string digest_a = "sha256:" + std::string(64, 'a');

sandbox::approval_request approval_for(const sandbox::ticket& parent,
                                       std::vector<std::string> domains) {
  sandbox::approval_request a;
  a.ticket_id = parent.id();
  a.tenant = parent.tenant();
  a.domains = std::move(domains);
  a.timeout = 2000ms;
  a.memory_limit_bytes = 256ULL << 20;
  a.source_sha256 = std::string(64, 'e');
  a.source_bytes = 9;
  a.isolation = sandbox::isolation::container;
  a.runtime = {"python3", digest_a};
  return a;
}

}  // namespace

TEST_CASE("egress rules: each field is checked, naming it", "[ticket][egress_rules]") {
  CHECK(rule_problem(rates_read()) == "<valid>");
  auto r = rates_read();
  r.host = "API.Example.COM.";
  REQUIRE_FALSE(check_egress_rule(r));
  CHECK(r.host == "api.example.com");  // canonical

  const auto with = [](auto edit) {
    auto x = rates_read();
    edit(x);
    return rule_problem(x);
  };
  // Names: [a-z0-9-], 1..64.
  for (const char* bad : {"", "Rates", "rates_read", "rates.read", "r s", "ä"}) {
    CAPTURE(bad);
    CHECK(with([&](egress_rule& x) { x.name = bad; }).rfind("name: ", 0) == 0);
  }
  CHECK(with([](egress_rule& x) { x.name = std::string(64, 'a'); }) == "<valid>");
  CHECK(with([](egress_rule& x) { x.name = std::string(65, 'a'); }).rfind("name: ", 0) == 0);
  // Hosts: egress patterns.
  for (const char* bad :
       {"", "*", "10.0.0.1", "api.example.com:443", "https://api.example.com", "*.com", "a..b"}) {
    CAPTURE(bad);
    CHECK(with([&](egress_rule& x) { x.host = bad; }).rfind("host: ", 0) == 0);
  }
  // Methods: a fixed set, upper case, no duplicates, not empty.
  CHECK(with([](egress_rule& x) { x.methods = {}; }) == "methods: must not be empty");
  for (const char* bad : {"get", "CONNECT", "TRACE", "GET ", "PROPFIND", ""}) {
    CAPTURE(bad);
    CHECK(with([&](egress_rule& x) { x.methods = {"GET", bad}; }).rfind("methods[1]: ", 0) == 0);
  }
  CHECK(with([](egress_rule& x) { x.methods = {"GET", "GET"}; }) == "methods[1]: duplicate 'GET'");
  CHECK(with([](egress_rule& x) {
          x.methods = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};
        }) == "<valid>");
  // Paths.
  CHECK(with([](egress_rule& x) { x.paths = {}; }) == "paths: must not be empty");
  for (const std::string& bad : std::vector<std::string>{
           "", "v1/rates/", "/v1/%2e%2e/", "/v1/rates%2F", "/v1?x", "/v1#x", "/v1\\rates",
           "/v1/../admin", "/v1/./x", "/..", "/v1/.", "/v1/..x", "/v1/.;x", "/v1 /x",
           std::string("/v1\0x", 5), "/v1/\x7f", "/v1/\xc3\xa4", "/" + std::string(256, 'a')}) {
    CAPTURE(bad);
    CHECK(with([&](egress_rule& x) { x.paths = {"/ok/", bad}; }).rfind("paths[1]: ", 0) == 0);
  }
  CHECK(with([](egress_rule& x) { x.paths = {"/a/", "/a/"}; }) == "paths[1]: duplicate '/a/'");
  CHECK(with([](egress_rule& x) {
          x.paths = std::vector<std::string>(33, "/a");
        }).rfind("paths: 33 prefixes", 0) == 0);
  for (const std::string& good :
       std::vector<std::string>{"/", "/v1/rates", "/v1/rates/", "/v1/x..", "/.well-known/", "/a;b",
                                "/" + std::string(255, 'a')}) {
    CAPTURE(good);
    CHECK(with([&](egress_rule& x) { x.paths = {good}; }) == "<valid>");
  }
  // Budgets: absent, or > 0.
  CHECK(with([](egress_rule& x) { x.max_requests = 0; }).rfind("max_requests: ", 0) == 0);
  CHECK(with([](egress_rule& x) { x.max_bytes = 0; }).rfind("max_bytes: ", 0) == 0);
  CHECK(with([](egress_rule& x) {
          x.max_requests.reset();
          x.max_bytes.reset();
        }) == "<valid>");
}

TEST_CASE("egress rules: path prefixes match at segment boundaries, as sent",
          "[ticket][egress_rules]") {
  using sandbox::egress_path_matches;
  CHECK(egress_path_matches("/v1/rates/", "/v1/rates/"));
  CHECK(egress_path_matches("/v1/rates/", "/v1/rates/eu"));
  CHECK(egress_path_matches("/v1/rates/", "/v1/rates//x"));
  CHECK_FALSE(egress_path_matches("/v1/rates/", "/v1/rates"));
  CHECK_FALSE(egress_path_matches("/v1/rates/", "/v1/ratesX/"));
  CHECK_FALSE(egress_path_matches("/v1/rates/", "/V1/RATES/"));  // case kept
  CHECK_FALSE(egress_path_matches("/v1/rates/", "/v1/rates%2F"));
  CHECK(egress_path_matches("/v1/rates", "/v1/rates"));
  CHECK(egress_path_matches("/v1/rates", "/v1/rates/eu"));
  CHECK_FALSE(egress_path_matches("/v1/rates", "/v1/ratesX"));
  CHECK_FALSE(egress_path_matches("/v1/rates", "/v1/rates.json"));
  CHECK_FALSE(egress_path_matches("/v1/rates", "/v1/rate"));
  CHECK(egress_path_matches("/", "/anything"));
  CHECK_FALSE(egress_path_matches("/", "*"));
  CHECK_FALSE(egress_path_matches("", "/x"));
}

TEST_CASE("egress rules: one rule within another", "[ticket][egress_rules]") {
  using sandbox::egress_rule_within;
  const auto outer = egress_rule{.name = "o",
                                 .host = "*.example.com",
                                 .methods = {"GET", "HEAD"},
                                 .paths = {"/v1/rates", "/v2/"},
                                 .max_requests = 10};
  auto inner = egress_rule{.name = "i",
                           .host = "api.example.com",
                           .methods = {"GET"},
                           .paths = {"/v1/rates/eu", "/v2/x"},
                           .max_requests = 5};
  CHECK(egress_rule_within(inner, outer));
  CHECK(egress_rule_within(outer, outer));
  const auto edited = [&](auto edit) {
    auto x = inner;
    edit(x);
    return egress_rule_within(x, outer);
  };
  CHECK_FALSE(edited([](egress_rule& x) { x.host = "api.example.org"; }));
  CHECK_FALSE(edited([](egress_rule& x) { x.host = "example.com"; }));
  CHECK(edited([](egress_rule& x) { x.host = "*.a.example.com"; }));
  CHECK_FALSE(edited([](egress_rule& x) { x.methods = {"POST"}; }));
  CHECK_FALSE(edited([](egress_rule& x) { x.paths = {"/v1/ratesX"}; }));
  CHECK(edited([](egress_rule& x) { x.paths = {"/v1/rates"}; }));
  CHECK(edited([](egress_rule& x) { x.paths = {"/v1/rates/"}; }));
  CHECK_FALSE(edited([](egress_rule& x) { x.paths = {"/v2"}; }));  // "/v2" is not under "/v2/"
  CHECK_FALSE(edited([](egress_rule& x) { x.paths = {"/"}; }));
  CHECK_FALSE(edited([](egress_rule& x) { x.max_requests.reset(); }));  // loses the budget
  CHECK_FALSE(edited([](egress_rule& x) { x.max_requests = 11; }));
  CHECK(edited([](egress_rule& x) { x.max_bytes = 5; }));  // a budget of its own: narrower
}

TEST_CASE("egress rules: pattern intersection", "[ticket][egress_rules]") {
  using sandbox::egress_intersection;
  CHECK(egress_intersection("api.example.com", "api.example.com") == "api.example.com");
  CHECK(egress_intersection("api.example.com", "*.example.com") == "api.example.com");
  CHECK(egress_intersection("*.example.com", "api.example.com") == "api.example.com");
  CHECK(egress_intersection("*.example.com", "*.a.example.com") == "*.a.example.com");
  CHECK_FALSE(egress_intersection("*.example.com", "example.com"));
  CHECK_FALSE(egress_intersection("*.a.example.com", "*.b.example.com"));
  CHECK_FALSE(egress_intersection("a.example.com", "b.example.com"));
}

TEST_CASE("egress rules: a ticket carries them with the network only", "[ticket][egress_rules]") {
  const ticket_issuer issuer;
  auto t = issuer.issue(ruled_spec(), sandbox::network_grant{});
  REQUIRE(t.has_value());
  CHECK(t->egress_rules() == std::vector<egress_rule>{rates_read()});
  // Without code.network: refused.
  auto s = ruled_spec();
  s.egress.clear();
  CHECK_FALSE(issuer.issue(s).has_value());
  // A rule for a host the egress does not allow; a wildcard rule sharing a name is fine.
  auto off = rates_read();
  off.host = "api.other.example";
  CHECK_FALSE(issuer.issue(ruled_spec({off}), sandbox::network_grant{}).has_value());
  auto wide = rates_read();
  wide.host = "*.example.com";
  CHECK(issuer.issue(ruled_spec({wide}), sandbox::network_grant{}).has_value());
  // Names unique; at most 32 rules.
  auto twin = rates_read();
  twin.paths = {"/v2/"};
  CHECK_FALSE(issuer.issue(ruled_spec({rates_read(), twin}), sandbox::network_grant{}).has_value());
  std::vector<egress_rule> many;
  for (int i = 0; i < 33; ++i) {
    auto r = rates_read();
    r.name = "r" + std::to_string(i);
    many.push_back(r);
  }
  CHECK_FALSE(issuer.issue(ruled_spec(many), sandbox::network_grant{}).has_value());
  many.pop_back();
  CHECK(issuer.issue(ruled_spec(many), sandbox::network_grant{}).has_value());
}

TEST_CASE("egress rules: the JSON form, strict, naming the field", "[ticket][egress_rules][json]") {
  const std::string good =
      R"([{"name":"rates-read","host":"API.example.com","methods":["GET","HEAD"],)"
      R"("paths":["/v1/rates/"],"max_requests":10,"max_bytes":1048576},)"
      R"({"name":"quote","host":"api.example.com","methods":["POST"],"paths":["/v1/quote"]}])";
  auto t = ticket_issuer{}.decode(doc_with_rules(good));
  REQUIRE(t.has_value());
  REQUIRE(t->egress_rules().size() == 2);
  CHECK(t->egress_rules()[0].host == "api.example.com");
  CHECK(t->egress_rules()[0].max_requests == 10u);
  CHECK(t->egress_rules()[1].max_bytes == std::nullopt);
  // Round trip: canonical, budgets written only when set, equal tickets equal bytes.
  const std::string text = sandbox::encode(*t);
  CHECK(text.find(R"("egress_rules":[{"name":"rates-read","host":"api.example.com",)"
                  R"("methods":["GET","HEAD"],"paths":["/v1/rates/"],"max_requests":10,)"
                  R"("max_bytes":1048576},{"name":"quote","host":"api.example.com",)"
                  R"("methods":["POST"],"paths":["/v1/quote"]}])") != std::string::npos);
  auto back = ticket_issuer{}.decode(text);
  REQUIRE(back.has_value());
  CHECK(*back == *t);
  CHECK(sandbox::encode(*back) == text);
  // A ticket without rules writes none.
  CHECK(
      sandbox::encode(*ticket_issuer{}.issue({.id = "x", .tenant = "acme"})).find("egress_rules") ==
      std::string::npos);

  CHECK(decode_problem(doc_with_rules("[]")) == "egress_rules: must not be empty (leave it out)");
  CHECK(decode_problem(doc_with_rules("{}")) == "egress_rules: expected an array");
  CHECK(decode_problem(doc_with_rules(R"([{"name":"a","host":"api.example.com","methods":["GET"],)"
                                      R"("paths":["/"],"extra":1}])")) ==
        "egress_rules[0]: unknown field 'extra'");
  CHECK(decode_problem(doc_with_rules(R"([{"host":"api.example.com","methods":["GET"],)"
                                      R"("paths":["/"]}])")) ==
        "egress_rules[0].name: required field is missing");
  CHECK(decode_problem(doc_with_rules(R"([{"name":"a","host":"api.example.com","methods":"GET",)"
                                      R"("paths":["/"]}])")) ==
        "egress_rules[0].methods: expected an array");
  CHECK(decode_problem(doc_with_rules(R"([{"name":"a","host":"api.example.com","methods":["GET"],)"
                                      R"("paths":["/"],"max_bytes":-1}])"))
            .rfind("egress_rules[0].max_bytes: ", 0) == 0);
  CHECK(decode_problem(doc_with_rules(R"([{"name":"a","host":"api.example.com","methods":["GET"],)"
                                      R"("paths":["/"],"max_requests":0}])"))
            .rfind("egress_rules[0].max_requests: must be greater than 0", 0) == 0);
  CHECK(decode_problem(doc_with_rules(R"([{"name":"a","host":"api.example.com","methods":["GET"],)"
                                      R"("paths":["/"]},{"name":"b","host":"api.example.com",)"
                                      R"("methods":["GET"],"paths":["/ok","/x/%2e%2e/"]}])"))
            .rfind("egress_rules[1].paths[1]: no '%'", 0) == 0);
  CHECK(decode_problem(doc_with_rules(R"([{"name":"a","host":"evil.example","methods":["GET"],)"
                                      R"("paths":["/"]}])")) ==
        "egress_rules[0].host: 'evil.example' names no host the ticket's egress allows");
  CHECK(decode_problem(doc_with_rules(R"([{"name":"a","host":"api.example.com",)"
                                      R"("methods":["get"],"paths":["/"]}])"))
            .rfind("egress_rules[0].methods[0]: not one of GET", 0) == 0);
  // Rules without the network.
  CHECK(decode_problem(
            R"({"v":1,"id":"t-1","tenant":"acme","actions":["code.execute"],"isolation":"process",)"
            R"("max_timeout_ms":8000,"max_memory_bytes":536870912,"egress_rules":[{"name":"a",)"
            R"("host":"api.example.com","methods":["GET"],"paths":["/"]}]})") ==
        "egress_rules: only a ticket granting code.network may have L7 rules");
}

TEST_CASE("egress rules: a derived ticket only narrows them", "[ticket][egress_rules][derive]") {
  const ticket_issuer issuer;
  // A network parent with rules (derived from directly; approvals are the usual path).
  auto ps = ruled_spec();
  ps.isolation = sandbox::isolation::container;
  const auto parent = *issuer.issue(ps, sandbox::network_grant{});
  const auto approval = approval_for(parent, {"api.example.com", "img.cdn.example"});
  auto d = issuer.derive(parent, approval, {.now = noon, .id = "d-1"});
  REQUIRE(d.has_value());
  CHECK(d->egress_rules() == parent.egress_rules());  // kept: they apply to the domains
  CHECK_FALSE(sandbox::check_derivation(parent, *d, noon));
  // Approved for the unruled name only: the parent's rule does not apply, and is not kept.
  auto cdn = issuer.derive(parent, approval,
                           {.now = noon, .domains = std::vector<std::string>{"img.cdn.example"}});
  REQUIRE(cdn.has_value());
  CHECK(cdn->egress_rules().empty());
  // Narrower rules given by the approver: fine; broader, dropped or off-host: refused.
  auto narrow = rates_read();
  narrow.paths = {"/v1/rates/eu"};
  narrow.max_requests = 2;
  auto cdn_rule =
      egress_rule{.name = "cdn", .host = "*.cdn.example", .methods = {"GET"}, .paths = {"/img/"}};
  CHECK(issuer
            .derive(parent, approval,
                    {.now = noon, .egress_rules = std::vector<egress_rule>{narrow, cdn_rule}})
            .has_value());
  const auto refused = [&](std::vector<egress_rule> rules) {
    return !issuer.derive(parent, approval, {.now = noon, .egress_rules = std::move(rules)});
  };
  auto wider = rates_read();
  wider.methods = {"GET", "POST"};
  CHECK(refused({wider}));
  auto no_budget = rates_read();
  no_budget.max_bytes.reset();
  CHECK(refused({no_budget}));
  auto root = rates_read();
  root.paths = {"/"};
  CHECK(refused({root}));
  CHECK(refused({}));          // the ruled host would lose its rules
  CHECK(refused({cdn_rule}));  // likewise

  // check_derivation on documents (what a verifier and the runtime see).
  const std::string text = sandbox::encode(*d);
  const auto problem = [&](const std::string& rules_json) {
    auto j = nlohmann::ordered_json::parse(text);
    if (rules_json.empty()) {
      j.erase("egress_rules");
    } else {
      j["egress_rules"] = nlohmann::ordered_json::parse(rules_json);
    }
    auto child = ticket_issuer{}.decode(j.dump());
    REQUIRE(child.has_value());
    return sandbox::check_derivation(parent, *child, noon).value_or("<valid>");
  };
  CHECK(problem("") == "egress_rules: 'api.example.com' loses the parent's rule 'rates-read'");
  CHECK(problem(R"([{"name":"rates-read","host":"api.example.com","methods":["GET"],)"
                R"("paths":["/v1/"],"max_requests":10,"max_bytes":1048576}])") ==
        "egress_rules[0]: 'rates-read' is not within a rule of the parent (host, methods, "
        "paths and budgets)");
  CHECK(problem(R"([{"name":"rates-read","host":"api.example.com","methods":["GET"],)"
                R"("paths":["/v1/rates/"],"max_requests":11,"max_bytes":1048576}])") ==
        "egress_rules[0]: 'rates-read' is not within a rule of the parent (host, methods, "
        "paths and budgets)");
  CHECK(problem(R"([{"name":"x","host":"api.example.com","methods":["GET"],)"
                R"("paths":["/v1/rates/a","/v1/rates/b"],"max_requests":1,"max_bytes":1}])") ==
        "<valid>");
  // A rule for a host the parent left unruled only restricts: fine.
  CHECK(
      problem(R"([{"name":"rates-read","host":"api.example.com","methods":["GET"],)"
              R"("paths":["/v1/rates/"],"max_requests":10,"max_bytes":1048576},)"
              R"({"name":"cdn","host":"*.cdn.example","methods":["GET","POST"],"paths":["/"]}])") ==
      "<valid>");
  // A rule over a wider host than the parent's rule, reaching into it: refused.
  CHECK(problem(
            R"([{"name":"rates-read","host":"api.example.com","methods":["GET"],)"
            R"("paths":["/v1/rates/"],"max_requests":10,"max_bytes":1048576},)"
            R"({"name":"wide","host":"*.example.com","methods":["GET","POST"],"paths":["/"]}])") ==
        "egress_rules[1]: 'wide' is not within a rule of the parent (host, methods, paths and "
        "budgets)");

  // A parent without the network (the approval flow): the approver may add rules.
  const auto plain = *issuer.issue({.id = "t-2", .tenant = "acme"});
  const auto ask = approval_for(plain, {"api.example.com"});
  auto added = issuer.derive(plain, ask,
                             {.now = noon, .egress_rules = std::vector<egress_rule>{rates_read()}});
  REQUIRE(added.has_value());
  CHECK(added->egress_rules() == std::vector<egress_rule>{rates_read()});
  CHECK_FALSE(sandbox::check_derivation(plain, *added, noon));
  CHECK(issuer.derive(plain, ask, {.now = noon})->egress_rules().empty());
}

TEST_CASE("egress rules: admission hands a run the rules of its domains",
          "[ticket][egress_rules][admission]") {
  auto cdn_rule =
      egress_rule{.name = "cdn", .host = "*.cdn.example", .methods = {"GET"}, .paths = {"/img/"}};
  auto s = ruled_spec({rates_read(), cdn_rule});
  s.isolation = sandbox::isolation::container;
  const auto t = *ticket_issuer{}.issue(s, sandbox::network_grant{});
  sandbox::host_catalog catalog;
  catalog.runtimes["python3"] = digest_a;
  catalog.levels = {sandbox::isolation::container};
  sandbox::run_request req{.runtime = "python3", .source = "print(1)"};
  req.network = true;
  req.egress = {"api.example.com"};
  auto v = sandbox::admit(req, t, sandbox::policy{}, catalog, noon);
  REQUIRE(std::holds_alternative<sandbox::admitted>(v));
  CHECK(std::get<sandbox::admitted>(v).egress_rules == std::vector<egress_rule>{rates_read()});
  req.egress = {"img.cdn.example", "api.example.com"};
  v = sandbox::admit(req, t, sandbox::policy{}, catalog, noon);
  REQUIRE(std::holds_alternative<sandbox::admitted>(v));
  CHECK(std::get<sandbox::admitted>(v).egress_rules ==
        std::vector<egress_rule>{rates_read(), cdn_rule});
  // No network: no rules.
  req.network = false;
  req.egress.clear();
  v = sandbox::admit(req, t, sandbox::policy{}, catalog, noon);
  REQUIRE(std::holds_alternative<sandbox::admitted>(v));
  CHECK(std::get<sandbox::admitted>(v).egress_rules.empty());
}
