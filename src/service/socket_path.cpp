// The daemon's unix socket on disk (service/socket_path.hpp).
#include "service/socket_path.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "protocol/display_text.hpp"

namespace sandbox::service {
namespace {

std::string quoted(const std::filesystem::path& path) {
  return sandbox::detail::quote_name(path.string());
}

sockaddr_un address_of(const std::filesystem::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.string().size());
  return addr;
}

}  // namespace

std::string clear_socket_path(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return fmt::format("cannot inspect {}: {}", quoted(path), std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return fmt::format("{} exists and is not a socket; refusing to replace it", quoted(path));
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fmt::format("socket: {}", std::strerror(errno));
  sockaddr_un addr = address_of(path);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int err = errno;
  ::close(fd);
  if (rc == 0) return fmt::format("another server is listening on {}", quoted(path));
  if (err != ECONNREFUSED) {
    return fmt::format("{} is a socket that cannot be probed: {}", quoted(path),
                       std::strerror(err));
  }
  // Stale: nobody listens. Remove it, unless it was replaced meanwhile.
  struct stat again {};
  if (::lstat(path.c_str(), &again) == 0 && again.st_ino == st.st_ino &&
      again.st_dev == st.st_dev && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return fmt::format("cannot remove the stale socket {}: {}", quoted(path), std::strerror(errno));
  }
  return {};
}

int bind_socket(const std::filesystem::path& path, struct stat& st, std::string& why) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    why = fmt::format("socket: {}", std::strerror(errno));
    return -1;
  }
  sockaddr_un addr = address_of(path);
  // The file is created owner-only (umask 077: never more open than intended, not even for
  // an instant), then widened to the group.
  mode_t old = ::umask(077);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int err = errno;
  ::umask(old);
  if (rc != 0) {
    why = fmt::format("cannot bind {}: {}", quoted(path), std::strerror(err));
    ::close(fd);
    return -1;
  }
  if (::chmod(path.c_str(), 0660) != 0 || ::lstat(path.c_str(), &st) != 0 ||
      !S_ISSOCK(st.st_mode)) {
    why = fmt::format("cannot set the mode of {}: {}", quoted(path), std::strerror(errno));
    ::unlink(path.c_str());
    ::close(fd);
    return -1;
  }
  if (::listen(fd, 128) != 0) {
    why = fmt::format("listen: {}", std::strerror(errno));
    ::unlink(path.c_str());
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace sandbox::service
