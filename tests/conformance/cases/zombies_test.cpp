// Kind 11 — zombies and reaping: a run's PID 1 must reap every orphan, however it ended, fast
// enough that thousands of short-lived orphans never exhaust the run's (low) pids limit.
// A sandbox whose init does not reap — or reaps only its direct child — fails with EAGAIN
// after a few dozen orphans, and the run's whole pids budget is gone afterwards.
//
// Each variant also measures, after the orphans, how many processes the run can still hold at
// once: the pids budget must be intact (zombies are not hoarded) and still bounded (the limit
// holds).
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "conformance/suite.hpp"

using conformance::js;
using conformance::py;
using sandbox::code;

namespace {

// Python epilogue: waits (bounded) until no zombie of ours is left unreaped, then fills the
// pids budget with sleeping children and reports how many fitted. `made` goes in `report`.
constexpr const char* budget_probe = R"PY(
import os, time, json, signal
def zombies():
    n = 0
    for p in os.listdir('/proc'):
        if not p.isdigit() or int(p) == os.getpid(): continue
        try:
            st = open(f'/proc/{p}/stat').read()
        except OSError:
            continue
        if st[st.rindex(')') + 2] == 'Z': n += 1
    return n
deadline = time.monotonic() + 5
while zombies() and time.monotonic() < deadline:
    time.sleep(0.05)
report['zombies_left'] = zombies()
kids = []
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60); os._exit(0)
    kids.append(pid)
    if len(kids) > 4096: break
report['budget'] = len(kids)
for k in kids: os.kill(k, signal.SIGKILL)
for k in kids: os.waitpid(k, 0)
print(json.dumps(report))
)PY";

// Python prelude: `fork_patiently()`. A reaper that keeps up only on an idle host is still a
// reaper: on a loaded one (CI runs tiers side by side) PID 1 may fall behind a forking loop for
// a moment, so a fork that meets the pids limit is retried for up to 2 s (`report['retried']`
// counts those, for the log). One that does not reap never frees a pid again: a fork that
// still fails after 2 s raises BlockingIOError, and the cases stop there.
constexpr const char* patient_fork = R"PY(
import os, time
def fork_patiently():
    give_up = time.monotonic() + 2
    while True:
        try:
            return os.fork()
        except BlockingIOError:
            if time.monotonic() > give_up: raise
            report['retried'] = report.get('retried', 0) + 1
            time.sleep(0.005)
)PY";

/// `req` with room for `max_pids` interpreters where forked ones cost more memory
/// (expectations::forked_processes_cost_memory).
sandbox::run_request with_room(const conformance::backend& b, sandbox::run_request req) {
  // (~63 forked interpreters, plus the main one and the sandbox's kernel: the policy's
  // ceiling.)
  if (b.expect().forked_processes_cost_memory) req.memory_limit_bytes = 1ULL << 30;
  return req;
}

/// The deadline of every case here: one that catches a hang, never a speed. 3,000 orphans at
/// the process level took 7 to 8.4 s on this project's 2-core host with a TCG guest and a
/// build beside it (the case once had 8 s, and ended `timeout`), 17 s with two test runs
/// more; what is tested is that every orphan is reaped and the pids budget comes back.
constexpr std::chrono::milliseconds zombie_deadline{30000};

/// `n` scaled down for a backend whose forks are slow (expectations::syscall_slowdown).
int scaled(const conformance::backend& b, int n) {
  return n / std::max(1, b.expect().syscall_slowdown);
}

void check_report(conformance::backend& b, const sandbox::run_result& r, int orphans) {
  REQUIRE(r.code == code::ok);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  INFO(j.dump());
  CHECK(j["eagain"] == 0);
  CHECK(j["orphans"] == orphans);
  // Every orphan was reaped by the run's PID 1 ...
  CHECK(j["zombies_left"] == 0);
  // ... so the whole pids budget is available again, and still bounded by the limit (the
  // main process, PID 1 and a little slack for the runtime's own threads are not in `budget`).
  const int max_pids = static_cast<int>(b.rt().policy().max_pids);
  CHECK(j["budget"].get<int>() < max_pids);
  CHECK(j["budget"].get<int>() >= max_pids - 8);
}

}  // namespace

TEST_CASE("zombies: thousands of double-forked orphans, each dying differently, are reaped",
          "[zombies][core]") {
  CONFORMANCE_BACKEND(b);
  // 3000 orphans: the middle process exits at once, so each grandchild is re-parented to the
  // run's PID 1 and dies there by _exit(0), _exit(3), SIGKILL or SIGSEGV — a reaper that
  // handles only one kind of exit, or only its direct child, runs out of pids early.
  // (Fewer where forks are slow: expectations::syscall_slowdown.)
  // (Forks are patient, `patient_fork`: the loop stops at one that fails for 2 s, so
  // `orphans` falls short and `eagain` says why.)
  const int orphans = scaled(b, 3000);
  auto r = b.run(
      with_room(b, py("ORPHANS = " + std::to_string(orphans) + patient_fork + std::string(R"PY(
import signal
report = {'eagain': 0, 'orphans': 0, 'retried': 0}
for i in range(ORPHANS):
    try:
        pid = fork_patiently()
    except BlockingIOError:
        report['eagain'] += 1; break
    if pid == 0:
        try:
            g = fork_patiently()
        except OSError:
            os._exit(1)
        if g == 0:
            m = i % 4
            if m == 0: os._exit(0)
            if m == 1: os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL if m == 2 else signal.SIGSEGV)
            os._exit(9)
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    if os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0: report['orphans'] += 1
    else: report['eagain'] += 1
)PY") + budget_probe,
                      zombie_deadline)));
  check_report(b, r, orphans);
}

TEST_CASE("zombies: bursts of orphans alive at the same time stay within the pids limit",
          "[zombies][core]") {
  CONFORMANCE_BACKEND(b);
  // 100 bursts of 20 orphans that live a few milliseconds each, so that up to 40 processes of
  // the run exist at once (well under the limit). Each burst's orphans hold a pipe's write end,
  // so the main process knows when they have all exited (not when they are reaped: that is PID
  // 1's job) and only then starts the next burst: what could exhaust the pids limit is only
  // zombies PID 1 failed to reap.
  const int bursts = scaled(b, 100);
  // Where the sandbox's kernel needs host tasks for each process (gVisor: 10-45 each), 20 at
  // once would reach the run's host pids limit and end the sandbox (`pids_limit`): 8 then.
  const int burst = b.expect().sandbox_kernel_host_tasks ? 8 : 20;
  auto r = b.run(with_room(b, py("BURSTS = " + std::to_string(bursts) + "\nBURST = " +
                                     std::to_string(burst) + patient_fork + std::string(R"PY(
report = {'eagain': 0, 'orphans': 0, 'retried': 0, 'at_eagain': []}
def census():  # (zombies, others) visible now: for the failure message
    z = a = 0
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try: st = open(f'/proc/{p}/stat').read()
        except OSError: continue
        if st[st.rindex(')') + 2] == 'Z': z += 1
        else: a += 1
    return [z, a]
stuck = False
for burst in range(BURSTS):
    if stuck: break
    r, w = os.pipe()
    mids = []
    for i in range(BURST):
        try:
            pid = fork_patiently()
        except BlockingIOError:
            report['eagain'] += 1
            report['at_eagain'].append([burst, i] + census())
            stuck = True
            break
        if pid == 0:
            os.close(r)
            try:
                if fork_patiently() == 0:
                    time.sleep(0.002); os._exit(0)
            except OSError:
                os._exit(1)
            os._exit(0)
        mids.append(pid)
    os.close(w)
    for pid in mids:
        _, st = os.waitpid(pid, 0)
        if os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0: report['orphans'] += 1
        else: report['eagain'] += 1
    while os.read(r, 1): pass   # EOF: every orphan of this burst has exited
    os.close(r)
)PY") + budget_probe,
                                 zombie_deadline)));
  check_report(b, r, bursts * burst);
}

TEST_CASE("zombies: orphans left by shells (background jobs) are reaped", "[zombies][core]") {
  CONFORMANCE_BACKEND(b);
  // The way real code makes orphans: a shell that starts background jobs and exits at once.
  // The jobs inherit the captured stdout, so each iteration ends once they have exited (and
  // left PID 1 zombies to reap), never with live jobs piling up across iterations.
  // (Patient as `patient_fork`: an iteration whose shell or its jobs met the pids limit
  // while PID 1 was still reaping is tried again for up to 2 s; the loop stops at one that
  // fails for longer.)
  const int shells = scaled(b, 300);
  auto r = b.run(with_room(b, py("SHELLS = " + std::to_string(shells) + std::string(R"PY(
import subprocess, time
report = {'eagain': 0, 'orphans': 0, 'retried': 0}
for i in range(SHELLS):
    give_up = time.monotonic() + 2
    while True:
        try:
            p = subprocess.run(['/bin/sh', '-c', 'true & true & true & exit 0'],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            ok = p.returncode == 0 and not p.stderr
        except BlockingIOError:
            ok = False
        if ok or time.monotonic() > give_up: break
        report['retried'] += 1
        time.sleep(0.005)
    if not ok:
        report['eagain'] += 1; break
    report['orphans'] += 3
)PY") + budget_probe,
                                 zombie_deadline)));
  check_report(b, r, shells * 3);
}

TEST_CASE("zombies: node's child_process orphans are reaped", "[zombies][core][node]") {
  CONFORMANCE_BACKEND(b);
  // libuv reaps only its own children; the shells' background jobs are PID 1's to reap
  // (spawnSync reads the shell's stdout to EOF, so each iteration waits for its jobs to exit).
  // (Patient as the Python cases: an iteration that met the pids limit while PID 1 was
  // still reaping is tried again for up to 2 s; the loop stops at one that fails longer.
  // Seen under load: 5 of 300 spawns met EAGAIN, every orphan reaped in the end.)
  const int shells = scaled(b, 300);
  auto r = b.run(js("const SHELLS = " + std::to_string(shells) + ";" + R"JS(
const cp = require('child_process');
let eagain = 0, orphans = 0, retried = 0;
const pause = new Int32Array(new SharedArrayBuffer(4));
for (let i = 0; i < SHELLS; i++) {
  const giveUp = Date.now() + 2000;
  let ok = false;
  for (;;) {
    const p = cp.spawnSync('/bin/sh', ['-c', 'true & true & exit 0']);
    ok = p.status === 0 && !p.error && p.stderr.length === 0;
    if (ok || Date.now() > giveUp) break;
    retried++;
    Atomics.wait(pause, 0, 0, 5);
  }
  if (!ok) { eagain++; break; }
  orphans += 2;
}
console.log(JSON.stringify({eagain, orphans, retried}));
)JS",
                    zombie_deadline));
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  INFO(j.dump());
  CHECK(j["eagain"] == 0);
  CHECK(j["orphans"] == shells * 2);
}
