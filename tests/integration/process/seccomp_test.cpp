// seccomp: violations end the run with evidence the host recorded; refusals leave it running;
// nothing the program does to itself can fake a code.
#include <catch2/catch.hpp>

#include "integration/harness.hpp"

using sandbox::code;

TEST_CASE("seccomp: ptrace ends the run as a violation naming the call", "[seccomp]") {
  auto before = itest::snapshot();
  auto r = itest::run(R"PY(
import ctypes, os
print('before', flush=True)
ctypes.CDLL(None).ptrace(16, 1, 0, 0)  # PTRACE_ATTACH to PID 1
print('after')
)PY");
  CHECK(r.code == code::seccomp_violation);
  CHECK(r.violation == "ptrace");
  CHECK(r.std_out.summary == "before\n");
  CHECK(r.message.find("ptrace") != std::string::npos);
  itest::check_host_unchanged(before);
}

TEST_CASE("seccomp: an x32 system call number is a violation", "[seccomp][abi]") {
  auto r = itest::run(R"PY(
import ctypes
print('x32 result', ctypes.CDLL(None).syscall(0x40000000 | 39), flush=True)
)PY");
  CHECK(r.code == code::seccomp_violation);
  REQUIRE(r.violation);
  CHECK(r.violation->rfind("x32:", 0) == 0);
}

TEST_CASE("seccomp: refused calls return errors and the program goes on", "[seccomp]") {
  auto r = itest::run(R"PY(
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def err(rc):
    return errno.errorcode.get(ctypes.get_errno(), '?') if rc == -1 else 'OK'
out = [err(libc.syscall(425, 1, 0))]                       # io_uring_setup
out.append(err(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)))
out.append(err(libc.unshare(0x10000000)))                  # CLONE_NEWUSER
out.append(err(libc.syscall(435, 0, 0)))                   # clone3
try:
    socket.socket(40, socket.SOCK_STREAM); out.append('VSOCK')  # AF_VSOCK
except OSError as e: out.append(errno.errorcode[e.errno])
out.append(err(libc.syscall(250, 0, 0)))         # keyctl
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 15); out.append('UEVENT')  # KOBJECT_UEVENT
except OSError as e: out.append(errno.errorcode[e.errno])
socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()                 # NETLINK_ROUTE ok
# Calls newer than the filter are ENOSYS whether or not this kernel has them: statmount,
# listmount, open_tree_attr, and numbers no kernel has yet (up to the x32 range).
out += [err(libc.syscall(n, 0, 0, 0, 0)) for n in (457, 458, 467, 480, 511)]
print(' '.join(out))
)PY");
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary ==
        "ENOSYS EPERM EPERM ENOSYS EAFNOSUPPORT EPERM EPROTONOSUPPORT"
        " ENOSYS ENOSYS ENOSYS ENOSYS ENOSYS\n");
}

TEST_CASE("codes: a self-raised SIGSYS, exit(137) or exit(124) are not evidence",
          "[seccomp][lying]") {
  auto sigsys = itest::run("import os, signal\nos.kill(os.getpid(), signal.SIGSYS)");
  CHECK(sigsys.code == code::ok);
  CHECK(sigsys.signal == 31);
  auto e137 = itest::run("import sys\nsys.exit(137)");
  CHECK(e137.code == code::ok);
  CHECK(e137.exit_code == 137);
  auto e124 = itest::run("print('timeout')\nimport sys\nsys.exit(124)");
  CHECK(e124.code == code::ok);
  CHECK(e124.exit_code == 124);
  auto kill9 = itest::run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)");
  CHECK(kill9.code == code::ok);
  CHECK(kill9.signal == 9);
  CHECK(kill9.oom_kills == 0);
}

TEST_CASE("seccomp: no process may change another's limits or scheduling (PID 1 included)",
          "[seccomp][init]") {
  auto r = itest::run(R"PY(
import os, resource, errno
out = []
def attempt(f):
    try:
        f(); out.append('OK')
    except OSError as e: out.append(errno.errorcode[e.errno])
attempt(lambda: resource.prlimit(1, resource.RLIMIT_CPU, (0, 0)))
attempt(lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
attempt(lambda: os.sched_setaffinity(1, {0}))
attempt(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))   # our own: fine
attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, 5))                  # our own: fine
print(' '.join(out))
)PY");
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "EPERM EPERM EPERM OK OK\n");
}
