// The host's end of a microvm network run's egress tunnel (backends/microvm/net_relay.hpp,
// wire/guest_protocol.hpp "The egress tunnel"). The test plays a hostile guest on the port's
// other end: every rule broken must end the relay with a fault (never a crash or a hang),
// frames that merely cross a close are ignored, and whatever the guest does the relay holds
// no more than the windows allow.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "backends/microvm/net_relay.hpp"
#include "wire/guest_protocol.hpp"

namespace {

namespace asio = boost::asio;
namespace gp = sandbox::detail::guest_protocol;
namespace ip = sandbox::detail::init_protocol;
using sandbox::detail::net_relay;

std::string frame(std::uint32_t type, std::uint32_t id, std::int64_t b = 0,
                  std::string_view payload = {}) {
  ip::init_header h{static_cast<ip::msg>(type), id, b};
  auto len = static_cast<std::uint32_t>(sizeof h + payload.size());
  std::string f(reinterpret_cast<const char*>(&len), sizeof len);
  f.append(reinterpret_cast<const char*>(&h), sizeof h);
  f.append(payload);
  return f;
}
std::string frame(gp::net_msg t, std::uint32_t id, std::int64_t b = 0, std::string_view p = {}) {
  return frame(static_cast<std::uint32_t>(t), id, b, p);
}

// A TCP listener on 127.0.0.1 (ephemeral port). `echo`: a thread accepts and echoes every
// connection (shutting down its write side at EOF); otherwise the accept queue is full (one
// unaccepted connection, backlog 0), so connects to it never complete and nothing is ever
// written to the proxy.
struct proxy {
  int listener = -1, filler = -1;
  std::uint16_t port = 0;
  std::thread th;
  std::atomic<bool> quit{false};
  explicit proxy(bool echo) {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener, echo ? 128 : 0) == 0);
    socklen_t l = sizeof a;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &l);
    port = ntohs(a.sin_port);
    if (!echo) {
      filler = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      REQUIRE(::connect(filler, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
      return;
    }
    th = std::thread([this] {
      std::vector<std::thread> conns;
      for (;;) {
        pollfd p{listener, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) {
          if (quit) break;
          continue;
        }
        int c = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        conns.emplace_back([c] {
          char buf[65536];
          for (;;) {
            ssize_t n = ::read(c, buf, sizeof buf);
            if (n <= 0) break;
            for (ssize_t off = 0; off < n;) {
              ssize_t w = ::write(c, buf + off, static_cast<std::size_t>(n - off));
              if (w <= 0) break;
              off += w;
            }
          }
          ::shutdown(c, SHUT_WR);
          ::close(c);
        });
      }
      for (auto& t : conns) t.join();
    });
  }
  ~proxy() {
    quit = true;
    if (th.joinable()) th.join();
    ::close(listener);
    if (filler >= 0) ::close(filler);
  }
};

struct fixture {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread runner;
  int guest = -1;  // the guest's end of the port
  std::shared_ptr<net_relay> relay;
  std::mutex mu;
  std::string fault;
  std::atomic<int> faults{0};
  std::string in;  // bytes read from the port, not yet parsed

  explicit fixture(std::uint16_t proxy_port) {
    int sp[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
    guest = sp[0];
    relay = net_relay::start(
        asio::make_strand(io.get_executor()), sp[1],
        [](std::string* why) {
          int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
          if (fd < 0) *why = "socket";
          return fd;
        },
        asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), proxy_port),
        [this](std::string why) {
          std::lock_guard lock(mu);
          fault = std::move(why);
          ++faults;
        });
    runner = std::thread([this] { io.run(); });
  }
  ~fixture() {
    relay->stop();
    work.reset();
    runner.join();
    ::close(guest);
  }
  void send(const std::string& bytes) {
    for (std::size_t off = 0; off < bytes.size();) {
      ssize_t n = ::send(guest, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the relay closed the port (after a fault)
      off += static_cast<std::size_t>(n);
    }
  }
  // Waits (bounded, generously: not a timing assertion) until `pred` holds.
  template <class P>
  bool wait_for(P pred) {
    for (int i = 0; i < 6000 && !pred(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return pred();
  }
  std::string fault_reason() {
    std::lock_guard lock(mu);
    return fault;
  }
  // The relay ended with a fault naming `what`.
  void expect_fault(std::string_view what) {
    REQUIRE(wait_for([&] { return faults.load() == 1; }));
    CHECK(relay->stopped());
    CHECK(fault_reason().find(what) != std::string::npos);
    CHECK(relay->connections() == 0);
    // The port is closed: the guest reads EOF (after anything already queued).
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(guest, buf, sizeof buf);
      if (n <= 0) break;
    }
  }
  // Reads one frame from the port (blocking, bounded by a 30 s poll): false at EOF.
  bool read_frame(ip::init_header* h, std::string* payload) {
    for (;;) {
      if (in.size() >= 4) {
        std::uint32_t len;
        std::memcpy(&len, in.data(), 4);
        REQUIRE(len >= sizeof(ip::init_header));
        REQUIRE(len <= sizeof(ip::init_header) + gp::net_chunk);
        if (in.size() >= 4 + len) {
          std::memcpy(h, in.data() + 4, sizeof *h);
          payload->assign(in, 4 + sizeof *h, len - sizeof *h);
          in.erase(0, 4 + len);
          return true;
        }
      }
      pollfd p{guest, POLLIN, 0};
      if (::poll(&p, 1, 30000) <= 0) return false;
      char buf[65536];
      ssize_t n = ::read(guest, buf, sizeof buf);
      if (n <= 0) return false;
      in.append(buf, static_cast<std::size_t>(n));
    }
  }
};

std::uint32_t t(gp::net_msg m) { return static_cast<std::uint32_t>(m); }

}  // namespace

TEST_CASE("net relay: a connection carries bytes both ways, half-close and close",
          "[microvm][net]") {
  proxy echo(true);
  fixture f(echo.port);
  f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::data, 1, 0, "hello ") +
         frame(gp::net_msg::data, 1, 0, "world") + frame(gp::net_msg::eof, 1));
  std::string got;
  std::int64_t acked = 0;
  bool eof = false, closed = false;
  ip::init_header h{};
  std::string p;
  while (!closed && f.read_frame(&h, &p)) {
    REQUIRE(h.a == 1);
    const auto type = static_cast<std::uint32_t>(h.type);
    if (type == t(gp::net_msg::data)) {
      CHECK_FALSE(eof);
      got += p;
      // The guest acknowledges what it "wrote", as the agent does.
      f.send(frame(gp::net_msg::ack, 1, static_cast<std::int64_t>(p.size())));
    } else if (type == t(gp::net_msg::ack)) {
      acked += h.b;
    } else if (type == t(gp::net_msg::eof)) {
      eof = true;
    } else if (type == t(gp::net_msg::close)) {
      closed = true;
    } else {
      FAIL("unexpected frame type " << type);
    }
  }
  CHECK(got == "hello world");
  CHECK(acked == 11);
  CHECK(eof);
  CHECK(closed);
  CHECK(f.faults == 0);
  CHECK(f.wait_for([&] { return f.relay->connections() == 0; }));
}

TEST_CASE("net relay: hostile frames end the relay with a fault", "[microvm][net]") {
  proxy stalled(false);  // connects never complete: nothing is written or acknowledged
  fixture f(stalled.port);
  const std::string chunk(gp::net_chunk, 'x');
  SECTION("data for an id never opened") {
    f.send(frame(gp::net_msg::data, 1, 0, "x"));
    f.expect_fault("unopened id 1");
  }
  SECTION("an ack for an id never opened") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::ack, 7, 1));
    f.expect_fault("unopened id 7");
  }
  SECTION("id 0") {
    f.send(frame(gp::net_msg::open, 0));
    f.expect_fault("reused or out of order");
  }
  SECTION("an id opened twice") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::open, 1));
    f.expect_fault("reused or out of order");
  }
  SECTION("ids out of order") {
    f.send(frame(gp::net_msg::open, 5) + frame(gp::net_msg::open, 4));
    f.expect_fault("reused or out of order");
  }
  SECTION("an id reused after its close") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::close, 1) +
           frame(gp::net_msg::data, 1, 0, "late: ignored") + frame(gp::net_msg::open, 1));
    f.expect_fault("reused or out of order");
  }
  SECTION("an oversized frame") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::data, 1, 0, chunk + "y"));
    f.expect_fault("net frame of");
  }
  SECTION("a length shorter than the header") {
    std::uint32_t len = 3;
    f.send(std::string(reinterpret_cast<const char*>(&len), 4) + "abc");
    f.expect_fault("net frame of 3 bytes");
  }
  SECTION("a huge length (never buffered)") {
    std::uint32_t len = 0xFFFFFFF0u;
    f.send(std::string(reinterpret_cast<const char*>(&len), 4));
    f.expect_fault("net frame of");
  }
  SECTION("data past the window") {
    std::string s = frame(gp::net_msg::open, 1);
    for (std::uint32_t i = 0; i < gp::net_window / gp::net_chunk; ++i)
      s += frame(gp::net_msg::data, 1, 0, chunk);
    f.send(s);
    f.send(frame(gp::net_msg::data, 1, 0, "1"));
    f.expect_fault("past the window");
  }
  SECTION("data after eof") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::eof, 1) +
           frame(gp::net_msg::data, 1, 0, "x"));
    f.expect_fault("data after eof");
  }
  SECTION("eof twice") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::eof, 1) + frame(gp::net_msg::eof, 1));
    f.expect_fault("eof twice");
  }
  SECTION("empty data") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::data, 1));
    f.expect_fault("empty net data");
  }
  SECTION("an ack for bytes never sent") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::ack, 1, 1));
    f.expect_fault("ack beyond");
  }
  SECTION("a negative ack") {
    f.send(frame(gp::net_msg::open, 1) + frame(gp::net_msg::ack, 1, -5));
    f.expect_fault("ack beyond");
  }
  SECTION("an unknown frame type") {
    f.send(frame(gp::net_msg::open, 1) + frame(101, 1));
    f.expect_fault("unknown net frame type 101");
  }
  SECTION("an open with a payload") {
    f.send(frame(gp::net_msg::open, 1, 0, "x"));
    f.expect_fault("open with a payload");
  }
  SECTION("more connections than the cap") {
    std::string s;
    for (std::uint32_t id = 1; id <= gp::net_max_connections + 1; ++id)
      s += frame(gp::net_msg::open, id);
    f.send(s);
    f.expect_fault("net connections at once");
  }
}

TEST_CASE("net relay: frames that cross a close are ignored; closed ids free their slot",
          "[microvm][net]") {
  proxy stalled(false);
  fixture f(stalled.port);
  std::string s;
  // Twice the cap over time, never more than the cap at once.
  for (std::uint32_t id = 1; id <= 2 * gp::net_max_connections; ++id) {
    s += frame(gp::net_msg::open, id) + frame(gp::net_msg::data, id, 0, "abc") +
         frame(gp::net_msg::close, id) + frame(gp::net_msg::data, id, 0, "late") +
         frame(gp::net_msg::ack, id, 1);
  }
  f.send(s);
  f.send(frame(gp::net_msg::open, 1000));
  CHECK(f.wait_for([&] { return f.relay->connections() == 1; }));
  CHECK(f.faults == 0);
  CHECK_FALSE(f.relay->stopped());
}

TEST_CASE("net relay: a flood stays within the windows, even from a guest that never reads",
          "[microvm][net]") {
  proxy echo(true);
  fixture f(echo.port);
  const std::string chunk(gp::net_chunk, 'z');
  // Every connection the cap allows, each sent a full window (echoed back by the proxy). A
  // thread sends (the relay stops reading the port while the guest leaves its backlog
  // unread, so these writes wait); the guest reads nothing until the backlog is over its cap.
  std::thread sender([&f, &chunk] {
    std::string s;
    for (std::uint32_t id = 1; id <= gp::net_max_connections; ++id)
      s += frame(gp::net_msg::open, id);
    f.send(s);
    for (std::uint32_t id = 1; id <= gp::net_max_connections; ++id) {
      s.clear();
      for (std::uint32_t i = 0; i < gp::net_window / gp::net_chunk; ++i)
        s += frame(gp::net_msg::data, id, 0, chunk);
      f.send(s);
    }
  });
  CHECK(f.wait_for([&] { return f.relay->peak_buffered() > net_relay::max_backlog; }));
  // The relay's own holdings: at most a window per connection and direction, the port's
  // backlog cap and one read of the port.
  const std::size_t bound = std::size_t{gp::net_max_connections} * (2 * gp::net_window + 1024) +
                            net_relay::max_backlog + 65536 + 2 * (gp::net_chunk + 64);
  // Now read everything: each connection's window comes back whole, in order.
  std::map<std::uint32_t, std::size_t> back;
  std::size_t total = 0;
  ip::init_header h{};
  std::string p;
  const std::size_t want = std::size_t{gp::net_max_connections} * gp::net_window;
  while (total < want && f.read_frame(&h, &p)) {
    if (static_cast<std::uint32_t>(h.type) != t(gp::net_msg::data)) continue;
    REQUIRE(p.find_first_not_of('z') == std::string::npos);
    back[h.a] += p.size();
    total += p.size();
    // (No acks: a window per connection is all the proxy echoes; the sender thread owns the
    // port's write side.)
  }
  sender.join();
  CHECK(total == want);
  CHECK(back.size() == gp::net_max_connections);
  CHECK(f.faults == 0);
  CHECK(f.relay->peak_buffered() <= bound);
  CHECK(f.relay->peak_buffered() > 0);
}
