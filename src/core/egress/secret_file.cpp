// Reading a secret's value from its root-only file (core/egress/secret_file.hpp).
#include "core/egress/secret_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "sandbox/secrets.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

secret_file_read read_secret_file(const std::string& path, uid_t owner) {
  auto refuse = [](std::string why) { return secret_file_read{{}, std::move(why)}; };
  if (path.empty() || path.front() != '/') return refuse("not an absolute path");
  // 1. Open without following a final link and without blocking on a FIFO: the checks below
  //    are then about the very file whose bytes are read (no check-then-open race).
  unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  if (!fd) {
    if (errno == ELOOP) return refuse("is a symbolic link");
    return refuse(std::string("cannot be opened: ") + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return refuse(std::string("fstat: ") + std::strerror(errno));
  // 2. A regular file, the host's own, that nobody else may read or write.
  if (!S_ISREG(st.st_mode)) return refuse("is not a regular file");
  if (st.st_uid != 0 && st.st_uid != owner) {
    return refuse("is owned by uid " + std::to_string(st.st_uid) + ", not by root or uid " +
                  std::to_string(owner));
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return refuse(std::string("is accessible to group or others (mode ") + mode +
                  "; chmod 600 it)");
  }
  if (st.st_size > static_cast<off_t>(max_secret_value_bytes + 2)) {
    return refuse("is larger than " + std::to_string(max_secret_value_bytes) + " bytes");
  }
  // 3. Read it all (bounded: a file that grows meanwhile is refused, not cut).
  std::string bytes(max_secret_value_bytes + 3, '\0');
  std::size_t have = 0;
  while (have < bytes.size()) {
    const ssize_t n = ::read(fd.get(), bytes.data() + have, bytes.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return refuse(std::string("read: ") + std::strerror(errno));
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  bytes.resize(have);
  if (bytes.ends_with("\r\n")) {
    bytes.resize(bytes.size() - 2);
  } else if (bytes.ends_with('\n')) {
    bytes.pop_back();
  }
  if (bytes.size() > max_secret_value_bytes) {
    return refuse("is larger than " + std::to_string(max_secret_value_bytes) + " bytes");
  }
  if (bytes.size() < min_secret_value_bytes) {
    return refuse("holds fewer than " + std::to_string(min_secret_value_bytes) + " bytes");
  }
  for (char c : bytes) {
    if (c < 0x20 || c > 0x7e) {
      return refuse("holds a byte that is not printable ASCII (one line, no control bytes)");
    }
  }
  if (bytes.front() == ' ' || bytes.back() == ' ') {
    return refuse("has leading or trailing spaces");
  }
  return secret_file_read{std::move(bytes), {}};
}

}  // namespace sandbox::detail
