// The daemon under a service manager (service/systemd.hpp). The protocols are the ones
// sd_listen_fds(3) and sd_notify(3) document; libsystemd is not a dependency.
#include "service/systemd.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "protocol/display_text.hpp"

namespace sandbox::service {
namespace {

constexpr const char* kListenVars[] = {"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"};

std::optional<std::string> take_var(const char* name) {
  const char* v = std::getenv(name);
  std::optional<std::string> out;
  if (v != nullptr) out = std::string(v);
  ::unsetenv(name);
  return out;
}

/// A decimal without sign, spaces or junk; nullopt otherwise (or past `max`).
std::optional<long> parse_decimal(const std::string& text, long max) {
  long v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || text.front() == '-' || text.front() == '+' || ec != std::errc() ||
      ptr != end || v > max) {
    return std::nullopt;
  }
  return v;
}

/// sd_listen_fds_with_names(3): a name is 1..255 printable ASCII characters, no ':'.
bool valid_fd_name(const std::string& name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    if (c < 0x20 || c > 0x7e || c == ':') return false;
  }
  return true;
}

std::string shown(const std::string& text) { return sandbox::detail::quote_name(text); }

}  // namespace

listen_env take_listen_env() {
  listen_env env;
  env.listen_pid = take_var(kListenVars[0]);
  env.listen_fds = take_var(kListenVars[1]);
  env.listen_fdnames = take_var(kListenVars[2]);
  return env;
}

std::variant<activated_socket, std::string> take_activated_socket(const listen_env& env, pid_t self,
                                                                  int first_fd) {
  // 1. The variables: meant for us, and exactly one descriptor.
  if (!env.listen_fds || !env.listen_pid) {
    return std::string(
        "--systemd-socket: not socket-activated ($LISTEN_FDS and $LISTEN_PID are not both "
        "set); start the daemon through its socket unit (deploy/systemd/agent-sandbox.socket) "
        "or give --socket PATH");
  }
  auto pid = parse_decimal(*env.listen_pid, 0x7fffffff);
  if (!pid || *pid <= 0) {
    return fmt::format("--systemd-socket: $LISTEN_PID is not a process id: {}",
                       shown(*env.listen_pid));
  }
  if (*pid != self) {
    return fmt::format(
        "--systemd-socket: $LISTEN_PID is {}, not this process ({}): the sockets were passed to "
        "another process (a wrapper that did not exec the daemon?); start sandboxctl directly "
        "in ExecStart=",
        *pid, self);
  }
  auto count = parse_decimal(*env.listen_fds, 0x7fffffff);
  if (!count) {
    return fmt::format("--systemd-socket: $LISTEN_FDS is not a number: {}", shown(*env.listen_fds));
  }
  if (*count != 1) {
    return fmt::format(
        "--systemd-socket: {} sockets passed ($LISTEN_FDS), expected exactly one: give the "
        "socket unit one ListenStream= (and Accept=no)",
        *count);
  }
  std::string name;
  if (env.listen_fdnames) {
    const std::string& names = *env.listen_fdnames;
    if (names.find(':') != std::string::npos) {
      return fmt::format("--systemd-socket: $LISTEN_FDNAMES names more than one socket: {}",
                         shown(names));
    }
    if (!valid_fd_name(names)) {
      return fmt::format(
          "--systemd-socket: $LISTEN_FDNAMES is not a valid name (1 to 255 printable "
          "characters): {}",
          shown(names));
    }
    name = names;
  }
  // 2. The descriptor: a listening unix stream socket (what the protocol is served on).
  const std::string which = fmt::format("--systemd-socket: descriptor {}{}", first_fd,
                                        name.empty() ? "" : " (" + shown(name) + ")");
  struct stat st {};
  if (::fstat(first_fd, &st) != 0) {
    return fmt::format("{}: fstat: {}", which, std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) return which + " is not a socket";
  int domain = 0, type = 0, listening = 0;
  socklen_t len = sizeof domain;
  if (::getsockopt(first_fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 || domain != AF_UNIX) {
    return which + " is not a unix socket: use ListenStream=/path in the socket unit";
  }
  len = sizeof type;
  if (::getsockopt(first_fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
    return which +
           " is not a stream socket: use ListenStream= (not ListenDatagram= or "
           "ListenSequentialPacket=)";
  }
  len = sizeof listening;
  if (::getsockopt(first_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) {
    return which + " is not listening: the socket unit must have Accept=no";
  }
  // 3. Ours now: never inherited by a child, and non-blocking for the accept loop.
  int fd_flags = ::fcntl(first_fd, F_GETFD);
  int fl_flags = ::fcntl(first_fd, F_GETFL);
  if (fd_flags < 0 || fl_flags < 0 || ::fcntl(first_fd, F_SETFD, fd_flags | FD_CLOEXEC) != 0 ||
      ::fcntl(first_fd, F_SETFL, fl_flags | O_NONBLOCK) != 0) {
    return fmt::format("{}: fcntl: {}", which, std::strerror(errno));
  }
  activated_socket out{.fd = first_fd, .name = name, .address = {}};
  sockaddr_un addr{};
  socklen_t alen = sizeof addr;
  if (::getsockname(first_fd, reinterpret_cast<sockaddr*>(&addr), &alen) == 0 &&
      alen > offsetof(sockaddr_un, sun_path) && addr.sun_path[0] != '\0') {
    out.address.assign(addr.sun_path, ::strnlen(addr.sun_path, sizeof addr.sun_path));
  }
  return out;
}

systemd_notifier::systemd_notifier() {
  if (auto v = take_var("NOTIFY_SOCKET")) address_ = *v;
}

std::string systemd_notifier::notify(const std::string& state) const {
  if (address_.empty()) return {};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // sd_notify(3): an absolute path, or '@' for the abstract namespace.
  if ((address_.front() != '/' && address_.front() != '@') ||
      address_.size() >= sizeof addr.sun_path) {
    return fmt::format("$NOTIFY_SOCKET is not a socket address: {}", shown(address_));
  }
  std::memcpy(addr.sun_path, address_.data(), address_.size());
  if (address_.front() == '@') addr.sun_path[0] = '\0';
  const auto alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size() +
                                           (address_.front() == '@' ? 0 : 1));
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fmt::format("socket(AF_UNIX, SOCK_DGRAM): {}", std::strerror(errno));
  ssize_t n = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                       reinterpret_cast<const sockaddr*>(&addr), alen);
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(state.size())) {
    return fmt::format("sendto({}): {}", shown(address_),
                       n < 0 ? std::strerror(err) : "short write");
  }
  return {};
}

}  // namespace sandbox::service
