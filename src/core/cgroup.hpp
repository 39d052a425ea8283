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

namespace sandbox::detail {

enum class cgroup_mode : std::uint8_t { v2, hybrid, v1 };

/// Limits applied to one run's cgroup.
struct cgroup_limits {
  std::uint64_t memory_bytes = 256ULL << 20;  ///< memory (+tmpfs) limit; swap is always 0
  std::uint32_t max_pids = 64;                ///< pids.max
  std::uint32_t cpu_quota_millicores = 1000;  ///< cpu.max / cfs_quota over a 100 ms period
};

/// Figures read from a run's cgroup after (or during) the run.
struct cgroup_stats {
  std::uint64_t oom_kills = 0;          ///< processes killed by this cgroup's OOM killer
  std::uint64_t peak_memory_bytes = 0;  ///< highest memory usage seen
  std::uint64_t cpu_usage_usec = 0;     ///< user + system CPU of every process, µs
  bool peak_is_sampled = false;         ///< the kernel had no peak counter; sampled instead
};

class cgroup_host;

/// One run's cgroup (a directory in each relevant hierarchy). Movable, not copyable. The
/// directories are removed by `remove()` (explicitly: removal can fail and must be reported).
class run_cgroup {
 public:
  run_cgroup(run_cgroup&&) noexcept;
  run_cgroup& operator=(run_cgroup&&) noexcept;
  ~run_cgroup();

  /// Moves process `pid` into this cgroup in every hierarchy (writes cgroup.procs).
  result<void> attach(pid_t pid) const;
  /// Kills every process in the cgroup now (cgroup.kill, or freeze/pids.max=0 + SIGKILL
  /// loop). Does not wait; see `is_empty`.
  result<void> kill_all() const;
  /// True when no process is left (cgroup.events `populated 0`, or every cgroup.procs empty).
  result<bool> is_empty() const;
  /// Current figures. Safe to call any time; cheap (a few small reads).
  result<cgroup_stats> stats() const;
  /// Samples memory usage for hosts without a peak counter (call periodically).
  void sample_memory() const;
  /**
   * A descriptor that becomes readable when the cgroup's OOM counter may have changed:
   * v1 an eventfd registered through cgroup.event_control on memory.oom_control; v2 an
   * inotify descriptor watching memory.events. Owned by this object; -1 if unavailable.
   * After it fires, drain it with `drain_oom_event_fd()` and read `stats().oom_kills`.
   */
  int oom_event_fd() const noexcept;
  void drain_oom_event_fd() const noexcept;
  /// rmdir in every hierarchy (the cgroup must be empty). Idempotent.
  result<void> remove();
  /// The directories, for logs and tests.
  const std::vector<std::filesystem::path>& dirs() const noexcept;

 private:
  friend class cgroup_host;
  run_cgroup() = default;
  struct state;
  std::unique_ptr<state> s_;
};

/// The cgroup filesystems of this host, and the parent cgroup the library owns.
class cgroup_host {
 public:
  /**
   * Detects the layout from `mountinfo` (normally /proc/self/mountinfo) restricted to mounts
   * under `root` (normally /sys/fs/cgroup; tests use a fake tree), and sets up the parent
   * cgroup `parent` (e.g. "/agent-sandbox") in each hierarchy: creates it if missing and, on
   * v2, enables +memory +pids +cpu in its `cgroup.subtree_control` (and its ancestors' below
   * the delegation point). Errors: `unsupported` (no usable memory or pids controller —
   * message in `describe_error`), `permission_denied` (parent not writable: not delegated),
   * `io_error`.
   */
  static result<cgroup_host> open(const std::filesystem::path& root,
                                  const std::filesystem::path& mountinfo,
                                  std::string parent);

  cgroup_mode mode() const noexcept { return mode_; }
  /// One line for logs and self-test reports, e.g. "hybrid: v1 memory,pids,cpu + v2 kill".
  std::string describe() const;
  /// Creates the run cgroup `<parent>/<name>` in every hierarchy and applies `limits`.
  /// Errors: `already_exists`, `io_error`, `permission_denied`.
  result<run_cgroup> create(std::string_view name, const cgroup_limits& limits) const;

  /// Names of existing run cgroups under the parent (from the first hierarchy).
  std::vector<std::string> list() const;

  /// Kills everything in the existing run cgroup `name`, waits up to ~2 s for it to empty,
  /// and removes it: used to reclaim what a crashed host left behind.
  result<void> destroy(std::string_view name) const;

 private:
  struct hierarchy {
    std::filesystem::path parent_dir;  ///< <mount>/<parent>
    std::vector<std::string> controllers;
    bool is_v2 = false;
  };
  cgroup_mode mode_ = cgroup_mode::v2;
  std::vector<hierarchy> hierarchies_;
  bool has_cgroup_kill_ = false;
  bool has_memory_peak_ = false;
};

}  // namespace sandbox::detail
