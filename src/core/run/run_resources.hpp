// What one run holds on the host, and the kill of its processes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/run/cgroup.hpp"
#include "core/run/launcher.hpp"
#include "core/run/uid_pool.hpp"
#include "core/run/workspace.hpp"
#include "sandbox/span.hpp"

namespace sandbox::detail {

/**
 * A run's host resources — the shared lock on its image, its uid, its cgroup, its
 * workspace, what its launch made (`launched`, with the launched process's pidfd) — and
 * their end: the kill, the confirmation that every process is dead (polled with back-off
 * within the teardown budget), the reaping of the launched process, and the removal
 * (once, with retries while the kernel still reports the empty cgroup busy, then left for
 * the next start's orphan reclaim).
 *
 * Thread-safety: `kill_now` and `is_dead` may be called from any thread (runtime shutdown):
 * they, and everything that changes the cgroup or the pidfd, hold the kill mutex, so a kill
 * never races the run tearing down. Everything else runs on the run's strand, or from the
 * run's destructor (`emergency_cleanup`, when the io_context went away with the run in
 * flight). Lifetime: the pending poll holds the owner given to `confirm_dead`.
 */
class run_resources {
 public:
  /// What the backend shares with its runs.
  struct host {
    uid_pool* uids = nullptr;             ///< root hosts: the uid range; else nullptr
    bool kill_launched_process = true;    ///< launcher_traits::kill_launched_process
    std::atomic<bool>* left_for_reclaim;  ///< set when a cgroup or work dir outlives its run
    std::function<void(log_level, const std::string&)> log;  ///< the run's host log
  };

  run_resources(boost::asio::strand<boost::asio::any_io_executor> strand, host h);

  // --- acquiring (prepare, on the strand) ---------------------------------------------------

  /// Takes a shared flock on the image's unpacked root while the run uses it (the image
  /// store's remove() takes it exclusively, `busy` otherwise). False when it is missing or
  /// being removed.
  bool lock_image(const std::filesystem::path& rootfs);
  /// Root hosts: a uid of the run's own; unprivileged hosts: the single mapped id of a user
  /// namespace (per-uid counters are per user namespace there). False when the range is full.
  bool acquire_uid();
  /// The run's uid (and gid).
  std::uint32_t uid() const noexcept { return uid_; }
  /// The run's cgroup, created with its limits before any process exists.
  void adopt_cgroup(run_cgroup cg);
  /// The run's cgroup; nullptr before `adopt_cgroup` and after removal.
  run_cgroup* cgroup() noexcept { return cgroup_ ? &*cgroup_ : nullptr; }
  /// The run's workspace (removed with the rest).
  void adopt_workspace(run_workspace ws);
  bool has_workspace() const noexcept { return have_ws_; }
  const run_workspace& workspace() const noexcept { return ws_; }
  /// What the launch made; takes its pidfd (the kill and the reaping go through it) and
  /// keeps a duplicate of it for `watch_exit`.
  void adopt_launched(std::unique_ptr<launched> l);
  /// Watches the launched process's exit: once it exited, polls at once if `confirm_dead`
  /// is waiting (sandbox-init, PID 1 of the run, exits last), then calls `on_exit` on the
  /// strand (once). The wait holds `owner`. A bare wake-up of the wait is no exit
  /// (sys/confirmed_wait.hpp). The watch ends with `reap_or_abandon`.
  void watch_exit(std::shared_ptr<void> owner, std::function<void()> on_exit);
  /// What the launch made, or nullptr.
  launched* launched_run() noexcept { return launched_.get(); }
  const launched* launched_run() const noexcept { return launched_.get(); }
  /// What the launch left to explain a setup failure (`launched::diagnostics`, e.g. an OCI
  /// runtime's log) — only once there is a workspace; empty when there is nothing.
  std::string diagnostics() const {
    return have_ws_ && launched_ ? launched_->diagnostics() : std::string();
  }

  // --- the end ----------------------------------------------------------------------------

  /// Kills every process of the run right now (any thread). An OCI runtime is left to exit by
  /// itself once its container is gone (killed in the middle it leaves its state and cgroups
  /// behind); `confirm_dead` kills it only if it lingers.
  void kill_now() noexcept;
  /// True once every process is confirmed dead, or the run never started one (any thread).
  bool is_dead() noexcept;
  /// Kills and confirms every process dead, polling with back-off (1 → 50 ms) until
  /// `deadline`; a launched process that outlives the run's processes by 2 s after `ended`
  /// is killed. `done` runs once, on the strand: every process is dead and the launched
  /// process reaped, or the deadline passed (`failed()` is then true: what is left is the
  /// next start's reclaim). Calling it again (the launched process exited) polls at once.
  void confirm_dead(std::chrono::steady_clock::time_point ended,
                    std::chrono::steady_clock::time_point deadline, std::weak_ptr<void> owner,
                    std::function<void()> done);
  /// Polls now if `confirm_dead` is waiting (the launched process just exited).
  void poll_now() {
    if (confirming_) poll();
  }
  /// Teardown, after `confirm_dead`: ends the exit watch, and reaps the launched process,
  /// or — the budget ran out — kills it and reaps it whenever it ends (never left a zombie).
  void reap_or_abandon() noexcept;
  /// True when processes of the run survived the teardown budget.
  bool failed() const noexcept { return failed_; }

  /// Removes the workspace and the uid reservation, releases the launch (`launched::release`)
  /// and removes the cgroup once it is confirmed empty (a live process must not lose its
  /// limits); after a failed teardown only the workspace goes. False while the kernel still
  /// reports the empty cgroup busy (v1, for a moment after its last task): call again later.
  bool destroy_once() noexcept;
  /// Synchronous removal with retries (pool instances, emergency cleanup).
  void destroy() noexcept;
  /// Removal of a cgroup still busy when the result went out: retried on a timer (every
  /// process is dead already) rather than by blocking an executor thread.
  void destroy_after_result(std::weak_ptr<void> owner, int attempt = 1);
  /// The io_context went away with the run in flight (the run's destructor): kills, waits
  /// (≤ 2 s) and cleans up synchronously.
  void emergency_cleanup() noexcept;

 private:
  bool reap_locked() noexcept;
  void poll();
  void finish_confirming();
  void give_up_cgroup() noexcept;

  host host_;
  boost::asio::steady_timer timer_;  ///< confirm_dead's polls, then destroy_after_result
  boost::asio::posix::stream_descriptor exit_watch_;  ///< a duplicate of the pidfd (watch_exit)
  std::mutex kill_mu_;  ///< guards cgroup_ and pidfd_ (see the class comment)
  std::optional<run_cgroup> cgroup_;
  int pidfd_ = -1;
  int image_lock_fd_ = -1;
  std::uint32_t uid_ = 0;
  bool have_uid_ = false;
  run_workspace ws_;
  bool have_ws_ = false;
  std::unique_ptr<launched> launched_;
  bool released_ = false;  ///< launched::release() ran
  bool failed_ = false;    ///< processes survived the teardown budget
  // confirm_dead's state
  bool confirming_ = false, launched_killed_ = false;
  std::chrono::steady_clock::time_point ended_, deadline_;
  std::chrono::milliseconds delay_{1};
  std::weak_ptr<void> owner_;
  std::function<void()> done_;
};

}  // namespace sandbox::detail
