// The microvm launcher: per run, one VMM process (QEMU microvm) booting the guest agent from
// an initramfs, with the runtime image as a read-only erofs disk; the run machine talks to
// sandbox-init in the guest through the agent (stream control). See microvm_backend.hpp.
//
// Steps of one launch (each one's reason beside it):
//  1. The image disk: built once per image by `mkfs.erofs` (published and verified before
//     use: ensure_disk), kept beside the image store's unpacked roots, keyed by the image's
//     digest.
//  2. `<ws>/out`: the host output dir the guest's output files are written into (by the
//     guest channel, with the caps enforced here), then read by the shared collector.
//  3. The VMM, started by `spawn_process` (no shell, empty environment, every other
//     descriptor closed) in new pid, mount, ipc, uts and network namespaces (no network
//     device exists anyway), as the run's own uid with no_new_privs; it reaches kernel,
//     initramfs and disk only through descriptors the host opened; its own log is capped
//     by RLIMIT_FSIZE. It sees no host path but its own prepared root (vmm_root.hpp) and
//     joins the run's cgroup (whose memory covers guest RAM and the VMM's overhead) itself,
//     before its exec.
//  4. The guest channel: `setup` goes first, then the run machine's configuration, relayed
//     by the agent to sandbox-init.
//  5. A network run (still no NIC): the run's network namespace is made on the host with the
//     egress proxy's listener (the run machine serves the proxy on it, as for runsc), and
//     QEMU gets a fourth port, "sandbox.net", whose host end the guest channel hands to a
//     net_relay once the run machine starts it: each tunnel connection from the guest agent
//     becomes a connection to that listener (net_relay.hpp, wire/guest_protocol.hpp).
#include "backends/microvm/microvm_backend.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/kvm.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "backends/microvm/cpio.hpp"
#include "backends/microvm/net_relay.hpp"
#include "backends/microvm/vmm.hpp"
#include "backends/microvm/vmm_root.hpp"
#include "core/run/workspace.hpp"
#include "embedded/sandbox_guest.hpp"
#include "protocol/sha256.hpp"
#include "protocol/text_util.hpp"
#include "store/publish.hpp"
#include "store/store_io.hpp"
#include "sys/netns.hpp"
#include "sys/pidfd.hpp"
#include "sys/spawn.hpp"
#include "sys/sys.hpp"
#include "sys/tool_process.hpp"
#include "wire/guest_protocol.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {
namespace {

namespace ip = init_protocol;
namespace gp = guest_protocol;
namespace fs = std::filesystem;

// Guest paths sandbox-init's configuration names (helpers/guest/main.cpp makes them).
constexpr const char* guest_image_dir = "/run/image";
constexpr const char* guest_staging_dir = "/run/ws/root";
constexpr const char* guest_inputs_dir = "/run/ws/in";
constexpr const char* guest_source_path = "/run/ws/source";

// The VMM's own log (QEMU's messages and the guest console) stops growing here: RLIMIT_FSIZE
// (a VMM the guest took over cannot fill the host's disk through it).
constexpr std::uint64_t vmm_log_bytes = 1 << 20;

std::string frame(gp::msg type, std::uint32_t a, std::int64_t b, std::string_view payload) {
  std::string f;
  ip::append_frame(f, static_cast<std::uint32_t>(type), a, b, payload);
  return f;
}

// A file's frames: file_open (name, mode 0400, size), file_data chunks, file_close.
void append_file_frames(std::string& out, std::string_view name, std::string_view content) {
  out += frame(gp::msg::file_open, 0400, static_cast<std::int64_t>(content.size()), name);
  const std::size_t chunk = ip::max_packet - sizeof(ip::init_header);
  for (std::size_t off = 0; off < content.size(); off += chunk) {
    out += frame(gp::msg::file_data, 0, 0, content.substr(off, chunk));
  }
  out += frame(gp::msg::file_close, 0, 0, {});
}

bool read_file(const fs::path& p, std::string* out, std::uint64_t max_bytes) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return false;
  }
  out->assign(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < out->size()) {
    ssize_t n = ::read(fd, out->data() + got, out->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out->resize(got);
  return true;
}

bool valid_output_name(std::string_view n) {
  if (n.empty() || n.size() > 255 || n == "." || n == "..") return false;
  return std::none_of(n.begin(), n.end(), [](char c) { return c == '/' || c == '\0'; });
}

// --- the guest channel ------------------------------------------------------------------

class guest_channel final : public agent_channel {
 public:
  guest_channel(int out_dir_fd, guest_output_limits limits, std::string setup)
      : out_dir_(out_dir_fd), limits_(limits), setup_(std::move(setup)) {}
  ~guest_channel() override {
    if (file_fd_ >= 0) ::close(file_fd_);
  }

  std::string initial_frames() override { return frame(gp::msg::setup, 0, 0, setup_); }

  result<std::string> file_frames(const run_workspace& ws) override {
    std::string out, content;
    if (!read_file(ws.source, &content, 1ULL << 30)) return make_error_code(errc::io_error);
    append_file_frames(out, "source", content);
    std::error_code ec;
    std::vector<fs::path> inputs;
    for (const auto& e : fs::directory_iterator(ws.inputs, ec)) inputs.push_back(e.path());
    if (ec) return make_error_code(errc::io_error);
    std::sort(inputs.begin(), inputs.end());
    for (const auto& p : inputs) {
      if (!read_file(p, &content, 1ULL << 30)) return make_error_code(errc::io_error);
      append_file_frames(out, "in/" + p.filename().string(), content);
    }
    return out;
  }

  std::string on_frame(const ip::init_header& h, std::string_view payload) override {
    if (refused_) return "frame after a refused one";
    std::string why = handle(h, payload);
    if (!why.empty()) {
      refused_ = true;
      if (file_fd_ >= 0) {
        ::close(file_fd_);
        file_fd_ = -1;
        ::unlinkat(out_dir_, file_name_.c_str(), 0);  // a partial file is not an output
      }
    }
    return why;
  }

  std::optional<guest_usage> usage() const override { return usage_; }
  std::vector<dropped_file> dropped() const override { return dropped_; }

 private:
  std::string handle(const ip::init_header& h, std::string_view payload) {
    const auto type = static_cast<gp::msg>(static_cast<std::uint32_t>(h.type));
    if (type != gp::msg::agent_ready && !ready_) return "agent message before agent_ready";
    switch (type) {
      case gp::msg::agent_ready:
        if (ready_) return "agent_ready twice";
        if (h.a != gp::version)
          return fmt::format("guest protocol version {} (expected {})", h.a, gp::version);
        ready_ = true;
        return {};
      case gp::msg::agent_failed:
        return fmt::format("agent setup step {} failed (errno {}): {}", h.a, h.b,
                           quote_for_message(payload, 160));
      case gp::msg::file_open: {
        if (file_fd_ >= 0) return "file_open while a file is open";
        if (usage_) return "file_open after usage";
        if (!valid_output_name(payload))
          return "output file name " + quote_for_message(payload, 64);
        if ((h.a & ~0700U) != 0) return "output file mode";
        if (h.b < 0) return "output file size";
        if (files_ + 1 > limits_.max_files) return "more output files than files_out.max_files";
        if (bytes_ + static_cast<std::uint64_t>(h.b) > limits_.max_bytes) {
          return "output files larger than files_out.max_bytes";
        }
        std::string name(payload);
        int fd = ::openat(out_dir_, name.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
          return errno == EEXIST ? "output file sent twice " + quote_for_message(name, 64)
                                 : fmt::format("creating an output file: errno {}", errno);
        }
        file_fd_ = fd;
        names_.insert(name);
        file_name_ = std::move(name);
        declared_ = static_cast<std::uint64_t>(h.b);
        written_ = 0;
        ++files_;
        bytes_ += declared_;
        return {};
      }
      case gp::msg::file_data: {
        if (file_fd_ < 0) return "file_data without an open file";
        if (written_ + payload.size() > declared_) return "output file longer than declared";
        std::size_t off = 0;
        while (off < payload.size()) {
          ssize_t n = ::write(file_fd_, payload.data() + off, payload.size() - off);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) return fmt::format("writing an output file: errno {}", errno);
          off += static_cast<std::size_t>(n);
        }
        written_ += payload.size();
        return {};
      }
      case gp::msg::file_close:
        if (file_fd_ < 0) return "file_close without an open file";
        if (written_ != declared_) return "output file shorter than declared";
        ::close(file_fd_);
        file_fd_ = -1;
        return {};
      case gp::msg::file_dropped: {
        // Untrusted like the files: one name component, a reason the agent may give, each
        // name once (sent or dropped), no more than the collector's scan limit, and only
        // before `usage`. A bad name is bad_name whatever the guest said (the collector judges
        // the name first); a plain one cannot be. Kept as the display form.
        if (usage_) return "file_dropped after usage";
        if (file_fd_ >= 0) return "file_dropped while a file is open";
        if (!valid_output_name(payload))
          return "dropped output name " + quote_for_message(payload, 64);
        if (h.a > static_cast<std::uint32_t>(gp::dropped::bad_name))
          return fmt::format("dropped output reason {}", h.a);
        const bool plain = is_display_safe_name(payload);  // text_util.hpp
        if (plain && h.a == static_cast<std::uint32_t>(gp::dropped::bad_name))
          return "a plain output name dropped as bad_name";
        if (dropped_.size() >= gp::max_dropped) return "more dropped outputs than the scan limit";
        std::string name(payload);
        if (!names_.insert(name).second)
          return "output name reported twice " + quote_for_message(name, 64);
        dropped_.push_back(
            {.name_display = escape_name_for_display(name),
             .reason = plain ? static_cast<drop_reason>(h.a) : drop_reason::bad_name});
        return {};
      }
      case gp::msg::usage: {
        if (usage_) return "usage twice";
        if (file_fd_ >= 0) return "usage while a file is open";
        guest_usage u;
        bool counted_out = false, counted_err = false;
        for (auto [k, v] : ip::parse_config(payload)) {
          std::uint64_t n = 0;
          auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
          if (ec != std::errc{} || p != v.data() + v.size()) return "usage figure not a number";
          if (k == "memory_peak_bytes")
            u.memory_peak_bytes = n;
          else if (k == "cpu_usec")
            u.cpu_usec = n;
          else if (k == "oom_kills")
            u.oom_kills = n;
          else if (k == "stdout_bytes")
            u.stdout_bytes = n, counted_out = true;
          else if (k == "stderr_bytes")
            u.stderr_bytes = n, counted_err = true;
        }
        // The stream counts are the run machine's proof that its capture is complete: an
        // agent of this version always sends both.
        if (!counted_out || !counted_err) return "usage without the stream byte counts";
        usage_ = u;
        return {};
      }
      default:
        return fmt::format("unexpected agent message type {}", static_cast<std::uint32_t>(type));
    }
  }

  int out_dir_;
  guest_output_limits limits_;
  std::string setup_;
  bool ready_ = false, refused_ = false;
  int file_fd_ = -1;
  std::string file_name_;
  std::uint64_t declared_ = 0, written_ = 0, files_ = 0, bytes_ = 0;
  std::optional<guest_usage> usage_;
  std::vector<dropped_file> dropped_;
  std::set<std::string> names_;  // every name sent or dropped (each at most once)
};

static_assert(static_cast<std::uint32_t>(drop_reason::count_limit) ==
              static_cast<std::uint32_t>(gp::dropped::count_limit));
static_assert(static_cast<std::uint32_t>(drop_reason::bytes_limit) ==
              static_cast<std::uint32_t>(gp::dropped::bytes_limit));
static_assert(static_cast<std::uint32_t>(drop_reason::not_regular_file) ==
              static_cast<std::uint32_t>(gp::dropped::not_regular_file));
static_assert(static_cast<std::uint32_t>(drop_reason::bad_name) ==
              static_cast<std::uint32_t>(gp::dropped::bad_name));

// --- the launcher -----------------------------------------------------------------------

struct microvm_settings {
  std::unique_ptr<vmm_driver> vmm;
  std::string vmm_version;  // "7.2.22"
  fs::path mkfs_erofs;
  fs::path kernel, initramfs;
  /// A shared lock on `initramfs` (store/publish.hpp): no cleanup removes it while we live.
  unique_fd initramfs_hold;
  fs::path state_disks;  // disks of roots that are not image-store roots (the self-test's)
  bool kvm = false;
  gid_t kvm_gid = 0;
  /// Kernel arguments that keep an emulated guest's clock working on a loaded host (TCG):
  /// the TSC rate given instead of calibrated (calibration against the emulated PIT fails
  /// when the host is busy, and the guest then hangs at boot), no clocksource watchdog, no
  /// timer check. Empty under KVM (kvm-clock).
  std::string timer_args;
  std::uint64_t guest_overhead_mib = 96, vmm_overhead_mib = 192;
  log_sink log;
  /// The VMM's own root (vmm_root.hpp), pivoted into by every VMM.
  vmm_root root;
};

class microvm_launcher final : public launcher {
 public:
  explicit microvm_launcher(microvm_settings s) : s_(std::move(s)) {}

  launcher_traits traits() const override {
    return {.isolation = sandbox::isolation::microvm,
            .name = "microvm",
            .description = fmt::format("{} {} microvm ({})", s_.vmm->name(), s_.vmm_version,
                                       s_.kvm ? "kvm" : "tcg"),
            .unprivileged = false,
            .stdio_over_control = false,
            .stream_control = true,
            .stdio_sockets = true,  // see qemu_driver.cpp
            // Network runs: no NIC even then. The run's network namespace is made here, on the
            // host, with the egress proxy's listener; the guest's connections reach it through
            // the "sandbox.net" port (net_relay.hpp, wire/guest_protocol.hpp).
            .makes_network_namespace = true,
            .kill_launched_process = true,
            // A guest boots before sandbox-init answers: ~2 s under TCG on an idle 2-core host,
            // tens of seconds when the host is loaded; well under a second with KVM.
            .min_setup_budget = s_.kvm ? std::chrono::seconds(20) : std::chrono::seconds(90),
            // Network runs' Node gets the proxy preload in its `go`: the guest has no file
            // of it.
            .node_proxy_preload_path = ip::node_proxy_path,
            .node_proxy_preload_in_go = true,
            .probe_path = "sandbox-init",
            // A pooled VM boots to a waiting interpreter: the guest's sandbox-init pre-starts
            // it after the boot, and the hand-out's file frames are staged before its `go`.
            .can_prestart = true,
            // The host's run cgroup holds QEMU, never the guest's processes: an idle
            // interpreter's death is known from the guest sandbox-init's report alone.
            .host_cgroup_lists_processes = false};
  }

  void adjust_limits(const sandbox::policy& pol, cgroup_limits& limits) const override {
    // The run cgroup holds the VMM: guest RAM (see guest_ram_mib) plus QEMU's own. The
    // program's own limits are the guest cgroup's (`setup`).
    limits.memory_bytes = (guest_ram_mib(limits.memory_bytes, pol) + s_.vmm_overhead_mib) << 20;
    limits.max_pids += 64;  // QEMU's threads (vCPU, RCU, I/O workers)
    if (limits.cpu_quota_millicores > 0) {
      limits.cpu_quota_millicores = std::max<std::uint32_t>(limits.cpu_quota_millicores, 1000);
    }
  }

  // The guest workspace's tmpfs cap (`setup`'s ws_bytes): the source (or a tool's stdin) and
  // the inputs, at most what the policy lets a request bring.
  static std::uint64_t guest_ws_bytes(const sandbox::policy& pol) {
    return std::max(pol.max_source_bytes, pol.max_stdin_bytes) + pol.max_input_bytes + (1 << 20);
  }
  // Guest RAM, MiB: the program's memory limit (the guest run cgroup's), the guest's own
  // overhead (kernel, agent, initramfs), and room for a full workspace. The workspace's tmpfs
  // pages are written by the agent, outside the program's cgroup: without that room, inputs
  // near the policy's maximum squeezed the program below its own limit, and the guest
  // kernel's OOM killer then ended it as if it had exceeded that limit. RAM the guest never
  // touches costs the host nothing (QEMU maps it lazily).
  std::uint64_t guest_ram_mib(std::uint64_t memory_limit_bytes, const sandbox::policy& pol) const {
    return (memory_limit_bytes >> 20) + s_.guest_overhead_mib +
           ((guest_ws_bytes(pol) + (1 << 20) - 1) >> 20);
  }

  result<std::unique_ptr<launched>> launch(const launch_request& r, std::string* why) override {
    // 1. The image disk.
    auto disk = ensure_disk(r.job.rootfs, why);
    if (disk.empty()) return make_error_code(errc::io_error);
    // 2. The host output dir (the run machine opens it after this returns; the guest
    //    channel keeps a descriptor of it for its life: files are created beneath it only).
    const auto out = r.ws.dir / "out";
    if (::mkdir(out.c_str(), 0700) < 0) {
      *why = fmt::format("mkdir output dir: errno {}", errno);
      return make_error_code(errc::io_error);
    }
    unique_fd out_dir(::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
    if (!out_dir) {
      *why = fmt::format("opening the output dir: errno {}", errno);
      return make_error_code(errc::io_error);
    }
    // 2'. A network run: the run's network namespace with the egress proxy's listener, and
    //     the stream socket of the guest's "sandbox.net" port (the VMM gets one end).
    const bool net = r.network;
    run_netns netns;
    unique_fd net_host, net_vmm;  // the port's stream socket: the host's end, QEMU's end
    if (net) {
      auto made = make_run_netns(ip::egress_proxy_port, why);
      if (!made) return made.error();
      netns = std::move(*made);
      int np[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, np) < 0) {
        *why = fmt::format("net port socketpair: errno {}", errno);
        return make_error_code(errc::io_error);
      }
      net_host.reset(np[0]);
      net_vmm.reset(np[1]);
    }
    // 3. The VMM.
    auto log_path = r.ws.dir / "vmm.log";
    int logfd = ::open(log_path.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    int kernel = ::open(s_.kernel.c_str(), O_RDONLY | O_CLOEXEC);
    int initrd = ::open(s_.initramfs.c_str(), O_RDONLY | O_CLOEXEC);
    int diskfd = ::open(disk.c_str(), O_RDONLY | O_CLOEXEC);
    struct closer {
      std::vector<int*> fds;
      ~closer() {
        for (int* f : fds) {
          if (*f >= 0) ::close(*f);
        }
      }
    } close_all{{&logfd, &devnull, &kernel, &initrd, &diskfd}};
    if (logfd < 0 || devnull < 0 || kernel < 0 || initrd < 0 || diskfd < 0) {
      *why = fmt::format("opening the VMM's files: errno {}", errno);
      return make_error_code(errc::io_error);
    }
    if (::fchown(logfd, r.uid, r.uid) < 0) {
      *why = fmt::format("fchown vmm.log: errno {}", errno);
      return make_error_code(errc::io_error);
    }
    const auto& req = r.job.admitted.request;
    vm_spec vm{.memory_mib = guest_ram_mib(req.memory_limit_bytes, r.job.policy),
               .vcpus = 1,
               .kvm = s_.kvm,
               // pci=off: the microvm machine has no PCI bus (every device is virtio-mmio); the
               // kernel's probe finds nothing, costs boot time under TCG and prints "PCI: Fatal: No
               // config space access function found", which read like the cause of a lost boot.
               // cryptomgr.notests: the crypto API's self-tests of every algorithm as it is
               // registered (known-answer tests against a miscompiled implementation; no part
               // of the boundary) took about 0.25 s of each boot under TCG.
               .kernel_cmdline =
                   "console=ttyS0 quiet panic=-1 reboot=t rdinit=/init pci=off cryptomgr.notests" +
                   s_.timer_args,
               .net_port = net};
    spawn_request sr;  // QEMU is exec'd by its path inside its own root (jail below)
    sr.argv = s_.vmm->argv(vm);
    sr.fd0 = devnull;
    sr.fd1 = logfd;
    sr.fd2 = logfd;
    sr.fd3 = r.ctl_fd;
    sr.fd4 = r.out_fd;
    sr.extra_fds = {r.err_fd, kernel, initrd, diskfd, logfd};
    if (net) sr.extra_fds.push_back(net_vmm.get());  // vmm_fd::net
    sr.clone_flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;
    sr.uid = r.uid;
    sr.gid = r.uid;
    if (s_.kvm) sr.supplementary_gid = s_.kvm_gid;
    sr.fsize_bytes = vmm_log_bytes;
    // A VMM outlives nothing of ours: killed with the supervisor's thread (the soak's fault
    // (a): after a SIGKILL of the daemon, every QEMU was still running 10 s later).
    sr.die_with_parent = true;
    jail(sr);
    // The VMM joins the run's cgroups itself, before its first instruction (so no attach
    // after the spawn).
    std::vector<unique_fd> cgroup_procs;
    for (const auto& d : r.cgroup.dirs()) {
      unique_fd fd(::open((d / "cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd || cgroup_procs.size() == 8) {
        *why = fmt::format("opening the run cgroup's cgroup.procs: errno {}", fd ? E2BIG : errno);
        return make_error_code(errc::io_error);
      }
      sr.cgroup_procs_fds.push_back(fd.get());
      cgroup_procs.push_back(std::move(fd));
    }
    auto sp = spawn_process(sr);
    if (!sp) {
      *why = "starting the VMM: " + sp.error().message();
      return sp.error();
    }
    auto l = std::make_unique<microvm_launched>(r.ws.dir);
    l->pid = sp->pid;
    l->pidfd.reset(sp->pidfd);
    l->host_output_dir = out;
    // Guest paths: the agent mounted the image and made the workspace there.
    l->config.add("rootfs", guest_image_dir);
    l->config.add("staging", guest_staging_dir);
    l->config.add("inputs", guest_inputs_dir);
    l->config.add("source", guest_source_path);
    l->config.add("notify", "0");  // a stream channel carries no listener
    // 4. The guest channel; a network run's tunnel (the host's end of the port and the
    //    namespace) goes with it, the proxy's listener to the run machine.
    pending_net tunnel;
    if (net) {
      l->egress_listener.reset(netns.release_listener());
      tunnel = pending_net{std::move(net_host), std::move(netns)};
    }
    l->agent = make_channel(r, out_dir.release(), std::move(tunnel));
    return l;
  }

  // The VMM's file system: its prepared root (vmm_root.hpp), /dev/null, /dev/kvm under KVM,
  // a procfs of its own pid namespace (QEMU opens its descriptors as /proc/self/fd/N).
  void jail(spawn_request& sr) const {
    spawn_request::root_switch nr;
    nr.dir = s_.root.dir.string();
    nr.binds = {{"/dev/null", "dev/null"}};
    if (s_.kvm) nr.binds.emplace_back("/dev/kvm", "dev/kvm");
    nr.proc = true;
    nr.exec_path = s_.root.exec_path;
    sr.new_root = std::move(nr);
  }

 private:
  // A network run's tunnel, from launch to the channel's start: the host's end of the
  // "sandbox.net" port and the run's network namespace (its listener already handed out).
  struct pending_net {
    unique_fd port;
    run_netns ns;
  };

  // One run's VM, from its launch until its processes are confirmed dead.
  class microvm_launched final : public launched {
   public:
    explicit microvm_launched(fs::path ws_dir) : ws_dir_(std::move(ws_dir)) {}
    // The tail of the VMM's own log (QEMU's messages and the guest console), host log only.
    std::string diagnostics() const override {
      std::string text;
      if (!read_file(ws_dir_ / "vmm.log", &text, vmm_log_bytes)) return {};
      if (text.size() > 4096) text = text.substr(text.size() - 4096);
      return "vmm: " + escape_for_display(text);
    }

   private:
    fs::path ws_dir_;
  };

  // The run's guest channel: the agent's `setup` (the guest cgroup's limits, the workspace
  // and output caps), owning `dir` (the host output dir) and, in a network run, the tunnel.
  std::unique_ptr<agent_channel> make_channel(const launch_request& r, int dir, pending_net net) {
    const auto& req = r.job.admitted.request;
    const auto& pol = r.job.policy;
    ip::config_writer w;
    w.add("memory_bytes", req.memory_limit_bytes);
    w.add("pids", std::uint64_t{pol.max_pids});
    if (pol.cpu_quota_millicores > 0) {
      w.add("cpu_quota_us", std::uint64_t{pol.cpu_quota_millicores} * 100);
      w.add("cpu_period_us", std::uint64_t{100000});
    }
    w.add("ws_bytes", guest_ws_bytes(pol));
    w.add("in_files", std::uint64_t{pol.max_input_files});
    w.add("out_files", std::uint64_t{req.files_out.max_files});
    w.add("out_bytes", req.files_out.max_bytes);
    w.add("network", net.port ? "1" : "0");
    return std::make_unique<owning_channel>(
        dir, guest_output_limits{req.files_out.max_files, req.files_out.max_bytes}, w.bytes(),
        std::move(net));
  }

  // The guest channel owning its output dir descriptor and, in a network run, the tunnel.
  class owning_channel final : public agent_channel {
   public:
    owning_channel(int dir, guest_output_limits l, std::string setup, pending_net net)
        : dir_(dir), inner_(make_guest_channel(dir, l, std::move(setup))), net_(std::move(net)) {}
    ~owning_channel() override {
      if (relay_) relay_->stop();
      inner_.reset();
      ::close(dir_);
    }
    void start(boost::asio::strand<boost::asio::any_io_executor> strand,
               std::function<void(std::string)> fault) override {
      if (!net_.port) return;
      // Each guest connection gets a socket made inside the run's namespace, connected to
      // the proxy's listener there. The namespace stays open as long as the relay.
      auto ns = std::make_shared<run_netns>(std::move(net_.ns));
      const int port = net_.port.release();  // the relay owns it
      relay_ = net_relay::start(
          strand, port, [ns](std::string* why) { return socket_in_netns(ns->ns_fd(), why); },
          boost::asio::ip::tcp::endpoint(boost::asio::ip::address_v4::loopback(),
                                         ip::egress_proxy_port),
          [fault = std::move(fault)](std::string why) { fault("egress tunnel: " + why); });
    }
    std::string initial_frames() override { return inner_->initial_frames(); }
    result<std::string> file_frames(const run_workspace& ws) override {
      return inner_->file_frames(ws);
    }
    std::string on_frame(const ip::init_header& h, std::string_view p) override {
      return inner_->on_frame(h, p);
    }
    std::optional<guest_usage> usage() const override { return inner_->usage(); }
    std::vector<dropped_file> dropped() const override { return inner_->dropped(); }

   private:
    int dir_;
    std::unique_ptr<agent_channel> inner_;
    pending_net net_;
    std::shared_ptr<net_relay> relay_;
  };

  // The erofs disk of `rootfs`, built once. Image-store roots (<images>/rootfs/<64 hex>) get
  // <images>/microvm/disks/sha256-<hex>.erofs; any other root (the self-test's empty one) a
  // disk under the state dir named by the hash of its path. Every process starting runs of an
  // image shares its disk, so (store/publish.hpp):
  //  - one builder at a time: `disk_mu_` in this process, an flock on "<disk>.lock" between
  //    processes (concurrent first runs of one image build it once);
  //  - built under a unique temporary name (mkfs.erofs writes the file we created), fsync'd,
  //    then renamed into place, and its digest published after it in "<disk>.sha256"
  //    ("<sha256 hex> <bytes>\n");
  //  - verified before use: a disk whose bytes do not match that digest (or without one: a
  //    crash between the two, or an older version's) is rebuilt and replaced, never used. A
  //    process hashes a disk once; it knows it again by its inode, size and times.
  fs::path ensure_disk(const fs::path& rootfs, std::string* why) {
    std::lock_guard lock(disk_mu_);
    const std::string base = rootfs.filename().string();
    const bool store_root =
        rootfs.parent_path().filename() == "rootfs" && base.size() == 64 &&
        std::all_of(base.begin(), base.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
        });
    fs::path dir =
        store_root ? rootfs.parent_path().parent_path() / "microvm" / "disks" : s_.state_disks;
    const std::string name = store_root
                                 ? "sha256-" + base + ".erofs"
                                 : "root-" + sha256_hex(rootfs.string()).substr(0, 16) + ".erofs";
    const fs::path disk = dir / name;
    std::error_code ec;
    fs::create_directories(dir, ec);
    auto dfd = ec ? result<unique_fd>(sys_error(ec.value())) : open_dir_at(AT_FDCWD, dir.string());
    if (!dfd) {
      *why = "cannot open the disk cache " + dir.string() + ": " + dfd.error().message();
      return {};
    }
    // (On a read-only image store nothing can be built: a disk there is only verified.)
    auto held = file_lock::acquire(dfd->get(), name + ".lock", true, true);
    if (!held && held.error().value() != EROFS && held.error().value() != EACCES) {
      *why = "cannot lock " + disk.string() + ".lock: " + held.error().message();
      return {};
    }
    // Known: this process verified this very file (same inode, size and times) before.
    auto identity = [&]() -> std::string {
      struct stat st {};
      if (::fstatat(dfd->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return {};
      return fmt::format("{}:{}:{}:{}.{}:{}.{}", st.st_dev, st.st_ino, st.st_size,
                         st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec,
                         st.st_ctim.tv_nsec);
    };
    const std::string digest_name = name + ".sha256";
    if (auto it = verified_disks_.find(disk.string());
        it != verified_disks_.end() && !it->second.empty() && it->second == identity()) {
      return disk;
    }
    if (auto recorded = read_file_at(dfd->get(), digest_name, 256)) {
      std::istringstream in(*recorded);
      file_digest want;
      in >> want.sha256 >> want.size;
      if (in && is_hex64(want.sha256) && open_verified_at(dfd->get(), name, want, 0444)) {
        verified_disks_[disk.string()] = identity();
        return disk;
      }
    }
    // -x-1: no extended attributes (no file capabilities reach the guest); -T0: fixed times.
    std::string tool_output;
    auto built = install_file_at(
        dfd->get(), name, 0444,
        [&](int, const std::string& tmp) -> result<void> {
          auto r = run_tool({s_.mkfs_erofs.string(), "--quiet", "-x-1", "-T0", (dir / tmp).string(),
                             rootfs.string()},
                            minimal_tool_env(), std::chrono::minutes(5));
          if (r && r->ok()) return {};
          tool_output = r ? ": " + r->describe() + ": " + r->output.substr(0, 512) : "";
          return make_error_code(errc::io_error);
        },
        nullptr, true);
    if (!built) {
      *why = tool_output.empty() ? "publishing the image disk: " + built.error().message()
                                 : "mkfs.erofs failed" + tool_output;
      return {};
    }
    if (auto rec = replace_file_at(dfd->get(), digest_name,
                                   fmt::format("{} {}\n", built->sha256, built->size), 0444);
        !rec) {
      *why = "recording the image disk's digest: " + rec.error().message();
      return {};
    }
    verified_disks_[disk.string()] = identity();
    if (s_.log) s_.log(log_level::info, "microvm: built image disk " + disk.string());
    return disk;
  }

  microvm_settings s_;
  std::mutex disk_mu_;
  /// Disks this process verified: path → identity (device, inode, size, times). Guarded by
  /// disk_mu_.
  std::map<std::string, std::string> verified_disks_;
};

// KVM is usable when /dev/kvm makes a VM and a non-root VMM may open it (group rw).
bool kvm_usable(gid_t* gid, std::string* why) {
  int fd = ::open("/dev/kvm", O_RDWR | O_CLOEXEC);
  if (fd < 0) return *why = "/dev/kvm cannot be opened", false;
  int vm = ::ioctl(fd, KVM_CREATE_VM, 0);
  ::close(fd);
  if (vm < 0) return *why = fmt::format("/dev/kvm cannot create a VM (errno {})", errno), false;
  ::close(vm);
  struct stat st {};
  if (::stat("/dev/kvm", &st) < 0 || (st.st_mode & 0060) != 0060) {
    return *why = "/dev/kvm is not group read-write (the VMM runs as the run's uid)", false;
  }
  *gid = st.st_gid;
  return true;
}

// The initramfs: /init (the guest agent), /sandbox-init, /modules/{order, *.ko}. Published
// under <state>/initramfs/ by the hash of its bytes ("initramfs-<32 hex>.cpio", shared by every
// process starting this level with the same helpers and kernel modules; store/publish.hpp),
// verified before use and held (`*hold`) for the backend's life. Copies no live process holds
// are removed (the older "<32 hex>.cpio" names, whose users held no lock, are left alone).
// Returns its path, or "" with `*why`.
fs::path build_initramfs(const fs::path& state, const fs::path& kernel_dir, int init_exec_fd,
                         unique_fd* hold, const log_sink& log, std::string* why) {
  const std::string_view guest = embedded::sandbox_guest();
  // (A sealed memfd, or a file opened O_PATH: reopened for reading through /proc.)
  std::string init;
  {
    int fd = ::open(fmt::format("/proc/self/fd/{}", init_exec_fd).c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
      if (fd >= 0) ::close(fd);
      return *why = "cannot read the sandbox-init executable", fs::path{};
    }
    init.assign(static_cast<std::size_t>(st.st_size), '\0');
    ssize_t got = ::pread(fd, init.data(), init.size(), 0);
    ::close(fd);
    if (got != static_cast<ssize_t>(init.size()))
      return *why = "cannot read the sandbox-init executable", fs::path{};
  }
  std::string order;
  if (!read_file(kernel_dir / "modules" / "order", &order, 1 << 20)) {
    return *why = "kernel store: " + (kernel_dir / "modules" / "order").string() + " is missing",
           fs::path{};
  }
  cpio_writer w;
  w.add_file("init", 0755, guest);
  w.add_file("sandbox-init", 0755, init);
  w.add_directory("modules", 0755);
  w.add_file("modules/order", 0444, order);
  std::istringstream lines(order);
  for (std::string name; std::getline(lines, name);) {
    if (name.empty()) continue;
    if (name.find('/') != std::string::npos || name == "." || name == ".." || name == "order") {
      return *why = "kernel store: modules/order names '" + name + "'", fs::path{};
    }
    std::string ko;
    if (!read_file(kernel_dir / "modules" / name, &ko, 64 << 20)) {
      return *why =
                 "kernel store: module " + (kernel_dir / "modules" / name).string() + " is missing",
             fs::path{};
    }
    w.add_file("modules/" + name, 0444, ko);
  }
  std::string archive = w.finish();
  auto dir = state / "initramfs";
  std::error_code ec;
  fs::create_directories(dir, ec);
  auto dfd = ec ? result<unique_fd>(sys_error(ec.value())) : open_dir_at(AT_FDCWD, dir.string());
  if (!dfd) return *why = "cannot open " + dir.string() + ": " + dfd.error().message(), fs::path{};
  const std::string name = "initramfs-" + sha256_hex(archive).substr(0, 32) + ".cpio";
  auto fd = publish_file_at(dfd->get(), name, archive, {.mode = 0444, .hold = true});
  if (!fd) {
    return *why = "cannot write the initramfs under " + dir.string() + ": " + fd.error().message(),
           fs::path{};
  }
  *hold = std::move(*fd);
  remove_unheld_at(
      dfd->get(),
      [](std::string_view n) {
        return n.rfind("initramfs-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".cpio";
      },
      name, store_logger(log));
  return dir / name;
}

}  // namespace

std::unique_ptr<agent_channel> make_guest_channel(int out_dir_fd, guest_output_limits limits,
                                                  std::string setup_payload) {
  return std::make_unique<guest_channel>(out_dir_fd, limits, std::move(setup_payload));
}

std::variant<std::shared_ptr<backend>, std::string> make_microvm_backend(
    const run_machine_context& ctx, const microvm_backend_options& o) {
  if (::geteuid() != 0) return std::string("microvm: needs root");
  microvm_settings s;
  fs::path qemu = o.qemu_path.empty() ? fs::path("/usr/bin/qemu-system-x86_64") : o.qemu_path;
  if (::access(qemu.c_str(), X_OK) != 0) {
    return "microvm: " + qemu.string() + " is missing (install qemu-system-x86)";
  }
  auto ver = run_tool({qemu.string(), "--version"}, minimal_tool_env(), std::chrono::seconds(10));
  if (!ver || !ver->ok()) return "microvm: `" + qemu.string() + " --version` failed";
  {
    // "QEMU emulator version 7.2.22 (Debian …)"
    std::string first = ver->output.substr(0, ver->output.find('\n'));
    auto at = first.find("version ");
    s.vmm_version =
        at == std::string::npos ? "?" : first.substr(at + 8, first.find(' ', at + 8) - at - 8);
  }
  s.vmm = make_qemu_driver(qemu);
  s.mkfs_erofs = o.mkfs_erofs_path.empty() ? fs::path("/usr/bin/mkfs.erofs") : o.mkfs_erofs_path;
  if (::access(s.mkfs_erofs.c_str(), X_OK) != 0) {
    return "microvm: " + s.mkfs_erofs.string() + " is missing (install erofs-utils)";
  }
  // The uncompressed kernel when the store has it (tools/extract-vmlinux.py): QEMU boots it
  // at its PVH entry, skipping the guest's self-decompression (about 0.85 s of each boot under
  // TCG); otherwise the bzImage.
  s.kernel = o.kernel_dir / "vmlinux";
  if (::access(s.kernel.c_str(), R_OK) != 0) s.kernel = o.kernel_dir / "vmlinuz";
  if (::access(s.kernel.c_str(), R_OK) != 0) {
    return "microvm: kernel store " + o.kernel_dir.string() +
           " has no vmlinuz (run tools/fetch-guest-kernel.sh, or set backends.microvm.kernel_dir)";
  }
  if (o.accel != "auto" && o.accel != "kvm" && o.accel != "tcg") {
    return "microvm: accel must be auto, kvm or tcg (got '" + o.accel + "')";
  }
  if (o.accel != "tcg") {
    std::string why;
    s.kvm = kvm_usable(&s.kvm_gid, &why);
    if (!s.kvm && o.accel == "kvm") return "microvm: accel kvm: " + why;
    if (!s.kvm && ::access("/dev/kvm", F_OK) == 0 && ctx.log) {
      // The operator may not know that a present /dev/kvm is unusable: runs are several
      // times slower to start under emulation.
      ctx.log(log_level::warning,
              "microvm: " + why + ": using TCG emulation (docs/operations.md, \"microvm level\")");
    }
  }
  if (!s.kvm) {
    // Under TCG the guest's TSC runs at the host's rate. x86 Linux derives BogoMIPS from the
    // TSC (2 × MHz), which, unlike "cpu MHz", does not move with frequency scaling.
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
      if (line.rfind("bogomips", 0) != 0) continue;
      double bogomips = std::atof(line.substr(line.find(':') + 1).c_str());
      if (bogomips > 200) {
        s.timer_args = fmt::format(" tsc_early_khz={}", static_cast<std::uint64_t>(bogomips * 500));
      }
      break;
    }
    s.timer_args += " tsc=reliable no_timer_check";
  }
  s.guest_overhead_mib = o.guest_overhead_mib;
  s.vmm_overhead_mib = o.vmm_overhead_mib;
  s.log = ctx.log;
  auto state = ctx.state_dir / "microvm";
  std::error_code ec;
  fs::create_directories(state, ec);
  if (ec) return "microvm: state directory " + state.string() + " cannot be created";
  ::chmod(state.c_str(), 0711);
  s.state_disks = state / "disks";
  auto root = prepare_vmm_root(state, qemu);
  if (auto* bad = std::get_if<std::string>(&root)) return "microvm: " + *bad;
  s.root = std::move(std::get<vmm_root>(root));
  int init_fd = open_init_executable(ctx.options.init_path);
  if (init_fd < 0) return std::string("microvm: cannot load the sandbox-init helper");
  std::string why;
  s.initramfs = build_initramfs(state, o.kernel_dir, init_fd, &s.initramfs_hold, ctx.log, &why);
  ::close(init_fd);
  if (s.initramfs.empty()) return "microvm: " + why;
  // The level's own pools (the context carries the process level's, which are not VMs).
  run_machine_context c = ctx;
  c.options.warm_pool = o.warm_pool;
  // A recorded self-test pass holds while the VMM, mkfs.erofs, the guest kernel and its
  // initramfs (our guest agent and the kernel's modules) and these settings do.
  c.self_test_deps = {
      .files = {qemu, s.mkfs_erofs, s.kernel, s.initramfs},
      .config = fmt::format("accel={} kvm_gid={} vmm={} timer_args={} guest_overhead_mib={} "
                            "vmm_overhead_mib={}",
                            s.kvm ? "kvm" : "tcg", s.kvm_gid, s.vmm_version, s.timer_args,
                            s.guest_overhead_mib, s.vmm_overhead_mib)};
  return make_run_machine(c, std::make_shared<microvm_launcher>(std::move(s)));
}

}  // namespace sandbox::detail
