// Process descriptors (pidfd_open(2), pidfd_send_signal(2), waitid(P_PIDFD)), in one place
// for libc headers that predate them (private to src/). Header-only.
#pragma once

#include <signal.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#ifndef P_PIDFD
#define P_PIDFD static_cast<idtype_t>(3)  // <linux/wait.h>; glibc before 2.36 lacks it
#endif

namespace sandbox::detail {

/// pidfd_open(2) (Linux 5.3): a descriptor of process `pid`, close-on-exec; -1 with errno.
inline int pidfd_open(pid_t pid) noexcept {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

/// pidfd_send_signal(2) (Linux 5.1): `sig` to the process behind `pidfd`, which cannot have
/// been recycled into another process meanwhile. 0, or -1 with errno (ESRCH: it has exited).
inline int pidfd_send_signal(int pidfd, int sig) noexcept {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

/// pidfd_getfd(2) (Linux 5.6): a copy of descriptor `fd` of the process behind `pidfd`.
inline int pidfd_getfd(int pidfd, int fd) noexcept {
  return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
}

/// waitid(P_PIDFD, pidfd, ...) (Linux 5.4); `options` as waitid(2), e.g. WEXITED | WNOHANG.
/// Retries EINTR. 0 or -1 with errno, as waitid(2); with WNOHANG `info->si_pid` is 0 while
/// the child still runs.
inline int waitid_pidfd(int pidfd, siginfo_t* info, int options) noexcept {
  int r;
  do {
    r = ::waitid(P_PIDFD, static_cast<id_t>(pidfd), info, options);
  } while (r < 0 && errno == EINTR);
  return r;
}

/// True once the child behind `pidfd` is reaped now (it had exited) or is not ours to reap
/// (ECHILD: someone else's waitpid(-1) took it). Never blocks.
inline bool try_reap_pidfd(int pidfd) noexcept {
  siginfo_t si{};
  const int r = waitid_pidfd(pidfd, &si, WEXITED | WNOHANG);
  return (r == 0 && si.si_pid != 0) || (r < 0 && errno == ECHILD);
}

}  // namespace sandbox::detail
