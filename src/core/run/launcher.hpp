// The launcher: what a level supplies to the run machine (private to src/).
//
// Every level runs the program under sandbox-init, so one run machine (machine.hpp) drives
// every run's life: cgroup, uid, workspace, control channel, capture, evidence, deadlines,
// kill-and-confirm, collection, classification, warm pools. What differs per level is how
// sandbox-init gets started — the process level spawns it, the OCI levels run crun, runc or
// runsc with a bundle, the microvm level boots a VM whose guest agent starts it — and that
// is a `launcher`: its traits (a value, read once), the run cgroup's limits, and `launch`,
// which returns a per-run `launched` object the run owns until every process is confirmed
// dead. Plus `start` and `drain` at the backend's start and shutdown. See
// docs/architecture.md ("Run machine and launchers").
#pragma once

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/run/cgroup.hpp"
#include "core/run/workspace.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/error.hpp"
#include "sys/unique_fd.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {

/// Ids inside a run's user namespace (unprivileged hosts).
inline constexpr std::uint32_t userns_inside_id = 1000;

/// What a launcher is, read once when the run machine is made. Every flag's default is the
/// process level's.
struct launcher_traits {
  sandbox::isolation isolation = sandbox::isolation::process;  ///< the level it provides
  std::string name{};         ///< short name for reports and logs, e.g. "process", "crun"
  std::string description{};  ///< what results report as `backend`, e.g. "crun 1.8.1"
  /// Works for a host without root (the run gets a user namespace and every id maps to
  /// `userns_inside_id`).
  bool unprivileged = false;
  /// The stdout/stderr pipes reach sandbox-init with its configuration (SCM_RIGHTS) rather
  /// than as the launched process's stdio: an OCI runtime in the foreground holds its own
  /// stdio until it exits, so the host would never see the program's end of output. `launch`
  /// then gets no pipes (`out_fd`, `err_fd` are -1).
  bool stdio_over_control = false;
  /// The control channel is a byte stream that carries no descriptors (runsc: gVisor passes
  /// only stdio, and sockets into it lose SCM_RIGHTS; microvm: a virtio-serial port). Then
  /// packets are length-prefixed, sandbox-init serves the DNS sink itself and reports
  /// queries as `dns`, there is no seccomp user notification, and `quiet` marks the end of
  /// the program's output. See wire/init_protocol.hpp.
  bool stream_control = false;
  /// The program's stdout/stderr are stream sockets rather than pipes (the host reads them
  /// the same way): a VMM whose chardevs only flow-control sockets.
  bool stdio_sockets = false;
  /// A network run's launch makes the run's network namespace on the host and returns the
  /// egress proxy's listener (`launched::egress_listener`; runsc: its sandbox cannot pass a
  /// descriptor out). Such runs never take a warm-pool instance (those have no network).
  bool makes_network_namespace = false;
  /// Killing a run starts with SIGKILL to the launched process (sandbox-init: yes). An OCI
  /// runtime instead exits by itself once the run's cgroup is empty, so it can clean up
  /// after its container; it is killed only if it lingers (2 s).
  bool kill_launched_process = true;
  /// The least setup budget a run gets, whatever the policy says (a VM boots before
  /// sandbox-init can answer: seconds under emulation on a loaded host).
  std::chrono::milliseconds min_setup_budget{0};
  /// Where the run sees the Node proxy preload (network runs get
  /// `NODE_OPTIONS=--require <path>`); empty: not provided.
  std::string node_proxy_preload_path{};
  /// The launcher's runs have no file of the preload: a network run's `go` carries it and
  /// sandbox-init writes it to `init_protocol::node_proxy_path` (the microvm level, whose
  /// guest has nothing of the host). `node_proxy_preload_path` must then be that path.
  bool node_proxy_preload_in_go = false;
  /// argv[0] of the start-up self-test's probe inside the sandbox.
  std::string probe_path{};
  /// Pre-started warm-pool classes (`warm_pool_class::prestart`) can be served: sandbox-init
  /// starts the interpreter in the prepared instance and hands it the run at `go` (process,
  /// container and gvisor levels; not a microVM guest's sandbox-init yet).
  bool can_prestart = true;
  /// The host's run cgroup lists the sandbox's own processes in `cgroup.procs`, so the
  /// hand-out health check can see that a pre-started interpreter still lives (process
  /// level, crun, runc). False at gvisor: that cgroup holds the runtime's sentry and gofer,
  /// never the sandboxed processes, whose life only the sentry knows; there an idle
  /// interpreter's death is known from sandbox-init's `failed` report alone.
  bool host_cgroup_lists_processes = true;
};

/// One run's launch: what the launcher gets from the run machine. Every reference lives
/// for the call only.
struct launch_request {
  const run_job& job;
  const std::string& instance_id;  ///< names the run's cgroup, workspace and container
  const run_workspace& ws;
  run_cgroup& cgroup;              ///< created, with limits, before any process exists
  const std::string& cgroup_path;  ///< its path inside each hierarchy, e.g. "/agent-sandbox/r-…"
  std::uint32_t uid = 0;           ///< the program's uid (and gid)
  bool selftest = false;           ///< the start-up self-test's probe run
  bool network = false;            ///< a network run (is_network_granted)
  const std::string& input_name;   ///< "in-<16 hex>": the inputs' dir under /sandbox
  int ctl_fd = -1;                 ///< becomes sandbox-init's control channel (fd 3, or stdin
                                   ///< in stream mode: init_protocol::control_fd)
  int out_fd = -1, err_fd = -1;    ///< become the program's stdout and stderr (-1 with
                                   ///< `stdio_over_control`)
};

/// Usage figures a guest reported (microvm: its own cgroup's), as trustworthy as its kernel.
struct guest_usage {
  std::uint64_t memory_peak_bytes = 0, cpu_usec = 0, oom_kills = 0;
  /// Bytes the program wrote to its stdout / stderr, as the guest agent counted them at its
  /// relay (wire/guest_protocol.hpp, `usage`). Untrusted: the run machine completes a run
  /// once its capture received that many on each stream, or after a bounded wait (the
  /// result then says what is missing); it never reports more than it received.
  std::uint64_t stdout_bytes = 0, stderr_bytes = 0;
};

/**
 * One run's side of a guest agent (the microvm level, wire/guest_protocol.hpp): the run
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
  /// egress tunnel, wire/guest_protocol.hpp) on the run's `strand`. `fault` (called there,
  /// at most once) ends the run `internal` with a short reason for the host log (never guest
  /// bytes). Called once, right after the launch. Default: nothing to start.
  virtual void start(boost::asio::strand<boost::asio::any_io_executor> strand,
                     std::function<void(std::string)> fault) {
    (void)strand;
    (void)fault;
  }
};

/**
 * What one launch made, owned by its run from `launch` until every process of the run is
 * confirmed dead (or given up on): the launched process and what the run machine takes from
 * it, and the run's own launcher hooks. A launcher derives from it to keep per-run state
 * (an OCI container's id, the paths its hooks read). The run machine calls the hooks on the
 * run's strand, or from the run's destructor (emergency cleanup); never concurrently.
 */
class launched {
 public:
  virtual ~launched() = default;

  /// The launched process: sandbox-init itself, or the OCI runtime or VMM that runs it. Its
  /// exit means the run's processes are going (the run still confirms its cgroup empty).
  pid_t pid = -1;
  /// Its pidfd (O_CLOEXEC). The run machine takes it: it kills and reaps through it.
  unique_fd pidfd;
  /// A network run of a launcher that makes the run's network namespace: the egress proxy's
  /// listening socket in it, which the run serves; else none (sandbox-init then makes it).
  unique_fd egress_listener;
  /// The output directory on the host, when the launcher made it (the OCI and microvm
  /// launchers: `<ws>/out`); empty when sandbox-init hands over a descriptor of its own.
  std::filesystem::path host_output_dir;
  /// The launcher's entries of sandbox-init's configuration (the run machine writes uid,
  /// sizes, limits and names before them): host or guest paths, `launch=oci`, …
  init_protocol::config_writer config;
  /// A guest agent between the host and sandbox-init (microvm), or nullptr when sandbox-init
  /// is reached directly. The run machine takes it.
  std::unique_ptr<agent_channel> agent;

  /// What the launched process said about a failed setup (an OCI runtime's log, a VMM's), for
  /// the host log only: it may name host paths. Empty when there is nothing.
  virtual std::string diagnostics() const { return {}; }
  /// CPU time (µs) of the run's processes when the run cgroup cannot tell it (they joined
  /// hierarchies it does not read); nullopt when unknown.
  virtual std::optional<std::uint64_t> cpu_usage_usec() const { return std::nullopt; }
  /// Called once, when every process of the run is confirmed dead, before the workspace is
  /// removed (never after a failed teardown: what is left then is the next start's reclaim):
  /// releases what the launch made outside the workspace (host mounts, the OCI runtime's
  /// state). Never blocks on a sandbox-controlled object.
  virtual void release() noexcept {}
};

/// How one level starts sandbox-init. Implementations are thread-safe: runs launch
/// concurrently, from their own strands.
class launcher {
 public:
  virtual ~launcher() = default;

  /// What the launcher is; called once, when the run machine is made.
  virtual launcher_traits traits() const = 0;

  /// The run cgroup's limits, from the request's (`pol`: the run's policy): a launcher whose
  /// runtime puts its own processes into the run's cgroup (gVisor's sentry and gofer, a VMM
  /// and its guest's RAM) adds their overhead here, and must write the same figures into its
  /// runtime's configuration.
  virtual void adjust_limits(const sandbox::policy& pol, cgroup_limits& limits) const {
    (void)pol;
    (void)limits;
  }

  /**
   * Starts sandbox-init for `r`: its control channel is `r.ctl_fd`, the program's
   * stdout/stderr `r.out_fd`/`r.err_fd`, stdin /dev/null, inside `r.cgroup` before it reads
   * its configuration (it waits for it). Returns what it made, or an error with `*why` for
   * the host log; a failed launch leaves nothing behind outside the workspace (the run
   * machine removes the workspace, the cgroup and the uid).
   */
  virtual result<std::unique_ptr<launched>> launch(const launch_request& r, std::string* why) = 0;

  /**
   * At start-up, once: `backend_instance_id` (12 hex; unique per process and start), which
   * the launcher may use in names (container ids); then reclaims what instances of this state
   * directory that are not `alive` (crashed, or shut down with work left) left behind with
   * this launcher. Never throws past a failed reclaim (logged).
   */
  virtual void start(const std::string& backend_instance_id,
                     const std::function<bool(const std::string&)>& alive) {
    (void)backend_instance_id;
    (void)alive;
  }

  /// At shutdown: waits (bounded) for releases still in flight.
  virtual void drain() noexcept {}
};

}  // namespace sandbox::detail
