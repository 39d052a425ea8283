// Starting sandbox-init from the multithreaded host (private to src/).
//
// Why our own spawn: the host is multithreaded, so nothing but async-signal-safe code may run
// between clone and exec; Boost.Process v2's launchers also call `notify_fork` on the Asio
// context in the child, which re-registers reactor descriptors while other threads use them.
// We use glibc's clone() with CLONE_VM | CLONE_VFORK (like posix_spawn: no copy of the host's
// address space, the parent thread waits until exec), CLONE_PIDFD, and the namespace flags,
// so sandbox-init starts life as PID 1 of its own namespaces. The child only rearranges
// descriptors and calls execveat — raw system calls on memory prepared beforehand.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/error.hpp"

namespace sandbox::detail {

struct spawn_request {
  int exec_fd = -1;  ///< executable to run (execveat with AT_EMPTY_PATH); O_CLOEXEC is fine
  std::vector<std::string> argv;
  /// Descriptors that become 0, 1, 2, 3 (and 4 when `fd4` >= 0) in the child; every other
  /// descriptor is closed. The environment is empty.
  int fd0 = -1, fd1 = -1, fd2 = -1, fd3 = -1, fd4 = -1;
  /// Become 5, 6, … in the child (needs `fd4`; at most 5 of them).
  std::vector<int> extra_fds;
  /// When set, the child drops to this uid and `gid` (no supplementary group but
  /// `supplementary_gid` when set; no_new_privs) just before the exec: a VMM run as the
  /// run's own uid (backends/microvm). Root only.
  std::optional<uid_t> uid;
  gid_t gid = 0;
  std::optional<gid_t> supplementary_gid;
  /// > 0: RLIMIT_FSIZE of the child, bytes (a log it writes cannot fill the disk).
  std::uint64_t fsize_bytes = 0;
  /// CLONE_NEW* flags. With CLONE_NEWUSER the child keeps its capabilities in the new user
  /// namespace across the exec (raised into the ambient set; see spawn.cpp).
  unsigned long clone_flags = 0;
  /// With CLONE_NEWNS: make every mount private in the new namespace, then detach this mount
  /// (e.g. "/sys/fs/cgroup/unified", so crun sees a pure cgroup v1 host). Empty: nothing.
  std::string detach_mount;
  /// A network namespace (an nsfs descriptor) the child joins (setns(2)) before anything
  /// else; -1: the parent's, or a new one with CLONE_NEWNET.
  int netns_fd = -1;
};

struct spawned_process {
  pid_t pid = -1;
  int pidfd = -1;  ///< O_CLOEXEC pidfd of the child (owned by the caller)
};

/// Starts the process. Errors: the errno of clone or of the child's setup/exec, as a
/// generic-category error code (e.g. EPERM when user namespaces are not allowed).
result<spawned_process> spawn_process(const spawn_request& req);

}  // namespace sandbox::detail
