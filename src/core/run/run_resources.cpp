#include "core/run/run_resources.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "sys/confirmed_wait.hpp"
#include "sys/pidfd.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
using clock = std::chrono::steady_clock;

namespace {

/// A launched process that outlives the run's processes by this much is killed.
constexpr auto launched_exit_grace = std::chrono::seconds(2);
constexpr int destroy_retries = 50;
constexpr auto destroy_retry_delay = std::chrono::milliseconds(2);

/// Reaps the child behind `pidfd` and closes it: now if it has exited, else on a detached
/// thread that waits for it (a launched process that outlived its run's teardown, already
/// sent SIGKILL, must still never stay a zombie of the host process).
void reap_eventually(int pidfd) noexcept {
  siginfo_t si{};
  const int r = waitid_pidfd(pidfd, &si, WEXITED | WNOHANG);
  if ((r == 0 && si.si_pid != 0) || (r < 0 && errno == ECHILD)) {  // reaped (ECHILD: not ours)
    ::close(pidfd);
    return;
  }
  try {
    std::thread([pidfd] {
      siginfo_t info{};
      while (waitid_pidfd(pidfd, &info, WEXITED) < 0 && errno == EINTR) {
      }
      ::close(pidfd);
    }).detach();
  } catch (...) {
    ::close(pidfd);  // no thread: the zombie stays until the host process exits
  }
}

}  // namespace

run_resources::run_resources(asio::strand<asio::any_io_executor> strand, host h)
    : host_(std::move(h)), timer_(strand), exit_watch_(std::move(strand)) {}

bool run_resources::lock_image(const std::filesystem::path& rootfs) {
  image_lock_fd_ = ::open(rootfs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return image_lock_fd_ >= 0 && ::flock(image_lock_fd_, LOCK_SH | LOCK_NB) == 0;
}

bool run_resources::acquire_uid() {
  if (!host_.uids) {
    uid_ = userns_inside_id;
    return true;
  }
  auto uid = host_.uids->acquire();
  if (!uid) return false;
  uid_ = *uid;
  have_uid_ = true;
  return true;
}

void run_resources::adopt_cgroup(run_cgroup cg) {
  std::lock_guard lock(kill_mu_);
  cgroup_.emplace(std::move(cg));
}

void run_resources::adopt_workspace(run_workspace ws) {
  ws_ = std::move(ws);
  have_ws_ = true;
}

void run_resources::adopt_launched(std::unique_ptr<launched> l) {
  launched_ = std::move(l);
  std::lock_guard lock(kill_mu_);
  pidfd_ = launched_->pidfd.release();
  exit_watch_.assign(::dup(pidfd_));
}

void run_resources::watch_exit(std::shared_ptr<void> owner, std::function<void()> on_exit) {
  // A pidfd polls readable once its process has exited; a bare wake-up of the wait (Asio
  // applies a closed descriptor's events to the one that recycles its state:
  // sys/confirmed_wait.hpp) is no exit, and must not end a live run as "supervisor lost".
  async_wait_confirmed(
      exit_watch_, asio::posix::descriptor_base::wait_read, pidfd_exited,
      [this, owner = std::move(owner), on_exit = std::move(on_exit)](boost::system::error_code ec) {
        if (ec) return;
        poll_now();  // killing: this is the moment to confirm
        on_exit();
      });
}

void run_resources::kill_now() noexcept {
  std::lock_guard lock(kill_mu_);
  if (pidfd_ >= 0 && host_.kill_launched_process) pidfd_send_signal(pidfd_, SIGKILL);
  if (cgroup_) (void)cgroup_->kill_all();
}

bool run_resources::is_dead() noexcept {
  std::lock_guard lock(kill_mu_);
  if (!cgroup_) return true;
  auto e = cgroup_->is_empty();
  return e && *e;
}

// Reaps the launched process if it has exited. True once it is reaped (or someone else's
// waitpid(-1) took it: ECHILD). A dead but unreaped helper still pins its cgroup on v1.
bool run_resources::reap_locked() noexcept {
  if (pidfd_ < 0) return true;
  siginfo_t si{};
  int r = waitid_pidfd(pidfd_, &si, WEXITED | WNOHANG);
  if ((r < 0 && errno == ECHILD) || (r == 0 && si.si_pid != 0)) {
    ::close(pidfd_);
    pidfd_ = -1;
    return true;
  }
  return false;
}

void run_resources::confirm_dead(clock::time_point ended, clock::time_point deadline,
                                 std::weak_ptr<void> owner, std::function<void()> done) {
  ended_ = ended;
  deadline_ = deadline;
  owner_ = std::move(owner);
  done_ = std::move(done);
  delay_ = std::chrono::milliseconds(1);
  confirming_ = true;
  kill_now();
  poll();
}

void run_resources::poll() {
  if (!confirming_) return;
  bool empty = true, reaped = false;
  {
    std::lock_guard lock(kill_mu_);
    if (cgroup_) {
      auto e = cgroup_->is_empty();
      empty = e && *e;
    }
    if (empty) reaped = reap_locked();
  }
  if (empty && reaped) return finish_confirming();
  if (empty && !launched_killed_ && clock::now() - ended_ > launched_exit_grace) {
    // The run's processes are gone but the process we launched (an OCI runtime) is not.
    std::lock_guard lock(kill_mu_);
    if (pidfd_ >= 0) pidfd_send_signal(pidfd_, SIGKILL);
    launched_killed_ = true;
    host_.log(log_level::warning, "the launched process outlived the run's processes; killed");
  }
  if (clock::now() >= deadline_) {
    failed_ = true;
    *host_.left_for_reclaim = true;
    host_.log(log_level::error, "processes of the run survived the kill past the teardown budget");
    return finish_confirming();
  }
  kill_now();  // v1 without cgroup.kill: keep killing what appears
  timer_.expires_after(delay_);
  delay_ = std::min(delay_ * 2, std::chrono::milliseconds(50));
  timer_.async_wait([this, keep = owner_.lock()](boost::system::error_code ec) {
    if (!ec) poll();  // aborted: a later poll re-armed it (or it is done)
  });
}

void run_resources::finish_confirming() {
  confirming_ = false;
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

void run_resources::reap_or_abandon() noexcept {
  boost::system::error_code ignored;
  exit_watch_.close(ignored);
  std::lock_guard lock(kill_mu_);
  if (reap_locked()) return;
  if (pidfd_ >= 0) {
    pidfd_send_signal(pidfd_, SIGKILL);
    reap_eventually(pidfd_);
    pidfd_ = -1;
  }
}

bool run_resources::destroy_once() noexcept {
  std::lock_guard lock(kill_mu_);
  if (image_lock_fd_ >= 0) ::close(image_lock_fd_);  // every process is dead: the image may go
  image_lock_fd_ = -1;
  if (launched_ && !released_ && !failed_) {
    released_ = true;
    launched_->release();
  }
  if (have_ws_) {
    remove_tree(ws_.dir);
    have_ws_ = false;
  }
  if (have_uid_ && !failed_) {
    host_.uids->release(uid_);
    have_uid_ = false;
  }
  if (cgroup_ && !failed_) {
    auto rm = cgroup_->remove();
    if (!rm && rm.error() == make_error_code(errc::busy)) return false;
    if (!rm)
      host_.log(log_level::warning, "removing the run cgroup failed: " + rm.error().message());
    cgroup_.reset();
  }
  return true;
}

// A cgroup still busy after the retries is left to the next start's orphan reclaim.
void run_resources::give_up_cgroup() noexcept {
  std::lock_guard lock(kill_mu_);
  if (!cgroup_) return;
  host_.log(log_level::warning, "removing the run cgroup failed: still busy; left for reclaim");
  *host_.left_for_reclaim = true;
  cgroup_.reset();
}

void run_resources::destroy() noexcept {
  for (int i = 0; !destroy_once(); ++i) {
    if (i >= destroy_retries) return give_up_cgroup();
    std::this_thread::sleep_for(destroy_retry_delay);
  }
}

void run_resources::destroy_after_result(std::weak_ptr<void> owner, int attempt) {
  if (destroy_once()) return;
  if (attempt >= destroy_retries) return give_up_cgroup();
  timer_.expires_after(destroy_retry_delay);
  timer_.async_wait([this, keep = owner.lock(), owner, attempt](boost::system::error_code) {
    destroy_after_result(owner, attempt + 1);
  });
}

void run_resources::emergency_cleanup() noexcept {
  if (!cgroup_ && !have_ws_ && pidfd_ < 0) return;
  kill_now();
  if (pidfd_ >= 0) pidfd_send_signal(pidfd_, SIGKILL);
  auto until = clock::now() + std::chrono::seconds(2);
  while (!is_dead() && clock::now() < until) ::usleep(2000);
  if (pidfd_ >= 0) {
    reap_eventually(pidfd_);
    pidfd_ = -1;
  }
  if (!is_dead()) {
    failed_ = true;
    *host_.left_for_reclaim = true;
  }
  destroy();
}

}  // namespace sandbox::detail
