// Whole-buffer writes (private to src/). Header-only and free of exceptions and Boost, so the
// static helpers (sandbox-init, the guest agent) use the same code as the host.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace sandbox::detail {

/**
 * Writes all `n` bytes of `data` to `fd`: retries EINTR and short writes, and on a
 * non-blocking descriptor (EAGAIN) waits for it to take more with poll(2). True when every
 * byte was written; false with `errno` set otherwise (EIO when nothing could be written).
 * A socket is written with send(MSG_NOSIGNAL), so a peer that went away is EPIPE, never a
 * SIGPIPE; any other descriptor with write(2) (a pipe's lost reader raises SIGPIPE unless
 * the caller ignores or blocks it).
 */
inline bool write_all(int fd, const void* data, std::size_t n) noexcept {
  const char* p = static_cast<const char*>(data);
  bool socket = true;  // until send(2) says ENOTSOCK
  while (n > 0) {
    const ssize_t w = socket ? ::send(fd, p, n, MSG_NOSIGNAL) : ::write(fd, p, n);
    if (w < 0) {
      if (socket && errno == ENOTSOCK) {
        socket = false;
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pfd{fd, POLLOUT, 0};
        (void)::poll(&pfd, 1, -1);
        continue;
      }
      return false;
    }
    if (w == 0) {
      errno = EIO;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace sandbox::detail
