// The run machine of every backend built on sandbox-init (init_backend.hpp): the process
// backend and the OCI backends. Only the launch differs (an `init_launcher`).
//
// One `init_run` per request drives the life of a run (DESIGN.md) on a strand:
//   prepare   uid (root hosts), run cgroup with limits, workspace (inputs, source)
//   launch    the launcher starts sandbox-init in the run's namespaces and cgroup (the
//             process backend spawns it itself; the OCI backends run crun, runc or runsc
//             with a generated bundle); then the configuration is sent
//   watch     stdout/stderr into capped captures; seccomp notifications (violations, egress);
//             DNS sink; OOM events; the deadline timer (from `started`, user code only)
//   end       main exited and pipes closed, or exit grace elapsed, or deadline, OOM,
//             violation, cancellation → kill everything, confirm the cgroup empty
//   collect   outputs from the output tmpfs via the descriptor sandbox-init handed over
//   classify  timeout → oom → seccomp_violation → network_disabled → ok, from our evidence
//   destroy   cgroup, workspace, uid; then complete the handler
#include "core/init_backend.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD static_cast<idtype_t>(3)  // <linux/wait.h>; older glibc lacks it
#endif

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <thread>
#include <boost/asio/strand.hpp>
#include <pthread.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <span>

#include <fmt/format.h>

#include "core/capture.hpp"
#include "core/guest_streams.hpp"
#include "core/cgroup.hpp"
#include "core/collector.hpp"
#include "core/confirmed_wait.hpp"
#include "core/dns_sink.hpp"
#include "core/egress_proxy.hpp"
#include "core/guest_protocol.hpp"
#include "core/init_protocol.hpp"
#include "core/seccomp_notify.hpp"
#include "core/spawn.hpp"
#include "core/text_util.hpp"
#include "sandbox/egress.hpp"
#include "core/uid_pool.hpp"
#include "core/workspace.hpp"

#ifdef SANDBOX_HAS_INIT_IMAGE
extern "C" {
extern const char sandbox_init_image_begin[];
extern const char sandbox_init_image_end[];
}
#endif

namespace sandbox::detail {
namespace {

namespace asio = boost::asio;
namespace ip = init_protocol;
using clock = std::chrono::steady_clock;
using handler_type =
    asio::any_completion_handler<void(boost::system::error_code, run_result)>;

constexpr std::size_t max_egress_records = 64;

// Unpredictable names (the inputs' directory): getrandom only, never a fallback.
std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(hex[c >> 4]);
    out.push_back(hex[c & 15]);
  }
  return out;
}

}  // namespace

bool write_existing_file(const std::string& path, std::string_view content) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  ::close(fd);
  return ok;
}

namespace {

void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::int64_t ms_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// What each sandbox-init step needs from the host, for self-test reasons and host logs.
const char* describe_step(ip::step s) {
  switch (s) {
    case ip::step::config: return "reading the configuration";
    case ip::step::cgroup_namespace: return "a cgroup namespace";
    case ip::step::mount_private: return "a private mount namespace";
    case ip::step::root_tmpfs: return "mounting tmpfs";
    case ip::step::rootfs_bind: return "read-only bind mounts of the image";
    case ip::step::proc: return "mounting a fresh /proc in the new pid namespace";
    case ip::step::dev: return "a minimal /dev (bind mounts of host device nodes)";
    case ip::step::tmpfs: return "size-capped tmpfs for /tmp and $HOME";
    case ip::step::inputs: return "a read-only bind of the inputs";
    case ip::step::outputs: return "the output tmpfs";
    case ip::step::source: return "a read-only bind of the source";
    case ip::step::etc_files: return "replacing /etc/resolv.conf, hosts, hostname";
    case ip::step::hostname: return "a UTS namespace";
    case ip::step::loopback: return "bringing up loopback in the new network namespace";
    case ip::step::dns_socket: return "binding the DNS sink on the run's loopback";
    case ip::step::pivot_root: return "pivot_root into the new root";
    case ip::step::remount_readonly: return "remounting the new root read-only";
    case ip::step::fork: return "starting the program's process";
    case ip::step::rlimits: return "resource limits";
    case ip::step::drop_privileges: return "dropping uid, gid and capabilities";
    case ip::step::no_new_privs: return "no_new_privs";
    case ip::step::seccomp: return "loading the seccomp filter with user notification";
    case ip::step::exec: return "executing the interpreter";
    case ip::step::drop_init_privileges: return "dropping sandbox-init's own capabilities";
    case ip::step::egress_proxy: return "the egress proxy's listener on the run's loopback";
  }
  return "an unknown step";
}

/// Everything the backend shares with its runs.
struct backend_shared {
  init_backend_context ctx;
  std::shared_ptr<init_launcher> launcher;
  std::optional<cgroup_host> cgroups;
  std::string cgroup_parent;       // e.g. "/agent-sandbox"
  std::unique_ptr<uid_pool> uids;  // root hosts only
  bool userns = false;
  std::string instance_id;
  std::filesystem::path runs_dir;
  int instance_lock_fd = -1;
  std::filesystem::path instance_lock_path;
  std::atomic<bool> shutting_down{false};
  std::atomic<bool> left_for_reclaim{false};  ///< a cgroup or work dir outlived its run
  /// Network runs' name resolution: the pinned names, then the host's resolver.
  std::shared_ptr<egress_resolver> resolver;
  ~backend_shared() {
    // A clean shutdown leaves nothing behind: the (empty) runs dir and the instance lock go.
    // Anything a failed teardown left stays, with the lock file, for the next start's reclaim.
    // What was left for reclaim is found through the lock file: it stays then.
    if (left_for_reclaim.load()) {
      // keep the lock file
    } else if (!runs_dir.empty() && ::rmdir(runs_dir.c_str()) == 0 && !instance_lock_path.empty()) {
      ::unlink(instance_lock_path.c_str());
    } else if (!runs_dir.empty() && errno == ENOENT && !instance_lock_path.empty()) {
      ::unlink(instance_lock_path.c_str());
    }
    close_fd(instance_lock_fd);
  }
};

/// Reaps the child behind `pidfd` and closes it: now if it has exited, else on a detached
/// thread that waits for it (a launched process that outlived its run's teardown, already
/// sent SIGKILL, must still never stay a zombie of the host process).
void reap_eventually(int pidfd) noexcept {
  siginfo_t si{};
  const int r = ::waitid(P_PIDFD, static_cast<id_t>(pidfd), &si, WEXITED | WNOHANG);
  if ((r == 0 && si.si_pid != 0) || (r < 0 && errno == ECHILD)) {  // reaped (ECHILD: not ours)
    ::close(pidfd);
    return;
  }
  try {
    std::thread([pidfd] {
      siginfo_t info{};
      while (::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED) < 0 && errno == EINTR) {
      }
      ::close(pidfd);
    }).detach();
  } catch (...) {
    ::close(pidfd);  // no thread: the zombie stays until the host process exits
  }
}

/// Host-only details of a run, kept beside the result (the result's message is sanitized).
struct run_detail {
  std::string text;
};

/// What a session's public object keeps of its run once the run is gone: the closing result
/// and the last figures (the run itself lives only as long as its own pending operations).
struct session_shared {
  std::mutex mu;
  std::optional<session_result> result;
  session_stats last;
};

/// One run. Lives on its strand; kept alive by its own pending operations.
class init_run : public std::enable_shared_from_this<init_run> {
 public:
  using done_fn = std::function<void(run_result, run_detail)>;

  init_run(std::shared_ptr<backend_shared> shared, asio::any_io_executor ex, run_job job,
              bool selftest)
      : shared_(std::move(shared)),
        strand_(asio::make_strand(ex)),
        job_(std::move(job)),
        selftest_(selftest),
        out_(job_.policy.stream_capture_bytes, job_.policy.summary_bytes),
        err_(job_.policy.stream_capture_bytes, job_.policy.summary_bytes),
        ctl_(strand_),
        stdout_(strand_),
        stderr_(strand_),
        pidfd_desc_(strand_),
        listener_(strand_),
        dns_(strand_),
        oom_(strand_),
        setup_timer_(strand_),
        deadline_(strand_),
        grace_(strand_),
        teardown_timer_(strand_),
        sample_timer_(strand_),
        agent_timer_(strand_),
        stream_timer_(strand_),
        stdout_park_(strand_),
        stderr_park_(strand_),
        stdin_(strand_),
        idle_timer_(strand_),
        close_timer_(strand_) {}

  ~init_run() {
    close_fd(stdin_child_fd_);
    if (proxy_) proxy_->stop();  // (normally stopped at teardown already; idempotent)
    close_fd(stdout_parked_);
    close_fd(stderr_parked_);
    emergency_cleanup();
  }

  /// A cold run: prepare and activate back to back (the program's "go" is queued right
  /// behind the configuration, so sandbox-init goes straight through).
  void start(done_fn done) {
    asio::dispatch(strand_, [self = shared_from_this(), done = std::move(done)]() mutable {
      self->prepare();
      self->activate_on_strand(self->job_, std::move(done));
    });
  }

  /// A warm-pool instance: everything up to "ready" (namespaces, cgroup, filesystem) is
  /// prepared now from the template job; `on_prepared(true)` once sandbox-init is ready and
  /// waiting for its program, `(false)` if preparing failed (the instance is then destroyed).
  /// `on_lost` is called if an idle ready instance dies before it is handed out.
  /// Always posted, never run inline: the pool calls this holding its lock, and a preparation
  /// that fails at once calls `on_prepared(false)`, which takes that lock.
  void prepare_pooled(std::function<void(bool)> on_prepared, std::function<void()> on_lost) {
    asio::post(strand_, [self = shared_from_this(), on_prepared = std::move(on_prepared),
                             on_lost = std::move(on_lost)]() mutable {
      self->on_prepared_ = std::move(on_prepared);
      self->on_lost_ = std::move(on_lost);
      self->prepare();
    });
  }

  /// Hands a prepared instance its run (same limits class as the template): stages inputs and
  /// source into the already-bound workspace, then sends the program. From here on the run is
  /// exactly a cold run.
  /// `on_started` (optional) is called once, on the strand, when the program has started or
  /// when the run ends without starting — the pool refills then, so that preparing the next
  /// instance does not compete with this run's hand-out for the executor and the cores.
  void activate(run_job job, done_fn done, std::function<void()> on_started = {}) {
    asio::dispatch(strand_, [self = shared_from_this(), job = std::move(job), done = std::move(done),
                             on_started = std::move(on_started)]() mutable {
      self->t0_ = clock::now();  // a pooled run's setup starts at hand-out
      self->on_lost_ = nullptr;
      self->on_started_ = std::move(on_started);
      self->activate_on_strand(std::move(job), std::move(done));
    });
  }

  /// True while the instance is ready and idle (not handed out, not failing).
  bool is_ready_idle() const noexcept { return ready_.load() && !activated_.load(); }

  /// Cancels the run from any thread (posted to the strand).
  void cancel() {
    asio::post(strand_, [self = shared_from_this()] {
      self->cancelled_ = true;
      self->finish();
    });
  }

  /// Kills every process of the run right now, from any thread (runtime shutdown). Safe
  /// against the run tearing down concurrently.
  void kill_now() noexcept {
    std::lock_guard lock(kill_mu_);
    // An OCI runtime is left to exit by itself once its container is gone (killed in the
    // middle it leaves its state and cgroups behind); poll_dead kills it only if it lingers.
    if (pidfd_raw_ >= 0 && shared_->launcher->kill_launched_process()) {
      syscall(SYS_pidfd_send_signal, pidfd_raw_, SIGKILL, nullptr, 0);
    }
    if (cgroup_) (void)cgroup_->kill_all();
  }

  /// True once every process is confirmed dead (or the run never started one).
  bool is_dead() noexcept {
    std::lock_guard lock(kill_mu_);
    if (!cgroup_) return true;
    auto e = cgroup_->is_empty();
    return e && *e;
  }

  const std::string& run_id() const noexcept { return job_.run_id; }

  // --- session mode (sandbox/session.hpp) ---------------------------------------------------
  // The same run, except: the program's stdin is a pipe the host writes (sent with `go`),
  // its stdout is read by the session's reader instead of a capture, an idle timer ends it
  // when no byte moves, `async_close` ends it on purpose. Everything else — cgroup,
  // teardown, kill-and-confirm, classification — is the run's.
  using io_handler =
      asio::any_completion_handler<void(boost::system::error_code, std::size_t)>;
  using close_handler =
      asio::any_completion_handler<void(boost::system::error_code, session_result)>;
  using open_handler =
      asio::any_completion_handler<void(boost::system::error_code, session_start)>;

  /// Starts a cold run in session mode. `opened` completes once the program started (with
  /// `session`) or the run ended before (without).
  void start_session(session_job sj, std::shared_ptr<sandbox::session> session,
                     std::shared_ptr<session_shared> shared, open_handler opened) {
    asio::dispatch(strand_, [self = shared_from_this(), sj = std::move(sj), session = std::move(session),
                             shared = std::move(shared), opened = std::move(opened)]() mutable {
      self->session_ = true;
      self->session_shared_ = std::move(shared);
      self->sjob_ = std::move(sj);
      self->stdin_buf_.reserve(self->sjob_.stdin_buffer_bytes);
      self->stdin_capacity_ = self->sjob_.stdin_buffer_bytes;
      self->open_session_ = std::move(session);
      self->open_handler_.emplace(std::move(opened));
      self->prepare();
      std::weak_ptr<init_run> weak = self;
      self->activate_on_strand(self->job_, [weak](run_result r, run_detail) {
        if (auto s = weak.lock()) s->session_done(std::move(r));
      });
    });
  }

  void session_write(asio::const_buffer d, io_handler h) {
    asio::dispatch(strand_, [self = shared_from_this(), d, h = std::move(h)]() mutable {
      auto& me = *self;
      if (me.pending_write_) return me.complete_io(std::move(h), asio::error::in_progress, 0);
      if (me.finishing_ || me.torn_down_) {
        return me.complete_io(std::move(h), asio::error::operation_aborted, 0);
      }
      if (me.stdin_close_requested_ || !me.stdin_is_open()) {
        return me.complete_io(std::move(h), asio::error::broken_pipe, 0);
      }
      me.pending_write_.emplace(pending_write{d, 0, std::move(h)});
      me.accept_input();
      me.flush_stdin();
    });
  }

  void session_read(asio::mutable_buffer b, io_handler h) {
    asio::dispatch(strand_, [self = shared_from_this(), b, h = std::move(h)]() mutable {
      auto& me = *self;
      if (me.read_pending_) return me.complete_io(std::move(h), asio::error::in_progress, 0);
      if (me.stdout_eof_) return me.complete_io(std::move(h), asio::error::eof, 0);
      if (me.finishing_ || me.torn_down_ || !me.stdout_.is_open()) {
        return me.complete_io(std::move(h), asio::error::operation_aborted, 0);
      }
      if (me.stdout_quiet_) return me.read_after_quiet(b, std::move(h));
      me.read_pending_ = true;
      me.stdout_.async_read_some(b, [self, b, h = std::move(h)](boost::system::error_code ec,
                                                                std::size_t n) mutable {
        auto& me = *self;
        me.read_pending_ = false;
        // Stream mode: `quiet` cancelled this wait (the pipe's writers inside are gone, but
        // the runtime holds it open): what is left in it is read without waiting.
        if (ec == asio::error::operation_aborted && n == 0 && me.stdout_quiet_ &&
            !me.finishing_ && !me.torn_down_ && me.stdout_.is_open()) {
          return me.read_after_quiet(b, std::move(h));
        }
        if (n > 0) {
          me.bytes_from_server_ += n;
          me.touch();
        }
        if (ec == asio::error::eof) {
          me.stdout_eof_ = true;
          me.stdout_open_ = false;
          me.maybe_end_after_exit();
        } else if (ec && ec != asio::error::operation_aborted) {
          me.stdout_open_ = false;
          me.maybe_end_after_exit();
        }
        if (ec && ec != asio::error::eof && n == 0) ec = asio::error::operation_aborted;
        me.complete_io(std::move(h), n > 0 ? boost::system::error_code{} : ec, n);
      });
    });
  }

  void session_close_stdin() {
    asio::dispatch(strand_, [self = shared_from_this()] {
      self->stdin_close_requested_ = true;
      self->flush_stdin();
    });
  }

  void session_close(close_handler h) {
    asio::dispatch(strand_, [self = shared_from_this(), h = std::move(h)]() mutable {
      auto& me = *self;
      if (me.session_result_) {
        sandbox::detail::post_completion(me.job_.executor, std::move(h), boost::system::error_code{},
                                         *me.session_result_);
        return;
      }
      me.close_handlers_.push_back(std::move(h));
      if (me.close_requested_ || me.finishing_) return;  // (ending already: as it ends)
      me.close_requested_ = true;
      // stdin closes now (buffered bytes are dropped: the host is done); stdout no longer
      // holds the end back; the server gets the exit grace to go by itself, then the kill.
      // (Stream mode: the bytes in flight stay counted until sandbox-init acknowledges
      // them; only the unsent rest is dropped.)
      me.stdin_buf_.resize(me.stream_ ? me.stdin_sent_ : 0);
      me.stdin_buffered_ = static_cast<std::uint32_t>(me.stdin_buf_.size());
      me.close_stdin_pipe();
      me.fail_pending_write(asio::error::operation_aborted);
      me.stdout_open_ = false;
      me.close_timer_.expires_after(me.job_.policy.exit_grace);
      me.close_timer_.async_wait([self](boost::system::error_code ec) {
        if (!ec) self->finish();
      });
      me.maybe_end_after_exit();
    });
  }

  session_stats stats_snapshot() const {
    return {.bytes_to_server = bytes_to_server_.load(),
            .bytes_from_server = bytes_from_server_.load(),
            .stdin_buffered = stdin_buffered_.load(),
            .stdin_capacity = stdin_capacity_,
            .write_waiting = write_waiting_.load(),
            .ended = ended_.load()};
  }

 private:
  struct pending_write {
    asio::const_buffer rest;
    std::size_t accepted = 0;
    io_handler handler;
  };

  void complete_io(io_handler h, boost::system::error_code ec, std::size_t n) {
    sandbox::detail::post_completion(job_.executor, std::move(h), ec, n);
  }

  void touch() { last_activity_ = clock::now(); }

  // Moves what fits of the pending write into the bounded buffer; completes the write once
  // all of it is in. (The buffer's capacity is reserved up front: appending never moves
  // bytes a write in flight points at.)
  void accept_input() {
    if (!pending_write_) return;
    auto& w = *pending_write_;
    const std::size_t space = stdin_capacity_ - std::min<std::size_t>(stdin_capacity_, stdin_buf_.size());
    const std::size_t n = std::min(space, w.rest.size());
    stdin_buf_.append(static_cast<const char*>(w.rest.data()), n);
    w.rest += n;
    w.accepted += n;
    stdin_buffered_ = static_cast<std::uint32_t>(stdin_buf_.size());
    if (w.rest.size() == 0) {
      auto h = std::move(w.handler);
      const std::size_t total = w.accepted;
      pending_write_.reset();
      write_waiting_ = false;
      complete_io(std::move(h), {}, total);
    } else {
      write_waiting_ = true;
    }
  }

  void fail_pending_write(boost::system::error_code ec) {
    if (!pending_write_) return;
    auto h = std::move(pending_write_->handler);
    const std::size_t n = pending_write_->accepted;
    pending_write_.reset();
    write_waiting_ = false;
    complete_io(std::move(h), ec, n);
  }

  // write(2) on the stdin pipe without SIGPIPE (the host library must not die because a
  // server closed its stdin): the signal is blocked on this thread for the call, and one it
  // raised is consumed before unblocking.
  static ssize_t write_no_sigpipe(int fd, const char* p, std::size_t n) {
    sigset_t pipe_set, old;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    sigset_t pending;
    sigpending(&pending);
    const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
    ssize_t r = ::write(fd, p, n);
    const int saved = errno;
    if (r < 0 && saved == EPIPE && !was_pending) {
      timespec zero{};
      while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    errno = saved;
    return r;
  }

  /// The host can still send the program stdin bytes (the pipe, or in stream mode the
  /// control stream's stdin, is open).
  bool stdin_is_open() const noexcept { return stream_ ? stdin_stream_open_ : stdin_.is_open(); }

  /// EOF for the program: the pipe's write end closes, or (stream mode) `stdin_close` is
  /// queued behind the bytes already sent.
  void close_stdin_pipe() {
    if (stream_) {
      if (!stdin_stream_open_) return;
      stdin_stream_open_ = false;
      send_frame(ip::msg::stdin_close, 0, {});
      return;
    }
    boost::system::error_code ignored;
    stdin_.close(ignored);
  }

  /// Stream mode: sends what the credit window allows of the buffer's unsent bytes
  /// (`stdin_sent_` of its front are in flight), in chunks; the buffer's front is erased only
  /// as sandbox-init acknowledges it, so `stdin_buffered_` counts every byte not yet in the
  /// program's pipe.
  void flush_stdin_stream() {
    if (!stdin_stream_open_) return;
    while (stdin_sent_ < stdin_buf_.size() && stdin_sent_ < ip::stdin_window) {
      const std::size_t n = std::min<std::size_t>(
          {stdin_buf_.size() - stdin_sent_, ip::stdin_chunk, ip::stdin_window - stdin_sent_});
      send_frame(ip::msg::stdin_data, 0, std::string_view(stdin_buf_.data() + stdin_sent_, n));
      stdin_sent_ += n;
    }
    // EOF as soon as every byte is sent: sandbox-init writes what it holds first.
    if (stdin_sent_ == stdin_buf_.size() && stdin_close_requested_) close_stdin_pipe();
  }

  /// Stream mode: sandbox-init wrote `n` more bytes into the program's pipe. Untrusted: a
  /// count above what is in flight, or an ack outside a session, is a protocol fault.
  void on_stdin_ack(std::uint32_t n) {
    if (!session_ || !stream_ || n == 0 || n > stdin_sent_) {
      return protocol_fault("sandbox-init acknowledged stdin bytes it was not sent");
    }
    stdin_buf_.erase(0, n);
    stdin_sent_ -= n;
    bytes_to_server_ += n;
    stdin_buffered_ = static_cast<std::uint32_t>(stdin_buf_.size());
    touch();
    accept_input();
    flush_stdin_stream();
  }

  /// Stream mode: the program closed its stdin; what the host holds for it is dropped.
  void on_stdin_closed() {
    if (!session_ || !stream_) {
      return protocol_fault("sandbox-init reported a stdin the run does not have");
    }
    stdin_stream_open_ = false;
    stdin_buf_.clear();
    stdin_sent_ = 0;
    stdin_buffered_ = 0;
    fail_pending_write(asio::error::broken_pipe);
  }

  void protocol_fault(const char* what) {
    log(log_level::error, what);
    if (finishing_) return;
    if (!started_) return fail_setup(what);
    internal_error_ = "sandbox failed";
    detail_.text = what;
    finish();
  }

  /// Stream mode, after `quiet`: no process inside holds the session's stdout any more, but
  /// the runtime does, so its end never shows. Every byte the server wrote is in the pipe:
  /// read what is there without waiting; an empty pipe is the end (EOF).
  void read_after_quiet(asio::mutable_buffer b, io_handler h) {
    ssize_t n = -1;
    if (stdout_.is_open() && b.size() > 0) {
      do {
        n = ::read(stdout_.native_handle(), b.data(), b.size());
      } while (n < 0 && errno == EINTR);
    }
    if (n > 0) {
      bytes_from_server_ += static_cast<std::uint64_t>(n);
      touch();
      return complete_io(std::move(h), {}, static_cast<std::size_t>(n));
    }
    if (b.size() == 0 && stdout_.is_open()) return complete_io(std::move(h), {}, 0);
    stdout_eof_ = true;
    stdout_open_ = false;
    maybe_end_after_exit();
    complete_io(std::move(h), asio::error::eof, 0);
  }

  void flush_stdin() {
    if (stream_) return flush_stdin_stream();
    if (stdin_flushing_ || !stdin_.is_open()) return;
    if (stdin_buf_.empty()) {
      if (stdin_close_requested_) {
        boost::system::error_code ignored;
        stdin_.close(ignored);
      }
      return;
    }
    stdin_flushing_ = true;
    stdin_.async_wait(asio::posix::descriptor_base::wait_write,
                      [self = shared_from_this()](boost::system::error_code ec) {
                        auto& me = *self;
                        me.stdin_flushing_ = false;
                        if (ec || !me.stdin_.is_open()) return;
                        ssize_t n = write_no_sigpipe(me.stdin_.native_handle(), me.stdin_buf_.data(),
                                                     me.stdin_buf_.size());
                        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return me.flush_stdin();
                        if (n < 0) {
                          // The server closed its stdin (EPIPE): nothing more reaches it.
                          me.stdin_buf_.clear();
                          me.stdin_buffered_ = 0;
                          boost::system::error_code ignored;
                          me.stdin_.close(ignored);
                          me.fail_pending_write(asio::error::broken_pipe);
                          return;
                        }
                        me.stdin_buf_.erase(0, static_cast<std::size_t>(n));
                        me.bytes_to_server_ += static_cast<std::uint64_t>(n);
                        me.stdin_buffered_ = static_cast<std::uint32_t>(me.stdin_buf_.size());
                        if (n > 0) me.touch();
                        me.accept_input();
                        me.flush_stdin();
                      });
  }

  void arm_idle_timer() {
    auto due = last_activity_ + sjob_.idle_timeout;
    idle_timer_.expires_at(due);
    idle_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      auto& me = *self;
      if (ec || me.finishing_) return;
      if (clock::now() - me.last_activity_ < me.sjob_.idle_timeout) return me.arm_idle_timer();
      // A server that exited with output the host never read ends as exited, not idle.
      if (!me.main_status_) me.idle_timed_out_ = true;
      me.finish();
    });
  }

  void session_started() {
    touch();
    arm_idle_timer();
    if (!open_handler_) return;
    auto h = std::move(*open_handler_);
    open_handler_.reset();
    auto s = std::move(open_session_);
    sandbox::detail::post_completion(job_.executor, std::move(h), boost::system::error_code{}, session_start{.session = std::move(s), .code = sandbox::code::ok, .message = {}});
  }

  void session_done(run_result r) {
    session_result sr;
    if (close_requested_ && !idle_timed_out_ && !timed_out_ && r.code == sandbox::code::ok) {
      sr.end = session_end::closed;
    } else if (idle_timed_out_) {
      sr.end = session_end::idle_timeout;
    } else if (timed_out_) {
      sr.end = sjob_.lifetime_ends_at_ticket_expiry ? session_end::ticket_expired
                                                    : session_end::max_lifetime;
    } else if (r.code == sandbox::code::oom) {
      sr.end = session_end::oom;
    } else if (r.code == sandbox::code::seccomp_violation) {
      sr.end = session_end::seccomp_violation;
    } else if (cancelled_ || shared_shutting_down()) {
      sr.end = session_end::killed;
      r.code = sandbox::code::internal;
      r.message = "session killed (its owner went away or the runtime shut down)";
    } else if (r.code == sandbox::code::internal) {
      sr.end = session_end::failed;
    } else {
      sr.end = session_end::server_exited;
    }
    r.std_out = {};
    r.std_out.total_bytes = bytes_from_server_.load();
    sr.bytes_to_server = bytes_to_server_.load();
    sr.bytes_from_server = bytes_from_server_.load();
    sr.result = std::move(r);
    // The runtime's span, scheduler slot and receipt (session_job::on_end): once, before
    // the record is kept and before any handler.
    if (auto on_end = std::move(sjob_.on_end)) {
      sjob_.on_end = nullptr;
      on_end(sr);
    }
    session_result_ = sr;
    ended_ = true;
    if (session_shared_) {
      std::lock_guard lock(session_shared_->mu);
      session_shared_->result = sr;
      session_shared_->last = stats_snapshot();
    }
    fail_pending_write(asio::error::operation_aborted);
    if (open_handler_) {
      // Never started: the open fails with the run's code (never `ok`).
      auto h = std::move(*open_handler_);
      open_handler_.reset();
      open_session_.reset();
      session_start st{.session = nullptr,
                       .code = sr.result.code == sandbox::code::ok ? sandbox::code::internal
                                                                   : sr.result.code,
                       .message = sr.result.message.empty() ? "the server did not start"
                                                            : sr.result.message};
      sandbox::detail::post_completion(job_.executor, std::move(h), boost::system::error_code{}, std::move(st));
    }
    auto handlers = std::move(close_handlers_);
    close_handlers_.clear();
    for (auto& h : handlers) {
      sandbox::detail::post_completion(job_.executor, std::move(h), boost::system::error_code{}, sr);
    }
  }

  // --- prepare and launch ------------------------------------------------------------------

  void log(log_level lvl, const std::string& line) const {
    if (shared_->ctx.log) shared_->ctx.log(lvl, fmt::format("run {}: {}", job_.run_id, line));
  }

  void fail_setup(const std::string& detail_in) {
    internal_error_ = "sandbox setup failed";
    std::string detail = detail_in;
    if (have_ws_) {
      if (auto d = shared_->launcher->diagnostics(ws_); !d.empty()) detail += " [" + d + "]";
    }
    detail_.text = detail;
    // An idle pool instance destroyed on purpose (shutdown, health check) is not an error;
    // one that died idle is worth a warning (the pool replaces it).
    if (ready_.load() && !activated_.load()) {
      if (!cancelled_ && !shared_shutting_down()) {
        log(log_level::warning, "idle warm-pool instance lost: " + detail);
      }
    } else if (!activated_.load() && (cancelled_ || shared_shutting_down())) {
      // A warm-pool instance still being prepared when the pool or the runtime went away.
      log(log_level::debug, "warm-pool instance dropped while preparing: " + detail);
    } else {
      log(log_level::error, detail);
    }
    finish();
  }

  bool shared_shutting_down() const noexcept { return shared_->shutting_down.load(); }

  void prepare() {
    t0_ = clock::now();
    instance_id_ = job_.run_id;  // resources are named by the instance, results by the run
    const auto& req = job_.admitted.request;
    const std::uint64_t mem = req.memory_limit_bytes;

    // 0. The image stays while this sandbox uses it: a shared lock on its unpacked root, which
    //    the image store's remove() must take exclusively (`busy` otherwise).
    image_lock_fd_ = ::open(job_.rootfs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (image_lock_fd_ < 0 || ::flock(image_lock_fd_, LOCK_SH | LOCK_NB) != 0) {
      return fail_setup("the runtime's image is missing or being removed");
    }

    // 1. Identity: a uid of the run's own (root hosts), or the single mapped id of a user
    //    namespace (unprivileged hosts: per-uid counters are per user namespace there).
    if (shared_->uids) {
      auto uid = shared_->uids->acquire();
      if (!uid) return fail_setup("no free sandbox uid in the configured range");
      uid_ = *uid;
      have_uid_ = true;
    } else {
      uid_ = userns_inside_id;
    }

    // 2. The run's cgroup, with limits, before any process exists.
    cgroup_limits limits{mem, job_.policy.max_pids, job_.policy.cpu_quota_millicores};
    shared_->launcher->adjust_limits(job_.policy, limits);
    std::string cg_name = "r-" + shared_->instance_id + "-" + instance_id_;
    cgroup_path_ = shared_->cgroup_parent + "/" + cg_name;
    auto cg = shared_->cgroups->create(cg_name, limits);
    if (!cg) return fail_setup("cgroup create failed: " + cg.error().message());
    {
      std::lock_guard lock(kill_mu_);
      cgroup_.emplace(std::move(*cg));
    }
    t_cgroup_ = clock::now();

    // 3. Workspace skeleton: an empty input dir and source file (bound by sandbox-init now,
    //    filled at activation), the staging mount point.
    auto ws = create_workspace(shared_->runs_dir, instance_id_,
                               selftest_ ? std::string("probe") : job_.runtime.source_name);
    if (!ws) return fail_setup("workspace: " + ws.error().message());
    ws_ = *ws;
    have_ws_ = true;
    t_workspace_ = clock::now();

    // 4. Channels: control socket, stdout/stderr pipes.
    int ctl[2], outp[2], errp[2];
    stream_ = shared_->launcher->stream_control();
    if (socketpair(AF_UNIX, (stream_ ? SOCK_STREAM : SOCK_SEQPACKET) | SOCK_CLOEXEC, 0, ctl) < 0) {
      return fail_setup(fmt::format("socketpair: errno {}", errno));
    }
    // (A launcher may want stream sockets instead of pipes: QEMU's socket chardevs wait
    // for a full peer, its file chardevs on a pipe were seen losing most of a flood.)
    const bool sockets = shared_->launcher->stdio_sockets();
    auto make_pair = [&](int fds[2]) {
      return sockets ? ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) : ::pipe2(fds, O_CLOEXEC);
    };
    if (make_pair(outp) < 0 || make_pair(errp) < 0) {
      ::close(ctl[0]);
      ::close(ctl[1]);
      return fail_setup(fmt::format("pipe2: errno {}", errno));
    }
    input_name_ = "in-" + random_hex(8);
    if (session_ && !stream_) {
      // A session's stdin: the host keeps the write end (non-blocking), the read end goes to
      // sandbox-init with the program (`go`, a = 1) and on to the program as its fd 0.
      // (Stream mode: sandbox-init makes the pipe and the bytes travel on the control
      // stream, init_protocol.hpp.)
      int inp[2];
      if (pipe2(inp, O_CLOEXEC) < 0) {
        ::close(ctl[0]);
        ::close(ctl[1]);
        for (int fd : {outp[0], outp[1], errp[0], errp[1]}) ::close(fd);
        return fail_setup(fmt::format("pipe2: errno {}", errno));
      }
      fcntl(inp[1], F_SETFL, O_NONBLOCK);
      stdin_.assign(inp[1]);
      stdin_child_fd_ = inp[0];
    }

    // 5. sandbox-init, in the run's namespaces and cgroup, waiting for its configuration.
    launch_request lr{.job = job_, .instance_id = instance_id_, .ws = ws_, .cgroup = *cgroup_,
                      .cgroup_path = cgroup_path_,
                      .uid = uid_, .selftest = selftest_, .input_name = input_name_,
                      .ctl_fd = ctl[1],
                      .out_fd = shared_->launcher->stdio_over_control() ? -1 : outp[1],
                      .err_fd = shared_->launcher->stdio_over_control() ? -1 : errp[1]};
    std::string why;
    auto sp = shared_->launcher->launch(lr, &why);
    ::close(ctl[1]);
    // Launchers whose runtime process would hold the pipes (an OCI runtime waits in the
    // foreground) get them to sandbox-init with the configuration instead (`a` = 1).
    if (!shared_->launcher->stdio_over_control()) {
      ::close(outp[1]);
      ::close(errp[1]);
      outp[1] = errp[1] = -1;
    }
    struct closer {
      int* fds[2];
      ~closer() {
        for (int* f : fds) close_fd(*f);
      }
    } close_later{{&outp[1], &errp[1]}};
    ctl_.assign(ctl[0]);
    stdout_.assign(outp[0]);
    stderr_.assign(errp[0]);
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
    if (!sp) {
      return fail_setup(fmt::format("starting sandbox-init ({}) failed: {}{}",
                                    shared_->launcher->name(), sp.error().message(),
                                    why.empty() ? "" : ": " + why));
    }
    {
      std::lock_guard lock(kill_mu_);
      pidfd_raw_ = sp->pidfd;
    }
    helper_pid_ = sp->pid;
    pidfd_desc_.assign(::dup(sp->pidfd));
    agent_ = shared_->launcher->make_agent_channel(lr);
    if (agent_) ctl_out_ += agent_->initial_frames();  // sent ahead of the configuration
    if (agent_) {
      // The agent's own I/O (microvm: a network run's egress tunnel); its faults are the
      // guest's, like a refused agent frame.
      std::weak_ptr<init_run> weak = weak_from_this();
      agent_->start(strand_, [weak](std::string why) {
        if (auto self = weak.lock(); self && !self->finishing_) self->agent_refused(why);
      });
    }
    t_spawned_ = clock::now();
    if (sp->egress_listener >= 0) {
      // The launcher made the run's network namespace (makes_network_namespace).
      if (network_granted()) start_proxy(sp->egress_listener);
      else ::close(sp->egress_listener);
    }

    // 6. The output directory, when the launcher made it on the host.
    if (auto out = shared_->launcher->host_output_dir(ws_); !out.empty()) {
      out_dir_fd_ = ::open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
      if (out_dir_fd_ < 0) return fail_setup(fmt::format("opening the output dir: errno {}", errno));
    }

    // 7. The configuration.
    if (outp[1] >= 0) {
      const int stdio[2] = {outp[1], errp[1]};
      send_config(lr, stdio);
    } else {
      send_config(lr);
    }
    if (finishing_) return;
    t_config_sent_ = clock::now();

    // 8. Watch.
    auto self = shared_from_this();
    arm_setup_timer();
    read_control();
    if (!session_) read_stream(stdout_, out_, stdout_open_);  // a session's reader reads it
    read_stream(stderr_, err_, stderr_open_);
    // A pidfd polls readable once its process has exited; a bare wake-up of the wait (Asio
    // applies a closed descriptor's events to the one that recycles its state:
    // core/confirmed_wait.hpp) is no exit, and must not end a live run as "supervisor lost".
    async_wait_confirmed(pidfd_desc_, asio::posix::descriptor_base::wait_read, pidfd_exited,
                         [self](boost::system::error_code ec) {
                           if (ec) return;
                           self->helper_exited_ = true;
                           // Killing: sandbox-init (PID 1 of the run) exits last, so this
                           // is the moment to confirm, rather than the next poll.
                           if (self->finishing_) return self->poll_dead();
                           if (!self->started_)
                             return self->fail_setup("sandbox-init exited during setup");
                           self->supervisor_lost();
                         });
    if (int fd = cgroup_->oom_event_fd(); fd >= 0) {
      oom_.assign(::dup(fd));
      watch_oom();
    }
  }

  void send_config(const launch_request& lr, std::span<const int> stdio_fds = {}) {
    ip::config_writer w;
    w.add("mode", selftest_ ? "selftest" : "run");
    w.add("input_name", input_name_);
    w.add("source_name", selftest_ ? std::string("probe") : job_.runtime.source_name);
    w.add("uid", std::uint64_t{uid_});
    w.add("gid", std::uint64_t{uid_});
    w.add("userns", shared_->userns ? "1" : "0");
    const auto sizes = sandbox_sizes(job_);
    w.add("tmp_bytes", sizes.tmp_bytes);
    w.add("home_bytes", sizes.home_bytes);
    w.add("shm_bytes", sizes.shm_bytes);
    w.add("out_bytes", sizes.out_bytes);
    w.add("tmpfs_inodes", sizes.tmpfs_inodes);
    w.add("out_inodes", sizes.out_inodes);
    w.add("nofile", sizes.nofile);
    w.add("fsize_bytes", sizes.fsize_bytes);
    shared_->launcher->add_config(lr, w);
    ip::init_header h{ip::msg::config, stdio_fds.empty() ? 0U : 1U, 0};
    std::string packet(reinterpret_cast<const char*>(&h), sizeof h);
    packet += w.bytes();
    if (packet.size() > ip::max_packet) return fail_setup("configuration too large");
    if (send_packet(packet, stdio_fds) < 0) {
      return fail_setup(fmt::format("sending configuration failed: errno {}", errno));
    }
  }

  // One packet on the control channel, with descriptors (SCM_RIGHTS) when `fds` has any.
  int send_packet(std::string& packet, std::span<const int> fds) {
    if (stream_) {
      // Length-prefixed, queued whole behind what is still unsent (a session's stdin chunks
      // follow `go` on the same stream), sent as the socket takes it.
      std::uint32_t len = static_cast<std::uint32_t>(packet.size());
      ctl_out_.append(reinterpret_cast<const char*>(&len), sizeof len);
      ctl_out_ += packet;
      return flush_control_out() ? 0 : -1;
    }
    iovec iov{packet.data(), packet.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 2)];
    if (!fds.empty()) {
      m.msg_control = cbuf;
      m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    return ::sendmsg(ctl_.native_handle(), &m, MSG_NOSIGNAL) < 0 ? -1 : 0;
  }

  /// Stream mode: one host → init packet of `type` with `payload`, queued.
  void send_frame(ip::msg type, std::uint32_t a, std::string_view payload) {
    ip::init_header h{type, a, 0};
    std::string packet(reinterpret_cast<const char*>(&h), sizeof h);
    packet.append(payload);
    (void)send_packet(packet, {});  // a dead channel shows as its EOF on the read side
  }

  /// Stream mode: sends what the control socket takes of `ctl_out_` now and waits for room
  /// for the rest. Bounded: the configuration, `go`, at most `stdin_window` bytes of stdin
  /// and their frames. False when the channel failed (sandbox-init is gone).
  bool flush_control_out() {
    while (!ctl_out_.empty()) {
      ssize_t n = ::send(ctl_.native_handle(), ctl_out_.data(), ctl_out_.size(),
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!ctl_out_waiting_) {
          ctl_out_waiting_ = true;
          ctl_.async_wait(asio::posix::descriptor_base::wait_write,
                          [self = shared_from_this()](boost::system::error_code ec) {
                            self->ctl_out_waiting_ = false;
                            if (!ec && !self->finishing_) (void)self->flush_control_out();
                          });
        }
        return true;
      }
      if (n <= 0) {
        ctl_out_.clear();
        return false;
      }
      ctl_out_.erase(0, static_cast<std::size_t>(n));
    }
    return true;
  }

  void send_go() {
    const auto& req = job_.admitted.request;
    ip::config_writer w;
    const std::string source_path = "/sandbox/" + job_.runtime.source_name;
    if (selftest_) {
      w.add("argv", shared_->launcher->probe_path());
      w.add("argv", "--probe");
      w.add("argv", std::to_string(uid_));
      // gVisor's procfs shows PID 1's environ (the probe is told); a microVM's is Linux's.
      if (stream_ && shared_->launcher->isolation() == sandbox::isolation::gvisor) {
        w.add("argv", "gvisor");
      }
    } else if (session_) {
      for (const auto& a : job_.runtime.argv) w.add("argv", a);  // the entry's, as is
    } else {
      for (const auto& a : job_.runtime.argv) w.add("argv", a == "{source}" ? source_path : a);
      // A registered tool's standard input: the staged file, opened read-only as fd 0.
      if (job_.stdin_bytes) w.add("stdin", source_path);
    }
    w.add("env", "PATH=/usr/local/bin:/usr/bin:/bin");
    w.add("env", "HOME=/home/sandbox");
    w.add("env", "LANG=C.UTF-8");
    w.add("env", "SANDBOX_INPUT_DIR=/sandbox/" + input_name_);
    w.add("env", "SANDBOX_OUTPUT_DIR=/sandbox/out");
    if (network_granted() && !proxy_ && shared_->launcher->stream_control()) {
      // (A launcher without descriptor passing makes the namespace itself; this instance
      // has none: a warm-pool one, which network runs never take.)
      return fail_setup("network run on an instance without its own network namespace");
    }
    if (network_granted()) {
      // The proxy, for the clients that honour the usual variables (curl, urllib, requests,
      // pip, the node image's preload). Ours come first: the first of equal names wins.
      // sandbox-init makes its listener unless the launcher already did.
      if (!proxy_) w.add("egress_proxy", std::uint64_t{ip::egress_proxy_port});
      const std::string url = fmt::format("http://127.0.0.1:{}", ip::egress_proxy_port);
      for (const char* n : {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"}) {
        w.add("env", std::string(n) + "=" + url);
      }
      w.add("env", "NO_PROXY=localhost,127.0.0.1,::1");
      w.add("env", "no_proxy=localhost,127.0.0.1,::1");
      // Node's http, https and fetch ignore those variables: the preload makes them use it.
      if (auto preload = shared_->launcher->node_proxy_preload_path(); !preload.empty()) {
        w.add("env", "NODE_OPTIONS=--require " + preload);
      }
    }
    for (const auto& [k, v] : req.env) {
      // A network run's NODE_OPTIONS is ours (the proxy preload). The proxy variables need no
      // such care: admission refuses them in any request (env_rules.hpp, is_reserved_env).
      if (network_granted() && k == "NODE_OPTIONS") continue;
      w.add("env", k + "=" + v);
    }

    const bool with_stdin = session_ && (stream_ || stdin_child_fd_ >= 0);
    ip::init_header h{ip::msg::go, with_stdin ? 1U : 0U, 0};
    std::string packet(reinterpret_cast<const char*>(&h), sizeof h);
    packet += w.bytes();
    if (packet.size() > ip::max_packet) return fail_setup("program description too large");
    const int stdin_fds[1] = {stdin_child_fd_};
    const int sent = with_stdin && !stream_ ? send_packet(packet, stdin_fds)
                                            : send_packet(packet, {});
    close_fd(stdin_child_fd_);  // only sandbox-init (then the program) holds the read end
    if (with_stdin && stream_) stdin_stream_open_ = true;
    if (sent < 0) {
      return fail_setup(fmt::format("sending the program failed: errno {}", errno));
    }
  }

  // Host log (debug): where the setup time went — host-side steps and sandbox-init's phase
  // timestamps (same monotonic clock). Used by the benchmark's cold-path breakdown.
  void log_setup_breakdown(std::string_view init_times) {
    if (!shared_->ctx.log) return;
    auto us = [](clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
    };
    std::string line = fmt::format("setup breakdown us: t0={} cgroup={} workspace={} spawned={} config_sent={}",
                                   us(t0_), us(t_cgroup_), us(t_workspace_), us(t_spawned_),
                                   us(t_config_sent_));
    for (auto [k, v] : ip::parse_config(init_times)) line += fmt::format(" {}={}", k, v);
    line += fmt::format(" started={}", us(started_at_));
    shared_->ctx.log(log_level::debug, line);
  }

  // Host log (debug): where the time between the program's exit and the result went.
  void log_teardown_breakdown(bool removed) {
    if (!shared_->ctx.log || !started_) return;
    auto us = [](clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
    };
    auto exited = main_status_ ? main_exit_at_ : ended_at_;
    shared_->ctx.log(log_level::debug,
                     fmt::format("teardown breakdown us: exited={} finish={} dead={} collected={} "
                                 "destroyed={} delivered={} cgroup_busy={}",
                                 us(exited), us(ended_at_), us(t_dead_), us(t_collected_),
                                 us(t_destroyed_), us(clock::now()), removed ? 0 : 1));
  }

  // The policy's setup budget, or the launcher's floor when that is longer (a VM boots).
  std::chrono::milliseconds setup_budget() const {
    return std::max(job_.policy.setup_budget, shared_->launcher->min_setup_budget());
  }

  void arm_setup_timer() {
    setup_timer_.expires_after(setup_budget());
    setup_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->started_ || self->finishing_) return;
      // An idle pool instance is not on the clock: only preparing and activated runs are.
      if (self->ready_.load() && !self->activated_.load()) return;
      self->fail_setup("setup budget exceeded before the program started");
    });
  }

  void activate_on_strand(run_job job, done_fn done) {
    done_ = std::move(done);
    activated_ = true;
    job_.run_id = job.run_id;  // keep the template's resources; report as this run
    job_.admitted = std::move(job.admitted);
    job_.blobs = std::move(job.blobs);
    if (job.executor) job_.executor = std::move(job.executor);
    if (torn_down_) {
      // The instance died between being picked and activated: report, never hang.
      internal_error_ = "sandbox setup failed";
      run_result r;
      classify(r);
      auto d = std::move(done_);
      done_ = nullptr;
      d(std::move(r), std::move(detail_));
      return;
    }
    if (finishing_) return;  // preparing already failed: teardown reports it
    const auto& req = job_.admitted.request;
    std::size_t missing = 0;
    auto staged = stage_workspace(ws_, job_.stdin_bytes ? *job_.stdin_bytes : req.source,
                                  req.files_in, *job_.blobs,
                                  job_.admitted.tenant, &missing);
    if (!staged) {
      if (staged.error() == make_error_code(errc::not_found)) {
        blob_missing_ = missing;
        finish();
        return;
      }
      if (staged.error() == make_error_code(errc::digest_mismatch)) {
        // The blob store is damaged (the content on disk is not what the id names): a host
        // fault, but one the caller can act on, so the field is named.
        log(log_level::error, fmt::format("files_in[{}]: stored blob does not match its digest", missing));
        internal_error_ = fmt::format("files_in[{}].blob: the stored content does not match its digest", missing);
        finish();
        return;
      }
      return fail_setup("workspace: " + staged.error().message());
    }
    if (clock::now() - t0_ > setup_budget()) {
      return fail_setup("setup budget exceeded while staging the inputs");
    }
    if (agent_) {
      // A guest cannot see the host's workspace: the staged files travel as frames first
      // (the agent forwards `go` only after them).
      auto frames = agent_->file_frames(ws_);
      if (!frames) return fail_setup("workspace: " + frames.error().message());
      ctl_out_ += *frames;
      if (!flush_control_out()) return fail_setup("sending the files to the guest failed");
    }
    send_go();
    if (ready_.load()) arm_setup_timer();  // a pooled instance: the clock starts now
  }

  // --- watch -------------------------------------------------------------------------------

  void read_control() {
    ctl_.async_wait(asio::posix::descriptor_base::wait_read,
                    [self = shared_from_this()](boost::system::error_code ec) {
                      if (ec) return;
                      self->on_control();
                    });
  }

  // Stream mode: whatever arrived is appended to `ctl_in_`, whole packets are taken off the
  // front. A length out of range is a protocol violation by sandbox-init: the run ends.
  void on_control_stream() {
    char chunk[8192];
    for (;;) {
      ssize_t n = ::recv(ctl_.native_handle(), chunk, sizeof chunk, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      if (n <= 0) {
        control_closed_ = true;
        if (!finishing_) {
          if (!started_) fail_setup("sandbox-init closed the control channel during setup");
          else supervisor_lost();
        }
        return;
      }
      ctl_in_.append(chunk, static_cast<std::size_t>(n));
      while (ctl_in_.size() >= sizeof(std::uint32_t)) {
        std::uint32_t len;
        std::memcpy(&len, ctl_in_.data(), sizeof len);
        if (len < sizeof(ip::init_header) || len > ip::max_packet) {
          return fail_setup("sandbox-init sent a malformed packet");
        }
        if (ctl_in_.size() < sizeof len + len) break;
        ip::init_header h;
        std::memcpy(&h, ctl_in_.data() + sizeof len, sizeof h);
        std::string payload = ctl_in_.substr(sizeof len + sizeof h, len - sizeof h);
        ctl_in_.erase(0, sizeof len + len);
        std::vector<int> none;
        on_message(h, payload, none);
        if (finishing_) return;
      }
    }
    if (!finishing_) read_control();
  }

  void on_control() {
    if (stream_) return on_control_stream();
    for (;;) {
      std::string buf(4096, '\0');
      alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 4)];
      iovec iov{buf.data(), buf.size()};
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = cbuf;
      m.msg_controllen = sizeof cbuf;
      ssize_t n = ::recvmsg(ctl_.native_handle(), &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      std::vector<int> fds;
      for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (std::size_t i = 0; i < count; ++i) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            fds.push_back(fd);
          }
        }
      }
      if (n <= 0) {  // sandbox-init closed the channel: it is gone
        for (int fd : fds) ::close(fd);
        control_closed_ = true;
        if (!finishing_) {
          if (!started_) fail_setup("sandbox-init closed the control channel during setup");
          else supervisor_lost();
        }
        return;
      }
      if (static_cast<std::size_t>(n) < sizeof(ip::init_header)) {
        for (int fd : fds) ::close(fd);
        continue;
      }
      ip::init_header h;
      std::memcpy(&h, buf.data(), sizeof h);
      on_message(h, std::string_view(buf.data() + sizeof h, static_cast<std::size_t>(n) - sizeof h),
                 fds);
    }
    if (!finishing_) read_control();
  }

  void on_message(const ip::init_header& h, std::string_view payload, std::vector<int>& fds) {
    auto take = [&](std::size_t i) {
      int fd = i < fds.size() ? fds[i] : -1;
      if (i < fds.size()) fds[i] = -1;
      return fd;
    };
    switch (h.type) {
      case ip::msg::ready:
        if (int d = take(0); d >= 0) {
          if (out_dir_fd_ < 0) out_dir_fd_ = d;  // else the launcher's host dir is the one
          else ::close(d);
        }
        if (int d = take(1); d >= 0) {
          dns_.assign(d);
          serve_dns();
        }
        ready_ = true;
        if (on_prepared_) {
          auto f = std::move(on_prepared_);
          on_prepared_ = nullptr;
          f(true);
        }
        break;
      case ip::msg::egress_proxy: {
        int l = take(0);
        if (l < 0 || proxy_ || !network_granted()) {
          close_fd(l);
          fail_setup("unexpected egress proxy socket from sandbox-init");
          break;
        }
        start_proxy(l);
        break;
      }
      case ip::msg::started: {
        int l = take(0);
        if (l < 0 && !stream_) {
          fail_setup("no seccomp listener from sandbox-init");
          break;
        }
        if (l >= 0) listener_.assign(l);
        started_ = true;
        started_at_ = clock::now();
        log_setup_breakdown(payload);
        fire_on_started();
        setup_timer_.cancel();
        if (listener_.is_open()) watch_notifications();
        auto self = shared_from_this();
        deadline_.expires_after(job_.admitted.request.timeout);
        deadline_.async_wait([self](boost::system::error_code ec) {
          if (ec || self->finishing_) return;
          // A main process that exited in time ends the run as it exited: descendants that
          // still hold its pipes when the deadline passes (inside the exit grace) are killed,
          // but cannot turn its end into a timeout.
          self->timed_out_ = !self->main_status_.has_value();
          self->end_run();
        });
        sample_memory();
        if (session_) session_started();
        break;
      }
      case ip::msg::exited:
        main_status_ = static_cast<int>(h.a);
        main_exit_at_ = clock::now();
        // A parked pipe goes back to reading now (its timer's handler runs at once): the
        // end of output is what the result waits for.
        stdout_park_.cancel();
        stderr_park_.cancel();
        maybe_end_after_exit();
        break;
      case ip::msg::dns:
        // Stream mode only (else the host serves the sink): sandbox-init's report of a
        // query, as untrusted as anything from inside. It was escaped there; anything else
        // is recorded as unreadable, never copied raw.
        if (stream_) {
          std::string name(payload.substr(0, 255));
          bool clean = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
                   c == '_' || c == '\\';
          });
          record_egress({.protocol = "dns",
                         .host = clean ? name : std::string("(unreadable name)"),
                         .address = "",
                         .port = 53,
                         .allowed = false,
                         .reason = "network disabled"});
        }
        break;
      case ip::msg::quiet:
        if (stream_) quiet_seen_ = true;
        // A guest agent (microvm) counted what each stream carried: the run goes on once the
        // capture holds that much (bounded), since the ports are not the control channel.
        if (stream_ && agent_ && !session_ && !guest_streams_settled_) {
          wait_guest_streams();
          break;
        }
        on_stream_quiet();
        break;
      case ip::msg::stdin_ack:
        on_stdin_ack(h.a);
        break;
      case ip::msg::stdin_closed:
        on_stdin_closed();
        break;
      case ip::msg::failed:
        fail_setup(fmt::format("sandbox-init step '{}' ({}) failed: {}", payload,
                               describe_step(static_cast<ip::step>(h.a)),
                               std::strerror(static_cast<int>(h.b))));
        break;
      default:
        // A guest agent's own frames (microvm, core/guest_protocol.hpp): untrusted; the
        // channel checks them and anything it refuses ends the run.
        if (static_cast<std::uint32_t>(h.type) >= 100) {
          if (!agent_) {
            fail_setup("unexpected agent message on the control channel");
            break;
          }
          if (auto why = agent_->on_frame(h, payload); !why.empty()) agent_refused(why);
        }
        break;
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }

  // Stream mode: `quiet` (after wait_guest_streams, with a guest agent). The runtime holds the
  // capture pipes, so their end never shows; nothing of the run is left to write to them.
  void on_stream_quiet() {
    if (stream_ && agent_finish_sent_) {  // the guest ended the run when told to
      stdout_open_ = stderr_open_ = false;
      finish();
      return;
    }
    if (stream_ && main_status_) {
      stderr_open_ = false;
      if (session_) {
        // A session's stdout is read by the host at its pace: what the server left in the
        // pipe is still read, then EOF (read_after_quiet).
        stdout_quiet_ = true;
        if (read_pending_) {
          boost::system::error_code ignored;
          stdout_.cancel(ignored);
        }
      } else {
        stdout_open_ = false;
      }
      maybe_end_after_exit();
    }
  }

  // A guest agent's `usage` counted the bytes the program wrote to each stream at the guest's
  // relay; the ports deliver them on their own way, so some may still be in flight (in the
  // VMM, in the sockets) when `quiet` arrives. The run goes on once the capture holds the
  // counts — or, bounded (judge_guest_streams, core/guest_streams.hpp), when no byte came for
  // `stream_stall`, when max(10 s, a quarter of the launcher's setup floor) passed, or when a
  // stream ended short: the counts are untrusted and a guest could claim any number. A
  // shortfall is logged and said in the result (the stream is flagged truncated); a capture
  // past the count is only logged (it holds what really came). The deadline and the exit
  // grace stop here: the run's processes are gone.
  static constexpr auto stream_stall = std::chrono::seconds(3);

  void wait_guest_streams() {
    agent_timer_.cancel();
    deadline_.cancel();
    grace_.cancel();
    awaiting_streams_ = true;
    streams_wait_since_ = streams_last_progress_ = clock::now();
    streams_seen_ = out_.total_bytes() + err_.total_bytes();
    check_guest_streams();
  }

  void check_guest_streams() {
    if (!awaiting_streams_ || finishing_) return;
    const auto now = clock::now();
    const auto u = agent_->usage();
    const std::uint64_t seen = out_.total_bytes() + err_.total_bytes();
    if (seen != streams_seen_) {
      streams_seen_ = seen;
      streams_last_progress_ = now;
    }
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    const guest_stream_state st{
        .received_stdout = out_.total_bytes(),
        .received_stderr = err_.total_bytes(),
        .counted_stdout = u ? u->stdout_bytes : 0,
        .counted_stderr = u ? u->stderr_bytes : 0,
        .stdout_open = stdout_open_,
        .stderr_open = stderr_open_,
        .since_start = duration_cast<milliseconds>(now - streams_wait_since_),
        .since_progress = duration_cast<milliseconds>(now - streams_last_progress_)};
    const guest_stream_bounds bounds{
        .stall = stream_stall,
        .max = std::max<milliseconds>(std::chrono::seconds(10),
                                      shared_->launcher->min_setup_budget() / 4)};
    const auto verdict = judge_guest_streams(st, bounds);
    if (verdict == guest_stream_verdict::wait) {
      stream_timer_.expires_after(std::chrono::milliseconds(100));
      stream_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
        if (!ec) self->check_guest_streams();
      });
      return;
    }
    awaiting_streams_ = false;
    guest_streams_settled_ = true;
    stream_timer_.cancel();
    if (!u) {
      log(log_level::warning, "guest agent: quiet without a usage report; stream counts unchecked");
    } else {
      auto judge = [&](const char* name, const stream_capture_buffer& cap, std::uint64_t counted,
                       std::uint64_t& missing) {
        if (cap.total_bytes() < counted) {
          missing = counted - cap.total_bytes();
          log(log_level::warning,
              fmt::format("guest agent: {} counted {} bytes, the host received {} ({})", name,
                          counted, cap.total_bytes(), to_string(verdict)));
        } else if (cap.total_bytes() > counted) {
          log(log_level::warning,
              fmt::format("guest agent: {} counted {} bytes, the host received {} (more)", name,
                          counted, cap.total_bytes()));
        }
      };
      judge("stdout", out_, u->stdout_bytes, stdout_missing_);
      judge("stderr", err_, u->stderr_bytes, stderr_missing_);
    }
    on_stream_quiet();
  }

  // The guest agent sent something its channel refused (a name, size or count out of
  // bounds, a frame out of order, a setup failure): the VM is not to be trusted with more.
  void agent_refused(const std::string& why) {
    log(log_level::error, "guest agent: " + why);
    if (!internal_error_) {
      internal_error_ = started_ ? "the microVM's guest agent failed or broke the protocol; the VM was destroyed"
                                 : "sandbox setup failed";
    }
    finish();
  }

  /// How fast a session's stderr is drained once past its capture cap (bytes per second; see
  /// read_stream). docs/protocol.md and sandbox/session.hpp name the same figure.
  static constexpr std::uint64_t session_stderr_drain_bytes_per_s = 1U << 20;

  void read_stream(asio::posix::stream_descriptor& d, stream_capture_buffer& cap, bool& open) {
    auto buf = std::make_shared<std::array<char, 65536>>();
    d.async_read_some(asio::buffer(*buf), [self = shared_from_this(), buf, &d, &cap, &open](
                                              boost::system::error_code ec, std::size_t n) {
      if (n > 0) cap.append(std::span<const char>(buf->data(), n));
      if (self->awaiting_streams_) self->check_guest_streams();  // wait_guest_streams
      if (ec) {
        if (ec != asio::error::operation_aborted) {
          open = false;
          self->maybe_end_after_exit();
        }
        return;
      }
      // A session's stderr past its capture cap is only discarded, for as long as the
      // session lives: it is drained at most `session_stderr_drain_bytes_per_s` (the
      // descriptor is parked for the time those bytes are worth), so a server flooding its
      // stderr costs the host a bounded share of a core, and blocks on its own pipe instead
      // (a chatty logger under that rate never waits). Runs drain at full speed: their
      // deadline bounds them.
      std::chrono::milliseconds pause(2);
      const bool throttled = self->session_ && &d == &self->stderr_ && cap.truncated() &&
                             !self->main_status_;
      if (throttled) {
        pause = std::chrono::milliseconds(
            std::max<std::uint64_t>(1, n * 1000 / session_stderr_drain_bytes_per_s));
      } else if (n >= 4096) {
        return self->read_stream(d, cap, open);
      }
      // A trickle (e.g. one byte per write): let it collect in the pipe for a moment instead
      // of waking the host for every write. The descriptor is taken out of the reactor
      // meanwhile (an edge-triggered epoll would otherwise wake on every write); the writer
      // only blocks if the pipe fills.
      // Once the program has exited there is no trickle to wait for: read on at once.
      if (self->main_status_) return self->read_stream(d, cap, open);
      const bool is_out = &d == &self->stdout_;
      int& parked = is_out ? self->stdout_parked_ : self->stderr_parked_;
      auto& t = is_out ? self->stdout_park_ : self->stderr_park_;
      parked = d.release();
      t.expires_after(pause);
      t.async_wait([self, &d, &cap, &open, &parked](boost::system::error_code) {
        if (parked < 0) return;  // teardown took it back
        d.assign(parked);
        parked = -1;
        if (!self->finishing_) self->read_stream(d, cap, open);
      });
    });
  }

  // The deadline or the exit grace ended the run. With a guest agent (microvm) the outputs
  // are still inside the guest: the agent is told to kill what is left of the run there and
  // send them (`finish`, core/guest_protocol.hpp); its `quiet` then ends the run, or — if it
  // does not come within a bounded time — the run ends without them. Every other run ends
  // now.
  void end_run() {
    if (finishing_) return;
    if (agent_ && started_ && !control_closed_ && !quiet_seen_ && !agent_finish_sent_) {
      agent_finish_sent_ = true;
      ip::init_header h{static_cast<ip::msg>(static_cast<std::uint32_t>(guest_protocol::msg::finish)), 0, 0};
      std::string packet(reinterpret_cast<const char*>(&h), sizeof h);
      if (send_packet(packet, {}) == 0) {
        agent_timer_.expires_after(shared_->launcher->min_setup_budget() / 4);
        agent_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
          if (!ec) self->finish();
        });
        return;
      }
    }
    finish();
  }

  void maybe_end_after_exit() {
    if (finishing_ || !main_status_) return;
    if (!stdout_open_ && !stderr_open_) {
      finish();
      return;
    }
    // A session's stdout is read by the host at its pace: the idle timer (and the lifetime)
    // bound the wait for its end instead of the grace — unless the host is closing it.
    if (session_ && !stdout_eof_ && !close_requested_) return;
    // Descendants still hold the pipes: they get `exit_grace`, then everything is killed.
    if (grace_armed_) return;
    grace_armed_ = true;
    grace_.expires_after(job_.policy.exit_grace);
    grace_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->end_run();
    });
  }

  void watch_notifications() {
    // Each notification costs the host a few system calls while the calling thread waits, so
    // a run gets at most `notify_burst` per `notify_window`; past that the host waits before
    // answering the next one (the sandboxed threads stay blocked, costing nothing).
    constexpr int notify_burst = 200;
    constexpr auto notify_window = std::chrono::milliseconds(100);
    auto now = clock::now();
    if (now - notify_window_start_ > notify_window) {
      notify_window_start_ = now;
      notify_count_ = 0;
    }
    if (++notify_count_ > notify_burst) {
      auto t = std::make_shared<asio::steady_timer>(strand_, notify_window_start_ + notify_window);
      t->async_wait([self = shared_from_this(), t](boost::system::error_code) {
        if (!self->finishing_) self->watch_notifications();
      });
      return;
    }
    listener_.async_wait(asio::posix::descriptor_base::wait_read,
                         [self = shared_from_this()](boost::system::error_code ec) {
                           if (ec || self->finishing_) return;
                           auto ev = handle_notification(self->listener_.native_handle(),
                                                         self->mem_cache_);
                           if (ev && ev->what == notify_event::kind::violation) {
                             if (!self->violation_) self->violation_ = ev->syscall;
                             self->finish();
                             return;
                           }
                           if (ev && ev->what == notify_event::kind::egress) {
                             self->record_egress(std::move(ev->attempt));
                           }
                           if (!ev) {
                             // Nothing pending: either a dead target, every filter user has
                             // exited (the listener then polls as hung up), or a wake-up
                             // with nothing behind it (handle_notification never receives
                             // then: a receive would block this thread). The last is
                             // re-armed after a moment, so it can never spin.
                             pollfd p{self->listener_.native_handle(), POLLIN, 0};
                             const int n = ::poll(&p, 1, 0);
                             if (n == 1 && (p.revents & POLLHUP) && !(p.revents & POLLIN)) return;
                             if (n == 0) {
                               auto t = std::make_shared<asio::steady_timer>(
                                   self->strand_, std::chrono::milliseconds(1));
                               t->async_wait([self, t](boost::system::error_code) {
                                 if (!self->finishing_) self->watch_notifications();
                               });
                               return;
                             }
                           }
                           self->watch_notifications();
                         });
  }

  // A network run: granted (admission checked the ticket and the request's egress list).
  bool network_granted() const noexcept {
    return !selftest_ && job_.admitted.request.network && !job_.admitted.request.egress.empty();
  }

  // Serves the run's egress proxy on `listener` (from sandbox-init, in the run's netns).
  void start_proxy(int listener) {
    const auto& o = shared_->ctx.egress;
    egress_grant g;
    g.domains = job_.admitted.request.egress;
    g.connect_ports = o.connect_ports;
    g.http_ports = o.http_ports;
    g.max_connections = o.max_connections;
    g.max_bytes_up = o.max_bytes_up;
    g.max_bytes_down = o.max_bytes_down;
    std::weak_ptr<init_run> weak = weak_from_this();
    proxy_ = egress_proxy::start(strand_, listener, std::move(g), shared_->resolver,
                                 [weak](egress_attempt a) {
                                   if (auto self = weak.lock()) self->record_egress(std::move(a));
                                 });
  }

  // Lists each distinct attempt once; repeats and attempts past the cap are only counted.
  void record_egress(egress_attempt a) {
    if (network_granted() && a.protocol != "https" && a.protocol != "http" && !a.allowed) {
      // Seen outside the proxy (seccomp notification, the DNS sink): refused even in a network run.
      a.reason = a.protocol == "dns" ? "DNS from inside is not allowed: use the proxy"
                                     : "direct connection not allowed: use the proxy";
    }
    for (const auto& e : egress_) {
      if (e == a) {
        ++egress_dropped_;
        return;
      }
    }
    if (egress_.size() >= max_egress_records) {
      ++egress_dropped_;
      return;
    }
    egress_.push_back(std::move(a));
  }

  void serve_dns() {
    dns_.async_wait(asio::posix::descriptor_base::wait_read,
                    [self = shared_from_this()](boost::system::error_code ec) {
                      if (ec || self->finishing_) return;
                      for (int i = 0; i < 64; ++i) {
                        std::array<std::uint8_t, 1500> pkt;
                        sockaddr_storage from{};
                        socklen_t fl = sizeof from;
                        ssize_t n = ::recvfrom(self->dns_.native_handle(), pkt.data(), pkt.size(),
                                               MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from),
                                               &fl);
                        if (n <= 0) break;
                        std::span<const std::uint8_t> q(pkt.data(), static_cast<std::size_t>(n));
                        // The run's own names (localhost, its hostname) never leave it: answered,
                        // not egress.
                        if (auto local = dns_local_response(q); !local.empty()) {
                          ::sendto(self->dns_.native_handle(), local.data(), local.size(),
                                   MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), fl);
                          continue;
                        }
                        if (auto name = dns_query_name(q)) {
                          self->record_egress({.protocol = "dns",
                                               .host = *name,
                                               .address = "",
                                               .port = 53,
                                               .allowed = false,
                                               .reason = "network disabled"});
                        }
                        auto resp = dns_refused_response(q);
                        if (!resp.empty()) {
                          ::sendto(self->dns_.native_handle(), resp.data(), resp.size(),
                                   MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), fl);
                        }
                      }
                      self->serve_dns();
                    });
  }

  void watch_oom() {
    oom_.async_wait(asio::posix::descriptor_base::wait_read,
                    [self = shared_from_this()](boost::system::error_code ec) {
                      if (ec || self->finishing_) return;
                      self->cgroup_->drain_oom_event_fd();
                      self->check_oom(0);
                      self->watch_oom();
                    });
  }

  // The notification comes when the OOM killer is invoked, which can be a moment before the
  // kill is counted: re-read the counter for a short while before concluding nothing died.
  void check_oom(int attempt) {
    if (finishing_) return;
    auto st = cgroup_->stats();
    if (st && st->oom_kills > 0) {
      // One OOM kill ends the whole run (v2 does this itself with memory.oom.group; v1
      // needs us), so results agree on every host.
      oom_triggered_ = true;
      finish();
      return;
    }
    if (attempt >= 50) return;
    auto t = std::make_shared<asio::steady_timer>(strand_, std::chrono::milliseconds(2));
    t->async_wait([self = shared_from_this(), t, attempt](boost::system::error_code ec) {
      if (!ec) self->check_oom(attempt + 1);
    });
  }

  void sample_memory() {
    if (finishing_ || !cgroup_) return;
    cgroup_->sample_memory();
    sample_timer_.expires_after(std::chrono::milliseconds(20));
    sample_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->sample_memory();
    });
  }

  // --- end ---------------------------------------------------------------------------------

  // Keeps the largest figures seen: a later read may find the cgroup removed (an OCI runtime
  // deletes it when it exits) or its counters no larger.
  void snapshot_stats() {
    if (!cgroup_) return;
    if (auto st = cgroup_->stats()) {
      stats_.oom_kills = std::max(stats_.oom_kills, st->oom_kills);
      stats_.cpu_usage_usec = std::max(stats_.cpu_usage_usec, st->cpu_usage_usec);
      stats_.peak_memory_bytes = std::max(stats_.peak_memory_bytes, st->peak_memory_bytes);
      stats_.peak_is_sampled = st->peak_is_sampled;
    }
    // A guest's own report (microvm): the host cgroup holds the VMM, whose figures are the
    // VM's; the program's are the guest cgroup's, as trustworthy as the guest kernel.
    if (agent_) {
      if (auto u = agent_->usage()) {
        stats_.oom_kills = std::max<std::uint64_t>(stats_.oom_kills, u->oom_kills);
        stats_.cpu_usage_usec = u->cpu_usec;
        stats_.peak_memory_bytes = u->memory_peak_bytes;
        stats_.peak_is_sampled = true;
      }
      return;
    }
    // The CPU time of processes that joined only the v1 hierarchies (crun and runsc on a
    // hybrid host: our figure comes from the unified cpu.stat).
    if (stats_.cpu_usage_usec == 0) {
      if (auto cpu = shared_->launcher->cpu_usage_usec(cgroup_path_)) stats_.cpu_usage_usec = *cpu;
    }
  }

  // sandbox-init (or the runtime around it) went away while the run was live and we had not
  // ended it: nothing the program can do causes that (PID 1 ignores its signals), so the
  // sandbox itself failed — e.g. gVisor's sentry died. Unless the main process had already
  // exited normally, the result says so instead of passing for the program's own end.
  void supervisor_lost() {
    if (!main_status_) supervisor_lost_ = true;
    finish();
  }

  void finish() {
    if (finishing_) return;
    finishing_ = true;
    ended_at_ = clock::now();
    for (auto* t : {&setup_timer_, &deadline_, &grace_, &sample_timer_, &idle_timer_, &close_timer_,
                    &agent_timer_, &stream_timer_}) {
      t->cancel();
    }
    // Usage and the OOM counter are read now, before the kill: once the run's processes are
    // gone an OCI runtime removes the container's cgroup (our run cgroup) as it exits.
    snapshot_stats();
    kill_now();
    teardown_deadline_ = clock::now() + job_.policy.teardown_budget;
    teardown_delay_ = std::chrono::milliseconds(1);
    poll_dead();
  }

  // Reaps sandbox-init if it has exited. True once it is reaped (or someone else's
  // waitpid(-1) took it: ECHILD). A dead but unreaped helper still pins its cgroup on v1.
  bool reap_helper() noexcept {
    std::lock_guard lock(kill_mu_);
    if (pidfd_raw_ < 0) return true;
    siginfo_t si{};
    int r = ::waitid(P_PIDFD, static_cast<id_t>(pidfd_raw_), &si, WEXITED | WNOHANG);
    if ((r < 0 && errno == ECHILD) || (r == 0 && si.si_pid != 0)) {
      ::close(pidfd_raw_);
      pidfd_raw_ = -1;
      return true;
    }
    return false;
  }

  void poll_dead() {
    if (dead_confirmed_) return;
    bool empty = true;
    if (cgroup_) {
      auto e = cgroup_->is_empty();
      empty = e && *e;
    }
    if (empty && reap_helper()) {
      dead_confirmed_ = true;
      return teardown();
    }
    if (empty && !helper_killed_ && clock::now() - ended_at_ > launched_exit_grace) {
      // The run's processes are gone but the process we launched (an OCI runtime) is not.
      std::lock_guard lock(kill_mu_);
      if (pidfd_raw_ >= 0) syscall(SYS_pidfd_send_signal, pidfd_raw_, SIGKILL, nullptr, 0);
      helper_killed_ = true;
      log(log_level::warning, "the launched process outlived the run's processes; killed");
    }
    if (clock::now() >= teardown_deadline_) {
      dead_confirmed_ = true;
      teardown_failed_ = true;
      shared_->left_for_reclaim = true;
      log(log_level::error, "processes of the run survived the kill past the teardown budget");
      return teardown();
    }
    kill_now();  // v1 without cgroup.kill: keep killing what appears
    teardown_timer_.expires_after(teardown_delay_);
    teardown_delay_ = std::min(teardown_delay_ * 2, std::chrono::milliseconds(50));
    teardown_timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->poll_dead();  // aborted: a later poll re-armed it (or it is done)
    });
  }

  void drain(asio::posix::stream_descriptor& d, stream_capture_buffer& cap) {
    if (!d.is_open()) return;
    std::array<char, 65536> buf;
    for (int i = 0; i < 4096; ++i) {  // bounded: at most a pipe's worth remains
      ssize_t n = ::read(d.native_handle(), buf.data(), buf.size());
      if (n <= 0) break;
      cap.append(std::span<const char>(buf.data(), static_cast<std::size_t>(n)));
    }
  }

  void fire_on_started() {
    if (!on_started_) return;
    auto f = std::move(on_started_);
    on_started_ = nullptr;
    f();
  }

  void teardown() {
    // A network run's proxy first: its connections end with the run, each recorded with its
    // final bytes before the result is made (waited for at most 2 s: a name lookup on the
    // host reports only when it returns; later records are dropped).
    if (proxy_ && !proxy_drained_) {
      if (proxy_stop_requested_) return;
      proxy_stop_requested_ = true;
      auto self = shared_from_this();
      auto resume = [self] {
        if (self->proxy_drained_) return;
        self->proxy_drained_ = true;
        self->teardown_timer_.cancel();
        self->teardown();
      };
      proxy_->stop([self, resume] { asio::dispatch(self->strand_, resume); });
      teardown_timer_.expires_after(std::chrono::seconds(2));
      teardown_timer_.async_wait([resume](boost::system::error_code ec) {
        if (!ec) resume();
      });
      return;
    }
    t_dead_ = clock::now();
    fire_on_started();  // never started: whoever waited for the start must not wait forever
    // Everything is dead: what is left in the pipes is final.
    for (auto [d, parked] : {std::pair{&stdout_, &stdout_parked_}, {&stderr_, &stderr_parked_}}) {
      if (*parked >= 0) {
        d->assign(*parked);
        *parked = -1;
      }
    }
    if (!session_) drain(stdout_, out_);  // a session's unread output is not kept
    drain(stderr_, err_);
    boost::system::error_code ignored;
    for (auto* d : {&ctl_, &stdout_, &stderr_, &listener_, &dns_, &oom_, &stdin_}) d->close(ignored);
    mem_cache_.clear();  // the run's /proc/<pid>/mem descriptors: gone before the result
    // sandbox-init is reaped by now (poll_dead), unless the teardown budget ran out: then it
    // is killed and reaped whenever it ends (never left a zombie).
    if (!reap_helper()) {
      std::lock_guard lock(kill_mu_);
      if (pidfd_raw_ >= 0) {
        syscall(SYS_pidfd_send_signal, pidfd_raw_, SIGKILL, nullptr, 0);
        reap_eventually(pidfd_raw_);
        pidfd_raw_ = -1;
      }
    }
    pidfd_desc_.close(ignored);

    if (!activated_.load()) {
      // A warm-pool instance that never got a run: nothing to collect or report.
      close_fd(out_dir_fd_);
      destroy();
      torn_down_ = true;
      if (on_prepared_) {
        auto f = std::move(on_prepared_);
        on_prepared_ = nullptr;
        f(false);
      } else if (on_lost_) {
        auto f = std::move(on_lost_);
        on_lost_ = nullptr;
        f();
      }
      return;
    }
    run_result r;
    if (!started_ && (out_.total_bytes() > 0 || err_.total_bytes() > 0)) {
      // Nothing of the program ran: what came through the pipes is the launcher's (an OCI
      // runtime's error names host paths). It goes to the host log, never into the result.
      std::string text = err_.summary() + out_.summary();
      while (!text.empty() && text.back() == '\n') text.pop_back();
      log(log_level::warning, "before the program started: " + text);
      out_ = stream_capture_buffer(job_.policy.stream_capture_bytes, job_.policy.summary_bytes);
      err_ = stream_capture_buffer(job_.policy.stream_capture_bytes, job_.policy.summary_bytes);
    }
    if (cgroup_) {
      snapshot_stats();
    }
    // Streams first: a program must not be able to crowd its own stdout/stderr out of the
    // tenant's quota with output files.
    store_stream(out_, r.std_out, "stdout");
    store_stream(err_, r.std_err, "stderr");
    note_guest_stream_shortfall(r);
    if (out_dir_fd_ >= 0 && !teardown_failed_) {
      collect_limits lim{job_.admitted.request.files_out.max_files,
                         job_.admitted.request.files_out.max_bytes};
      auto c = collect_outputs(out_dir_fd_, lim, *job_.blobs, job_.admitted.tenant,
                               shared_->ctx.log);
      r.files_out = std::move(c.files);
      r.files_dropped = std::move(c.dropped);
      // A guest's own drops (microvm): entries it kept in the VM. One list in name order, as
      // the collector makes it on the host levels.
      if (agent_) {
        auto guest = agent_->dropped();
        if (!guest.empty()) {
          r.files_dropped.insert(r.files_dropped.end(), std::make_move_iterator(guest.begin()),
                                 std::make_move_iterator(guest.end()));
          std::stable_sort(r.files_dropped.begin(), r.files_dropped.end(),
                           [](const dropped_file& a, const dropped_file& b) {
                             return a.name_display < b.name_display;
                           });
        }
      }
    }
    close_fd(out_dir_fd_);
    classify(r);
    if (!unstored_.empty()) {
      r.message += (r.message.empty() ? "" : "; ") + unstored_ +
                   " could not be stored (blob store quota or error)";
    }
    t_collected_ = clock::now();
    torn_down_ = true;
    if (done_) {
      // Removed before the result: the workspace, the uid and the cgroup — unless the kernel
      // still reports the (empty) cgroup busy; that one is retried after the result rather
      // than holding it back.
      const bool removed = destroy_once();
      t_destroyed_ = clock::now();
      auto done = std::move(done_);
      done_ = nullptr;
      done(std::move(r), std::move(detail_));
      log_teardown_breakdown(removed);
      if (!removed) destroy_after_result(1);
      return;
    }
    destroy();
    if (on_prepared_) {  // a pool instance that never became ready
      auto f = std::move(on_prepared_);
      on_prepared_ = nullptr;
      f(false);
    } else if (on_lost_) {  // a ready pool instance that died idle
      auto f = std::move(on_lost_);
      on_lost_ = nullptr;
      f();
    }
  }

  // Bytes a guest agent counted that never reached the capture (check_guest_streams): the
  // stream is flagged truncated (the result does not hold all of it) and the message says how
  // many bytes are missing. total_bytes stays what the host received.
  void note_guest_stream_shortfall(run_result& r) const {
    std::string note;
    for (auto [s, missing, name] : {std::tuple{&r.std_out, stdout_missing_, "stdout"},
                                    std::tuple{&r.std_err, stderr_missing_, "stderr"}}) {
      if (missing == 0) continue;
      s->truncated = true;
      note += fmt::format("{}{}: {} bytes the guest counted did not arrive",
                          note.empty() ? "" : "; ", name, missing);
    }
    if (!note.empty()) r.message += (r.message.empty() ? "" : "; ") + note;
  }

  void store_stream(const stream_capture_buffer& cap, stream_capture& s, const char* name) {
    s.summary = cap.summary();
    s.bytes = cap.stored().size();
    s.total_bytes = cap.total_bytes();
    s.truncated = cap.truncated();
    auto id = job_.blobs->put(job_.admitted.tenant, cap.stored());
    if (id) {
      s.blob = *id;
      return;
    }
    // Nothing stored: say so (no blob, no bytes) rather than pretend.
    log(log_level::warning, std::string("storing ") + name + " failed: " + id.error().message());
    s.blob.clear();
    s.bytes = 0;
    s.truncated = s.total_bytes > 0;
    unstored_ += unstored_.empty() ? name : std::string(" and ") + name;
  }

  void classify(run_result& r) {
    const auto& req = job_.admitted.request;
    r.run_id = job_.run_id;
    r.isolation = shared_->launcher->isolation();
    r.backend = shared_->launcher->describe();
    r.runtime = job_.admitted.runtime;
    r.timeout = req.timeout;
    r.memory_limit_bytes = req.memory_limit_bytes;
    r.timeout_clamped = job_.admitted.timeout_clamped;
    r.memory_clamped = job_.admitted.memory_clamped;
    r.oom_kills = static_cast<std::uint32_t>(stats_.oom_kills);
    r.usage.cpu = std::chrono::milliseconds(stats_.cpu_usage_usec / 1000);
    r.usage.peak_memory_bytes = stats_.peak_memory_bytes;
    if (started_) {
      r.usage.setup = std::chrono::milliseconds(ms_between(t0_, started_at_));
      auto end = main_status_ && main_exit_at_ < ended_at_ ? main_exit_at_ : ended_at_;
      r.usage.wall = std::chrono::milliseconds(std::max<std::int64_t>(0, ms_between(started_at_, end)));
    } else {
      r.usage.setup = std::chrono::milliseconds(ms_between(t0_, ended_at_));
    }
    r.egress_attempts = egress_;
    r.egress_attempts_dropped = egress_dropped_;
    if (main_status_) {
      int st = *main_status_;
      if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
      if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
    } else if (started_) {
      r.signal = SIGKILL;  // we killed it before it exited
    }

    if (blob_missing_) {
      r.code = sandbox::code::blob_not_found;
      r.message = fmt::format("files_in[{}].blob: blob not found", *blob_missing_);
      return;
    }
    if (teardown_failed_) {
      r.code = sandbox::code::internal;
      r.message = "sandbox teardown failed";
      return;
    }
    if (internal_error_) {
      r.code = sandbox::code::internal;
      r.message = *internal_error_;
      return;
    }
    if (cancelled_) {
      r.code = sandbox::code::internal;
      r.message = "run cancelled";
      return;
    }
    bool main_killed = !main_status_ || (WIFSIGNALED(*main_status_) && WTERMSIG(*main_status_) == SIGKILL);
    if (idle_timed_out_) {
      r.code = sandbox::code::timeout;
      r.message = fmt::format("idle for {} ms (no byte either way); all processes were killed",
                              sjob_.idle_timeout.count());
      return;
    }
    if (supervisor_lost_ && !timed_out_ && !(stats_.oom_kills > 0)) {
      log(log_level::error, "the sandbox's supervisor ended before the program did");
      r.code = sandbox::code::internal;
      r.message = "the sandbox ended unexpectedly before the program did; all processes were killed";
      return;
    }
    if (timed_out_) {
      r.code = sandbox::code::timeout;
      r.message = fmt::format("timed out after {} ms; all processes were killed", req.timeout.count());
    } else if (stats_.oom_kills > 0 && (oom_triggered_ || main_killed)) {
      r.code = sandbox::code::oom;
      r.message = fmt::format("memory limit of {} bytes exceeded; all processes were killed",
                              req.memory_limit_bytes);
    } else if (violation_) {
      r.code = sandbox::code::seccomp_violation;
      r.violation = violation_;
      r.message = fmt::format("forbidden system call '{}'; all processes were killed", *violation_);
    } else if (!egress_.empty() && !network_granted()) {
      r.code = sandbox::code::network_disabled;
      r.message = fmt::format("network access is disabled for this run; {} attempt(s) refused",
                              egress_.size() + egress_dropped_);
    } else {
      r.code = sandbox::code::ok;
    }
  }

  // Removes the workspace and the uid reservation, and the cgroup when it is confirmed empty
  // (a live process must not lose its limits). False while the kernel still reports the
  // empty cgroup busy (v1, for a moment after its last task is released): call again later.
  bool destroy_once() noexcept {
    std::lock_guard lock(kill_mu_);
    close_fd(image_lock_fd_);  // every process is dead: the image may go
    if (have_ws_ && !released_ && !teardown_failed_) {
      released_ = true;
      shared_->launcher->release(instance_id_, ws_);
    }
    if (have_ws_) {
      remove_tree(ws_.dir);
      have_ws_ = false;
    }
    if (have_uid_ && !teardown_failed_) {
      shared_->uids->release(uid_);
      have_uid_ = false;
    }
    if (cgroup_ && !teardown_failed_) {
      auto rm = cgroup_->remove();
      if (!rm && rm.error() == make_error_code(errc::busy)) return false;
      if (!rm) log(log_level::warning, "removing the run cgroup failed: " + rm.error().message());
      cgroup_.reset();
    }
    return true;
  }

  // A cgroup still busy after the retries is left to the next start's orphan reclaim.
  void give_up_cgroup() noexcept {
    std::lock_guard lock(kill_mu_);
    if (!cgroup_) return;
    log(log_level::warning, "removing the run cgroup failed: still busy; left for reclaim");
    shared_->left_for_reclaim = true;
    cgroup_.reset();
  }

  static constexpr int destroy_retries = 50;
  static constexpr auto destroy_retry_delay = std::chrono::milliseconds(2);

  // Synchronous removal (pool instances, emergency cleanup).
  void destroy() noexcept {
    for (int i = 0; !destroy_once(); ++i) {
      if (i >= destroy_retries) return give_up_cgroup();
      std::this_thread::sleep_for(destroy_retry_delay);
    }
  }

  // Removal of a cgroup still busy when the result went out (every process is confirmed
  // dead already): retried on a timer rather than by blocking an executor thread.
  void destroy_after_result(int attempt) {
    if (destroy_once()) return;
    if (attempt >= destroy_retries) return give_up_cgroup();
    teardown_timer_.expires_after(destroy_retry_delay);
    teardown_timer_.async_wait([self = shared_from_this(), attempt](boost::system::error_code) {
      self->destroy_after_result(attempt + 1);
    });
  }

  // The io_context went away with the run still in flight: kill and clean up synchronously.
  void emergency_cleanup() noexcept {
    if (!cgroup_ && !have_ws_ && pidfd_raw_ < 0) return;
    kill_now();
    if (pidfd_raw_ >= 0) syscall(SYS_pidfd_send_signal, pidfd_raw_, SIGKILL, nullptr, 0);
    auto until = clock::now() + std::chrono::seconds(2);
    while (!is_dead() && clock::now() < until) ::usleep(2000);
    if (pidfd_raw_ >= 0) {
      reap_eventually(pidfd_raw_);
      pidfd_raw_ = -1;
    }
    close_fd(out_dir_fd_);
    if (!is_dead()) {
      teardown_failed_ = true;
      shared_->left_for_reclaim = true;
    }
    destroy();
  }

  std::shared_ptr<backend_shared> shared_;
  asio::strand<asio::any_io_executor> strand_;
  run_job job_;
  bool selftest_;
  done_fn done_;
  run_detail detail_;

  stream_capture_buffer out_, err_;
  asio::posix::stream_descriptor ctl_, stdout_, stderr_, pidfd_desc_, listener_, dns_, oom_;
  asio::steady_timer setup_timer_, deadline_, grace_, teardown_timer_, sample_timer_;
  /// Bounds the wait for a guest agent's outputs after `finish` was sent (end_run).
  asio::steady_timer agent_timer_;
  /// Guest stream counts (wait_guest_streams): the wait's clock, and what it found.
  asio::steady_timer stream_timer_;
  bool awaiting_streams_ = false, guest_streams_settled_ = false;
  clock::time_point streams_wait_since_, streams_last_progress_;
  std::uint64_t streams_seen_ = 0;
  /// Bytes the guest counted on stdout / stderr that never reached the capture (0: none).
  std::uint64_t stdout_missing_ = 0, stderr_missing_ = 0;
  bool quiet_seen_ = false;         ///< stream mode: `quiet` arrived
  bool agent_finish_sent_ = false;  ///< the guest agent was told to end the run

  std::mutex kill_mu_;
  std::optional<run_cgroup> cgroup_;
  int pidfd_raw_ = -1;
  pid_t helper_pid_ = -1;
  std::uint32_t uid_ = 0;
  bool have_uid_ = false;
  run_workspace ws_;
  bool have_ws_ = false;
  std::string input_name_;
  bool stream_ = false;   ///< the launcher's stream_control()
  std::string ctl_in_;    ///< stream mode: bytes received, not yet a whole packet
  /// The guest agent's side of this run (microvm), or nullptr (launcher::make_agent_channel).
  std::unique_ptr<agent_channel> agent_;
  std::string cgroup_path_;  ///< the run cgroup's path inside each hierarchy
  std::string instance_id_;  ///< names the cgroup and workspace (the template's run id)
  int out_dir_fd_ = -1;
  bool released_ = false;  ///< the launcher's release() ran
  int image_lock_fd_ = -1;  ///< shared flock on the image's unpacked root while in use
  std::atomic<bool> ready_{false};      ///< sandbox-init is set up and waits for its program
  std::atomic<bool> activated_{false};  ///< the instance has its run
  bool torn_down_ = false;              ///< teardown finished (strand only)
  std::function<void(bool)> on_prepared_;
  std::function<void()> on_lost_;
  std::function<void()> on_started_;  ///< see activate()

  clock::time_point t0_, started_at_, main_exit_at_, ended_at_, teardown_deadline_;
  clock::time_point t_cgroup_, t_workspace_, t_spawned_, t_config_sent_;
  std::chrono::milliseconds teardown_delay_{1};
  bool started_ = false, finishing_ = false, grace_armed_ = false, control_closed_ = false;
  bool helper_exited_ = false;
  bool helper_killed_ = false;  ///< poll_dead gave up waiting for the launched process
  static constexpr auto launched_exit_grace = std::chrono::seconds(2);
  bool dead_confirmed_ = false;  ///< poll_dead found everything dead (or gave up): torn down
  bool stdout_open_ = true, stderr_open_ = true;
  int stdout_parked_ = -1, stderr_parked_ = -1;  ///< pipe fds out of the reactor for a moment
  asio::steady_timer stdout_park_, stderr_park_;  ///< when a parked pipe goes back (cancel: now)
  clock::time_point t_dead_, t_collected_, t_destroyed_;  ///< teardown breakdown (debug log)
  bool timed_out_ = false, oom_triggered_ = false, cancelled_ = false, teardown_failed_ = false;
  bool supervisor_lost_ = false;  ///< see supervisor_lost()
  std::optional<int> main_status_;
  std::optional<std::string> violation_;
  std::optional<std::string> internal_error_;
  std::optional<std::size_t> blob_missing_;
  std::vector<egress_attempt> egress_;
  std::uint32_t egress_dropped_ = 0;
  std::shared_ptr<egress_proxy> proxy_;  ///< network runs: the run's egress proxy
  bool proxy_stop_requested_ = false;    ///< teardown asked it to stop
  bool proxy_drained_ = false;           ///< it reported every session (or 2 s passed)
  notify_mem_cache mem_cache_;
  std::string unstored_;  ///< streams that could not be stored ("stdout and stderr")
  clock::time_point notify_window_start_{};
  int notify_count_ = 0;
  cgroup_stats stats_;

  // Session mode (strand only, except the atomics read by stats_snapshot()).
  bool session_ = false;
  session_job sjob_;
  asio::posix::stream_descriptor stdin_;  ///< write end of the program's stdin pipe
  /// Stream mode: the program's stdin is fed through the control stream (init_protocol.hpp)
  /// and still open; `stdin_sent_` bytes at the front of `stdin_buf_` are in flight (sent,
  /// not yet acknowledged: ≤ stdin_window).
  bool stdin_stream_open_ = false;
  std::size_t stdin_sent_ = 0;
  bool stdout_quiet_ = false;  ///< stream mode: `quiet` came (see read_after_quiet)
  std::string ctl_out_;        ///< stream mode: host → init bytes not yet taken by the socket
  bool ctl_out_waiting_ = false;
  int stdin_child_fd_ = -1;               ///< its read end, until sent with `go`
  std::string stdin_buf_;                 ///< accepted, not yet written (≤ capacity)
  std::uint32_t stdin_capacity_ = 0;
  bool stdin_flushing_ = false, stdin_close_requested_ = false;
  std::optional<pending_write> pending_write_;
  bool read_pending_ = false, stdout_eof_ = false;
  asio::steady_timer idle_timer_, close_timer_;
  clock::time_point last_activity_{};
  bool idle_timed_out_ = false, close_requested_ = false;
  std::optional<open_handler> open_handler_;
  std::shared_ptr<sandbox::session> open_session_;  ///< handed out by the open handler
  std::vector<close_handler> close_handlers_;
  std::optional<session_result> session_result_;
  std::shared_ptr<session_shared> session_shared_;
  std::atomic<std::uint64_t> bytes_to_server_{0}, bytes_from_server_{0};
  std::atomic<std::uint32_t> stdin_buffered_{0};
  std::atomic<bool> write_waiting_{false}, ended_{false};
};

/// The public face of a session run: forwards to its `init_run` while that lives (it keeps
/// itself alive by its pending operations until its end), then answers from what the run
/// left in `session_shared`. Destroying it kills the run.
class init_session final : public sandbox::session {
 public:
  init_session(std::weak_ptr<init_run> run, std::string id, std::shared_ptr<session_shared> s,
               asio::any_io_executor ex)
      : run_(std::move(run)), id_(std::move(id)), shared_(std::move(s)), ex_(std::move(ex)) {}
  ~init_session() override {
    if (auto r = run_.lock()) r->cancel();
  }
  const std::string& id() const noexcept override { return id_; }
  void close_stdin() override {
    if (auto r = run_.lock()) r->session_close_stdin();
  }
  session_stats stats() const override {
    if (auto r = run_.lock()) return r->stats_snapshot();
    std::lock_guard lock(shared_->mu);
    auto s = shared_->last;
    s.ended = true;
    return s;
  }

 private:
  void do_write(asio::const_buffer d, init_run::io_handler h) override {
    if (auto r = run_.lock()) return r->session_write(d, std::move(h));
    gone(std::move(h));
  }
  void do_read(asio::mutable_buffer b, init_run::io_handler h) override {
    if (auto r = run_.lock()) return r->session_read(b, std::move(h));
    gone(std::move(h));
  }
  void do_close(init_run::close_handler h) override {
    if (auto r = run_.lock()) return r->session_close(std::move(h));
    std::optional<session_result> res;
    {
      std::lock_guard lock(shared_->mu);
      res = shared_->result;
    }
    if (res) return sandbox::detail::post_completion(ex_, std::move(h), boost::system::error_code{}, *res);
    // The run went without a result: its execution context was destroyed, so there is no
    // executor to post to (every process was killed by the runtime's shutdown).
    session_result killed;
    killed.end = session_end::killed;
    killed.result.code = sandbox::code::internal;
    killed.result.message = "session killed (the runtime shut down)";
    std::move(h)(asio::error::operation_aborted, std::move(killed));
  }
  void gone(init_run::io_handler h) {
    bool have_result;
    {
      std::lock_guard lock(shared_->mu);
      have_result = shared_->result.has_value();
    }
    if (have_result) {
      return sandbox::detail::post_completion(ex_, std::move(h), boost::system::error_code(asio::error::operation_aborted), std::size_t{0});
    }
    std::move(h)(asio::error::operation_aborted, 0);
  }
  std::weak_ptr<init_run> run_;
  std::string id_;
  std::shared_ptr<session_shared> shared_;
  asio::any_io_executor ex_;
};

class init_backend final : public backend,
                              public std::enable_shared_from_this<init_backend> {
 public:
  explicit init_backend(std::shared_ptr<backend_shared> shared) : shared_(std::move(shared)) {}

  /// Creates the configured warm pools and starts filling them (asynchronously, on the
  /// runtime's executor). Classes whose runtime is unavailable, or whose limits no request
  /// could have under the policy, are logged and skipped.
  void start_pools() {
    std::lock_guard lock(mu_);
    const policy& pol = shared_->ctx.policy;
    for (const auto& cls : shared_->ctx.options.warm_pool) {
      if (cls.size == 0) continue;
      if (cls.memory_limit_bytes < pol.min_memory_bytes || cls.memory_limit_bytes > pol.max_memory_bytes ||
          cls.files_out.max_files > pol.max_output_files || cls.files_out.max_bytes > pol.max_output_bytes) {
        if (shared_->ctx.log) {
          shared_->ctx.log(log_level::warning, "warm pool for runtime '" + cls.runtime +
                                                   "' skipped: its limits are outside the policy");
        }
        continue;
      }
      auto resolved = shared_->ctx.resolve_runtime ? shared_->ctx.resolve_runtime(cls.runtime)
                                                   : std::nullopt;
      if (!resolved) {
        if (shared_->ctx.log) {
          shared_->ctx.log(log_level::warning,
                           "warm pool for runtime '" + cls.runtime + "' skipped: unavailable");
        }
        continue;
      }
      auto p = std::make_unique<pool_state>();
      p->cls = cls;
      p->tmpl.runtime = resolved->first;
      p->tmpl.rootfs = resolved->second;
      p->tmpl.policy = shared_->ctx.policy;
      p->tmpl.admitted.request.runtime = cls.runtime;
      p->tmpl.admitted.request.memory_limit_bytes = cls.memory_limit_bytes;
      p->tmpl.admitted.request.files_out = cls.files_out;
      p->tmpl.blobs = make_memory_blob_store(1);
      pools_.push_back(std::move(p));
    }
    for (auto& p : pools_) refill_locked(*p);
  }

  std::vector<pool_stats> warm_pool_stats() const override {
    std::lock_guard lock(mu_);
    std::vector<pool_stats> out;
    for (const auto& p : pools_) {
      out.push_back({.runtime = p->cls.runtime,
                     .memory_limit_bytes = p->cls.memory_limit_bytes,
                     .size = p->cls.size,
                     .ready = static_cast<std::uint32_t>(p->ready.size()),
                     .starting = p->starting,
                     .handed_out = p->handed_out,
                     .failed = p->failed});
    }
    return out;
  }

  sandbox::isolation isolation() const noexcept override {
    return shared_->launcher->isolation();
  }
  std::string_view name() const noexcept override { return shared_->launcher->name(); }

  void shutdown() noexcept override {
    std::vector<std::shared_ptr<init_run>> live;
    shared_->shutting_down = true;
    {
      std::lock_guard lock(mu_);
      shutting_down_ = true;
      for (auto& p : pools_) p->ready.clear();  // idle instances die with the kill below
      for (auto& [id, w] : runs_) {
        if (auto r = w.lock()) live.push_back(std::move(r));
      }
    }
    for (auto& r : live) r->kill_now();
    auto until = clock::now() + std::chrono::seconds(5);
    for (auto& r : live) {
      while (!r->is_dead() && clock::now() < until) ::usleep(2000);
    }
    shared_->launcher->drain();
  }

  /// Runs the self-test on a private io_context. Empty string when it passed.
  std::string self_test(const std::filesystem::path& empty_root) {
    asio::io_context io;
    run_job job;
    job.run_id = "selftest-" + random_hex(4);
    job.admitted.tenant = "selftest";
    job.admitted.request.runtime = "selftest";
    job.admitted.request.timeout = std::chrono::milliseconds(5000);
    job.admitted.request.memory_limit_bytes = 64ULL << 20;
    job.rootfs = empty_root;
    job.blobs = make_memory_blob_store(64ULL << 20);
    job.runtime.source_name = "probe";
    job.policy = sandbox::policy{};
    auto run = std::make_shared<init_run>(shared_, io.get_executor(), std::move(job), true);
    std::string reason = "self-test did not complete";
    run->start([&](run_result r, run_detail d) {
      // Egress evidence: the DNS sink recorded the probe's query, and — with user
      // notification — the seccomp record has its UDP connect to 192.0.2.1.
      auto recorded = [&](std::string_view proto, std::string_view host, std::string_view addr) {
        return std::any_of(r.egress_attempts.begin(), r.egress_attempts.end(), [&](const auto& a) {
          return a.protocol == proto && a.host == host && a.address == addr;
        });
      };
      const bool evidence = recorded("dns", "probe.invalid", "") &&
                            (shared_->launcher->stream_control() || recorded("udp", "", "192.0.2.1"));
      if (r.code == sandbox::code::network_disabled && r.exit_code == 0 &&
          r.std_out.summary == "probe ok\n" && evidence) {
        reason.clear();
        return;
      }
      if (!d.text.empty()) {
        reason = d.text;
      } else if (!r.std_err.summary.empty()) {
        reason = r.std_err.summary;
        while (!reason.empty() && reason.back() == '\n') reason.pop_back();
      } else {
        reason = fmt::format("probe ended with code {} (exit {}, egress recorded: {})",
                             to_string(r.code), r.exit_code.value_or(-1),
                             r.egress_attempts.size());
      }
    });
    run.reset();
    io.run_for(std::max<std::chrono::milliseconds>(std::chrono::seconds(30),
                                                   shared_->launcher->min_setup_budget() + std::chrono::seconds(20)));
    return reason;
  }

 private:
  struct pool_state {
    warm_pool_class cls;
    run_job tmpl;  ///< the limits class: runtime, rootfs, policy, memory, files_out
    std::deque<std::shared_ptr<init_run>> ready;
    std::uint32_t starting = 0;
    std::uint64_t handed_out = 0, failed = 0;
    std::uint32_t consecutive_failures = 0;
    bool retry_scheduled = false;
  };

  bool matches(const pool_state& p, const run_job& job) const {
    const auto& req = job.admitted.request;
    // A network run of a launcher that makes its namespace at launch goes cold.
    if (req.network && shared_->launcher->makes_network_namespace()) return false;
    // Pools are prepared with the policy's own limits and a runtime's argv: a registered
    // tool or a run under a workload profile goes cold.
    if (!req.tool.empty() || !job.admitted.profile.empty()) return false;
    return job.runtime.name == p.cls.runtime &&
           req.memory_limit_bytes == p.cls.memory_limit_bytes &&
           req.files_out == p.cls.files_out;
  }

  void track_locked(const std::shared_ptr<init_run>& run) {
    for (auto it = runs_.begin(); it != runs_.end();) {
      it = it->second.expired() ? runs_.erase(it) : std::next(it);
    }
    runs_[run->run_id()] = run;
  }

  // Starts preparing instances until ready + starting reaches the pool's size (at most two
  // in flight per pool, so refills never starve live runs of the host's cores).
  void refill_locked(pool_state& p) {
    if (shutting_down_ || p.retry_scheduled) return;
    if (p.consecutive_failures >= 3) {
      // Something is wrong on this host right now: retry later instead of spinning.
      p.retry_scheduled = true;
      auto t = std::make_shared<asio::steady_timer>(shared_->ctx.executor, std::chrono::seconds(5));
      t->async_wait([weak = weak_from_this(), pp = &p, t](boost::system::error_code ec) {
        auto self = weak.lock();
        if (ec || !self) return;
        std::lock_guard lock(self->mu_);
        pp->retry_scheduled = false;
        pp->consecutive_failures = 0;
        self->refill_locked(*pp);
      });
      return;
    }
    while (p.ready.size() + p.starting < p.cls.size && p.starting < 2) {
      ++p.starting;
      run_job job = p.tmpl;
      job.run_id = "w" + random_hex(8);
      auto inst = std::make_shared<init_run>(shared_, shared_->ctx.executor, std::move(job),
                                                false);
      track_locked(inst);
      std::weak_ptr<init_run> winst = inst;
      auto weak = weak_from_this();
      inst->prepare_pooled(
          [weak, pp = &p, winst](bool ok) {
            auto self = weak.lock();
            if (!self) return;
            std::lock_guard lock(self->mu_);
            --pp->starting;
            auto i = winst.lock();
            if (ok && i && !self->shutting_down_) {
              pp->ready.push_back(std::move(i));
              pp->consecutive_failures = 0;
            } else if (!ok) {
              ++pp->failed;
              ++pp->consecutive_failures;
            }
            self->refill_locked(*pp);
          },
          [weak, pp = &p, winst] {
            auto self = weak.lock();
            if (!self) return;
            std::lock_guard lock(self->mu_);
            auto i = winst.lock();
            auto it = std::find(pp->ready.begin(), pp->ready.end(), i);
            if (it != pp->ready.end()) pp->ready.erase(it);
            ++pp->failed;
            self->refill_locked(*pp);
          });
    }
  }

  // A ready, healthy instance of a matching pool (one-shot: it leaves the pool for good), and
  // in `from` its pool, which the caller refills once the run has started. Without one, the
  // matching pool refills now.
  std::shared_ptr<init_run> take_pooled(const run_job& job, pool_state*& from) {
    std::lock_guard lock(mu_);
    for (auto& p : pools_) {
      if (!matches(*p, job)) continue;
      std::shared_ptr<init_run> got;
      while (!p->ready.empty() && !got) {
        auto c = std::move(p->ready.front());
        p->ready.pop_front();
        if (c->is_ready_idle()) {
          got = std::move(c);
          ++p->handed_out;
        } else {
          ++p->failed;  // failed its health check: destroyed, never handed out
          c->cancel();
        }
      }
      if (got) {
        from = p.get();
      } else {
        refill_locked(*p);
      }
      return got;
    }
    return nullptr;
  }

  void do_execute(run_job job, handler_type handler) override {
    auto ex = job.executor ? job.executor : shared_->ctx.executor;
    pool_state* from = nullptr;
    std::shared_ptr<init_run> run = take_pooled(job, from);
    const bool pooled = run != nullptr;
    if (!pooled) {
      run = std::make_shared<init_run>(shared_, ex, job, false);
      std::lock_guard lock(mu_);
      track_locked(run);
    }
    auto slot = asio::get_associated_cancellation_slot(handler);
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    if (slot.is_connected()) {
      std::weak_ptr<init_run> weak = run;
      slot.assign([weak, cancelled](asio::cancellation_type) {
        cancelled->store(true);
        if (auto r = weak.lock()) r->cancel();
      });
    }
    auto h = std::make_shared<handler_type>(std::move(handler));
    auto done = [h, cancelled](run_result r, run_detail) mutable {
      auto slot = asio::get_associated_cancellation_slot(*h);
      if (slot.is_connected()) slot.clear();
      auto ex = asio::get_associated_executor(*h);
      boost::system::error_code ec;
      if (cancelled->load()) ec = asio::error::operation_aborted;
      asio::dispatch(ex, [h, ec, r = std::move(r)]() mutable { std::move(*h)(ec, std::move(r)); });
    };
    if (pooled) {
      run->activate(std::move(job), std::move(done), [weak = weak_from_this(), from] {
        auto self = weak.lock();
        if (!self) return;
        std::lock_guard lock(self->mu_);
        self->refill_locked(*from);
      });
    } else {
      run->start(std::move(done));
    }
  }

  void open_session(run_job job, session_job sj, session_handler handler) override {
    // (A stream control channel carries the stdin bytes themselves: init_protocol.hpp.)
    auto ex = job.executor ? job.executor : shared_->ctx.executor;
    auto run = std::make_shared<init_run>(shared_, ex, std::move(job), false);
    {
      std::lock_guard lock(mu_);
      track_locked(run);
    }
    auto state = std::make_shared<session_shared>();
    auto s = std::make_shared<init_session>(run, run->run_id(), state, ex);
    run->start_session(std::move(sj), std::move(s), std::move(state), std::move(handler));
  }

  std::shared_ptr<backend_shared> shared_;
  mutable std::mutex mu_;
  std::map<std::string, std::weak_ptr<init_run>> runs_;
  std::vector<std::unique_ptr<pool_state>> pools_;
  bool shutting_down_ = false;
};

// Reclaims cgroups and work dirs of hosts that died: an instance is dead when its lock file
// in this state directory can be locked (flock is released when its process dies). Cgroups
// of instances without a lock here belong to hosts using another state directory (possibly
// alive): they are left alone.
void reclaim_orphans(const backend_shared& s) {
  auto instances = s.ctx.state_dir / "instances";
  // 1 dead, 0 alive, -1 unknown (no lock file here).
  auto liveness = [&](const std::string& inst) {
    if (inst == s.instance_id) return 0;
    auto lock = instances / (inst + ".lock");
    int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    bool dead = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    return dead ? 1 : 0;
  };
  auto is_dead = [&](const std::string& inst) { return liveness(inst) == 1; };
  std::set<std::string> dead;
  for (const auto& name : s.cgroups->list()) {
    // r-<instance>-<run>
    if (name.size() < 3 || name.compare(0, 2, "r-") != 0) continue;
    auto dash = name.find('-', 2);
    if (dash == std::string::npos) continue;
    std::string inst = name.substr(2, dash - 2);
    if (!is_dead(inst)) continue;
    dead.insert(inst);
    if (auto d = s.cgroups->destroy(name); !d && s.ctx.log) {
      s.ctx.log(log_level::warning, "could not reclaim orphaned cgroup " + name);
    } else if (s.ctx.log) {
      s.ctx.log(log_level::info, "reclaimed orphaned cgroup " + name);
    }
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(s.ctx.state_dir / "runs", ec)) {
    std::string inst = e.path().filename().string();
    if (liveness(inst) != 0) {  // every live instance of this state dir holds its lock
      // A launcher's host mount in a work dir (the OCI output tmpfs) goes first: the removal
      // never crosses into another filesystem.
      for (const auto& run : std::filesystem::directory_iterator(e.path(), ec)) {
        ::umount2((run.path() / "out").c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
      }
      remove_tree(e.path());
      dead.insert(inst);
    }
  }
  s.launcher->reclaim([&](const std::string& inst) { return liveness(inst) == 0; });
  for (const auto& inst : dead) ::unlink((instances / (inst + ".lock")).c_str());
}

}  // namespace

int open_init_executable(const std::filesystem::path& path) {
  if (!path.empty()) return ::open(path.c_str(), O_PATH | O_CLOEXEC);
#ifndef SANDBOX_HAS_INIT_IMAGE
  return -1;  // no backend that needs it was built in
#else
  int fd = static_cast<int>(memfd_create("sandbox-init", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) return -1;
  const char* p = sandbox_init_image_begin;
  std::size_t left = static_cast<std::size_t>(sandbox_init_image_end - sandbox_init_image_begin);
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n <= 0) {
      ::close(fd);
      return -1;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
#endif
}


sandbox_size_set sandbox_sizes(const run_job& job) {
  const auto& req = job.admitted.request;
  const std::uint64_t mem = req.memory_limit_bytes;
  // tmpfs treats size=0 as "unlimited": every size has a floor.
  auto tmpfs_size = [](std::uint64_t want, std::uint64_t cap) {
    return std::max<std::uint64_t>(std::min(want, cap), 64 * 1024);
  };
  sandbox_size_set s;
  s.tmp_bytes = tmpfs_size(job.policy.tmp_bytes, mem / 8);
  s.home_bytes = tmpfs_size(job.policy.home_bytes, mem / 8);
  s.shm_bytes = tmpfs_size(job.policy.shm_bytes, mem / 8);
  s.out_bytes = tmpfs_size(req.files_out.max_bytes + (1 << 20), mem / 4);
  s.tmpfs_inodes = job.policy.tmpfs_inodes;
  s.out_inodes = std::max<std::uint32_t>(req.files_out.max_files * 2, 64) + 16;
  s.nofile = job.policy.max_open_files;
  s.fsize_bytes = std::uint64_t{1} << 30;
  return s;
}

namespace {

// The operator's pinned names (trusted answers), then the host's resolver for the rest.
class pinned_then_system_resolver final : public egress_resolver {
 public:
  pinned_then_system_resolver(std::shared_ptr<egress_resolver> pinned,
                              std::set<std::string> pinned_names,
                              std::shared_ptr<egress_resolver> system)
      : pinned_(std::move(pinned)), names_(std::move(pinned_names)), system_(std::move(system)) {}
  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    auto canonical = canonical_egress_pattern(host);
    if (canonical && names_.contains(*canonical)) return pinned_->async_resolve(*canonical, std::move(done));
    system_->async_resolve(host, std::move(done));
  }

 private:
  std::shared_ptr<egress_resolver> pinned_;
  std::set<std::string> names_;
  std::shared_ptr<egress_resolver> system_;
};

// The operator's resolver function (egress_proxy_options::resolver): its answers are not
// pinned, so the proxy checks their addresses; unparsable entries are dropped.
class function_resolver final : public egress_resolver {
 public:
  using fn = std::function<void(const std::string&, std::function<void(std::vector<std::string>)>)>;
  explicit function_resolver(fn f) : f_(std::move(f)) {}
  void async_resolve(const std::string& host,
                     std::function<void(boost::system::error_code, answer)> done) override {
    auto once = std::make_shared<std::atomic<bool>>(false);
    auto call = [done = std::move(done), once](std::vector<std::string> addresses) {
      if (once->exchange(true)) return;
      answer a;
      for (const auto& t : addresses) {
        boost::system::error_code ec;
        auto addr = asio::ip::make_address(t, ec);
        if (!ec) a.addresses.push_back(addr);
      }
      const auto ec = a.addresses.empty() ? make_error_code(asio::error::host_not_found)
                                          : boost::system::error_code();
      done(ec, std::move(a));
    };
    try {
      auto canonical = canonical_egress_pattern(host);  // the form the operator configured
      f_(canonical ? *canonical : host, std::move(call));
    } catch (...) {
      // An operator's resolver that throws answers nothing.
    }
  }

 private:
  fn f_;
};

}  // namespace

std::variant<std::shared_ptr<egress_resolver>, std::string> make_egress_resolver(
    asio::any_io_executor ex, const std::map<std::string, std::vector<std::string>>& pinned,
    std::function<void(const std::string&, std::function<void(std::vector<std::string>)>)> fallback) {
  std::map<std::string, std::vector<asio::ip::address>> names;
  for (const auto& [name, addresses] : pinned) {
    auto canonical = canonical_egress_pattern(name);
    if (!canonical || canonical->starts_with("*.")) {
      return fmt::format("egress.pinned_hosts: {} is not a host name",
                         detail::quote_for_message(name));
    }
    auto& out = names[*canonical];
    for (const auto& a : addresses) {
      boost::system::error_code ec;
      auto addr = asio::ip::make_address(a, ec);
      if (ec) {
        return fmt::format("egress.pinned_hosts[{}]: {} is not an IP address",
                           detail::quote_for_message(name), detail::quote_for_message(a));
      }
      out.push_back(addr);
    }
    if (out.empty()) {
      return fmt::format("egress.pinned_hosts[{}]: no address", detail::quote_for_message(name));
    }
  }
  std::set<std::string> keys;
  for (const auto& [n, _] : names) keys.insert(n);
  std::shared_ptr<egress_resolver> rest =
      fallback ? std::make_shared<function_resolver>(std::move(fallback)) : make_system_resolver(ex);
  return std::make_shared<pinned_then_system_resolver>(make_static_resolver(std::move(names)),
                                                       std::move(keys), std::move(rest));
}

std::variant<std::shared_ptr<backend>, std::string> make_init_backend(
    const init_backend_context& ctx_in, std::shared_ptr<init_launcher> launcher) {
  auto shared = std::make_shared<backend_shared>();
  shared->ctx = ctx_in;
  shared->launcher = launcher;
  const bool root = ::geteuid() == 0;
  if (!root && !launcher->unprivileged()) {
    return std::string(launcher->name()) + " needs root on this host";
  }
  shared->userns = !root;
  // Each backend keeps its own state below the runtime's state dir (its locks, work dirs).
  if (launcher->isolation() != sandbox::isolation::process) {
    shared->ctx.state_dir = ctx_in.state_dir / std::string(launcher->name());
  }
  const auto& ctx = shared->ctx;

  // State directory, instance lock, run dirs.
  std::error_code ec;
  std::filesystem::create_directories(ctx.state_dir / "instances", ec);
  std::filesystem::create_directories(ctx.state_dir / "runs", ec);
  if (ec) return "state directory " + ctx.state_dir.string() + " cannot be created";
  ::chmod(ctx.state_dir.c_str(), 0711);
  ::chmod((ctx.state_dir / "runs").c_str(), 0700);
  shared->instance_id = random_hex(6);
  auto lock_path = ctx.state_dir / "instances" / (shared->instance_id + ".lock");
  shared->instance_lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (shared->instance_lock_fd < 0 || ::flock(shared->instance_lock_fd, LOCK_EX | LOCK_NB) < 0) {
    return "cannot create the instance lock in the state directory";
  }
  shared->instance_lock_path = lock_path;
  launcher->set_backend_instance(shared->instance_id);
  shared->runs_dir = ctx.state_dir / "runs" / shared->instance_id;
  {
    auto resolver = make_egress_resolver(ctx.executor, ctx.egress.pinned_hosts, ctx.egress.resolver);
    if (auto* why = std::get_if<std::string>(&resolver)) return *why;
    shared->resolver = std::get<std::shared_ptr<egress_resolver>>(resolver);
  }

  // cgroups.
  std::string parent = ctx.options.cgroup_parent;
  if (parent.empty()) {
    if (!root) {
      return "cgroup parent not configured: an unprivileged host needs a delegated cgroup "
             "subtree (process_backend_options.cgroup_parent)";
    }
    parent = "/agent-sandbox";
  }
  std::string why;
  auto host = cgroup_host::open(ctx.options.cgroup_root, ctx.mountinfo, parent, &why);
  if (!host) return why.empty() ? "cgroups unusable: " + host.error().message() : why;
  // Proved, not assumed: limits written to a run cgroup read back as written. Named like a
  // run of this instance, so that a crash in between leaves it to the next start's reclaim.
  if (auto v = host->verify_limits("r-" + shared->instance_id + "-limits-test", &why); !v) {
    return why.empty() ? "cgroup limits unverifiable: " + v.error().message() : why;
  }
  shared->cgroups.emplace(std::move(*host));
  shared->cgroup_parent = parent;

  if (!shared->userns) {
    // One uid range for every backend of this state dir: the lock file is shared.
    auto pool = uid_pool::open(ctx_in.state_dir / "uids.lock", ctx.options.uid_base,
                               ctx.options.uid_count);
    if (!pool) return "uid pool: " + pool.error().message();
    shared->uids = std::move(*pool);
  }

  reclaim_orphans(*shared);

  auto be = std::make_shared<init_backend>(shared);
  auto empty_root = ctx.state_dir / "selftest-root";
  std::filesystem::create_directories(empty_root, ec);
  std::string reason = be->self_test(empty_root);
  if (!reason.empty()) return std::string(launcher->name()) + " backend self-test failed: " + reason;
  be->start_pools();
  if (ctx.log) {
    ctx.log(log_level::info, fmt::format("{} backend ready ({})", launcher->describe(),
                                         shared->cgroups->describe()));
  }
  return std::shared_ptr<backend>(be);
}

}  // namespace sandbox::detail
