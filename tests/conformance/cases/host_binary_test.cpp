// Kind 1 — reaching the host binary or the runtime from inside (the runc CVE-2019-5736
// class): writable handles to the helper and the interpreter through /proc/<pid>/exe,
// /proc/self/exe and /proc/1/exe, by path, through an O_PATH handle re-opened via
// /proc/self/fd, through /proc/self/map_files, and on a running child's executable. The
// helper (PID 1 of the run) must be neither writable nor dumpable from inside, and the host
// binaries (the supervising process, the image's interpreters and libc as stored on the host)
// hash the same after the run as before.
//
// Write attempts that would succeed write back the byte already there, so a broken sandbox
// fails the case without destroying the shared image.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "conformance/suite.hpp"

using conformance::js;
using conformance::py;
using nlohmann::json;
using sandbox::code;

namespace {

constexpr const char* py_attack = R"PY(
import os, sys, json, errno, subprocess, time
res = {}
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
def attempt(label, fn):
    try:
        r = fn()
        res[label] = 'OK' if r is None else r
    except OSError as e:
        res[label] = err(e)
def open_write(path, flags):
    def f():
        fd = os.open(path, flags)
        try:
            # Write back the first byte unchanged: proves writability, changes nothing.
            first = os.pread(fd, 1, 0) if flags & os.O_RDWR else b'\x7f'
            os.pwrite(fd, first, 0)
        finally:
            os.close(fd)
    return f
def reopen(path):
    # runc's CVE-2019-5736: hold an O_PATH handle, re-open it for writing through /proc.
    def f():
        p = os.open(path, os.O_PATH)
        try:
            open_write(f'/proc/self/fd/{p}', os.O_WRONLY)()
        finally:
            os.close(p)
    return f
def meta(path):
    def f():
        st = os.stat(path)
        os.chmod(path, st.st_mode & 0o7777)         # same mode
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return f
def truncate_same(path):
    def f():
        os.truncate(path, os.stat(path).st_size)
    return f
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
time.sleep(0.05)
libc = next((l.split()[-1] for l in open('/proc/self/maps') if 'libc.so' in l), '/usr/lib/x86_64-linux-gnu/libc.so.6')
targets = {
    'self_exe': '/proc/self/exe',
    'pid_exe': f'/proc/{os.getpid()}/exe',
    'exe_path': os.path.realpath('/proc/self/exe'),
    'sys_executable': sys.executable,
    'child_exe': f'/proc/{child.pid}/exe',
    'thread_exe': f'/proc/self/task/{os.getpid()}/exe',
    'parent_exe': f'/proc/{os.getppid()}/exe',
    'init_exe': '/proc/1/exe',
    'libc': libc,
}
map_files = []
try:
    map_files = sorted(os.listdir('/proc/self/map_files'))[:2]
except OSError as e:
    res['list map_files'] = err(e)
for m in map_files:
    targets['map_files ' + m] = '/proc/self/map_files/' + m
for name, path in targets.items():
    attempt(f'{name} O_WRONLY', open_write(path, os.O_WRONLY))
    attempt(f'{name} O_RDWR', open_write(path, os.O_RDWR))
    attempt(f'{name} O_APPEND', open_write(path, os.O_WRONLY | os.O_APPEND))
    attempt(f'{name} reopen', reopen(path))
    attempt(f'{name} chmod/utime', meta(path))
    attempt(f'{name} truncate', truncate_same(path))
# The helper: not visible, not readable, not dumpable.
helper = {}
for f in ('exe', 'mem', 'environ', 'maps', 'fd', 'root', 'cwd', 'status', 'auxv', 'comm'):
    p = '/proc/1/' + f
    try:
        if f in ('exe', 'root', 'cwd'):
            helper[f] = 'readlink ' + os.readlink(p)
        elif f == 'fd':
            helper[f] = 'listed ' + ','.join(os.listdir(p))
        else:
            with open(p, 'rb') as fh:
                fh.read(64)
            helper[f] = 'read'
    except OSError as e:
        helper[f] = err(e)
# Each of the helper's descriptors, opened through /proc (the way to reach its control
# channel or the run's pipes if they were listed).
for n in range(0, 8):
    p = f'/proc/1/fd/{n}'
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
        try:
            helper[f'fd/{n}'] = 'OK ' + os.readlink(f'/proc/self/fd/{fd}')
        finally:
            os.close(fd)
    except OSError as e:
        helper[f'fd/{n}'] = err(e)
environ1 = ''
try:
    environ1 = open('/proc/1/environ', 'rb').read().decode('latin-1')
except OSError:
    pass
visible = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
child.kill(); child.wait()
print(json.dumps({'attempts': res, 'helper': helper, 'visible': visible, 'self': os.getpid(),
                  'environ1': environ1,
                  'child': child.pid, 'ppid': os.getppid()}))
)PY";

}  // namespace

TEST_CASE(
    "host binary: the interpreter, its libc and the helper cannot be opened for writing "
    "through /proc/*/exe or by path (Python)",
    "[hostbin][core]") {
  CONFORMANCE_BACKEND(b);
  const auto before = conformance::host_binary_hashes(b.rt());
  REQUIRE(before.size() >= 2);  // the supervisor and at least one interpreter
  auto r = b.run(py(py_attack, std::chrono::milliseconds(8000)));
  REQUIRE(r.code == code::ok);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  CHECK(j["attempts"].size() >= 54);
  for (auto& [label, result] : j["attempts"].items()) {
    INFO(label);
    CHECK(result != "OK");
  }
  // The helper (PID 1) shows nothing: not its executable, memory, environment or files —
  // where the backend cannot hide it (expectations::init_hidden), nothing beyond what a
  // non-dumpable root process shows (init_entry_allowed): never its memory, executable,
  // root, working directory or a descriptor other than /dev/null.
  CHECK(j["helper"].size() == 18);
  for (auto& [what, result] : j["helper"].items()) {
    INFO("/proc/1/" << what << " -> " << result);
    CHECK(conformance::init_entry_allowed(b.expect(), what, result.get<std::string>()));
  }
  // Whatever of its environment shows holds nothing of the host's.
  const std::string environ1 = j["environ1"];
  CHECK(environ1.find("conformance-canary") == std::string::npos);
  if (b.expect().init_hidden) CHECK(environ1.empty());
  // Only the program's own processes are visible (and PID 1, where it cannot be hidden).
  std::set<int> own = {j["self"].get<int>(), j["child"].get<int>()};
  if (!b.expect().init_hidden) own.insert(1);
  for (const auto& pid : j["visible"]) {
    INFO("visible pid " << pid);
    CHECK(own.count(pid.get<int>()) == 1);
  }
  CHECK(conformance::host_binary_hashes(b.rt()) == before);
}

TEST_CASE("host binary: Node cannot open its own executable or the helper for writing",
          "[hostbin][node][core]") {
  CONFORMANCE_BACKEND(b);
  const auto before = conformance::host_binary_hashes(b.rt());
  auto r = b.run(js(R"JS(
const fs = require('fs');
const C = fs.constants;
const out = {};
const targets = { self_exe: '/proc/self/exe', exec_path: process.execPath,
  real: fs.realpathSync('/proc/self/exe'), init_exe: '/proc/1/exe',
  parent_exe: '/proc/' + process.ppid + '/exe' };
for (const [name, p] of Object.entries(targets)) {
  for (const [mode, flags] of [['O_WRONLY', C.O_WRONLY], ['O_RDWR', C.O_RDWR],
                               ['O_APPEND', C.O_WRONLY | C.O_APPEND]]) {
    try {
      const fd = fs.openSync(p, flags);
      const first = Buffer.alloc(1);
      if (flags & C.O_RDWR) fs.readSync(fd, first, 0, 1, 0); else first[0] = 0x7f;
      fs.writeSync(fd, first, 0, 1, 0);
      fs.closeSync(fd);
      out[name + ' ' + mode] = 'OK';
    } catch (e) { out[name + ' ' + mode] = e.code; }
  }
  try { const st = fs.statSync(p); fs.chmodSync(p, st.mode & 0o7777); out[name + ' chmod'] = 'OK'; }
  catch (e) { out[name + ' chmod'] = e.code; }
}
let init;
try { init = fs.readlinkSync('/proc/1/exe'); } catch (e) { init = e.code; }
console.log(JSON.stringify({ attempts: out, init }));
)JS"));
  REQUIRE(r.code == code::ok);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  CHECK(j["attempts"].size() == 20);
  for (auto& [label, result] : j["attempts"].items()) {
    INFO(label);
    CHECK(result != "OK");
  }
  CHECK(j["init"].get<std::string>().rfind("/", 0) != 0);  // PID 1's executable is not shown
  CHECK(conformance::host_binary_hashes(b.rt()) == before);
}

TEST_CASE(
    "host binary: a child's /proc/<pid>/exe stays closed while it execs and exits, "
    "repeatedly",
    "[hostbin][heavy]") {
  CONFORMANCE_BACKEND(b);
  // The race of CVE-2019-5736: open a process's exe at the moment it execs. Here children
  // exec the interpreter again and again while the parent keeps trying their /proc/<pid>/exe.
  const auto before = conformance::host_binary_hashes(b.rt());
  auto r = b.run(py(R"PY(
import os, sys, errno, json
hits, errs = 0, {}
for i in range(40):
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'pass'])
    for _ in range(200):
        try:
            fd = os.open(f'/proc/{pid}/exe', os.O_WRONLY)
            hits += 1
            os.close(fd)
        except OSError as e:
            k = errno.errorcode.get(e.errno, str(e.errno)); errs[k] = errs.get(k, 0) + 1
    os.waitpid(pid, 0)
print(json.dumps({'hits': hits, 'errors': errs}))
)PY",
                    std::chrono::milliseconds(8000)));
  REQUIRE(r.code == code::ok);
  REQUIRE(r.exit_code == 0);
  auto j = json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  CHECK(j["hits"] == 0);
  CHECK(conformance::host_binary_hashes(b.rt()) == before);
}
