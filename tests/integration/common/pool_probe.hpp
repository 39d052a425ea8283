// The pooled/cold equivalence probe: a Python program that prints, as one JSON line, what a
// program can see of its sandbox (environment, argv, `__main__`, descriptors, limits, mounts,
// modules, file times). A pooled run and a cold run of it must print the same, but for what a
// level documents (docs/security.md). Shared by the process and OCI levels' pool tests.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <string>

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

}  // namespace pooltest
