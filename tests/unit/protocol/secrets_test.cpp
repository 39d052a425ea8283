// Host-held secrets in the pure core (sandbox/secrets.hpp): names and their placeholders'
// variables, definitions, the configuration's `secrets` section, tickets granting them,
// admission (unknown and ungranted names refused, naming them), the approval request showing
// where each would go, and derived tickets that can only narrow them.
#include "sandbox/secrets.hpp"

#include <catch2/catch.hpp>
#include <string>
#include <variant>

#include "sandbox/admission.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/json.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/ticket.hpp"

using namespace std::chrono_literals;
using sandbox::code;
using sandbox::secret_definition;

namespace {

const std::string digest = "sha256:" + std::string(64, 'a');
const auto noon = std::chrono::sys_days{std::chrono::year{2026} / 12 / 1} + 12h;

secret_definition rates_def() {
  return {.file = "/etc/agent-sandbox/secrets/rates-api",
          .domains = {"api.rates.example"},
          .header = "Authorization: Bearer {value}"};
}

sandbox::host_catalog catalog() {
  return {
      .levels = {sandbox::isolation::process, sandbox::isolation::container},
      .runtimes = {{"python3", digest}},
      .tools = {},
      .secrets = {
          {"rates-api", rates_def()},
          {"mail", {.file = "/s/mail", .domains = {"mail.example"}, .header = "X-Key: {value}"}}}};
}

sandbox::ticket ticket(std::vector<std::string> secrets, bool network = true) {
  sandbox::ticket_spec s{.id = "t-1", .tenant = "acme"};
  s.secrets = std::move(secrets);
  if (!network) return sandbox::ticket_issuer{}.issue(s).value();
  s.egress = {"api.rates.example", "other.example"};
  return sandbox::ticket_issuer{}.issue(s, sandbox::network_grant{}).value();
}

sandbox::run_request net_request(std::vector<std::string> secrets) {
  return {.runtime = "python3",
          .source = "print(1)",
          .network = true,
          .egress = {"api.rates.example"},
          .secrets = std::move(secrets)};
}

sandbox::rejection refused(const std::variant<sandbox::admitted, sandbox::rejection>& v) {
  REQUIRE(std::holds_alternative<sandbox::rejection>(v));
  return std::get<sandbox::rejection>(v);
}

sandbox::approval_request approval_for(const sandbox::run_request& r) {
  sandbox::approval_request q;
  q.ticket_id = "t-1";
  q.tenant = "acme";
  q.domains = r.egress;
  q.timeout = r.timeout;
  q.memory_limit_bytes = r.memory_limit_bytes;
  q.source_sha256 = sandbox::blob_id_of(r.source).substr(7);
  q.source_bytes = r.source.size();
  q.runtime = {"python3", digest};
  q.secrets = {{.name = "rates-api", .domains = {"api.rates.example"}, .header = "Authorization"},
               {.name = "mail", .domains = {"mail.example"}, .header = "X-Key"}};
  return q;
}

}  // namespace

TEST_CASE("secrets: names and the placeholders' variable names", "[secrets]") {
  for (const char* ok : {"rates-api", "a", "k9", "abc-def-0"}) {
    CAPTURE(ok);
    CHECK(sandbox::is_valid_secret_name(ok));
  }
  for (std::string bad : {"", "Rates", "9lives", "-x", "x-", "a_b", "a.b", "a b", "a/b"}) {
    CAPTURE(bad);
    CHECK(!sandbox::is_valid_secret_name(bad));
  }
  CHECK(sandbox::is_valid_secret_name(std::string(64, 'a')));
  CHECK(!sandbox::is_valid_secret_name(std::string(65, 'a')));
  CHECK(sandbox::secret_env_name("rates-api") == "SANDBOX_SECRET_RATES_API");
  CHECK(sandbox::secret_env_name("k9") == "SANDBOX_SECRET_K9");
}

TEST_CASE("secrets: a definition names a file, its domains and one header template", "[secrets]") {
  auto d = rates_def();
  d.domains = {"API.Rates.Example.", "api.rates.example", "*.cdn.example"};
  CHECK(!sandbox::check_secret_definition(d));
  CHECK(d.domains == std::vector<std::string>{"api.rates.example", "*.cdn.example"});
  CHECK(sandbox::secret_header_name(d) == "Authorization");
  auto problem = [](secret_definition d) {
    auto p = sandbox::check_secret_definition(d);
    return p.value_or("(accepted)");
  };
  auto with = [](auto f) {
    auto d = rates_def();
    f(d);
    return d;
  };
  CHECK(problem(with([](auto& d) { d.file = "secrets/rates"; })) ==
        "file: must be an absolute path (the value is never inline)");
  CHECK(problem(with([](auto& d) { d.file = ""; })).starts_with("file:"));
  CHECK(problem(with([](auto& d) { d.domains = {}; })) == "domains: must name at least one domain");
  CHECK(problem(with([](auto& d) { d.domains = {"10.0.0.1"}; })).starts_with("domains[0]:"));
  CHECK(problem(with([](auto& d) { d.header = "Authorization: Bearer"; })) ==
        "header: the template must hold '{value}' exactly once");
  CHECK(problem(with([](auto& d) { d.header = "A: {value}{value}"; })) ==
        "header: the template must hold '{value}' exactly once");
  CHECK(problem(with([](auto& d) { d.header = "{value}"; })).starts_with("header: expected"));
  CHECK(problem(with([](auto& d) { d.header = ": {value}"; })).starts_with("header: expected"));
  CHECK(problem(with([](auto& d) { d.header = "Bad Name: {value}"; })) ==
        "header: the name before ':' must be an HTTP field name (RFC 9110 token)");
  CHECK(problem(with([](auto& d) { d.header = "X: {value}\r\nX-Evil: 1"; })) ==
        "header: only printable ASCII (no line breaks)");
  CHECK(problem(with([](auto& d) {
          d.header = "X: " + std::string(300, 'a') + "{value}";
        })).starts_with("header: longer than"));
}

TEST_CASE("secrets: the configuration's section is strict and never takes a value",
          "[secrets][config]") {
  sandbox::runtime_options o;
  auto ok = sandbox::apply_config(
      R"({"v":1,"secrets":{"rates-api":{"file":"/etc/s/rates","domains":["API.rates.example"],)"
      R"("header":"Authorization: Bearer {value}"}}})",
      o);
  REQUIRE(ok.has_value());
  REQUIRE(o.secrets.size() == 1);
  CHECK(o.secrets.at("rates-api") == secret_definition{.file = "/etc/s/rates",
                                                       .domains = {"api.rates.example"},
                                                       .header = "Authorization: Bearer {value}"});
  auto message = [](const std::string& section) {
    sandbox::runtime_options o;
    o.secrets = {{"kept", rates_def()}};
    auto r = sandbox::apply_config(R"({"v":1,"secrets":)" + section + "}", o);
    REQUIRE(!r.has_value());
    CHECK(r.error().code == code::invalid_request);
    CHECK(o.secrets.contains("kept"));  // nothing applied
    return r.error().message;
  };
  const std::string good_rest = R"("domains":["a.example"],"header":"X-Key: {value}")";
  CHECK(message(R"({"k":{"value":"sk-inline-123","file":"/f",)" + good_rest + "}}")
            .starts_with("secrets['k'].value: a secret's value is never inline"));
  CHECK(message(R"({"k":{"file":"/f","extra":1,)" + good_rest + "}}").find("extra") !=
        std::string::npos);
  CHECK(message(R"({"Bad_Name":{"file":"/f",)" + good_rest + "}}")
            .starts_with("secrets['Bad_Name']: not a secret name"));
  CHECK(message(R"({"k":{"file":"rel",)" + good_rest + "}}") ==
        "secrets['k'].file: must be an absolute path (the value is never inline)");
  CHECK(message(R"({"k":{"file":"/f","domains":["a.example"]}})").find("header") !=
        std::string::npos);
  CHECK(message(R"({"k":{"file":"/f","domains":["a.example"],"header":"X: no mark"}})") ==
        "secrets['k'].header: the template must hold '{value}' exactly once");
  CHECK(message(R"([])").starts_with("secrets:"));
}

TEST_CASE("secrets: tickets grant them by name, in their JSON form too", "[secrets][ticket]") {
  const auto t = ticket({"rates-api", "mail", "rates-api"});
  CHECK(t.secrets() == std::vector<std::string>{"rates-api", "mail"});
  CHECK(t.allows_secret("mail"));
  CHECK(!t.allows_secret("other"));
  const auto back = sandbox::ticket_issuer{}.decode(sandbox::encode(t));
  REQUIRE(back.has_value());
  CHECK(*back == t);
  CHECK(sandbox::encode(t).find(R"("secrets":["rates-api","mail"])") != std::string::npos);
  // A ticket without network may still hold them (an approval may later add the network).
  CHECK(ticket({"mail"}, false).secrets() == std::vector<std::string>{"mail"});
  sandbox::ticket_spec bad{.id = "t", .tenant = "a"};
  bad.secrets = {"Not_A_Name"};
  CHECK(!sandbox::ticket_issuer{}.issue(bad).has_value());
  bad.secrets.clear();
  for (int i = 0; i <= 16; ++i) bad.secrets.push_back("s" + std::to_string(i));
  CHECK(!sandbox::ticket_issuer{}.issue(bad).has_value());
  auto decoded = sandbox::ticket_issuer{}.decode(
      R"({"v":1,"id":"t","tenant":"a","actions":["code.execute"],"isolation":"process",)"
      R"("max_timeout_ms":1000,"max_memory_bytes":1048576,"secrets":["x_y"]})");
  REQUIRE(!decoded.has_value());
  CHECK(decoded.error().message.starts_with("secrets[0]: not a secret name"));
  decoded = sandbox::ticket_issuer{}.decode(
      R"({"v":1,"id":"t","tenant":"a","actions":["code.execute"],"isolation":"process",)"
      R"("max_timeout_ms":1000,"max_memory_bytes":1048576,"secrets":[]})");
  REQUIRE(!decoded.has_value());
  CHECK(decoded.error().message == "secrets: must not be empty (leave it out)");
}

TEST_CASE("secrets: admission needs each name granted and defined, and the network",
          "[secrets][admission]") {
  const sandbox::policy p;
  const auto t = ticket({"rates-api", "ghost"});
  auto admitted = sandbox::admit(net_request({"rates-api"}), t, p, catalog(), noon);
  REQUIRE(std::holds_alternative<sandbox::admitted>(admitted));
  CHECK(std::get<sandbox::admitted>(admitted).request.secrets ==
        std::vector<std::string>{"rates-api"});
  auto r = refused(sandbox::admit(net_request({"mail"}), t, p, catalog(), noon));
  CHECK(r.code == code::action_denied);
  CHECK(r.message == "secrets: the ticket does not grant the secret 'mail'");
  r = refused(sandbox::admit(net_request({"ghost"}), t, p, catalog(), noon));
  CHECK(r.code == code::action_denied);
  CHECK(r.message == "secrets: no secret 'ghost' on this host");
  auto no_net = net_request({"rates-api"});
  no_net.network = false;
  no_net.egress.clear();
  r = refused(sandbox::admit(no_net, t, p, catalog(), noon));
  CHECK(r.code == code::invalid_request);
  CHECK(r.message == "secrets: only a request with network may use secrets");
  r = refused(sandbox::admit(net_request({"rates-api", "rates-api"}), t, p, catalog(), noon));
  CHECK(r.message == "secrets[1]: duplicate 'rates-api'");
  r = refused(sandbox::admit(net_request({"RATES"}), t, p, catalog(), noon));
  CHECK(r.code == code::invalid_request);
  CHECK(r.message.starts_with("secrets[0]: not a secret name"));
  auto tool = sandbox::run_request{.secrets = {"rates-api"}, .tool = "fetch"};
  r = refused(sandbox::admit(tool, t, p, catalog(), noon));
  CHECK(r.message == "secrets: a tool run takes no secrets");
  // Pending approval: the parent must grant them already (an approval never adds one).
  const auto parent = ticket({"rates-api"}, false);
  CHECK(std::holds_alternative<sandbox::admitted>(
      sandbox::admit_pending_approval(net_request({"rates-api"}), parent, p, catalog(), noon)));
  r = refused(sandbox::admit_pending_approval(net_request({"mail"}), parent, p, catalog(), noon));
  CHECK(r.message == "secrets: the ticket does not grant the secret 'mail'");
}

TEST_CASE("secrets: the run request carries the names on the wire", "[secrets][json]") {
  const auto r = net_request({"rates-api"});
  const auto text = sandbox::encode(r);
  CHECK(text.find(R"("secrets":["rates-api"])") != std::string::npos);
  const auto back = sandbox::decode_run_request(text);
  REQUIRE(back.has_value());
  CHECK(*back == r);
  std::string many = R"({"v":1,"runtime":"python3","source":"","secrets":[)";
  for (int i = 0; i < 100; ++i) many += std::string(i ? "," : "") + "\"s\"";
  const auto refused_many = sandbox::decode_run_request(many + "]}");
  REQUIRE(!refused_many.has_value());
  CHECK(refused_many.error().message.starts_with("secrets: 100 names"));
  const auto wrong = sandbox::decode_run_request(
      R"({"v":1,"runtime":"python3","source":"","secrets":"rates-api"})");
  REQUIRE(!wrong.has_value());
  CHECK(wrong.error().message.starts_with("secrets:"));
}

TEST_CASE("secrets: the approval shows names and destinations; derived tickets only narrow",
          "[secrets][approval]") {
  const sandbox::ticket_issuer issuer;
  const auto parent = ticket({"rates-api", "mail"}, false);
  const auto r = net_request({"rates-api", "mail"});
  const auto q = approval_for(r);
  // The approval page round-trips with its secrets, and holds no value.
  const auto text = sandbox::encode(q);
  CHECK(text.find(R"("secrets":[{"name":"rates-api","domains":["api.rates.example"],)"
                  R"("header":"Authorization"})") != std::string::npos);
  const auto back = sandbox::decode_approval_request(text);
  REQUIRE(back.has_value());
  CHECK(*back == q);
  for (const char* bad : {R"("name":"BAD","domains":["a.example"],"header":"X")",
                          R"("name":"a","domains":[],"header":"X")",
                          R"("name":"a","domains":["A.example"],"header":"X")",
                          R"("name":"a","domains":["a.example"],"header":"X: y")",
                          R"("name":"a","domains":["a.example"],"header":"X","value":"v")"}) {
    CAPTURE(bad);
    auto doc = text;
    const auto at = doc.find(R"("secrets":[)") + 11;
    doc.insert(at, std::string("{") + bad + "},");
    CHECK(!sandbox::decode_approval_request(doc).has_value());
  }

  // Default: every secret the approval shows.
  const auto all = issuer.derive(parent, q, {.now = noon});
  REQUIRE(all.has_value());
  CHECK(all->secrets() == std::vector<std::string>{"rates-api", "mail"});
  CHECK(std::holds_alternative<sandbox::admitted>(
      sandbox::admit(r, *all, sandbox::policy{}, catalog(), noon)));
  // Narrowed: only rates-api. The request naming mail is refused, naming it.
  const auto narrow =
      issuer.derive(parent, q, {.now = noon, .secrets = std::vector<std::string>{"rates-api"}});
  REQUIRE(narrow.has_value());
  CHECK(narrow->secrets() == std::vector<std::string>{"rates-api"});
  CHECK(!sandbox::check_derivation(parent, *narrow, noon));
  CHECK(refused(sandbox::admit(r, *narrow, sandbox::policy{}, catalog(), noon)).message ==
        "secrets: the ticket does not grant the secret 'mail'");
  CHECK(std::holds_alternative<sandbox::admitted>(
      sandbox::admit(net_request({"rates-api"}), *narrow, sandbox::policy{}, catalog(), noon)));
  // No secret at all.
  const auto none = issuer.derive(parent, q, {.now = noon, .secrets = std::vector<std::string>{}});
  REQUIRE(none.has_value());
  CHECK(none->secrets().empty());
  // Never broader: a name the approval does not show, or one the parent never granted.
  CHECK(!issuer.derive(parent, q, {.now = noon, .secrets = std::vector<std::string>{"other"}})
             .has_value());
  const auto stingy = ticket({"rates-api"}, false);
  CHECK(!issuer.derive(stingy, q, {.now = noon}).has_value());
  CHECK(sandbox::check_derivation(stingy, *all, noon) ==
        std::optional<std::string>("secrets: 'mail' is not granted by the parent"));
  // An approved ticket admits only the secrets its approval showed.
  auto q_one = q;
  q_one.secrets.pop_back();
  const auto d_one = issuer.derive(parent, q_one, {.now = noon});
  REQUIRE(d_one.has_value());
  CHECK(refused(sandbox::admit(r, *d_one, sandbox::policy{}, catalog(), noon)).code ==
        code::action_denied);
}
