// A session run's front (sandbox/session.hpp): what the host sees of a run in session mode —
// the open, the stdio pump, the idle timer, `async_close`, and how the session ended.
#pragma once

#include <atomic>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/run/control_channel.hpp"
#include "core/run/session_stdio.hpp"
#include "core/run/stream_reader.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/session.hpp"

namespace sandbox::detail {

/// What a session's public object keeps of its run once the run is gone: the closing result
/// and the last figures (the run itself lives only as long as its own pending operations).
struct session_shared {
  std::mutex mu;  ///< guards both fields (any thread)
  std::optional<session_result> result;
  session_stats last;
};

/// A live session's usage so far, read on its run's strand (for an interpreter's cells).
struct session_usage {
  std::uint64_t cpu_usec = 0;           ///< CPU of every process of the session so far, µs
  std::uint64_t peak_memory_bytes = 0;  ///< the peak since the last reset (or the session's)
  bool peak_reset = false;              ///< this read started a new peak window
  /// Egress attempts refused so far (recorded and dropped alike; never granted here: a
  /// session's run has no network), so a caller can tell which ones came in a window.
  std::uint64_t egress_attempts = 0;
};

/**
 * The session-facing part of one run. The same run as any other, except: the program's
 * stdin is a pipe the host writes (sent with `go`), its stdout is read by the session's
 * reader instead of a capture, an idle timer ends it when no byte moves, `close` ends it on
 * purpose. Everything else — cgroup, teardown, kill-and-confirm, classification — is the
 * run's; the front only tells the run to end (`hooks::finish`) and maps its result onto the
 * session's end (`done`).
 *
 * Outside a session (`begin` never called) it is inert: `active()` is false and the stdio
 * pump only answers the run's questions (no stdin pipe, nothing to close).
 *
 * Thread-safety: strand only, except `stats`, which reads atomics from any thread, and the
 * `post_*` entry points of the session's public object (run_session.hpp), which dispatch to
 * the strand from any thread. Handlers complete through post_completion on the session's
 * executor, never inline. Lifetime: each pending timer holds the owner given to `begin` (a
 * strong reference taken when it is armed), and each `post_*` call holds `keep` (the run)
 * until it ran, so the run lives while the front waits, as the run's own waits do.
 */
class session_front {
 public:
  using io_handler = session_stdio::io_handler;
  /// `async_close`'s completion.
  using close_handler =
      boost::asio::any_completion_handler<void(boost::system::error_code, session_result)>;
  /// The open's completion.
  using open_handler =
      boost::asio::any_completion_handler<void(boost::system::error_code, session_start)>;

  /// What the front asks of its run; each is called on the strand.
  struct hooks {
    std::function<void()> finish;  ///< end the run now (idle timeout, close grace elapsed)
    std::function<void()> maybe_end_after_exit;  ///< stdout ended or close: the run may end
    std::function<bool()> ending;                ///< the run is ending (or torn down)
    std::function<bool()> main_exited;           ///< sandbox-init reported the main's exit
    /// The usage so far; with `true`, then starts a new peak window (run_cgroup::
    /// reset_memory_peak). Empty when the run is ending.
    std::function<std::optional<session_usage>(bool reset_peak)> usage;
    /// Copies the blobs `files` (of the run's tenant; names checked by the caller) into the
    /// run's input directory: `ok`, or a code with `message` (blob_not_found,
    /// invalid_request for a name already there, runtime_unavailable where the level's
    /// inputs are not live, internal).
    std::function<sandbox::code(const std::vector<input_file>& files, std::string& message)>
        stage_inputs;
  };
  /// `post_usage`'s completion: `operation_aborted` once the run is ending.
  using usage_handler =
      boost::asio::any_completion_handler<void(boost::system::error_code, session_usage)>;
  /// `post_stage_inputs`'s completion: the code (`ok` or why not) and a message.
  using stage_handler = boost::asio::any_completion_handler<void(sandbox::code, std::string)>;

  /// `ctl` and `out` (the run's stdout reader) outlive the front. `stream`: the launcher's
  /// `stream_control`.
  session_front(boost::asio::strand<boost::asio::any_io_executor> strand, bool stream,
                control_channel& ctl, stream_reader& out);

  /// Makes the run a session (before prepare): `opened` completes once the program started
  /// (with `session`) or the run ended before (without); completions go to `ex`.
  /// `exit_grace`: what `async_close` gives the server to go by itself.
  void begin(session_job sj, std::shared_ptr<sandbox::session> session,
             std::shared_ptr<session_shared> shared, open_handler opened,
             boost::asio::any_io_executor ex, std::chrono::milliseconds exit_grace,
             std::weak_ptr<void> owner, hooks h);
  /// True once `begin` ran: the run is a session.
  bool active() const noexcept { return active_; }
  /// The session's stdin and stdout (the run drives its launch and protocol side).
  session_stdio& stdio() noexcept { return stdio_; }

  /// The host's `async_write`, `async_read`, `close_stdin` and `async_close`, from any
  /// thread: dispatched to the strand, holding `keep` (the run) until they ran. `async_close`
  /// completes with the session's record once it ended; the first one closes stdin (buffered
  /// bytes are dropped), stops stdout from holding the end back and gives the server the
  /// exit grace to go by itself, then the run is ended.
  void post_write(std::shared_ptr<void> keep, boost::asio::const_buffer d, io_handler h);
  void post_read(std::shared_ptr<void> keep, boost::asio::mutable_buffer b, io_handler h);
  void post_close_stdin(std::shared_ptr<void> keep);
  void post_close(std::shared_ptr<void> keep, close_handler h);
  /// The session's usage so far (`hooks::usage`), from any thread; completes on the
  /// session's executor.
  void post_usage(std::shared_ptr<void> keep, bool reset_peak, usage_handler h);
  /// Stages input files into the live session's input directory (`hooks::stage_inputs`),
  /// from any thread; completes on the session's executor (`internal` once it is ending).
  void post_stage_inputs(std::shared_ptr<void> keep, std::vector<input_file> files,
                         stage_handler h);

  /// The program started: the idle clock starts and the open completes with the session.
  void started();
  /// The run ended (teardown made `r`): maps it onto the session's end (`timed_out`: the
  /// run's deadline, its lifetime, ended it; `killed`: cancelled or runtime shutdown), calls
  /// `session_job::on_end` once, keeps the record for the public object, and completes the
  /// open (never `ok` when the program never started) and every close handler.
  void done(run_result r, bool timed_out, bool killed);
  /// The run is ending: the idle and close timers stop.
  void cancel_timers();

  /// The host called `close`.
  bool close_requested() const noexcept { return close_requested_; }
  /// The idle timer ended the session.
  bool idle_timed_out() const noexcept { return idle_timed_out_; }
  /// The session's idle timeout (session_job's default outside a session), for the
  /// result's message.
  std::chrono::milliseconds idle_timeout() const noexcept { return sjob_.idle_timeout; }
  /// The session's figures, from any thread (atomics only).
  session_stats stats() const { return stdio_.stats(ended_.load()); }

 private:
  void close(close_handler h);
  void touch();
  void arm_idle_timer();

  boost::asio::strand<boost::asio::any_io_executor> strand_;
  session_stdio stdio_;
  stream_reader& out_;
  boost::asio::steady_timer idle_timer_, close_timer_;
  boost::asio::any_io_executor ex_;
  std::weak_ptr<void> owner_;
  hooks h_;
  std::chrono::milliseconds exit_grace_{0};
  bool active_ = false;
  session_job sjob_;
  std::chrono::steady_clock::time_point last_activity_{};
  bool idle_timed_out_ = false, close_requested_ = false;
  std::optional<open_handler> open_handler_;
  std::shared_ptr<sandbox::session> open_session_;  ///< handed out by the open handler
  std::vector<close_handler> close_handlers_;
  std::optional<session_result> result_;
  std::shared_ptr<session_shared> shared_;
  std::atomic<bool> ended_{false};  ///< read by stats() from any thread
};

}  // namespace sandbox::detail
