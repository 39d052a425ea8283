// The seccomp table (wire/seccomp_policy.hpp) and sandbox-init's filter built from it: the
// BPF program libseccomp generates, run here the way the kernel runs it, answers every call
// the way the table says — for each rule and around it, for every other named call, for
// calls newer than the table and for the non-native ABIs. (The OCI section is held to the
// same table in tests/unit/backends/oci_bundle_test.cpp.)
#include "wire/seccomp_policy.hpp"

#include <errno.h>
#include <seccomp.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <set>
#include <string>

#include "unit/wire/seccomp_reference.hpp"

namespace {

using namespace seccomp_reference;
using sandbox::detail::seccomp_table;
using sandbox::detail::seccomp_treatment;

constexpr seccomp_enforcer init_enforcers[] = {seccomp_enforcer::init_notify,
                                               seccomp_enforcer::init_without_notify};

// The highest native number the build's libseccomp can name.
int highest_named() {
  for (int nr = 511; nr >= 0; --nr) {
    if (char* name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr)) {
      std::free(name);
      return nr;
    }
  }
  return -1;
}

seccomp_action filter_action(const std::vector<sock_filter>& prog, const call& c) {
  const auto a = action_of_return(run_bpf(prog, c));
  REQUIRE(a.has_value());
  return *a;
}

}  // namespace

TEST_CASE("seccomp table: every row is well formed", "[seccomp]") {
  std::set<std::string> names;
  for (const auto& row : seccomp_table()) {
    INFO(row.syscall);
    CHECK(names.insert(row.syscall).second);  // one row per call
    CHECK(seccomp_syscall_resolve_name(row.syscall) != __NR_SCMP_ERROR);
    REQUIRE_FALSE(row.rules.empty());
    CHECK(std::string(row.why).size() > 0);
    for (const auto& rule : row.rules) {
      CHECK(rule.check_count <= rule.checks.size());
      for (const auto& check : rule.args()) CHECK(check.index < 6);
      // Errno rows say which errno; the other treatments leave it to the enforcer.
      if (row.treatment == seccomp_treatment::errno_value) {
        CHECK(rule.errno_value > 0);
      } else {
        CHECK(rule.errno_value == 0);
      }
      // Violation rows are unconditional: an attack call is never let through by its
      // arguments.
      if (row.treatment == seccomp_treatment::violation) CHECK(rule.check_count == 0);
    }
  }
}

TEST_CASE("seccomp filter: the BPF program answers each rule of the table as the table says",
          "[seccomp]") {
  for (auto e : init_enforcers) {
    INFO("enforcer " << static_cast<int>(e));
    const auto prog = exported_filter(e);
    for (const auto& row : seccomp_table()) {
      const int nr = seccomp_syscall_resolve_name(row.syscall);
      for (const auto& c : probes(row, nr)) {
        INFO(row.syscall << " args " << c.args[0] << ", " << c.args[1] << ", " << c.args[2] << ", "
                         << c.args[4]);
        const auto want = reference_action(row, c, e);
        const auto got = filter_action(prog, c);
        INFO("want " << describe(want) << ", got " << describe(got));
        CHECK(same(want, got));
      }
    }
  }
}

TEST_CASE("seccomp filter: calls outside the table are allowed, newer ones get ENOSYS",
          "[seccomp]") {
  std::set<int> in_table;
  for (const auto& row : seccomp_table())
    in_table.insert(seccomp_syscall_resolve_name(row.syscall));
  const int highest = highest_named();
  REQUIRE(highest > 400);
  for (auto e : init_enforcers) {
    INFO("enforcer " << static_cast<int>(e));
    const auto prog = exported_filter(e);
    for (int nr = 0; nr <= highest; ++nr) {
      if (in_table.contains(nr)) continue;
      INFO("nr " << nr);
      CHECK(same(filter_action(prog, call{.nr = nr}), seccomp_action{}));
    }
    const auto newer = sandbox::detail::seccomp_newer_syscall_action(e);
    CHECK(same(newer, {seccomp_action_kind::errno_value, ENOSYS}));
    for (int nr = highest + 1; nr < 512; ++nr) {
      INFO("nr " << nr);
      CHECK(same(filter_action(prog, call{.nr = nr}), newer));
    }
  }
}

TEST_CASE("seccomp filter: non-native ABIs get the table's non-native action", "[seccomp]") {
  for (auto e : init_enforcers) {
    INFO("enforcer " << static_cast<int>(e));
    const auto prog = exported_filter(e);
    const auto want = sandbox::detail::seccomp_non_native_abi_action(e);
    CHECK(want.kind != seccomp_action_kind::none);
    // i386 (`int 0x80`): execve, getpid, ptrace.
    for (int nr : {11, 20, 26}) {
      CHECK(same(filter_action(prog, call{.nr = nr, .arch = AUDIT_ARCH_I386}), want));
    }
    // x32: x86-64's numbers with bit 30 set.
    for (int nr : {0, 39, 101}) {
      CHECK(same(filter_action(prog, call{.nr = nr | 0x40000000}), want));
    }
  }
  CHECK(sandbox::detail::seccomp_non_native_abi_action(seccomp_enforcer::init_notify).kind ==
        seccomp_action_kind::notify);
}

TEST_CASE("seccomp table: the host's egress calls are the table's egress rows", "[seccomp]") {
  std::set<int> egress;
  for (const auto& row : seccomp_table()) {
    if (row.treatment == seccomp_treatment::egress) {
      egress.insert(seccomp_syscall_resolve_name(row.syscall));
    }
  }
  CHECK(egress == std::set<int>{42, 44, 46, 307});  // connect, sendto, sendmsg, sendmmsg
  for (int nr = 0; nr < 512; ++nr) {
    INFO("nr " << nr);
    CHECK(sandbox::detail::is_egress_syscall(nr, AUDIT_ARCH_X86_64) == egress.contains(nr));
    CHECK_FALSE(sandbox::detail::is_egress_syscall(nr, AUDIT_ARCH_I386));
  }
}

TEST_CASE("seccomp table: what each enforcer does with each treatment", "[seccomp]") {
  using sandbox::detail::seccomp_action_for;
  using E = seccomp_enforcer;
  for (const auto& row : seccomp_table()) {
    INFO(row.syscall);
    for (const auto& rule : row.rules) {
      const auto errno_of = [](int e) {
        return seccomp_action{seccomp_action_kind::errno_value, e};
      };
      switch (row.treatment) {
        case seccomp_treatment::errno_value:
          CHECK(same(seccomp_action_for(row, rule, E::init_notify), errno_of(rule.errno_value)));
          CHECK(same(seccomp_action_for(row, rule, E::init_without_notify),
                     errno_of(rule.errno_value)));
          CHECK(same(seccomp_action_for(row, rule, E::oci_stacked), errno_of(rule.errno_value)));
          // runsc would answer EPERM, and EPERM means "no fallback".
          CHECK(same(seccomp_action_for(row, rule, E::oci_gvisor),
                     rule.errno_value == ENOSYS ? seccomp_action{} : errno_of(rule.errno_value)));
          break;
        case seccomp_treatment::violation:
          CHECK(seccomp_action_for(row, rule, E::init_notify).kind == seccomp_action_kind::notify);
          CHECK(same(seccomp_action_for(row, rule, E::init_without_notify), errno_of(EPERM)));
          CHECK(same(seccomp_action_for(row, rule, E::oci_stacked), seccomp_action{}));
          CHECK(same(seccomp_action_for(row, rule, E::oci_gvisor), errno_of(EPERM)));
          break;
        case seccomp_treatment::egress:
          CHECK(seccomp_action_for(row, rule, E::init_notify).kind == seccomp_action_kind::notify);
          for (auto e : {E::init_without_notify, E::oci_stacked, E::oci_gvisor}) {
            CHECK(same(seccomp_action_for(row, rule, e), seccomp_action{}));
          }
          break;
      }
    }
  }
}

TEST_CASE("seccomp filter: the known refusals, by name", "[seccomp]") {
  // A few rows spelled out, so a table edited by mistake fails here in plain words too.
  const auto prog = exported_filter(seccomp_enforcer::init_notify);
  const auto nr = [](const char* name) { return seccomp_syscall_resolve_name(name); };
  const seccomp_action allow{};
  const seccomp_action eperm{seccomp_action_kind::errno_value, EPERM};
  const seccomp_action notify{seccomp_action_kind::notify, 0};
  CHECK(same(filter_action(prog, call{.nr = nr("ptrace")}), notify));
  CHECK(same(filter_action(prog, call{.nr = nr("mount")}), eperm));
  CHECK(same(filter_action(prog, call{.nr = nr("clone3")}),
             {seccomp_action_kind::errno_value, ENOSYS}));
  CHECK(same(filter_action(prog, call{.nr = nr("clone"), .args = {0x01200011}}), allow));  // fork
  CHECK(
      same(filter_action(prog, call{.nr = nr("clone"), .args = {0x10000000}}), eperm));  // NEWUSER
  // ioctl(fd, TIOCSTI) with garbage in the upper half is still TIOCSTI (CVE-2019-10063).
  CHECK(same(filter_action(prog, call{.nr = nr("ioctl"), .args = {0, 0xFFFFFFFF00005412}}), eperm));
  CHECK(same(filter_action(prog, call{.nr = nr("ioctl"), .args = {0, 0x5401}}), allow));  // TCGETS
  CHECK(same(filter_action(prog, call{.nr = nr("socket"), .args = {40}}),  // AF_VSOCK
             {seccomp_action_kind::errno_value, EAFNOSUPPORT}));
  CHECK(same(filter_action(prog, call{.nr = nr("socket"), .args = {16, 3, 9}}),  // NETLINK_AUDIT
             {seccomp_action_kind::errno_value, EPROTONOSUPPORT}));
  CHECK(same(filter_action(prog, call{.nr = nr("socket"), .args = {16, 3, 0}}), allow));
  CHECK(same(filter_action(prog, call{.nr = nr("socket"), .args = {2, 1, 0}}), allow));
  // Limits and scheduling: a program may tune itself and its own processes, by 0 or by pid
  // (2 here; CPython's test_os passes os.getpid()); aimed at sandbox-init (PID 1, compared on
  // the low 32 bits as the kernel reads a pid_t) or at a whole uid, refused.
  CHECK(same(filter_action(prog, call{.nr = nr("prlimit64"), .args = {0, 7, 0x1000, 0}}), allow));
  CHECK(same(filter_action(prog, call{.nr = nr("prlimit64"), .args = {2, 7, 0x1000, 0}}), allow));
  CHECK(same(filter_action(prog, call{.nr = nr("prlimit64"), .args = {1, 7, 0x1000, 0}}), eperm));
  CHECK(same(
      filter_action(prog, call{.nr = nr("prlimit64"), .args = {0xFFFFFFFF00000001, 7, 0x1000}}),
      eperm));
  CHECK(same(filter_action(prog, call{.nr = nr("prlimit64"), .args = {1, 7, 0, 0x1000}}), allow));
  const auto setpriority = [&](std::uint64_t which, std::uint64_t who) {
    return filter_action(prog, call{.nr = nr("setpriority"), .args = {which, who, 10}});
  };
  CHECK(same(setpriority(0, 0), allow));                   // PRIO_PROCESS, self
  CHECK(same(setpriority(0, 2), allow));                   // PRIO_PROCESS, own pid
  CHECK(same(setpriority(1, 0), allow));                   // PRIO_PGRP, own group
  CHECK(same(setpriority(0, 1), eperm));                   // sandbox-init
  CHECK(same(setpriority(0, 0xFFFFFFFF00000001), eperm));  // the same to the kernel
  CHECK(same(setpriority(1, 1), eperm));                   // sandbox-init's group
  CHECK(same(setpriority(2, 0), eperm));                   // PRIO_USER: every process of a uid
  CHECK(same(setpriority(0xFFFFFFFF00000002, 0), eperm));
  CHECK(same(filter_action(prog, call{.nr = nr("sched_setscheduler"), .args = {2, 5, 0x1000}}),
             allow));  // SCHED_IDLE for an own process
  CHECK(same(filter_action(prog, call{.nr = nr("sched_setscheduler"), .args = {1, 5, 0x1000}}),
             eperm));
  CHECK(same(filter_action(prog, call{.nr = nr("sched_setaffinity"), .args = {3, 8, 0x1000}}),
             allow));
  CHECK(same(filter_action(prog, call{.nr = nr("ioprio_set"), .args = {1, 2, 0x6000}}),
             allow));  // IOPRIO_WHO_PROCESS, own pid, idle class
  CHECK(same(filter_action(prog, call{.nr = nr("ioprio_set"), .args = {1, 1, 0x6000}}), eperm));
  CHECK(same(filter_action(prog, call{.nr = nr("ioprio_set"), .args = {3, 0, 0x6000}}), eperm));
  CHECK(same(filter_action(prog, call{.nr = nr("sendto")}), allow));
  CHECK(same(filter_action(prog, call{.nr = nr("sendto"), .args = {3, 0, 0, 0, 0x1000, 16}}),
             notify));
  CHECK(same(filter_action(prog, call{.nr = nr("connect")}), notify));
  CHECK(same(filter_action(prog, call{.nr = nr("read")}), allow));
}
