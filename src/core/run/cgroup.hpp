// Per-run cgroups on cgroup v2, v1 and the v1/v2 "hybrid" layout (private to src/).
//
// Layouts (detected from /proc/self/mountinfo at start-up):
//  - v2: one cgroup2 mount with the memory, pids and cpu controllers. A run gets one
//    directory `<root><parent>/<name>` with memory.max, memory.swap.max=0, memory.oom.group=1,
//    pids.max, cpu.max. Kill with cgroup.kill (5.14+; else freeze + SIGKILL loop); empty when
//    cgroup.events says `populated 0`; OOM kills from memory.events `oom_kill`; peak from
//    memory.peak (5.19+; else sampled memory.current).
//  - hybrid: v1 memory/pids/cpu(+cpuacct) hierarchies for the limits, plus the cgroup2 mount
//    (usually /sys/fs/cgroup/unified, no controllers) which still offers cgroup.kill and
//    cgroup.events: a run gets a directory in each hierarchy; kill and "empty" come from v2.
//  - v1: v1 hierarchies only: kill by freezer (or pids.max=0) + SIGKILL loop; empty when
//    cgroup.procs of every hierarchy is empty. OOM kills from memory.oom_control `oom_kill`,
//    peak from memory.max_usage_in_bytes, CPU from cpuacct.usage.
// Kernel docs: Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/memory.rst.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/error.hpp"
#include "sandbox/span.hpp"

namespace sandbox::detail {

enum class cgroup_mode : std::uint8_t { v2, hybrid, v1 };

/// Limits applied to one run's cgroup.
struct cgroup_limits {
  std::uint64_t memory_bytes = 256ULL << 20;  ///< memory (+tmpfs) limit, > 0; swap is always 0
  std::uint32_t max_pids = 64;                ///< pids.max, > 0
  /// cpu.max / cfs_quota_us over a 100 ms period (1000 = one CPU); 0 = no CPU limit; values
  /// below 10 are raised to 10 (the kernel's minimum quota is 1 ms). Ignored (and logged) on
  /// hosts without a usable cpu controller.
  std::uint32_t cpu_quota_millicores = 1000;
};

/// Figures read from a run's cgroup after (or during) the run.
struct cgroup_stats {
  std::uint64_t oom_kills = 0;          ///< processes killed by this cgroup's OOM killer
  std::uint64_t peak_memory_bytes = 0;  ///< highest memory usage seen
  std::uint64_t cpu_usage_usec = 0;     ///< user + system CPU of every process, µs
  bool peak_is_sampled = false;         ///< the kernel had no peak counter; sampled instead
  /// Times a fork or clone in the cgroup was refused at its pids.max (the "max" line of
  /// pids.events, v1 and v2); 0 where the pids controller's file cannot be read.
  std::uint64_t pids_limit_hits = 0;
};

class cgroup_host;

/// Where a daemon started with a delegated cgroup (systemd `Delegate=yes`) lives and puts its
/// runs: three cgroup2 paths, relative to the cgroup2 mount (e.g. "/system.slice/x.service").
struct delegated_cgroup {
  std::string own;     ///< the cgroup the process was started in (/proc/self/cgroup "0::")
  std::string leaf;    ///< `own`/daemon: the leaf the process moved itself into
  std::string parent;  ///< `own`/runs: the runs' parent (`process_backend_options::cgroup_parent`)
};

/**
 * Takes over the cgroup this process was started in, as a service manager delegates one
 * (systemd `Delegate=yes`; cgroup-v2.rst, "Delegation" and "No Internal Process
 * Constraint"): moves the whole process (every thread: it writes cgroup.procs) into the leaf
 * `<own>/daemon`, then opens `<own>/runs` as a `cgroup_host` would, which enables memory,
 * pids (and cpu when offered) in `<own>/cgroup.subtree_control` — possible only now that
 * `<own>` holds no process of ours. Call it before threads start, before anything else
 * creates cgroups. Pure cgroup v2 only: v1 and hybrid hosts have no single subtree to hand
 * over. "0::/" counts as delegated only at the root of a cgroup namespace (a container's own
 * cgroup: `root`/cgroup.type exists), never in the host's root cgroup.
 *
 * `root` is the cgroup2 mount (normally /sys/fs/cgroup), `mountinfo` and `proc_cgroup`
 * normally /proc/self/mountinfo and /proc/self/cgroup (tests use a fake tree). Errors, each
 * with an actionable one-line reason in `*why` when `why` is not null:
 * `unsupported` (v1 or hybrid layout, no cgroup2 "0::" line, the host's root cgroup, or memory /
 * pids not offered to `<own>`), `permission_denied` (`<own>` not writable by us: not
 * delegated), `invalid_argument` (a malformed /proc/self/cgroup), `io_error`; and those of
 * `cgroup_host::open` (e.g. another process still in `<own>`: `unsupported`, EBUSY).
 */
result<delegated_cgroup> enter_delegated_cgroup(const std::filesystem::path& root,
                                                const std::filesystem::path& mountinfo,
                                                const std::filesystem::path& proc_cgroup,
                                                std::string* why = nullptr, log_sink log = {});

/**
 * One run's cgroup (a directory in each relevant hierarchy). Movable, not copyable. The
 * directories are removed by `remove()` (explicitly: removal can fail and must be reported);
 * the destructor only closes the OOM descriptor.
 *
 * Thread safety: the const members may be called concurrently from any threads (they keep
 * no state but the sampled peak, which is atomic); `remove()` and moves need exclusive use.
 * Every call is a handful of small reads or writes of cgroupfs files and never blocks on the
 * sandboxed processes.
 */
class run_cgroup {
 public:
  run_cgroup(run_cgroup&&) noexcept;
  run_cgroup& operator=(run_cgroup&&) noexcept;
  ~run_cgroup();

  /// Moves process `pid` into this cgroup in every hierarchy (writes cgroup.procs; the
  /// cgroup2 directory first, so `kill_all` and `is_empty` cover the process even when a v1
  /// write then fails). Errors: `invalid_argument` (pid <= 0), `not_found` (no such
  /// process), `permission_denied`, `io_error`.
  result<void> attach(pid_t pid) const;
  /// As `attach`, but leaves out the cgroup2 directory: for a process created there by
  /// `clone3(CLONE_INTO_CGROUP)` (`open_unified_dir`). Same errors.
  result<void> attach_except_unified(pid_t pid) const;
  /// A descriptor open on the cgroup2 directory (O_RDONLY | O_DIRECTORY | O_CLOEXEC), for
  /// `spawn_request::into_cgroup_fd`; -1 when there is none (v1) or it cannot be opened.
  /// The caller closes it.
  int open_unified_dir() const noexcept;
  /// Kills every process in the cgroup now (cgroup.kill, or freeze/pids.max=0 + SIGKILL
  /// loop until a pass finds no process it has not signalled yet). Does not wait for the
  /// processes to be gone; see `is_empty`. Never signals pid <= 1 or the calling process.
  /// Errors: `io_error`/`permission_denied` when neither mechanism could be used.
  result<void> kill_all() const;
  /// True when no process is left (cgroup.events `populated 0` and every v1 cgroup.procs
  /// empty; a directory that no longer exists counts as empty). Errors: `io_error`.
  result<bool> is_empty() const;
  /// Current figures. Safe to call any time; cheap (a few small reads). Errors: `io_error`
  /// (a counter file could not be read, e.g. after `remove()`).
  result<cgroup_stats> stats() const;
  /// Samples memory usage for hosts without a peak counter (call periodically); a no-op
  /// where the kernel keeps a peak (memory.peak, v1 max_usage_in_bytes).
  void sample_memory() const;
  /// Starts a new peak window: from now on the peak figure of `stats()` is the highest
  /// usage since this call (v1: `memory.max_usage_in_bytes` written 0; v2 without
  /// memory.peak: the sample restarts at memory.current). Returns false where the kernel's
  /// peak cannot be reset (v2 memory.peak): the peak then stays the cgroup's whole life's.
  /// Read `stats()` first to keep the peak so far.
  bool reset_memory_peak() const;
  /**
   * A descriptor that becomes readable when the cgroup's OOM counter may have changed:
   * v1 an eventfd registered through cgroup.event_control on memory.oom_control; v2 an
   * inotify descriptor watching memory.events. Owned by this object; -1 if unavailable.
   * After it fires, drain it with `drain_oom_event_fd()` and read `stats().oom_kills`.
   */
  int oom_event_fd() const noexcept;
  void drain_oom_event_fd() const noexcept;
  /// rmdir in every hierarchy (the cgroup must be empty). Idempotent: directories already
  /// gone count as removed, and a retry after `busy` continues where it stopped. Errors:
  /// `busy` (processes or child cgroups left: EBUSY), `permission_denied`, `io_error`.
  result<void> remove();
  /// The directories, for logs and tests.
  const std::vector<std::filesystem::path>& dirs() const noexcept;
  /// The cgroup2 directory of this run (for clone3's CLONE_INTO_CGROUP), if any: the only
  /// directory on v2, the unified one on hybrid, none on v1.
  std::optional<std::filesystem::path> unified_dir() const;
  /// The directory whose `cgroup.procs` lists the run's processes whoever placed them there:
  /// a v1 hierarchy's where there is one (on a hybrid host an OCI runtime, which sees a pure
  /// v1 host, joins only those: oci_backend.cpp), else the cgroup2 one; empty when none.
  std::filesystem::path procs_dir() const;

 private:
  friend class cgroup_host;
  run_cgroup() = default;
  result<void> attach_parts(pid_t pid, bool unified) const;
  struct state;
  std::unique_ptr<state> s_;
};

/// The cgroup filesystems of this host, and the parent cgroup the library owns. Copyable;
/// its const members are thread-safe. All filesystem access goes through `detail::sys`.
class cgroup_host {
 public:
  /**
   * Detects the layout from `mountinfo` (normally /proc/self/mountinfo) restricted to mounts
   * under `root` (normally /sys/fs/cgroup; tests use a fake tree), and sets up the parent
   * cgroup `parent` (an absolute path inside each hierarchy, e.g. "/agent-sandbox"; not "/")
   * in each hierarchy: creates it (and missing ancestors) if missing and, on v2, enables
   * the controllers it takes from cgroup2 (+memory +pids, +cpu when available) in the
   * `cgroup.subtree_control` of every level from the mount down to `parent` where they are
   * not enabled yet (so nothing is written above a delegation point that already enables
   * them). memory and pids are required, cpu optional (logged when absent).
   * Errors (with a one-line reason in `*why` when `why` is not null, naming the missing
   * controller, file or errno): `invalid_argument` (bad `parent`), `unsupported` (no usable
   * memory or pids controller, or v2's "no internal processes" rule forbids enabling them),
   * `permission_denied` (parent not writable: not delegated), `io_error`.
   * `log` receives host log lines (syscall, path, errno); it may be empty.
   */
  static result<cgroup_host> open(const std::filesystem::path& root,
                                  const std::filesystem::path& mountinfo, std::string parent,
                                  std::string* why = nullptr, log_sink log = {});

  cgroup_mode mode() const noexcept { return mode_; }
  /// One line for logs and self-test reports, e.g. "hybrid: v1 memory,pids,cpu + v2 kill".
  std::string describe() const;
  /// Creates the run cgroup `<parent>/<name>` in every hierarchy and applies `limits`.
  /// `name`: 1..128 of [A-Za-z0-9_.-], not starting with '.'. On failure nothing is left
  /// behind. Errors: `invalid_argument` (bad name or zero limit), `already_exists`,
  /// `io_error`, `permission_denied`.
  result<run_cgroup> create(std::string_view name, const cgroup_limits& limits) const;

  /**
   * The start-up self-test's proof that limits take effect on this host: creates the run
   * cgroup `<parent>/<name>` with a 64 MiB memory limit, a pids limit of 16 and a CPU quota,
   * reads each limit file back (memory.max / memory.limit_in_bytes, pids.max, cpu.max /
   * cpu.cfs_quota_us), and removes the cgroup again. Errors (with a one-line, actionable
   * reason in `*why` when `why` is not null): as `create`, and `unsupported` when a value
   * read back is not the one written (the controller accepts writes but does not enforce
   * them: e.g. a cgroupfs emulation, or the controller not enabled for this subtree).
   */
  result<void> verify_limits(std::string_view name, std::string* why = nullptr) const;

  /// Names of existing run cgroups under the parent (the union over every hierarchy, so a
  /// cgroup half-created by a crash is listed too), sorted; at most 100000.
  std::vector<std::string> list() const;

  /// Kills everything in the existing run cgroup `name`, waits up to ~2 s for it to empty,
  /// and removes it: used to reclaim what a crashed host left behind. Works on a cgroup
  /// missing in some hierarchies; one missing everywhere is success. Errors:
  /// `invalid_argument` (bad name), `busy` (still populated after the wait), as `remove()`.
  result<void> destroy(std::string_view name) const;

 private:
  struct hierarchy {
    std::filesystem::path parent_dir;      ///< <mount><parent>
    std::vector<std::string> controllers;  ///< the controllers runs use from it
    bool is_v2 = false;
  };
  run_cgroup make_run(std::string_view name) const;

  cgroup_mode mode_ = cgroup_mode::v2;
  std::vector<hierarchy> hierarchies_;
  bool has_cgroup_kill_ = false;
  bool has_memory_peak_ = false;
  log_sink log_;
};

}  // namespace sandbox::detail
