// Network off: nothing leaves the run's loopback-only namespace, and every attempt is
// evidence in `egress_attempts` and the `network_disabled` code.
#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <string>

#include "integration/harness.hpp"

using sandbox::code;
using namespace std::chrono_literals;

namespace {
bool has_attempt(const sandbox::run_result& r, const std::string& protocol,
                 const std::string& host_or_addr, std::uint16_t port) {
  for (const auto& a : r.egress_attempts) {
    if (a.protocol == protocol && (a.host == host_or_addr || a.address == host_or_addr) &&
        a.port == port && !a.allowed) {
      return true;
    }
  }
  return false;
}
}  // namespace

TEST_CASE("network: urllib to a name fails at DNS, and the lookup is reported", "[network]") {
  // The lookup fails at once, never after the 3 s timeout the program gives: timed by the
  // program around the call only (the run's wall time also holds start-up, which a loaded
  // host or a TCG guest stretches past 3 s).
  auto r = itest::run(R"PY(
import sys, time, urllib.request
t0 = time.monotonic()
try:
    urllib.request.urlopen('http://example.com/rates', timeout=3)
    print('FETCHED')
except Exception as e:
    print(type(e).__name__)
print(time.monotonic() - t0, file=sys.stderr)
)PY");
  CHECK(r.code == code::network_disabled);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary == "URLError\n");
  CHECK(has_attempt(r, "dns", "example.com", 53));
  INFO("stderr: " << r.std_err.summary);
  CHECK(std::stod(r.std_err.summary) < 3.0);
}

TEST_CASE("network: direct TCP and UDP to addresses are refused and reported", "[network]") {
  auto r = itest::run(R"PY(
import socket, errno
out = []
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.connect(('1.1.1.1', 80)); out.append('CONNECTED')
except OSError as e: out.append(errno.errorcode[e.errno])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b'x', ('8.8.8.8', 53)); out.append('SENT')
except OSError as e: out.append(errno.errorcode[e.errno])
m = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    m.connect(('169.254.169.254', 80)); out.append('METADATA')
except OSError as e: out.append(errno.errorcode[e.errno])
s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
try:
    s6.connect(('2606:4700:4700::1111', 443)); out.append('CONNECTED6')
except OSError as e: out.append(errno.errorcode[e.errno])
print(' '.join(out))
)PY");
  CHECK(r.code == code::network_disabled);
  CHECK(r.std_out.summary == "ENETUNREACH ENETUNREACH ENETUNREACH ENETUNREACH\n");
  CHECK(has_attempt(r, "tcp", "1.1.1.1", 80));
  CHECK(has_attempt(r, "udp", "8.8.8.8", 53));
  CHECK(has_attempt(r, "tcp", "169.254.169.254", 80));
  CHECK(has_attempt(r, "tcp", "2606:4700:4700::1111", 443));
}

TEST_CASE("network: loopback inside the run works and is not egress", "[network]") {
  auto r = itest::run(R"PY(
import socket, threading
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)
port = srv.getsockname()[1]
def serve():
    c, _ = srv.accept(); c.sendall(c.recv(10).upper()); c.close()
t = threading.Thread(target=serve); t.start()
cl = socket.create_connection(('127.0.0.1', port)); cl.sendall(b'ping')
print(cl.recv(10).decode()); t.join()
)PY");
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "PING\n");
  CHECK(r.egress_attempts.empty());
}

TEST_CASE("network: node fetch/dns are refused and reported", "[network][node]") {
  auto r = itest::run(R"JS(
const dns = require('dns');
dns.lookup('api.freight.example', (err) => { console.log(err ? err.code : 'RESOLVED'); });
)JS",
                      {}, "node");
  CHECK(r.code == code::network_disabled);
  CHECK(r.std_out.summary.find("RESOLVED") == std::string::npos);
  CHECK(has_attempt(r, "dns", "api.freight.example", 53));
}

TEST_CASE(
    "network: a lingering socket left in the host's hands cannot stall the host or the deadline",
    "[network][timeout]") {
  // To record an egress attempt's protocol the host reads the socket's type through a copy
  // of it. tests/helpers/linger_race.c drops its own references at that moment, so the copy
  // is the last, on a socket set to linger for 10^6 s with unsent data: its close blocks. It
  // must block no thread that serves runs: the deadline still ends the run, and every later
  // notification is still answered (the program's probe says "stalled" otherwise).
  std::ifstream in(SANDBOX_LINGER_RACE_PATH, std::ios::binary);
  REQUIRE(in);
  const std::string binary((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string id = itest::put(binary);
  sandbox::run_request req{.runtime = "python3", .source = R"PY(
import os, shutil
shutil.copy(os.path.join(os.environ['SANDBOX_INPUT_DIR'], 'race'), '/tmp/race')
os.chmod('/tmp/race', 0o755)
os.execv('/tmp/race', ['/tmp/race'])
)PY"};
  req.files_in = {{.name = "race", .blob = id}};
  // 2 s of racing after a start-up that a loaded host stretches (calibrated: a fixed 2 s
  // once ended before the program had printed anything).
  req.timeout = 2000ms + itest::startup_allowance();
  int hits = 0;
  for (int attempt = 0; attempt < 3 && hits == 0; ++attempt) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = itest::run(req, itest::ticket("itest", req.timeout + 1s));
    const auto wall = std::chrono::steady_clock::now() - t0;
    const std::string out = itest::blob(r.std_out.blob);
    INFO("stdout tail: " << out.substr(out.size() > 300 ? out.size() - 300 : 0));
    CHECK(r.code == code::timeout);
    CHECK(wall <
          req.timeout + 4s);  // the deadline, kill and teardown; a stalled host never returns
    CHECK(out.find("stalled") == std::string::npos);
    // It kept racing (every attempt's probe answered within 1 s): 10 attempts at least (a
    // loaded host ran fewer than 50 in 2 s, with hits among them).
    CHECK(out.find("attempts 10") != std::string::npos);
    for (std::size_t p = out.find("hit\n"); p != std::string::npos; p = out.find("hit\n", p + 1))
      ++hits;
    CHECK(has_attempt(r, "tcp", "192.0.2.1", 80));
  }
  // Not vacuous: the host was left holding the lingering socket at least once.
  CHECK(hits > 0);
}
