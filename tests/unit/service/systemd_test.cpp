// Socket activation and readiness notification (service/systemd.hpp): every malformed or
// mismatched input is a clear one-line reason, never a crash or a descriptor taken by mistake;
// a good socket comes back close-on-exec and non-blocking; READY=1 reaches $NOTIFY_SOCKET.
#include "service/systemd.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "unit/test_files.hpp"

using sandbox::service::activated_socket;
using sandbox::service::listen_env;
using sandbox::service::systemd_notifier;
using sandbox::service::take_activated_socket;
using sandbox::service::take_listen_env;

namespace {

/// A unix socket bound to `path` (`listening`: listen(2) called too).
int unix_socket(const std::string& path, int type, bool listening) {
  int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof addr.sun_path);
  std::memcpy(addr.sun_path, path.data(), path.size());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  if (listening) REQUIRE(::listen(fd, 4) == 0);
  return fd;
}

listen_env env_for(pid_t pid, const std::string& fds = "1") {
  return {.listen_pid = std::to_string(pid), .listen_fds = fds, .listen_fdnames = std::nullopt};
}

/// The reason `take_activated_socket` gives (fails the test if it took the descriptor).
std::string refusal(const listen_env& env, int fd, pid_t self = ::getpid()) {
  auto r = take_activated_socket(env, self, fd);
  REQUIRE(std::holds_alternative<std::string>(r));
  return std::get<std::string>(r);
}

}  // namespace

TEST_CASE("systemd: a listening unix stream socket is taken, close-on-exec and non-blocking",
          "[service][systemd]") {
  sandbox::test::temp_dir dir;
  const std::string path = (dir.path / "s.sock").string();
  int fd = unix_socket(path, SOCK_STREAM, true);
  REQUIRE(::fcntl(fd, F_SETFD, 0) == 0);  // as inherited: no FD_CLOEXEC
  auto env = env_for(::getpid());
  env.listen_fdnames = "agent-sandbox.socket";
  auto r = take_activated_socket(env, ::getpid(), fd);
  REQUIRE(std::holds_alternative<activated_socket>(r));
  const auto& s = std::get<activated_socket>(r);
  CHECK(s.fd == fd);
  CHECK(s.name == "agent-sandbox.socket");
  CHECK(s.address == path);
  CHECK((::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
  ::close(fd);
}

TEST_CASE("systemd: variables meant for another process, or malformed, are refused",
          "[service][systemd]") {
  sandbox::test::temp_dir dir;
  int fd = unix_socket((dir.path / "s.sock").string(), SOCK_STREAM, true);
  const pid_t self = ::getpid();
  CHECK_THAT(refusal({}, fd), Catch::Contains("not socket-activated"));
  CHECK_THAT(refusal({.listen_pid = std::nullopt, .listen_fds = "1", .listen_fdnames = {}}, fd),
             Catch::Contains("not socket-activated"));
  // Another process's (a wrapper that forked instead of exec'ing the daemon).
  CHECK_THAT(refusal(env_for(self + 1), fd), Catch::Contains("not this process"));
  for (const char* bad : {"", "abc", "-1", "+5", "0", " 12", "12 ", "99999999999999999999"}) {
    INFO("LISTEN_PID=" << bad);
    CHECK_THAT(refusal({.listen_pid = bad, .listen_fds = "1", .listen_fdnames = {}}, fd),
               Catch::Contains("LISTEN_PID"));
  }
  // Count: exactly one.
  CHECK_THAT(refusal(env_for(self, "0"), fd), Catch::Contains("0 sockets passed"));
  CHECK_THAT(refusal(env_for(self, "2"), fd), Catch::Contains("2 sockets passed"));
  for (const char* bad : {"", "one", "-1", "1x", "99999999999999999999"}) {
    INFO("LISTEN_FDS=" << bad);
    CHECK_THAT(refusal(env_for(self, bad), fd), Catch::Contains("LISTEN_FDS"));
  }
  // Names: one valid name for the one socket.
  auto named = [&](const std::string& names) {
    auto env = env_for(self);
    env.listen_fdnames = names;
    return refusal(env, fd);
  };
  CHECK_THAT(named("a:b"), Catch::Contains("more than one socket"));
  CHECK_THAT(named(""), Catch::Contains("not a valid name"));
  CHECK_THAT(named(std::string(256, 'n')), Catch::Contains("not a valid name"));
  CHECK_THAT(named("bad\nname"), Catch::Contains("not a valid name"));
  // Nothing was taken: the descriptor is as it was (still open, still blocking).
  CHECK((::fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
  ::close(fd);
}

TEST_CASE("systemd: a descriptor that is not a listening unix stream socket is refused",
          "[service][systemd]") {
  sandbox::test::temp_dir dir;
  const auto env = env_for(::getpid());
  SECTION("not open") {
    int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::close(fd);
    CHECK_THAT(refusal(env, fd), Catch::Contains("fstat"));
  }
  SECTION("not a socket") {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    CHECK_THAT(refusal(env, p[0]), Catch::Contains("is not a socket"));
    ::close(p[0]);
    ::close(p[1]);
  }
  SECTION("not listening") {
    int fd = unix_socket((dir.path / "s.sock").string(), SOCK_STREAM, false);
    CHECK_THAT(refusal(env, fd), Catch::Contains("is not listening"));
    ::close(fd);
  }
  SECTION("a datagram socket") {
    int fd = unix_socket((dir.path / "d.sock").string(), SOCK_DGRAM, false);
    CHECK_THAT(refusal(env, fd), Catch::Contains("not a stream socket"));
    ::close(fd);
  }
  SECTION("not a unix socket") {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    CHECK_THAT(refusal(env, fd), Catch::Contains("not a unix socket"));
    ::close(fd);
  }
}

TEST_CASE("systemd: take_listen_env reads and unsets the variables", "[service][systemd]") {
  ::setenv("LISTEN_PID", "42", 1);
  ::setenv("LISTEN_FDS", "1", 1);
  ::setenv("LISTEN_FDNAMES", "serve", 1);
  auto env = take_listen_env();
  CHECK(env.listen_pid == "42");
  CHECK(env.listen_fds == "1");
  CHECK(env.listen_fdnames == "serve");
  CHECK(std::getenv("LISTEN_PID") == nullptr);
  CHECK(std::getenv("LISTEN_FDS") == nullptr);
  CHECK(std::getenv("LISTEN_FDNAMES") == nullptr);
  auto none = take_listen_env();
  CHECK_FALSE(none.listen_pid.has_value());
  CHECK_FALSE(none.listen_fds.has_value());
}

TEST_CASE("systemd: READY=1 reaches $NOTIFY_SOCKET as one datagram; the variable is unset",
          "[service][systemd]") {
  sandbox::test::temp_dir dir;
  SECTION("a path") {
    const std::string path = (dir.path / "notify").string();
    int rx = unix_socket(path, SOCK_DGRAM, false);
    ::setenv("NOTIFY_SOCKET", path.c_str(), 1);
    const systemd_notifier n;
    CHECK(std::getenv("NOTIFY_SOCKET") == nullptr);
    CHECK(n.active());
    CHECK(n.notify("READY=1").empty());
    char buf[64] = {};
    ssize_t got = ::recv(rx, buf, sizeof buf, MSG_DONTWAIT);
    CHECK(std::string(buf, got > 0 ? static_cast<std::size_t>(got) : 0) == "READY=1");
    ::close(rx);
  }
  SECTION("nobody listening: a reason, not a crash") {
    ::setenv("NOTIFY_SOCKET", (dir.path / "absent").c_str(), 1);
    const systemd_notifier n;
    CHECK_THAT(n.notify("READY=1"), Catch::Contains("sendto"));
  }
  SECTION("not an address") {
    ::setenv("NOTIFY_SOCKET", "relative/path", 1);
    const systemd_notifier n;
    CHECK_THAT(n.notify("READY=1"), Catch::Contains("not a socket address"));
  }
  SECTION("unset: nothing to do") {
    ::unsetenv("NOTIFY_SOCKET");
    const systemd_notifier n;
    CHECK_FALSE(n.active());
    CHECK(n.notify("READY=1").empty());
  }
}
