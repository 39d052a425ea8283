// Kind 8 — escaping the run's lifetime: double fork + setsid + ignored SIGTERM/SIGHUP + closed
// descriptors; a grandchild holding the stdout pipe after the main process exits; a
// busy-looping daemon; a daemon that keeps forking while it is killed. After the result is
// returned the run's cgroup is gone and no process of it exists anywhere on the host (the
// case guard's snapshot: run cgroups, processes in them or with a sandbox uid).
//
// The rule for "main exited, descendants still alive" (DESIGN.md, life of a run, step 6;
// policy `exit_grace`, 100 ms by default):
//  - the run ends when the main process has exited and stdout and stderr are closed;
//  - descendants that still hold stdout or stderr get `exit_grace` after the main process
//    exits; what they write meanwhile is kept;
//  - then, or at once when no descendant holds a stream, every process of the run is killed
//    (whatever it ignores, wherever it moved in its session or process group) and the result
//    is `ok` with the main process's exit status: descendants can neither hold the run open
//    until the deadline nor turn it into a `timeout`.
// The cases use waits far longer than the grace (seconds), so they prove the rule without
// asserting on time.
#include <catch2/catch.hpp>
#include <string>

#include "conformance/suite.hpp"

using conformance::js;
using conformance::py;
using sandbox::code;
using namespace std::chrono_literals;

namespace {

/// A daemon (no streams held) that writes `marker` into the output directory after `delay_s`
/// seconds: if it is still alive then, the run outlived the rule.
std::string late_marker(const std::string& marker, double delay_s) {
  return "\nimport os as _os, time as _time\n"
         "if _os.fork() == 0:\n"
         "    _os.setsid()\n"
         "    if _os.fork() == 0:\n"
         "        _os.closerange(0, 3)\n"
         "        _time.sleep(" +
         std::to_string(delay_s) +
         ")\n"
         "        open(_os.environ['SANDBOX_OUTPUT_DIR'] + '/" +
         marker +
         "', 'w').write('alive')\n"
         "    _os._exit(0)\n"
         "_os.wait()\n";
}

void check_no_marker(const sandbox::run_result& r) {
  for (const auto& f : r.files_out) CHECK(f.name.rfind("late", 0) != 0);
}

}  // namespace

TEST_CASE(
    "lifetime: a double-forked, setsid'd daemon ignoring SIGTERM/SIGHUP with its "
    "descriptors closed dies with the run",
    "[lifetime][core]") {
  CONFORMANCE_BACKEND(b);
  // The daemon holds no stream, so the run ends when the main process exits: `ok`, never a
  // timeout, and the daemon is gone (case guard). A second daemon shows it did not survive.
  auto r = b.run(
      py(conformance::helper_source("daemonize.py") + late_marker("late", 3) + "print('main done')",
         6000ms));
  CHECK(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary == "main done\n");
  check_no_marker(r);
}

TEST_CASE(
    "lifetime: a grandchild holding stdout after the main process exits gets the grace, "
    "then dies",
    "[lifetime][core]") {
  CONFORMANCE_BACKEND(b);
  auto rs = b.run_all({
      // Writes forever.
      py(R"PY(
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    print('grandchild started', flush=True)
    while True:
        sys.stdout.write('.'); sys.stdout.flush(); time.sleep(0.01)
time.sleep(0.2)
print('main exits', flush=True)
)PY",
         6000ms),
      // Holds stdout and stderr silently, then would write after three seconds.
      py(R"PY(
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        time.sleep(3)
        print('late', flush=True)
        os._exit(0)
    os._exit(0)
os.wait()
print('main exits', flush=True)
sys.exit(3)
)PY",
         6000ms),
      // Holds only stderr (stdout closed).
      py(R"PY(
import os, sys, time
if os.fork() == 0:
    os.close(1)
    time.sleep(3)
    os.write(2, b'late')
    os._exit(0)
print('main exits', flush=True)
)PY",
         6000ms),
  });
  for (auto& r : rs) {
    INFO(sandbox::encode(r));
    CHECK(r.code == code::ok);
    CHECK(r.std_out.summary.find("main exits") != std::string::npos);
    CHECK(r.std_out.summary.find("late") == std::string::npos);
    CHECK(r.std_err.summary.find("late") == std::string::npos);
  }
  CHECK(rs[0].exit_code == 0);
  CHECK(rs[0].std_out.summary.rfind("grandchild started\n", 0) == 0);
  CHECK(rs[1].exit_code == 3);
  CHECK(rs[1].std_out.summary == "main exits\n");
  CHECK(rs[2].exit_code == 0);
}

TEST_CASE("lifetime: a busy-looping daemon is killed when the main process exits",
          "[lifetime][core]") {
  CONFORMANCE_BACKEND(b);
  auto rs = b.run_all({
      // Busy loop, no streams.
      py(R"PY(
import os, signal
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
            signal.signal(s, signal.SIG_IGN)
        os.closerange(0, 1024)
        while True:
            pass
    os._exit(0)
os.wait()
print('main done')
)PY" + late_marker("late", 3),
         6000ms),
      // Busy loop holding stdout.
      py(R"PY(
import os
if os.fork() == 0:
    os.setsid()
    while True:
        pass
print('main done')
)PY",
         6000ms),
      // Node: a detached child with inherited stdio and unref'd, spinning.
      js(R"JS(
const { spawn } = require('child_process');
const c = spawn(process.execPath, ['-e', 'process.on("SIGTERM", () => {}); for (;;) {}'],
                { detached: true, stdio: 'inherit' });
c.unref();
console.log('main done');
)JS",
         6000ms),
  });
  for (auto& r : rs) {
    INFO(sandbox::encode(r));
    CHECK(r.code == code::ok);
    CHECK(r.exit_code == 0);
    CHECK(r.std_out.summary == "main done\n");
    check_no_marker(r);
  }
}

TEST_CASE("lifetime: a daemon that keeps forking while it is killed leaves nothing behind",
          "[lifetime][core]") {
  CONFORMANCE_BACKEND(b);
  // Each generation forks a replacement and exits (a moving target for anyone killing pids
  // one by one), in its own session and process group, ignoring every catchable signal.
  auto r = b.run(py(R"PY(
import os, signal, time
if os.fork() == 0:
    os.setsid()
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(s, signal.SIG_IGN)
    os.closerange(0, 1024)
    while True:
        try:
            if os.fork() != 0:
                os._exit(0)
            os.setpgid(0, 0)
        except OSError:
            time.sleep(0.001)
time.sleep(0.2)
print('main done')
)PY" + late_marker("late", 3),
                    6000ms));
  CHECK(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary == "main done\n");
  check_no_marker(r);
}

TEST_CASE("lifetime: descendants of a run that times out die with it", "[lifetime][core]") {
  CONFORMANCE_BACKEND(b);
  // The main process never exits: the deadline ends the run, and the daemon, the forking
  // daemon and a subreaper's children all go with it.
  auto r = b.run(py(conformance::helper_source("daemonize.py") + R"PY(
import ctypes, os, time
libc = ctypes.CDLL(None)
if os.fork() == 0:
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below come to us
    for i in range(4):
        if os.fork() == 0:
            if os.fork() == 0:
                time.sleep(100)
            os._exit(0)
    while True:
        try: os.wait()
        except ChildProcessError: time.sleep(0.05)
print('waiting', flush=True)
time.sleep(100)
)PY",
                    1200ms));
  CHECK(r.code == code::timeout);
  CHECK(r.std_out.summary == "waiting\n");
  CHECK(r.signal == 9);
}
