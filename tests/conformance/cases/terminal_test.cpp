// Kind 3 — terminal injection: the host itself runs under a real pty (`sandboxctl run` with a
// pseudo-terminal as its controlling terminal and stdio, like an operator's shell), and the
// sandboxed code tries TIOCSTI / TIOCLINUX on every descriptor and terminal it can find.
// Nothing may land in the terminal's input queue (where the operator's shell would read it as
// typed commands), and the code has no controlling terminal: /dev/tty fails, ttyname fails.
// Its own pseudo-terminals are allowed — a devpts instance of the run's own, in which none of
// the host's ptys (the operator's terminal above) exists — and TIOCSTI/TIOCLINUX are refused
// on them too.
//
// A control run of the same harness with an *unsandboxed* program shows the check can fail:
// where the kernel lets a process inject into its own terminal (root, or legacy TIOCSTI
// enabled), the injected bytes are seen.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "conformance/suite.hpp"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct pty_outcome {
  int status = -1;       ///< exit status (128+N when killed by signal N)
  std::string output;    ///< everything written to the terminal
  std::string injected;  ///< what sits in the terminal's input queue afterwards
  bool started = false;
};

/// Runs argv (an absolute path, no shell) as a session leader whose controlling terminal and
/// stdio are the slave side of a fresh pty; collects what it writes, then reads the slave's
/// input queue (raw mode, so every injected byte counts, newline or not).
pty_outcome run_under_pty(const std::vector<std::string>& args,
                          std::chrono::seconds limit = std::chrono::seconds(30)) {
  pty_outcome o;
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) {
    if (master >= 0) ::close(master);
    return o;
  }
  char name[128] = {};
  if (::ptsname_r(master, name, sizeof name) != 0) {
    ::close(master);
    return o;
  }
  // Our own handle on the slave (no controlling-terminal side effects): keeps the terminal
  // alive after the child exits and lets us look at its input queue.
  int slave = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) {
    ::close(master);
    return o;
  }
  termios tio{};
  ::tcgetattr(slave, &tio);
  ::cfmakeraw(&tio);
  tio.c_oflag |= OPOST | ONLCR;  // keep output readable
  ::tcsetattr(slave, TCSANOW, &tio);

  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
                                 "TERM=xterm"};
  for (const char* keep :
       {"ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS", "LSAN_OPTIONS", "HOME"}) {
    if (const char* v = std::getenv(keep)) env_s.push_back(std::string(keep) + "=" + v);
  }
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  // Between fork and exec only async-signal-safe calls: a new session, the pty as its
  // controlling terminal (open without O_NOCTTY + TIOCSCTTY), and as 0, 1, 2.
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();
    int t = ::open(name, O_RDWR);
    if (t < 0 || ::ioctl(t, TIOCSCTTY, 0) < 0) ::_exit(120);
    ::dup2(t, 0);
    ::dup2(t, 1);
    ::dup2(t, 2);
    if (t > 2) ::close(t);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (pid < 0) {
    ::close(master);
    ::close(slave);
    return o;
  }
  o.started = true;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  bool exited = false;
  char buf[4096];
  while (!exited) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 20) > 0 && (p.revents & POLLIN)) {
      ssize_t n = ::read(master, buf, sizeof buf);
      if (n > 0) o.output.append(buf, static_cast<std::size_t>(n));
    }
    pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) exited = true;
    if (!exited && std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      exited = true;
      o.output += "\n[killed: time limit]\n";
    }
  }
  // The rest of the output.
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) break;
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;
    o.output.append(buf, static_cast<std::size_t>(n));
  }
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  // The input queue: what the terminal's reader (the operator's shell) would get next.
  int queued = 0;
  ::ioctl(slave, FIONREAD, &queued);
  ::fcntl(slave, F_SETFL, O_NONBLOCK);
  for (;;) {
    ssize_t n = ::read(slave, buf, sizeof buf);
    if (n <= 0) break;
    o.injected.append(buf, static_cast<std::size_t>(n));
  }
  if (o.injected.empty() && queued > 0) o.injected = "<" + std::to_string(queued) + " bytes>";
  ::close(slave);
  ::close(master);
  return o;
}

/// A scratch directory for sandboxctl's state, script and ticket; removed afterwards.
struct ctl_dir {
  fs::path path;
  ctl_dir() {
    path = conformance::state_root() /
           ("tty-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::create_directories(path);
    fs::permissions(path, fs::perms(0755));
  }
  ~ctl_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

/// `sandboxctl run` of `script` (runtime from its extension) under a pty, with this backend's
/// level in the ticket and the suite's image dir and cgroup parent; deadline and ceiling have
/// the level's start-up allowance on top.
pty_outcome sandboxctl_under_pty(const conformance::backend& b, const std::string& script_name,
                                 const std::string& source) {
  ctl_dir dir;
  std::ofstream(dir.path / script_name) << source;
  std::ofstream(dir.path / "ticket.json")
      << R"({"v":1,"id":"tty","tenant":"conformance","actions":["code.execute"],"isolation":")"
      << sandbox::to_string(b.profile().level) << R"(","max_timeout_ms":)"
      << 8000 + conformance::startup_allowance().count() << R"(,"max_memory_bytes":536870912})";
  std::vector<std::string> args{
      SANDBOXCTL_PATH, "run",
      "--state-dir",   (dir.path / "state").string(),
      "--blob-dir",    (dir.path / "blobs").string(),
      "--ticket",      (dir.path / "ticket.json").string(),
      "--timeout-ms",  std::to_string(5000 + conformance::startup_allowance().count())};
  if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) {
    args.insert(args.end(), {"--image-dir", d});
  }
  if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) {
    args.insert(args.end(), {"--cgroup-parent", p});
  }
  if (!b.profile().host_config.empty()) {
    std::ofstream(dir.path / "config.json") << b.profile().host_config;
    args.insert(args.end(), {"--config", (dir.path / "config.json").string()});
  }
  args.push_back((dir.path / script_name).string());
  return run_under_pty(args, std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::seconds(30) + conformance::startup_allowance()));
}

/// The JSON line the hostile program printed (the terminal turns \n into \r\n).
json find_report(const std::string& output) {
  auto start = output.find("{\"");
  if (start == std::string::npos) return json();
  auto end = output.find('\n', start);
  std::string line = output.substr(start, end == std::string::npos ? end : end - start);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
  return json::parse(line, nullptr, false);
}

// Tries TIOCSTI and TIOCLINUX on 0..2, every other open descriptor, /dev/tty, /dev/console,
// /dev/ptmx, the pts devices and whatever /proc shows of other processes' descriptors.
constexpr const char* py_injector = R"PY(
import os, fcntl, termios, errno, json, struct, glob
res = {}
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
try:
    pts = sorted(os.listdir('/dev/pts'))
except OSError as e:
    pts = err(e)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def ioctl(fd, cmd, arg):
    rc = libc.ioctl(fd, ctypes.c_ulong(cmd), arg)
    return 'OK' if rc == 0 else errno.errorcode.get(ctypes.get_errno(), '?')
def inject(label, fd):
    c = ctypes.c_char(b'X')
    sel = ctypes.c_char(b'\x02')  # TIOCL_SETSEL
    for name, cmd, arg in [('TIOCSTI', 0x5412, c), ('TIOCLINUX', 0x541C, sel)]:
        r = 'OK'
        if name == 'TIOCSTI':
            for ch in b'echo INJECTED\n':
                c.value = bytes([ch])
                r = ioctl(fd, cmd, ctypes.byref(c))
                if r != 'OK': break
        else:
            r = ioctl(fd, cmd, ctypes.byref(arg))
        res[f'{label} {name}'] = r
        # The same command with the register's upper half set: the kernel only looks at the
        # low 32 bits, so it must be refused exactly like the plain form.
        res[f'{label} {name} high-bits'] = ioctl(fd, 0xFFFFFFFF00000000 | cmd, ctypes.byref(arg))
for fd in range(0, 64):
    try:
        os.fstat(fd)
    except OSError:
        continue
    inject(f'fd{fd}', fd)
paths = ['/dev/tty', '/dev/console', '/dev/ptmx', '/dev/tty0', '/dev/tty1'] + glob.glob('/dev/pts/*')
paths += glob.glob('/proc/[0-9]*/fd/[0-9]*')
opened = {}
for p in paths:
    try:
        fd = os.open(p, os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        opened[p] = err(e)
        continue
    opened[p] = 'OK'
    if os.isatty(fd):
        inject(p, fd)
    os.close(fd)
ttynames = {}
for fd in (0, 1, 2):
    try:
        ttynames[fd] = os.ttyname(fd)
    except OSError as e:
        ttynames[fd] = err(e)
try:
    os.open('/dev/tty', os.O_RDWR); ctty = 'OK'
except OSError as e:
    ctty = err(e)
stat = open('/proc/self/stat').read().rsplit(')', 1)[1].split()
print(json.dumps({'ioctl': res, 'opened': opened, 'pts': pts, 'ttyname': ttynames, 'dev_tty': ctty,
                  'tty_nr': int(stat[4]), 'isatty': [os.isatty(i) for i in (0, 1, 2)],
                  'sid_is_self': os.getsid(0) == os.getpid()}), flush=True)
# Output that a terminal would act on: set the title then ask for it back (answered as typed
# input by some terminals), device status report, clipboard write, DCS, and the C1 forms.
import sys
payload = ('\x1b]2;;echo INJECTED\x07\x1b[21t\x1b[6n\x1b]52;c;ZWNobyBJTkpFQ1RFRA==\x07'
           '\x1bP+q544e\x1b\\\u009b6n\u009d0;x\u009c\r\x08\x7f')
sys.stdout.write(payload); sys.stdout.flush()
sys.stderr.write(payload); sys.stderr.flush()
os.write(1, b'\x9b6n\x1b[6n\n')
)PY";

void check_no_terminal(const conformance::backend& b, const json& j) {
  INFO("inside: " << j.dump());
  REQUIRE(j.is_object());
  for (auto& [label, result] : j["ioctl"].items()) {
    INFO(label);
    CHECK(result != "OK");
    // Upper bits of the command change nothing: the answer is the plain command's.
    if (label.size() > 10 && label.substr(label.size() - 10) == " high-bits") {
      CHECK(result == j["ioctl"][label.substr(0, label.size() - 10)]);
    }
  }
  // The run's devpts holds nothing of the host's: only its multiplexer, before the code
  // opened a pty of its own.
  CHECK(j["pts"] == nlohmann::json::array({"ptmx"}));
  for (auto& [path, result] : j["opened"].items()) {
    INFO(path);
    // Only the run's own descriptors may open; none of them is a terminal (checked above).
    if (path.rfind("/proc/", 0) == 0) continue;
    // ...and its own pty multiplexer: a new pty of the run's own instance, on which the
    // injections above were refused like everywhere else.
    if (path == "/dev/ptmx" || path == "/dev/pts/ptmx") {
      CHECK(result == "OK");
      CHECK(j["ioctl"].contains(path + " TIOCSTI"));
      continue;
    }
    CHECK(result != "OK");
  }
  for (auto& [fd, name] : j["ttyname"].items()) CHECK(name != "OK");
  for (auto& [fd, name] : j["ttyname"].items())
    CHECK(name.get<std::string>().rfind("/dev/", 0) != 0);
  CHECK(j["dev_tty"] != "OK");
  CHECK(j["tty_nr"] == 0);  // no controlling terminal
  CHECK(j["isatty"] == json::array({false, false, false}));
}

bool legacy_tiocsti_possible() {
  if (::geteuid() == 0) return true;  // CAP_SYS_ADMIN may always inject into its own tty
  std::ifstream in("/proc/sys/dev/tty/legacy_tiocsti");
  int v = 1;  // kernels without the knob allow it
  if (in) in >> v;
  return v != 0;
}

}  // namespace

TEST_CASE(
    "terminal: with the host under a real pty, TIOCSTI/TIOCLINUX inject nothing and "
    "the code has no controlling terminal (Python)",
    "[tty][core]") {
  CONFORMANCE_BACKEND(b);
  auto o = sandboxctl_under_pty(b, "inject.py", py_injector);
  INFO("terminal output:\n" << o.output);
  REQUIRE(o.started);
  CHECK(o.status == 0);  // `ok`
  CHECK(o.injected == "");
  // The program's control sequences reach the operator's terminal only escaped: no ESC, BEL,
  // backspace, DEL or C1 control (raw or UTF-8 encoded) from it comes out.
  for (const std::string bad : {"\x1b", "\x07", "\x08", "\x7f", "\xc2\x9b", "\xc2\x9d", "\x9b"}) {
    INFO("control bytes " << sandbox::escape_for_display(bad));
    CHECK(o.output.find(bad) == std::string::npos);
  }
  CHECK(o.output.find("\\x1b]2;;echo INJECTED") != std::string::npos);  // shown, escaped
  check_no_terminal(b, find_report(o.output));
}

TEST_CASE("terminal: a pty of the run's own opens and round-trips; pty.fork gets a terminal",
          "[tty][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = b.run(conformance::py(R"PY(
import errno, fcntl, json, os, pty, termios
res = {}
m, s = os.openpty()
res['name'] = os.ttyname(s)
attrs = termios.tcgetattr(s)
attrs[3] &= ~termios.ECHO
termios.tcsetattr(s, termios.TCSANOW, attrs)
os.write(m, b'ping\n')
res['slave_read'] = os.read(s, 100).decode()
os.write(s, b'pong\n')
got = b''
while not got.endswith(b'\n'):
    got += os.read(m, 100)
res['master_read'] = got.decode()
try:
    fcntl.ioctl(s, termios.TIOCSTI, b'x'); res['tiocsti'] = 'OK'
except OSError as e:
    res['tiocsti'] = errno.errorcode[e.errno]
pid, fd = pty.fork()
if pid == 0:
    try:
        tty = 'OK' if os.open('/dev/tty', os.O_RDWR) >= 0 else '?'
    except OSError as e:
        tty = errno.errorcode[e.errno]
    print('child', os.ttyname(0), os.isatty(1), tty, flush=True)
    os._exit(0)
out = b''
while not out.endswith(b'\n'):
    out += os.read(fd, 1024)
res['fork'] = out.decode()
res['status'] = os.waitpid(pid, 0)[1]
# The child is gone and no slave descriptor is left: EIO (a pexpect-style EOF), where the
# kernel gives one; polled, so a kernel that would wait instead is seen, not waited on.
import select
if select.select([fd], [], [], 2)[0]:
    try:
        res['after'] = 'data %r' % os.read(fd, 1024)
    except OSError as e:
        res['after'] = errno.errorcode[e.errno]
else:
    res['after'] = 'waits'
print(json.dumps(res))
)PY"));
  INFO("stderr: " << r.std_err.summary);
  REQUIRE(r.code == sandbox::code::ok);
  auto j = json::parse(b.blob(r.std_out.blob), nullptr, false);
  INFO("inside: " << j.dump());
  REQUIRE(j.is_object());
  CHECK(j["name"] == "/dev/pts/0");  // numbered from 0: an instance of the run's own
  CHECK(j["slave_read"] == "ping\n");
  CHECK(j["master_read"] == "pong\r\n");
  CHECK(j["tiocsti"] == "EPERM");
  // The child's controlling terminal is the new pty (/dev/tty names it, where it can).
  CHECK(j["fork"] ==
        (b.expect().linux_pty ? "child /dev/pts/1 True OK\r\n" : "child /dev/pts/1 True EIO\r\n"));
  CHECK(j["status"] == 0);
  CHECK(j["after"] == (b.expect().linux_pty ? "EIO" : "waits"));
}

TEST_CASE("terminal: the harness sees an injection by an unsandboxed program (control)",
          "[tty][core]") {
  // The same pty harness around a host program that *is* allowed to inject (not sandboxed):
  // shows that the input-queue check would catch a sandbox that let TIOCSTI through, and that
  // the child really had the pty as its controlling terminal.
  const bool can_inject = legacy_tiocsti_possible();
  auto o = run_under_pty({"/usr/bin/python3", "-c", R"PY(
import fcntl, termios, os, sys
print('ctty', os.ttyname(0), os.open('/dev/tty', os.O_RDWR) >= 0, flush=True)
try:
    for ch in b'echo INJECTED\n':
        fcntl.ioctl(0, termios.TIOCSTI, bytes([ch]))
    print('injected', flush=True)
except OSError as e:
    print('refused', e.errno, flush=True)
)PY"});
  INFO("terminal output:\n" << o.output);
  REQUIRE(o.started);
  CHECK(o.status == 0);
  CHECK(o.output.find("ctty /dev/pts/") != std::string::npos);
  if (can_inject) {
    CHECK(o.output.find("injected") != std::string::npos);
    CHECK(o.injected == "echo INJECTED\n");
  } else {
    WARN(
        "this host refuses TIOCSTI to unprivileged processes (dev.tty.legacy_tiocsti=0): the "
        "control cannot show an injection being detected");
  }
}

TEST_CASE("terminal: Node under a host pty sees no terminal", "[tty][node][heavy]") {
  CONFORMANCE_BACKEND(b);
  auto o = sandboxctl_under_pty(b, "tty.js", R"JS(
const tty = require('tty'), fs = require('fs');
let devtty;
try { fs.openSync('/dev/tty', 'r+'); devtty = 'OK'; } catch (e) { devtty = e.code; }
const stat = fs.readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ');
console.log(JSON.stringify({ isatty: [0, 1, 2].map((fd) => tty.isatty(fd)), devtty,
  tty_nr: Number(stat[4]), stdoutTTY: !!process.stdout.isTTY, stdinTTY: !!process.stdin.isTTY }));
)JS");
  INFO("terminal output:\n" << o.output);
  REQUIRE(o.started);
  CHECK(o.status == 0);
  CHECK(o.injected == "");
  auto j = find_report(o.output);
  INFO("inside: " << j.dump());
  REQUIRE(j.is_object());
  CHECK(j["isatty"] == json::array({false, false, false}));
  CHECK(j["devtty"] != "OK");
  CHECK(j["tty_nr"] == 0);
  CHECK(j["stdoutTTY"] == false);
  CHECK(j["stdinTTY"] == false);
}
