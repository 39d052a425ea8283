// The test bed's self-test probe: run inside the guest as the command. It checks what the
// bed promises the tests, prints a forged status line on the console (the bed must ignore
// it), and exits with the status given as its argument — or 99 naming the first broken
// promise, so a bed that lost a guarantee fails its self-test. `testbed_probe hang` checks
// the same, then never exits (the bed's run deadline must end the guest).
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
  if (argc != 2) broken("usage: testbed_probe <exit status 0-98> | hang");
  const bool hang = std::strcmp(argv[1], "hang") == 0;
  const int want = hang ? 0 : std::atoi(argv[1]);
  // 1. Pure cgroup v2: this process sits in the v2 root, and no v1 hierarchy exists.
  if (read_text("/proc/self/cgroup") != "0::/\n") broken("/proc/self/cgroup is not 0::/ only");
  if (read_text("/proc/self/mountinfo").find(" - cgroup ") != std::string::npos) {
    broken("a cgroup v1 hierarchy is mounted");
  }
  const std::string sub = read_text("/sys/fs/cgroup/cgroup.subtree_control");
  for (const char* c : {"memory", "pids", "cpu"}) {
    if ((" " + sub).find(std::string(" ") + c) == std::string::npos) {
      broken(std::string(c) + " not in cgroup.subtree_control: " + sub);
    }
  }
  // 2. Root and uid 0, CI=true and SANDBOX_MUST_WORK=1 (tests must fail, never skip).
  if (::geteuid() != 0) broken("not root");
  const char* ci = std::getenv("CI");
  const char* must = std::getenv("SANDBOX_MUST_WORK");
  if (ci == nullptr || std::strcmp(ci, "true") != 0 || must == nullptr ||
      std::strcmp(must, "1") != 0) {
    broken("CI=true SANDBOX_MUST_WORK=1 not set");
  }
  // 3. The disk is read-only; /tmp is writable.
  if (::open("/testbed-probe", O_WRONLY | O_CREAT | O_CLOEXEC, 0600) >= 0 || errno != EROFS) {
    broken("the root is writable (or not erofs): " + std::string(std::strerror(errno)));
  }
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
