// The seccomp policy of every run: ONE declarative table, and the two things generated from it
// (private to src/; compiled into sandbox-init, which is static and has no exceptions, and into
// the host library).
//
// Shape: default allow, native x86-64 ABI only, and a deny table. Each row names one syscall,
// its treatment and the rules under which the treatment applies (argument conditions, each
// rule with its errno). The treatments, documented in docs/security.md:
//  - errno (EPERM / ENOSYS / EAFNOSUPPORT / EPROTONOSUPPORT): calls a well-behaved program may
//    probe, where a refusal is enough (mount, unshare, io_uring → ENOSYS so libuv falls back,
//    clone3 → ENOSYS so glibc falls back to clone, namespace flags on clone, TIOCSTI);
//  - violation: calls whose only use here is an attack (ptrace, bpf, kexec, modules, …) and
//    every non-native ABI call (x32 numbers, i386 `int 0x80`). These go to the host through
//    seccomp user notification: the host records the call, refuses it, and kills the run,
//    so `seccomp_violation` rests on the host's own record — never on a SIGSYS wait status,
//    which the code could raise itself;
//  - egress: connect / sendto (with an address) / sendmsg / sendmmsg also go to the host,
//    which records attempts to leave the sandbox's loopback-only network namespace and
//    refuses them (ENETUNREACH); everything else continues.
//
// The table is enforced in four places (`seccomp_enforcer`), and `seccomp_action_for` is the
// one function that says what each does with each rule: sandbox-init's own filter, built here
// with libseccomp (`load_seccomp_filter`), with or without user notification, and the
// `linux.seccomp` section of an OCI bundle's config.json (backends/oci/bundle.hpp,
// `seccomp_section`), which translates the same rows mechanically.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace sandbox::detail {

/// How a denied call is treated (see the file comment).
enum class seccomp_treatment : std::uint8_t { errno_value, violation, egress };

/// How one syscall argument is compared, always as a 64-bit value (libseccomp's
/// `scmp_compare`, OCI's `op`). A 32-bit argument is compared in full too: a condition that
/// must ignore the upper half masks it (ioctl's request).
enum class seccomp_op : std::uint8_t {
  ne,         ///< argument != value
  eq,         ///< argument == value
  gt,         ///< argument > value (unsigned)
  masked_eq,  ///< (argument & value) == value_two
};

/// One condition on one argument of a call.
struct seccomp_arg_check {
  std::uint8_t index = 0;  ///< the argument, 0..5
  seccomp_op op = seccomp_op::eq;
  std::uint64_t value = 0;      ///< the datum compared; for `masked_eq`, the mask
  std::uint64_t value_two = 0;  ///< for `masked_eq`, what the masked argument must equal; else 0
};

/// One rule of a row: the row's treatment applies to a call when every check holds (a rule
/// without checks: always).
struct seccomp_rule {
  int errno_value = 0;           ///< errno rows: the errno the call returns; 0 in other rows
  std::uint8_t check_count = 0;  ///< how many of `checks` are used (0..2)
  std::array<seccomp_arg_check, 2> checks{};  ///< ANDed

  /// The checks in use.
  constexpr std::span<const seccomp_arg_check> args() const noexcept {
    return {checks.data(), check_count};
  }
};

/// One row of the deny table: the treatment applies when any one of `rules` holds.
struct seccomp_row {
  const char* syscall;  ///< the name libseccomp and OCI know it by
  seccomp_treatment treatment;
  std::span<const seccomp_rule> rules;  ///< never empty
  const char* why;                      ///< for docs and tests
};

/// The deny table, in the order filters are built. Static storage; never empty.
std::span<const seccomp_row> seccomp_table() noexcept;

/// Where the table is enforced.
enum class seccomp_enforcer : std::uint8_t {
  init_notify,          ///< sandbox-init's filter, the host holding its notification listener
  init_without_notify,  ///< sandbox-init's filter on a kernel without user notification (gVisor)
  oci_stacked,  ///< crun/runc: config.json's filter, loaded beneath sandbox-init's own filter
  oci_gvisor,   ///< runsc (run with --oci-seccomp): gVisor's own seccomp
};

/// What an enforcer does with a call.
enum class seccomp_action_kind : std::uint8_t {
  none,         ///< no rule here: the call goes on (to a later filter, or allowed)
  errno_value,  ///< refused with `seccomp_action::errno_value`
  notify,       ///< sent to the host by user notification (SCMP_ACT_NOTIFY)
};

/// An enforcer's action for one rule.
struct seccomp_action {
  seccomp_action_kind kind = seccomp_action_kind::none;
  int errno_value = 0;  ///< for `errno_value`
};

/**
 * What `enforcer` does with a call matching `rule` of `row`:
 *  - errno rows: that errno everywhere, except that runsc answers every SCMP_ACT_ERRNO with
 *    EPERM whatever its errnoRet, so `oci_gvisor` leaves out the ENOSYS rules (there only so
 *    that programs fall back: an EPERM from clone3 would make glibc's pthread_create fail
 *    instead of falling back to clone) to gVisor's own kernel;
 *  - violation rows: `notify` in `init_notify`; EPERM where there is no user notification
 *    (`init_without_notify`, `oci_gvisor`); `none` in `oci_stacked`, whose ERRNO would take
 *    precedence over sandbox-init's USER_NOTIF and hide the violation from the host;
 *  - egress rows: `notify` in `init_notify`, else `none` (without notification the run's
 *    network namespace has nowhere to go, and the DNS sink is the record; a stacked OCI
 *    filter must not hide the host's record).
 * Never `notify` for the OCI enforcers.
 */
seccomp_action seccomp_action_for(const seccomp_row& row, const seccomp_rule& rule,
                                  seccomp_enforcer enforcer) noexcept;

/// What `enforcer` does with a call of a non-native ABI (i386 `int 0x80`, x32 numbers):
/// `notify` (a violation) in `init_notify`, ENOSYS in `init_without_notify`, `none` for the
/// OCI enforcers (crun/runc let such calls through to sandbox-init's filter; gVisor runs
/// neither ABI).
seccomp_action seccomp_non_native_abi_action(seccomp_enforcer enforcer) noexcept;

/// What `enforcer` does with a native call numbered above the highest that the build's
/// libseccomp can name (up to the x32 range, 511): ENOSYS in sandbox-init's filters, as from
/// a kernel that lacks the call, so a call newer than the table never passes unexamined;
/// `none` for the OCI enforcers (OCI rules name calls).
seccomp_action seccomp_newer_syscall_action(seccomp_enforcer enforcer) noexcept;

/**
 * Builds sandbox-init's filter (`init_notify`) and loads it into the calling thread (which
 * must already have no_new_privs set), with a user-notification listener. Returns the listener
 * descriptor (O_CLOEXEC), or -errno on failure with `*failed` naming the rule or step.
 * Async-signal-safe it is not: call it only in a single-threaded process (sandbox-init's
 * child).
 */
int load_seccomp_filter(const char** failed) noexcept;

/// The same for a kernel without seccomp user notification (`init_without_notify`). Returns
/// 0, or -errno with `*failed` as above.
int load_seccomp_filter_without_notify(const char** failed) noexcept;

/// Builds sandbox-init's filter for `enforcer` (`init_notify` or `init_without_notify`) without
/// loading it, and writes its BPF program (struct sock_filter, host byte order) to `fd`: how
/// tests read what the kernel would run. Returns 0, -EINVAL for an OCI enforcer, or -errno
/// with `*failed` naming the rule or step. Thread-safe.
int export_seccomp_filter(seccomp_enforcer enforcer, int fd, const char** failed) noexcept;

/// True when a notified call with this syscall number is an egress call (an egress row of the
/// table: connect, sendto, sendmsg, sendmmsg); every other notification is a violation.
/// Thread-safe.
bool is_egress_syscall(int nr, std::uint32_t arch) noexcept;

}  // namespace sandbox::detail
