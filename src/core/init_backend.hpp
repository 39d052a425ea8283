// Backends built on sandbox-init (private to src/): the process backend and the OCI backends
// (container: crun, runc; gvisor: runsc) share everything of a run's life — cgroup, uid,
// workspace, the control channel, capture, seccomp notifications, the DNS sink, deadlines,
// kill-and-confirm, output collection, classification, warm pools — and differ only in how
// sandbox-init is started. That difference is an `init_launcher`. See docs/architecture.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>

#include "core/cgroup.hpp"
#include "core/init_protocol.hpp"
#include "core/workspace.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox::detail {

/// One run's launch: what the launcher gets from the shared run machine.
struct launch_request {
  const run_job& job;
  const std::string& instance_id;  ///< names the run's cgroup, workspace and container
  const run_workspace& ws;
  run_cgroup& cgroup;              ///< created, with limits, before any process exists
  const std::string& cgroup_path;  ///< its path inside each hierarchy, e.g. "/agent-sandbox/r-…"
  std::uint32_t uid = 0;           ///< the program's uid (and gid)
  bool selftest = false;           ///< the start-up self-test's probe run
  const std::string& input_name;   ///< "in-<16 hex>": the inputs' dir under /sandbox
  int ctl_fd = -1;                 ///< becomes sandbox-init's fd 3 (init_protocol::control_fd)
  int out_fd = -1, err_fd = -1;    ///< become the program's stdout and stderr (see
                                   ///< `stdio_over_control`: -1 then)
};

/// The process a launch started: sandbox-init itself, or the OCI runtime that runs it. Its
/// exit means the run's processes are going (the run still confirms its cgroup empty).
struct launched {
  pid_t pid = -1;
  int pidfd = -1;  ///< owned by the caller, O_CLOEXEC
  /// Network runs of a launcher that made the run's network namespace itself
  /// (`makes_network_namespace`): the egress proxy's listening socket in it (owned by the
  /// caller); -1 otherwise (sandbox-init then makes it: init_protocol `egress_proxy`).
  int egress_listener = -1;
};

/// Usage figures a guest reported (microvm: its own cgroup's), as trustworthy as its kernel.
struct guest_usage {
  std::uint64_t memory_peak_bytes = 0, cpu_usec = 0, oom_kills = 0;
  /// Bytes the program wrote to its stdout / stderr, as the guest agent counted them at its
  /// relay (core/guest_protocol.hpp, `usage`). Untrusted: the run machine completes a run
  /// once its capture received that many on each stream, or after a bounded wait (the
  /// result then says what is missing); it never reports more than it received.
  std::uint64_t stdout_bytes = 0, stderr_bytes = 0;
};

/**
 * One run's side of a guest agent (the microvm level, core/guest_protocol.hpp): the run
 * machine hands it the agent's frames (types from 100) and asks it for the files to send
 * before `go`. Everything it gets came from the guest and is untrusted. Used on the run's
 * strand only.
 */
class agent_channel {
 public:
  virtual ~agent_channel() = default;
  /// Stream-framed frames to send before sandbox-init's configuration (the agent's `setup`).
  virtual std::string initial_frames() = 0;
  /// The staged source and inputs of `ws` as stream-framed file_* frames (sent before `go`).
  /// Errors: `io_error` when a staged file cannot be read.
  virtual result<std::string> file_frames(const run_workspace& ws) = 0;
  /// Handles one agent frame. Empty when accepted; else a short reason for the host log
  /// (never guest bytes): the run then ends `internal`.
  virtual std::string on_frame(const init_protocol::init_header& h, std::string_view payload) = 0;
  /// The guest's usage report, once it came.
  virtual std::optional<guest_usage> usage() const = 0;
  /// Output entries the guest reported and did not send (microvm: file_dropped), already
  /// checked and capped, each with its display name and reason; the run machine merges them
  /// into `files_dropped` beside the host collector's own. Empty by default.
  virtual std::vector<dropped_file> dropped() const { return {}; }
  /// Starts the channel's own I/O beside the control channel (microvm network runs: the
  /// egress tunnel, core/guest_protocol.hpp) on the run's `strand`. `fault` (called there, at
  /// most once) ends the run `internal` with a short reason for the host log (never guest
  /// bytes). Called once, right after the channel is made. Default: nothing to start.
  virtual void start(boost::asio::strand<boost::asio::any_io_executor> strand,
                     std::function<void(std::string)> fault) {
    (void)strand;
    (void)fault;
  }
};

/// How one backend starts sandbox-init. Implementations are thread-safe.
class init_launcher {
 public:
  virtual ~init_launcher() = default;

  virtual sandbox::isolation isolation() const noexcept = 0;
  /// Short name for reports and logs, e.g. "process", "crun".
  virtual std::string_view name() const noexcept = 0;
  /// What results report as `backend`, e.g. "process" or "crun 1.8.1".
  virtual std::string describe() const { return std::string(name()); }
  /// True when the launcher works for a host without root (the run gets a user namespace
  /// and every id maps to `userns_inside_id`).
  virtual bool unprivileged() const noexcept { return false; }

  /**
   * Starts sandbox-init for `r`: fd 3 = `r.ctl_fd`, stdout/stderr = `r.out_fd`/`r.err_fd`,
   * stdin /dev/null, inside `r.cgroup` before it reads its configuration (it waits for it).
   * Returns the process to watch, or an error with `*why` for the host log.
   */
  virtual result<launched> launch(const launch_request& r, std::string* why) = 0;

  /// Adds the launcher's entries to sandbox-init's configuration (the shared machine writes
  /// uid, sizes, limits and names).
  virtual void add_config(const launch_request& r, init_protocol::config_writer& w) = 0;

  /// True when the stdout/stderr pipes must reach sandbox-init with its configuration
  /// (SCM_RIGHTS) rather than as the launched process's stdio: an OCI runtime in the
  /// foreground holds its own stdio until it exits, so the host would never see the
  /// program's end of output. `launch` then gets no pipes (`out_fd`, `err_fd` are -1).
  virtual bool stdio_over_control() const noexcept { return false; }

  /// What the launched process said about a failed setup (an OCI runtime's log), for the host
  /// log only: it may name host paths. Empty when there is nothing.
  virtual std::string diagnostics(const run_workspace& ws) const {
    (void)ws;
    return {};
  }

  /// True when the control channel is a byte stream that carries no descriptors (runsc:
  /// gVisor passes only stdio, and sockets into it lose SCM_RIGHTS). Then packets are
  /// length-prefixed, sandbox-init serves the DNS sink itself and reports queries as `dns`,
  /// there is no seccomp user notification, and `quiet` marks the end of the program's
  /// output (the runtime holds the capture pipes too). See core/init_protocol.hpp.
  virtual bool stream_control() const noexcept { return false; }
  /// True when the program's stdout/stderr must be stream sockets rather than pipes (the
  /// host reads them the same way): a VMM whose chardevs only flow-control sockets.
  virtual bool stdio_sockets() const noexcept { return false; }
  /// The least setup budget a run of this launcher gets, whatever the policy says (a VM
  /// boots before sandbox-init can answer: seconds under emulation on a loaded host).
  virtual std::chrono::milliseconds min_setup_budget() const noexcept {
    return std::chrono::milliseconds(0);
  }
  /// True when a network run's launch makes the run's network namespace on the host and
  /// returns the egress proxy's listener in `launched` (runsc: its sandbox cannot pass a
  /// descriptor out). Such runs never take a warm-pool instance (those have no network).
  virtual bool makes_network_namespace() const noexcept { return false; }
  /// Where the run sees the Node proxy preload (network runs get
  /// `NODE_OPTIONS=--require <path>`); empty: not provided.
  virtual std::string node_proxy_preload_path() const { return {}; }

  /// The run cgroup's limits, from the request's (`pol`: the run's policy): a launcher whose
  /// runtime puts its own processes into the run's cgroup (gVisor's sentry and gofer, a
  /// VMM and its guest's RAM) adds their overhead here, and must write the same figures into
  /// its runtime's configuration.
  virtual void adjust_limits(const sandbox::policy& pol, cgroup_limits& limits) const {
    (void)pol;
    (void)limits;
  }

  /// Whether killing a run starts with SIGKILL to the launched process (sandbox-init: yes).
  /// An OCI runtime instead exits by itself once the run's cgroup is empty, so it can clean
  /// up after its container; it is killed only if it lingers (2 s).
  virtual bool kill_launched_process() const noexcept { return true; }

  /// CPU time (µs) of the run's processes when the run cgroup cannot tell it (they joined
  /// hierarchies it does not read); nullopt when unknown.
  virtual std::optional<std::uint64_t> cpu_usage_usec(const std::string& cgroup_path) const {
    (void)cgroup_path;
    return std::nullopt;
  }

  /// argv[0] of the self-test probe inside the sandbox.
  virtual std::string probe_path() const = 0;

  /// The output directory on the host, when the launcher made it (the OCI launchers mount a
  /// size-capped tmpfs there); empty when sandbox-init hands over a descriptor of its own.
  virtual std::filesystem::path host_output_dir(const run_workspace& ws) const {
    (void)ws;
    return {};
  }

  /// Called once per instance when every process is confirmed dead (or given up on), before
  /// the workspace is removed: releases what `launch` made outside the workspace (host
  /// mounts, the OCI runtime's state). Never blocks on a sandbox-controlled object.
  virtual void release(const std::string& instance_id, const run_workspace& ws) noexcept {
    (void)instance_id;
    (void)ws;
  }

  /// Called once, before anything else: the backend instance's id (12 hex; unique per
  /// process and start), which the launcher may use in names (container ids).
  virtual void set_backend_instance(const std::string& id) { (void)id; }

  /// At start-up: reclaims what instances of this state directory that are not `alive`
  /// (crashed, or shut down with work left) left behind with this launcher.
  virtual void reclaim(const std::function<bool(const std::string&)>& alive) noexcept {
    (void)alive;
  }

  /// At shutdown: waits (bounded) for releases still in flight.
  virtual void drain() noexcept {}

  /// A guest agent between the host and sandbox-init (microvm): the run's channel, made
  /// right after `launch`; nullptr (the default) when sandbox-init is reached directly.
  virtual std::unique_ptr<agent_channel> make_agent_channel(const launch_request& r) {
    (void)r;
    return nullptr;
  }
};

/// Ids inside a run's user namespace (unprivileged hosts).
inline constexpr std::uint32_t userns_inside_id = 1000;

/// What the runtime hands a backend built on sandbox-init.
struct init_backend_context {
  boost::asio::any_io_executor executor;  ///< timers and I/O of every run
  process_backend_options options;  ///< cgroup parent/root, uid range, warm pools
  std::filesystem::path state_dir;  ///< per-host runtime state (work dirs, locks)
  log_sink log;                     ///< host log lines
  sandbox::policy policy;           ///< limits of warm-pool instances
  /// Runtime name → its spec and unpacked image root (for warm-pool templates); nullopt when
  /// the runtime or its image is unavailable.
  std::function<std::optional<std::pair<runtime_spec, std::filesystem::path>>(std::string_view)>
      resolve_runtime;
  egress_proxy_options egress;      ///< network runs' egress proxy
  /// The mount table the cgroup layout is read from. Tests point it (with
  /// `options.cgroup_root`) at a fake cgroupfs to see the self-test refuse a weak host.
  std::filesystem::path mountinfo = "/proc/self/mountinfo";
};

/**
 * Opens the state directory (a subdirectory per backend name), the cgroups and the uid
 * pool, reclaims what crashed hosts left behind, runs the start-up self-test through
 * `launcher` (a real sandbox: the probe checks uid, capabilities, no_new_privs, seccomp,
 * and that an egress attempt is recorded) and returns the backend, or a one-line reason.
 */
std::variant<std::shared_ptr<backend>, std::string> make_init_backend(
    const init_backend_context& ctx, std::shared_ptr<init_launcher> launcher);

class egress_resolver;
/// The resolver of network runs' egress proxies: `pinned` names (egress_proxy_options) answer
/// with their fixed, trusted addresses; other names go to `fallback` (untrusted answers) or,
/// when it is empty, the host's resolver. A reason (naming the entry) when a pinned name or
/// address is malformed.
std::variant<std::shared_ptr<egress_resolver>, std::string> make_egress_resolver(
    boost::asio::any_io_executor ex, const std::map<std::string, std::vector<std::string>>& pinned,
    std::function<void(const std::string&, std::function<void(std::vector<std::string>)>)> fallback = {});

/// Sizes and limits inside one run's sandbox, derived from its request and the policy
/// (bytes, counts). Every tmpfs size has a 64 KiB floor: tmpfs reads size=0 as unlimited.
struct sandbox_size_set {
  std::uint64_t tmp_bytes = 0, home_bytes = 0, shm_bytes = 0, out_bytes = 0;
  std::uint64_t tmpfs_inodes = 0, out_inodes = 0, nofile = 0, fsize_bytes = 0;
};
sandbox_size_set sandbox_sizes(const run_job& job);

/// A descriptor of the sandbox-init executable: a sealed memfd holding the copy built into
/// the library, or `path` opened O_PATH when given. -1 on failure.
int open_init_executable(const std::filesystem::path& path);

/// Writes `content` to an existing file (no create); false on any failure.
bool write_existing_file(const std::string& path, std::string_view content);

}  // namespace sandbox::detail
