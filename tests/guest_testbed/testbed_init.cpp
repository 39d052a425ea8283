// PID 1 of the pure cgroup v2 test bed guest (tools/run-in-cgroup2-guest.sh).
//
// The host on which this project is built is cgroup v1-hybrid; production hosts are pure
// cgroup v2. This init turns a QEMU microvm guest into a pure v2 host and runs one test
// command there, so the library's v2 path (src/core/cgroup.cpp) runs for real: as root, or
// as an unprivileged user owning a delegated subtree (/testbed/user), the way systemd's
// Delegate=yes hands one over — the user's processes in its leaf `host`, runs under `runs`.
//
// Initramfs (built by the script, cpio newc):
//   /init                   this program, static
//   /modules/order          kernel modules to load, one file name a line, in order
//   /modules/<name>.ko      those modules (virtio_mmio, virtio_console, virtio_blk, erofs, …)
//   /testbed/argv           the command: its arguments, each ended by a NUL byte
//   /testbed/user           optional, "<uid>:<gid>" (not 0): run the command as that user
//                           with /sys/fs/cgroup/agent-sandbox-ci delegated to it
//   /testbed/watchdog       optional, "<min s> <per-ready factor> <margin s>": the command
//                           may run max(min, factor × the guest's boot-to-ready time) − margin
//                           seconds; past that the bed prints every process, thread, kernel
//                           stack and cgroup on the console, kills everything and reports
//                           TESTBED-FAIL (the host's own deadline, `margin` later, is the
//                           backstop that can only kill QEMU and say nothing of why; it
//                           gives the dump more time once TESTBED-WATCHDOG arrives)
// Disk (virtio-blk, erofs, read-only): the root of the tests; it must hold the mount points
//   /tmp /run /var/tmp /root /var/lib/agent-sandbox/blobs /dev /proc /sys.
// Status port: the virtio-serial port named "testbed.status" carries, one line each,
//   TESTBED-READY                  the root is assembled, the command is about to start
//   TESTBED-CGROUP-PARENT <text>   after the command: cgroup.subtree_control of the
//                                  runtime's parent cgroup (/sys/fs/cgroup/agent-sandbox,
//                                  or agent-sandbox-ci/runs for a user), or "absent"
//   TESTBED-EXIT <n>               the command's exit status (128 + signal when killed)
//   TESTBED-WATCHDOG               the watchdog fired: the dump is under way, TESTBED-FAIL
//                                  follows (the host extends its deadline on this line)
//   TESTBED-FAIL <reason>          the test bed itself failed (instead of READY or EXIT),
//                                  or the command outlived the watchdog
// The command never holds the port: it is opened close-on-exec and its device node is
// removed before the command starts, so nothing the tests print can forge a status line;
// their output goes to the console (ttyS0) only.
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr const char* kStatusPortName = "testbed.status";
constexpr const char* kNewRoot = "/newroot";
constexpr const char* kDiskView = "/disk";              // the disk again, outside the new root
constexpr auto kDeviceWait = std::chrono::seconds(30);  // TCG on a loaded host is slow
constexpr std::size_t kMaxArgvBytes = 64 * 1024;
/// Writable tmpfs mounts over the read-only disk: path inside the root, mode.
struct writable_dir {
  const char* path;
  mode_t mode;
};
constexpr writable_dir kWritableDirs[] = {
    {"/tmp", 01777},
    {"/var/tmp", 01777},
    {"/run", 0755},
    {"/root", 0700},
    {"/var/lib/agent-sandbox/blobs", 0700},
};

int status_fd = -1;  // the status port; -1 until found

/// Who runs the command: root, or a user with a delegated cgroup subtree.
struct identity {
  bool is_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
};
constexpr const char* kDelegated = "/sys/fs/cgroup/agent-sandbox-ci";  // the user's subtree
constexpr const char* kUserHome = "/tmp/home-testbed";

/// Writes one line to the console (test bed's own messages, not the tests').
void say(const std::string& line) {
  std::string out = "testbed: " + line + "\n";
  (void)!::write(STDERR_FILENO, out.data(), out.size());
}

/// Writes one line to the status port (blocking: virtio_console returns once the host has
/// taken the buffer, so a line written before power-off is not lost).
void status(const std::string& line) {
  if (status_fd < 0) return;
  std::string out = line + "\n";
  const char* p = out.data();
  std::size_t left = out.size();
  while (left > 0) {
    ssize_t n = ::write(status_fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

[[noreturn]] void power_off() {
  ::tcdrain(STDOUT_FILENO);  // the tests' last output is still in the UART's queue
  ::sync();
  ::reboot(RB_POWER_OFF);
  ::reboot(RB_AUTOBOOT);  // QEMU runs with -no-reboot: a reboot ends it as well
  for (;;) ::pause();
}

/// The test bed could not be set up: says why on both streams and powers off.
[[noreturn]] void fail(const std::string& why) {
  say("FAILED: " + why);
  status("TESTBED-FAIL " + why);
  power_off();
}

std::string errno_text(int e) {
  const char* name = ::strerrorname_np(e);
  return std::string(name != nullptr ? name : "?") + " (" + ::strerror(e) + ")";
}

void must(bool ok, const std::string& what) {
  if (!ok) fail(what + ": " + errno_text(errno));
}

std::optional<std::string> read_text(const fs::path& p, std::size_t cap = 64 * 1024) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::string s(cap, '\0');
  in.read(s.data(), static_cast<std::streamsize>(cap));
  s.resize(static_cast<std::size_t>(in.gcount()));
  return s;
}

// --- The watchdog ------------------------------------------------------------------------------
volatile sig_atomic_t watchdog_fired = 0;
extern "C" void on_watchdog(int) { watchdog_fired = 1; }

/// The watchdog's settings, read from the initramfs before the root changes.
struct watchdog_spec {
  unsigned long min_s = 0, factor = 0, margin_s = 0;  // min_s 0: no watchdog
};

watchdog_spec read_watchdog() {
  watchdog_spec w;
  auto text = read_text("/testbed/watchdog", 64);
  if (!text) return w;
  if (std::sscanf(text->c_str(), "%lu %lu %lu", &w.min_s, &w.factor, &w.margin_s) != 3 ||
      w.min_s == 0 || w.min_s > 86400 || w.factor > 10000 || w.margin_s >= w.min_s) {
    fail("/testbed/watchdog must be \"<min s> <factor> <margin s>\": " + text->substr(0, 32));
  }
  return w;
}

/// The watchdog's limit in seconds: the guest's boot-to-ready time is CLOCK_BOOTTIME now,
/// just before the command starts; 0: no watchdog.
unsigned watchdog_seconds(const watchdog_spec& w) {
  if (w.min_s == 0) return 0;
  timespec up{};
  ::clock_gettime(CLOCK_BOOTTIME, &up);
  const unsigned long limit =
      std::max<unsigned long>(w.min_s, w.factor * static_cast<unsigned long>(up.tv_sec));
  return static_cast<unsigned>(limit - w.margin_s);
}

std::string one_line(std::string s, std::size_t cap = 200) {
  for (char& c : s) {
    if (c == '\0' || c == '\n') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s.substr(0, cap);
}

/// What a hung command was doing: each process and thread (state, wait channel, kernel
/// stack, cgroup, command line) and each cgroup's members, on the console.
void dump_processes() {
  say("--- watchdog: processes (pid ppid state comm | cmdline | cgroup) and threads ---");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid == "1")
      continue;
    auto stat = read_text(e.path() / "stat", 1024);
    auto cmdline = read_text(e.path() / "cmdline", 400);
    if (!stat || !cmdline || cmdline->empty()) continue;  // gone, or a kernel thread
    say("pid " + one_line(*stat, 120) + " | " + one_line(*cmdline) + " | " +
        one_line(read_text(e.path() / "cgroup", 400).value_or("")));
    std::error_code tec;
    for (const auto& t : fs::directory_iterator(e.path() / "task", tec)) {
      auto tstat = read_text(t.path() / "stat", 1024).value_or("");
      std::string state = tstat.substr(0, tstat.find(' ', tstat.rfind(')') + 2));
      say("  tid " + one_line(state, 80) +
          " wchan=" + one_line(read_text(t.path() / "wchan", 128).value_or("?")) +
          " syscall=" + one_line(read_text(t.path() / "syscall", 200).value_or("?"), 60));
      std::istringstream stack(read_text(t.path() / "stack", 4096).value_or(""));
      std::string frame;
      for (int n = 0; std::getline(stack, frame) && n < 16; ++n) say("      " + frame);
    }
  }
  say("--- watchdog: cgroups (path: procs | events) ---");
  say("/sys/fs/cgroup: " + one_line(read_text("/sys/fs/cgroup/cgroup.procs", 400).value_or("?")));
  for (auto it = fs::recursive_directory_iterator("/sys/fs/cgroup", ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (!it->is_directory(ec)) continue;
    say(it->path().string() + ": " +
        one_line(read_text(it->path() / "cgroup.procs", 400).value_or("?")) + " | " +
        one_line(read_text(it->path() / "cgroup.events", 200).value_or("?")));
  }
  say("--- watchdog: end ---");
}

void mount_or_fail(const char* source, const std::string& target, const char* type,
                   unsigned long flags, const char* data) {
  must(::mount(source, target.c_str(), type, flags, data) == 0,
       std::string("mount(") + type + " on " + target + ")");
}

// Waits for `pred` to hold, polling; false after kDeviceWait.
template <class Pred>
bool wait_for(Pred pred) {
  const auto end = std::chrono::steady_clock::now() + kDeviceWait;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// 1. Kernel modules (the cloud kernel builds virtio, virtio_console, virtio_blk and erofs as
//    modules; there is no depmod or modprobe here, so the script gives the order).
void load_modules() {
  auto order = read_text("/modules/order");
  if (!order) fail("cannot read /modules/order in the initramfs");
  std::istringstream lines(*order);
  std::string name;
  while (std::getline(lines, name)) {
    if (name.empty()) continue;
    if (name.find('/') != std::string::npos) fail("bad module name in /modules/order: " + name);
    const std::string path = "/modules/" + name;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    must(fd >= 0, "open " + path);
    if (::syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST) {
      fail("finit_module(" + name + "): " + errno_text(errno));
    }
    ::close(fd);
  }
}

// 2. The status port: found by its name in sysfs, opened, and its node removed so the
//    command cannot open it (a hostile test writing "TESTBED-EXIT 0" there is the risk).
void open_status_port() {
  std::string dev;
  bool found = wait_for([&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/sys/class/virtio-ports", ec)) {
      auto name = read_text(e.path() / "name");
      if (name && (*name == kStatusPortName || *name == std::string(kStatusPortName) + "\n")) {
        dev = "/dev/" + e.path().filename().string();
        if (::access(dev.c_str(), F_OK) == 0) return true;
      }
    }
    return false;
  });
  if (!found) fail(std::string("no virtio-serial port named ") + kStatusPortName);
  status_fd = ::open(dev.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  must(status_fd >= 0, "open " + dev);
  must(::unlink(dev.c_str()) == 0, "unlink " + dev);
}

// 3. The root: the erofs disk read-only, tmpfs where the tests write, fresh /dev /proc /sys.
void assemble_root() {
  must(::mkdir(kNewRoot, 0755) == 0 || errno == EEXIST, "mkdir /newroot");
  if (!wait_for([] { return ::access("/dev/vda", F_OK) == 0; })) fail("no disk /dev/vda");
  mount_or_fail("/dev/vda", kNewRoot, "erofs", MS_RDONLY | MS_NODEV, nullptr);
  const std::string root = kNewRoot;
  // The disk a second time, read-only, so that what it holds under a writable directory
  // stays reachable once a tmpfs covers that directory: a build tree under /tmp or /root
  // (a CI clone can be anywhere) is bound back in, read-only, at its own path.
  must(::mkdir(kDiskView, 0755) == 0 || errno == EEXIST, "mkdir /disk");
  mount_or_fail("/dev/vda", kDiskView, "erofs", MS_RDONLY | MS_NODEV, nullptr);
  for (const auto& w : kWritableDirs) {
    char data[64];
    std::snprintf(data, sizeof data, "mode=%o", static_cast<unsigned>(w.mode));
    mount_or_fail("tmpfs", root + w.path, "tmpfs", MS_NOSUID | MS_NODEV, data);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(std::string(kDiskView) + w.path, ec)) {
      const std::string name = e.path().filename().string();
      const std::string target = root + w.path + "/" + name;
      if (!e.is_directory(ec) || e.is_symlink(ec)) continue;  // the disk holds directories here
      must(::mkdir(target.c_str(), 0755) == 0, "mkdir " + target);
      must(::mount(e.path().c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0,
           "bind " + target);
      must(
          ::mount(nullptr, target.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0,
          "read-only " + target);
    }
  }
  mount_or_fail("devtmpfs", root + "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  must(::mkdir((root + "/dev/pts").c_str(), 0755) == 0 || errno == EEXIST, "mkdir /dev/pts");
  must(::mkdir((root + "/dev/shm").c_str(), 01777) == 0 || errno == EEXIST, "mkdir /dev/shm");
  mount_or_fail("devpts", root + "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                "newinstance,ptmxmode=0666,mode=0620");
  mount_or_fail("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  mount_or_fail("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mount_or_fail("sysfs", root + "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
}

// 4. cgroup2 as the only hierarchy, mounted as systemd mounts it on production hosts, with
//    the controllers the library uses enabled for subtrees. Nothing mounts cgroup v1.
void setup_cgroup2() {
  const std::string cg = std::string(kNewRoot) + "/sys/fs/cgroup";
  mount_or_fail("cgroup2", cg, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "nsdelegate,memory_recursiveprot");
  for (const char* c : {"+memory", "+pids", "+cpu"}) {
    int fd = ::open((cg + "/cgroup.subtree_control").c_str(), O_WRONLY | O_CLOEXEC);
    must(fd >= 0, "open cgroup.subtree_control");
    must(::write(fd, c, ::strlen(c)) == static_cast<ssize_t>(::strlen(c)),
         std::string("write ") + c + " to cgroup.subtree_control");
    ::close(fd);
  }
  auto enabled = read_text(cg + "/cgroup.subtree_control");
  if (!enabled) fail("cannot read cgroup.subtree_control");
  for (const char* c : {"memory", "pids", "cpu"}) {
    if ((" " + *enabled + " ").find(std::string(" ") + c) == std::string::npos) {
      fail(std::string("controller ") + c + " not enabled: " + *enabled);
    }
  }
  // What the tests will see: one line, the v2 root; and no v1 hierarchy mounted anywhere.
  auto self = read_text("/proc/self/cgroup");
  if (!self || *self != "0::/\n")
    fail("/proc/self/cgroup is not \"0::/\" only: " + self.value_or("unreadable"));
  auto mounts = read_text("/proc/self/mountinfo", 1 << 20);
  if (!mounts) fail("cannot read /proc/self/mountinfo");
  if (mounts->find(" - cgroup ") != std::string::npos) fail("a cgroup v1 hierarchy is mounted");
  say("cgroup2 only; subtree_control: " + enabled->substr(0, enabled->find('\n')));
}

// 5. Loopback up (the tests' sandboxes get their own; some tests talk to 127.0.0.1 here).
void loopback_up() {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  must(s >= 0, "socket(AF_INET)");
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  must(::ioctl(s, SIOCGIFFLAGS, &ifr) == 0, "ioctl(SIOCGIFFLAGS, lo)");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP | IFF_RUNNING);
  must(::ioctl(s, SIOCSIFFLAGS, &ifr) == 0, "ioctl(SIOCSIFFLAGS, lo)");
  ::close(s);
}

// 6. Into the new root, the way switch_root does (the initramfs is rootfs: no pivot_root).
void enter_root() {
  must(::chdir(kNewRoot) == 0, "chdir /newroot");
  must(::mount(".", "/", nullptr, MS_MOVE, nullptr) == 0, "move /newroot to /");
  must(::chroot(".") == 0, "chroot");
  must(::chdir("/") == 0, "chdir /");
}

std::vector<std::string> read_argv() {
  auto text = read_text("/testbed/argv", kMaxArgvBytes + 1);
  if (!text) fail("cannot read /testbed/argv in the initramfs");
  if (text->size() > kMaxArgvBytes) fail("/testbed/argv is over 64 KiB");
  if (text->empty() || text->back() != '\0') fail("/testbed/argv must be NUL-terminated arguments");
  std::vector<std::string> args;
  std::size_t at = 0;
  while (at < text->size()) {
    std::size_t end = text->find('\0', at);
    args.push_back(text->substr(at, end - at));
    at = end + 1;
  }
  if (args.front().empty() || args.front().front() != '/')
    fail("the command must be an absolute path");
  return args;
}

identity read_identity() {
  identity id;
  auto text = read_text("/testbed/user", 64);
  if (!text) return id;
  unsigned long uid = 0, gid = 0;
  char rest = 0;
  if (std::sscanf(text->c_str(), "%lu:%lu%c", &uid, &gid, &rest) < 2 ||
      (rest != 0 && rest != '\n') || uid == 0 || gid == 0 || uid > 0xfffffffeUL ||
      gid > 0xfffffffeUL) {
    fail("/testbed/user must be \"<uid>:<gid>\", both non-zero: " + text->substr(0, 32));
  }
  id.is_user = true;
  id.uid = static_cast<uid_t>(uid);
  id.gid = static_cast<gid_t>(gid);
  return id;
}

void chown_or_fail(const std::string& path, const identity& id) {
  must(::chown(path.c_str(), id.uid, id.gid) == 0, "chown " + path);
}

// 7a. A delegated subtree, as cgroup-v2.rst's "Delegation" says and systemd does it: the
//     user owns the subtree's directory and its cgroup.procs, cgroup.threads and
//     cgroup.subtree_control (not its limits), the controllers are enabled in it, and the
//     user's processes live in the leaf `host` (no internal processes), runs under `runs`.
void delegate_subtree(const identity& id) {
  const std::string sub = kDelegated;
  must(::mkdir(sub.c_str(), 0755) == 0, "mkdir " + sub);
  for (const char* c : {"+memory", "+pids", "+cpu"}) {
    int fd = ::open((sub + "/cgroup.subtree_control").c_str(), O_WRONLY | O_CLOEXEC);
    must(fd >= 0 && ::write(fd, c, ::strlen(c)) == static_cast<ssize_t>(::strlen(c)),
         std::string("write ") + c + " to " + sub + "/cgroup.subtree_control");
    ::close(fd);
  }
  chown_or_fail(sub, id);
  for (const char* f : {"cgroup.procs", "cgroup.threads", "cgroup.subtree_control"}) {
    chown_or_fail(sub + "/" + f, id);
  }
  // Children the user would have made itself: everything in them is the user's.
  for (const char* leaf : {"host", "runs"}) {
    const std::string dir = sub + "/" + leaf;
    must(::mkdir(dir.c_str(), 0755) == 0, "mkdir " + dir);
    chown_or_fail(dir, id);
    for (const auto& e : fs::directory_iterator(dir)) chown_or_fail(e.path().string(), id);
  }
  must(::mkdir(kUserHome, 0700) == 0, std::string("mkdir ") + kUserHome);
  chown_or_fail(kUserHome, id);
}

// 7b. The command, as root or the user, in /tmp, with a fixed environment; stdin is
//     /dev/null and its output goes to the console. Returns its wait status as an exit status;
//     past `watchdog` seconds (0: none) it shows what hangs and fails the bed instead.
int run_command(const std::vector<std::string>& args, const identity& id, unsigned watchdog) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "TERM=dumb",
                                  "CI=true", "SANDBOX_MUST_WORK=1"};
  if (id.is_user) {
    // As tools/run-unprivileged.sh sets them: runs under the delegated subtree, root's image
    // store (read-only), a home of its own.
    env.push_back(std::string("HOME=") + kUserHome);
    env.push_back("SANDBOX_CGROUP_PARENT=/agent-sandbox-ci/runs");
    env.push_back("SANDBOX_IMAGE_DIR=/var/lib/agent-sandbox/images");
  } else {
    env.push_back("HOME=/root");
  }
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string leaf_procs = std::string(kDelegated) + "/host/cgroup.procs";
  pid_t child = ::fork();
  must(child >= 0, "fork");
  if (child == 0) {
    ::setsid();
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || ::dup2(null, STDIN_FILENO) < 0 || ::chdir("/tmp") != 0) _exit(126);
    if (id.is_user) {
      // Into the leaf first (as root), then the identity: groups, gid, uid, verified.
      int procs = ::open(leaf_procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (procs < 0 || ::write(procs, "0", 1) != 1) _exit(126);
      ::close(procs);
      if (::setgroups(0, nullptr) != 0 || ::setresgid(id.gid, id.gid, id.gid) != 0 ||
          ::setresuid(id.uid, id.uid, id.uid) != 0 || ::getuid() != id.uid ||
          ::geteuid() != id.uid) {
        _exit(126);
      }
    }
    ::execve(argv[0], argv.data(), envp.data());
    std::string msg = std::string("testbed: execve ") + argv[0] + ": " + ::strerror(errno) + "\n";
    (void)!::write(STDERR_FILENO, msg.data(), msg.size());
    _exit(127);
  }
  // PID 1 reaps every orphan too; the command's own status is the one reported. SIGALRM
  // (installed without SA_RESTART) interrupts the wait when the watchdog's time is up.
  if (watchdog > 0) {
    struct sigaction sa {};
    sa.sa_handler = on_watchdog;
    ::sigaction(SIGALRM, &sa, nullptr);
    ::alarm(watchdog);
  }
  int result = -1;
  while (result < 0) {
    int st = 0;
    pid_t p = ::waitpid(-1, &st, 0);
    if (p < 0 && errno == EINTR && watchdog_fired) {
      status("TESTBED-WATCHDOG");
      dump_processes();
      ::kill(-1, SIGKILL);
      while (::waitpid(-1, nullptr, 0) > 0 || errno == EINTR) {
      }
      fail("the command ran past the watchdog's " + std::to_string(watchdog) +
           " s (its processes are on the console above)");
    }
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) fail("waitpid: " + errno_text(errno));
    if (p == child) result = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  // Whatever the command left behind ends with it.
  ::kill(-1, SIGKILL);
  while (::waitpid(-1, nullptr, 0) > 0 || errno == EINTR) {
  }
  return result;
}

}  // namespace

int main() {
  if (::getpid() != 1) {
    std::fprintf(stderr, "testbed_init runs as PID 1 of the test bed guest only\n");
    return 2;
  }
  ::umask(022);
  // The initramfs has /dev /proc /sys as empty directories and no /dev/console node, so the
  // kernel could not give init its console: open it here, on devtmpfs.
  if (::mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755") != 0) power_off();
  if (::fcntl(STDERR_FILENO, F_GETFD) < 0) {
    int con = ::open("/dev/console", O_RDWR | O_NOCTTY);
    if (con < 0) power_off();
    for (int fd = 0; fd < 3; ++fd) ::dup2(con, fd);
    if (con > 2) ::close(con);
  }
  mount_or_fail("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  mount_or_fail("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  load_modules();
  open_status_port();
  const auto args = read_argv();
  const identity id = read_identity();
  const watchdog_spec dog = read_watchdog();
  assemble_root();
  setup_cgroup2();
  loopback_up();
  must(::sethostname("testbed", 7) == 0, "sethostname");
  enter_root();
  if (id.is_user) delegate_subtree(id);
  const unsigned watchdog = watchdog_seconds(dog);
  status("TESTBED-READY");
  const int code = run_command(args, id, watchdog);
  auto parent =
      read_text(id.is_user ? std::string(kDelegated) + "/runs/cgroup.subtree_control"
                           : std::string("/sys/fs/cgroup/agent-sandbox/cgroup.subtree_control"));
  std::string controllers = parent ? parent->substr(0, parent->find('\n')) : "absent";
  status("TESTBED-CGROUP-PARENT " + (controllers.empty() ? std::string("none") : controllers));
  say("command exited with status " + std::to_string(code));
  status("TESTBED-EXIT " + std::to_string(code));
  power_off();
}
