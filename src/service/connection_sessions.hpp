// The sessions of one connection (private to the service room): `session_open`, `_write`,
// `_close_stdin`, `_close`, and the stdout events (docs/protocol.md, "Sessions").
//
//   `{"id":…,"session_open":{"ticket":T,"request":SESSION_REQUEST}}` → `{"id":…,"session":S}`;
//   `session_write` → `{"id":…,"written":N}` once the session's stdin buffer took every byte;
//   `session_close_stdin` → `{"id":…,"stdin_closed":true}` after the writes before it;
//   `session_close` → `{"id":…,"session_result":{…}}`. Stdout arrives as events without an
//   id: `{"session":S,"stdout":B64}`, then `{"session":S,"eof":true}` once it ended.
//
// Sessions belong to the connection that opened them. Each has at most one stdout read
// outstanding, started only while the connection's unwritten answers are under
// `output_pause_bytes` (so a server's output waits in its own pipe, never in the daemon),
// and a queue of writes handed to the session one at a time. Closing (by the client, or by
// the connection when the client leaves) is the session's kill-and-confirm.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/interpreter.hpp"
#include "sandbox/session.hpp"
#include "service/context.hpp"
#include "service/line_protocol.hpp"

namespace sandbox::service {

/// The connection as its sessions see it (`connection` implements it). Every call is made on
/// the connection's strand.
class session_host {
 public:
  /// Queues one answer or event line for the client (dropped once the client is gone).
  virtual void send(std::string line) = 0;
  /// Marks a request id as in flight (a line reusing it is refused) or no longer.
  virtual void hold_id(const std::string& id) = 0;
  virtual void release_id(const std::string& id) = 0;
  /// Something the sessions held was released (an answer, write bytes, a session): the
  /// connection may read, write or finish.
  virtual void resume() = 0;
  /// True once the client is gone or the daemon stops: a session that opens now is closed
  /// at once, unannounced.
  virtual bool is_leaving() const = 0;
  /// True once the client's input ended (no `session_close` can come any more).
  virtual bool has_input_ended() const = 0;
  /// True while the client is connected and its unwritten answers are under
  /// `output_pause_bytes`: only then is a session's stdout read.
  virtual bool can_take_output() const = 0;
  /// Keeps the connection (and with it this object) alive until a completion has run.
  virtual std::shared_ptr<void> keep_alive() = 0;

 protected:
  ~session_host() = default;
};

/// The open and opening sessions of one connection, with their write queues and reads. Not
/// thread-safe: every member runs on the connection's strand (`executor`).
class connection_sessions {
 public:
  /// `host` owns this object; `executor` is its strand; `name` names the client in logs.
  connection_sessions(session_host& host, service_context& ctx,
                      boost::asio::any_io_executor executor, const std::string& name);
  connection_sessions(const connection_sessions&) = delete;
  connection_sessions& operator=(const connection_sessions&) = delete;

  /// `session_open`: refused `capacity` past `max_sessions_per_client` or `max_sessions`;
  /// else opened through the runtime, answered `{"session":S}` or the runtime's error.
  void open(std::string id, session_open_line request);
  /// `session_write`: `session_not_found`, `session_ended` (closing, stdin closed), else
  /// queued for the session's stdin and answered once taken.
  void write(std::string id, session_write_line request);
  /// `session_close_stdin`: after the writes queued before it (idempotent).
  void close_stdin(std::string id, const std::string& sid);
  /// `session_close`: answered with the session's result once it ended.
  void close(std::string id, const std::string& sid);
  /// Starts a stdout read on every session that has none, while the answers have room.
  void pump_reads();
  /// Closes every session and interpreter not closing yet (the client left, or its input
  /// ended).
  void close_all();

  /// `interp_open`: counted as a session against the same limits; answered
  /// `{"interpreter":S}` or the runtime's error.
  void interp_open(std::string id, interp_open_line request);
  /// `interp_execute`: `session_not_found` (also another connection's interpreter),
  /// `session_ended` (closing), else answered `{"cell_result":{…}}` when the cell is done.
  void interp_execute(std::string id, interp_execute_line request);
  /// `interp_close`: answered with the interpreter's `session_result` once it ended.
  void interp_close(std::string id, const std::string& sid);

  /// True when no session or interpreter is open, opening or closing.
  bool empty() const noexcept { return sessions_.empty() && interps_.empty() && opening_ == 0; }
  /// Bytes of `session_write` data waiting for the sessions' stdin buffers.
  std::size_t write_bytes() const noexcept { return write_bytes_; }

 private:
  struct write_op {
    std::string id;    ///< the `session_write` line's id
    std::string data;  ///< bytes for the server's stdin
  };
  struct entry {
    std::shared_ptr<sandbox::session> s;
    std::shared_ptr<std::vector<char>> buf;  ///< stdout chunk of the outstanding read
    bool reading = false;                    ///< an async_read_some is outstanding
    bool writing = false;                    ///< the front of `writes` is in async_write
    bool out_done = false;                   ///< stdout ended (eof event sent)
    bool closing = false;                    ///< async_close started: no more requests
    bool ended = false;                      ///< async_close completed
    std::deque<write_op> writes;
    std::optional<std::string> close_stdin_id;  ///< `session_close_stdin` waiting for writes
    bool stdin_closed = false;
    std::optional<std::string> close_id;  ///< the `session_close` line's id
  };

  struct interp_entry {
    std::shared_ptr<sandbox::interpreter> in;
    std::uint32_t executing = 0;          ///< cells answered by the interpreter not yet
    bool closing = false;                 ///< async_close started: no more requests
    bool ended = false;                   ///< async_close completed
    std::optional<std::string> close_id;  ///< the `interp_close` line's id
  };
  void on_interp_opened(const std::string& id, boost::system::error_code ec,
                        sandbox::interpreter_start start);
  interp_entry* find_interp(const std::string& id, const std::string& sid,
                            const std::string& op_name);
  void close_interp(const std::string& sid, interp_entry& e);
  void maybe_erase_interp(const std::string& sid);
  /// Whether a session or interpreter may open (else the `capacity` answer is sent).
  bool reserve_slot(const std::string& id);

  void on_opened(const std::string& id, boost::system::error_code ec, sandbox::session_start start);
  /// The entry `sid` (`op_name.session` in messages); sends the error answer and returns
  /// null when there is none, or it is closing.
  entry* find(const std::string& id, const std::string& sid, const std::string& op_name);
  void write_next(const std::string& sid);
  void on_written(const std::string& sid, boost::system::error_code ec, std::size_t n);
  void close_entry(const std::string& sid, entry& e);
  void on_closed(const std::string& sid, sandbox::session_result r);
  void on_read(const std::string& sid, boost::system::error_code ec, std::size_t n);
  void maybe_erase(const std::string& sid);
  /// Forgets the bytes of one write (answered or dropped) here and daemon-wide.
  void release_write_bytes(std::size_t n);
  void log(sandbox::log_level level, const std::string& message) const;

  session_host& host_;
  service_context& ctx_;
  boost::asio::any_io_executor executor_;
  const std::string& name_;
  std::map<std::string, entry> sessions_;
  std::map<std::string, interp_entry> interps_;
  std::uint32_t opening_ = 0;    ///< session_open lines not completed yet
  std::size_t write_bytes_ = 0;  ///< bytes in the entries' `writes` queues
};

}  // namespace sandbox::service
