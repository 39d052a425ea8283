// Registered tools with their own egress (sandbox/registry.hpp, `tool_entry::egress`): the
// host's registry, not the ticket, decides that a tool may reach a name. Its one-shot runs and
// its sessions are network runs at container or stronger, through the run's egress proxy,
// reaching only the entry's names; the ticket needs only `tool.run`, and a request cannot add
// a network of its own. Proved against the suite's real origins (suite.hpp, `egress_origin`):
// their own counters say what got through, not the tool's word. The tool is the suite's
// "fetch" entry (backends.cpp): the URLs it fetches are model bytes on its stdin.
#include <fmt/format.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <string>

#include "conformance/suite.hpp"

using nlohmann::json;
using sandbox::code;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

/// A ticket granting tool.run for `tools` at the process level only, and no code.network:
/// whatever network the run gets is the registry entry's.
sandbox::ticket tool_only_ticket(std::vector<std::string> tools = {conformance::egress_tool_name}) {
  return sandbox::ticket_issuer{}
      .issue({.id = "conformance-tool-egress",
              .tenant = "conformance",
              .execute = false,
              .isolation = sandbox::isolation::process,
              .max_timeout = 8000ms,
              .max_memory_bytes = 1ULL << 30,
              .tools = std::move(tools)})
      .value();
}

/// What the origins have seen so far, not counting the /stats requests that ask.
struct origin_counts {
  int http_connections = -1, https_connections = -1, https_requests = -1;
  bool operator==(const origin_counts&) const = default;
};
origin_counts origin_seen() {
  static int asked = 0;  // our own /stats connections (each counts itself)
  auto j = json::parse(conformance::egress_origin().stats(), nullptr, false);
  ++asked;
  if (!j.is_object()) return {};
  return {j["http"]["connections"].get<int>() - asked, j["https"]["connections"].get<int>(),
          j["https"]["requests"].get<int>()};
}

/// Skips (laptop) or fails (CI) when the origins could not start; true when they run.
bool origins_ready() {
  const auto& o = conformance::egress_origin();
  if (o.ok) return true;
  if (conformance::must_work()) FAIL("egress origins unavailable: " << o.why);
  WARN("egress origins unavailable, case skipped: " << o.why);
  return false;
}

std::string url(bool https, const char* host, const std::string& path) {
  const auto& o = conformance::egress_origin();
  return fmt::format("{}://{}:{}{}", https ? "https" : "http", host,
                     https ? o.https_port : o.http_port, path);
}

/// The tool's report lines (one JSON object per input line), by input line.
std::map<std::string, json> reports_of(const std::string& out) {
  std::map<std::string, json> m;
  std::size_t start = 0;
  while (start < out.size()) {
    auto nl = out.find('\n', start);
    if (nl == std::string::npos) nl = out.size();
    auto j = json::parse(out.substr(start, nl - start), nullptr, false);
    if (j.is_object() && j.contains("in")) m[j["in"].get<std::string>()] = j;
    start = nl + 1;
  }
  return m;
}

std::string attempts_text(const std::vector<sandbox::egress_attempt>& attempts) {
  std::string out;
  for (const auto& a : attempts) {
    out +=
        fmt::format("{} host={} addr={} port={} allowed={} reason='{}' up={} down={}\n", a.protocol,
                    a.host, a.address, a.port, a.allowed, a.reason, a.bytes_up, a.bytes_down);
  }
  return out;
}

/// Checks the attempts of a run of the fetch tool: the approved name `allowed` times, allowed
/// with bytes both ways; every other attempt refused, and the unapproved name among them with
/// the proxy's reason and no byte carried.
void check_attempts(const std::vector<sandbox::egress_attempt>& attempts, int allowed) {
  int seen_allowed = 0;
  bool other_refused = false;
  for (const auto& a : attempts) {
    if (a.allowed) {
      ++seen_allowed;
      CHECK(a.host == conformance::egress_approved_name);
      CHECK(a.address == "127.0.0.1");
      CHECK(a.bytes_up > 0);
      CHECK(a.bytes_down > 0);
    } else if (a.host == conformance::egress_other_name) {
      other_refused = true;
      CHECK(a.reason == "domain not approved");
      CHECK(a.bytes_up == 0);
      CHECK(a.bytes_down == 0);
    }
  }
  CHECK(seen_allowed == allowed);
  CHECK(other_refused);
}

}  // namespace

TEST_CASE("tool egress: an entry's own egress reaches its name through the proxy, nothing else",
          "[tools][egress][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  const auto& o = conformance::egress_origin();
  const std::string approved_https = url(true, conformance::egress_approved_name, "/rates");
  const std::string approved_http = url(false, conformance::egress_approved_name, "/echo");
  const std::string other_https = url(true, conformance::egress_other_name, "/rates");
  const std::string other_http = url(false, conformance::egress_other_name, "/rates");
  const std::string direct_loopback = fmt::format("direct 127.0.0.1:{}", o.https_port);
  const std::string direct_public = "direct 93.184.216.34:443";
  const std::string input = approved_https + "\n" + approved_http + "\n" + other_https + "\n" +
                            other_http + "\n" + direct_loopback + "\n" + direct_public + "\n";
  const auto before = origin_seen();
  sandbox::run_request req{
      .timeout = 8000ms, .tool = conformance::egress_tool_name, .std_in = input};
  req.files_in = {{.name = "ca.pem", .blob = b.put(o.ca_pem)}};
  auto r = b.rt().run(req, tool_only_ticket());
  INFO("result: code=" << to_string(r.code) << " message=" << r.message << "\nstdout: "
                       << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                       << attempts_text(r.egress_attempts));
  if (!b.expect().egress_proxy) {
    // No proxy at this level and no stronger one registered: the entry's runs have no weaker
    // level to fall back to; nothing ran, nothing reached an origin.
    CHECK(r.code == code::runtime_unavailable);
    // The refusal names the isolation (admission: no level with a proxy) or the level.
    CHECK((r.message.find("isolation") != std::string::npos ||
           r.message.find(std::string(to_string(b.profile().level))) != std::string::npos));
    CHECK(r.std_out.summary.empty());
    CHECK(r.egress_attempts.empty());
    CHECK(origin_seen() == before);
    return;
  }
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 0);
  // The entry and the ticket both say process; the entry's egress lifts the run.
  CHECK(sandbox::is_at_least(r.isolation, sandbox::isolation::container));
  CHECK(r.isolation == b.profile().level);
  CHECK(r.runtime.name == conformance::egress_tool_name);
  auto rep = reports_of(b.blob(r.std_out.blob));
  REQUIRE(rep.size() == 6);
  // Through the proxy the environment names.
  CHECK_FALSE(rep[approved_https]["proxy"].get<std::string>().empty());
  CHECK(rep[approved_https]["status"] == 200);
  CHECK(rep[approved_https]["body"].get<std::string>().find("\"per_kg\": 1.75") !=
        std::string::npos);
  CHECK(rep[approved_http]["status"] == 200);
  auto echo = json::parse(rep[approved_http]["body"].get<std::string>(), nullptr, false);
  CHECK(echo["path"] == "/echo");
  // Another name: refused by the proxy, with its reason (HTTPS: the tunnel's 403).
  CHECK(rep[other_http]["status"] == 403);
  CHECK(rep[other_http]["body"].get<std::string>().find("domain not approved") !=
        std::string::npos);
  CHECK(rep[other_https]["status"] == 0);
  CHECK(rep[other_https]["body"].get<std::string>().find("403") != std::string::npos);
  // Straight out, past the proxy: no connection.
  CHECK(rep[direct_loopback]["status"] == 0);
  CHECK(rep[direct_public]["status"] == 0);
  // The origins saw exactly the two approved fetches: one HTTPS request on one connection,
  // one plain HTTP connection; nothing of the other name or the direct attempts.
  const auto after = origin_seen();
  CHECK(after.https_connections == before.https_connections + 1);
  CHECK(after.https_requests == before.https_requests + 1);
  CHECK(after.http_connections == before.http_connections + 1);
  check_attempts(r.egress_attempts, 2);
}

TEST_CASE("tool egress: the ticket needs only tool.run; a request adds no network of its own",
          "[tools][egress][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  const auto before = origin_seen();
  const std::string other_http = url(false, conformance::egress_other_name, "/rates") + "\n";
  const auto tool_ticket = tool_only_ticket();
  // `network` or `egress` on a tool run: invalid, whatever the ticket grants.
  const auto network_ticket = sandbox::ticket_issuer{}
                                  .issue({.id = "conformance-tool-egress-net",
                                          .tenant = "conformance",
                                          .execute = true,
                                          .isolation = b.profile().level,
                                          .max_timeout = 8000ms,
                                          .max_memory_bytes = 1ULL << 30,
                                          .egress = {conformance::egress_other_name},
                                          .tools = {"*"}},
                                         sandbox::network_grant{})
                                  .value();
  sandbox::run_request with_network{.tool = conformance::egress_tool_name, .std_in = other_http};
  with_network.network = true;
  with_network.egress = {conformance::egress_other_name};
  for (const auto* t : {&network_ticket, &tool_ticket}) {
    auto r = b.rt().run(with_network, *t);
    INFO("message: " << r.message);
    CHECK(r.code == code::invalid_request);
    CHECK(r.message.rfind("network:", 0) == 0);
  }
  sandbox::run_request with_egress{.tool = conformance::egress_tool_name, .std_in = other_http};
  with_egress.egress = {conformance::egress_other_name};
  for (const auto* t : {&network_ticket, &tool_ticket}) {
    auto r = b.rt().run(with_egress, *t);
    INFO("message: " << r.message);
    CHECK(r.code == code::invalid_request);
    CHECK(r.message.rfind("egress:", 0) == 0);
  }
  // A ticket granting other tools only does not run this one.
  auto denied = b.rt().run({.tool = conformance::egress_tool_name, .std_in = other_http},
                           tool_only_ticket({"markdown", "cat"}));
  INFO("message: " << denied.message);
  CHECK(denied.code == code::action_denied);
  CHECK(denied.message.find("tool.run") != std::string::npos);
  // Nothing of it reached an origin.
  CHECK(origin_seen() == before);
}

TEST_CASE("tool egress: a session of the entry fetches its name; another is refused",
          "[tools][egress][session][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  const auto before = origin_seen();
  auto st = b.rt()
                .async_open_session({.tool = conformance::egress_tool_name}, tool_only_ticket(),
                                    asio::use_future)
                .get();
  INFO("open: code=" << to_string(st.code) << " message=" << st.message);
  if (!b.expect().egress_proxy) {
    CHECK(st.code == code::runtime_unavailable);
    // The refusal names the isolation (admission: no level with a proxy) or the level.
    CHECK((st.message.find("isolation") != std::string::npos ||
           st.message.find(std::string(to_string(b.profile().level))) != std::string::npos));
    CHECK_FALSE(st.session);
    CHECK(origin_seen() == before);
    return;
  }
  REQUIRE(st.code == code::ok);
  REQUIRE(st.session);
  auto& s = *st.session;
  std::string pending;
  // One request line, one report line back.
  auto ask = [&](const std::string& line) {
    const std::string data = line + "\n";
    auto n = s.async_write(asio::buffer(data), asio::use_future).get();
    REQUIRE(n == data.size());
    std::vector<char> buf(8192);
    while (pending.find('\n') == std::string::npos) {
      std::promise<std::pair<boost::system::error_code, std::size_t>> p;
      s.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t got) {
        p.set_value({ec, got});
      });
      auto [ec, got] = p.get_future().get();
      pending.append(buf.data(), got);
      if (ec) break;
    }
    const auto nl = pending.find('\n');
    auto j = json::parse(pending.substr(0, nl), nullptr, false);
    pending.erase(0, nl == std::string::npos ? pending.size() : nl + 1);
    INFO("report: " << j.dump());
    REQUIRE(j.is_object());
    CHECK(j["in"] == line);
    return j;
  };
  const auto approved = ask(url(false, conformance::egress_approved_name, "/echo"));
  CHECK(approved["status"] == 200);
  CHECK_FALSE(approved["proxy"].get<std::string>().empty());
  const auto other = ask(url(false, conformance::egress_other_name, "/rates"));
  CHECK(other["status"] == 403);
  CHECK(other["body"].get<std::string>().find("domain not approved") != std::string::npos);
  const auto direct = ask("direct 93.184.216.34:443");
  CHECK(direct["status"] == 0);
  // The same session, asked again: the approved name still works (the proxy lives with it).
  // Another path, so the attempt differs in its bytes (identical attempts are listed once
  // and only counted in `egress_attempts_dropped`).
  const auto again = ask(url(false, conformance::egress_approved_name, "/rates"));
  CHECK(again["status"] == 200);
  auto res = st.session->async_close(asio::use_future).get();
  INFO("session: end=" << to_string(res.end) << " code=" << to_string(res.result.code)
                       << " message=" << res.result.message << "\nattempts:\n"
                       << attempts_text(res.result.egress_attempts));
  CHECK(
      (res.end == sandbox::session_end::closed || res.end == sandbox::session_end::server_exited));
  CHECK(sandbox::is_at_least(res.result.isolation, sandbox::isolation::container));
  check_attempts(res.result.egress_attempts, 2);
  // The origins saw the two approved fetches and nothing else.
  const auto after = origin_seen();
  CHECK(after.http_connections == before.http_connections + 2);
  CHECK(after.https_connections == before.https_connections);
  st.session.reset();
}
