// Kind 7 — resource floods: stdout without newlines, one 1 GiB line, a child flooding the
// inherited stdout, stderr; disk fill of /tmp, the output directory, /dev/shm and $HOME;
// inode exhaustion; a fork bomb; a memory bomb in the main process and in a child only.
// Properties: the run ends with the right code (`ok` when the program merely hit a limit and
// went on, `timeout` when it never stopped, `oom` when the run's memory limit killed it,
// `pids_limit` when a sandbox kernel that spends host tasks on the program's processes
// ended at the run's pids limit — never `internal`), the
// limits hold (stream caps, ENOSPC rather than an OOM kill, the pids limit, the memory limit),
// the supervising process's memory stays bounded whatever the run does (measured: this test
// process is the supervisor), and an unrelated run started at the same time finishes `ok`.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "conformance/suite.hpp"

using conformance::js;
using conformance::py;
using sandbox::code;
using namespace std::chrono_literals;

namespace {

/// The supervisor's memory, before / now / peak since construction (VmHWM, reset through
/// /proc/self/clear_refs so earlier cases do not count). Bounds are in bytes, never time.
class rss_probe {
 public:
  rss_probe() {
    std::ofstream("/proc/self/clear_refs") << "5";  // reset the peak RSS to the current RSS
    before_ = conformance::self_rss_bytes();
  }
  std::uint64_t before() const { return before_; }
  static std::uint64_t peak() {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    }
    return 0;
  }
  /// CHECKs that neither the peak nor the current RSS grew by `bound` bytes or more.
  void check(std::uint64_t bound, const char* what) const {
    const auto now = conformance::self_rss_bytes();
    const auto top = peak();
    WARN("supervisor RSS during " << what << ": before " << (before_ >> 10) << " KiB, peak "
                                  << (top >> 10) << " KiB, after " << (now >> 10) << " KiB");
    CHECK(top < before_ + bound);
    CHECK(now < before_ + bound);
  }

 private:
  std::uint64_t before_ = 0;
};

/// An unrelated run, started beside a flood; must finish `ok` with exactly its output.
sandbox::run_request unrelated() { return py("print('unrelated ok')", 6000ms); }

void check_unrelated(const sandbox::run_result& r) {
  CHECK(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary == "unrelated ok\n");
}

void check_capped(conformance::backend& b, const sandbox::stream_capture& s, std::uint64_t total,
                  char fill) {
  CHECK(s.total_bytes == total);
  CHECK(s.truncated);
  CHECK(s.bytes < s.total_bytes);
  CHECK(s.bytes > 0);
  CHECK(s.summary.size() <= 4096);
  const std::string blob = b.blob(s.blob);
  CHECK(blob.size() == s.bytes);
  CHECK(blob.find_first_not_of(fill) == std::string::npos);  // the stream's first bytes, exact
}

constexpr std::uint64_t MiB = 1ULL << 20;

}  // namespace

TEST_CASE(
    "floods: stdout without newlines is capped, drained and flagged; the supervisor's "
    "memory stays bounded",
    "[floods][core]") {
  CONFORMANCE_BACKEND(b);
  rss_probe rss;
  auto rs = b.run_all({py(R"PY(
import sys
chunk = b'x' * (1 << 20)
for i in range(64):
    sys.stdout.buffer.write(chunk)
sys.stdout.flush()
sys.stderr.write('done')
)PY",
                          8000ms),
                       js(R"JS(
const chunk = 'y'.repeat(1 << 20);
for (let i = 0; i < 48; i++) process.stdout.write(chunk);
process.stderr.write('done');
)JS",
                          8000ms),
                       unrelated()});
  for (int i = 0; i < 2; ++i) {
    auto& r = rs[i];
    REQUIRE(r.code == code::ok);
    CHECK(r.exit_code == 0);
    check_capped(b, r.std_out, i == 0 ? 64 * MiB : 48 * MiB, i == 0 ? 'x' : 'y');
    CHECK(r.std_err.summary == "done");  // the other stream is unaffected
    CHECK_FALSE(r.std_err.truncated);
  }
  check_unrelated(rs[2]);
  rss.check(48 * MiB, "two stdout floods (112 MiB)");
}

TEST_CASE("floods: one 1 GiB line", "[floods][heavy]") {
  CONFORMANCE_BACKEND(b);
  rss_probe rss;
  auto rs = b.run_all({py(R"PY(
import os
chunk = b'z' * (1 << 20)
for i in range(1024):
    view = memoryview(chunk)
    while view:
        view = view[os.write(1, view):]
os.write(1, b'\n')
)PY",
                          8000ms),
                       unrelated()});
  auto& r = rs[0];
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.total_bytes == 1024 * MiB + 1);
  CHECK(r.std_out.truncated);
  const std::string blob = b.blob(r.std_out.blob);
  CHECK(blob.size() == r.std_out.bytes);
  CHECK(blob.find_first_not_of('z') == std::string::npos);
  CHECK(r.std_out.summary.size() <= 4096);
  CHECK(r.std_out.summary.back() == '\n');  // the tail of the line is shown
  check_unrelated(rs[1]);
  rss.check(48 * MiB, "a 1 GiB line");
}

TEST_CASE(
    "floods: a child floods the inherited stdout; a grandchild floods after the main "
    "process exits",
    "[floods][core]") {
  CONFORMANCE_BACKEND(b);
  rss_probe rss;
  auto rs = b.run_all(
      {py(R"PY(
import subprocess, sys
p = subprocess.run([sys.executable, '-c',
    "import sys\nfor i in range(32): sys.stdout.buffer.write(b'c' * (1 << 20))"])
print('child rc', p.returncode, file=sys.stderr)
)PY",
          8000ms),
       // The grandchild never stops: the run ends at the main process's exit plus the grace.
       py(R"PY(
import os, sys
if os.fork() == 0:
    chunk = b'g' * (1 << 16)
    while True:
        os.write(1, chunk)
os.write(2, b'main exits')
)PY",
          6000ms),
       unrelated()});
  REQUIRE(rs[0].code == code::ok);
  check_capped(b, rs[0].std_out, 32 * MiB, 'c');
  CHECK(rs[0].std_err.summary == "child rc 0\n");
  CHECK(rs[1].code == code::ok);
  CHECK(rs[1].exit_code == 0);
  CHECK(rs[1].std_err.summary == "main exits");
  CHECK(b.blob(rs[1].std_out.blob).find_first_not_of('g') == std::string::npos);
  check_unrelated(rs[2]);
  rss.check(48 * MiB, "child and grandchild floods");
}

TEST_CASE("floods: stderr alone, and both streams at once", "[floods][core]") {
  CONFORMANCE_BACKEND(b);
  rss_probe rss;
  auto rs = b.run_all({py(R"PY(
import os
chunk = b'e' * (1 << 20)
for i in range(32):
    view = memoryview(chunk)
    while view: view = view[os.write(2, view):]  # a pipe write may be short (gVisor)
)PY",
                          8000ms),
                       py(R"PY(
import os, threading
def flood(fd, c):
    chunk = c * (1 << 20)
    for i in range(24):
        view = memoryview(chunk)
        while view: view = view[os.write(fd, view):]
t = threading.Thread(target=flood, args=(1, b'o'))
t.start()
flood(2, b'e')
t.join()
)PY",
                          8000ms),
                       unrelated()});
  REQUIRE(rs[0].code == code::ok);
  check_capped(b, rs[0].std_err, 32 * MiB, 'e');
  CHECK(rs[0].std_out.total_bytes == 0);
  REQUIRE(rs[1].code == code::ok);
  check_capped(b, rs[1].std_out, 24 * MiB, 'o');
  check_capped(b, rs[1].std_err, 24 * MiB, 'e');
  check_unrelated(rs[2]);
  rss.check(48 * MiB, "stderr floods");
}

TEST_CASE(
    "floods: filling /tmp, $HOME, /dev/shm and the output directory at once gives "
    "ENOSPC, never an OOM kill",
    "[floods][disk][core]") {
  CONFORMANCE_BACKEND(b);
  // Everything stays full until the end, so the sum of the file systems must fit under the
  // memory limit beside the interpreter. (Node at the minimum limit does not fit: a known
  // limit, docs/security.md.)
  const std::string fill = R"PY(
import errno, json, mmap, os
out = os.environ['SANDBOX_OUTPUT_DIR']
res = {}
for d in ['/tmp', os.environ['HOME'], '/dev/shm', out]:
    n = 0
    try:
        with open(os.path.join(d, 'fill'), 'wb') as f:
            while True:
                f.write(b'x' * (1 << 20)); f.flush(); n += 1
    except OSError as e:
        res[d] = [errno.errorcode[e.errno], n]
try:
    fd = os.open(os.path.join(out, 'small.txt'), os.O_WRONLY | os.O_CREAT)
    os.write(fd, b's' * 8192); os.close(fd); res['small'] = 'ok'
except OSError as e:
    res['small'] = errno.errorcode[e.errno]
print(json.dumps(res))
)PY";
  // Python at the policy's minimum memory limit, Python and Node at the default one.
  auto small = py(fill, 8000ms);
  small.memory_limit_bytes = sandbox::policy{}.min_memory_bytes;
  auto node = js(R"JS(
const fs = require('fs');
const out = process.env.SANDBOX_OUTPUT_DIR;
const res = {};
for (const d of ['/tmp', process.env.HOME, '/dev/shm', out]) {
  const fd = fs.openSync(d + '/fill', 'w');
  const buf = Buffer.alloc(1 << 20, 120);
  let n = 0;
  try { for (;;) { fs.writeSync(fd, buf); n++; } } catch (e) { res[d] = [e.code, n]; }
  fs.closeSync(fd);
}
try { fs.writeFileSync(out + '/small.txt', 's'.repeat(8192)); res.small = 'ok'; }
catch (e) { res.small = e.code; }
console.log(JSON.stringify(res));
)JS",
                 8000ms);
  auto rs = b.run_all({py(fill, 8000ms), small, node, unrelated()});
  for (int i = 0; i < 3; ++i) {
    auto& r = rs[i];
    INFO("run " << i << ": " << sandbox::encode(r));
    REQUIRE(r.code == code::ok);
    CHECK(r.oom_kills == 0);
    CHECK(r.exit_code == 0);
    auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
    for (auto& [dir, v] : j.items()) {
      if (!v.is_array()) continue;
      INFO(dir);
      CHECK(v[0] == "ENOSPC");
      CHECK(v[1].get<std::uint64_t>() * MiB < r.memory_limit_bytes);
    }
    CHECK(j.size() == 5);
    // (A sandbox kernel charged to the run's cgroup counts too: expectations.)
    CHECK(r.usage.peak_memory_bytes <= peak_memory_ceiling(r, b.expect()));
    // The full output file is over the byte cap: dropped and flagged, never half-returned.
    std::size_t seen = 0;
    for (const auto& d : r.files_dropped) {
      if (d.name_display != "fill") continue;
      ++seen;
      CHECK(d.reason == sandbox::drop_reason::bytes_limit);
    }
    for (const auto& f : r.files_out) {
      if (f.name != "fill") continue;
      ++seen;
      CHECK(b.blob(f.blob).size() == f.bytes);
    }
    CHECK(seen == 1);
  }
  check_unrelated(rs[3]);
}

TEST_CASE("floods: inode exhaustion gives ENOSPC; every output entry is accounted for",
          "[floods][disk][core]") {
  CONFORMANCE_BACKEND(b);
  // Where the tmpfs inode cap is a known gap (expectations::gap_tmpfs_inode_limit), each
  // directory stops at a little over the cap instead of running into the memory limit.
  const int cap = b.expect().gap_tmpfs_inode_limit
                      ? static_cast<int>(sandbox::policy{}.tmpfs_inodes) + 904
                      : 200000;
  auto rs = b.run_all({py("CAP = " + std::to_string(cap) + R"PY(
import errno, json, os
out = os.environ['SANDBOX_OUTPUT_DIR']
res = {}
for d in ['/tmp', os.environ['HOME'], '/dev/shm', out]:
    n = 0
    try:
        while n < CAP:
            if n % 3 == 0: open(f'{d}/f{n}', 'w').close()
            elif n % 3 == 1: os.mkdir(f'{d}/d{n}')
            else: os.symlink('x', f'{d}/l{n}')
            n += 1
        res[d] = ['none', n]
    except OSError as e:
        res[d] = [errno.errorcode[e.errno], n]
print(json.dumps({'res': res, 'entries': len(os.listdir(out))}))
)PY",
                          8000ms),
                       unrelated()});
  auto& r = rs[0];
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  for (auto& [dir, v] : j["res"].items()) {
    INFO(dir << ": " << v.dump());
    if (b.expect().gap_tmpfs_inode_limit && dir != "/sandbox/out" && v[0] == "none") {
      WARN("GAP (gap_tmpfs_inode_limit): " << dir << " took " << v[1]
                                           << " entries, over its inode cap of "
                                           << sandbox::policy{}.tmpfs_inodes);
      continue;
    }
    CHECK(v[0] == "ENOSPC");
    CHECK(v[1].get<int>() < cap);
  }
  // The output directory held `entries` names: each came back or was listed with a reason.
  CHECK(r.files_out.size() + r.files_dropped.size() == j["entries"].get<std::size_t>());
  CHECK(r.files_out.size() <= 16);  // files_out.max_files (default)
  for (const auto& f : r.files_out) CHECK(f.bytes == 0);
  check_unrelated(rs[1]);
}

TEST_CASE("floods: a fork bomb is held by the pids limit and killed to the last process",
          "[floods][pids][core]") {
  CONFORMANCE_BACKEND(b);
  const auto max_pids = sandbox::policy{}.max_pids;
  // Where the sandbox's kernel spends host tasks on the program's processes (gVisor), the
  // bomb gets long enough to use up the run's host pids limit (1.6-3 s measured on a loaded
  // 2-core host): the sandbox then ends, and the code must say why from our evidence.
  const auto bomb_deadline = b.expect().sandbox_kernel_host_tasks ? 6000ms : 1500ms;
  auto rs = b.run_all(
      {// Every process forks forever: only the deadline ends it.
       py(R"PY(
import os, time
print('bomb', flush=True)
while True:
    try:
        os.fork()
    except BaseException:  # EAGAIN, and MemoryError when 60-odd interpreters fill the limit
        time.sleep(0.005)
)PY",
          bomb_deadline),
       // Counts what it got: bounded by the pids limit, and the refusals are errors it sees.
       py(R"PY(
import os, time
made = failed = 0
for i in range(400):
    try:
        pid = os.fork()
    except OSError:
        failed += 1
        continue
    if pid == 0:
        time.sleep(60); os._exit(0)
    made += 1
print(made, failed)
)PY",
          6000ms),
       unrelated()});
  INFO("bomb: exit " << rs[0].exit_code.value_or(-1) << ", signal " << rs[0].signal.value_or(0)
                     << ", stderr: " << rs[0].std_err.summary);
  INFO("counter: code " << to_string(rs[1].code) << ", signal " << rs[1].signal.value_or(0)
                        << ", stdout: " << rs[1].std_out.summary);
  INFO("bomb: code " << to_string(rs[0].code) << ": " << rs[0].message);
  // Never `internal`: the sandbox did not fail, the program used up a limit of its run.
  CHECK(rs[0].code != code::internal);
  if (b.expect().sandbox_kernel_host_tasks) {
    // The sandbox ended at the run's host pids limit (pids.events counted the refusals),
    // or, on a host too slow for the bomb to get there, our deadline came first.
    CHECK((rs[0].code == code::pids_limit || rs[0].code == code::timeout));
    if (rs[0].code == code::timeout) {
      WARN("the fork bomb did not use up the host pids limit within "
           << bomb_deadline.count() << " ms: the pids_limit ending was not exercised");
    }
  } else {
    // Forks past the limit get EAGAIN and the bomb goes on: only the deadline ends it.
    CHECK(rs[0].code == code::timeout);
  }
  CHECK(rs[0].signal == SIGKILL);
  CHECK(!rs[0].exit_code);
  CHECK(rs[0].std_out.summary.rfind("bomb\n", 0) == 0);
  REQUIRE(rs[1].code == code::ok);
  int made = 0, failed = 0;
  std::istringstream(rs[1].std_out.summary) >> made >> failed;
  CHECK(made > 0);
  CHECK(made < static_cast<int>(max_pids));
  CHECK(failed == 400 - made);
  check_unrelated(rs[2]);
}

TEST_CASE(
    "floods: a memory bomb in the main process ends the run as oom; limits and the "
    "supervisor's memory hold",
    "[floods][oom][core]") {
  CONFORMANCE_BACKEND(b);
  rss_probe rss;
  auto bomb = py(R"PY(
chunks = []
print('allocating', flush=True)
while True:
    chunks.append(bytearray(16 << 20))
)PY");
  bomb.memory_limit_bytes = 96 * MiB;
  auto node = js(R"JS(
const chunks = [];
console.log('allocating');
for (;;) chunks.push(Buffer.alloc(16 << 20, 1));
)JS");
  node.memory_limit_bytes = 128 * MiB;
  auto rs = b.run_all({bomb, node, unrelated()});
  for (int i = 0; i < 2; ++i) {
    auto& r = rs[i];
    INFO("run " << i);
    CHECK(r.code == code::oom);
    CHECK(r.oom_kills >= 1);
    CHECK(r.signal == 9);
    CHECK_FALSE(r.exit_code);
    CHECK(r.std_out.summary == "allocating\n");
    // (A sandbox kernel charged to the run's cgroup counts too: expectations.)
    CHECK(r.usage.peak_memory_bytes <= peak_memory_ceiling(r, b.expect()));
  }
  check_unrelated(rs[2]);
  rss.check(32 * MiB, "memory bombs");
}

TEST_CASE("floods: a memory bomb in a child only ends the run as oom", "[floods][oom][core]") {
  CONFORMANCE_BACKEND(b);
  rss_probe rss;
  auto bomb = py(R"PY(
import subprocess, sys, time
print('parent', flush=True)
p = subprocess.run([sys.executable, '-c',
    "chunks = []\nwhile True: chunks.append(bytearray(16 << 20))"])
print('child status', p.returncode, flush=True)
time.sleep(30)
)PY",
                 6000ms);
  bomb.memory_limit_bytes = 96 * MiB;
  auto rs = b.run_all({bomb, unrelated()});
  auto& r = rs[0];
  CHECK(r.code == code::oom);
  CHECK(r.oom_kills >= 1);
  // One OOM kill ends the whole run: the parent's sleep never finishes (that would be a
  // timeout), and its output so far is kept.
  CHECK(r.std_out.summary.rfind("parent\n", 0) == 0);
  CHECK(r.usage.peak_memory_bytes <= peak_memory_ceiling(r, b.expect()));
  check_unrelated(rs[1]);
  rss.check(32 * MiB, "a child's memory bomb");
}
