// The OCI launchers: sandbox-init as the container's process under crun, runc or runsc.
//
// Per run (on top of the shared machine, core/run/machine.hpp):
//   launch    mount a size-capped tmpfs at <ws>/out (the output dir, collected on the host
//             with the same no-follow collector), write the bundle (bundle.hpp), then run
//             `<runtime> --root <state>/<runtime>/runtime run --bundle <ws>/bundle
//             --preserve-fds 1 <id>` in the foreground with sandbox-init's control socket as
//             fd 3; the capture pipes reach sandbox-init with its configuration (the runtime
//             holds its own stdio, which goes to <ws>/runtime.log). runsc passes nothing but
//             stdio: there the control socket is stdin and the pipes are stdout and stderr
//             (stream mode, wire/init_protocol.hpp). The container joins the run's cgroup
//             (linux.cgroupsPath), so limits, OOM events, usage and kill-and-confirm are the
//             process backend's.
//   release   when every process is confirmed dead: unmount <ws>/out, then always
//             `<runtime> delete --force <id>` (queued off the result's path, bounded by a
//             timer), then the container's cgroups the runtime left in other hierarchies.
// Host quirks:
//   - crun refuses cgroup v1 hosts that also mount a cgroup2 hierarchy with controllers
//     ("hybrid"): it runs in a private mount namespace with that mount detached, where it
//     sees a pure v1 host (spawn_request::detach_mount).
//   - Our own `--root` keeps the runtime's state apart from every other user of the runtime
//     (and makes orphan reclaim a directory listing of our own).
#include "backends/oci/oci_backend.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#include <fmt/format.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "backends/oci/bundle.hpp"
#include "store/publish.hpp"
#include "store/store_io.hpp"
#include "sys/confirmed_wait.hpp"
#include "sys/netns.hpp"
#include "sys/pidfd.hpp"
#include "sys/spawn.hpp"
#include "sys/tool_process.hpp"

namespace sandbox::detail {
namespace {

namespace asio = boost::asio;
using clock = std::chrono::steady_clock;

constexpr auto delete_timeout = std::chrono::seconds(10);

// sandbox-init's copies in a level's state directory: this prefix, then a content hash.
constexpr std::string_view init_file_prefix = "sandbox-init-";
// A configured debugging copy of sandbox-init larger than this is refused.
constexpr std::uint64_t init_max_bytes = 256ULL << 20;

// True on a cgroup v1 host that also mounts cgroup2 at /sys/fs/cgroup/unified (crun refuses
// such a host when that hierarchy has any controller enabled).
bool hybrid_cgroups(const std::filesystem::path& root) {
  struct statfs top {
  }, uni{};
  if (::statfs(root.c_str(), &top) != 0 || top.f_type != TMPFS_MAGIC) return false;
  auto unified = root / "unified";
  return ::statfs(unified.c_str(), &uni) == 0 && uni.f_type == CGROUP2_SUPER_MAGIC;
}

// Calls `f(mount point, fstype, super options)` for every cgroup and cgroup2 mount in
// /proc/self/mountinfo (proc(5)).
template <class F>
void for_each_cgroup_mount(F&& f) {
  std::ifstream mi("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mi, line)) {
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream pre(line.substr(0, dash)), post(line.substr(dash + 3));
    std::string id, parent, devno, root, point, fstype, source, opts;
    pre >> id >> parent >> devno >> root >> point;
    post >> fstype >> source >> opts;
    if (fstype == "cgroup" || fstype == "cgroup2") f(point, fstype, opts);
  }
}

class oci_launcher final : public launcher, public std::enable_shared_from_this<oci_launcher> {
 public:
  struct setup {
    oci::runtime_kind kind;
    std::string name;                  // "crun", "runc", "runsc"
    std::filesystem::path binary;      // absolute
    std::string version;               // first line of --version
    std::string platform;              // runsc
    std::filesystem::path state_root;  // --root
    std::filesystem::path init_file;   // sandbox-init on the host (bound into containers)
    unique_fd init_hold;  // a shared lock on init_file: no cleanup removes it while we live
    std::string cgroup_parent;
    std::string detach_mount;   // crun on a hybrid host
    std::string cpuacct_mount;  // a v1 hierarchy with cpuacct, if mounted
    asio::any_io_executor executor;
    log_sink log;
  };

  explicit oci_launcher(setup s) : s_(std::move(s)) {}
  ~oci_launcher() override {
    if (exec_fd_ >= 0) ::close(exec_fd_);
  }

  bool open_binary() {
    exec_fd_ = ::open(s_.binary.c_str(), O_PATH | O_CLOEXEC);
    return exec_fd_ >= 0;
  }

  launcher_traits traits() const override {
    const bool runsc = s_.kind == oci::runtime_kind::runsc;
    return {.isolation = runsc ? sandbox::isolation::gvisor : sandbox::isolation::container,
            .name = s_.name,
            .description = s_.name + " " + s_.version,
            .unprivileged = false,
            .stdio_over_control = !runsc,
            .stream_control = runsc,
            .stdio_sockets = false,
            .makes_network_namespace = runsc,
            // The runtime exits by itself once the run's cgroup is empty (killed in the middle
            // it leaves its state and cgroups behind).
            .kill_launched_process = false,
            .min_setup_budget = std::chrono::milliseconds(0),
            .node_proxy_preload_path = oci::node_proxy_preload_path,
            .probe_path = "/.sandbox-init",
            // Pre-started classes: sandbox-init starts the interpreter inside the started
            // container as it does at the process level. crun and runc put the container's
            // processes in the run cgroup itself; runsc puts its sentry and gofer there, which
            // say nothing about the sandboxed interpreter (launcher_traits).
            .can_prestart = true,
            .host_cgroup_lists_processes = !runsc};
  }

  result<std::unique_ptr<launched>> launch(const launch_request& r, std::string* why) override {
    const auto sizes = sandbox_sizes(r.job);
    // 1. The output dir: a tmpfs of the run's own, size- and inode-capped, owned by its uid.
    auto out = r.ws.dir / "out";
    if (::mkdir(out.c_str(), 0755) != 0) {
      *why = fmt::format("output dir: errno {}", errno);
      return make_error_code(errc::io_error);
    }
    std::string opts = fmt::format("size={},nr_inodes={},mode=0755,uid={},gid={}", sizes.out_bytes,
                                   sizes.out_inodes, r.uid, r.uid);
    if (::mount("tmpfs", out.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts.c_str()) !=
        0) {
      *why = fmt::format("output tmpfs: errno {}", errno);
      return make_error_code(errc::io_error);
    }
    // From here a failed launch unmounts it again (nothing else of it is outside the
    // workspace: no container exists until the runtime runs).
    struct unmount_on_failure {
      const std::filesystem::path& dir;
      bool armed = true;
      ~unmount_on_failure() {
        if (armed) ::umount2(dir.c_str(), MNT_DETACH);
      }
    } unmount{out};
    // 2. The bundle.
    oci::bundle_params p;
    p.container_id = container_id(r.instance_id);
    p.kind = s_.kind;
    p.image_root = r.job.rootfs;
    p.workspace = r.ws.dir;
    p.inputs = r.ws.inputs;
    p.source = r.ws.source;
    p.source_name = r.selftest ? std::string("probe") : r.job.runtime.source_name;
    p.input_name = r.input_name;
    p.output_dir = out;
    p.init_executable = s_.init_file;
    p.cgroups_path = r.cgroup_path;
    p.uid = r.uid;
    p.gid = r.uid;
    cgroup_limits limits{r.job.admitted.request.memory_limit_bytes, r.job.policy.max_pids,
                         r.job.policy.cpu_quota_millicores};
    adjust_limits(r.job.policy, limits);  // the same figures the run cgroup got
    p.memory_bytes = limits.memory_bytes;
    p.max_pids = limits.max_pids;
    p.cpu_millicores = r.job.policy.cpu_quota_millicores;
    p.tmp_bytes = sizes.tmp_bytes;
    p.home_bytes = sizes.home_bytes;
    p.shm_bytes = sizes.shm_bytes;
    p.tmpfs_inodes = sizes.tmpfs_inodes;
    p.nofile = sizes.nofile;
    p.fsize_bytes = sizes.fsize_bytes;
    // A gVisor network run: the runtime runs in a network namespace of the run's own, made
    // here with the egress proxy's listener on its loopback (sys/netns.hpp).
    const bool own_netns = s_.kind == oci::runtime_kind::runsc && r.network;
    run_netns netns;
    if (own_netns) {
      auto made = make_run_netns(init_protocol::egress_proxy_port, why);
      if (!made) return made.error();
      netns = std::move(*made);
      p.runtime_network_namespace = true;
    }
    auto b = oci::write_bundle(p, why);
    if (!b) return b.error();
    // 3. The runtime, in the foreground: it exits when the container's init does. Its own
    //    output goes to a log in the workspace (host logs only); the program's pipes reach
    //    sandbox-init with its configuration (stdio_over_control).
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    auto log_path = r.ws.dir / "runtime.log";
    int logfd = ::open(log_path.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (logfd < 0) {
      if (devnull >= 0) ::close(devnull);
      *why = fmt::format("runtime log: errno {}", errno);
      return make_error_code(errc::io_error);
    }
    spawn_request sr;
    sr.exec_fd = exec_fd_;
    sr.argv = global_args(own_netns);
    sr.netns_fd = netns.ns_fd();
    for (const char* a : {"run", "--bundle"}) sr.argv.emplace_back(a);
    sr.argv.push_back(b->dir.string());
    if (s_.kind != oci::runtime_kind::runsc) {
      sr.argv.emplace_back("--preserve-fds");
      sr.argv.emplace_back("1");
    }
    sr.argv.push_back(p.container_id);
    if (s_.kind == oci::runtime_kind::runsc) {
      // runsc passes only stdio into the sandbox: the control socket is sandbox-init's
      // stdin, the capture pipes its stdout and stderr (runsc's own errors land there too;
      // before the program starts they go to the host log, never into a result).
      sr.fd0 = r.ctl_fd;
      sr.fd1 = r.out_fd;
      sr.fd2 = r.err_fd;
      sr.fd3 = devnull;
    } else {
      sr.fd0 = devnull;
      sr.fd1 = logfd;
      sr.fd2 = logfd;
      sr.fd3 = r.ctl_fd;
    }
    if (!s_.detach_mount.empty()) {
      sr.clone_flags = CLONE_NEWNS;
      sr.detach_mount = s_.detach_mount;
    }
    auto sp = spawn_process(sr);
    ::close(devnull);
    ::close(logfd);
    if (!sp) {
      *why = "spawning " + s_.name + ": " + sp.error().message();
      return sp.error();
    }
    unmount.armed = false;
    auto l = std::make_unique<oci_launched>(shared_from_this(), container_id(r.instance_id),
                                            r.cgroup_path, r.ws.dir);
    l->pid = sp->pid;
    l->pidfd.reset(sp->pidfd);
    if (own_netns) l->egress_listener.reset(netns.release_listener());
    l->host_output_dir = out;
    l->config.add("launch", "oci");
    if (s_.kind == oci::runtime_kind::runsc) {
      l->config.add("notify", "0");  // gVisor has no seccomp user notification
      // The program's processes are capped inside the sandbox kernel at the request's pids
      // limit (the host's pids.max also counts the sentry: see adjust_limits).
      // gVisor lets the main process have RLIMIT_NPROC children besides itself: one less
      // makes it `max_pids` processes in all, as the pids controller counts elsewhere.
      l->config.add("nproc", std::uint64_t{std::max<std::uint32_t>(r.job.policy.max_pids, 2) - 1});
    }
    return l;
  }

  // gVisor's sentry and gofer run in the run's cgroup: their threads count against pids.max
  // (with the ptrace platform, one host thread per sandboxed thread as well) and their
  // memory against the limit. Without room for them the sentry cannot start a thread and
  // the whole sandbox dies. The program itself is still held to the request's figures by
  // the sandbox's own kernel only as far as the cgroup allows: see docs/security.md.
  // With the ptrace platform each sandboxed process costs several host tasks (its stub and
  // the sentry threads that trace it): about six were measured; the request's pids limit is
  // enforced inside the sandbox kernel instead (RLIMIT_NPROC, see launch), and the host
  // limit leaves room for that many processes and the sentry's own threads.
  static constexpr std::uint32_t gvisor_host_tasks_per_process = 8;
  static constexpr std::uint32_t gvisor_pids_overhead = 256;
  static constexpr std::uint64_t gvisor_memory_overhead = 96ULL << 20;
  void adjust_limits(const sandbox::policy& /*pol*/, cgroup_limits& l) const override {
    if (s_.kind != oci::runtime_kind::runsc) return;
    l.max_pids = l.max_pids * gvisor_host_tasks_per_process + gvisor_pids_overhead;
    l.memory_bytes += gvisor_memory_overhead;
  }
  // Every container in our own --root belongs to an instance of this state directory; one
  // whose instance is not alive (its lock is free, or gone after a clean shutdown whose
  // deletes could not all run) is deleted.
  void start(const std::string& backend_instance_id,
             const std::function<bool(const std::string&)>& alive) override {
    instance_tag_ = backend_instance_id;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(s_.state_root, ec)) {
      std::string id = e.path().filename().string();
      // as-<instance>-<run>
      if (id.size() < 4 || id.compare(0, 3, "as-") != 0) continue;
      auto dash = id.find('-', 3);
      if (dash == std::string::npos || alive(id.substr(3, dash - 3))) continue;
      bool ok = delete_now(id);
      log(ok ? log_level::info : log_level::warning,
          std::string(ok ? "reclaimed" : "could not reclaim") + " orphaned container " + id);
    }
  }

  void drain() noexcept override {
    // Deletes not started yet run here (the executor may be stopping); then the ones still
    // running are reaped (their asio handlers may never run), bounded.
    std::vector<std::pair<std::string, std::string>> queued;
    {
      std::lock_guard lock(mu_);
      queued.swap(queued_);
    }
    for (const auto& [id, path] : queued) {
      delete_now(id);
      remove_runtime_cgroups(path);
    }
    auto until = clock::now() + delete_timeout;
    std::unique_lock lock(mu_);
    while (!pending_.empty() && clock::now() < until) {
      for (auto it = pending_.begin(); it != pending_.end();) {
        siginfo_t si{};
        if (waitid_pidfd(*it, &si, WEXITED | WNOHANG) == 0 && si.si_pid == 0) {
          ++it;
          continue;
        }
        ::close(*it);  // reaped (or not ours to reap any more)
        it = pending_.erase(it);
      }
      if (!pending_.empty()) {
        lock.unlock();
        ::usleep(2000);
        lock.lock();
      }
    }
  }

 private:
  // One run's container, from its launch until its processes are confirmed dead.
  class oci_launched final : public launched {
   public:
    oci_launched(std::shared_ptr<oci_launcher> owner, std::string id, std::string cgroup_path,
                 std::filesystem::path ws_dir)
        : owner_(std::move(owner)),
          id_(std::move(id)),
          cgroup_path_(std::move(cgroup_path)),
          ws_dir_(std::move(ws_dir)) {}

    // The first 4 KiB of the runtime's own log, for the host log only.
    std::string diagnostics() const override {
      int fd = ::open((ws_dir_ / "runtime.log").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) return {};
      std::string text(4096, '\0');
      ssize_t n = ::read(fd, text.data(), text.size());
      ::close(fd);
      text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      for (char& c : text) {
        if (c == '\n' || c == '\r') c = ' ';
      }
      while (!text.empty() && text.back() == ' ') text.pop_back();
      return text.empty() ? text : owner_->s_.name + " said: " + text;
    }

    // The runtime joins the container's cgroup in every v1 hierarchy, cpuacct included,
    // which the run cgroup does not read (it takes CPU time from the unified hierarchy on a
    // hybrid host, where crun and runsc put nothing).
    std::optional<std::uint64_t> cpu_usage_usec() const override {
      const auto& mount = owner_->s_.cpuacct_mount;
      if (mount.empty() || cgroup_path_.find("..") != std::string::npos) return std::nullopt;
      std::ifstream in(mount + cgroup_path_ + "/cpuacct.usage");
      std::uint64_t ns = 0;
      if (!(in >> ns)) return std::nullopt;
      return ns / 1000;
    }

    void release() noexcept override {
      auto out = ws_dir_ / "out";
      if (::umount2(out.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
        owner_->log(log_level::warning,
                    fmt::format("unmounting a run's output dir: errno {}", errno));
      }
      owner_->queue_delete(id_, cgroup_path_);
    }

   private:
    std::shared_ptr<oci_launcher> owner_;
    std::string id_;           // as-<backend instance>-<run instance>
    std::string cgroup_path_;  // the run cgroup's, for the cleanup after delete
    std::filesystem::path ws_dir_;
  };

  std::string container_id(const std::string& instance_id) const {
    return "as-" + instance_tag_ + "-" + instance_id;
  }

  // `<runtime> delete --force <id>`, off the result's path: the spawn (a vfork'd clone, with
  // a mount namespace for crun on a hybrid host) costs milliseconds.
  void queue_delete(const std::string& id, const std::string& cgroup_path) noexcept {
    try {
      {
        std::lock_guard lock(mu_);
        queued_.emplace_back(id, cgroup_path);
      }
      asio::post(s_.executor, [self = shared_from_this()] { self->start_queued_delete(); });
    } catch (...) {
      log(log_level::warning, "cannot queue the delete of " + id + "; left for reclaim");
    }
  }

  // `host_network` (runsc network runs): gVisor's sockets are host sockets of the run's own
  // network namespace, where the runtime is started (launch); otherwise its netstack has
  // loopback only.
  std::vector<std::string> global_args(bool host_network = false) const {
    std::vector<std::string> a{s_.name, "--root", s_.state_root.string()};
    if (s_.kind == oci::runtime_kind::runsc) {
      a.push_back("--platform=" + s_.platform);
      a.emplace_back(host_network ? "--network=host" : "--network=none");
      a.emplace_back("--oci-seccomp");
    }
    return a;
  }

  void log(log_level l, const std::string& line) const {
    if (s_.log) s_.log(l, s_.name + ": " + line);
  }

  // The runtime makes the container's cgroup in every v1 hierarchy it sees (blkio, cpuset,
  // devices, freezer, …), beyond the ones the run cgroup covers. Its `delete` removes them;
  // whatever is still there after it (an interrupted runtime) is removed here, when empty.
  static void remove_runtime_cgroups(const std::string& cgroup_path) noexcept {
    if (cgroup_path.empty() || cgroup_path.find("..") != std::string::npos) return;
    try {
      for_each_cgroup_mount([&](const std::string& point, const std::string&, const std::string&) {
        ::rmdir((point + cgroup_path).c_str());  // fails harmlessly when absent, busy or ours
      });
    } catch (...) {
    }
  }

  // Starts `<runtime> delete --force <id>` (in crun's private mount namespace on a hybrid host).
  result<spawned_process> spawn_delete(const std::string& id) {
    int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    spawn_request sr;
    sr.exec_fd = exec_fd_;
    sr.argv = global_args();
    for (const char* a : {"delete", "--force"}) sr.argv.emplace_back(a);
    sr.argv.push_back(id);
    sr.fd0 = sr.fd1 = sr.fd2 = sr.fd3 = devnull;
    if (!s_.detach_mount.empty()) {
      sr.clone_flags = CLONE_NEWNS;
      sr.detach_mount = s_.detach_mount;
    }
    auto sp = spawn_process(sr);
    if (devnull >= 0) ::close(devnull);
    return sp;
  }

  // Synchronous delete, bounded by `delete_timeout` (start-up reclaim, shutdown drain).
  bool delete_now(const std::string& id) noexcept {
    try {
      auto sp = spawn_delete(id);
      if (!sp) return false;
      pollfd p{sp->pidfd, POLLIN, 0};
      int rc = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(delete_timeout).count()));
      if (rc <= 0) pidfd_send_signal(sp->pidfd, SIGKILL);
      siginfo_t si{};
      waitid_pidfd(sp->pidfd, &si, WEXITED);
      ::close(sp->pidfd);
      return rc > 0 && si.si_code == CLD_EXITED && si.si_status == 0;
    } catch (...) {
      return false;
    }
  }

  void start_queued_delete() noexcept {
    std::pair<std::string, std::string> item;
    {
      std::lock_guard lock(mu_);
      if (queued_.empty()) return;  // drain() took it
      item = std::move(queued_.front());
      queued_.erase(queued_.begin());
    }
    start_delete(item.first, item.second);
  }

  // `delete --force`, reaped on the executor, killed after `delete_timeout`.
  void start_delete(const std::string& id, const std::string& cgroup_path) noexcept {
    try {
      auto sp = spawn_delete(id);
      if (!sp) {
        log(log_level::warning, "cannot start delete for " + id + ": " + sp.error().message());
        return;
      }
      int pidfd = sp->pidfd;
      {
        std::lock_guard lock(mu_);
        pending_.push_back(pidfd);
      }
      auto self = shared_from_this();
      auto watch = std::make_shared<asio::posix::stream_descriptor>(s_.executor, ::dup(pidfd));
      auto timer = std::make_shared<asio::steady_timer>(s_.executor, delete_timeout);
      timer->async_wait([self, pidfd, id](boost::system::error_code ec) {
        if (ec) return;
        std::lock_guard lock(self->mu_);
        if (std::find(self->pending_.begin(), self->pending_.end(), pidfd) !=
            self->pending_.end()) {
          pidfd_send_signal(pidfd, SIGKILL);
          self->log(log_level::warning, "delete of " + id + " timed out; killed");
        }
      });
      // Confirmed (sys/confirmed_wait.hpp): the handler's waitid blocks, and after a bare
      // wake-up, with the kill timer cancelled, it would block until the delete ends.
      async_wait_confirmed(*watch, asio::posix::descriptor_base::wait_read, pidfd_exited,
                           [self, watch, timer, pidfd, id, cgroup_path](boost::system::error_code) {
                             timer->cancel();
                             std::lock_guard lock(self->mu_);
                             auto it =
                                 std::find(self->pending_.begin(), self->pending_.end(), pidfd);
                             if (it == self->pending_.end()) return;  // drain() reaped it
                             siginfo_t si{};
                             if (waitid_pidfd(pidfd, &si, WEXITED) == 0 &&
                                 (si.si_code != CLD_EXITED || si.si_status != 0)) {
                               self->log(log_level::warning, "delete of " + id + " failed");
                             }
                             ::close(pidfd);
                             self->pending_.erase(it);
                             remove_runtime_cgroups(cgroup_path);
                           });
    } catch (...) {
      log(log_level::warning, "cannot start delete for " + id);
    }
  }

  setup s_;
  int exec_fd_ = -1;
  std::string instance_tag_;
  std::mutex mu_;
  std::vector<int> pending_;                                 ///< pidfds of deletes in flight
  std::vector<std::pair<std::string, std::string>> queued_;  ///< (id, cgroup path) to delete
};

// The bytes of sandbox-init: the configured debugging copy, else the one built into the
// library (read from its sealed memfd). Empty when it cannot be read.
std::string read_init_bytes(const std::filesystem::path& from) {
  if (!from.empty()) {
    auto bytes = read_file_at(AT_FDCWD, from.string(), init_max_bytes);
    return bytes ? std::move(*bytes) : std::string();
  }
  unique_fd fd(open_init_executable({}));
  if (!fd) return {};
  std::string out;
  char buf[65536];
  for (off_t off = 0;;) {
    ssize_t n = ::pread(fd.get(), buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return {};
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    off += n;
  }
  return out;
}

// Installs sandbox-init into the level's state directory `state`, which every process
// starting this level on the host shares: under a name of its content
// ("sandbox-init-<first 16 hex of its SHA-256>"), so that concurrent starters of one library
// agree on one file and starters of another version never touch it, published and verified
// by publish_file_at (store/publish.hpp). The returned descriptor holds a shared lock on the
// file for as long as the launcher may bind it into a container (by name).
//
// Old copies (another version's, or this one's after an upgrade) are removed here, but only
// those no live process holds: every starter keeps its lock for its backend's life, and
// remove_unheld_at takes a copy's exclusive lock without waiting, so a copy that a live
// runtime may still bind (and exec) is never removed. The fixed name `sandbox-init` of older
// versions (which held no lock) is left alone: it may still be in use.
std::variant<std::pair<std::string, unique_fd>, std::string> install_init_file(
    const std::filesystem::path& state, const std::filesystem::path& from, const log_sink& log) {
  const std::string bytes = read_init_bytes(from);
  if (bytes.empty()) return std::string("cannot read the sandbox-init executable");
  const file_digest want = digest_of(bytes);
  if (want.sha256.empty()) return std::string("cannot hash the sandbox-init executable");
  auto dir = open_dir_at(AT_FDCWD, state.string());
  if (!dir) return "cannot open " + state.string() + ": " + dir.error().message();
  const std::string name = std::string(init_file_prefix) + want.sha256.substr(0, 16);
  auto fd = publish_file_at(dir->get(), name, bytes, {.mode = 0555, .hold = true});
  if (!fd) return "cannot write the sandbox-init executable: " + fd.error().message();
  remove_unheld_at(
      dir->get(), [](std::string_view n) { return n.rfind(init_file_prefix, 0) == 0; }, name,
      store_logger(log));
  return std::make_pair(name, std::move(*fd));
}

}  // namespace

std::variant<std::shared_ptr<backend>, std::string> make_oci_backend(
    const run_machine_context& ctx, const oci_backend_options& oci) {
  oci_launcher::setup s;
  if (oci.runtime == "crun") {
    s.kind = oci::runtime_kind::crun;
  } else if (oci.runtime == "runc") {
    s.kind = oci::runtime_kind::runc;
  } else if (oci.runtime == "runsc") {
    s.kind = oci::runtime_kind::runsc;
  } else {
    return "unknown OCI runtime '" + oci.runtime + "' (crun, runc or runsc)";
  }
  s.name = oci.runtime;
  s.binary = oci.path.empty() ? std::filesystem::path("/usr/bin") / oci.runtime : oci.path;
  if (!s.binary.is_absolute()) return s.name + ": the runtime path must be absolute";
  if (::access(s.binary.c_str(), X_OK) != 0) {
    return s.name + " not found at " + s.binary.string() + ": install it, or name its path (" +
           "\"path\" of the level under \"backends\" in the host configuration)";
  }
  if (::geteuid() != 0) return s.name + ": needs root";
  if (s.kind == oci::runtime_kind::runsc && oci.platform != "ptrace" && oci.platform != "kvm" &&
      oci.platform != "systrap") {
    return "runsc: unknown platform '" + oci.platform + "'";
  }
  s.platform = oci.platform;
  auto ver =
      run_tool({s.binary.string(), "--version"}, minimal_tool_env(), std::chrono::seconds(10));
  if (!ver || !ver->ok()) {
    return s.name + ": `" + s.binary.string() + " --version` failed" + (ver ? "" : " to start") +
           ": the binary does not work on this host";
  }
  // "crun version 1.8.1", "runc version 1.1.5+ds1", "runsc version 0.0~20221219.0"
  std::string first = ver->output.substr(0, ver->output.find('\n'));
  auto sp = first.rfind(' ');
  s.version = sp == std::string::npos ? first : first.substr(sp + 1);

  auto state = ctx.state_dir / oci.runtime;
  std::error_code ec;
  std::filesystem::create_directories(state / "runtime", ec);
  if (ec) return "state directory " + state.string() + " cannot be created";
  ::chmod(state.c_str(), 0711);
  ::chmod((state / "runtime").c_str(), 0700);
  s.state_root = state / "runtime";
  {
    auto init = install_init_file(state, ctx.options.init_path, ctx.log);
    if (auto* why = std::get_if<std::string>(&init)) return *why;
    auto& [name, hold] = std::get<std::pair<std::string, unique_fd>>(init);
    s.init_file = state / name;
    s.init_hold = std::move(hold);
  }
  s.cgroup_parent = ctx.options.cgroup_parent;
  if (s.kind == oci::runtime_kind::crun && hybrid_cgroups(ctx.options.cgroup_root)) {
    s.detach_mount = (ctx.options.cgroup_root / "unified").string();
  }
  s.executor = ctx.executor;
  s.log = ctx.log;
  for_each_cgroup_mount(
      [&](const std::string& point, const std::string& fstype, const std::string& opts) {
        if (s.cpuacct_mount.empty() && fstype == "cgroup" &&
            ("," + opts + ",").find(",cpuacct,") != std::string::npos) {
          s.cpuacct_mount = point;
        }
      });
  const std::filesystem::path binary = s.binary;
  const std::string version = s.version;
  auto l = std::make_shared<oci_launcher>(std::move(s));
  if (!l->open_binary()) return oci.runtime + ": cannot open the binary";
  run_machine_context c = ctx;
  c.options.warm_pool = oci.warm_pool;
  // A recorded self-test pass holds while the runtime's binary and these settings do.
  c.self_test_deps = {.files = {binary},
                      .config = fmt::format("runtime={} version={} platform={}", oci.runtime,
                                            version, oci.platform)};
  return make_run_machine(c, l);
}

}  // namespace sandbox::detail
