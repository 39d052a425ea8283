// Network runs at the microvm level: no NIC in the guest, ever; the program's HTTP(S)_PROXY
// is a listener of the guest agent on the run's loopback, tunnelled over the "sandbox.net"
// virtio-serial port to the host's egress proxy (wire/guest_protocol.hpp, "The egress
// tunnel"). The hostile parts run inside the guest and the test asserts what they could not
// do; the origin is the harness's server on the host's loopback, reachable only through the
// proxy by its pinned names.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "integration/microvm/microvm_harness.hpp"

using sandbox::code;

namespace {

const sandbox::egress_attempt* find_attempt(const sandbox::run_result& r, std::string_view host,
                                            std::string_view reason) {
  for (const auto& a : r.egress_attempts) {
    if (a.host == host && a.reason == reason) return &a;
  }
  return nullptr;
}

// The host process's resident memory (VmRSS, KiB).
std::uint64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

}  // namespace

TEST_CASE(
    "microvm: a network run reaches its approved name through the egress tunnel; other "
    "names and direct IPs are refused and recorded; the guest has no NIC",
    "[microvm][network]") {
  REQUIRE(mvtest::origin_port() != 0);
  const auto src = fmt::format(R"PY(
import functools, os, socket, urllib.request, urllib.error
print = functools.partial(print, flush=True)
port = {port}
print('proxy', os.environ.get('HTTP_PROXY'), os.environ.get('HTTPS_PROXY'))
print('ifaces', sorted(n for _, n in socket.if_nameindex()))
def get(url):
    try:
        with urllib.request.urlopen(url, timeout={io}) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except Exception as e:
        return 0, type(e).__name__
print('approved', *get('http://{approved}:%d/hello' % port))
print('other', get('http://{other}:%d/' % port)[0])
# A direct IP, through the proxy (the variables send it there).
s = socket.create_connection(('127.0.0.1', 3128), timeout={io})
s.sendall(b'GET http://93.184.216.34/ HTTP/1.1\r\nHost: 93.184.216.34\r\n\r\n')
print('directip', s.recv(100).split(b'\r\n')[0].decode())
s.close()
# Around the proxy: there is no route anywhere.
for target in [('93.184.216.34', 80), ('10.0.2.2', 80)]:
    try:
        socket.create_connection(target, timeout=5).close()
        print('direct connected', target)
    except OSError as e:
        print('direct refused', type(e).__name__)
try:
    socket.getaddrinfo('example.com', 80)
    print('dns resolved')
except OSError as e:
    print('dns refused')
)PY",
                               fmt::arg("port", mvtest::origin_port()),
                               fmt::arg("approved", mvtest::approved_name),
                               fmt::arg("other", mvtest::other_name),
                               // Each exchange's own bound: a third of the run's (calibrated,
                               // at least 20 s), so an exchange that hangs says which.
                               fmt::arg("io", mvtest::must_finish().count() / 3000));
  sandbox::run_request base;
  base.timeout = mvtest::must_finish();
  auto r = mvtest::run_network(src, base);
  REQUIRE(r.code == code::ok);
  const auto& out = r.std_out.summary;
  CHECK(out.find("proxy http://127.0.0.1:3128 http://127.0.0.1:3128") != std::string::npos);
  // Loopback only: no network device in the guest, and none in the run's namespace.
  CHECK(out.find("ifaces ['lo']") != std::string::npos);
  CHECK(out.find("approved 200 origin got 0 bytes for GET /hello") != std::string::npos);
  CHECK(out.find("other 403") != std::string::npos);
  CHECK(out.find("directip HTTP/1.1 403") != std::string::npos);
  CHECK(out.find("direct connected") == std::string::npos);
  CHECK(out.find("direct refused") != std::string::npos);
  CHECK(out.find("dns resolved") == std::string::npos);
  // The proxy's records, as at the other levels.
  auto ok = find_attempt(r, mvtest::approved_name, "approved");
  REQUIRE(ok != nullptr);
  CHECK(ok->allowed);
  CHECK(ok->protocol == "http");
  CHECK(ok->port == mvtest::origin_port());
  CHECK(ok->bytes_down > 0);
  auto other = find_attempt(r, mvtest::other_name, "domain not approved");
  REQUIRE(other != nullptr);
  CHECK_FALSE(other->allowed);
  auto ipl = find_attempt(r, "93.184.216.34", "direct IP not allowed");
  REQUIRE(ipl != nullptr);
  CHECK_FALSE(ipl->allowed);
}

TEST_CASE("microvm: a guest-side flood of tunnel connections and an upload stay within the caps",
          "[microvm][network]") {
  REQUIRE(mvtest::origin_port() != 0);
  const std::uint64_t before_bytes = mvtest::origin_bytes();
  const std::uint64_t rss_before = rss_kib();
  // 1. An 8 MiB upload (the proxy's per-run budget is 16 MiB), read whole by the origin.
  // 2. 100 connections to the proxy held open at once (the agent accepts 64 at a time, the
  //    proxy serves 32 per run), each asking for the approved name, then all read.
  const auto src = fmt::format(R"PY(
import socket, urllib.request
port = {port}
body = b'u' * (8 << 20)
req = urllib.request.Request('http://{approved}:%d/upload' % port, data=body, method='POST')
with urllib.request.urlopen(req, timeout=120) as r:
    print('upload', r.status, r.read().decode())
socks = []
for i in range(100):
    s = socket.socket()
    s.settimeout(60)
    s.connect(('127.0.0.1', 3128))
    socks.append(s)
for s in socks:
    try:
        s.sendall(b'GET http://{approved}:%d/c HTTP/1.1\r\nHost: {approved}:%d\r\n\r\n' % (port, port))
    except OSError:
        pass
codes = {{}}
for s in socks:
    try:
        line = s.recv(64).split(b'\r\n')[0].decode() or 'closed'
    except OSError as e:
        line = type(e).__name__
    codes[line] = codes.get(line, 0) + 1
    s.close()
print('codes', sorted(codes.items()))
)PY",
                               fmt::arg("port", mvtest::origin_port()),
                               fmt::arg("approved", mvtest::approved_name));
  sandbox::run_request base;
  base.timeout = mvtest::must_finish();
  auto r = mvtest::run_network(src, base);
  REQUIRE(r.code == code::ok);
  const auto& out = r.std_out.summary;
  CHECK(out.find(fmt::format("upload 200 origin got {} bytes for POST /upload", 8 << 20)) !=
        std::string::npos);
  CHECK(mvtest::origin_bytes() - before_bytes >= (8u << 20));
  auto up = find_attempt(r, mvtest::approved_name, "approved");
  REQUIRE(up != nullptr);
  // Over the proxy's per-run connection cap: refused and recorded, the run unharmed.
  CHECK(find_attempt(r, mvtest::approved_name, "connection limit") != nullptr);
  CHECK(out.find("HTTP/1.1 200 OK") != std::string::npos);
  // The host held no more than the windows (64 connections x 64 KiB each way, plus the
  // proxy's own bounded buffers): not the 8 MiB upload, not 100 connections' worth.
  const std::uint64_t rss_after = rss_kib();
  CHECK(rss_after < rss_before + 48 * 1024);
}
