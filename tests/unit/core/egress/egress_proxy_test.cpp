// The host-side egress proxy (core/egress/egress_proxy.hpp): the addresses it refuses, and the
// proxy itself against loopback origin servers reached through names the test maps.
//
// Origins and clients are plain blocking sockets with receive timeouts in their own threads, so
// a broken proxy fails a test instead of hanging it; Catch2 assertions stay on the main thread.
#include "core/egress/egress_proxy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/egress/run_ca.hpp"
#include "core/egress/secret_scan.hpp"
#include "core/egress/terminated_http.hpp"
#include "unit/core/egress/egress_test_support.hpp"

namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using namespace sandbox::detail;
using namespace egress_test;

asio::ip::address ip(const char* s) { return asio::ip::make_address(s); }

// ---------------------------------------------------------------------------------------------
// Blocking sockets with timeouts.

void set_timeouts(int fd) {
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

// A listening socket on 127.0.0.1, any port.
int listen_loopback(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(fd, 128) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  port = ntohs(a.sin_port);
  return fd;
}

// A port on 127.0.0.1 where nothing listens (bound, then released).
std::uint16_t closed_port() {
  std::uint16_t port = 0;
  ::close(listen_loopback(port));
  return port;
}

class client {
 public:
  explicit client(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd_ >= 0);
    set_timeouts(fd_);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~client() { close(); }
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  // Sends everything it can; false when the peer is gone.
  bool send(std::string_view s) {
    while (!s.empty()) {
      const ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  bool send(const bytes& b) {
    return send(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
  }

  // Up to and including the first CRLF CRLF (empty on EOF before it).
  std::string read_head() {
    std::string out;
    char c = 0;
    while (::recv(fd_, &c, 1, 0) == 1) {
      out += c;
      if (out.ends_with("\r\n\r\n")) return out;
    }
    return {};
  }
  std::string read_n(std::size_t n) {
    std::string out(n, '\0');
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    out.resize(got);
    return out;
  }
  // Until EOF (or an error or the timeout).
  std::string read_all() {
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
      if (r <= 0) return out;
      out.append(buf, static_cast<std::size_t>(r));
    }
  }
  void shutdown_send() { ::shutdown(fd_, SHUT_WR); }
  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// A loopback origin server: records what each connection sent. `echo`: sends `banner` when a
// connection opens, then echoes every byte until EOF (a stand-in for a TLS server: the proxy never
// decrypts). `http`: reads one request head (+ Content-Length body), answers `response`, closes.
class origin {
 public:
  enum class mode { echo, http };
  explicit origin(mode m, std::string reply = {}) : mode_(m), reply_(std::move(reply)) {
    fd_ = listen_loopback(port_);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~origin() {
    stop_ = true;
    acceptor_.join();
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(m_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
    ::close(fd_);
  }
  origin(const origin&) = delete;
  origin& operator=(const origin&) = delete;

  std::uint16_t port() const { return port_; }

  // What each finished connection sent, in the order they finished; waits for `n` of them.
  std::vector<std::string> finished(std::size_t n) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, 10s, [&] { return received_.size() >= n; });
    return received_;
  }
  std::size_t accepted() const { return accepted_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ++accepted_;
      set_timeouts(c);
      std::lock_guard lock(m_);
      threads_.emplace_back([this, c] { serve(c); });
    }
  }

  void serve(int c) {
    std::string got;
    char buf[4096];
    if (mode_ == mode::echo) {
      if (!reply_.empty()) ::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      for (;;) {
        const ssize_t r = ::recv(c, buf, sizeof(buf), 0);
        if (r <= 0) break;
        got.append(buf, static_cast<std::size_t>(r));
        ::send(c, buf, static_cast<std::size_t>(r), MSG_NOSIGNAL);
      }
    } else {
      std::size_t want = std::string::npos;
      while (want == std::string::npos || got.size() < want) {
        const ssize_t r = ::recv(c, buf, sizeof(buf), 0);
        if (r <= 0) break;
        got.append(buf, static_cast<std::size_t>(r));
        const auto end = got.find("\r\n\r\n");
        if (want == std::string::npos && end != std::string::npos) {
          std::size_t length = 0;
          const auto cl = got.find("Content-Length: ");
          if (cl != std::string::npos && cl < end) length = std::stoul(got.substr(cl + 16));
          want = end + 4 + length;
        }
      }
      ::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      ::shutdown(c, SHUT_WR);
      // Whatever else arrives (nothing, from a correct proxy) is recorded too.
      for (;;) {
        const ssize_t r = ::recv(c, buf, sizeof(buf), 0);
        if (r <= 0) break;
        got.append(buf, static_cast<std::size_t>(r));
      }
    }
    ::close(c);
    std::lock_guard lock(m_);
    received_.push_back(std::move(got));
    cv_.notify_all();
  }

  mode mode_;
  std::string reply_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> accepted_{0};
  std::thread acceptor_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
  std::vector<std::string> received_;
};

// A proxy on its own io_context thread, serving a fresh loopback listener; attempts collected.
class proxy_fixture {
 public:
  proxy_fixture(egress_grant grant, std::shared_ptr<egress_resolver> resolver)
      : work_(asio::make_work_guard(io_)) {
    const int fd = listen_loopback(port_);
    proxy_ = egress_proxy::start(io_.get_executor(), fd, std::move(grant), std::move(resolver),
                                 [this](sandbox::egress_attempt a) {
                                   std::lock_guard lock(m_);
                                   attempts_.push_back(std::move(a));
                                   cv_.notify_all();
                                 });
    REQUIRE(proxy_ != nullptr);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~proxy_fixture() { shutdown(); }
  proxy_fixture(const proxy_fixture&) = delete;
  proxy_fixture& operator=(const proxy_fixture&) = delete;

  std::uint16_t port() const { return port_; }
  egress_proxy& proxy() { return *proxy_; }

  // The first `n` attempts (waiting up to 10 s for them).
  std::vector<sandbox::egress_attempt> attempts(std::size_t n) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, 10s, [&] { return attempts_.size() >= n; });
    return attempts_;
  }

  // stop(), then let every handler run: io_context::run returns once nothing is left.
  void shutdown() {
    if (!thread_.joinable()) return;
    proxy_->stop();
    work_.reset();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!io_.stopped() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    stuck_ = !io_.stopped();
    io_.stop();
    thread_.join();
  }
  bool stuck() const { return stuck_; }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::uint16_t port_ = 0;
  std::shared_ptr<egress_proxy> proxy_;
  std::thread thread_;
  bool stuck_ = false;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<sandbox::egress_attempt> attempts_;
};

egress_grant grant_for(std::vector<std::string> domains, std::uint16_t port) {
  egress_grant g;
  g.domains = std::move(domains);
  g.connect_ports = {port};
  g.http_ports = {port};
  return g;
}

std::shared_ptr<egress_resolver> loopback_names(std::vector<std::string> names) {
  std::map<std::string, std::vector<asio::ip::address>> m;
  for (auto& n : names) m[n] = {ip("127.0.0.1")};
  return make_static_resolver(std::move(m));
}

std::string connect_request(const std::string& authority) {
  return "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n";
}

// Sends `request` as a fresh client and reads the answer to EOF.
http_answer ask(std::uint16_t port, const std::string& request) {
  client c(port);
  c.send(request);
  return parse_answer(c.read_all());
}

}  // namespace

// =============================================================================================
// Addresses

TEST_CASE("egress: address_refusal classes", "[egress]") {
  const std::vector<std::pair<const char*, std::optional<std::string>>> table = {
      // IPv4
      {"0.0.0.0", "unspecified"},
      {"0.1.2.3", "this network"},
      {"127.0.0.1", "loopback"},
      {"127.255.255.254", "loopback"},
      {"10.0.0.1", "private"},
      {"172.16.0.1", "private"},
      {"172.31.255.255", "private"},
      {"172.32.0.1", std::nullopt},
      {"192.168.1.1", "private"},
      {"100.64.0.1", "shared"},
      {"100.127.255.255", "shared"},
      {"100.128.0.1", std::nullopt},
      {"100.100.100.200", "shared"},  // Alibaba Cloud metadata
      {"169.254.169.254", "metadata"},
      {"169.254.1.1", "link-local"},
      {"224.0.0.1", "multicast"},
      {"239.255.255.250", "multicast"},
      {"240.0.0.1", "reserved"},
      {"255.255.255.255", "broadcast"},
      {"192.0.0.8", "reserved"},
      {"192.0.2.1", "documentation"},
      {"198.51.100.7", "documentation"},
      {"203.0.113.9", "documentation"},
      {"198.18.0.1", "benchmarking"},
      {"93.184.216.34", std::nullopt},
      {"8.8.8.8", std::nullopt},
      {"1.1.1.1", std::nullopt},
      // IPv6
      {"::", "unspecified"},
      {"::1", "loopback"},
      {"fc00::1", "unique-local"},
      {"fd12:3456::1", "unique-local"},
      {"fd00:ec2::254", "metadata"},
      {"fe80::1", "link-local"},
      {"febf::1", "link-local"},
      {"fec0::1", "site-local"},
      {"ff02::1", "multicast"},
      {"ff0e::1", "multicast"},
      {"2001:db8::1", "documentation"},
      {"100::1", "discard"},
      {"2001::1", "teredo"},
      {"2606:4700:4700::1111", std::nullopt},
      {"2a00:1450:4001::200e", std::nullopt},
      // IPv4 carried in IPv6
      {"::ffff:127.0.0.1", "loopback"},
      {"::ffff:169.254.169.254", "metadata"},
      {"::ffff:10.1.2.3", "private"},
      {"::ffff:8.8.8.8", std::nullopt},
      {"::127.0.0.1", "loopback"},  // IPv4-compatible
      {"::10.0.0.1", "private"},
      {"::ffff:0:127.0.0.1", "loopback"},  // IPv4-translated
      {"64:ff9b::127.0.0.1", "loopback"},  // NAT64
      {"64:ff9b::a9fe:a9fe", "metadata"},
      {"64:ff9b::192.168.0.1", "private"},
      {"64:ff9b::8.8.8.8", std::nullopt},
      {"64:ff9b:1::1", "nat64-local"},
      {"2002:7f00:1::1", "loopback"},  // 6to4 of 127.0.0.1
      {"2002:a9fe:a9fe::1", "metadata"},
      {"2002:808:808::1", std::nullopt},
  };
  for (const auto& [text, expected] : table) {
    INFO(text);
    CHECK(address_refusal(ip(text)) == expected);
  }
  // Every IPv4 address is judged alike in its mapped, compatible and NAT64 forms.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const auto v4 = asio::ip::address_v4(static_cast<std::uint32_t>(rng()));
    const auto b = v4.to_bytes();
    asio::ip::address_v6::bytes_type mapped{};
    mapped[10] = mapped[11] = 0xFF;
    asio::ip::address_v6::bytes_type nat64{0, 0x64, 0xFF, 0x9B};
    for (int k = 0; k < 4; ++k) mapped[12 + k] = nat64[12 + k] = b[k];
    INFO(v4.to_string());
    CHECK(address_refusal(asio::ip::address_v6(mapped)) == address_refusal(v4));
    CHECK(address_refusal(asio::ip::address_v6(nat64)) == address_refusal(v4));
  }
}

// =============================================================================================
// The proxy

TEST_CASE("egress proxy: an approved CONNECT tunnel relays and counts both ways", "[egress]") {
  const std::string banner = "origin says hi\n";
  origin tls(origin::mode::echo, banner);
  proxy_fixture p(grant_for({"api.example.com"}, tls.port()), loopback_names({"api.example.com"}));

  const std::string authority = "API.example.com:" + std::to_string(tls.port());
  client c(p.port());
  REQUIRE(c.send(connect_request(authority)));
  CHECK(c.read_head() == "HTTP/1.1 200 Connection established\r\n\r\n");
  const auto hello = client_hello("api.example.com.");  // case and trailing dot do not matter
  const std::string data = "application data, encrypted in real life";
  REQUIRE(c.send(hello));
  REQUIRE(c.send(data));
  const std::string expected_down = banner + to_string(hello) + data;
  CHECK(c.read_n(expected_down.size()) == expected_down);
  c.shutdown_send();
  CHECK(c.read_all().empty());  // the origin closed after our EOF; so does the tunnel
  c.close();

  const auto seen = tls.finished(1);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == to_string(hello) + data);
  const auto attempts = p.attempts(1);
  REQUIRE(attempts.size() == 1);
  const auto& a = attempts[0];
  CHECK(a.protocol == "https");
  CHECK(a.host == "API.example.com");
  CHECK(a.address == "127.0.0.1");
  CHECK(a.port == tls.port());
  CHECK(a.allowed);
  CHECK(a.reason == "approved");
  CHECK(a.bytes_up == hello.size() + data.size());
  CHECK(a.bytes_down == expected_down.size());
}

TEST_CASE("egress proxy: a ClientHello split across records and TCP writes", "[egress]") {
  origin tls(origin::mode::echo);
  proxy_fixture p(grant_for({"*.example.com"}, tls.port()),
                  loopback_names({"deep.api.example.com"}));
  client c(p.port());
  const auto hello = tls_records(client_hello_message({.sni = "deep.api.example.com"}), {30});
  // The CONNECT head and the first ClientHello bytes in one write, the rest in two more.
  std::string first = connect_request("deep.api.example.com:" + std::to_string(tls.port()));
  first.append(reinterpret_cast<const char*>(hello.data()), 3);
  REQUIRE(c.send(first));
  CHECK(c.read_head().starts_with("HTTP/1.1 200 "));
  REQUIRE(c.send(bytes(hello.begin() + 3, hello.begin() + 40)));
  std::this_thread::sleep_for(20ms);
  REQUIRE(c.send(bytes(hello.begin() + 40, hello.end())));
  CHECK(c.read_n(hello.size()) == to_string(hello));
  c.close();
  CHECK(tls.finished(1).at(0) == to_string(hello));
  const auto a = p.attempts(1).at(0);
  CHECK(a.allowed);
  CHECK(a.bytes_up == hello.size());
}

TEST_CASE("egress proxy: refusals before connecting", "[egress]") {
  origin tls(origin::mode::echo);
  const std::string port = std::to_string(tls.port());
  proxy_fixture p(grant_for({"api.example.com"}, tls.port()),
                  loopback_names({"api.example.com", "evil.example"}));

  struct refusal_case {
    std::string request;
    int status;
    std::string reason;
    std::string host;
  };
  const std::vector<refusal_case> cases = {
      {connect_request("evil.example:" + port), 403, "domain not approved", "evil.example"},
      {connect_request("api.example.com.evil.example:" + port), 403, "domain not approved",
       "api.example.com.evil.example"},
      {connect_request("127.0.0.1:" + port), 403, "direct IP not allowed", "127.0.0.1"},
      {connect_request("[::1]:" + port), 403, "direct IP not allowed", "::1"},
      {connect_request("2130706433:" + port), 403, "direct IP not allowed", "2130706433"},
      {connect_request("0x7f.1:" + port), 403, "direct IP not allowed", "0x7f.1"},
      {connect_request("api.example.com:22"), 403, "port not approved", "api.example.com"},
      {connect_request("api_example.com:" + port), 403, "domain not approved", "api_example.com"},
      {connect_request("api.example.com"), 400, "malformed request", "api.example.com"},
      {"CONNECT api.example.com:" + port + " HTTP/2.0\r\n\r\n", 501, "unsupported request",
       "api.example.com"},
      {"GET http://127.0.0.1:" + port + "/ HTTP/1.1\r\nHost: 127.0.0.1:" + port + "\r\n\r\n", 403,
       "direct IP not allowed", "127.0.0.1"},
      {"GET http://evil.example:" + port + "/ HTTP/1.1\r\nHost: evil.example:" + port + "\r\n\r\n",
       403, "domain not approved", "evil.example"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& rc = cases[i];
    INFO(rc.request);
    const auto answer = ask(p.port(), rc.request);
    p.attempts(i + 1);  // one at a time, so the records come in this order
    CHECK(answer.status == rc.status);
    CHECK(answer.head.find("Content-Type: application/json\r\n") != std::string::npos);
    CHECK(answer.head.find("Connection: close\r\n") != std::string::npos);
    REQUIRE(answer.body.is_object());
    CHECK(answer.body["reason"] == rc.reason);
    CHECK(answer.body["host"] == rc.host);
    if (rc.status == 403) CHECK(answer.body["error"] == "egress_denied");
  }
  const auto attempts = p.attempts(cases.size());
  REQUIRE(attempts.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i].request);
    CHECK_FALSE(attempts[i].allowed);
    CHECK(attempts[i].reason == cases[i].reason);
    CHECK(attempts[i].host == cases[i].host);
    CHECK(attempts[i].address.empty());
    CHECK(attempts[i].bytes_up == 0);
    CHECK(attempts[i].bytes_down == 0);
  }
  CHECK(attempts[0].protocol == "https");
  CHECK(attempts[6].port == 22);
  CHECK(attempts.back().protocol == "http");
  CHECK(tls.accepted() == 0);  // nothing reached the origin
}

TEST_CASE("egress proxy: the ClientHello must name the CONNECT host", "[egress]") {
  origin tls(origin::mode::echo);
  proxy_fixture p(grant_for({"api.example.com", "other.example.com"}, tls.port()),
                  loopback_names({"api.example.com", "other.example.com"}));
  const std::string authority = "api.example.com:" + std::to_string(tls.port());
  struct tunnel_case {
    bytes first_bytes;
    std::string reason;
  };
  const std::vector<tunnel_case> cases = {
      {client_hello("other.example.com"), "SNI does not match CONNECT host"},  // approved too!
      {client_hello("evil.example"), "SNI does not match CONNECT host"},
      {client_hello(std::nullopt), "no SNI"},
      {to_bytes("GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n"), "not TLS"},
      {{22, 3, 1, 0, 5, 2, 0, 0, 1, 0}, "not TLS"},  // a ServerHello
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& tc = cases[i];
    client c(p.port());
    REQUIRE(c.send(connect_request(authority)));
    CHECK(c.read_head().starts_with("HTTP/1.1 200 "));
    c.send(tc.first_bytes);
    CHECK(c.read_all().empty());  // closed, nothing relayed back
    p.attempts(i + 1);
  }
  const auto attempts = p.attempts(cases.size());
  REQUIRE(attempts.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CHECK_FALSE(attempts[i].allowed);
    CHECK(attempts[i].reason == cases[i].reason);
    CHECK(attempts[i].address == "127.0.0.1");  // connected, but nothing forwarded
    CHECK(attempts[i].bytes_up == 0);
    CHECK(attempts[i].bytes_down == 0);
  }
  // The origin accepted each connection and saw zero bytes on every one.
  const auto seen = tls.finished(cases.size());
  REQUIRE(seen.size() == cases.size());
  for (const auto& s : seen) CHECK(s.empty());
}

TEST_CASE("egress proxy: plain HTTP is forwarded in origin-form, stripped, one request",
          "[egress]") {
  const std::string response =
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
  origin web(origin::mode::http, response);
  const std::string authority = "api.example.com:" + std::to_string(web.port());
  proxy_fixture p(grant_for({"api.example.com"}, web.port()), loopback_names({"api.example.com"}));

  // A POST with its body, then a pipelined second request that must never reach the origin.
  const std::string request =
      "POST http://" + authority + "/submit?x=1 HTTP/1.1\r\nHost: " + authority +
      "\r\nProxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
      "Content-Length: 11\r\nUser-Agent: test\r\n\r\nhello world";
  const std::string smuggled =
      "GET http://" + authority + "/admin HTTP/1.1\r\nHost: " + authority + "\r\n\r\n";
  client c(p.port());
  REQUIRE(c.send(request + smuggled));
  CHECK(c.read_all() == response);
  c.close();

  const std::string expected =
      "POST /submit?x=1 HTTP/1.1\r\nHost: " + authority +
      "\r\nContent-Length: 11\r\nUser-Agent: test\r\nConnection: close\r\n\r\n"
      "hello world";
  CHECK(web.finished(1).at(0) == expected);
  const auto a = p.attempts(1).at(0);
  CHECK(a.protocol == "http");
  CHECK(a.host == "api.example.com");
  CHECK(a.port == web.port());
  CHECK(a.address == "127.0.0.1");
  CHECK(a.allowed);
  CHECK(a.reason == "approved");
  CHECK(a.bytes_up == expected.size());
  CHECK(a.bytes_down == response.size());
}

TEST_CASE("egress proxy: plain HTTP refusals (Host, smuggling, schemes)", "[egress]") {
  origin web(origin::mode::http, "HTTP/1.1 204 No Content\r\n\r\n");
  const std::string authority = "api.example.com:" + std::to_string(web.port());
  const std::string line = "POST http://" + authority + "/ HTTP/1.1\r\n";
  const std::string host = "Host: " + authority + "\r\n";
  proxy_fixture p(grant_for({"api.example.com"}, web.port()), loopback_names({"api.example.com"}));
  const std::vector<std::tuple<std::string, int, std::string>> cases = {
      {line + "Host: other.example.com\r\n\r\n", 400, "malformed request"},
      {line + "Host: api.example.com\r\n\r\n", 400, "malformed request"},  // port differs
      {line + "\r\n", 400, "malformed request"},                           // no Host
      {line + host + "Content-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400, "malformed request"},
      {line + host + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n", 400,
       "malformed request"},
      {line + host + "X: 1\n\r\n", 400, "malformed request"},  // bare LF
      {line + host + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501, "unsupported request"},
      {"GET https://" + authority + "/ HTTP/1.1\r\n" + host + "\r\n", 501, "unsupported request"},
      {"GET ftp://" + authority + "/ HTTP/1.1\r\n" + host + "\r\n", 501, "unsupported request"},
      {"GET / HTTP/1.1\r\n" + host + "\r\n", 400, "malformed request"},  // not a proxy request
      {std::string("\x16\x03\x01\x00\x05hello", 10), 400, "malformed request"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [request, status, reason] = cases[i];
    INFO(request);
    const auto answer = ask(p.port(), request);
    p.attempts(i + 1);
    CHECK(answer.status == status);
    REQUIRE(answer.body.is_object());
    CHECK(answer.body["reason"] == reason);
  }
  const auto attempts = p.attempts(cases.size());
  REQUIRE(attempts.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CHECK_FALSE(attempts[i].allowed);
    CHECK(attempts[i].reason == std::get<2>(cases[i]));
  }
  CHECK(web.accepted() == 0);
}

TEST_CASE("egress proxy: unpinned answers to non-public addresses are refused", "[egress]") {
  origin tls(origin::mode::echo);
  const std::string port = std::to_string(tls.port());
  // A DNS answer the sandbox's code may control (rebinding): the proxy judges the address.
  auto unpinned = make_static_resolver(
      {{"api.example.com", {ip("127.0.0.1")}},
       {"meta.example.com", {ip("169.254.169.254")}},
       {"mixed.example.com", {ip("169.254.169.254"), ip("10.0.0.1"), ip("::ffff:127.0.0.1")}},
       {"v6.example.com", {ip("::ffff:127.0.0.1"), ip("fd00:ec2::254")}}},
      false);
  proxy_fixture p(grant_for({"*.example.com", "api.example.com"}, tls.port()), unpinned);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"api.example.com", "address refused: loopback", "127.0.0.1"},
      {"meta.example.com", "address refused: metadata", "169.254.169.254"},
      {"mixed.example.com", "address refused: metadata", "169.254.169.254"},
      {"v6.example.com", "address refused: loopback", "::ffff:127.0.0.1"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& [name, reason, address] = cases[i];
    const auto answer = ask(p.port(), connect_request(name + ":" + port));
    p.attempts(i + 1);
    CHECK(answer.status == 403);
    CHECK(answer.body["reason"] == reason);
  }
  const auto attempts = p.attempts(cases.size());
  REQUIRE(attempts.size() == cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    CHECK(attempts[i].reason == std::get<1>(cases[i]));
    CHECK(attempts[i].address == std::get<2>(cases[i]));
  }
  CHECK(tls.accepted() == 0);
}

namespace {

// Resolves the names it knows through another resolver under another name: a granted name
// answered by the host's real resolver with what "localhost" resolves to.
class alias_resolver final : public egress_resolver {
 public:
  alias_resolver(std::shared_ptr<egress_resolver> inner, std::map<std::string, std::string> alias)
      : inner_(std::move(inner)), alias_(std::move(alias)) {}
  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    const auto it = alias_.find(host);
    inner_->async_resolve(it == alias_.end() ? host : it->second, std::move(done));
  }

 private:
  std::shared_ptr<egress_resolver> inner_;
  std::map<std::string, std::string> alias_;
};

// Never answers; keeps the callbacks (a resolver that hangs).
class silent_resolver final : public egress_resolver {
 public:
  void async_resolve(const std::string&,
                     std::function<void(boost::system::error_code, answer)> done) override {
    std::lock_guard lock(m_);
    pending_.push_back(std::move(done));
    cv_.notify_all();
  }
  bool wait_for_request() {
    std::unique_lock lock(m_);
    return cv_.wait_for(lock, 10s, [&] { return !pending_.empty(); });
  }
  void answer_all_with_failure() {
    std::vector<std::function<void(boost::system::error_code, answer)>> p;
    {
      std::lock_guard lock(m_);
      p.swap(pending_);
    }
    for (auto& f : p) f(boost::asio::error::host_not_found, {});
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::function<void(boost::system::error_code, answer)>> pending_;
};

}  // namespace

TEST_CASE("egress proxy: the system resolver's loopback answer is refused", "[egress]") {
  asio::io_context resolver_io;
  auto work = asio::make_work_guard(resolver_io);
  std::thread resolver_thread([&] { resolver_io.run(); });
  {
    proxy_fixture p(grant_for({"db.example.com"}, 443),
                    std::make_shared<alias_resolver>(
                        make_system_resolver(resolver_io.get_executor(), false),
                        std::map<std::string, std::string>{{"db.example.com", "localhost"}}));
    const auto answer = ask(p.port(), connect_request("db.example.com:443"));
    CHECK(answer.status == 403);
    CHECK(answer.body["reason"] == "address refused: loopback");
    const auto a = p.attempts(1).at(0);
    CHECK(a.reason == "address refused: loopback");
    CHECK(asio::ip::make_address(a.address).is_loopback());
  }
  work.reset();
  resolver_thread.join();
}

TEST_CASE("egress proxy: resolution and connection failures are 502", "[egress]") {
  const std::uint16_t nobody = closed_port();
  proxy_fixture p(grant_for({"*.example.com"}, nobody),
                  make_static_resolver({{"down.example.com", {ip("127.0.0.1")}}}));
  const std::string port = std::to_string(nobody);
  auto answer = ask(p.port(), connect_request("unknown.example.com:" + port));
  CHECK(answer.status == 502);
  CHECK(answer.body["error"] == "egress_failed");
  CHECK(answer.body["reason"] == "resolution failed");
  answer = ask(p.port(), connect_request("down.example.com:" + port));
  CHECK(answer.status == 502);
  CHECK(answer.body["reason"] == "connect failed");
  const auto attempts = p.attempts(2);
  REQUIRE(attempts.size() == 2);
  CHECK(attempts[0].reason == "resolution failed");
  CHECK(attempts[0].address.empty());
  CHECK(attempts[1].reason == "connect failed");
  CHECK(attempts[1].address == "127.0.0.1");
}

TEST_CASE("egress proxy: the up byte budget closes the tunnel that crosses it", "[egress]") {
  origin tls(origin::mode::echo);
  auto grant = grant_for({"api.example.com"}, tls.port());
  grant.max_bytes_up = 4096;
  proxy_fixture p(grant, loopback_names({"api.example.com"}));
  const std::string authority = "api.example.com:" + std::to_string(tls.port());
  {
    client c(p.port());
    REQUIRE(c.send(connect_request(authority)));
    CHECK(c.read_head().starts_with("HTTP/1.1 200 "));
    REQUIRE(c.send(client_hello("api.example.com")));
    c.send(std::string(10000, 'x'));  // may fail part-way: the proxy closes
    c.read_all();
  }
  const auto seen = tls.finished(1);
  CHECK(seen.at(0).size() == 4096);  // exactly the budget, not a byte more
  const auto first = p.attempts(1).at(0);
  CHECK_FALSE(first.allowed);
  CHECK(first.reason == "byte limit");
  CHECK(first.bytes_up == 4096);
  // The budget is spent for the whole run.
  const auto answer = ask(p.port(), connect_request(authority));
  CHECK(answer.status == 403);
  CHECK(answer.body["reason"] == "byte limit");
  CHECK(p.attempts(2).at(1).reason == "byte limit");
}

TEST_CASE("egress proxy: the down byte budget", "[egress]") {
  origin tls(origin::mode::echo, std::string(5000, 'b'));
  auto grant = grant_for({"api.example.com"}, tls.port());
  grant.max_bytes_down = 1000;
  proxy_fixture p(grant, loopback_names({"api.example.com"}));
  client c(p.port());
  REQUIRE(c.send(connect_request("api.example.com:" + std::to_string(tls.port()))));
  CHECK(c.read_head().starts_with("HTTP/1.1 200 "));
  REQUIRE(c.send(client_hello("api.example.com")));
  CHECK(c.read_all() == std::string(1000, 'b'));
  const auto a = p.attempts(1).at(0);
  CHECK(a.reason == "byte limit");
  CHECK(a.bytes_down == 1000);
}

TEST_CASE("egress proxy: the connection budget", "[egress]") {
  origin tls(origin::mode::echo);
  auto grant = grant_for({"api.example.com"}, tls.port());
  grant.max_connections = 2;
  proxy_fixture p(grant, loopback_names({"api.example.com"}));
  const std::string authority = "api.example.com:" + std::to_string(tls.port());
  const auto hello = client_hello("api.example.com");
  // Two tunnels stay open; the third client is refused although everything else is approved.
  client one(p.port());
  client two(p.port());
  for (client* c : {&one, &two}) {
    REQUIRE(c->send(connect_request(authority)));
    CHECK(c->read_head().starts_with("HTTP/1.1 200 "));
    REQUIRE(c->send(hello));
    CHECK(c->read_n(hello.size()) == to_string(hello));
  }
  const auto answer = ask(p.port(), connect_request(authority));
  CHECK(answer.status == 403);
  CHECK(answer.body["reason"] == "connection limit");
  // Closing a tunnel does not give its slot back: the budget counts connections in total.
  one.close();
  CHECK(ask(p.port(), connect_request(authority)).body["reason"] == "connection limit");
  two.close();
  const auto attempts = p.attempts(4);
  REQUIRE(attempts.size() == 4);
  int approved = 0;
  int limited = 0;
  for (const auto& a : attempts) {
    if (a.reason == "approved") ++approved;
    if (a.reason == "connection limit") {
      ++limited;
      CHECK(a.host == "api.example.com");
      CHECK_FALSE(a.allowed);
    }
  }
  CHECK(approved == 2);
  CHECK(limited == 2);
  CHECK(tls.accepted() == 2);
}

TEST_CASE("egress proxy: at most 256 attempts are recorded, the rest counted", "[egress]") {
  auto grant = grant_for({"api.example.com"}, 443);
  grant.max_connections = 0;
  proxy_fixture p(grant, loopback_names({"api.example.com"}));
  constexpr std::size_t total = 300;
  for (std::size_t i = 0; i < total; ++i) ask(p.port(), connect_request("api.example.com:443"));
  p.shutdown();  // every attempt is reported by then
  CHECK(p.attempts(max_recorded_egress_attempts).size() == max_recorded_egress_attempts);
  CHECK(p.proxy().dropped() == total - max_recorded_egress_attempts);
}

TEST_CASE("egress proxy: handshake timeouts", "[egress]") {
  origin tls(origin::mode::echo);
  auto grant = grant_for({"api.example.com"}, tls.port());
  grant.handshake_timeout = 300ms;
  proxy_fixture p(grant, loopback_names({"api.example.com"}));
  {
    client silent(p.port());  // sends nothing at all
    CHECK(silent.read_all().empty());
  }
  {
    client slow(p.port());  // half a head
    slow.send("CONNECT api.exam");
    CHECK(slow.read_all().empty());
  }
  {
    client no_hello(p.port());  // a tunnel, then no ClientHello
    REQUIRE(no_hello.send(connect_request("api.example.com:" + std::to_string(tls.port()))));
    CHECK(no_hello.read_head().starts_with("HTTP/1.1 200 "));
    CHECK(no_hello.read_all().empty());
  }
  const auto attempts = p.attempts(3);
  REQUIRE(attempts.size() == 3);
  for (const auto& a : attempts) {
    CHECK(a.reason == "timeout");
    CHECK_FALSE(a.allowed);
  }
  CHECK(tls.finished(1).at(0).empty());
}

TEST_CASE("egress proxy: stop() reports every open attempt once", "[egress]") {
  origin tls(origin::mode::echo);
  auto resolver = std::make_shared<silent_resolver>();
  // api.example.com resolves to the origin; slow.example.com never resolves.
  class split_resolver final : public egress_resolver {
   public:
    split_resolver(std::shared_ptr<egress_resolver> fast, std::shared_ptr<egress_resolver> slow)
        : fast_(std::move(fast)), slow_(std::move(slow)) {}
    void async_resolve(const std::string& host,
                       std::function<void(boost::system::error_code, answer)> done) override {
      (host == "slow.example.com" ? slow_ : fast_)->async_resolve(host, std::move(done));
    }

   private:
    std::shared_ptr<egress_resolver> fast_, slow_;
  };
  proxy_fixture p(grant_for({"*.example.com"}, tls.port()),
                  std::make_shared<split_resolver>(loopback_names({"api.example.com"}), resolver));
  const std::string port = std::to_string(tls.port());

  client partial(p.port());  // accepted first: still sending its head
  partial.send("CONNECT api.example.com:");
  client resolving(p.port());
  resolving.send(connect_request("slow.example.com:" + port));
  REQUIRE(resolver->wait_for_request());
  client tunnel(p.port());
  REQUIRE(tunnel.send(connect_request("api.example.com:" + port)));
  CHECK(tunnel.read_head().starts_with("HTTP/1.1 200 "));
  const auto hello = client_hello("api.example.com");
  REQUIRE(tunnel.send(hello));
  CHECK(tunnel.read_n(hello.size()) == to_string(hello));

  p.proxy().stop();  // from this thread, not the io_context's
  p.proxy().stop();  // idempotent
  const auto attempts = p.attempts(3);
  REQUIRE(attempts.size() == 3);
  CHECK(tunnel.read_all().empty());
  CHECK(resolving.read_all().empty());
  CHECK(partial.read_all().empty());
  resolver->answer_all_with_failure();  // a late answer changes nothing
  p.shutdown();
  CHECK_FALSE(p.stuck());
  const auto final_attempts = p.attempts(0);  // all of them: the handlers have all run
  CHECK(final_attempts.size() == 3);          // exactly once each
  int stopped = 0;
  for (const auto& a : final_attempts) {
    if (a.reason == "approved") {
      CHECK(a.allowed);
      CHECK(a.bytes_up == hello.size());
      CHECK(a.bytes_down == hello.size());
    } else {
      CHECK(a.reason == "proxy stopped");
      CHECK_FALSE(a.allowed);
      ++stopped;
    }
  }
  CHECK(stopped == 2);
}

TEST_CASE("egress proxy: start refuses a descriptor that is not a listening socket", "[egress]") {
  asio::io_context io;
  const auto sink = [](sandbox::egress_attempt) {};
  auto resolver = make_static_resolver({});
  CHECK(egress_proxy::start(io.get_executor(), -1, {}, resolver, sink) == nullptr);
  const int not_listening = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(egress_proxy::start(io.get_executor(), not_listening, {}, resolver, sink) == nullptr);
  CHECK(::fcntl(not_listening, F_GETFD) == -1);  // taken and closed
  const int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  CHECK(egress_proxy::start(io.get_executor(), udp, {}, resolver, sink) == nullptr);
}

// =============================================================================================
// Secret placeholders (secret_scan.hpp): refused wherever the proxy sees them in clear

TEST_CASE("egress proxy: a secret's placeholder in a host, URL, header or body is refused",
          "[egress][secrets]") {
  origin web(origin::mode::http, "HTTP/1.1 204 No Content\r\n\r\n");
  const std::string placeholder = "sbx-secret-0123456789abcdef0123456789abcdef";
  const std::string mark = "0123456789abcdef0123456789abcdef";
  auto g = grant_for({"api.example.com", "*.example.com"}, web.port());
  g.secret_marks = placeholder_marks(std::vector<std::string>{placeholder});
  proxy_fixture p(std::move(g), loopback_names({"api.example.com"}));
  const std::string authority = "api.example.com:" + std::to_string(web.port());
  const std::string host = "Host: " + authority + "\r\n";
  const std::string post = "POST http://" + authority + "/ HTTP/1.1\r\n" + host;
  const std::vector<std::string> cases = {
      // A name under an approved wildcard: refused before it is resolved (no DNS lookup).
      connect_request(placeholder + ".example.com:" + std::to_string(web.port())),
      connect_request("x" + mark + "y.example.com:" + std::to_string(web.port())),
      "GET http://" + authority + "/v1?key=" + placeholder + " HTTP/1.1\r\n" + host + "\r\n",
      "GET http://" + authority + "/" + placeholder + " HTTP/1.1\r\n" + host + "\r\n",
      "GET http://" + authority + "/ HTTP/1.1\r\n" + host + "X-Api-Key: " + placeholder +
          "\r\n\r\n",
      "GET http://" + authority + "/ HTTP/1.1\r\n" + host + "Cookie: k=" + "SBX-SECRET-" +
          "0123456789ABCDEF0123456789ABCDEF\r\n\r\n",  // case does not hide it
      post + "Content-Length: 53\r\n\r\n{\"key\":\"" + placeholder + "\"}",
      // Not yet approved either: the misuse is what the record says.
      "GET http://other.test:" + std::to_string(web.port()) + "/" + mark +
          " HTTP/1.1\r\nHost: other.test:" + std::to_string(web.port()) + "\r\n\r\n",
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO(cases[i]);
    const auto answer = ask(p.port(), cases[i]);
    p.attempts(i + 1);
    CHECK(answer.status == 403);
    REQUIRE(answer.body.is_object());
    CHECK(answer.body["reason"] == "secret_misuse");
    CHECK(answer.body["advice"].get<std::string>().find("placeholder") != std::string::npos);
  }
  const auto attempts = p.attempts(cases.size());
  REQUIRE(attempts.size() == cases.size());
  for (const auto& a : attempts) {
    CHECK_FALSE(a.allowed);
    CHECK(a.reason == "secret_misuse");
    CHECK(a.bytes_up == 0);
  }
  CHECK(web.accepted() == 0);  // the origin's own count: nothing arrived

  // A request without the placeholder still goes through.
  const auto ok = ask(p.port(), "GET http://" + authority + "/ HTTP/1.1\r\n" + host + "\r\n");
  CHECK(ok.status == 204);
}

TEST_CASE("egress proxy: a placeholder later in a plain-HTTP body never goes upstream",
          "[egress][secrets]") {
  origin web(origin::mode::http, "HTTP/1.1 204 No Content\r\n\r\n");
  const std::string placeholder = "sbx-secret-fedcba9876543210fedcba9876543210";
  const std::string mark = "fedcba9876543210fedcba9876543210";
  auto g = grant_for({"api.example.com"}, web.port());
  g.secret_marks = placeholder_marks(std::vector<std::string>{placeholder});
  proxy_fixture p(std::move(g), loopback_names({"api.example.com"}));
  const std::string authority = "api.example.com:" + std::to_string(web.port());
  // Sends the head, then the body in two writes cut inside the placeholder.
  auto post = [&](std::size_t filler_bytes) {
    const std::string body = std::string(filler_bytes, 'a') + placeholder + "tail";
    client c(p.port());
    c.send("POST http://" + authority + "/upload HTTP/1.1\r\nHost: " + authority +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n");
    std::this_thread::sleep_for(50ms);  // the head is read on its own
    c.send(body.substr(0, filler_bytes + 10));
    std::this_thread::sleep_for(50ms);
    c.send(body.substr(filler_bytes + 10));
    auto answer = parse_answer(c.read_all());
    c.close();
    return answer;
  };
  // A body that fits (64 KiB) is read whole and judged first: nothing reaches the origin.
  auto answer = post(40000);
  CHECK(answer.status == 403);
  auto a = p.attempts(1).at(0);
  CHECK_FALSE(a.allowed);
  CHECK(a.reason == "secret_misuse");
  CHECK(a.bytes_up == 0);
  CHECK(web.accepted() == 0);
  // A larger one is judged as it is relayed: the origin's own log has the head and part of
  // the filler, never the placeholder's mark; the client still gets the 403.
  answer = post(100000);
  CHECK(answer.status == 403);
  a = p.attempts(2).at(1);
  CHECK_FALSE(a.allowed);
  CHECK(a.reason == "secret_misuse");
  const auto seen = web.finished(1);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].rfind("POST /upload HTTP/1.1\r\n", 0) == 0);
  CHECK(seen[0].find(mark) == std::string::npos);
  CHECK(seen[0].find(mark.substr(0, 10)) == std::string::npos);  // the cut piece neither
  CHECK(a.bytes_up == seen[0].size());
}

// =============================================================================================
// Terminated TLS (a run with secrets): tests speak real TLS through OpenSSL on blocking
// sockets with receive timeouts, so a broken proxy fails a test instead of hanging it.

namespace {

struct ssl_ctx_free {
  void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
};
struct ssl_free {
  void operator()(SSL* s) const noexcept { SSL_free(s); }
};
using ssl_ctx_ptr = std::unique_ptr<SSL_CTX, ssl_ctx_free>;
using ssl_ptr = std::unique_ptr<SSL, ssl_free>;

const std::string tls_placeholder = "sbx-secret-00112233445566778899aabbccddeeff";
const std::string tls_value = "the-real-secret-VALUE-42";

std::string ssl_read_all(SSL* s) {
  std::string out;
  char buf[4096];
  for (;;) {
    const int n = SSL_read(s, buf, sizeof(buf));
    if (n <= 0) return out;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

bool ssl_write_all(SSL* s, std::string_view data) {
  while (!data.empty()) {
    const int n = SSL_write(s, data.data(), static_cast<int>(data.size()));
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// A loopback HTTPS origin for api.example.com with a certificate from its own test CA. Each
// connection: one request head read, recorded (the origin's log), answered with a body that
// echoes the request's Authorization header, then closed — or, `keep_alive`, every request
// head of the connection answered in turn until the client closes.
class tls_origin {
 public:
  explicit tls_origin(bool keep_alive = false) : ca_(make_ca()), keep_alive_(keep_alive) {
    const run_leaf* leaf = ca_->leaf_for("api.example.com");
    REQUIRE(leaf != nullptr);
    ctx_.reset(SSL_CTX_new(TLS_server_method()));
    REQUIRE(SSL_CTX_use_certificate(ctx_.get(), leaf->cert.get()) == 1);
    REQUIRE(SSL_CTX_use_PrivateKey(ctx_.get(), leaf->key.get()) == 1);
    fd_ = listen_loopback(port_);
    thread_ = std::thread([this] { serve(); });
  }
  ~tls_origin() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  tls_origin(const tls_origin&) = delete;
  tls_origin& operator=(const tls_origin&) = delete;

  std::uint16_t port() const { return port_; }
  const std::string& ca_pem() const { return ca_->cert_pem(); }
  std::size_t accepted() const { return accepted_; }
  // The request heads received (decrypted), waiting up to 10 s for `n`.
  std::vector<std::string> heads(std::size_t n) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, 10s, [&] { return heads_.size() >= n; });
    return heads_;
  }

 private:
  static std::unique_ptr<run_ca> make_ca() {
    std::string why;
    const std::vector<std::string> domains{"api.example.com"};
    auto ca = run_ca::create("origin-test-ca", domains, why);
    REQUIRE(ca != nullptr);
    return ca;
  }

  void serve() {
    // OpenSSL writes with write(2): a proxy that closed makes it EPIPE, not this process's end.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    while (!stop_) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ++accepted_;
      set_timeouts(c);
      ssl_ptr s(SSL_new(ctx_.get()));
      SSL_set_fd(s.get(), c);
      const bool accepted = SSL_accept(s.get()) == 1;
      if (accepted && keep_alive_) {
        serve_kept_alive(s.get());
      } else if (accepted) {
        std::string got;
        char buf[4096];
        while (got.find("\r\n\r\n") == std::string::npos) {
          const int n = SSL_read(s.get(), buf, sizeof(buf));
          if (n <= 0) break;
          got.append(buf, static_cast<std::size_t>(n));
        }
        std::string auth;
        if (const auto at = got.find("Authorization: "); at != std::string::npos) {
          auth = got.substr(at + 15, got.find("\r\n", at) - at - 15);
        }
        const std::string body = "you sent [" + auth + "]";
        if (got.find("\r\n\r\n") == std::string::npos) got.clear();  // no request came
        if (!got.empty())
          ssl_write_all(s.get(), "HTTP/1.1 200 OK\r\nX-Echo: " + auth + "\r\nContent-Length: " +
                                     std::to_string(body.size()) + "\r\n\r\n" + body);
        SSL_shutdown(s.get());
        if (!got.empty()) {
          std::lock_guard lock(m_);
          heads_.push_back(std::move(got));
          cv_.notify_all();
        }
      }
      ::close(c);
    }
  }

  void serve_kept_alive(SSL* s) {
    std::string buf;
    char chunk[4096];
    for (;;) {
      const auto end = buf.find("\r\n\r\n");
      if (end == std::string::npos) {
        const int n = SSL_read(s, chunk, sizeof(chunk));
        if (n <= 0) break;
        buf.append(chunk, static_cast<std::size_t>(n));
        continue;
      }
      std::string head = buf.substr(0, end + 4);
      buf.erase(0, end + 4);
      const std::string body = "kept alive";
      if (!ssl_write_all(s, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                                "\r\n\r\n" + body)) {
        break;
      }
      std::lock_guard lock(m_);
      heads_.push_back(std::move(head));
      cv_.notify_all();
    }
    SSL_shutdown(s);
  }

  std::unique_ptr<run_ca> ca_;
  bool keep_alive_ = false;
  ssl_ctx_ptr ctx_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> accepted_{0};
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::string> heads_;
};

// A grant for a run with the secret, its CA, and (when given) the origin's test CA trusted.
egress_grant secret_grant(std::uint16_t port, const std::shared_ptr<run_ca>& ca,
                          const std::string& origin_ca_file) {
  auto g = grant_for({"api.example.com", "other.example.com"}, port);
  g.secret_marks = placeholder_marks(std::vector<std::string>{tls_placeholder});
  g.secrets = {secret_injection{.placeholder = tls_placeholder,
                                .value = std::make_shared<const std::string>(tls_value),
                                .domains = {"api.example.com"},
                                .header_name = "Authorization",
                                .header_template = "Bearer {value}"}};
  g.ca = ca;
  g.origin_ca_file = origin_ca_file;
  return g;
}

std::shared_ptr<run_ca> run_ca_for_test() {
  std::string why;
  const std::vector<std::string> domains{"api.example.com", "other.example.com"};
  std::shared_ptr<run_ca> ca = run_ca::create("run-test", domains, why);
  REQUIRE(ca != nullptr);
  return ca;
}

// A PEM file for the proxy's origin_ca_file; removed with the object.
struct temp_pem {
  explicit temp_pem(const std::string& pem) {
    char name[] = "/tmp/egress-origin-ca-XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, pem.data(), pem.size()) == static_cast<ssize_t>(pem.size()));
    ::close(fd);
    path = name;
  }
  ~temp_pem() { ::unlink(path.c_str()); }
  std::string path;
};

// A client of the proxy: CONNECT, then TLS trusting only the run's CA, one request, the
// answer read to EOF. Empty when the tunnel or the handshake failed.
std::string https_exchange(std::uint16_t proxy_port, std::uint16_t origin_port, const run_ca& ca,
                           const std::string& request) {
  client c(proxy_port);
  const std::string authority = "api.example.com:" + std::to_string(origin_port);
  if (!c.send(connect_request(authority))) return {};
  if (c.read_head() != "HTTP/1.1 200 Connection established\r\n\r\n") return {};
  ssl_ctx_ptr ctx(SSL_CTX_new(TLS_client_method()));
  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca.cert());
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  ssl_ptr s(SSL_new(ctx.get()));
  SSL_set_tlsext_host_name(s.get(), "api.example.com");
  SSL_set1_host(s.get(), "api.example.com");
  SSL_set_fd(s.get(), c.fd());
  if (SSL_connect(s.get()) != 1) return {};
  if (!ssl_write_all(s.get(), request)) return {};
  return ssl_read_all(s.get());
}

// The body of a complete chunked response (what an HTTP client reads); empty when malformed.
std::string dechunked_body(const std::string& response) {
  std::size_t at = response.find("\r\n\r\n");
  if (at == std::string::npos) return {};
  at += 4;
  std::string body;
  for (;;) {
    const auto eol = response.find("\r\n", at);
    if (eol == std::string::npos) return {};
    const std::size_t size = std::stoul(response.substr(at, eol - at), nullptr, 16);
    if (size == 0) return body;
    body += response.substr(eol + 2, size);
    at = eol + 2 + size + 2;
  }
}

std::string api_get(const std::string& extra) {
  return "GET /v1/rates HTTP/1.1\r\nHost: api.example.com\r\n" + extra + "\r\n";
}

}  // namespace

TEST_CASE("egress proxy: with a secret, TLS is terminated and the value injected, echo redacted",
          "[egress][secrets]") {
  tls_origin web;
  const temp_pem origin_ca(web.ca_pem());
  const auto ca = run_ca_for_test();
  proxy_fixture p(secret_grant(web.port(), ca, origin_ca.path),
                  loopback_names({"api.example.com", "other.example.com"}));

  const std::string answer = https_exchange(
      p.port(), web.port(), *ca, api_get("Authorization: Bearer " + tls_placeholder + "\r\n"));
  // The origin saw the value in the configured header...
  const auto heads = web.heads(1);
  REQUIRE(heads.size() == 1);
  CHECK(heads[0].find("Authorization: Bearer " + tls_value + "\r\n") != std::string::npos);
  CHECK(heads[0].find(tls_placeholder) == std::string::npos);
  // ... and its echo of it (a header and the body) reached the program as the placeholder.
  INFO("answer: " << answer);
  CHECK(answer.starts_with("HTTP/1.1 200 OK\r\n"));
  CHECK(answer.find("X-Echo: Bearer " + tls_placeholder) != std::string::npos);
  CHECK(dechunked_body(answer) == "you sent [Bearer " + tls_placeholder + "]");
  CHECK(answer.find(tls_value) == std::string::npos);

  const auto attempts = p.attempts(1);
  REQUIRE(attempts.size() == 1);
  CHECK(attempts[0].allowed);
  CHECK(attempts[0].reason == "approved");
  CHECK(attempts[0].bytes_up > 0);
  CHECK(attempts[0].bytes_down > 0);
}

TEST_CASE("egress proxy: inside terminated TLS a placeholder elsewhere is secret_misuse",
          "[egress][secrets]") {
  tls_origin web;
  const temp_pem origin_ca(web.ca_pem());
  const auto ca = run_ca_for_test();
  proxy_fixture p(secret_grant(web.port(), ca, origin_ca.path),
                  loopback_names({"api.example.com"}));
  const std::vector<std::string> requests = {
      "GET /v1/" + tls_placeholder + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
      api_get("X-Api-Key: " + tls_placeholder + "\r\n"),
      "POST /v1 HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 43\r\n\r\n" + tls_placeholder,
  };
  for (std::size_t i = 0; i < requests.size(); ++i) {
    INFO(requests[i]);
    const auto answer = parse_answer(https_exchange(p.port(), web.port(), *ca, requests[i]));
    CHECK(answer.status == 403);
    REQUIRE(answer.body.is_object());
    CHECK(answer.body["reason"] == "secret_misuse");
  }
  const auto attempts = p.attempts(requests.size());
  REQUIRE(attempts.size() == requests.size());
  for (const auto& a : attempts) {
    CHECK_FALSE(a.allowed);
    CHECK(a.reason == "secret_misuse");
  }
  // The origin's log: TLS sessions were made (the origin is verified first), but no request
  // head ever arrived.
  CHECK(web.heads(0).empty());
}

TEST_CASE("egress proxy: an origin whose certificate does not verify is refused",
          "[egress][secrets]") {
  tls_origin web;  // its test CA is not trusted: no origin_ca_file
  const auto ca = run_ca_for_test();
  proxy_fixture p(secret_grant(web.port(), ca, ""), loopback_names({"api.example.com"}));
  const auto answer = parse_answer(https_exchange(
      p.port(), web.port(), *ca, api_get("Authorization: Bearer " + tls_placeholder + "\r\n")));
  CHECK(answer.status == 403);
  REQUIRE(answer.body.is_object());
  CHECK(answer.body["reason"] == "origin_unverified");
  const auto attempts = p.attempts(1);
  REQUIRE(attempts.size() == 1);
  CHECK_FALSE(attempts[0].allowed);
  CHECK(attempts[0].reason == "origin_unverified");
  CHECK(web.heads(0).empty());
}

TEST_CASE("egress proxy: without a run CA, a run's tunnels are relayed as they are",
          "[egress][secrets]") {
  // Secrets without a CA (a run whose CA could not be made) and runs without secrets: the
  // client's own TLS bytes reach the origin unchanged, nothing is terminated.
  origin tls(origin::mode::echo);
  auto g = grant_for({"api.example.com"}, tls.port());
  g.secret_marks = placeholder_marks(std::vector<std::string>{tls_placeholder});
  g.secrets = secret_grant(tls.port(), nullptr, "").secrets;
  proxy_fixture p(std::move(g), loopback_names({"api.example.com"}));
  client c(p.port());
  REQUIRE(c.send(connect_request("api.example.com:" + std::to_string(tls.port()))));
  CHECK(c.read_head() == "HTTP/1.1 200 Connection established\r\n\r\n");
  const auto hello = client_hello("api.example.com");
  REQUIRE(c.send(hello));
  CHECK(c.read_n(hello.size()) == to_string(hello));  // echoed: the origin got it as sent
  c.close();
  const auto attempts = p.attempts(1);
  REQUIRE(attempts.size() == 1);
  CHECK(attempts[0].allowed);
  CHECK(attempts[0].reason == "approved");
}

TEST_CASE("egress: origin_ca_file must be PEM certificates at an absolute path", "[egress]") {
  CHECK_FALSE(origin_ca_file_problem(""));
  const temp_pem good(run_ca_for_test()->cert_pem());
  CHECK_FALSE(origin_ca_file_problem(good.path));
  const temp_pem bad("not a certificate\n");
  CHECK(origin_ca_file_problem(bad.path).value_or("").find("no PEM certificate") !=
        std::string::npos);
  CHECK(origin_ca_file_problem("/nonexistent/ca.pem").has_value());
  CHECK(origin_ca_file_problem("ca.pem").value_or("").find("absolute") != std::string::npos);
}

// =============================================================================================
// L7 rules (core/egress/l7_rules.hpp): plain HTTP judged in the proxy, HTTPS judged inside
// the tunnel the run's CA terminates; the origins' own logs say what arrived.

namespace {

sandbox::egress_rule rates_rule(std::optional<std::uint64_t> max_requests = std::nullopt,
                                std::optional<std::uint64_t> max_bytes = std::nullopt) {
  return sandbox::egress_rule{.name = "rates-read",
                              .host = "api.example.com",
                              .methods = {"GET"},
                              .paths = {"/v1/rates/"},
                              .max_requests = max_requests,
                              .max_bytes = max_bytes};
}

// A run whose grant holds `rates_rule(2)` for api.example.com, a run CA, and a TLS origin
// whose test CA the proxy trusts: the proxy terminates HTTPS to judge every request.
struct rules_over_tls {
  tls_origin web;
  temp_pem origin_ca;
  std::shared_ptr<run_ca> ca;
  proxy_fixture p;

  explicit rules_over_tls(bool keep_alive = false)
      : web(keep_alive),
        origin_ca(web.ca_pem()),
        ca(run_ca_for_test()),
        p(grant(), loopback_names({"api.example.com"})) {}

 private:
  egress_grant grant() const {
    auto g = grant_for({"api.example.com"}, web.port());
    g.rules = {rates_rule(2)};
    g.ca = ca;
    g.origin_ca_file = origin_ca.path;
    return g;
  }
};

std::string plain_get(std::uint16_t port, const std::string& path,
                      const std::string& method = "GET") {
  const std::string authority = "api.example.com:" + std::to_string(port);
  return method + " http://" + authority + path + " HTTP/1.1\r\nHost: " + authority +
         "\r\nContent-Length: 0\r\n\r\n";
}

}  // namespace

TEST_CASE("egress proxy: L7 rules judge plain-HTTP requests before anything goes upstream",
          "[egress][egress_rules]") {
  origin web(origin::mode::http, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  auto g = grant_for({"api.example.com", "other.example.com"}, web.port());
  g.rules = {rates_rule(2)};
  proxy_fixture p(std::move(g), loopback_names({"api.example.com", "other.example.com"}));

  CHECK(ask(p.port(), plain_get(web.port(), "/v1/rates/eu")).status == 200);
  struct refused_case {
    std::string request, reason, path;
  };
  const std::vector<refused_case> refused = {
      {plain_get(web.port(), "/v1/rates/eu", "POST"), "rule_refused", "/v1/rates/eu"},
      {plain_get(web.port(), "/v1/admin"), "rule_refused", "/v1/admin"},
      {plain_get(web.port(), "/v1/rates/%2e%2e/admin"), "unsafe_path", "/v1/rates/%2e%2e/admin"},
      {plain_get(web.port(), "/v1/rates/%2E%2E/admin"), "unsafe_path", "/v1/rates/%2E%2E/admin"},
      {plain_get(web.port(), "/v1/rates/../admin"), "unsafe_path", "/v1/rates/../admin"},
  };
  for (const auto& r : refused) {
    CAPTURE(r.request);
    const auto answer = ask(p.port(), r.request);
    CHECK(answer.status == 403);
    REQUIRE(answer.body.is_object());
    CHECK(answer.body["error"] == "egress_denied");
    CHECK(answer.body["reason"] == r.reason);
    CHECK(answer.body["rule"] == "rates-read");
    CHECK(answer.body["advice"].get<std::string>().find(
              "rule 'rates-read' allows GET /v1/rates/") != std::string::npos);
  }
  CHECK(ask(p.port(), plain_get(web.port(), "/v1/rates/us")).status == 200);
  // The budget (2 requests) is spent.
  const auto spent = ask(p.port(), plain_get(web.port(), "/v1/rates/eu"));
  CHECK(spent.status == 403);
  REQUIRE(spent.body.is_object());
  CHECK(spent.body["reason"] == "budget_exhausted");
  CHECK(spent.body["rule"] == "rates-read");
  // Another host has no rules: anything goes, unrecorded by rules.
  const std::string other = "other.example.com:" + std::to_string(web.port());
  CHECK(ask(p.port(), "DELETE http://" + other + "/x/../y HTTP/1.1\r\nHost: " + other + "\r\n\r\n")
            .status == 200);

  // The origin's own log (in the order its connections finished): the two admitted GETs and
  // the unruled DELETE, nothing else.
  const auto seen = web.finished(3);
  REQUIRE(seen.size() == 3);
  std::vector<std::string> lines;
  for (const auto& got : seen) lines.push_back(got.substr(0, got.find("\r\n")));
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"DELETE /x/../y HTTP/1.1", "GET /v1/rates/eu HTTP/1.1",
                                          "GET /v1/rates/us HTTP/1.1"});
  CHECK(web.accepted() == 3);

  const auto attempts = p.attempts(9);
  REQUIRE(attempts.size() == 9);
  // Looked up by what was asked: sessions report as they close, not strictly in order.
  const auto find = [&](const std::string& method, const std::string& path,
                        const std::string& reason) -> const sandbox::egress_attempt* {
    for (const auto& a : attempts) {
      if (a.method == method && a.path == path && a.reason == reason) return &a;
    }
    return nullptr;
  };
  const auto* first = find("GET", "/v1/rates/eu", "approved");
  REQUIRE(first != nullptr);
  CHECK(first->allowed);
  CHECK(first->rule == "rates-read");
  CHECK(first->bytes_down > 0);
  for (const auto& r : refused) {
    CAPTURE(r.request);
    const auto* a = find(r.request.substr(0, r.request.find(' ')), r.path, r.reason);
    REQUIRE(a != nullptr);
    CHECK_FALSE(a->allowed);
    CHECK(a->rule == "rates-read");
    CHECK(a->bytes_up == 0);
  }
  CHECK(find("GET", "/v1/rates/us", "approved") != nullptr);
  const auto* over = find("GET", "/v1/rates/eu", "budget_exhausted");
  REQUIRE(over != nullptr);
  CHECK(over->rule == "rates-read");
  // No rule for that host: not judged, and recorded without method, path or rule.
  const auto* unruled = find("", "", "approved");
  REQUIRE(unruled != nullptr);
  CHECK(unruled->rule.empty());
}

TEST_CASE("egress proxy: a plain-HTTP response is cut at its rule's byte budget",
          "[egress][egress_rules]") {
  const std::string body(1000, 'x');
  origin web(origin::mode::http, "HTTP/1.1 200 OK\r\nContent-Length: " +
                                     std::to_string(body.size()) + "\r\n\r\n" + body);
  auto g = grant_for({"api.example.com"}, web.port());
  g.rules = {rates_rule(std::nullopt, 300)};
  proxy_fixture p(std::move(g), loopback_names({"api.example.com"}));
  client c(p.port());
  REQUIRE(c.send(plain_get(web.port(), "/v1/rates/big")));
  const std::string got = c.read_all();
  CHECK(got.size() == 300);  // head and body count alike: relayed unparsed
  const auto attempts = p.attempts(1);
  REQUIRE(attempts.size() == 1);
  CHECK_FALSE(attempts[0].allowed);
  CHECK(attempts[0].reason == "budget_exhausted");
  CHECK(attempts[0].bytes_down == 300);
  // Spent: the next request is refused.
  const auto next = ask(p.port(), plain_get(web.port(), "/v1/rates/big"));
  CHECK(next.status == 403);
  REQUIRE(next.body.is_object());
  CHECK(next.body["reason"] == "budget_exhausted");
}

TEST_CASE("egress proxy: with L7 rules, HTTPS is terminated and every request judged",
          "[egress][egress_rules]") {
  rules_over_tls f;
  auto& [web, origin_ca, ca, p] = f;
  const auto get_path = [](const std::string& method, const std::string& path) {
    return method + " " + path + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n";
  };
  // Allowed: reaches the origin (no secrets: terminated for the rules alone).
  const std::string answer =
      https_exchange(p.port(), web.port(), *ca, get_path("GET", "/v1/rates/eu"));
  CHECK(answer.starts_with("HTTP/1.1 200 OK\r\n"));
  auto heads = web.heads(1);
  REQUIRE(heads.size() == 1);
  CHECK(heads[0].rfind("GET /v1/rates/eu HTTP/1.1\r\n", 0) == 0);
  // Refused inside the tunnel: a 403 naming the rule; nothing reaches the origin.
  for (const auto& [req, reason] : std::vector<std::pair<std::string, std::string>>{
           {get_path("POST", "/v1/rates/eu"), "rule_refused"},
           {get_path("GET", "/v1/admin"), "rule_refused"},
           {get_path("GET", "/v1/rates/%2e%2e/admin"), "unsafe_path"},
           {get_path("GET", "/v1/rates/..%2Fadmin"), "unsafe_path"},
       }) {
    CAPTURE(req);
    const auto refused = parse_answer(https_exchange(p.port(), web.port(), *ca, req));
    CHECK(refused.status == 403);
    REQUIRE(refused.body.is_object());
    CHECK(refused.body["reason"] == reason);
    CHECK(refused.body["rule"] == "rates-read");
  }
  const auto attempts = p.attempts(5);
  REQUIRE(attempts.size() == 5);
  CHECK(attempts[0].protocol == "https");
  CHECK(attempts[0].allowed);
  CHECK(attempts[0].method == "GET");
  CHECK(attempts[0].path == "/v1/rates/eu");
  CHECK(attempts[0].rule == "rates-read");
  for (std::size_t i = 1; i <= 4; ++i) {
    CAPTURE(i);
    CHECK_FALSE(attempts[i].allowed);
    CHECK(attempts[i].rule == "rates-read");
    CHECK(attempts[i].bytes_up == 0);
  }
  CHECK(attempts[1].method == "POST");
  CHECK(attempts[2].path == "/v1/admin");
  CHECK(attempts[3].reason == "unsafe_path");
  CHECK(web.heads(2).size() == 1);
}

TEST_CASE("egress proxy: each request of a kept-alive tunnel under a rule is its own attempt",
          "[egress][egress_rules]") {
  rules_over_tls f(/*keep_alive=*/true);
  auto& [web, origin_ca, ca, p] = f;

  client c(p.port());
  REQUIRE(c.send(connect_request("api.example.com:" + std::to_string(web.port()))));
  REQUIRE(c.read_head() == "HTTP/1.1 200 Connection established\r\n\r\n");
  ssl_ctx_ptr ctx(SSL_CTX_new(TLS_client_method()));
  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca->cert());
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  ssl_ptr s(SSL_new(ctx.get()));
  SSL_set_tlsext_host_name(s.get(), "api.example.com");
  SSL_set1_host(s.get(), "api.example.com");
  SSL_set_fd(s.get(), c.fd());
  REQUIRE(SSL_connect(s.get()) == 1);
  const auto exchange = [&](const std::string& path) {
    REQUIRE(ssl_write_all(s.get(), "GET " + path + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n"));
    std::string out;
    char buf[4096];
    while (!out.ends_with("0\r\n\r\n")) {
      const int n = SSL_read(s.get(), buf, sizeof(buf));
      if (n <= 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
    return out;
  };
  CHECK(dechunked_body(exchange("/v1/rates/a")) == "kept alive");
  CHECK(dechunked_body(exchange("/v1/rates/b")) == "kept alive");
  // The third on the same connection: the rule's 2 requests are spent.
  REQUIRE(ssl_write_all(s.get(), "GET /v1/rates/c HTTP/1.1\r\nHost: api.example.com\r\n\r\n"));
  const auto refused = parse_answer(ssl_read_all(s.get()));
  CHECK(refused.status == 403);
  REQUIRE(refused.body.is_object());
  CHECK(refused.body["reason"] == "budget_exhausted");
  CHECK(refused.body["rule"] == "rates-read");
  c.close();

  const auto heads = web.heads(2);
  REQUIRE(heads.size() == 2);
  CHECK(heads[0].rfind("GET /v1/rates/a HTTP/1.1\r\n", 0) == 0);
  CHECK(heads[1].rfind("GET /v1/rates/b HTTP/1.1\r\n", 0) == 0);
  const auto attempts = p.attempts(3);
  REQUIRE(attempts.size() == 3);
  CHECK(attempts[0].allowed);
  CHECK(attempts[0].path == "/v1/rates/a");
  CHECK(attempts[0].bytes_down > 0);
  CHECK(attempts[1].allowed);
  CHECK(attempts[1].path == "/v1/rates/b");
  CHECK(attempts[1].bytes_down > 0);
  CHECK_FALSE(attempts[2].allowed);
  CHECK(attempts[2].reason == "budget_exhausted");
  CHECK(attempts[2].path == "/v1/rates/c");
  CHECK(attempts[2].rule == "rates-read");
  for (const auto& a : attempts) CHECK(a.protocol == "https");
}

TEST_CASE("egress proxy: without a run CA, HTTPS to a host with rules is refused",
          "[egress][egress_rules]") {
  origin tls(origin::mode::echo);
  auto g = grant_for({"api.example.com", "other.example.com"}, tls.port());
  g.rules = {rates_rule()};
  proxy_fixture p(std::move(g), loopback_names({"api.example.com", "other.example.com"}));
  const auto answer =
      ask(p.port(), connect_request("api.example.com:" + std::to_string(tls.port())));
  CHECK(answer.status == 403);
  REQUIRE(answer.body.is_object());
  CHECK(answer.body["reason"] == "rule_refused");
  // A host without rules keeps its plain tunnel.
  client c(p.port());
  REQUIRE(c.send(connect_request("other.example.com:" + std::to_string(tls.port()))));
  CHECK(c.read_head() == "HTTP/1.1 200 Connection established\r\n\r\n");
  c.close();
  const auto attempts = p.attempts(2);
  REQUIRE(attempts.size() == 2);
  CHECK(attempts[0].reason == "rule_refused");
  // Only the unruled tunnel reached the origin (its accept loop polls: give it a moment).
  for (int i = 0; i < 100 && tls.accepted() < 1; ++i) std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(100ms);
  CHECK(tls.accepted() == 1);
}
