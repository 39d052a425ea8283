// The pooled/cold equivalence probe: a Python program that prints, as one JSON line, what a
// program can see of its sandbox (environment, argv, `__main__`, descriptors, limits, mounts,
// modules, file times). A pooled run and a cold run of it must print the same, but for what a
// level documents (docs/security.md). Shared by the process and OCI levels' pool tests, with
// the host-side helpers that find an idle instance's processes.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace pooltest {

/// The probe: prints what a program can see of its sandbox. SINCE (prepended by probe_since) is
/// the host's clock just before the run was asked for.
inline constexpr const char* probe = R"PY(
import os, sys, json, resource, stat, time
d = os.environ['SANDBOX_INPUT_DIR']
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
print(json.dumps({
  'env': {k: ('IN-DIR' if k == 'SANDBOX_INPUT_DIR' else v) for k, v in os.environ.items()},
  'input_name_ok': os.path.basename(d).startswith('in-') and len(os.path.basename(d)) == 19,
  'inputs': sorted(os.listdir(d)),
  'argv': sys.argv, 'main': __name__, 'file': __file__, 'cwd': os.getcwd(),
  'stdin': os.read(0, 16).decode(), 'stdin_chr': stat.S_ISCHR(os.fstat(0).st_mode),
  'fds': sorted(os.listdir('/proc/self/fd')),
  'uid_nonzero': os.getuid() != 0, 'gid_is_uid': os.getgid() == os.getuid(),
  'pid': os.getpid(), 'ppid': os.getppid(),
  'rlimits': {n: resource.getrlimit(getattr(resource, n)) for n in
              ('RLIMIT_CORE', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE', 'RLIMIT_NPROC', 'RLIMIT_STACK')},
  # (gVisor's procfs has no NoNewPrivs line.)
  'caps': st.get('CapEff'), 'nnp': st.get('NoNewPrivs'), 'seccomp': st.get('Seccomp'),
  'tmp': sorted(os.listdir('/tmp')), 'home': sorted(os.listdir(os.environ['HOME'])),
  'shm': sorted(os.listdir('/dev/shm')), 'out': sorted(os.listdir(os.environ['SANDBOX_OUTPUT_DIR'])),
  'mounts': sorted(l.split()[4] for l in open('/proc/self/mountinfo') if '/sandbox/in-' not in l),
  'hostname': os.uname().nodename,
  'modules': sorted(sys.modules),
  'main_vars': list(vars(sys.modules['__main__'])), 'spec': repr(__spec__),
  'loader': [type(__loader__).__name__, __loader__.name, __loader__.path], 'cached': __cached__,
  'orig_argv': sys.orig_argv, 'flags': list(sys.flags), 'path': sys.path,
  # Whether what the sandbox made was made (or its times set) no earlier than the run was
  # asked for: a pooled instance waited seconds before its run, and that must not show (nor
  # when the pool's previous run was). Counted from the request, not from this line, so a
  # slow start (a loaded host, an emulated guest) cannot look like a wait; 1 s for the
  # coarse timestamps of tmpfs.
  'fresh': {('IN-DIR' if p == d else p): [t >= SINCE - 1 for t in (s.st_atime, s.st_mtime, s.st_ctime)]
            for p in ('/', '/tmp', '/dev', '/dev/shm', '/dev/stdout', '/home', os.environ['HOME'],
                      '/sandbox', os.environ['SANDBOX_OUTPUT_DIR'], d, __file__, '/bin',
                      '/.sandbox-etc', '/.sandbox-etc/hosts')
            if os.path.lexists(p) for s in [os.lstat(p)]},
}, sort_keys=True))
)PY";

/// The probe with SINCE set to `t` (the host's clock just before the run is asked for).
inline std::string probe_since(std::chrono::system_clock::time_point t) {
  return fmt::format("SINCE = {:.3f}\n",
                     std::chrono::duration<double>(t.time_since_epoch()).count()) +
         probe;
}

// Host pids of the processes whose pid in their own namespace is `ns_pid` in idle pool
// instances of the runtime whose state is `state_dir` (its run cgroups are named
// r-<instance>-w<hex>; its backends' instances are named under <state_dir>/[<runtime>/]instances).
inline std::vector<int> idle_instance_pids(const std::string& state_dir, int ns_pid) {
  const std::string nspid_tail = "\t" + std::to_string(ns_pid);
  std::vector<int> out;
  std::string ids;
  std::error_code ec;
  // Each backend holds <state>/[<runtime>/]instances/<id>.lock while it lives (an OCI
  // level's state is <state>/<runtime>).
  std::vector<std::filesystem::path> dirs = {state_dir};
  for (const auto& e : std::filesystem::directory_iterator(state_dir, ec)) {
    if (e.is_directory()) dirs.push_back(e.path());
  }
  for (const auto& d : dirs) {
    std::error_code ec2;
    for (const auto& e : std::filesystem::directory_iterator(d / "instances", ec2)) {
      const std::string f = e.path().filename().string();
      if (f.size() > 5 && f.ends_with(".lock")) {
        ids += (ids.empty() ? "" : "|") + f.substr(0, f.size() - 5);
      }
    }
  }
  if (ids.empty()) return out;
  const std::regex mine("/r-(" + ids + ")-w[0-9a-f]+");
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cg(e.path() / "cgroup");
    std::string line, all;
    while (std::getline(cg, line)) all += line + "\n";
    if (!std::regex_search(all, mine)) continue;
    std::ifstream st(e.path() / "status");
    while (std::getline(st, line)) {
      if (line.rfind("NSpid:", 0) == 0 && line.ends_with(nspid_tail)) {
        out.push_back(std::stoi(pid));
      }
    }
  }
  return out;
}

// True once `pid` has exited (a zombie or reaped).
inline bool exited(int pid) {
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string all;
  if (!std::getline(st, all)) return true;
  auto close = all.rfind(')');
  return close == std::string::npos || all.compare(close + 1, 3, " Z ") == 0 ||
         all.compare(close + 1, 3, " X ") == 0;
}

}  // namespace pooltest
