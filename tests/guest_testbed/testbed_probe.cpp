// The test bed's self-test probe: run inside the guest as the command. It checks what the
// bed promises the tests, prints a forged status line on the console (the bed must ignore
// it), and exits with the status given as its argument — or 99 naming the first broken
// promise, so a bed that lost a guarantee fails its self-test. `testbed_probe hang` checks
// the same, then never exits (the bed's run deadline must end the guest). A second argument
// `user` expects the bed's TESTBED_AS=user instead of root: not root, in the leaf of a
// delegated subtree that it may manage but whose limits it may not change.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string read_text(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "testbed_probe: BROKEN: %s\n", what.c_str());
  std::exit(99);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::strcmp(argv[2], "user") != 0)) {
    broken("usage: testbed_probe <exit status 0-98> | hang [user]");
  }
  const bool hang = std::strcmp(argv[1], "hang") == 0;
  const int want = hang ? 0 : std::atoi(argv[1]);
  const bool as_user = argc == 3;
  // 1. Pure cgroup v2: this process sits in the v2 root (a user: in its delegated leaf), and
  //    no v1 hierarchy exists.
  const std::string own = as_user ? "0::/agent-sandbox-ci/host\n" : "0::/\n";
  if (read_text("/proc/self/cgroup") != own) broken("/proc/self/cgroup is not " + own);
  if (read_text("/proc/self/mountinfo").find(" - cgroup ") != std::string::npos) {
    broken("a cgroup v1 hierarchy is mounted");
  }
  const std::string sub = read_text("/sys/fs/cgroup/cgroup.subtree_control");
  for (const char* c : {"memory", "pids", "cpu"}) {
    if ((" " + sub).find(std::string(" ") + c) == std::string::npos) {
      broken(std::string(c) + " not in cgroup.subtree_control: " + sub);
    }
  }
  // 2. Root (or not, as asked), CI=true and SANDBOX_MUST_WORK=1 (tests fail, never skip).
  if ((::geteuid() == 0) == as_user) broken(as_user ? "root, not a user" : "not root");
  if (as_user) {
    // The delegated subtree: the user makes and removes cgroups in it, and may not raise
    // the limits set on it from above.
    if (::mkdir("/sys/fs/cgroup/agent-sandbox-ci/runs/probe", 0755) != 0 ||
        ::rmdir("/sys/fs/cgroup/agent-sandbox-ci/runs/probe") != 0) {
      broken("cannot manage cgroups under the delegated runs/: " +
             std::string(std::strerror(errno)));
    }
    if (::open("/sys/fs/cgroup/agent-sandbox-ci/memory.max", O_WRONLY | O_CLOEXEC) >= 0) {
      broken("the user may write the delegated subtree's own memory.max");
    }
  }
  const char* ci = std::getenv("CI");
  const char* must = std::getenv("SANDBOX_MUST_WORK");
  if (ci == nullptr || std::strcmp(ci, "true") != 0 || must == nullptr ||
      std::strcmp(must, "1") != 0) {
    broken("CI=true SANDBOX_MUST_WORK=1 not set");
  }
  // 3. The disk is read-only; /tmp is writable.
  struct statvfs root {};
  if (::statvfs("/", &root) != 0 || (root.f_flag & ST_RDONLY) == 0) broken("the root is writable");
  int t = ::open("/tmp/testbed-probe", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (t < 0) broken("/tmp is not writable");
  ::close(t);
  // 4. The status port is out of reach: no virtio-serial port node in /dev.
  if (DIR* d = ::opendir("/dev")) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, "vport", 5) == 0)
        broken(std::string("/dev/") + e->d_name + " exists");
    }
    ::closedir(d);
  }
  // 5. A forged status line on the console, on both streams: the bed must not believe it.
  std::printf("TESTBED-EXIT 0\n");
  std::fflush(stdout);
  std::fprintf(stderr, "TESTBED-EXIT 0\n");
  if (hang) {
    std::printf("testbed_probe: all promises hold; hanging\n");
    std::fflush(stdout);
    for (;;) ::pause();
  }
  std::printf("testbed_probe: all promises hold; exiting %d\n", want);
  return want;
}
