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
#include <utility>
#include <vector>

#include "sandbox/error.hpp"

namespace sandbox::detail {

struct spawn_request {
  int exec_fd = -1;  ///< executable to run (execveat with AT_EMPTY_PATH); O_CLOEXEC is fine
  std::vector<std::string> argv;
  /// Descriptors that become 0, 1, 2, 3 (and 4 when `fd4` >= 0) in the child; every other
  /// descriptor is closed. The environment is empty.
  int fd0 = -1, fd1 = -1, fd2 = -1, fd3 = -1, fd4 = -1;
  /// Become 5, 6, … in the child (needs `fd4`; at most 7 of them).
  std::vector<int> extra_fds;
  /// When set, the child drops to this uid and `gid` (no supplementary group but
  /// `supplementary_gid` when set; no_new_privs) just before the exec: a VMM run as the
  /// run's own uid (backends/microvm). Root only.
  std::optional<uid_t> uid;
  gid_t gid = 0;
  std::optional<gid_t> supplementary_gid;
  /// SIGKILL the child when the thread that spawned it ends (PR_SET_PDEATHSIG, set after the
  /// identity change, which would clear it): a VMM whose supervisor was killed must not go on
  /// running (backends/microvm). The spawning thread must live as long as the child.
  bool die_with_parent = false;
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
  /// A root of the child's own, like Firecracker's jailer: with CLONE_NEWNS and
  /// CLONE_NEWPID, after every mount is made private, `dir` (a prepared host directory) is
  /// bind-mounted, each `binds` source (a host file, e.g. "/dev/null") bound onto its target
  /// (a path inside `dir` that exists, e.g. "dev/null") read-only and nosuid, a procfs of
  /// the child's new pid namespace mounted at `dir`/proc when `proc` (subset=pid: only the
  /// pid directories; nosuid, nodev, noexec), then pivot_root into it, the old root
  /// detached, and the new root remounted read-only, nosuid, nodev. The child then runs
  /// `exec_path` (a path inside the new root; `exec_fd` is not used and may be -1).
  struct root_switch {
    std::string dir;
    std::vector<std::pair<std::string, std::string>> binds;
    bool proc = true;
    std::string exec_path;
  };
  std::optional<root_switch> new_root;
  /// cgroup.procs files (descriptors open for writing) the child writes "0" to first of
  /// all, so it runs its first instruction in the run's cgroups (at most 8).
  std::vector<int> cgroup_procs_fds;
  /// A cgroup2 directory (a descriptor open on it) the child is created in:
  /// `clone3(CLONE_INTO_CGROUP)` (Linux 5.7+, clone(2)), so no migration (and none of its
  /// wait for an RCU grace period) is needed for that hierarchy. When clone3 refuses (an older
  /// kernel, a seccomp filter of the host's service manager, a cgroup that cannot take the
  /// process), the child is started by clone(2) instead and `spawned_process::in_cgroup` is
  /// false: the caller then moves it. -1: clone(2).
  int into_cgroup_fd = -1;
};

struct spawned_process {
  pid_t pid = -1;
  int pidfd = -1;  ///< O_CLOEXEC pidfd of the child (owned by the caller)
  /// True when the child was created in `spawn_request::into_cgroup_fd`'s cgroup.
  bool in_cgroup = false;
};

/// Starts the process. Errors: the errno of clone or of the child's setup/exec, as a
/// generic-category error code (e.g. EPERM when user namespaces are not allowed).
result<spawned_process> spawn_process(const spawn_request& req);

}  // namespace sandbox::detail
