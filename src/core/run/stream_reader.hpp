// One output stream of a run (stdout or stderr): its descriptor and its capped capture; and
// the pair of them, as the run machine holds them.
#pragma once

#include <fcntl.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/run/capture.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/**
 * Reads one of the program's output streams (a pipe, or a stream socket) into a capped
 * capture, at full speed for floods and in batches for a trickle: after a short read the
 * descriptor is "parked" — taken out of the reactor for a moment (2 ms) so that a program
 * writing one byte at a time does not wake the host for every write. Once the program has
 * exited there is no trickle to wait for: reads go on at once (`unpark`). A session's stderr
 * past its capture cap is throttled to `session_stderr_drain_bytes_per_s` instead.
 *
 * Thread-safety: strand only. Lifetime: every pending wait holds the owner given to
 * `assign` (the run stays alive while its streams have reads pending); teardown calls
 * `reclaim` (a parked descriptor comes back), `drain` and `close`.
 */
class stream_reader {
 public:
  using strand_type = boost::asio::strand<boost::asio::any_io_executor>;

  /// How fast a session's stderr is drained once past its capture cap (bytes per second).
  /// docs/protocol.md and sandbox/session.hpp name the same figure.
  static constexpr std::uint64_t session_stderr_drain_bytes_per_s = 1U << 20;

  /// What the reader asks and tells its run; each is called on the strand.
  struct hooks {
    std::function<void()> data;     ///< after every read (bytes may have come)
    std::function<void()> ended;    ///< the stream ended (EOF or an error); `open()` is false
    std::function<bool()> stopped;  ///< the run is ending: no more reads are started
    std::function<bool()> exited;   ///< the main process has exited
  };

  /// `capture_bytes` / `summary_bytes`: the policy's caps for this stream.
  stream_reader(strand_type strand, std::uint64_t capture_bytes, std::uint32_t summary_bytes);
  ~stream_reader();

  /// Takes the host's end of the stream (owned from here on) and the hooks.
  /// `throttle_past_cap`: a session's stderr (see the class comment).
  void assign(int fd, std::weak_ptr<void> owner, hooks h, bool throttle_past_cap);

  /// Starts the read loop (not for a session's stdout, which the session reads itself).
  void start();

  /// The main process exited: a parked descriptor goes back to reading now.
  void unpark() { park_timer_.cancel(); }

  /// Teardown, first step: no read is left in flight. A read the reactor has already
  /// performed has taken bytes out of the pipe before its handler runs on the strand; those
  /// bytes come before what `drain` still finds there, so teardown waits for that handler.
  /// Returns true when no read is in flight (nothing to wait for); otherwise cancels the
  /// pending read and returns false, and `resume` runs on the strand once its handler has
  /// appended what it read (that handler keeps the owner alive; `resume` must not hold it:
  /// the reader is the owner's, and an io_context stopped first would leak both). No read is
  /// started after this.
  bool settled(std::function<void()> resume);

  /// Teardown: everything of the run is dead and no read is in flight (`settled`), so what
  /// is left in the pipe is final. Takes a parked descriptor back, then reads what is left
  /// into the capture (bounded).
  void drain(bool into_capture);

  /// Closes the descriptor; pending reads end aborted.
  void close();

  /// False once the stream ended, or the run stopped waiting for its end.
  bool open() const noexcept { return open_; }
  /// The run no longer waits for this stream's end (it is over for the result).
  void mark_closed() noexcept { open_ = false; }

  /// The capture (the run stores it, or resets it when nothing of the program ran).
  stream_capture_buffer& capture() noexcept { return cap_; }
  const stream_capture_buffer& capture() const noexcept { return cap_; }

  /// The descriptor itself, for a session's stdout (read by the session at the host's pace).
  boost::asio::posix::stream_descriptor& descriptor() noexcept { return d_; }

 private:
  void read();
  void reclaim();

  boost::asio::posix::stream_descriptor d_;
  stream_capture_buffer cap_;
  std::weak_ptr<void> owner_;
  hooks h_;
  bool throttle_ = false;
  bool open_ = true;
  bool in_flight_ = false;                ///< an async read is pending (its handler not yet run)
  bool settling_ = false;                 ///< teardown began: no read is started any more
  std::function<void()> on_settled_;      ///< `settled`'s resume, once the pending read ends
  int parked_ = -1;                       ///< the descriptor, out of the reactor for a moment
  boost::asio::steady_timer park_timer_;  ///< when the parked descriptor goes back (cancel: now)
};

/**
 * The program's two output streams, read alike into captures of the policy's caps, except
 * in session mode: the session reads stdout itself (at the host's pace; it is not started
 * here, and its unread output is not kept at the end) and stderr is throttled past its cap.
 *
 * Thread-safety and lifetime: as `stream_reader`'s (strand only; pending reads hold the
 * owner given to `assign`).
 */
class output_streams {
 public:
  /// `capture_bytes` / `summary_bytes`: the policy's caps, for each stream.
  output_streams(stream_reader::strand_type strand, std::uint64_t capture_bytes,
                 std::uint32_t summary_bytes)
      : out_(strand, capture_bytes, summary_bytes), err_(strand, capture_bytes, summary_bytes) {}

  /// Takes the host's ends of stdout and stderr (owned from here on, made non-blocking) and
  /// the hooks both readers call. `session`: the run is in session mode.
  void assign(unique_fd out, unique_fd err, const std::weak_ptr<void>& owner,
              const stream_reader::hooks& h, bool session) {
    session_ = session;
    const int out_fd = out.release(), err_fd = err.release();
    out_.assign(out_fd, owner, h, false);
    err_.assign(err_fd, owner, h, session);  // a session's stderr: throttled
    ::fcntl(out_fd, F_SETFL, O_NONBLOCK);
    ::fcntl(err_fd, F_SETFL, O_NONBLOCK);
  }
  /// Starts reading (a session's stdout: its reader reads it).
  void start() {
    if (!session_) out_.start();
    err_.start();
  }
  /// The main process exited: parked descriptors go back to reading now.
  void unpark() {
    out_.unpark();
    err_.unpark();
  }
  /// True while either stream may still bring output the run waits for.
  bool any_open() const noexcept { return out_.open() || err_.open(); }
  /// Teardown, first step: `stream_reader::settled` for both. True when neither has a read in
  /// flight; otherwise false, and `resume` runs on the strand once both have none.
  bool settled(std::function<void()> resume) {
    if (settled_) return true;
    auto left = std::make_shared<int>(2);
    auto one = [this, left, resume = std::move(resume)] {
      if (--*left == 0) {
        settled_ = true;
        resume();
      }
    };
    const bool out_now = out_.settled(one);
    const bool err_now = err_.settled(one);
    if (out_now && err_now) {
      settled_ = true;
      return true;
    }
    if (out_now || err_now) one();  // the one with nothing in flight counts as done
    return false;
  }
  /// Teardown: everything of the run is dead and no read is in flight (`settled`), so what
  /// is left is final: read into the captures (not a session's stdout), then both
  /// descriptors are closed.
  void drain_and_close() {
    out_.drain(!session_);
    err_.drain(true);
    out_.close();
    err_.close();
  }

  /// Each stream (captures, `mark_closed`, a session's stdout descriptor).
  stream_reader& out() noexcept { return out_; }
  stream_reader& err() noexcept { return err_; }

 private:
  stream_reader out_, err_;  ///< stdout, stderr
  bool session_ = false;     ///< session mode (`assign`)
  bool settled_ = false;     ///< `settled` found (or waited for) no read in flight
};

}  // namespace sandbox::detail
