// Decoding sandbox-init's messages (core/run/init_events.hpp): each kind reaches its call,
// descriptors are handed over or closed on every path (none leaks), and hostile types and
// out-of-range values are ignored or described, never trusted.
#include "core/run/init_events.hpp"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

namespace sd = sandbox::detail;
namespace ip = sd::init_protocol;

/// Records every call as a line; keeps the descriptors it was handed (as the run would).
struct recorder final : sd::init_events {
  std::vector<std::string> calls;
  std::vector<int> got;  ///< the descriptors handed over, in order (-1: none)
  std::vector<sd::unique_fd> kept;

  void keep(sd::unique_fd fd) {
    got.push_back(fd.get());
    kept.push_back(std::move(fd));
  }
  void ready(sd::unique_fd out_dir, sd::unique_fd dns) override {
    calls.push_back("ready");
    keep(std::move(out_dir));
    keep(std::move(dns));
  }
  void egress_proxy(sd::unique_fd listener) override {
    calls.push_back("egress_proxy");
    keep(std::move(listener));
  }
  void started(std::string_view init_times, sd::unique_fd listener) override {
    calls.push_back("started " + std::string(init_times));
    keep(std::move(listener));
  }
  void exited(int status) override { calls.push_back("exited " + std::to_string(status)); }
  void dns(std::string_view payload) override { calls.push_back("dns " + std::string(payload)); }
  void quiet() override { calls.push_back("quiet"); }
  void stdin_ack(std::uint32_t bytes) override {
    calls.push_back("stdin_ack " + std::to_string(bytes));
  }
  void stdin_closed() override { calls.push_back("stdin_closed"); }
  void failed(const std::string& text, bool preload_raised) override {
    calls.push_back(std::string(preload_raised ? "failed(preload) " : "failed ") + text);
  }
  void agent_frame(const ip::init_header& h, std::string_view payload) override {
    calls.push_back("agent_frame " + std::to_string(static_cast<std::uint32_t>(h.type)) + " " +
                    std::string(payload));
  }
  void protocol_error(const std::string& text) override {
    calls.push_back("protocol_error " + text);
  }
};

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

/// `n` fresh descriptors (eventfds), closed by the test if the dispatcher left them open.
/// Declared before the recorder: what the recorder kept closes first.
struct fd_set_guard {
  std::vector<int> fds, original;
  explicit fd_set_guard(int n) {
    for (int i = 0; i < n; ++i) fds.push_back(::eventfd(0, EFD_CLOEXEC));
    original = fds;
  }
  ~fd_set_guard() {
    for (int fd : original) {
      if (is_open(fd)) ::close(fd);
    }
  }
};

ip::init_header header(ip::msg type, std::uint32_t a = 0, std::int64_t b = 0) {
  return {.type = type, .a = a, .b = b};
}

constexpr sd::init_channel_shape packet{.stream_control = false, .guest_agent = false};
constexpr sd::init_channel_shape stream{.stream_control = true, .guest_agent = false};
constexpr sd::init_channel_shape with_guest{.stream_control = true, .guest_agent = true};

/// Dispatches and checks that every entry of the span was taken.
void dispatch(ip::init_header h, std::string_view payload, fd_set_guard& g,
              sd::init_channel_shape shape, recorder& r) {
  sd::dispatch_init_message(h, payload, g.fds, shape, r);
  for (int fd : g.fds) CHECK(fd == -1);
}

}  // namespace

TEST_CASE("init events: ready hands over the output dir and the DNS sink, closes the rest",
          "[init_events]") {
  fd_set_guard g(3);
  recorder r;
  dispatch(header(ip::msg::ready), "", g, packet, r);
  CHECK(r.calls == std::vector<std::string>{"ready"});
  CHECK(r.got == std::vector<int>{g.original[0], g.original[1]});
  CHECK(is_open(g.original[0]));
  CHECK(is_open(g.original[1]));
  CHECK_FALSE(is_open(g.original[2]));  // an extra descriptor is closed
}

TEST_CASE("init events: ready without descriptors hands over none", "[init_events]") {
  fd_set_guard g(0);
  recorder r;
  dispatch(header(ip::msg::ready), "", g, stream, r);
  CHECK(r.calls == std::vector<std::string>{"ready"});
  CHECK(r.got == std::vector<int>{-1, -1});
}

TEST_CASE("init events: egress_proxy needs its listener", "[init_events]") {
  SECTION("with one") {
    fd_set_guard g(2);
    recorder r;
    dispatch(header(ip::msg::egress_proxy), "", g, packet, r);
    CHECK(r.calls == std::vector<std::string>{"egress_proxy"});
    CHECK(r.got == std::vector<int>{g.original[0]});
    CHECK_FALSE(is_open(g.original[1]));
  }
  SECTION("without") {
    fd_set_guard g(0);
    recorder r;
    dispatch(header(ip::msg::egress_proxy), "", g, packet, r);
    CHECK(r.calls == std::vector<std::string>{
                         "protocol_error unexpected egress proxy socket from sandbox-init"});
  }
}

TEST_CASE("init events: started needs a seccomp listener unless stream-controlled",
          "[init_events]") {
  SECTION("packet mode with the listener (and an extra descriptor)") {
    fd_set_guard g(2);
    recorder r;
    dispatch(header(ip::msg::started), "t=1", g, packet, r);
    CHECK(r.calls == std::vector<std::string>{"started t=1"});
    CHECK(r.got == std::vector<int>{g.original[0]});
    CHECK(is_open(g.original[0]));
    CHECK_FALSE(is_open(g.original[1]));
  }
  SECTION("packet mode without: a protocol error") {
    fd_set_guard g(0);
    recorder r;
    dispatch(header(ip::msg::started), "", g, packet, r);
    CHECK(r.calls ==
          std::vector<std::string>{"protocol_error no seccomp listener from sandbox-init"});
  }
  SECTION("stream mode without: started, no listener") {
    fd_set_guard g(0);
    recorder r;
    dispatch(header(ip::msg::started), "", g, stream, r);
    CHECK(r.calls == std::vector<std::string>{"started "});
    CHECK(r.got == std::vector<int>{-1});
  }
}

TEST_CASE("init events: exited carries the wait status as sent", "[init_events]") {
  fd_set_guard g(1);
  recorder r;
  dispatch(header(ip::msg::exited, 256), "", g, packet, r);
  dispatch(header(ip::msg::exited, std::numeric_limits<std::uint32_t>::max()), "", g, packet, r);
  CHECK(r.calls == std::vector<std::string>{"exited 256", "exited -1"});
  CHECK_FALSE(is_open(g.original[0]));  // no message but ready, egress_proxy, started keeps one
}

TEST_CASE("init events: dns and quiet only in stream mode", "[init_events]") {
  SECTION("stream mode") {
    fd_set_guard g(1);
    recorder r;
    dispatch(header(ip::msg::dns), "example.com", g, stream, r);
    dispatch(header(ip::msg::quiet), "", g, stream, r);
    CHECK(r.calls == std::vector<std::string>{"dns example.com", "quiet"});
    CHECK_FALSE(is_open(g.original[0]));
  }
  SECTION("packet mode: ignored (the host serves the sink, the pipes' end counts)") {
    fd_set_guard g(1);
    recorder r;
    dispatch(header(ip::msg::dns), "example.com", g, packet, r);
    dispatch(header(ip::msg::quiet), "", g, packet, r);
    CHECK(r.calls.empty());
    CHECK_FALSE(is_open(g.original[0]));
  }
}

TEST_CASE("init events: stdin acknowledgements pass through unchecked", "[init_events]") {
  fd_set_guard g(0);
  recorder r;
  dispatch(header(ip::msg::stdin_ack, std::numeric_limits<std::uint32_t>::max()), "", g, stream, r);
  dispatch(header(ip::msg::stdin_closed), "", g, stream, r);
  CHECK(r.calls == std::vector<std::string>{"stdin_ack 4294967295", "stdin_closed"});
}

TEST_CASE("init events: failed names the step and the errno, out-of-range ones too",
          "[init_events]") {
  fd_set_guard g(1);
  recorder r;
  dispatch(header(ip::msg::failed, static_cast<std::uint32_t>(ip::step::seccomp), EPERM), "seccomp",
           g, packet, r);
  dispatch(header(ip::msg::failed, 0xFFFFFFFF, std::numeric_limits<std::int64_t>::max()), "x", g,
           packet, r);
  REQUIRE(r.calls.size() == 2);
  CHECK(r.calls[0].starts_with("failed sandbox-init step 'seccomp' ("));
  CHECK(r.calls[0].find("seccomp filter") != std::string::npos);
  CHECK(r.calls[0].ends_with(std::string(": ") + std::strerror(EPERM)));
  CHECK(r.calls[1].starts_with("failed sandbox-init step 'x' ("));
  CHECK_FALSE(is_open(g.original[0]));
}

TEST_CASE("init events: a failed step's detail, and a preload import that raised",
          "[init_events]") {
  fd_set_guard g(0);
  recorder r;
  using namespace std::string_view_literals;
  const auto pre = static_cast<std::uint32_t>(ip::step::prestart);
  // The loader's report: errno 0, "<module>\n<summary>" (from inside: shown escaped).
  dispatch(header(ip::msg::failed, pre, 0),
           "prestart\0no_such_mod\nModuleNotFoundError: No module named 'no_such_mod'"sv, g, packet,
           r);
  // Died before it was ready: sandbox-init's own text.
  dispatch(header(ip::msg::failed, pre, ECHILD),
           "prestart\0the interpreter was killed by signal 9 before it was ready"sv, g, packet, r);
  // A report with control characters and a bidi override is shown escaped.
  dispatch(header(ip::msg::failed, pre, 0), "prestart\0m\nE: a\x1b[2Jb\u202e"sv, g, packet, r);
  // Without a detail: the errno, as before.
  dispatch(header(ip::msg::failed, pre, ECHILD), "prestart", g, packet, r);
  REQUIRE(r.calls.size() == 4);
  CHECK(r.calls[0] ==
        "failed(preload) sandbox-init step 'prestart' (pre-starting the interpreter and importing "
        "its preload list) failed: importing preload module 'no_such_mod' raised "
        "'ModuleNotFoundError: No module named 'no_such_mod''");
  CHECK(r.calls[1].starts_with("failed sandbox-init step 'prestart' ("));
  CHECK(r.calls[1].ends_with(": 'the interpreter was killed by signal 9 before it was ready'"));
  CHECK(r.calls[2].starts_with("failed(preload) "));
  CHECK(r.calls[2].ends_with("raised 'E: a\\x1b[2Jb\\u202e'"));
  CHECK(r.calls[3].starts_with("failed sandbox-init step 'prestart' ("));
  CHECK(r.calls[3].ends_with(std::string(": ") + std::strerror(ECHILD)));
}

TEST_CASE("init events: agent frames need a guest agent", "[init_events]") {
  SECTION("with one") {
    fd_set_guard g(1);
    recorder r;
    dispatch(header(static_cast<ip::msg>(100)), "frame", g, with_guest, r);
    dispatch(header(static_cast<ip::msg>(0xFFFFFFFF)), "", g, with_guest, r);
    CHECK(r.calls == std::vector<std::string>{"agent_frame 100 frame", "agent_frame 4294967295 "});
    CHECK_FALSE(is_open(g.original[0]));
  }
  SECTION("without: a protocol error") {
    fd_set_guard g(1);
    recorder r;
    dispatch(header(static_cast<ip::msg>(100)), "frame", g, stream, r);
    CHECK(r.calls == std::vector<std::string>{
                         "protocol_error unexpected agent message on the control channel"});
    CHECK_FALSE(is_open(g.original[0]));
  }
}

TEST_CASE("init events: kinds sandbox-init never sends are ignored, descriptors closed",
          "[init_events]") {
  for (std::uint32_t type : {0u, 1u, 2u, 3u, 4u, 9u, 19u, 99u}) {
    fd_set_guard g(2);
    recorder r;
    dispatch(header(static_cast<ip::msg>(type)), "junk", g, with_guest, r);
    CHECK(r.calls.empty());
    CHECK_FALSE(is_open(g.original[0]));
    CHECK_FALSE(is_open(g.original[1]));
  }
}
