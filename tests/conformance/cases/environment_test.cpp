// Kind 10 — environment and identity leaks: the host has canary secrets in its environment;
// none appears inside (env, /proc/1/environ, the parent's environ, children); the variables
// inside are exactly the protocol's set; PID 1 inside is ours; the uid is unprivileged and
// differs between concurrent runs (where the backend says it does); no capabilities. The
// run's uid and gid have passwd and group entries (generated, nothing of the host's), and a
// program may lower its own priority but never raise it or touch PID 1.
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "conformance/suite.hpp"

using conformance::py;
using sandbox::code;

TEST_CASE("env: host secrets never reach the sandbox (env, /proc, children)", "[env][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = b.run(py(R"PY(
import os, json, subprocess
found = []
secret = os.environ.get('CONFORMANCE_SECRET', '')
for pid in os.listdir('/proc'):
    if not pid.isdigit(): continue
    for f in ('environ', 'cmdline'):
        try:
            data = open(f'/proc/{pid}/{f}', 'rb').read()
            if b'conformance-canary' in data: found.append(f'{pid}/{f}')
        except OSError:
            pass
for path in ('/proc/1/environ', '/proc/self/environ', f'/proc/{os.getppid()}/environ'):
    try:
        if b'conformance-canary' in open(path, 'rb').read(): found.append(path)
    except OSError:
        pass
child = subprocess.run(['/usr/bin/env'], capture_output=True, text=True).stdout
print(json.dumps({'env': sorted(os.environ), 'found': found, 'child': 'conformance-canary' in child,
                  'secret': secret}))
)PY"));
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  CHECK(j["found"].empty());
  CHECK(j["child"] == false);
  CHECK(j["secret"] == "");
  CHECK(j["env"] ==
        nlohmann::json::array({"HOME", "LANG", "PATH", "SANDBOX_INPUT_DIR", "SANDBOX_OUTPUT_DIR"}));
  CHECK(b.blob(r.std_out.blob).find(conformance::canary_secret()) == std::string::npos);
}

TEST_CASE("env: node sees exactly the protocol's variables", "[env][core][node]") {
  CONFORMANCE_BACKEND(b);
  auto r = b.run(conformance::js("console.log(JSON.stringify(Object.keys(process.env).sort()))"));
  REQUIRE(r.code == code::ok);
  CHECK(r.std_out.summary ==
        "[\"HOME\",\"LANG\",\"PATH\",\"SANDBOX_INPUT_DIR\",\"SANDBOX_OUTPUT_DIR\"]\n");
}

TEST_CASE("identity: unprivileged, no capabilities, PID 1 is the sandbox's", "[identity][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = b.run(py(R"PY(
import os, json, ctypes
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
caps = {k: st[k] for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb') if k in st}
# The ambient set asked of the kernel itself (a sandbox kernel's status may not show it):
# prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, cap) for every capability it knows.
libc = ctypes.CDLL(None, use_errno=True)
ambient = [c for c in range(64) if libc.prctl(47, 1, c, 0, 0) == 1]
try:
    init = open('/proc/1/comm').read().strip()
except OSError as e:
    init = 'hidden'
print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(), 'caps': caps,
                  'ambient': ambient,
                  'nnp': st.get('NoNewPrivs'), 'seccomp': st.get('Seccomp'), 'init': init,
                  'pid': os.getpid(), 'groups': os.getgroups()}))
)PY"));
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  CHECK(j["uid"] != 0);
  CHECK(j["euid"] == j["uid"]);
  CHECK(j["gid"] != 0);
  for (auto& [k, v] : j["caps"].items()) CHECK(v == "0000000000000000");
  CHECK(j["ambient"].empty());
  if (b.expect().host_kernel) {
    CHECK(j["caps"].size() == 5);  // gVisor's status has no CapAmb line
    CHECK(j["nnp"] == "1");
    CHECK(j["seccomp"] == "2");
  } else {
    CHECK(j["caps"].size() >= 4);
  }
  // PID 1 is the sandbox's init, and the program cannot see it — or, where the backend
  // cannot hide it (expectations::init_hidden), sees it as the run's own sandbox-init.
  if (b.expect().init_hidden) {
    CHECK(j["init"] == "hidden");
  } else {
    CHECK(j["init"].get<std::string>().find("sandbox-init") != std::string::npos);
  }
  CHECK(j["pid"] != 1);
}

TEST_CASE("identity: concurrent runs get distinct uids", "[identity][core]") {
  CONFORMANCE_BACKEND(b);
  std::vector<sandbox::run_request> reqs;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(py("import os, time\ntime.sleep(0.3)\nprint(os.getuid())"));
  }
  auto rs = b.run_all(reqs);
  std::set<std::string> uids;
  for (auto& r : rs) {
    REQUIRE(r.code == code::ok);
    uids.insert(r.std_out.summary);
  }
  if (b.expect().distinct_uids) {
    CHECK(uids.size() == rs.size());
  } else {
    // One mapped uid per user namespace: the same number inside, never the host's root.
    CHECK(uids.size() == 1);
    CHECK(*uids.begin() != "0\n");
  }
}

TEST_CASE("identity: the run's uid and gid have passwd and group entries matching HOME",
          "[identity][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = b.run(py(R"PY(
import getpass, grp, json, os, pathlib, pwd
e = pwd.getpwuid(os.getuid())
res = {'pw': [e.pw_name, e.pw_uid, e.pw_gid, e.pw_dir], 'uid': os.getuid(), 'gid': os.getgid(),
       'gr': grp.getgrgid(os.getgid()).gr_name, 'getuser': getpass.getuser(),
       'home_env': os.environ['HOME'], 'tilde_user': os.path.expanduser('~sandbox'),
       'root': pwd.getpwnam('root').pw_dir,
       'host_users': sorted(set(l.split(':')[0] for l in open('/etc/passwd') if ':' in l))}
del os.environ['HOME']
res['home'] = str(pathlib.Path.home())
print(json.dumps(res))
)PY"));
  INFO("stderr: " << r.std_err.summary);
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  CHECK(j["pw"] == nlohmann::json::array({"sandbox", j["uid"], j["gid"], "/home/sandbox"}));
  CHECK(j["gr"] == "sandbox");
  CHECK(j["getuser"] == "sandbox");
  CHECK(j["home_env"] == "/home/sandbox");
  CHECK(j["home"] == "/home/sandbox");
  CHECK(j["tilde_user"] == "/home/sandbox");
  CHECK(j["root"] == "/root");  // the image's entries are kept
  // Nothing of the host's own accounts: only the image's names and the run's.
  CHECK(std::find(j["host_users"].begin(), j["host_users"].end(), "sandbox-ci") ==
        j["host_users"].end());
}

TEST_CASE("identity: a program may lower its own priority, never raise it or touch PID 1",
          "[identity][core]") {
  CONFORMANCE_BACKEND(b);
  auto r = b.run(py(R"PY(
import errno, json, os, resource
def attempt(f):
    try:
        r = f()
        return 'OK' if r is None else r
    except OSError as e:
        return errno.errorcode[e.errno]
base = os.getpriority(os.PRIO_PROCESS, 0)
res = {'base': base}
res['by_pid'] = attempt(lambda: os.setpriority(os.PRIO_PROCESS, os.getpid(), base + 1))
res['now'] = os.getpriority(os.PRIO_PROCESS, 0)
res['raise'] = attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, base - 1))
res['init'] = attempt(lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
res['fifo'] = attempt(lambda: os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)))
res['rlimits'] = [list(resource.getrlimit(resource.RLIMIT_NICE)),
                  list(resource.getrlimit(resource.RLIMIT_RTPRIO))]
res['batch'] = attempt(lambda: os.sched_setscheduler(os.getpid(), os.SCHED_BATCH, os.sched_param(0)))
print(json.dumps(res))
)PY"));
  INFO("stderr: " << r.std_err.summary);
  REQUIRE(r.code == code::ok);
  auto j = nlohmann::json::parse(b.blob(r.std_out.blob));
  INFO("inside: " << j.dump());
  REQUIRE(j["base"].get<int>() < 19);
  CHECK(j["by_pid"] == "OK");
  CHECK(j["now"] == j["base"].get<int>() + 1);
  CHECK(j["init"] == "EPERM");
  CHECK(j["rlimits"] == nlohmann::json::parse("[[0, 0], [0, 0]]"));
  if (b.expect().linux_scheduling) {
    CHECK(j["raise"] == "EACCES");
    CHECK(j["fifo"] == "EPERM");
    CHECK(j["batch"] == "OK");
  } else {
    CHECK(j["fifo"] == "EINVAL");  // only SCHED_OTHER exists there
    CHECK(j["batch"] == "EINVAL");
  }
}
