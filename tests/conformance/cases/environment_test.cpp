// Kind 10 — environment and identity leaks: the host has canary secrets in its environment;
// none appears inside (env, /proc/1/environ, the parent's environ, children); the variables
// inside are exactly the protocol's set; PID 1 inside is ours; the uid is unprivileged and
// differs between concurrent runs (where the backend says it does); no capabilities.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "conformance/suite.hpp"

using sandbox::code;
using conformance::py;

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
  CHECK(j["env"] == nlohmann::json::array({"HOME", "LANG", "PATH", "SANDBOX_INPUT_DIR",
                                           "SANDBOX_OUTPUT_DIR"}));
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
