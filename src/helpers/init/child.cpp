// Starting the user program, and the self-test probe.
//
// The child is created with CLONE_FILES | CLONE_VFORK: it shares init's descriptor table
// until it execs, so the seccomp listener it creates (O_CLOEXEC) is also in init's table,
// and init — suspended until the exec — picks it up from there. No descriptor ever has to
// be sent from inside the filter, and the user program never holds the listener (execve
// unshares the table and closes O_CLOEXEC descriptors).
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <charconv>
#include <string>
#include <vector>

#include "helpers/init/init.hpp"
#include "wire/seccomp_policy.hpp"

namespace sandbox::init {
namespace {

namespace ip = detail::init_protocol;

struct child_report {
  int kind;  // 1: listener fd in `value`; 2: failure at `where` with errno `value`
  int value;
  std::uint32_t where;
};

void report(int fd, child_report r) { (void)!write(fd, &r, sizeof r); }

[[noreturn]] void child_fail(int fd, step s, int err) {
  report(fd, {2, err, static_cast<std::uint32_t>(s)});
  _exit(126);
}

// Steps in the child, in order; each one's reason beside it.
[[noreturn]] void child_main(const config& cfg, int info_fd, char* const* argv, char* const* envp) {
  // 1. Signals as a fresh program expects them; its own session (no controlling terminal).
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  setsid();
  // 2. The OOM killer's choice again: sandbox-init set its own oom_score_adj to -1000 (root
  //    hosts) and a clone inherits it. A program that kept it could never be OOM-killed: at
  //    its memory limit it would spin in reclaim until the deadline (`timeout`, not `oom`).
  //    Raising it back needs no privilege; where sandbox-init could not lower it (no
  //    CAP_SYS_RESOURCE) this writes the value it already has.
  if (!cfg.userns) {
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj < 0 && errno != ENOENT) child_fail(info_fd, step::rlimits, errno);
    if (adj >= 0 && write(adj, "0", 1) != 1) child_fail(info_fd, step::rlimits, errno);
    if (adj >= 0) close(adj);
  }
  // 3. Resource limits the cgroup does not cover: no core dumps, bounded descriptors and
  //    file size; and no way to raise a scheduling priority, whatever limits the host process
  //    had: RLIMIT_NICE 0 (a nice value may only go up, never below where it is) and
  //    RLIMIT_RTPRIO 0 (no real-time policy, which cgroup v2's cpu.max does not bound). The
  //    program may lower its own priority (setpriority, nice, SCHED_BATCH, SCHED_IDLE); with
  //    no CAP_SYS_NICE and both hard limits 0 the kernel refuses the way back up (EACCES or
  //    EPERM). (gVisor's setpriority only records a number: its threads keep the host's
  //    priority whatever the program asks.)
  const rlimit core{0, 0};
  const rlimit nofile{cfg.nofile, cfg.nofile};
  const rlimit fsize{cfg.fsize_bytes, cfg.fsize_bytes};
  const rlimit no_raise{0, 0};
  if (setrlimit(RLIMIT_CORE, &core) < 0 || setrlimit(RLIMIT_NOFILE, &nofile) < 0 ||
      setrlimit(RLIMIT_FSIZE, &fsize) < 0) {
    child_fail(info_fd, step::rlimits, errno);
  }
  // gVisor cannot set these two (EPERM) and has them at 0 already: a limit that cannot be
  // set must be 0 to begin with, asked of the kernel.
  for (auto resource : {RLIMIT_NICE, RLIMIT_RTPRIO}) {
    if (setrlimit(resource, &no_raise) == 0) continue;
    const int err = errno;
    rlimit now{};
    if (getrlimit(resource, &now) < 0 || now.rlim_max != 0) child_fail(info_fd, step::rlimits, err);
  }
  // The program is the OOM killer's to choose again: sandbox-init lowered its own
  // oom_score_adj to -1000, which a child inherits, and with every task of the run at -1000
  // a cgroup v2 OOM finds "no killable processes" — the program then retries its page fault
  // forever instead of being killed (found on the microvm level's pure-v2 guest). Raising
  // it needs no privilege.
  {
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      (void)!write(fd, "0", 1);
      close(fd);
    }
  }
  // Under gVisor the host's pids.max counts the sandbox kernel's own threads as well, and
  // reaching it kills the whole sandbox: the program's processes are capped inside first
  // (every process of the run has the run's uid; sandbox-init, root, is not counted).
  if (cfg.nproc > 0) {
    const rlimit nproc{cfg.nproc, cfg.nproc};
    if (setrlimit(RLIMIT_NPROC, &nproc) < 0) child_fail(info_fd, step::rlimits, errno);
  }
  // 4. Drop privileges, in the order that works: lock securebits (needs CAP_SETPCAP), empty
  //    the bounding and ambient sets, supplementary groups, gid, uid, then clear the
  //    remaining sets and verify nothing is left.
  if (prctl(PR_SET_SECUREBITS,
            SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED |
                SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE |
                SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
            0, 0, 0) < 0 &&
      !(errno == EINVAL && !cfg.notify)) {
    // gVisor (the only kernel we run on without user notification) has no securebits: the
    // check below still proves that no capability survived the uid change.
    child_fail(info_fd, step::drop_privileges, errno);
  }
  for (int cap = 0; cap <= 63; ++cap) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL) break;  // past the last capability this kernel knows
      child_fail(info_fd, step::drop_privileges, errno);
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 &&
      !(errno == EINVAL && !cfg.notify)) {  // gVisor: no ambient set at all
    child_fail(info_fd, step::drop_privileges, errno);
  }
  if (!cfg.userns && setgroups(0, nullptr) < 0) child_fail(info_fd, step::drop_privileges, errno);
  if (setresgid(cfg.gid, cfg.gid, cfg.gid) < 0 || setresuid(cfg.uid, cfg.uid, cfg.uid) < 0) {
    child_fail(info_fd, step::drop_privileges, errno);
  }
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capset, &hdr, data) < 0) child_fail(info_fd, step::drop_privileges, errno);
  __user_cap_data_struct check[2]{};
  if (syscall(SYS_capget, &hdr, check) < 0) child_fail(info_fd, step::drop_privileges, errno);
  for (auto& c : check) {
    if (c.effective || c.permitted || c.inheritable) {
      child_fail(info_fd, step::drop_privileges, EPERM);
    }
  }
  if (getuid() != cfg.uid || geteuid() != cfg.uid || getgid() != cfg.gid || cfg.uid == 0) {
    child_fail(info_fd, step::drop_privileges, EPERM);
  }
  // 4b. Start in $HOME (a tmpfs of its own, mode 0700: entered as its owner, since in a
  //     container sandbox-init has no CAP_DAC_OVERRIDE).
  if (chdir("/home/sandbox") < 0) child_fail(info_fd, step::drop_privileges, errno);
  // 5. No privilege can ever be regained through exec (setuid files, file capabilities).
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(info_fd, step::no_new_privs, errno);
  // 6. The seccomp filter, last before exec; its listener goes to init through the shared
  //    descriptor table.
  const char* failed = nullptr;
  int listener = cfg.notify ? detail::load_seccomp_filter(&failed)
                            : detail::load_seccomp_filter_without_notify(&failed);
  if (listener < 0) child_fail(info_fd, step::seccomp, -listener);
  report(info_fd, {1, cfg.notify ? listener : -1, 0});
  // 7. Exec. In self-test mode the program is sandbox-init's own probe (by descriptor).
  if (cfg.mode == "selftest" && !cfg.oci) {
    syscall(SYS_execveat, ip::self_exec_fd, "", argv, envp, AT_EMPTY_PATH);
  } else {
    execve(argv[0], argv, envp);
  }
  child_fail(info_fd, step::exec, errno);
}

}  // namespace

bool start_child(const config& cfg, pid_t* pid, int* listener_fd, failure* f) {
  // fd 0 of the program: a session's live stdin pipe; else a registered tool's staged input
  // (a read-only file under /sandbox, never a link: the model's bytes, byte for byte, then
  // EOF); else the sandbox's /dev/null. 1 and 2 are the host's pipes already.
  int devnull = cfg.stdin_fd >= 0 ? cfg.stdin_fd
                : cfg.stdin_path.empty()
                    ? open("/dev/null", O_RDONLY)
                    : open(cfg.stdin_path.c_str(), O_RDONLY | O_NOFOLLOW | O_NOCTTY);
  if (devnull < 0) {
    *f = {step::fork, errno};
    return false;
  }
  if (devnull != 0) {
    dup2(devnull, 0);
    close(devnull);
  }
  std::vector<char*> argv, envp;
  for (const auto& a : cfg.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : cfg.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int info[2];
  if (pipe2(info, O_CLOEXEC) < 0) {
    *f = {step::fork, errno};
    return false;
  }
  long rc = syscall(SYS_clone, CLONE_FILES | CLONE_VFORK | SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (rc < 0) {
    *f = {step::fork, errno};
    return false;
  }
  if (rc == 0) child_main(cfg, info[1], argv.data(), envp.data());
  // Back here once the child exec'd (or exited). Its copy of the table is gone; ours still
  // holds the write end of `info` (shared until exec) and, if it got that far, the listener.
  *pid = static_cast<pid_t>(rc);
  close(info[1]);
  child_report r{};
  int listener = -1;
  failure fail{step::exec, 0};
  bool failed = false;
  bool loaded = false;
  while (read(info[0], &r, sizeof r) == sizeof r) {
    if (r.kind == 1) {
      loaded = true;
      listener = r.value;
    } else {
      failed = true;
      fail = {static_cast<step>(r.where), r.value};
    }
  }
  close(info[0]);
  if (failed || !loaded || (cfg.notify && listener < 0)) {
    if (listener >= 0) close(listener);
    *f = failed ? fail : failure{step::seccomp, EPROTO};
    return false;
  }
  *listener_fd = listener;
  return true;
}

// --- self-test probe ------------------------------------------------------------------------

namespace {

// `absent_ok`: a kernel that does not show the field at all (gVisor has no ambient set and
// no CapAmb line) passes.
bool status_field_is(const char* field, const char* expected, bool absent_ok = false) {
  FILE* fp = fopen("/proc/self/status", "re");
  if (fp == nullptr) return false;
  char line[256];
  bool found = false, present = false;
  std::size_t n = strlen(field);
  while (fgets(line, sizeof line, fp) != nullptr) {
    if (strncmp(line, field, n) == 0 && line[n] == ':') {
      present = true;
      const char* v = line + n + 1;
      while (*v == ' ' || *v == '\t') ++v;
      found = strncmp(v, expected, strlen(expected)) == 0;
      break;
    }
  }
  fclose(fp);
  return found || (absent_ok && !present);
}

int probe_fail(const char* what) {
  fprintf(stderr, "probe failed: %s (errno %d)\n", what, errno);
  return 1;
}

}  // namespace

int run_probe(int argc, char** argv) {
  uid_t want_uid = 0;
  if (argc >= 3) std::from_chars(argv[2], argv[2] + strlen(argv[2]), want_uid);
  if (getuid() == 0 || getuid() != want_uid) return probe_fail("unprivileged uid");
  for (const char* cap : {"CapInh", "CapPrm", "CapEff", "CapBnd"}) {
    if (!status_field_is(cap, "0000000000000000")) return probe_fail(cap);
  }
  if (!status_field_is("CapAmb", "0000000000000000", true)) return probe_fail("CapAmb");
  // Asked of the kernel directly (gVisor's /proc/self/status has neither line).
  if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1) return probe_fail("NoNewPrivs");
  if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) != 2) return probe_fail("Seccomp filter mode");
  if (mount("none", "/tmp", "tmpfs", 0, nullptr) == 0 || errno != EPERM) {
    return probe_fail("mount refused");
  }
  if (unshare(CLONE_NEWUSER) == 0) return probe_fail("unshare refused");
  if (open("/probe-write", O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0) {
    return probe_fail("read-only root");
  }
  int t = open("/tmp/probe", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (t < 0) return probe_fail("writable /tmp");
  close(t);
  unlink("/tmp/probe");
  if (socket(40 /* AF_VSOCK */, SOCK_STREAM, 0) >= 0 || errno != EAFNOSUPPORT) {
    return probe_fail("vsock refused");
  }
  if (syscall(425 /* io_uring_setup */, 1, nullptr) >= 0 || errno != ENOSYS) {
    return probe_fail("io_uring ENOSYS");
  }
  // sandbox-init (PID 1) is out of reach. Under gVisor (argv[3] "gvisor") its procfs shows a
  // foreign non-dumpable process's environ and maps (init keeps nothing there); its memory
  // and its descriptors must still be closed to us.
  const bool gvisor = argc >= 4 && strcmp(argv[3], "gvisor") == 0;
  if (!gvisor && open("/proc/1/environ", O_RDONLY | O_CLOEXEC) >= 0)
    return probe_fail("init hidden");
  if (open("/proc/1/mem", O_RDONLY | O_CLOEXEC) >= 0) return probe_fail("init memory hidden");
  for (int fd = 0; fd < 8; ++fd) {
    std::string p = "/proc/1/fd/" + std::to_string(fd);
    int got = open(p.c_str(), O_RDWR | O_CLOEXEC);
    if (got < 0) continue;
    struct stat st {};
    const bool devnull = fstat(got, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
    close(got);
    if (!devnull) return probe_fail("init descriptors hidden");  // /dev/null is no secret
  }
  // Egress: must fail, and the host must have recorded it (checked on the host side).
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return probe_fail("udp socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(9);
  a.sin_addr.s_addr = htonl(0xC0000201);  // 192.0.2.1 (TEST-NET-1)
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    return probe_fail("egress refused");
  }
  close(s);
  // The DNS sink answers (REFUSED) and the host records the name asked for.
  s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return probe_fail("udp socket");
  a.sin_port = htons(53);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{1, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // id 0x5eed, RD, one question: probe.invalid A IN
  static const unsigned char query[] = {0x5e, 0xed, 0x01, 0x00, 0,   1,   0,   0, 0,   0,   0,
                                        0,    5,    'p',  'r',  'o', 'b', 'e', 7, 'i', 'n', 'v',
                                        'a',  'l',  'i',  'd',  0,   0,   1,   0, 1};
  unsigned char answer[512];
  if (sendto(s, query, sizeof query, 0, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 ||
      recv(s, answer, sizeof answer, 0) < 12 || answer[0] != 0x5e || answer[1] != 0xed ||
      (answer[3] & 0x0f) != 5 /* REFUSED */) {
    return probe_fail("DNS sink");
  }
  close(s);
  printf("probe ok\n");
  return 0;
}

}  // namespace sandbox::init
