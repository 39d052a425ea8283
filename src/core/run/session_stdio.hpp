// A session run's stdio pump (sandbox/session.hpp): the program's stdin, fed from a bounded
// buffer, and its stdout, read at the host's pace.
#pragma once

#include <atomic>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/strand.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/run/control_channel.hpp"
#include "core/run/stream_reader.hpp"
#include "sandbox/session.hpp"

namespace sandbox::detail {

/**
 * The session's stdin and stdout, between the host's `async_write` / `async_read` and the
 * program. stdin: bytes are accepted into a bounded buffer (the session's
 * `stdin_buffer_bytes`; a write that does not fit waits for room) and written on to the
 * program — in pipe mode into the stdin pipe the host keeps the write end of (never raising
 * SIGPIPE in the host), in stream mode (the launcher's `stream_control`) as `stdin_data`
 * frames on the control channel, at most `stdin_window` bytes in flight until sandbox-init
 * acknowledges them. Acknowledgements are untrusted: one for bytes not in flight, or outside
 * a session, is a protocol fault. stdout: the host reads it itself; in stream mode, after
 * `quiet`, what is left in the pipe is read without waiting and an empty pipe is EOF (the
 * runtime holds the pipe open, so its end never shows).
 *
 * Thread-safety: strand only, except `stats`, which reads atomics (and the capacity, fixed
 * before the session is handed out) from any thread. Handlers complete through
 * post_completion on the session's executor. Lifetime: every pending wait holds the owner
 * given to `begin`.
 */
class session_stdio {
 public:
  /// A write's or read's completion.
  using io_handler =
      boost::asio::any_completion_handler<void(boost::system::error_code, std::size_t)>;

  /// What the pump tells its run; each is called on the strand.
  struct hooks {
    std::function<void()> activity;      ///< a byte moved (the idle timer's clock)
    std::function<void()> stdout_ended;  ///< stdout ended (EOF or an error): the run may end
    std::function<bool()> ending;        ///< the run is ending or torn down
  };

  /// `ctl` and `out` (the run's stdout reader, whose descriptor the session reads) outlive
  /// the pump. `stream`: the launcher's `stream_control`.
  session_stdio(boost::asio::strand<boost::asio::any_io_executor> strand, bool stream,
                control_channel& ctl, stream_reader& out);
  ~session_stdio();

  /// Makes the run a session: `capacity` bytes of stdin buffer, completions on `ex`.
  void begin(std::uint32_t capacity, boost::asio::any_io_executor ex, std::weak_ptr<void> owner,
             hooks h);
  /// True once `begin` ran.
  bool active() const noexcept { return active_; }

  /// Pipe mode, at launch: makes the stdin pipe (the host keeps the non-blocking write end;
  /// the read end goes to sandbox-init with `go`). False with errno on failure.
  bool make_pipe();
  /// The stdin pipe's read end until it is sent with `go`; -1 in stream mode.
  int child_fd() const noexcept { return child_fd_; }
  /// `go` went out (or failed): the read end is closed here; in stream mode, with the
  /// program's stdin (`with_stdin`), stdin is open from now on.
  void go_sent(bool with_stdin);

  /// The host's `async_write`: accepts what fits, completes once all of `d` is accepted.
  void write(boost::asio::const_buffer d, io_handler h);
  /// The host's `async_read` of the program's stdout.
  void read(boost::asio::mutable_buffer b, io_handler h);
  /// The host closes stdin: EOF for the program once every buffered byte is written.
  void close_stdin();
  /// The host closes the session: buffered bytes are dropped (stream mode: the bytes in
  /// flight stay counted until acknowledged), stdin closes, a waiting write is aborted.
  void drop_for_close();
  /// Fails a waiting write with `ec` (the run ended).
  void fail_pending_write(boost::system::error_code ec);

  /// Stream mode: sandbox-init wrote `n` more bytes into the program's pipe. Returns nullptr,
  /// or the protocol fault (an ack for bytes not in flight, or outside a stream session).
  const char* on_ack(std::uint32_t n);
  /// Stream mode: the program closed its stdin; what the host holds for it is dropped.
  /// Returns nullptr, or the protocol fault (no stream session).
  const char* on_stdin_closed();
  /// Stream mode: `quiet` came after the program's exit: a waiting read goes on without
  /// waiting (see the class comment).
  void on_quiet();

  /// True once the host read stdout's end.
  bool stdout_eof() const noexcept { return stdout_eof_; }
  /// Bytes written into the program's stdin / read from its stdout so far.
  std::uint64_t bytes_to_server() const noexcept { return bytes_to_server_.load(); }
  std::uint64_t bytes_from_server() const noexcept { return bytes_from_server_.load(); }
  /// The figures `session::stats` reports (any thread).
  session_stats stats(bool ended) const;

  /// Teardown: closes the stdin pipe's write end.
  void close();

 private:
  struct pending_write {
    boost::asio::const_buffer rest;
    std::size_t accepted = 0;
    io_handler handler;
  };

  void complete(io_handler h, boost::system::error_code ec, std::size_t n);
  void accept_input();
  bool stdin_is_open() const noexcept;
  void close_stdin_pipe();
  void flush();
  void flush_stream();
  void read_after_quiet(boost::asio::mutable_buffer b, io_handler h);

  bool stream_;
  control_channel& ctl_;
  stream_reader& out_;
  boost::asio::posix::stream_descriptor stdin_;  ///< write end of the program's stdin pipe
  boost::asio::any_io_executor ex_;
  std::weak_ptr<void> owner_;
  hooks h_;
  bool active_ = false;
  int child_fd_ = -1;  ///< the pipe's read end, until sent with `go`
  /// Stream mode: the program's stdin is fed through the control stream and still open;
  /// `sent_` bytes at the front of `buf_` are in flight (sent, not yet acknowledged:
  /// ≤ stdin_window).
  bool stream_open_ = false;
  std::size_t sent_ = 0;
  std::string buf_;  ///< accepted, not yet written (≤ capacity)
  std::uint32_t capacity_ = 0;
  bool flushing_ = false, close_requested_ = false;
  std::optional<pending_write> pending_write_;
  bool read_pending_ = false, stdout_eof_ = false;
  bool stdout_quiet_ = false;  ///< stream mode: `quiet` came (see read_after_quiet)
  std::atomic<std::uint64_t> bytes_to_server_{0}, bytes_from_server_{0};
  std::atomic<std::uint32_t> buffered_{0};
  std::atomic<bool> write_waiting_{false};
};

}  // namespace sandbox::detail
