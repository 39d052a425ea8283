// The seccomp filter of process-level runs. See seccomp_policy.hpp for the shape and
// seccomp(2), seccomp_unotify(2) and libseccomp's seccomp_rule_add(3) for the mechanisms.
#include "core/seccomp_policy.hpp"

#include <errno.h>
#include <linux/audit.h>
#include <sched.h>
#include <seccomp.h>

#include <cstdlib>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <array>
#include <string_view>

namespace sandbox::detail {
namespace {

using T = seccomp_treatment;

// clang-format off
constexpr std::array rules{
    // --- violations: recorded by the host, run killed ------------------------------------
    seccomp_rule_info{"ptrace", T::violation, 0, "inspect or control other processes"},
    seccomp_rule_info{"process_vm_readv", T::violation, 0, "read another process's memory"},
    seccomp_rule_info{"process_vm_writev", T::violation, 0, "write another process's memory"},
    seccomp_rule_info{"bpf", T::violation, 0, "kernel attack surface (eBPF)"},
    seccomp_rule_info{"perf_event_open", T::violation, 0, "kernel attack surface, side channels"},
    seccomp_rule_info{"userfaultfd", T::violation, 0, "used to win kernel races"},
    seccomp_rule_info{"kexec_load", T::violation, 0, "replace the kernel"},
    seccomp_rule_info{"kexec_file_load", T::violation, 0, "replace the kernel"},
    seccomp_rule_info{"init_module", T::violation, 0, "load kernel code"},
    seccomp_rule_info{"finit_module", T::violation, 0, "load kernel code"},
    seccomp_rule_info{"delete_module", T::violation, 0, "unload kernel code"},
    seccomp_rule_info{"open_by_handle_at", T::violation, 0, "escape the mount namespace (shocker)"},
    seccomp_rule_info{"iopl", T::violation, 0, "raw I/O port access"},
    seccomp_rule_info{"ioperm", T::violation, 0, "raw I/O port access"},
    seccomp_rule_info{"reboot", T::violation, 0, "host control"},
    seccomp_rule_info{"swapon", T::violation, 0, "host control"},
    seccomp_rule_info{"swapoff", T::violation, 0, "host control"},
    seccomp_rule_info{"acct", T::violation, 0, "host control"},
    // --- errno: refused, the program may go on -------------------------------------------
    seccomp_rule_info{"io_uring_setup", T::errno_value, ENOSYS, "io_uring bypasses seccomp; ENOSYS makes libuv fall back"},
    seccomp_rule_info{"io_uring_enter", T::errno_value, ENOSYS, "io_uring bypasses seccomp"},
    seccomp_rule_info{"io_uring_register", T::errno_value, ENOSYS, "io_uring bypasses seccomp"},
    seccomp_rule_info{"clone3", T::errno_value, ENOSYS, "flags are behind a pointer BPF cannot read; ENOSYS makes glibc use clone"},
    seccomp_rule_info{"unshare", T::errno_value, EPERM, "no new namespaces"},
    seccomp_rule_info{"setns", T::errno_value, EPERM, "no joining namespaces"},
    seccomp_rule_info{"mount", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"umount2", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"pivot_root", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"chroot", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"open_tree", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"move_mount", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"fsopen", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"fsconfig", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"fsmount", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"fspick", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"mount_setattr", T::errno_value, EPERM, "mount table is fixed"},
    seccomp_rule_info{"keyctl", T::errno_value, EPERM, "kernel keyrings are not namespaced"},
    seccomp_rule_info{"add_key", T::errno_value, EPERM, "kernel keyrings are not namespaced"},
    seccomp_rule_info{"request_key", T::errno_value, EPERM, "kernel keyrings are not namespaced"},
    seccomp_rule_info{"name_to_handle_at", T::errno_value, EPERM, "file handles (see open_by_handle_at)"},
    seccomp_rule_info{"fanotify_init", T::errno_value, EPERM, "watch the filesystem"},
    seccomp_rule_info{"kcmp", T::errno_value, EPERM, "compare kernel objects of other processes"},
    seccomp_rule_info{"pidfd_getfd", T::errno_value, EPERM, "take descriptors of other processes"},
    seccomp_rule_info{"process_madvise", T::errno_value, EPERM, "act on other processes' memory"},
    seccomp_rule_info{"memfd_secret", T::errno_value, EPERM, "unused; kernel attack surface"},
    seccomp_rule_info{"quotactl", T::errno_value, EPERM, "host control"},
    seccomp_rule_info{"quotactl_fd", T::errno_value, EPERM, "host control"},
    seccomp_rule_info{"syslog", T::errno_value, EPERM, "kernel log (host information)"},
    seccomp_rule_info{"vhangup", T::errno_value, EPERM, "terminal control"},
    seccomp_rule_info{"uselib", T::errno_value, EPERM, "obsolete loader"},
    seccomp_rule_info{"modify_ldt", T::errno_value, EPERM, "segment tricks, kernel attack surface"},
    seccomp_rule_info{"settimeofday", T::errno_value, EPERM, "host clock"},
    seccomp_rule_info{"clock_settime", T::errno_value, EPERM, "host clock"},
    seccomp_rule_info{"clock_adjtime", T::errno_value, EPERM, "host clock"},
    seccomp_rule_info{"adjtimex", T::errno_value, EPERM, "host clock"},
    seccomp_rule_info{"sethostname", T::errno_value, EPERM, "fixed"},
    seccomp_rule_info{"setdomainname", T::errno_value, EPERM, "fixed"},
    seccomp_rule_info{"clone", T::errno_value, EPERM, "only with a CLONE_NEW* flag: no new namespaces"},
    seccomp_rule_info{"ioctl", T::errno_value, EPERM, "only TIOCSTI / TIOCLINUX (low 32 bits compared): terminal injection"},
    seccomp_rule_info{"socket", T::errno_value, EAFNOSUPPORT, "only families other than unix, inet, inet6, netlink (vsock is not namespaced); netlink other than NETLINK_ROUTE gets EPROTONOSUPPORT"},
    seccomp_rule_info{"prlimit64", T::errno_value, EPERM, "only setting another process's limits (pid != 0): sandbox-init is PID 1 of the same uid under a user namespace"},
    seccomp_rule_info{"setpriority", T::errno_value, EPERM, "only for another process (who != 0)"},
    seccomp_rule_info{"sched_setaffinity", T::errno_value, EPERM, "only for another process (pid != 0)"},
    seccomp_rule_info{"sched_setscheduler", T::errno_value, EPERM, "only for another process (pid != 0)"},
    seccomp_rule_info{"sched_setparam", T::errno_value, EPERM, "only for another process (pid != 0)"},
    seccomp_rule_info{"sched_setattr", T::errno_value, EPERM, "only for another process (pid != 0)"},
    seccomp_rule_info{"ioprio_set", T::errno_value, EPERM, "only for another process (who != 0)"},
    seccomp_rule_info{"migrate_pages", T::errno_value, EPERM, "only for another process (pid != 0)"},
    seccomp_rule_info{"move_pages", T::errno_value, EPERM, "only for another process (pid != 0)"},
    // --- egress: recorded by the host; refused unless loopback ----------------------------
    seccomp_rule_info{"connect", T::egress, 0, "record attempts to leave loopback"},
    seccomp_rule_info{"sendto", T::egress, 0, "only with a destination address"},
    seccomp_rule_info{"sendmsg", T::egress, 0, "destination is behind a pointer: host reads it"},
    seccomp_rule_info{"sendmmsg", T::egress, 0, "destination is behind a pointer: host reads it"},
};
// clang-format on

constexpr std::uint64_t namespace_clone_flags[] = {
    CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
    CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
};

// Socket families refused (everything but AF_UNIX=1, AF_INET=2, AF_INET6=10, AF_NETLINK=16);
// values above 16 are refused by one GT rule.
constexpr std::uint64_t refused_low_families[] = {0, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15};

constexpr std::uint32_t tiocsti = 0x5412;
constexpr std::uint32_t tioclinux = 0x541C;
constexpr std::uint64_t low32 = 0xFFFFFFFFULL;

// `notify`: violation and egress rows go to the host by user notification; without it (a
// kernel that has none, such as gVisor's) violations are refused with EPERM and egress calls
// pass to the run's network namespace, which has nowhere to go.
int add_rules(scmp_filter_ctx ctx, const char** failed, bool notify) noexcept {
  for (const auto& r : rules) {
    int nr = seccomp_syscall_resolve_name(r.syscall);
    if (nr == __NR_SCMP_ERROR) continue;  // not a syscall on this architecture
    std::string_view name = r.syscall;
    if (!notify && r.treatment == T::egress) continue;
    int rc = 0;
    if (name == "clone") {
      for (auto flag : namespace_clone_flags) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1,
                              SCMP_A0_64(SCMP_CMP_MASKED_EQ, flag, flag));
        if (rc < 0) break;
      }
    } else if (name == "ioctl") {
      // The kernel takes ioctl's command as a 32-bit `unsigned int`; the filter sees the
      // whole 64-bit register. An equality test on the register (what SCMP_A1_32 does in
      // libseccomp 2.5: it only narrows the datum) misses 0xFFFFFFFF00005412, which the kernel
      // runs as TIOCSTI (flatpak CVE-2019-10063). Mask to the low 32 bits instead.
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1,
                            SCMP_A1_64(SCMP_CMP_MASKED_EQ, low32, tiocsti));
      if (rc == 0) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1,
                              SCMP_A1_64(SCMP_CMP_MASKED_EQ, low32, tioclinux));
      }
    } else if (name == "socket") {
      // Compared as 64-bit values: a domain with upper bits set is > 16 and refused too.
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, 1,
                            SCMP_A0_64(SCMP_CMP_GT, AF_NETLINK));
      for (auto fam : refused_low_families) {
        if (rc < 0) break;
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, 1,
                              SCMP_A0_64(SCMP_CMP_EQ, fam));
      }
      // Netlink: only NETLINK_ROUTE (getaddrinfo, if_nameindex). Uevent, audit and the
      // other families are not all namespaced, and nothing in a snippet needs them.
      if (rc == 0) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPROTONOSUPPORT), nr, 2,
                              SCMP_A0_64(SCMP_CMP_EQ, AF_NETLINK),
                              SCMP_A2_64(SCMP_CMP_NE, 0 /* NETLINK_ROUTE */));
      }
    } else if (name == "prlimit64") {
      // prlimit64(pid, resource, new_limit, old_limit): reading anyone's is harmless.
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 2, SCMP_A0_32(SCMP_CMP_NE, 0),
                            SCMP_A2_64(SCMP_CMP_NE, 0));
    } else if (name == "setpriority" || name == "ioprio_set") {
      // (which, who, ...): only "this process" (who == 0) is allowed.
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, SCMP_A1_32(SCMP_CMP_NE, 0));
    } else if (name.rfind("sched_set", 0) == 0 || name == "migrate_pages" ||
               name == "move_pages") {
      // (pid, ...): only the calling thread/process (pid == 0).
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, SCMP_A0_32(SCMP_CMP_NE, 0));
    } else if (!notify && r.treatment == T::violation) {
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    } else if (name == "sendto") {
      // sendto(fd, buf, len, flags, dest_addr, addrlen): only calls with a destination.
      rc = seccomp_rule_add(ctx, SCMP_ACT_NOTIFY, nr, 1, SCMP_A4_64(SCMP_CMP_NE, 0));
    } else if (r.treatment == T::errno_value) {
      rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(static_cast<std::uint32_t>(r.errno_value)), nr,
                            0);
    } else {
      rc = seccomp_rule_add(ctx, SCMP_ACT_NOTIFY, nr, 0);
    }
    if (rc < 0) {
      *failed = r.syscall;
      return rc;
    }
  }
  // Calls newer than this filter — numbers the build's libseccomp cannot name, below the x32
  // range (512) — get ENOSYS, as from a kernel that lacks them, rather than passing
  // unexamined under the default allow: e.g. open_tree_attr (mount family), listmount and
  // statmount on recent kernels. Programs treat ENOSYS as "not supported" and fall back.
  // (Only above the highest number it can name: x86-64 numbers are assigned upwards, and the
  // unassigned gaps below are ENOSYS in every kernel. Each rule costs filter build time.)
  int highest = 511;
  for (char* name = nullptr; highest >= 0; --highest) {
    name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, highest);
    if (name != nullptr) {
      std::free(name);
      break;
    }
  }
  for (int nr = highest + 1; nr < 512; ++nr) {
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0); rc < 0) {
      *failed = "syscalls unknown to the filter";
      return rc;
    }
  }
  return 0;
}

}  // namespace

std::span<const seccomp_rule_info> seccomp_rules() noexcept { return rules; }

namespace {

int load_filter(const char** failed, bool notify) noexcept {
  static const char* unused = nullptr;
  if (failed == nullptr) failed = &unused;
  *failed = "seccomp_init";
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return -ENOMEM;
  int rc = 0;
  // Non-native ABIs (i386 via int 0x80, x32 syscall numbers) go to the host as violations:
  // the filter only knows x86-64, so libseccomp sends every other ABI to BADARCH.
  if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH,
                             notify ? SCMP_ACT_NOTIFY : SCMP_ACT_ERRNO(ENOSYS))) < 0) {
    *failed = "badarch action";
  } else if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0)) < 0) {
    *failed = "nnp attribute";  // no_new_privs is set explicitly before loading
  } else if ((rc = add_rules(ctx, failed, notify)) < 0) {
    // *failed names the rule
  } else if ((rc = seccomp_load(ctx)) < 0) {
    *failed = "seccomp_load";
  } else if (notify) {
    rc = seccomp_notify_fd(ctx);
    if (rc < 0) *failed = "seccomp_notify_fd";
  }
  seccomp_release(ctx);  // the loaded filter and its listener outlive the context
  return rc;
}

}  // namespace

int load_seccomp_filter(const char** failed) noexcept { return load_filter(failed, true); }

int load_seccomp_filter_without_notify(const char** failed) noexcept {
  return load_filter(failed, false);
}

bool is_egress_syscall(int nr, std::uint32_t arch) noexcept {
  if (arch != AUDIT_ARCH_X86_64) return false;
  return nr == __NR_connect || nr == __NR_sendto || nr == __NR_sendmsg || nr == __NR_sendmmsg;
}

}  // namespace sandbox::detail
