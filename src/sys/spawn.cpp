#include "sys/spawn.hpp"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "sys/pidfd.hpp"

// clone3 with a child stack (CLONE_VM): the child starts on the new stack at the system
// call's return, where no C++ frame of the parent is valid, so it is entered here and calls
// `fn(arg)` itself, then exits with its return value (as glibc's clone does). x86-64 only,
// like the rest of the project. Returns the child's pid in the parent, or -errno.
//   long sandbox_detail_clone3(void* cl_args, unsigned long size, int (*fn)(void*), void* arg)
extern "C" long sandbox_detail_clone3(void* cl_args, unsigned long size, int (*fn)(void*),
                                      void* arg);
asm(R"(
  .pushsection .text
  .p2align 4
  .globl sandbox_detail_clone3
  .hidden sandbox_detail_clone3
  .type sandbox_detail_clone3, @function
sandbox_detail_clone3:
  .cfi_startproc
  movq %rdx, %r8
  movq %rcx, %r9
  movl $435, %eax
  syscall
  testq %rax, %rax
  jz 1f
  ret
1:
  .cfi_undefined rip
  xorl %ebp, %ebp
  movq %r9, %rdi
  callq *%r8
  movl %eax, %edi
  movl $60, %eax
  syscall
  hlt
  .cfi_endproc
  .size sandbox_detail_clone3, .-sandbox_detail_clone3
  .popsection
)");

namespace sandbox::detail {
namespace {

// struct clone_args of linux/sched.h (the CLONE_INTO_CGROUP version, 88 bytes), declared here
// so that the kernel's header and glibc's <sched.h> need not be mixed.
struct clone3_args {
  std::uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
};
static_assert(sizeof(clone3_args) == 88);
constexpr std::uint64_t clone_into_cgroup = 0x200000000ULL;  // CLONE_INTO_CGROUP
static_assert(SYS_clone3 == 435);

struct child_args {
  int exec_fd;
  char* const* argv;
  char* const* envp;
  int src[12];
  int nfds;
  long uid, gid;         // -1: keep the parent's
  bool die_with_parent;  // PR_SET_PDEATHSIG SIGKILL after the identity change
  long supplementary;    // -1: none
  rlimit fsize;          // rlim_cur 0: unchanged
  bool ambient_caps;
  const char* detach_mount;  // or nullptr
  int netns_fd;              // or -1
  int cg_fds[8];             // cgroup.procs descriptors to write "0" to
  int ncg;
  // The root switch (spawn_request::new_root): host paths prepared beforehand.
  const char* root_dir;  // or nullptr
  const char* const* bind_src;
  const char* const* bind_dst;  // absolute host paths under root_dir
  int nbinds;
  const char* proc_dir;   // root_dir + "/proc", or nullptr
  const char* exec_path;  // inside the new root
  std::atomic<int> err;   // written by the child (shared memory), read after it exec'd or died
};

long raw(long nr, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0) {
  return syscall(nr, a, b, c, d, e);
}

// The root switch of spawn_request::new_root, in the child (system calls only). False with
// errno set.
bool switch_root(const child_args* a) {
  auto mnt = [](const char* src, const char* dst, const char* type, unsigned long flags,
                const char* data) {
    return raw(SYS_mount, reinterpret_cast<long>(src), reinterpret_cast<long>(dst),
               reinterpret_cast<long>(type), static_cast<long>(flags),
               reinterpret_cast<long>(data)) == 0;
  };
  const unsigned long ro = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID;
  if (!mnt(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) ||
      !mnt(a->root_dir, a->root_dir, nullptr, MS_BIND, nullptr)) {
    return false;
  }
  for (int i = 0; i < a->nbinds; ++i) {
    if (!mnt(a->bind_src[i], a->bind_dst[i], nullptr, MS_BIND, nullptr) ||
        !mnt(nullptr, a->bind_dst[i], nullptr, ro | MS_NOEXEC, nullptr)) {
      return false;
    }
  }
  if (a->proc_dir != nullptr &&
      !mnt("proc", a->proc_dir, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "subset=pid")) {
    return false;
  }
  // pivot_root(".", "."): the old root ends up stacked on the new one, then is detached.
  if (raw(SYS_chdir, reinterpret_cast<long>(a->root_dir)) < 0 ||
      raw(SYS_pivot_root, reinterpret_cast<long>("."), reinterpret_cast<long>(".")) < 0 ||
      raw(SYS_umount2, reinterpret_cast<long>("."), MNT_DETACH) < 0 ||
      raw(SYS_chdir, reinterpret_cast<long>("/")) < 0) {
    return false;
  }
  return mnt(nullptr, "/", nullptr, ro | MS_NODEV, nullptr);
}

// Runs in the child on its own stack, sharing the parent's memory and (until exec) the calling
// thread's TLS: only system calls, no allocation, no locks. The parent thread is suspended
// (CLONE_VFORK) until exec or exit, so writing errno and `err` cannot race with it.
int child_fn(void* p) {
  auto* a = static_cast<child_args*>(p);
  // The run's network namespace first: its descriptor number may be one the shuffle below
  // reuses.
  if (a->netns_fd >= 0 && raw(SYS_setns, a->netns_fd, CLONE_NEWNET) < 0) {
    a->err.store(errno);
    raw(SYS_exit_group, 127);
  }
  // Into the run's cgroups before anything else of it runs.
  for (int i = 0; i < a->ncg; ++i) {
    if (raw(SYS_write, a->cg_fds[i], reinterpret_cast<long>("0"), 1) != 1) {
      a->err.store(errno);
      raw(SYS_exit_group, 127);
    }
  }
  // Move every source above the target range first, so dup2 never clobbers a source.
  int tmp[12];
  for (int i = 0; i < a->nfds; ++i) {
    tmp[i] = static_cast<int>(raw(SYS_fcntl, a->src[i], F_DUPFD, 16));
    if (tmp[i] < 0) {
      a->err.store(errno);
      raw(SYS_exit_group, 127);
    }
  }
  int exec_fd = a->exec_path != nullptr
                    ? -1
                    : static_cast<int>(raw(SYS_fcntl, a->exec_fd, F_DUPFD_CLOEXEC, 16));
  if (exec_fd < 0 && a->exec_path == nullptr) {
    a->err.store(errno);
    raw(SYS_exit_group, 127);
  }
  for (int i = 0; i < a->nfds; ++i) {
    if (raw(SYS_dup2, tmp[i], i) < 0) {
      a->err.store(errno);
      raw(SYS_exit_group, 127);
    }
  }
  // A process that created a user namespace holds every capability in it, but execve as a
  // uid that is not 0 there would drop them all. Raising them into the ambient set keeps
  // them across the exec of sandbox-init, which needs them to build the sandbox (and whose
  // child drops every one before running user code).
  if (a->ambient_caps) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (raw(SYS_capget, reinterpret_cast<long>(&hdr), reinterpret_cast<long>(data)) < 0) {
      a->err.store(errno);
      raw(SYS_exit_group, 127);
    }
    data[0].inheritable = data[0].permitted;
    data[1].inheritable = data[1].permitted;
    if (raw(SYS_capset, reinterpret_cast<long>(&hdr), reinterpret_cast<long>(data)) < 0) {
      a->err.store(errno);
      raw(SYS_exit_group, 127);
    }
    for (int cap = 0; cap <= 63; ++cap) {
      bool held =
          cap < 32 ? (data[0].permitted >> cap) & 1U : (data[1].permitted >> (cap - 32)) & 1U;
      if (held) raw(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0);
    }
  }
  if (a->detach_mount != nullptr) {
    if (raw(SYS_mount, 0, reinterpret_cast<long>("/"), 0, MS_REC | MS_PRIVATE, 0) < 0 ||
        raw(SYS_umount2, reinterpret_cast<long>(a->detach_mount), MNT_DETACH) < 0) {
      a->err.store(errno);
      raw(SYS_exit_group, 127);
    }
  }
  if (a->root_dir != nullptr && !switch_root(a)) {
    a->err.store(errno);
    raw(SYS_exit_group, 127);
  }
  // Another identity (a VMM run as the run's uid): groups, gid, then uid — in that order,
  // since dropping the uid first would forbid the rest — and no way back through exec.
  if (a->uid >= 0) {
    gid_t groups[1] = {static_cast<gid_t>(a->supplementary)};
    if (raw(SYS_setgroups, a->supplementary >= 0 ? 1 : 0, reinterpret_cast<long>(groups)) < 0 ||
        raw(SYS_setresgid, a->gid, a->gid, a->gid) < 0 ||
        raw(SYS_setresuid, a->uid, a->uid, a->uid) < 0 ||
        raw(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
      a->err.store(errno);
      raw(SYS_exit_group, 127);
    }
  }
  // After the identity change (which clears it); kept across the exec (QEMU is not set-id).
  if (a->die_with_parent && raw(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) {
    a->err.store(errno);
    raw(SYS_exit_group, 127);
  }
  if (a->fsize.rlim_cur > 0 &&
      raw(SYS_prlimit64, 0, RLIMIT_FSIZE, reinterpret_cast<long>(&a->fsize), 0) < 0) {
    a->err.store(errno);
    raw(SYS_exit_group, 127);
  }
  if (a->exec_path != nullptr) {
    raw(SYS_close_range, a->nfds, ~0U, 0);
    raw(SYS_execve, reinterpret_cast<long>(a->exec_path), reinterpret_cast<long>(a->argv),
        reinterpret_cast<long>(a->envp));
    a->err.store(errno != 0 ? errno : ENOEXEC);
    raw(SYS_exit_group, 127);
  }
  // Close everything else except the executable's descriptor, which exec closes itself.
  raw(SYS_close_range, a->nfds, exec_fd - 1, 0);
  raw(SYS_close_range, exec_fd + 1, ~0U, 0);
  raw(SYS_execveat, exec_fd, reinterpret_cast<long>(""), reinterpret_cast<long>(a->argv),
      reinterpret_cast<long>(a->envp), AT_EMPTY_PATH);
  a->err.store(errno != 0 ? errno : ENOEXEC);
  raw(SYS_exit_group, 127);
  return 127;
}

}  // namespace

result<spawned_process> spawn_process(const spawn_request& req) {
  std::vector<char*> argv;
  for (const auto& s : req.argv) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  char* envp[] = {nullptr};

  child_args args{};
  args.exec_fd = req.exec_fd;
  args.argv = argv.data();
  args.envp = envp;
  args.src[0] = req.fd0;
  args.src[1] = req.fd1;
  args.src[2] = req.fd2;
  args.src[3] = req.fd3;
  args.src[4] = req.fd4;
  args.nfds = req.fd4 >= 0 ? 5 : 4;
  if ((!req.extra_fds.empty() && req.fd4 < 0) || req.extra_fds.size() > 7) {
    return boost::system::error_code(EINVAL, boost::system::generic_category());
  }
  for (int fd : req.extra_fds) args.src[args.nfds++] = fd;
  args.uid = req.uid ? static_cast<long>(*req.uid) : -1;
  args.die_with_parent = req.die_with_parent;
  args.gid = req.uid ? static_cast<long>(req.gid) : -1;
  args.supplementary = req.supplementary_gid ? static_cast<long>(*req.supplementary_gid) : -1;
  args.fsize = {static_cast<rlim_t>(req.fsize_bytes), static_cast<rlim_t>(req.fsize_bytes)};
  args.ambient_caps = (req.clone_flags & CLONE_NEWUSER) != 0;
  args.detach_mount = req.detach_mount.empty() ? nullptr : req.detach_mount.c_str();
  if (args.detach_mount != nullptr && (req.clone_flags & CLONE_NEWNS) == 0) {
    return boost::system::error_code(EINVAL, boost::system::generic_category());
  }
  args.netns_fd = req.netns_fd;
  if (req.netns_fd >= 0 && (req.clone_flags & CLONE_NEWNET) != 0) {
    return boost::system::error_code(EINVAL, boost::system::generic_category());
  }
  if (req.cgroup_procs_fds.size() > 8) {
    return boost::system::error_code(EINVAL, boost::system::generic_category());
  }
  args.ncg = static_cast<int>(req.cgroup_procs_fds.size());
  for (int i = 0; i < args.ncg; ++i)
    args.cg_fds[i] = req.cgroup_procs_fds[static_cast<std::size_t>(i)];
  std::vector<std::string> bind_dst;
  std::vector<const char*> bind_src_p, bind_dst_p;
  std::string proc_dir;
  if (req.new_root) {
    const auto& nr = *req.new_root;
    constexpr unsigned long need = CLONE_NEWNS | CLONE_NEWPID;
    if ((req.clone_flags & need) != need || nr.dir.empty() || nr.dir[0] != '/' ||
        nr.exec_path.empty() || nr.exec_path[0] != '/' || !req.detach_mount.empty()) {
      return boost::system::error_code(EINVAL, boost::system::generic_category());
    }
    for (const auto& [src, dst] : nr.binds) {
      if (src.empty() || src[0] != '/' || dst.empty() || dst[0] == '/' ||
          dst.find("..") != std::string::npos) {
        return boost::system::error_code(EINVAL, boost::system::generic_category());
      }
      bind_dst.push_back(nr.dir + "/" + dst);
    }
    for (std::size_t i = 0; i < nr.binds.size(); ++i) {
      bind_src_p.push_back(nr.binds[i].first.c_str());
      bind_dst_p.push_back(bind_dst[i].c_str());
    }
    if (nr.proc) proc_dir = nr.dir + "/proc";
    args.root_dir = nr.dir.c_str();
    args.bind_src = bind_src_p.data();
    args.bind_dst = bind_dst_p.data();
    args.nbinds = static_cast<int>(nr.binds.size());
    args.proc_dir = nr.proc ? proc_dir.c_str() : nullptr;
    args.exec_path = nr.exec_path.c_str();
  }
  args.err.store(0);

  constexpr std::size_t stack_size = 64 * 1024;
  void* stack = mmap(nullptr, stack_size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED)
    return boost::system::error_code(errno, boost::system::generic_category());
  int pidfd = -1;
  pid_t pid = -1;
  int clone_errno = 0;
  bool in_cgroup = false;
  if (req.into_cgroup_fd >= 0) {
    clone3_args ca{};
    ca.flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | clone_into_cgroup | req.clone_flags;
    ca.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
    ca.exit_signal = SIGCHLD;
    ca.stack = reinterpret_cast<std::uint64_t>(stack);
    ca.stack_size = stack_size;
    ca.cgroup = static_cast<std::uint64_t>(req.into_cgroup_fd);
    const long r = sandbox_detail_clone3(&ca, sizeof ca, child_fn, &args);
    if (r > 0) {
      pid = static_cast<pid_t>(r);
      in_cgroup = true;
    }
    // Refused (ENOSYS, E2BIG, EINVAL on an older kernel; EPERM from a host filter; EBUSY,
    // EOPNOTSUPP, EACCES for the cgroup): no child exists; clone(2) below, moved by the caller.
  }
  if (pid < 0) {
    int flags = static_cast<int>(CLONE_VM | CLONE_VFORK | CLONE_PIDFD | req.clone_flags) | SIGCHLD;
    pid = clone(child_fn, static_cast<char*>(stack) + stack_size, flags, &args, &pidfd);
    clone_errno = errno;
  }
  munmap(stack, stack_size);
  if (pid < 0) return boost::system::error_code(clone_errno, boost::system::generic_category());
  fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  if (int e = args.err.load(); e != 0) {
    // The child failed before or at exec and has exited: reap it.
    siginfo_t si{};
    waitid_pidfd(pidfd, &si, WEXITED);
    close(pidfd);
    return boost::system::error_code(e, boost::system::generic_category());
  }
  return spawned_process{.pid = pid, .pidfd = pidfd, .in_cgroup = in_cgroup};
}

}  // namespace sandbox::detail
