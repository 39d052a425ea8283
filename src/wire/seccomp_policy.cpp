// The seccomp policy: the deny table, what each enforcer does with it, and sandbox-init's
// filter built from it. See seccomp_policy.hpp for the shape and seccomp(2),
// seccomp_unotify(2) and libseccomp's seccomp_rule_add(3) for the mechanisms.
#include "wire/seccomp_policy.hpp"

#include <errno.h>
#include <linux/audit.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/socket.h>

#include <cstdlib>

namespace sandbox::detail {
namespace {

using T = seccomp_treatment;

// ----- building blocks of the table (constant expressions: the table is static data)

constexpr seccomp_arg_check arg(std::uint8_t index, seccomp_op op, std::uint64_t value,
                                std::uint64_t value_two = 0) {
  return {index, op, value, value_two};
}
constexpr seccomp_rule always(int errno_value) { return {errno_value, 0, {}}; }
constexpr seccomp_rule when(int errno_value, seccomp_arg_check a) {
  return {errno_value, 1, {a, {}}};
}
constexpr seccomp_rule when(int errno_value, seccomp_arg_check a, seccomp_arg_check b) {
  return {errno_value, 2, {a, b}};
}
// (argument & flag) == flag: the flag is set.
constexpr seccomp_rule flag_set(int errno_value, std::uint8_t index, std::uint64_t flag) {
  return when(errno_value, arg(index, seccomp_op::masked_eq, flag, flag));
}

constexpr std::uint64_t low32 = 0xFFFFFFFFULL;
constexpr std::uint64_t tiocsti = 0x5412;
constexpr std::uint64_t tioclinux = 0x541C;
constexpr std::uint64_t netlink_route = 0;

// ----- the rules of the rows (a row's treatment applies when any one of its rules holds)

constexpr seccomp_rule unconditional[] = {always(0)};  // the enforcer decides the action
constexpr seccomp_rule eperm[] = {always(EPERM)};
constexpr seccomp_rule enosys[] = {always(ENOSYS)};

// clone with any namespace flag (clone3's flags are behind a pointer: clone3 is ENOSYS).
constexpr seccomp_rule clone_new_namespace[] = {
    flag_set(EPERM, 0, CLONE_NEWNS),   flag_set(EPERM, 0, CLONE_NEWCGROUP),
    flag_set(EPERM, 0, CLONE_NEWUTS),  flag_set(EPERM, 0, CLONE_NEWIPC),
    flag_set(EPERM, 0, CLONE_NEWUSER), flag_set(EPERM, 0, CLONE_NEWPID),
    flag_set(EPERM, 0, CLONE_NEWNET),
};

// The kernel takes ioctl's command as a 32-bit `unsigned int`; the filter sees the whole 64-bit
// register. An equality test on the register (what SCMP_A1_32 does in libseccomp 2.5: it only
// narrows the datum) misses 0xFFFFFFFF00005412, which the kernel runs as TIOCSTI (flatpak
// CVE-2019-10063). Masked to the low 32 bits instead.
constexpr seccomp_rule ioctl_terminal_injection[] = {
    when(EPERM, arg(1, seccomp_op::masked_eq, low32, tiocsti)),
    when(EPERM, arg(1, seccomp_op::masked_eq, low32, tioclinux)),
};

// Every family but AF_UNIX (1), AF_INET (2), AF_INET6 (10) and AF_NETLINK (16), compared as
// 64-bit values (a domain with upper bits set is > 16 and refused too). Netlink: only
// NETLINK_ROUTE (getaddrinfo, if_nameindex); uevent, audit and the other families are not all
// namespaced, and nothing in a snippet needs them.
constexpr seccomp_rule socket_refused[] = {
    when(EAFNOSUPPORT, arg(0, seccomp_op::gt, AF_NETLINK)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 0)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 3)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 4)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 5)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 6)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 7)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 8)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 9)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 11)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 12)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 13)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 14)),
    when(EAFNOSUPPORT, arg(0, seccomp_op::eq, 15)),
    when(EPROTONOSUPPORT, arg(0, seccomp_op::eq, AF_NETLINK),
         arg(2, seccomp_op::ne, netlink_route)),
};

// Calls that act on a process named by its pid. The run's pid namespace holds only the
// program's own processes and sandbox-init, which is PID 1 at every level: nothing outside the
// run can be named at all, and the kernel refuses what the uid may not do to a process (root
// hosts and the OCI levels: sandbox-init is root, the program is not). Under a user namespace
// (unprivileged hosts) sandbox-init has the program's uid, so the table refuses what aims at
// PID 1, or at a whole uid (which includes it); a program may tune itself and its own
// processes, by 0 or by pid (CPython's test_os passes os.getpid()). Raising a priority stays
// the kernel's to refuse: no CAP_SYS_NICE, RLIMIT_NICE and RLIMIT_RTPRIO 0 (child.cpp).
// pid_t, `which` and `who` are ints: the kernel reads the low 32 bits of the register, and so
// do these checks (a 64-bit equality would miss 0xFFFFFFFF00000001, as for ioctl above).
constexpr std::uint64_t init_pid = 1;
constexpr std::uint64_t prio_user = 2;        // setpriority's PRIO_USER
constexpr std::uint64_t ioprio_who_user = 3;  // ioprio_set's IOPRIO_WHO_USER
// prlimit64(pid, resource, new_limit, old_limit): setting sandbox-init's limits; reading
// anyone's is harmless.
constexpr seccomp_rule prlimit64_of_init[] = {
    when(EPERM, arg(0, seccomp_op::masked_eq, low32, init_pid), arg(2, seccomp_op::ne, 0)),
};
// setpriority(which, who, prio): sandbox-init (who 1, as a process or a process group), or a
// whole uid.
constexpr seccomp_rule priority_of_init[] = {
    when(EPERM, arg(1, seccomp_op::masked_eq, low32, init_pid)),
    when(EPERM, arg(0, seccomp_op::masked_eq, low32, prio_user)),
};
// ioprio_set(which, who, ioprio): the same, with IOPRIO_WHO_USER.
constexpr seccomp_rule ioprio_of_init[] = {
    when(EPERM, arg(1, seccomp_op::masked_eq, low32, init_pid)),
    when(EPERM, arg(0, seccomp_op::masked_eq, low32, ioprio_who_user)),
};
// (pid, ...): sandbox-init.
constexpr seccomp_rule pid_is_init[] = {
    when(EPERM, arg(0, seccomp_op::masked_eq, low32, init_pid))};
// sendto(fd, buf, len, flags, dest_addr, addrlen): only calls with a destination.
constexpr seccomp_rule sendto_with_address[] = {when(0, arg(4, seccomp_op::ne, 0))};

// ----- the table

// clang-format off
constexpr seccomp_row table[] = {
    // --- violations: recorded by the host, run killed ------------------------------------
    {"ptrace", T::violation, unconditional, "inspect or control other processes"},
    {"process_vm_readv", T::violation, unconditional, "read another process's memory"},
    {"process_vm_writev", T::violation, unconditional, "write another process's memory"},
    {"bpf", T::violation, unconditional, "kernel attack surface (eBPF)"},
    {"perf_event_open", T::violation, unconditional, "kernel attack surface, side channels"},
    {"userfaultfd", T::violation, unconditional, "used to win kernel races"},
    {"kexec_load", T::violation, unconditional, "replace the kernel"},
    {"kexec_file_load", T::violation, unconditional, "replace the kernel"},
    {"init_module", T::violation, unconditional, "load kernel code"},
    {"finit_module", T::violation, unconditional, "load kernel code"},
    {"delete_module", T::violation, unconditional, "unload kernel code"},
    {"open_by_handle_at", T::violation, unconditional, "escape the mount namespace (shocker)"},
    {"iopl", T::violation, unconditional, "raw I/O port access"},
    {"ioperm", T::violation, unconditional, "raw I/O port access"},
    {"reboot", T::violation, unconditional, "host control"},
    {"swapon", T::violation, unconditional, "host control"},
    {"swapoff", T::violation, unconditional, "host control"},
    {"acct", T::violation, unconditional, "host control"},
    // --- errno: refused, the program may go on -------------------------------------------
    {"io_uring_setup", T::errno_value, enosys, "io_uring bypasses seccomp; ENOSYS makes libuv fall back"},
    {"io_uring_enter", T::errno_value, enosys, "io_uring bypasses seccomp"},
    {"io_uring_register", T::errno_value, enosys, "io_uring bypasses seccomp"},
    {"clone3", T::errno_value, enosys, "flags are behind a pointer BPF cannot read; ENOSYS makes glibc use clone"},
    {"unshare", T::errno_value, eperm, "no new namespaces"},
    {"setns", T::errno_value, eperm, "no joining namespaces"},
    {"mount", T::errno_value, eperm, "mount table is fixed"},
    {"umount2", T::errno_value, eperm, "mount table is fixed"},
    {"pivot_root", T::errno_value, eperm, "mount table is fixed"},
    {"chroot", T::errno_value, eperm, "mount table is fixed"},
    {"open_tree", T::errno_value, eperm, "mount table is fixed"},
    {"move_mount", T::errno_value, eperm, "mount table is fixed"},
    {"fsopen", T::errno_value, eperm, "mount table is fixed"},
    {"fsconfig", T::errno_value, eperm, "mount table is fixed"},
    {"fsmount", T::errno_value, eperm, "mount table is fixed"},
    {"fspick", T::errno_value, eperm, "mount table is fixed"},
    {"mount_setattr", T::errno_value, eperm, "mount table is fixed"},
    {"keyctl", T::errno_value, eperm, "kernel keyrings are not namespaced"},
    {"add_key", T::errno_value, eperm, "kernel keyrings are not namespaced"},
    {"request_key", T::errno_value, eperm, "kernel keyrings are not namespaced"},
    {"name_to_handle_at", T::errno_value, eperm, "file handles (see open_by_handle_at)"},
    {"fanotify_init", T::errno_value, eperm, "watch the filesystem"},
    {"kcmp", T::errno_value, eperm, "compare kernel objects of other processes"},
    {"pidfd_getfd", T::errno_value, eperm, "take descriptors of other processes"},
    {"process_madvise", T::errno_value, eperm, "act on other processes' memory"},
    {"memfd_secret", T::errno_value, eperm, "unused; kernel attack surface"},
    {"quotactl", T::errno_value, eperm, "host control"},
    {"quotactl_fd", T::errno_value, eperm, "host control"},
    {"syslog", T::errno_value, eperm, "kernel log (host information)"},
    {"vhangup", T::errno_value, eperm, "terminal control"},
    {"uselib", T::errno_value, eperm, "obsolete loader"},
    {"modify_ldt", T::errno_value, eperm, "segment tricks, kernel attack surface"},
    {"settimeofday", T::errno_value, eperm, "host clock"},
    {"clock_settime", T::errno_value, eperm, "host clock"},
    {"clock_adjtime", T::errno_value, eperm, "host clock"},
    {"adjtimex", T::errno_value, eperm, "host clock"},
    {"sethostname", T::errno_value, eperm, "fixed"},
    {"setdomainname", T::errno_value, eperm, "fixed"},
    {"clone", T::errno_value, clone_new_namespace, "only with a CLONE_NEW* flag: no new namespaces"},
    {"ioctl", T::errno_value, ioctl_terminal_injection, "only TIOCSTI / TIOCLINUX (low 32 bits compared): terminal injection"},
    {"socket", T::errno_value, socket_refused, "only families other than unix, inet, inet6, netlink (vsock is not namespaced); netlink other than NETLINK_ROUTE gets EPROTONOSUPPORT"},
    {"prlimit64", T::errno_value, prlimit64_of_init, "only setting sandbox-init's limits (pid 1): under a user namespace it has the program's uid"},
    {"setpriority", T::errno_value, priority_of_init, "only for sandbox-init (who 1) or a whole uid (PRIO_USER); a program may lower its own priority"},
    {"sched_setaffinity", T::errno_value, pid_is_init, "only for sandbox-init (pid 1)"},
    {"sched_setscheduler", T::errno_value, pid_is_init, "only for sandbox-init (pid 1); SCHED_BATCH/SCHED_IDLE of the program's own processes are fine"},
    {"sched_setparam", T::errno_value, pid_is_init, "only for sandbox-init (pid 1)"},
    {"sched_setattr", T::errno_value, pid_is_init, "only for sandbox-init (pid 1)"},
    {"ioprio_set", T::errno_value, ioprio_of_init, "only for sandbox-init (who 1) or a whole uid (IOPRIO_WHO_USER)"},
    {"migrate_pages", T::errno_value, pid_is_init, "only for sandbox-init (pid 1)"},
    {"move_pages", T::errno_value, pid_is_init, "only for sandbox-init (pid 1)"},
    // --- egress: recorded by the host; refused unless loopback ----------------------------
    {"connect", T::egress, unconditional, "record attempts to leave loopback"},
    {"sendto", T::egress, sendto_with_address, "only with a destination address"},
    {"sendmsg", T::egress, unconditional, "destination is behind a pointer: host reads it"},
    {"sendmmsg", T::egress, unconditional, "destination is behind a pointer: host reads it"},
};
// clang-format on

constexpr seccomp_action no_rule{};
constexpr seccomp_action notify{seccomp_action_kind::notify, 0};
constexpr seccomp_action refuse(int errno_value) {
  return {seccomp_action_kind::errno_value, errno_value};
}

// ----- sandbox-init's filter, built with libseccomp

constexpr bool is_init(seccomp_enforcer e) {
  return e == seccomp_enforcer::init_notify || e == seccomp_enforcer::init_without_notify;
}

std::uint32_t scmp_action(seccomp_action a) noexcept {
  return a.kind == seccomp_action_kind::notify
             ? SCMP_ACT_NOTIFY
             : SCMP_ACT_ERRNO(static_cast<std::uint32_t>(a.errno_value));
}

scmp_compare scmp_op(seccomp_op op) noexcept {
  switch (op) {
    case seccomp_op::ne:
      return SCMP_CMP_NE;
    case seccomp_op::eq:
      return SCMP_CMP_EQ;
    case seccomp_op::gt:
      return SCMP_CMP_GT;
    case seccomp_op::masked_eq:
      return SCMP_CMP_MASKED_EQ;
  }
  return _SCMP_CMP_MIN;  // not reached; libseccomp refuses it
}

int add_rules(scmp_filter_ctx ctx, seccomp_enforcer enforcer, const char** failed) noexcept {
  for (const auto& row : table) {
    const int nr = seccomp_syscall_resolve_name(row.syscall);
    if (nr == __NR_SCMP_ERROR) continue;  // not a syscall on this architecture
    for (const auto& rule : row.rules) {
      const seccomp_action action = seccomp_action_for(row, rule, enforcer);
      if (action.kind == seccomp_action_kind::none) continue;
      scmp_arg_cmp cmp[2]{};
      for (std::uint8_t i = 0; i < rule.check_count; ++i) {
        const auto& c = rule.checks[i];
        // For SCMP_CMP_MASKED_EQ, datum_a is the mask and datum_b the value.
        cmp[i] = {c.index, scmp_op(c.op), c.value, c.value_two};
      }
      if (int rc = seccomp_rule_add_array(ctx, scmp_action(action), nr, rule.check_count, cmp);
          rc < 0) {
        *failed = row.syscall;
        return rc;
      }
    }
  }
  // Calls newer than this filter — numbers the build's libseccomp cannot name, below the x32
  // range (512) — get ENOSYS, as from a kernel that lacks them, rather than passing
  // unexamined under the default allow: e.g. open_tree_attr (mount family), listmount and
  // statmount on recent kernels. Programs treat ENOSYS as "not supported" and fall back.
  // (Only above the highest number it can name: x86-64 numbers are assigned upwards, and the
  // unassigned gaps below are ENOSYS in every kernel. Each rule costs filter build time.)
  const seccomp_action newer = seccomp_newer_syscall_action(enforcer);
  if (newer.kind == seccomp_action_kind::none) return 0;
  int highest = 511;
  for (char* name = nullptr; highest >= 0; --highest) {
    name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, highest);
    if (name != nullptr) {
      std::free(name);
      break;
    }
  }
  for (int nr = highest + 1; nr < 512; ++nr) {
    if (int rc = seccomp_rule_add(ctx, scmp_action(newer), nr, 0); rc < 0) {
      *failed = "syscalls unknown to the filter";
      return rc;
    }
  }
  return 0;
}

// A context holding sandbox-init's filter for `enforcer`, or nullptr with `*rc` (-errno) and
// `*failed` set. The caller releases it.
scmp_filter_ctx build_filter(seccomp_enforcer enforcer, const char** failed, int* rc) noexcept {
  *failed = "seccomp_init";
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) {
    *rc = -ENOMEM;
    return nullptr;
  }
  // Non-native ABIs (i386 via int 0x80, x32 syscall numbers): the filter only knows x86-64,
  // so libseccomp sends every other ABI to BADARCH.
  if ((*rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH,
                              scmp_action(seccomp_non_native_abi_action(enforcer)))) < 0) {
    *failed = "badarch action";
  } else if ((*rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0)) < 0) {
    *failed = "nnp attribute";  // no_new_privs is set explicitly before loading
  } else if ((*rc = add_rules(ctx, enforcer, failed)) < 0) {
    // *failed names the rule
  } else {
    return ctx;
  }
  seccomp_release(ctx);
  return nullptr;
}

int load_filter(seccomp_enforcer enforcer, const char** failed) noexcept {
  const char* unused = nullptr;
  if (failed == nullptr) failed = &unused;
  int rc = 0;
  scmp_filter_ctx ctx = build_filter(enforcer, failed, &rc);
  if (ctx == nullptr) return rc;
  if ((rc = seccomp_load(ctx)) < 0) {
    *failed = "seccomp_load";
  } else if (enforcer == seccomp_enforcer::init_notify) {
    rc = seccomp_notify_fd(ctx);
    if (rc < 0) *failed = "seccomp_notify_fd";
  }
  seccomp_release(ctx);  // the loaded filter and its listener outlive the context
  return rc;
}

}  // namespace

std::span<const seccomp_row> seccomp_table() noexcept { return table; }

seccomp_action seccomp_action_for(const seccomp_row& row, const seccomp_rule& rule,
                                  seccomp_enforcer enforcer) noexcept {
  using E = seccomp_enforcer;
  switch (row.treatment) {
    case T::errno_value:
      // runsc answers every SCMP_ACT_ERRNO with EPERM, and an ENOSYS rule is only there to
      // make programs fall back (EPERM from clone3 makes glibc's pthread_create fail): those
      // calls are left to gVisor's own kernel.
      if (enforcer == E::oci_gvisor && rule.errno_value == ENOSYS) return no_rule;
      return refuse(rule.errno_value);
    case T::violation:
      switch (enforcer) {
        case E::init_notify:
          return notify;
        case E::init_without_notify:
        case E::oci_gvisor:
          return refuse(EPERM);  // no user notification: refused
        case E::oci_stacked:
          return no_rule;  // its ERRNO would hide sandbox-init's USER_NOTIF
      }
      return no_rule;
    case T::egress:
      return enforcer == E::init_notify ? notify : no_rule;
  }
  return no_rule;
}

seccomp_action seccomp_non_native_abi_action(seccomp_enforcer enforcer) noexcept {
  switch (enforcer) {
    case seccomp_enforcer::init_notify:
      return notify;  // a violation, recorded by the host
    case seccomp_enforcer::init_without_notify:
      return refuse(ENOSYS);
    case seccomp_enforcer::oci_stacked:
    case seccomp_enforcer::oci_gvisor:
      return no_rule;
  }
  return no_rule;
}

seccomp_action seccomp_newer_syscall_action(seccomp_enforcer enforcer) noexcept {
  return is_init(enforcer) ? refuse(ENOSYS) : no_rule;
}

int load_seccomp_filter(const char** failed) noexcept {
  return load_filter(seccomp_enforcer::init_notify, failed);
}

int load_seccomp_filter_without_notify(const char** failed) noexcept {
  return load_filter(seccomp_enforcer::init_without_notify, failed);
}

int export_seccomp_filter(seccomp_enforcer enforcer, int fd, const char** failed) noexcept {
  const char* unused = nullptr;
  if (failed == nullptr) failed = &unused;
  if (!is_init(enforcer)) return -EINVAL;
  int rc = 0;
  scmp_filter_ctx ctx = build_filter(enforcer, failed, &rc);
  if (ctx == nullptr) return rc;
  if ((rc = seccomp_export_bpf(ctx, fd)) < 0) *failed = "seccomp_export_bpf";
  seccomp_release(ctx);
  return rc;
}

bool is_egress_syscall(int nr, std::uint32_t arch) noexcept {
  if (arch != AUDIT_ARCH_X86_64) return false;
  for (const auto& row : table) {
    if (row.treatment == T::egress && seccomp_syscall_resolve_name(row.syscall) == nr) return true;
  }
  return false;
}

}  // namespace sandbox::detail
