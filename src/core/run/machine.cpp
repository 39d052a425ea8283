// The run machine of every backend built on sandbox-init (machine.hpp): the process
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
#include "core/run/machine.hpp"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
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

#include <algorithm>
#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <thread>

#include "core/egress/egress_proxy.hpp"
#include "core/egress/secret_scan.hpp"
#include "core/run/capture.hpp"
#include "core/run/cgroup.hpp"
#include "core/run/collector.hpp"
#include "core/run/control_channel.hpp"
#include "core/run/egress_wiring.hpp"
#include "core/run/evidence.hpp"
#include "core/run/evidence_watchers.hpp"
#include "core/run/guest_link.hpp"
#include "core/run/guest_streams.hpp"
#include "core/run/init_events.hpp"
#include "core/run/init_messages.hpp"
#include "core/run/orphan_reclaim.hpp"
#include "core/run/pool_instance.hpp"
#include "core/run/result_assembler.hpp"
#include "core/run/run_clock.hpp"
#include "core/run/run_resources.hpp"
#include "core/run/run_session.hpp"
#include "core/run/run_setup.hpp"
#include "core/run/seccomp_notify.hpp"
#include "core/run/self_test.hpp"
#include "core/run/session_front.hpp"
#include "core/run/stream_reader.hpp"
#include "core/run/uid_pool.hpp"
#include "core/run/warm_pool.hpp"
#include "core/run/workspace.hpp"
#include "embedded/sandbox_init.hpp"
#include "protocol/text_util.hpp"
#include "sandbox/egress.hpp"
#include "sys/confirmed_wait.hpp"
#include "sys/io.hpp"
#include "sys/pidfd.hpp"
#include "sys/random.hpp"
#include "sys/spawn.hpp"
#include "wire/dns_sink.hpp"
#include "wire/guest_protocol.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {
namespace {

namespace asio = boost::asio;
namespace ip = init_protocol;
using clock = std::chrono::steady_clock;
using handler_type = asio::any_completion_handler<void(boost::system::error_code, run_result)>;

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

/// Everything the backend shares with its runs.
struct backend_shared {
  run_machine_context ctx;
  std::shared_ptr<detail::launcher> launcher;
  launcher_traits traits;  ///< the launcher's, read once
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

/// Host-only details of a run, kept beside the result (the result's message is sanitized).
struct run_detail {
  std::string text;
};

/**
 * One run: the state machine of its life (prepare, launch, watch, end, teardown, result) on
 * its strand, wiring together the objects that own the parts — run_setup (steps 0–5, config,
 * staging, go), run_resources (what the run holds on the host; kill and removal),
 * control_channel, stream_reader (stdout, stderr), evidence_watchers, guest_link (microvm),
 * egress_wiring (network runs), session_front (session mode), pool_instance (warm pools) and
 * result_assembler. The run keeps the evidence (`ev_`) and the timestamps (`times_`).
 *
 * Concurrency, as the objects carry it:
 * - Everything runs on `strand_`, except `cancel` (posted to it), `kill_now` and `is_dead`
 *   (any thread: run_resources takes its kill mutex around the cgroup and the pidfd, so a
 *   kill never races the teardown), `is_ready_idle` (pool_instance's atomics, read under
 *   the pool's lock) and a session's figures (session_stdio's atomics).
 * - A run is kept alive by its own pending operations only: each timer wait and each call
 *   dispatched to the strand holds a shared_ptr to it (here, in session_front, guest_link
 *   and egress_wiring's drain); each reader and watcher holds the weak owner and locks it
 *   per wait (control_channel, stream_reader, evidence_watchers, run_resources' polls).
 *   The objects' hooks call back into this run: they are members, so they never outlive it.
 * - The destructor runs with the run in flight only when its io_context went away: the
 *   egress proxy is stopped and run_resources' emergency_cleanup kills and removes
 *   everything synchronously.
 */
class init_run : public std::enable_shared_from_this<init_run>, private init_events {
 public:
  using done_fn = std::function<void(run_result, run_detail)>;

  init_run(std::shared_ptr<backend_shared> shared, asio::any_io_executor ex, run_job job,
           bool selftest)
      : shared_(std::move(shared)),
        strand_(asio::make_strand(ex)),
        job_(std::move(job)),
        selftest_(selftest),
        resources_(strand_,
                   {.uids = shared_->uids.get(),
                    .kill_launched_process = shared_->traits.kill_launched_process,
                    .left_for_reclaim = &shared_->left_for_reclaim,
                    .log = [this](log_level l, const std::string& line) { log(l, line); }}),
        ctl_(strand_, shared_->traits.stream_control),
        streams_(strand_, job_.policy.stream_capture_bytes, job_.policy.summary_bytes),
        watch_(strand_),
        clock_(strand_, std::max(job_.policy.setup_budget, shared_->traits.min_setup_budget)),
        guest_(strand_, shared_->traits.min_setup_budget),
        proxy_(strand_),
        result_([this](log_level l, const std::string& line) { log(l, line); }),
        session_(strand_, shared_->traits.stream_control, ctl_, streams_.out()) {}

  ~init_run() {
    proxy_.stop();  // (normally stopped at teardown already; idempotent)
    // The io_context went away with the run still in flight: kill and clean up synchronously.
    result_.close_output_dir();
    resources_.emergency_cleanup();
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
  void prepare_pooled(std::function<void(bool, const prepare_failure&)> on_prepared,
                      std::function<void()> on_lost) {
    asio::post(strand_, [self = shared_from_this(), on_prepared = std::move(on_prepared),
                         on_lost = std::move(on_lost)]() mutable {
      self->pool_.expect(std::move(on_prepared), std::move(on_lost));
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
    asio::dispatch(strand_, [self = shared_from_this(), job = std::move(job),
                             done = std::move(done), on_started = std::move(on_started)]() mutable {
      self->times_.t0 = clock::now();  // a pooled run's setup starts at hand-out
      self->pool_.hand_out(std::move(on_started));
      self->activate_on_strand(std::move(job), std::move(done));
    });
  }

  /// True while the instance is ready and idle (not handed out, not failing).
  bool is_ready_idle() const noexcept { return pool_.is_ready_idle(); }

  /// The hand-out health check beyond `is_ready_idle` (any thread, after `ready`): a
  /// pre-started instance's interpreter is still alive — its cgroup still holds a second
  /// live process besides sandbox-init (cgroup.procs lists no exited process). An instance
  /// whose interpreter died is never handed out, even before sandbox-init has reported it.
  /// Where the host's cgroup does not list the sandbox's processes (gvisor:
  /// `launcher_traits::host_cgroup_lists_processes`) there is no such evidence: the check
  /// passes, and an idle interpreter's death is known from sandbox-init's report alone.
  bool passes_health_check() const noexcept {
    if (!job_.prestart) return true;
    if (!shared_->traits.host_cgroup_lists_processes) return true;
    if (procs_path_.empty()) return false;
    const int fd = ::open(procs_path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[256];
    int lines = 0;
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      lines += static_cast<int>(std::count(buf, buf + n, '\n'));
    }
    ::close(fd);
    return lines >= 2;
  }

  /// Cancels the run from any thread (posted to the strand).
  void cancel() {
    asio::post(strand_, [self = shared_from_this()] {
      self->ev_.cancelled = true;
      self->finish();
    });
  }

  /// Kills every process of the run right now, from any thread (runtime shutdown). Safe
  /// against the run tearing down concurrently.
  void kill_now() noexcept { resources_.kill_now(); }

  /// True once every process is confirmed dead (or the run never started one).
  bool is_dead() noexcept { return resources_.is_dead(); }

  const std::string& run_id() const noexcept { return job_.run_id; }

  // --- session mode (sandbox/session.hpp): the session front (session_front.hpp) ----------

  /// Starts a cold run in session mode. `opened` completes once the program started (with
  /// `session`) or the run ended before (without).
  void start_session(session_job sj, std::shared_ptr<sandbox::session> session,
                     std::shared_ptr<session_shared> shared, session_front::open_handler opened) {
    asio::dispatch(
        strand_, [self = shared_from_this(), sj = std::move(sj), session = std::move(session),
                  shared = std::move(shared), opened = std::move(opened)]() mutable {
          // The front's hooks call back into this run: the front is a member, so they never
          // outlive it; its pending timers hold the run (the owner) themselves.
          init_run* me = self.get();
          me->session_.begin(std::move(sj), std::move(session), std::move(shared),
                             std::move(opened), me->job_.executor, me->job_.policy.exit_grace, self,
                             {.finish = [me] { me->finish(); },
                              .maybe_end_after_exit = [me] { me->maybe_end_after_exit(); },
                              .ending = [me] { return me->finishing_ || me->torn_down_; },
                              .main_exited = [me] { return me->ev_.main_status.has_value(); },
                              .usage = [me](bool reset) { return me->session_usage_now(reset); },
                              .stage_inputs =
                                  [me](const std::vector<input_file>& files, std::string& message) {
                                    return me->stage_session_inputs(files, message);
                                  }});
          me->prepare();
          std::weak_ptr<init_run> weak = self;
          me->activate_on_strand(me->job_, [weak](run_result r, run_detail) {
            if (auto s = weak.lock()) {
              s->session_.done(std::move(r), s->ev_.timed_out,
                               s->ev_.cancelled || s->shared_shutting_down());
            }
          });
        });
  }

  /// A live session's usage so far (session_front::hooks::usage): the run's largest
  /// figures are taken first, so a reset of the peak never lowers the session's own.
  std::optional<session_usage> session_usage_now(bool reset_peak) {
    run_cgroup* cg = resources_.cgroup();
    if (finishing_ || torn_down_ || cg == nullptr) return std::nullopt;
    snapshot_stats();
    session_usage u;
    u.cpu_usec = result_.stats().cpu_usage_usec;
    u.peak_memory_bytes = result_.stats().peak_memory_bytes;
    u.egress_attempts = ev_.egress.attempts().size() + ev_.egress.dropped();
    if (guest_.agent() == nullptr) {
      // The cgroup's own reading: the peak since the last reset where there was one.
      if (auto st = cg->stats()) u.peak_memory_bytes = st->peak_memory_bytes;
      if (reset_peak) u.peak_reset = cg->reset_memory_peak();
    }
    return u;
  }

  /// Adds input files to a live session (session_front::hooks::stage_inputs). Only where
  /// the sandbox binds the host's input directory: the process and container levels; under
  /// gVisor (its gofer caches the directory) and in a microVM (copied at boot) a later
  /// file would not be seen.
  sandbox::code stage_session_inputs(const std::vector<input_file>& files, std::string& message) {
    const auto level = shared_->traits.isolation;
    if (level != isolation::process && level != isolation::container) {
      message = "files_in: inputs cannot be added to a live session at the " +
                std::string(to_string(level)) + " level";
      return sandbox::code::runtime_unavailable;
    }
    if (!resources_.has_workspace() || !job_.blobs) {
      message = "the session is over";
      return sandbox::code::internal;
    }
    std::size_t failed = 0;
    auto added =
        add_inputs(resources_.workspace(), files, *job_.blobs, job_.admitted.tenant, &failed);
    if (added) return sandbox::code::ok;
    const std::string at = "files_in[" + std::to_string(failed) + "]";
    if (added.error() == make_error_code(errc::not_found)) {
      message = at + ".blob: blob not found";
      return sandbox::code::blob_not_found;
    }
    if (added.error() == make_error_code(errc::already_exists)) {
      message = at + ".name: the session already has an input of that name";
      return sandbox::code::invalid_request;
    }
    if (added.error() == make_error_code(errc::digest_mismatch)) {
      log(log_level::error, at + ": the stored blob does not match its id");
      message = at + ".blob: the stored blob is damaged";
      return sandbox::code::internal;
    }
    log(log_level::error, at + ": copying the input failed");
    message = "files_in: the inputs could not be staged";
    return sandbox::code::internal;
  }

  /// The session's public object: it reaches this run's session front through a pointer
  /// that shares the run's ownership (so each call keeps the run alive until it ran), and
  /// cancels the run when it is destroyed.
  std::shared_ptr<run_session> make_session_object(std::shared_ptr<session_shared> state,
                                                   asio::any_io_executor ex) {
    std::weak_ptr<init_run> weak = weak_from_this();
    return std::make_shared<run_session>(
        std::shared_ptr<session_front>(shared_from_this(), &session_),
        [weak] {
          if (auto r = weak.lock()) r->cancel();
        },
        job_.run_id, std::move(state), std::move(ex));
  }

 private:
  void protocol_fault(const char* what) {
    log(log_level::error, what);
    if (finishing_) return;
    if (!ev_.started) return fail_setup(what);
    ev_.internal_error = "sandbox failed";
    detail_.text = what;
    finish();
  }

  // --- prepare and launch ------------------------------------------------------------------

  void log(log_level lvl, const std::string& line) const {
    if (shared_->ctx.log) shared_->ctx.log(lvl, fmt::format("run {}: {}", job_.run_id, line));
  }

  void fail_setup(const std::string& detail_in) {
    ev_.internal_error = "sandbox setup failed";
    std::string detail = detail_in;
    if (auto d = resources_.diagnostics(); !d.empty()) detail += " [" + d + "]";
    detail_.text = detail;
    // An idle pool instance destroyed on purpose (shutdown, health check) is not an error.
    pool_.log_setup_failure(detail, ev_.cancelled || shared_shutting_down(),
                            [this](log_level l, const std::string& line) { log(l, line); });
    finish();
  }

  bool shared_shutting_down() const noexcept { return shared_->shutting_down.load(); }

  void prepare() {
    times_.t0 = clock::now();
    // What the evidence watchers see goes into the run's evidence (started later on).
    watch_.bind(weak_from_this(),
                {.violation =
                     [this](std::string syscall) {
                       if (!ev_.violation) ev_.violation = std::move(syscall);
                       finish();
                     },
                 .egress = [this](egress_attempt a) { record_egress(std::move(a)); },
                 .oom =
                     [this] {
                       ev_.oom_triggered = true;
                       finish();
                     },
                 .stopped = [this] { return finishing_; }});
    clock_.bind(weak_from_this(),
                {.setup_expired =
                     [this] {
                       // An idle pool instance is not on the clock: only preparing and
                       // activated runs are.
                       if (ev_.started || finishing_ || pool_.is_ready_idle()) return;
                       fail_setup("setup budget exceeded before the program started");
                     },
                 .deadline =
                     [this] {
                       if (finishing_) return;
                       // A main process that exited in time ends the run as it exited:
                       // descendants that still hold its pipes when the deadline passes
                       // (inside the exit grace) are killed, but cannot turn its end into a
                       // timeout.
                       ev_.timed_out = !ev_.main_status.has_value();
                       end_run();
                     },
                 .grace_over = [this] { end_run(); }});
    // 0.–5. Image lock, uid, cgroup, workspace, channels, sandbox-init launched (run_setup).
    auto o = setup_.launch({.l = *shared_->launcher,
                            .traits = shared_->traits,
                            .cgroups = *shared_->cgroups,
                            .cgroup_parent = shared_->cgroup_parent,
                            .backend_instance_id = shared_->instance_id,
                            .runs_dir = shared_->runs_dir},
                           resources_, job_, selftest_, network_granted(),
                           session_.active() && !stream_ ? &session_.stdio() : nullptr, times_);
    if (!o.ctl) return fail_setup(o.error);
    // The channels are the run's from here on, even when the launch failed (what it wrote
    // is read, and logged at teardown). Their hooks call into this run: the channel objects
    // are members, and each pending read holds `owner`.
    const std::weak_ptr<void> owner = weak_from_this();
    ctl_.assign(
        o.ctl.release(), owner,
        {.message =
             [this](const ip::init_header& h, std::string_view payload, std::vector<int>& fds) {
               dispatch_init_message(h, payload, fds,
                                     {.stream_control = stream_, .guest_agent = guest_.active()},
                                     *this);
             },
         .closed =
             [this] { supervisor_gone("sandbox-init closed the control channel during setup"); },
         .malformed = [this] { fail_setup("sandbox-init sent a malformed packet"); },
         .stopped = [this] { return finishing_; }});
    streams_.assign(std::move(o.out), std::move(o.err), owner,
                    {.data = [this] { guest_.progress(); },  // wait_guest_streams
                     .ended = [this] { maybe_end_after_exit(); },
                     .stopped = [this] { return finishing_; },
                     .exited = [this] { return ev_.main_status.has_value(); }},
                    session_.active());
    if (!o.made) return fail_setup(o.error);
    launched& made = *o.made;  // owned by resources_ from here on
    resources_.adopt_launched(std::move(o.made));
    // The guest agent's refusals end the run (microvm; guest_link.hpp).
    guest_.attach(std::move(made.agent), ctl_, weak_from_this(), [this](std::string why) {
      if (!finishing_) agent_refused(why);
    });
    times_.spawned = clock::now();
    // The launcher made the run's network namespace (makes_network_namespace): the listener
    // is served for a network run, else closed here.
    if (auto l = std::move(made.egress_listener); l && network_granted()) start_proxy(l.release());

    // 6. The output directory, when the launcher made it on the host.
    if (const auto& out = made.host_output_dir; !out.empty()) {
      if (int e = result_.open_output_dir(out))
        return fail_setup(fmt::format("opening the output dir: errno {}", e));
    }

    // 7. The configuration (with the program's stdout and stderr when the launcher left them
    //    to it; our copies close as `o` goes).
    const int stdio[2] = {o.child_out.get(), o.child_err.get()};
    if (auto why =
            setup_.send_config(ctl_, job_, facts(), made.config.bytes(),
                               o.child_out ? std::span<const int>(stdio) : std::span<const int>());
        !why.empty())
      fail_setup(why);
    if (finishing_) return;
    times_.config_sent = clock::now();

    // 8. Watch.
    auto self = shared_from_this();
    clock_.arm_setup();
    ctl_.start();
    streams_.start();
    // The launched process's exit (when killing, run_resources confirms the end at once).
    resources_.watch_exit(self, [this] { supervisor_gone("sandbox-init exited during setup"); });
    watch_.watch_oom(*resources_.cgroup());
  }

  // What `config` and `go` carry besides the job (run_setup).
  program_facts facts() const {
    return {.selftest = selftest_,
            .session = session_.active(),
            .uid = resources_.uid(),
            .userns = shared_->userns,
            .network = network_granted(),
            .proxy_served = proxy_.serving(),
            .run_ca_pem = proxy_.ca_pem()};
  }

  // Host log (debug): where the time between the program's exit and the result went.
  void log_teardown_breakdown(bool removed) {
    if (!shared_->ctx.log || !ev_.started) return;
    shared_->ctx.log(log_level::debug, teardown_breakdown(times_, ev_.main_status.has_value(),
                                                          clock::now(), removed));
  }

  void activate_on_strand(run_job job, done_fn done) {
    done_ = std::move(done);
    pool_.activate();
    job_.run_id = job.run_id;  // keep the template's resources; report as this run
    job_.admitted = std::move(job.admitted);
    job_.blobs = std::move(job.blobs);
    job_.secrets = std::move(job.secrets);  // this run's placeholders (and values, host-side)
    if (job.executor) job_.executor = std::move(job.executor);
    if (torn_down_) {
      // The instance died between being picked and activated: report, never hang.
      ev_.internal_error = "sandbox setup failed";
      run_result r;
      result_.classify(job_, shared_->traits.description, evidence(), times_,
                       session_.idle_timeout(), r);
      return std::exchange(done_, nullptr)(std::move(r), std::move(detail_));
    }
    if (finishing_) return;  // preparing already failed: teardown reports it
    // A missing or damaged input blob is the caller's to know (the evidence names it).
    const auto st = setup_.stage(resources_.workspace(), job_);
    if (auto why = st.note(ev_, [this](log_level l, const std::string& s) { log(l, s); });
        !why.empty())
      return fail_setup(why);
    if (st.what != staging_outcome::kind::ok) return finish();
    if (clock::now() - times_.t0 > clock_.setup_budget()) {
      return fail_setup("setup budget exceeded while staging the inputs");
    }
    if (guest_.active()) {
      // A guest cannot see the host's workspace: the staged files travel as frames first.
      if (auto why = guest_.send_files(resources_.workspace(), ctl_); !why.empty()) {
        return fail_setup(why);
      }
    }
    // A network run with secrets or rules: its CA, made before `go` carries its certificate.
    if (network_granted()) make_run_ca();
    if (auto why = setup_.send_go(ctl_, job_, shared_->traits, facts(), session_.stdio());
        !why.empty())
      fail_setup(why);
    if (pool_.ready()) clock_.arm_setup();  // a pooled instance: the clock starts now
  }

  // --- watch -------------------------------------------------------------------------------

  // sandbox-init's messages, decoded and their shape checked (init_events.hpp).

  void ready(unique_fd out_dir, unique_fd dns) override {
    result_.offer_output_dir(std::move(out_dir));  // (or the launcher's, on the host)
    if (dns) watch_.serve_dns(dns.release());
    // Written once, before `ready` is published (the health check reads it from any thread).
    // (A v1 hierarchy's where there is one: on a hybrid host crun and runc join only those.)
    if (job_.prestart && shared_->traits.host_cgroup_lists_processes && resources_.cgroup() &&
        !resources_.cgroup()->procs_dir().empty()) {
      procs_path_ = (resources_.cgroup()->procs_dir() / "cgroup.procs").string();
    }
    pool_.became_ready();
  }

  void egress_proxy(unique_fd listener) override {
    if (!proxy_.serving() && network_granted()) return start_proxy(listener.release());
    listener.reset();
    fail_setup("unexpected egress proxy socket from sandbox-init");
  }

  void started(std::string_view init_times, unique_fd listener) override {
    ev_.started = true;
    times_.started = clock::now();
    // Host log (debug): where the setup time went — host-side steps and sandbox-init's
    // phase timestamps (same monotonic clock). Used by the benchmark's cold-path breakdown.
    if (shared_->ctx.log) shared_->ctx.log(log_level::debug, setup_breakdown(times_, init_times));
    pool_.started();
    clock_.start_deadline(job_.admitted.request.timeout);
    if (listener) watch_.watch_notifications(listener.release());
    watch_.sample_memory(*resources_.cgroup(),
                         [this] { return finishing_ || !resources_.cgroup(); });
    if (session_.active()) session_.started();
  }

  void exited(int status) override {
    ev_.main_status = status;
    times_.main_exit = clock::now();
    // A parked pipe goes back to reading now (its timer's handler runs at once): the
    // end of output is what the result waits for.
    streams_.unpark();
    maybe_end_after_exit();
  }

  // Stream mode only (else the host serves the sink): sandbox-init's report of a query, as
  // untrusted as anything from inside. It was escaped there; anything else is recorded as
  // unreadable, never copied raw.
  void dns(std::string_view payload) override { record_egress(reported_dns_query(payload)); }

  void quiet() override {
    guest_.note_quiet();
    // A guest agent (microvm) counted what each stream carried: the run goes on once the
    // capture holds that much (bounded), since the ports are not the control channel.
    if (guest_.streams_unsettled() && !session_.active()) return wait_guest_streams();
    on_stream_quiet();
  }

  void stdin_ack(std::uint32_t bytes) override {
    if (const char* fault = session_.stdio().on_ack(bytes)) protocol_fault(fault);
  }

  void stdin_closed() override {
    if (const char* fault = session_.stdio().on_stdin_closed()) protocol_fault(fault);
  }

  void failed(const std::string& text, bool preload_raised) override {
    if (preload_raised) preload_raised_ = true;
    fail_setup(text);
  }

  // A guest agent's frame: anything its channel refuses ends the run.
  void agent_frame(const ip::init_header& h, std::string_view payload) override {
    if (auto why = guest_.on_frame(h, payload); !why.empty()) agent_refused(why);
  }

  void protocol_error(const std::string& text) override { fail_setup(text); }

  // Stream mode: `quiet` (after wait_guest_streams, with a guest agent). The runtime holds the
  // capture pipes, so their end never shows; nothing of the run is left to write to them.
  void on_stream_quiet() {
    if (stream_ && guest_.finish_sent()) {  // the guest ended the run when told to
      streams_.out().mark_closed();
      streams_.err().mark_closed();
      finish();
      return;
    }
    if (stream_ && ev_.main_status) {
      streams_.err().mark_closed();
      if (session_.active()) {
        // A session's stdout is read by the host at its pace: what the server left in the
        // pipe is still read, then EOF (read_after_quiet).
        session_.stdio().on_quiet();
      } else {
        streams_.out().mark_closed();
      }
      maybe_end_after_exit();
    }
  }

  // A guest agent's `usage` counted what each stream carried (guest_stream_wait.hpp). The
  // deadline and the exit grace stop here: the run's processes are gone.
  void wait_guest_streams() {
    clock_.stop_run_timers();
    guest_.wait_streams(streams_.out(), streams_.err(), weak_from_this(),
                        {.usage = nullptr,  // (the guest's report: guest_link fills it in)
                         .log = [this](log_level l, const std::string& line) { log(l, line); },
                         .settled = [this] { on_stream_quiet(); },
                         .stopped = [this] { return finishing_; }});
  }

  // The guest agent sent something its channel refused (a name, size or count out of
  // bounds, a frame out of order, a setup failure): the VM is not to be trusted with more.
  void agent_refused(const std::string& why) {
    log(log_level::error, "guest agent: " + why);
    if (!ev_.internal_error) {
      ev_.internal_error =
          ev_.started
              ? "the microVM's guest agent failed or broke the protocol; the VM was destroyed"
              : "sandbox setup failed";
    }
    finish();
  }

  // The deadline or the exit grace ended the run. With a guest agent (microvm) the outputs
  // are still inside the guest: the agent is told to kill what is left of the run there and
  // send them (`finish`, wire/guest_protocol.hpp); its `quiet` then ends the run, or — if it
  // does not come within a bounded time — the run ends without them. Every other run ends
  // now.
  void end_run() {
    if (finishing_) return;
    if (ev_.started && guest_.ask_finish(ctl_, shared_from_this(), [this] { finish(); })) return;
    finish();
  }

  void maybe_end_after_exit() {
    if (finishing_ || !ev_.main_status) return;
    if (!streams_.any_open()) {
      finish();
      return;
    }
    // A session's stdout is read by the host at its pace: the idle timer (and the lifetime)
    // bound the wait for its end instead of the grace — unless the host is closing it.
    if (session_.active() && !session_.stdio().stdout_eof() && !session_.close_requested()) return;
    // Descendants still hold the pipes: they get `exit_grace`, then everything is killed.
    clock_.arm_grace_once(job_.policy.exit_grace);
  }

  // A network run: granted (admission checked the ticket and the request's egress list).
  bool network_granted() const noexcept { return is_network_granted(job_, selftest_); }

  // A run with secrets or L7 rules: its CA (once; egress_wiring::prepare_ca). Without one
  // its secrets stay placeholders and HTTPS to its ruled hosts is refused; the host log says
  // why.
  void make_run_ca() {
    if (job_.secrets.empty() && job_.admitted.egress_rules.empty()) return;
    if (auto why = proxy_.prepare_ca(job_.run_id, job_.admitted.request.egress); !why.empty()) {
      log(log_level::warning,
          "no run CA (its secrets stay placeholders, HTTPS to its ruled hosts is refused): " + why);
    }
  }

  // Serves the run's egress proxy on `listener` (from sandbox-init, in the run's netns).
  void start_proxy(int listener) {
    make_run_ca();
    proxy_.start(listener, job_.admitted.request.egress, job_.secrets, job_.admitted.egress_rules,
                 shared_->ctx.egress, shared_->resolver, weak_from_this(),
                 [this](egress_attempt a) { record_egress(std::move(a)); });
  }

  void record_egress(egress_attempt a) {
    // A secret's placeholder in a name looked up: the run tried to send it where its value
    // may not go (the proxy judges its own attempts).
    if (a.protocol == "dns" && !job_.secrets.empty()) {
      std::vector<std::string> placeholders;
      for (const auto& s : job_.secrets) placeholders.push_back(s.placeholder);
      if (dns_name_holds_placeholder(a.host, placeholder_marks(placeholders))) {
        a.reason = std::string(secret_misuse_reason);
      }
    }
    ev_.egress.record(std::move(a), network_granted());
  }

  // --- end ---------------------------------------------------------------------------------

  // Keeps the largest figures seen (result_assembler::snapshot).
  void snapshot_stats() {
    result_.snapshot(resources_.cgroup(), guest_.agent(), resources_.launched_run());
  }

  // sandbox-init (or the runtime around it) went away — it exited, or closed the control
  // channel — and we had not ended the run. During setup that is a setup failure
  // (`during_setup` says how). While the run was live nothing the program can do causes it
  // (PID 1 ignores its signals), so the sandbox itself failed — e.g. gVisor's sentry died.
  // Unless the main process had already exited normally, the result says so instead of
  // passing for the program's own end.
  void supervisor_gone(const char* during_setup) {
    if (finishing_) return;
    if (!ev_.started) return fail_setup(during_setup);
    if (!ev_.main_status) ev_.supervisor_lost = true;
    finish();
  }

  void finish() {
    if (finishing_) return;
    finishing_ = true;
    times_.ended = clock::now();
    clock_.cancel_all();
    session_.cancel_timers();
    guest_.cancel();
    watch_.stop_sampling();
    // Usage and the OOM counter are read now, before the kill: once the run's processes are
    // gone an OCI runtime removes the container's cgroup (our run cgroup) as it exits. The
    // pids limit's refusals are taken from this reading only: the kill itself may set
    // pids.max to 0 (cgroup.hpp, kill_all), and refusals it causes are not the program's.
    snapshot_stats();
    ev_.pids_limit_hits = result_.stats().pids_limit_hits;
    resources_.confirm_dead(times_.ended, clock::now() + job_.policy.teardown_budget,
                            weak_from_this(), [this] { teardown(); });
  }

  void teardown() {
    // A network run's proxy first: its connections end with the run, each recorded with its
    // final bytes before the result is made (waited for at most 2 s: a name lookup on the
    // host reports only when it returns; later records are dropped).
    if (!proxy_.drained(shared_from_this(), [this] { teardown(); })) return;
    // A read the reactor already performed holds bytes taken from a pipe: they are the
    // program's and come before what is left there (lost from the result once, at gvisor
    // under load: 64 KiB of a 4 MiB flood).
    if (!streams_.settled([this] { teardown(); })) return;
    times_.dead = clock::now();
    pool_.started();  // never started: whoever waited for the start must not wait forever
    // Everything is dead: what is left in the pipes is final.
    streams_.drain_and_close();  // (a session's unread output is not kept)
    ctl_.close();
    watch_.close();  // (and the run's /proc/<pid>/mem descriptors: gone before the result)
    session_.stdio().close();
    // sandbox-init is reaped by now (poll_dead), unless the teardown budget ran out: then it
    // is killed and reaped whenever it ends (never left a zombie).
    resources_.reap_or_abandon();

    if (!pool_.activated()) {
      // A warm-pool instance that never got a run: nothing to collect or report.
      result_.close_output_dir();
      resources_.destroy();
      torn_down_ = true;
      pool_.gone({.why = detail_.text, .preload_raised = preload_raised_});
      return;
    }
    if (resources_.cgroup()) snapshot_stats();
    // Streams first (a program must not be able to crowd its own stdout/stderr out of the
    // tenant's quota with output files), then outputs — unless the teardown failed.
    run_result r = result_.make({.job = job_,
                                 .backend = shared_->traits.description,
                                 .out = streams_.out().capture(),
                                 .err = streams_.err().capture(),
                                 .guest = guest_,
                                 .collect = !resources_.failed(),
                                 .host_log = shared_->ctx.log,
                                 .ev = evidence(),
                                 .times = times_,
                                 .idle_timeout = session_.idle_timeout()});
    times_.collected = clock::now();
    torn_down_ = true;
    if (done_) {
      // Removed before the result: the workspace, the uid and the cgroup — unless the kernel
      // still reports the (empty) cgroup busy; that one is retried after the result rather
      // than holding it back.
      const bool removed = resources_.destroy_once();
      times_.destroyed = clock::now();
      std::exchange(done_, nullptr)(std::move(r), std::move(detail_));
      log_teardown_breakdown(removed);
      if (!removed) resources_.destroy_after_result(weak_from_this());
      return;
    }
    resources_.destroy();
    // A pool instance that never became ready, or died idle.
    pool_.gone({.why = detail_.text, .preload_raised = preload_raised_});
  }

  // The run's evidence with what its parts know (result_assembler::classify).
  run_evidence evidence() const {
    run_evidence ev = ev_;
    ev.idle_timed_out = session_.idle_timed_out();
    ev.network_granted = network_granted();
    ev.teardown_failed = resources_.failed();
    return ev;
  }

  std::shared_ptr<backend_shared> shared_;
  asio::strand<asio::any_io_executor> strand_;
  run_job job_;
  bool selftest_;
  done_fn done_;
  run_detail detail_;
  run_resources resources_;  ///< image lock, uid, cgroup, workspace, launch; kill and removal

  control_channel ctl_;      ///< to and from sandbox-init
  output_streams streams_;   ///< the program's stdout and stderr and their captures
  evidence_watchers watch_;  ///< seccomp notifications, DNS sink, OOM events, memory samples
  run_clock clock_;          ///< the setup budget, the deadline and the exit grace
  guest_link guest_;         ///< the guest agent's side (microvm), its finish and stream waits

  run_setup setup_;  ///< setup steps 0–5; the names of the run's resources
  const bool stream_ = shared_->traits.stream_control;  ///< the launcher's stream_control()
  bool torn_down_ = false;                              ///< teardown finished (strand only)
  pool_instance pool_;                                  ///< the warm pool's side (see activate())
  std::string procs_path_;       ///< a pre-started instance's cgroup.procs (passes_health_check)
  bool preload_raised_ = false;  ///< sandbox-init reported a preload import that raised

  run_times times_;  ///< when each step happened (usage, the debug log's breakdowns)
  run_evidence ev_;  ///< what the run saw (classified at the end; network and teardown there)
  bool finishing_ = false;
  egress_wiring proxy_;      ///< network runs: the run's egress proxy
  result_assembler result_;  ///< usage figures and the result's making (teardown)

  /// A session's front: its handlers, stdio pump and idle timer (inert outside a session).
  session_front session_;
};

class init_backend final : public backend, public std::enable_shared_from_this<init_backend> {
 public:
  explicit init_backend(std::shared_ptr<backend_shared> shared)
      : shared_(std::move(shared)),
        pool_(std::make_shared<warm_pool<init_run>>(
            shared_->ctx, shared_->traits.makes_network_namespace,
            // Pool instances run on the runtime's executor; the backend state outlives them
            // (each holds it).
            [shared = shared_](run_job job) {
              return std::make_shared<init_run>(shared, shared->ctx.executor, std::move(job),
                                                false);
            },
            shared_->traits.can_prestart)) {}

  /// Creates the configured warm pools and starts filling them (warm_pool::start).
  void start_pools() { pool_->start(); }

  std::vector<pool_stats> warm_pool_stats() const override { return pool_->stats(); }

  sandbox::isolation isolation() const noexcept override { return shared_->traits.isolation; }
  std::string_view name() const noexcept override { return shared_->traits.name; }

  void shutdown() noexcept override {
    shared_->shutting_down = true;
    // The pools first (no more refills; idle instances die with the kill below), then every
    // other live run; the two locks are never held together.
    std::vector<std::shared_ptr<init_run>> live = pool_->shutdown();
    {
      std::lock_guard lock(mu_);
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
    auto run = std::make_shared<init_run>(
        shared_, io.get_executor(), self_test_job(shared_->traits.isolation, empty_root), true);
    std::string reason = "self-test did not complete";
    run->start([&](run_result r, run_detail d) {
      reason = judge_self_test(r, d.text, shared_->traits.stream_control);
    });
    run.reset();
    io.run_for(std::max<std::chrono::milliseconds>(
        std::chrono::seconds(30), shared_->traits.min_setup_budget + std::chrono::seconds(20)));
    return reason;
  }

 private:
  // Live runs outside the pools (cold runs, sessions), for shutdown's kill.
  void track_locked(const std::shared_ptr<init_run>& run) {
    for (auto it = runs_.begin(); it != runs_.end();) {
      it = it->second.expired() ? runs_.erase(it) : std::next(it);
    }
    runs_[run->run_id()] = run;
  }

  void do_execute(run_job job, handler_type handler) override {
    auto ex = job.executor ? job.executor : shared_->ctx.executor;
    std::function<void()> refill;
    std::shared_ptr<init_run> run = pool_->take(job, refill);
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
      asio::dispatch(ex, [h, ec, r = std::move(r)]() mutable { std::move (*h)(ec, std::move(r)); });
    };
    if (pooled) {
      run->activate(std::move(job), std::move(done), std::move(refill));
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
    auto s = run->make_session_object(state, ex);
    run->start_session(std::move(sj), std::move(s), std::move(state), std::move(handler));
  }

  std::shared_ptr<backend_shared> shared_;
  mutable std::mutex mu_;
  std::map<std::string, std::weak_ptr<init_run>> runs_;  ///< guarded by mu_
  std::shared_ptr<warm_pool<init_run>> pool_;            ///< its own lock
};

}  // namespace

int open_init_executable(const std::filesystem::path& path) {
  if (!path.empty()) return ::open(path.c_str(), O_PATH | O_CLOEXEC);
  int fd = static_cast<int>(memfd_create("sandbox-init", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) return -1;
  const auto image = embedded::sandbox_init();
  if (!write_all(fd, image.data(), image.size())) {
    ::close(fd);
    return -1;
  }
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  return fd;
}

std::variant<std::shared_ptr<backend>, std::string> make_run_machine(
    const run_machine_context& ctx_in, std::shared_ptr<launcher> l) {
  auto shared = std::make_shared<backend_shared>();
  shared->ctx = ctx_in;
  shared->launcher = l;
  shared->traits = l->traits();
  const launcher_traits& traits = shared->traits;
  const bool root = ::geteuid() == 0;
  if (!root && !traits.unprivileged) {
    return traits.name + " needs root on this host";
  }
  shared->userns = !root;
  // Each backend keeps its own state below the runtime's state dir (its locks, work dirs).
  if (traits.isolation != sandbox::isolation::process) {
    shared->ctx.state_dir = ctx_in.state_dir / traits.name;
  }
  const auto& ctx = shared->ctx;

  // State directory, instance lock, run dirs.
  std::error_code ec;
  std::filesystem::create_directories(ctx.state_dir / "instances", ec);
  std::filesystem::create_directories(ctx.state_dir / "runs", ec);
  if (ec) return "state directory " + ctx.state_dir.string() + " cannot be created";
  ::chmod(ctx.state_dir.c_str(), 0711);
  ::chmod((ctx.state_dir / "runs").c_str(), 0700);
  auto instance_id = random_hex(6);
  if (!instance_id) return fmt::format("getrandom for the instance id failed: errno {}", errno);
  shared->instance_id = std::move(*instance_id);
  auto lock_path = ctx.state_dir / "instances" / (shared->instance_id + ".lock");
  shared->instance_lock_fd =
      ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (shared->instance_lock_fd < 0 || ::flock(shared->instance_lock_fd, LOCK_EX | LOCK_NB) < 0) {
    return "cannot create the instance lock in the state directory";
  }
  shared->instance_lock_path = lock_path;
  shared->runs_dir = ctx.state_dir / "runs" / shared->instance_id;
  {
    auto resolver =
        make_egress_resolver(ctx.executor, ctx.egress.pinned_hosts, ctx.egress.resolver);
    if (auto* why = std::get_if<std::string>(&resolver)) return *why;
    shared->resolver = std::get<std::shared_ptr<egress_resolver>>(resolver);
    if (auto why = origin_ca_file_problem(ctx.egress.origin_ca_file)) return *why;
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
  shared->cgroups.emplace(std::move(*host));
  shared->cgroup_parent = parent;

  if (!shared->userns) {
    // One set of uid reservations for the whole host, whatever the state dir.
    auto pool =
        uid_pool::open(ctx.options.uid_lock_file, ctx.options.uid_base, ctx.options.uid_count);
    if (!pool) {
      return fmt::format("uid pool: the host's uid lock file {} cannot be opened: {}",
                         ctx.options.uid_lock_file.string(), pool.error().message());
    }
    shared->uids = std::move(*pool);
  }

  reclaim_orphans({.state_dir = ctx.state_dir,
                   .instance_id = shared->instance_id,
                   .cgroups = *shared->cgroups,
                   .l = *shared->launcher,
                   .log = ctx.log});

  auto be = std::make_shared<init_backend>(shared);
  // The self-test, unless this boot already saw it pass under the same key: the host, our
  // build, the cgroup layout, the options the run machine uses, the level's configuration
  // and binaries (self_test_cache.hpp).
  self_test_key key{.parts = host_key_parts(), .files = ctx.self_test_deps.files};
  key.parts["level"] = traits.name;
  key.parts["cgroups"] = fmt::format("{} parent={} root={}", shared->cgroups->describe(), parent,
                                     ctx.options.cgroup_root.string());
  key.parts["options"] = fmt::format("uid_base={} uid_count={} userns={} init_path={} state_dir={}",
                                     ctx.options.uid_base, ctx.options.uid_count, shared->userns,
                                     ctx.options.init_path.string(), ctx.state_dir.string());
  key.parts["level_config"] = ctx.self_test_deps.config;
  if (!ctx.options.init_path.empty()) key.files.push_back(ctx.options.init_path);
  const self_test_cache verdicts(ctx.state_dir / "selftest", traits.name, ::geteuid());
  self_test_lookup found{.why_not = "recorded passes not consulted", .recorded_at = {}};
  if (ctx.reuse_self_test_verdict) found = verdicts.lookup(key);
  const bool test = !found.reusable;
  if (ctx.log) {
    ctx.log(log_level::info,
            test ? fmt::format("{} self-test: running it ({})", traits.name, found.why_not)
                 : fmt::format("{} self-test: passed on this boot at {}; not repeated ({})",
                               traits.name, found.recorded_at, verdicts.path().string()));
  }
  if (test) {
    // Proved, not assumed: limits written to a run cgroup read back as written. Part of the
    // self-test, so a recorded pass covers it: its key holds the cgroup layout, the parent,
    // the kernel and the boot. Named like a run of this instance, so that a crash in between
    // leaves it to the next start's reclaim.
    std::string limits_why;
    if (auto v = shared->cgroups->verify_limits("r-" + shared->instance_id + "-limits-test",
                                                &limits_why);
        !v) {
      return limits_why.empty() ? "cgroup limits unverifiable: " + v.error().message() : limits_why;
    }
    auto empty_root = ctx.state_dir / "selftest-root";
    std::filesystem::create_directories(empty_root, ec);
    std::string reason = be->self_test(empty_root);
    if (!reason.empty()) return traits.name + " backend self-test failed: " + reason;
    std::string why;
    if (!verdicts.record_pass(key, &why) && ctx.log) {
      ctx.log(log_level::warning,
              fmt::format("{} self-test: passed, but the pass is not recorded ({}); the next start "
                          "tests again",
                          traits.name, why));
    }
  }
  be->start_pools();
  if (ctx.log) {
    ctx.log(log_level::info,
            fmt::format("{} backend ready ({})", traits.description, shared->cgroups->describe()));
  }
  return std::shared_ptr<backend>(be);
}

}  // namespace sandbox::detail
