// The seccomp filter of every process-level run (private to src/; built with libseccomp).
//
// Shape: default allow, native x86-64 ABI only, and a deny table. Each denied call gets one
// of three treatments, chosen per call and documented in docs/security.md:
//  - errno (EPERM / ENOSYS / EAFNOSUPPORT): calls a well-behaved program may probe, where a
//    refusal is enough (mount, unshare, io_uring → ENOSYS so libuv falls back, clone3 →
//    ENOSYS so glibc falls back to clone, namespace flags on clone, TIOCSTI);
//  - violation: calls whose only use here is an attack (ptrace, bpf, kexec, modules, …) and
//    every non-native ABI call (x32 numbers, i386 `int 0x80`). These go to the host through
//    seccomp user notification: the host records the call, refuses it, and kills the run,
//    so `seccomp_violation` rests on the host's own record — never on a SIGSYS wait status,
//    which the code could raise itself;
//  - egress: connect / sendto (with an address) / sendmsg / sendmmsg also go to the host,
//    which records attempts to leave the sandbox's loopback-only network namespace and
//    refuses them (ENETUNREACH); everything else continues.
#pragma once

#include <cstdint>
#include <span>

namespace sandbox::detail {

/// How a denied call is treated.
enum class seccomp_treatment : std::uint8_t { errno_value, violation, egress };

/// One row of the deny table (for docs, tests and translation to OCI's seccomp format).
struct seccomp_rule_info {
  const char* syscall;
  seccomp_treatment treatment;
  int errno_value;  ///< for errno_value: the errno returned
  const char* why;
};

/// The deny table (argument-conditioned rows — clone flags, ioctl requests, socket
/// families — are listed once with their condition in `why`).
std::span<const seccomp_rule_info> seccomp_rules() noexcept;

/**
 * Builds and loads the filter into the calling thread (which must already have
 * no_new_privs set), with a user-notification listener. Returns the listener descriptor
 * (O_CLOEXEC), or -errno on failure with `*failed` naming the rule or step. Async-signal-safe
 * it is not: call it only in a single-threaded process (sandbox-init's child).
 */
int load_seccomp_filter(const char** failed) noexcept;

/**
 * The same filter for a kernel without seccomp user notification (gVisor's): violation rows
 * are refused with EPERM, egress rows are not filtered (the run's network namespace has no
 * route; the DNS sink is the record), non-native ABIs get ENOSYS. Returns 0, or -errno with
 * `*failed` as above.
 */
int load_seccomp_filter_without_notify(const char** failed) noexcept;

/// True when a notified call with this syscall number is an egress call (connect, sendto,
/// sendmsg, sendmmsg); every other notification is a violation.
bool is_egress_syscall(int nr, std::uint32_t arch) noexcept;

}  // namespace sandbox::detail
