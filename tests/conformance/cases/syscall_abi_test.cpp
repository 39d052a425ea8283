// Kind 4 — alternate system call ABIs and multiplexers: x32 numbers (nr | 0x40000000 through
// the 64-bit entry), i386 `int 0x80` from 64-bit code (machine code mmap'd and called through
// ctypes), the i386 multiplexer socketcall, and io_uring (which executes calls behind the
// filter's back). A non-native call never reaches the kernel's handler: on a backend whose
// code runs on the host kernel it is a `seccomp_violation` naming the ABI; io_uring_* answer
// ENOSYS so Node/libuv fall back and keep working.
//
// Whether the host kernel itself supports x32 and IA32 is detected *outside* the sandbox and
// printed (Catch WARN) with every case, so a pass that proves nothing on this kernel shows
// as such: without IA32 emulation `int 0x80` faults before any filter sees it; without x32
// the kernel would answer ENOSYS — but the filter still sees the x32 number and must refuse it.
#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "conformance/suite.hpp"

using conformance::js;
using conformance::py;
using nlohmann::json;
using sandbox::code;

namespace {

struct host_abis {
  bool x32 = false;
  bool ia32 = false;
};

/// Probes the host kernel from this (unsandboxed) process: an x32 getpid through the 64-bit
/// entry, and an i386 getpid through `int 0x80` in a forked child (which dies of SIGSEGV
/// where IA32 emulation is absent). Cached.
const host_abis& host_support() {
  static const host_abis abis = [] {
    host_abis a;
    long x = ::syscall(0x40000000L | 39 /* x32 getpid */);
    a.x32 = x == ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      // Only async-signal-safe work after fork: one raw call, then _exit.
      long ret = 20;  // i386 getpid
      asm volatile("int $0x80" : "+a"(ret) : : "memory");
      ::_exit(ret > 0 ? 0 : 1);
    }
    int status = 0;
    if (pid > 0 && ::waitpid(pid, &status, 0) == pid) {
      a.ia32 = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    return a;
  }();
  return abis;
}

void report_host_support() {
  const auto& a = host_support();
  WARN("host kernel: x32 ABI " << (a.x32 ? "supported" : "NOT supported")
                               << " (x32 cases only show the filter refusing the number; the "
                                  "kernel would answer ENOSYS anyway)"
                               << "; IA32 emulation " << (a.ia32 ? "supported" : "NOT supported")
                               << (a.ia32 ? ""
                                          : " (int 0x80 cases are VACUOUS here: the CPU "
                                            "faults before any filter runs)"));
}

// ctypes helpers: a page below 4 GiB (int 0x80 truncates pointers to 32 bits) holding code
// `push rbx; mov eax,NR; mov ebx,A; mov ecx,B; mov edx,C; int 0x80; pop rbx; ret` and data.
constexpr const char* py_int80 = R"PY(
import ctypes, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PAGE = libc.mmap(None, 8192, 7, 0x22 | 0x40, -1, 0)   # RWX, PRIVATE|ANON|MAP_32BIT
assert PAGE and PAGE < 2**32, PAGE
DATA = PAGE + 4096
def int80(nr, a=0, b=0, c=0):
    code = (b'\x53' + b'\xb8' + struct.pack('<I', nr) + b'\xbb' + struct.pack('<I', a & 0xffffffff) +
            b'\xb9' + struct.pack('<I', b & 0xffffffff) + b'\xba' + struct.pack('<I', c & 0xffffffff) +
            b'\xcd\x80\x5b\xc3')
    ctypes.memmove(PAGE, code, len(code))
    return ctypes.CFUNCTYPE(ctypes.c_int)(PAGE)()
def x32(nr, *args):
    return libc.syscall(ctypes.c_long(0x40000000 | nr), *[ctypes.c_long(a) for a in args])
)PY";

/// One non-native call per run (after `setup`, which runs natively): it must never return to
/// the program. Where the code runs on the host kernel, the host records a violation naming
/// the ABI (`prefix`) — for x32 even when the kernel lacks x32, since the number still passes
/// through the filter. Without IA32 emulation the CPU faults first (SIGSEGV): vacuous here.
void check_refused_abi(conformance::backend& b, const std::string& setup, const std::string& call,
                       const std::string& prefix, bool kernel_has_abi) {
  auto r = b.run(py(std::string(py_int80) + setup + "\nprint('before', flush=True)\nret = " + call +
                    "\nprint('after', ret, ctypes.get_errno(), flush=True)\n"));
  INFO("call: " << call);
  if (b.expect().output_survives_kill) CHECK(r.std_out.summary.rfind("before\n", 0) == 0);
  if (!b.expect().syscall_abi_on_host) {
    // A guest kernel of its own handles the call; the host is not involved.
    CHECK((r.code == code::ok || r.code == code::seccomp_violation));
    return;
  }
  CHECK(r.std_out.summary.find("after") == std::string::npos);
  if (kernel_has_abi || prefix == "x32:") {
    CHECK(r.code == code::seccomp_violation);
    REQUIRE(r.violation);
    CHECK(r.violation->rfind(prefix, 0) == 0);
  } else {
    CHECK(r.code == code::ok);
    CHECK(r.signal == SIGSEGV);
  }
}

}  // namespace

TEST_CASE("syscall ABI: i386 int 0x80 never reaches the kernel (getpid)", "[abi][core]") {
  CONFORMANCE_BACKEND(b);
  report_host_support();
  // i386 getpid.
  check_refused_abi(b, "", "int80(20)", "i386:", host_support().ia32);
}

TEST_CASE("syscall ABI: x32 connect to the network is refused (not an egress bypass)",
          "[abi][exfil][core]") {
  CONFORMANCE_BACKEND(b);
  report_host_support();
  // x32 socket(AF_INET, SOCK_STREAM) then x32 connect(1.1.1.1:80): would dodge a filter that
  // only inspects native connect.
  check_refused_abi(b,
                    "import socket\nfd = socket.socket().detach()\n"
                    "ctypes.memmove(DATA, struct.pack('<HH4s8x', 2, socket.htons(80), "
                    "bytes([1, 1, 1, 1])), 16)",
                    "x32(42, fd, DATA, 16)", "x32:", host_support().x32);
}

TEST_CASE(
    "syscall ABI: io_uring is ENOSYS, the program goes on; Node's libuv fs and timers "
    "work",
    "[abi][io_uring][node][core]") {
  CONFORMANCE_BACKEND(b);
  report_host_support();
  auto r = b.run(py(R"PY(
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
out = {}
for name, nr, args in [('io_uring_setup', 425, (8, params)), ('io_uring_enter', 426, (3, 1, 0, 0, None, 0)),
                       ('io_uring_register', 427, (3, 0, None, 0))]:
    rc = libc.syscall(nr, *args)
    out[name] = 'OK' if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), '?')
print(json.dumps(out))
)PY"));
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary ==
        "{\"io_uring_setup\": \"ENOSYS\", \"io_uring_enter\": \"ENOSYS\", "
        "\"io_uring_register\": \"ENOSYS\"}\n");

  auto n = b.run(js(R"JS(
const fs = require('fs'), os = require('os'), path = require('path');
const { execFileSync } = require('child_process');
(async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'uv-'));
  const f = path.join(dir, 'a.txt');
  fs.writeFileSync(f, 'sync');
  await fs.promises.writeFile(f + '.big', Buffer.alloc(1 << 20, 120));
  const big = await fs.promises.readFile(f + '.big');
  const cb = await new Promise((res, rej) => fs.readFile(f, 'utf8', (e, d) => (e ? rej(e) : res(d))));
  const fh = await fs.promises.open(f, 'r');
  const buf = Buffer.alloc(4);
  const { bytesRead } = await fh.read(buf, 0, 4, 0);
  await fh.close();
  const names = (await fs.promises.readdir(dir)).sort();
  await fs.promises.rename(f + '.big', f + '.moved');
  await fs.promises.unlink(f + '.moved');
  const t0 = Date.now();
  await new Promise((r) => setTimeout(r, 20));
  await new Promise((r) => setImmediate(r));
  let ticks = 0;
  await new Promise((r) => { const i = setInterval(() => { if (++ticks === 3) { clearInterval(i); r(); } }, 5); });
  const child = execFileSync(process.execPath, ['-e', 'process.stdout.write("child")']).toString();
  console.log(JSON.stringify({ sync: fs.readFileSync(f, 'utf8'), big: big.length, cb,
    read: buf.toString('utf8', 0, bytesRead), names, waited: Date.now() - t0 >= 19, ticks, child,
    uv: process.versions.uv }));
})().catch((e) => { console.log('ERR', e.code, e.message); process.exit(3); });
)JS"));
  CHECK(n.code == code::ok);
  REQUIRE(n.exit_code == 0);
  auto j = json::parse(b.blob(n.std_out.blob));
  INFO("node: " << j.dump());
  CHECK(j["sync"] == "sync");
  CHECK(j["big"] == 1 << 20);
  CHECK(j["cb"] == "sync");
  CHECK(j["read"] == "sync");
  CHECK(j["names"] == json::array({"a.txt", "a.txt.big"}));
  CHECK(j["waited"] == true);
  CHECK(j["ticks"] == 3);
  CHECK(j["child"] == "child");
}

TEST_CASE(
    "syscall ABI: every i386 and x32 variant of a forbidden or refused call is a "
    "violation, never the native treatment",
    "[abi][heavy]") {
  CONFORMANCE_BACKEND(b);
  report_host_support();
  const bool ia32 = host_support().ia32, x32 = host_support().x32;
  // i386: ptrace(PTRACE_ATTACH, 1), socketcall(SYS_SOCKET, [AF_VSOCK, SOCK_STREAM, 0]),
  // socket(AF_INET) directly, open("/etc/passwd"), mount, io_uring_setup, unshare(NEWUSER).
  const std::string data = "ctypes.memmove(DATA, ";
  check_refused_abi(b, "", "int80(26, 16, 1)", "i386:", ia32);
  check_refused_abi(b, data + "struct.pack('<III', 40, 1, 0), 12)", "int80(102, 1, DATA)",
                    "i386:", ia32);
  check_refused_abi(b, "", "int80(359, 2, 1, 0)", "i386:", ia32);
  check_refused_abi(b, data + "b'/etc/passwd\\0', 12)", "int80(5, DATA, 0)", "i386:", ia32);
  check_refused_abi(b, "", "int80(21, 0, 0, 0)", "i386:", ia32);
  check_refused_abi(b, "", "int80(425, 8, DATA)", "i386:", ia32);
  check_refused_abi(b, "", "int80(310, 0x10000000)", "i386:", ia32);
  // x32: getpid, ptrace (x32's own number 521), mount, io_uring_setup, unshare, socket.
  check_refused_abi(b, "", "x32(39)", "x32:", x32);
  check_refused_abi(b, "", "x32(521, 16, 1, 0, 0)", "x32:", x32);
  check_refused_abi(b, "", "x32(165, 0, 0, 0, 0, 0)", "x32:", x32);
  check_refused_abi(b, "", "x32(425, 8, DATA)", "x32:", x32);
  check_refused_abi(b, "", "x32(272, 0x10000000)", "x32:", x32);
  check_refused_abi(b, "", "x32(41, 40, 1, 0)", "x32:", x32);
}
