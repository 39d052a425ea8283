// Kind 6 — host-side file handling on sandbox-controlled paths. The run leaves its output
// directory full of traps: absolute and relative symlinks (to the host's canary files, to
// /etc/shadow, to `/`, to magic /proc links), FIFOs a naive collector would block on, sockets,
// directories, hard links, files a still-running grandchild keeps swapping for links and
// FIFOs, sparse files with a huge apparent size, modes that deny the reader, and links planted
// wherever the run can write. Properties:
//  - no byte of a host file leaves: no returned blob holds a host canary's secret or the
//    host's /etc/shadow;
//  - only regular files come back, byte-exact; every other entry is listed as dropped with a
//    reason, and every entry the program left is accounted for (returned or dropped);
//  - the collector never blocks (a run that does not complete is reported, not waited for);
//  - over-cap sparse files are dropped by size without being read (the host's memory shows it);
//  - host canaries keep content, owner, mode and mtime (the case guard's snapshot).
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "conformance/suite.hpp"

using conformance::py;
using sandbox::code;
using sandbox::drop_reason;
using namespace std::chrono_literals;

namespace {

/// Runs `req` and waits for it at most `limit`: a collector that blocked on a FIFO would hang
/// here, and the case says so instead of hanging the suite.
sandbox::run_result run_watched(conformance::backend& b, sandbox::run_request req,
                                std::chrono::seconds limit = 120s) {
  auto f = b.submit(std::move(req));
  if (f.wait_for(limit) != std::future_status::ready) {
    FAIL("the run did not complete within " << limit.count() << " s: output collection blocked");
  }
  auto r = f.get();
  UNSCOPED_INFO("result: " << sandbox::encode(r));
  return r;
}

std::string read_host_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Host secrets no returned byte may contain: the canary secret, and /etc/shadow of the host
/// when this process can read it (root).
std::vector<std::string> host_secrets() {
  std::vector<std::string> out = {conformance::canary_secret()};
  std::string shadow = read_host_file("/etc/shadow");
  if (!shadow.empty()) out.push_back(shadow);
  return out;
}

/// Every blob the run produced: stdout, stderr, output files.
std::vector<std::string> all_blobs(conformance::backend& b, const sandbox::run_result& r) {
  std::vector<std::string> out;
  for (const auto* s : {&r.std_out, &r.std_err}) {
    if (!s->blob.empty()) out.push_back(b.blob(s->blob));
  }
  for (const auto& f : r.files_out) out.push_back(b.blob(f.blob));
  return out;
}

void check_no_host_bytes(conformance::backend& b, const sandbox::run_result& r) {
  const auto secrets = host_secrets();
  for (const auto& blob : all_blobs(b, r)) {
    for (const auto& s : secrets) CHECK(blob.find(s) == std::string::npos);
  }
  for (const auto& f : r.files_out) CHECK(f.name.find('/') == std::string::npos);
}

/// The host canary paths as a Python list literal.
std::string canary_list() {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& c : conformance::canary_files()) j.push_back(c.string());
  return j.dump();
}

std::map<std::string, std::string> returned(conformance::backend& b, const sandbox::run_result& r) {
  std::map<std::string, std::string> out;
  for (const auto& f : r.files_out) {
    CHECK(out.count(f.name) == 0);  // never listed twice
    out[f.name] = b.blob(f.blob);
    CHECK(out[f.name].size() == f.bytes);
  }
  return out;
}

std::map<std::string, drop_reason> dropped(const sandbox::run_result& r) {
  std::map<std::string, drop_reason> out;
  for (const auto& d : r.files_dropped) {
    CHECK(out.count(d.name_display) == 0);
    out[d.name_display] = d.reason;
  }
  return out;
}

/// Every name the program saw in its output directory at its end is either returned or
/// dropped (ASCII names only: here the display form is the name), and nothing else is listed.
/// `kernel_only`: names of FIFOs and sockets that exist only in the sandbox kernel
/// (expectations::special_files_on_host false): never reported, and so not expected.
void check_accounted(const sandbox::run_result& r, const nlohmann::json& listing,
                     const std::set<std::string>& kernel_only = {}) {
  std::set<std::string> seen;
  for (const auto& n : listing) {
    if (kernel_only.count(n.get<std::string>()) == 0) seen.insert(n.get<std::string>());
  }
  std::set<std::string> reported;
  for (const auto& f : r.files_out) reported.insert(f.name);
  for (const auto& d : r.files_dropped) reported.insert(d.name_display);
  CHECK(reported == seen);
}

}  // namespace

TEST_CASE(
    "outputs: links, FIFOs, sockets and directories are dropped with a reason, never "
    "followed or opened",
    "[outputs][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = run_watched(b, py(R"PY(
import errno, json, os, socket
d = os.environ['SANDBOX_OUTPUT_DIR']
canaries = )PY" + canary_list() +
                             R"PY(
def attempt(f):
    try:
        f(); return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
open(f'{d}/ok.txt', 'w').write('fine')
links = {
    'abs-shadow': '/etc/shadow', 'abs-passwd': '/etc/passwd', 'root': '/', 'self': '.',
    'rel-source': '../main.py', 'rel-deep': '../../../../../../../../etc/shadow',
    'magic-root': '/proc/self/root/etc/shadow', 'init-root': '/proc/1/root',
    'magic-fd': '/proc/self/fd/0', 'loop-a': 'loop-b', 'loop-b': 'loop-a',
    'to-ok': 'ok.txt', 'dangling': 'no-such-file', 'dev-null': '/dev/null',
    'dev-zero': '/dev/zero', 'dev-urandom': '/dev/urandom',
}
for i, c in enumerate(canaries):
    links[f'canary-{i}'] = c
    links[f'canary-rel-{i}'] = '../../../../../../..' + c
for name, target in links.items():
    os.symlink(target, f'{d}/{name}')
os.mkfifo(f'{d}/fifo')
os.mkfifo(f'{d}/fifo-named.txt')
s = socket.socket(socket.AF_UNIX)
s.bind(f'{d}/sock')
os.mkdir(f'{d}/dir')
open(f'{d}/dir/inner.txt', 'w').write('nested')
os.symlink('/etc', f'{d}/dir/etc-link')
res = {'mknod': attempt(lambda: os.mknod(f'{d}/dev', 0o20666, os.makedev(1, 3))),
       'canary-visible': [os.path.exists(c) for c in canaries],
       'listing': sorted(os.listdir(d))}
print(json.dumps(res))
)PY"));
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 0);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  // The run could not make a device node, nor see the host's canary files.
  CHECK(j["mknod"] != "ok");
  for (const auto& v : j["canary-visible"]) CHECK(v == false);

  CHECK(returned(b, r) == std::map<std::string, std::string>{{"ok.txt", "fine"}});
  auto drops = dropped(r);
  for (const auto& [name, reason] : drops) {
    INFO(name);
    CHECK(reason == drop_reason::not_regular_file);
  }
  // Where FIFOs and sockets stay in the sandbox kernel (expectations::special_files_on_host),
  // the host never sees them: neither returned (checked above) nor listed as dropped.
  std::set<std::string> kernel_only;
  if (!b.expect().special_files_on_host) {
    kernel_only = {"fifo", "fifo-named.txt", "sock"};
    for (const auto& name : kernel_only) CHECK(drops.count(name) == 0);
  }
  check_accounted(r, j["listing"], kernel_only);
  // Nothing below a subdirectory is returned under any name.
  for (const auto& f : r.files_out) CHECK(f.name.find("inner") == std::string::npos);
  check_no_host_bytes(b, r);
}

TEST_CASE(
    "outputs: hard links come back as the files they are; none reaches outside the "
    "output directory",
    "[outputs][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = run_watched(b, py(R"PY(
import errno, json, os
d = os.environ['SANDBOX_OUTPUT_DIR']
canaries = )PY" + canary_list() +
                             R"PY(
def attempt(f):
    try:
        f(); return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
open(f'{d}/a.txt', 'w').write('alpha')
os.link(f'{d}/a.txt', f'{d}/b.txt')
res = {}
# Files of the run's other file systems, of the image, of the host (by path and by fd).
for src in ['/tmp/t.txt', '/home/sandbox/h.txt', '/dev/shm/s.txt']:
    open(src, 'w').write('elsewhere')
for i, src in enumerate(['/tmp/t.txt', '/home/sandbox/h.txt', '/dev/shm/s.txt', '/etc/passwd',
                         '/usr/bin/python3', '/etc/shadow', '/proc/self/exe'] + canaries):
    res[src] = attempt(lambda: os.link(src, f'{d}/link-{i}'))
fd = os.open('/etc/passwd', os.O_RDONLY)
res['by-fd'] = attempt(lambda: os.link(f'/proc/self/fd/{fd}', f'{d}/link-fd',
                                       follow_symlinks=True))
res['listing'] = sorted(os.listdir(d))
print(json.dumps(res))
)PY"));
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  for (auto& [src, outcome] : j.items()) {
    if (src == "listing") continue;
    INFO(src);
    CHECK(outcome != "ok");
  }
  CHECK(returned(b, r) ==
        std::map<std::string, std::string>{{"a.txt", "alpha"}, {"b.txt", "alpha"}});
  CHECK(r.files_dropped.empty());
  check_accounted(r, j["listing"]);
  check_no_host_bytes(b, r);
}

TEST_CASE("outputs: files a running grandchild keeps swapping for links and FIFOs",
          "[outputs][core]") {
  CONFORMANCE_BACKEND(b);
  // The grandchild detaches (setsid, double fork, SIGTERM ignored, stdio closed) and swaps
  // eight entries among a regular file, a symlink to a host file and a FIFO, for as long as
  // it lives. The run ends once by the main process exiting, once by the deadline.
  const std::string swapper = R"PY(
import os, signal, time
d = os.environ['SANDBOX_OUTPUT_DIR']
targets = )PY" + canary_list() +
                              R"PY( + ['/etc/shadow', '/etc/passwd', '/', '/proc/1/root']
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.closerange(0, 3)
        i = 0
        while True:
            for k in range(8):
                tmp, dst = f'{d}/.tmp{k}', f'{d}/swap{k}'
                try:
                    kind = (i + k) % 3
                    if kind == 0:
                        with open(tmp, 'w') as f: f.write(f'regular-{k}')
                    elif kind == 1:
                        os.symlink(targets[(i + k) % len(targets)], tmp)
                    else:
                        os.mkfifo(tmp)
                    os.replace(tmp, dst)
                except OSError:
                    try: os.unlink(tmp)
                    except OSError: pass
            i += 1
    os._exit(0)
os.wait()
time.sleep(0.3)
print('main done', flush=True)
)PY";
  auto rs = b.run_all({py(swapper, 5000ms), py(swapper + "while True: time.sleep(1)\n", 3000ms)});
  CHECK(rs[0].code == code::ok);
  CHECK(rs[0].exit_code == 0);
  CHECK(rs[1].code == code::timeout);
  for (auto& r : rs) {
    CHECK(r.std_out.summary == "main done\n");
    for (const auto& [name, content] : returned(b, r)) {
      INFO(name);
      // Only the regular-file state can come back, with the bytes written for it: whole under
      // the final name (renamed into place once written), possibly cut short under the
      // temporary one (the kill can land between the create and the write).
      REQUIRE(name.size() >= 2);
      const std::string want = "regular-" + name.substr(name.size() - 1);
      if (name.rfind("swap", 0) == 0) {
        CHECK(content == want);
      } else {
        CHECK(name.rfind(".tmp", 0) == 0);
        CHECK(want.rfind(content, 0) == 0);
      }
    }
    for (const auto& [name, reason] : dropped(r)) {
      INFO(name);
      CHECK(reason == drop_reason::not_regular_file);
    }
    check_no_host_bytes(b, r);
  }
}

TEST_CASE("outputs: sparse files with a huge apparent size are dropped by size, never read",
          "[outputs][core]") {
  CONFORMANCE_BACKEND(b);
  const auto rss_before = conformance::self_rss_bytes();
  auto r = run_watched(b, py(R"PY(
import errno, json, os
d = os.environ['SANDBOX_OUTPUT_DIR']
res = {}
with open(f'{d}/sparse-1g', 'wb') as f: f.truncate((1 << 30) - 1)
with open(f'{d}/sparse-tail', 'wb') as f:
    f.seek((1 << 30) - 2); f.write(b'x')
open(f'{d}/sparse-1t', 'wb').close()
try:
    os.truncate(f'{d}/sparse-1t', 1 << 40); res['1t'] = 'ok'
except OSError as e:
    res['1t'] = errno.errorcode[e.errno]
with open(f'{d}/small-sparse', 'wb') as f: f.truncate(1 << 20)
res['listing'] = sorted(os.listdir(d))
print(json.dumps(res))
)PY"));
  const auto rss_after = conformance::self_rss_bytes();
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  // The run's own file size limit stops a 1 TiB file.
  CHECK(j["1t"] != "ok");
  auto got = returned(b, r);
  CHECK(got.count("sparse-1g") == 0);
  CHECK(got.count("sparse-tail") == 0);
  // Under the caps: returned, every byte of it.
  REQUIRE(got.count("small-sparse") == 1);
  CHECK(got["small-sparse"] == std::string(1 << 20, '\0'));
  auto drops = dropped(r);
  CHECK(drops["sparse-1g"] == drop_reason::bytes_limit);
  CHECK(drops["sparse-tail"] == drop_reason::bytes_limit);
  check_accounted(r, j["listing"]);
  // A collector that read the 1 GiB files would have grown this process by as much.
  INFO("supervisor RSS before " << rss_before << ", after " << rss_after);
  CHECK(rss_after < rss_before + (64ULL << 20));
}

TEST_CASE("outputs: modes the program sets cannot hide or fake entries", "[outputs][core]") {
  CONFORMANCE_BACKEND(b);
  // A file without any permission, a write-only file, a directory without read or search
  // permission: the files come back, the directory is listed as dropped. Then the same with
  // the output directory itself made unreadable and unsearchable. (The program owns them; an
  // unprivileged host reads them as that owner, so the modes must not decide.)
  const std::string body = R"PY(
import json, os
d = os.environ['SANDBOX_OUTPUT_DIR']
for name, mode in [('mode-000', 0o000), ('mode-200', 0o200), ('mode-444', 0o444)]:
    open(f'{d}/{name}', 'w').write(name)
    os.chmod(f'{d}/{name}', mode)
os.mkdir(f'{d}/closed-dir'); open(f'{d}/closed-dir/x', 'w').write('x')
os.chmod(f'{d}/closed-dir', 0)
listing = sorted(os.listdir(d))
)PY";
  auto rs = b.run_all({py(body + "print(json.dumps(listing))\n"),
                       py(body + "os.chmod(d, 0)\nprint(json.dumps(listing))\n")});
  for (auto& r : rs) {
    REQUIRE(r.code == code::ok);
    auto listing = nlohmann::json::parse(b.blob(r.std_out.blob));
    check_accounted(r, listing);
    // Regular files come back whatever their mode, on every host (root or not).
    CHECK(returned(b, r) == std::map<std::string, std::string>{{"mode-000", "mode-000"},
                                                               {"mode-200", "mode-200"},
                                                               {"mode-444", "mode-444"}});
    auto drops = dropped(r);
    CHECK(drops ==
          std::map<std::string, drop_reason>{{"closed-dir", drop_reason::not_regular_file}});
  }
}

TEST_CASE(
    "outputs: links planted wherever the run can write are never followed by the host, "
    "and gone for the next run",
    "[outputs][core]") {
  CONFORMANCE_BACKEND(b);
  // The run plants links to the host's canary files and /etc/shadow in every writable place,
  // under names a host might write (result files, shell history, the output directory's own
  // name), and tries to replace the places the sandbox itself writes before the program
  // starts (resolv.conf, the source, the output mount point). The host's canaries are checked
  // by the case guard; a second run must find none of it.
  auto r = run_watched(b, py(R"PY(
import errno, json, os
d = os.environ['SANDBOX_OUTPUT_DIR']
canaries = )PY" + canary_list() +
                             R"PY(
def attempt(f):
    try:
        f(); return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
targets = canaries + ['/etc/shadow']
planted = []
for place in ['/tmp', '/home/sandbox', '/dev/shm', d]:
    for name in ['result.json', 'output.txt', '.bash_history', 'out', 'stdout', 'main.py']:
        p = f'{place}/{name}'
        os.symlink(targets[len(planted) % len(targets)], p)
        planted.append(p)
res = {
    'resolv': attempt(lambda: os.replace('/tmp/result.json', '/etc/resolv.conf')),
    'source': attempt(lambda: os.unlink('/sandbox/main.py')),
    'out-mount': attempt(lambda: os.rename(d, '/tmp/moved-out')),
    'out-rmdir': attempt(lambda: os.rmdir(d)),
    'sandbox-link': attempt(lambda: os.symlink('/', '/sandbox/out2')),
    'etc-link': attempt(lambda: os.symlink('/tmp/result.json', '/etc/agent-sandbox-planted')),
    'planted': planted,
}
print(json.dumps(res))
)PY"));
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  for (const char* k : {"resolv", "source", "out-mount", "out-rmdir", "sandbox-link", "etc-link"}) {
    INFO(k);
    CHECK(j[k] != "ok");
  }
  CHECK(r.files_out.empty());
  for (const auto& d : r.files_dropped) CHECK(d.reason == drop_reason::not_regular_file);
  CHECK(r.files_dropped.size() == 6);
  check_no_host_bytes(b, r);

  // Nothing of the first run is reused by the next one.
  auto next = run_watched(b, py(R"PY(
import json, os
planted = )PY" + j["planted"].dump() +
                                R"PY(
print(json.dumps([p for p in planted if os.path.lexists(p)] + os.listdir(os.environ['SANDBOX_OUTPUT_DIR'])))
)PY"));
  REQUIRE(next.code == code::ok);
  CHECK(next.std_out.summary == "[]\n");
}

TEST_CASE("outputs: node's links, hard links and regular files", "[outputs][core][node]") {
  CONFORMANCE_BACKEND(b);
  auto r = run_watched(b, conformance::js(R"JS(
const fs = require('fs');
const d = process.env.SANDBOX_OUTPUT_DIR;
const canaries = )JS" + canary_list() + R"JS(;
fs.writeFileSync(`${d}/ok.txt`, 'fine');
fs.linkSync(`${d}/ok.txt`, `${d}/hard.txt`);
canaries.concat(['/etc/shadow', '/', '../main.js']).forEach((t, i) => fs.symlinkSync(t, `${d}/link-${i}`));
fs.mkdirSync(`${d}/dir`);
let crossed = 'ok';
try { fs.writeFileSync('/tmp/x', 'x'); fs.linkSync('/tmp/x', `${d}/cross`); } catch (e) { crossed = e.code; }
console.log(JSON.stringify({crossed, listing: fs.readdirSync(d).sort()}));
)JS"));
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  CHECK(j["crossed"] != "ok");
  CHECK(returned(b, r) ==
        std::map<std::string, std::string>{{"hard.txt", "fine"}, {"ok.txt", "fine"}});
  for (const auto& [name, reason] : dropped(r)) CHECK(reason == drop_reason::not_regular_file);
  check_accounted(r, j["listing"]);
  check_no_host_bytes(b, r);
}
