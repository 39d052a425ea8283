// Serving one client on the daemon's own stdin/stdout (service/stdio_pumps.hpp).
#include "service/stdio_pumps.hpp"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <thread>

#include "sys/io.hpp"

namespace sandbox::service {
namespace {

/// Copies `src` to `dst` until end of input or an error; closes both.
void pump_in(int src, int dst) {
  std::array<char, 64 * 1024> buf{};
  for (;;) {
    ssize_t r = ::read(src, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || !sandbox::detail::write_all(dst, buf.data(), static_cast<std::size_t>(r))) break;
  }
  ::close(src);
  ::close(dst);
}

/// Copies `src` (our answers) to `dst` (the daemon's stdout) until `src` ends, or until the
/// reader of `dst` goes away (then closing `src` tells the connection: EPOLLERR).
void pump_out(int src, int dst) {
  std::array<char, 64 * 1024> buf{};
  for (;;) {
    std::array<pollfd, 2> p{pollfd{src, POLLIN, 0}, pollfd{dst, 0, 0}};
    int n = ::poll(p.data(), p.size(), -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (p[1].revents & (POLLHUP | POLLERR)) != 0) break;
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    ssize_t r = ::read(src, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || !sandbox::detail::write_all(dst, buf.data(), static_cast<std::size_t>(r))) break;
  }
  ::close(src);
  ::close(dst);
}

}  // namespace

std::string start_stdio_pumps(stdio_pipes& pipes) {
  // Private copies of stdin/stdout for the pumps.
  int src = ::fcntl(0, F_DUPFD_CLOEXEC, 3);
  int dst = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
  std::array<int, 2> in_pipe{-1, -1}, out_pipe{-1, -1};
  if (src < 0 || dst < 0 || ::pipe2(in_pipe.data(), O_CLOEXEC) != 0 ||
      ::pipe2(out_pipe.data(), O_CLOEXEC) != 0) {
    return std::string("cannot set up stdin/stdout: ") + std::strerror(errno);
  }
  int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::close(devnull);
  }
  std::thread(pump_in, src, in_pipe[1]).detach();
  std::packaged_task<void()> task([r = out_pipe[0], dst] { pump_out(r, dst); });
  pipes.out_done = task.get_future();
  std::thread(std::move(task)).detach();
  pipes.in = in_pipe[0];
  pipes.out = out_pipe[1];
  return {};
}

}  // namespace sandbox::service
