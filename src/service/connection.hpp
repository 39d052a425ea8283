// One client of the daemon (private to the service room): its byte streams, its request
// lines, its runs, its blob requests and its sessions, and the answers written back.
//
// All state lives on the connection's strand. Lines are read with a bounded buffer
// (`line_reader`) and read (`line_protocol`); runs go through `runtime::async_run`, each with
// its own cancellation signal; blob requests run on the daemon's pool (blocking file I/O);
// sessions are `connection_sessions`'. Backpressure: no line is read while the client has
// `max_in_flight` requests in flight, a blob request pending, `output_pause_bytes` of answers
// unwritten or `session_write_pause_bytes` of session writes waiting; a client whose
// unwritten answers pass `max_output_bytes` is disconnected.
//
// A client that disconnects (its socket hung up) has every run cancelled and every session
// closed; the runtime kills each and confirms it dead before completing it. The connection
// reports itself done (its slot in the daemon is free) only once it is closed and nothing
// of it is in flight any more.
#pragma once

#include <array>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/strand.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"
#include "service/connection_sessions.hpp"
#include "service/context.hpp"
#include "service/line_reader.hpp"

namespace sandbox::service {

/// One client: a byte stream in and one out, which for a socket are two descriptors of the
/// same socket. Create with `std::make_shared`, then `start()`.
class connection final : public std::enable_shared_from_this<connection>, private session_host {
 public:
  /// Called once, from the connection's strand, when the connection is closed and nothing
  /// of it is in flight: the daemon then forgets it (and its slot is free).
  using done_handler = std::function<void(std::shared_ptr<connection>)>;

  /// Takes ownership of `in_fd` and `out_fd` (closed on failure too); `name` names the
  /// client in log lines. Throws `std::runtime_error` when a descriptor cannot be watched.
  connection(service_context& ctx, boost::asio::io_context& io, int in_fd, int out_fd,
             std::string name, done_handler on_done);
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
  ~connection() = default;

  /// Starts reading and watching for hang-up. Call once, right after construction.
  void start();
  /// Daemon shutdown: stop reading, cancel every run, close every session, write the
  /// answers, then close. Thread-safe.
  void stop();

 private:
  using strand_t = boost::asio::strand<boost::asio::io_context::executor_type>;

  struct run_entry {
    std::string id;
    std::unique_ptr<boost::asio::cancellation_signal> cancel;
    /// `"record": true` on the run line: the answer also carries the run's record
    /// (sandbox/record.hpp), made from this request and ticket, for the client to checkpoint.
    std::optional<std::pair<sandbox::run_request, sandbox::ticket>> record_of;
  };

  // session_host: what the sessions see of the connection.
  void send(std::string line) override { queue_answer(std::move(line)); }
  void hold_id(const std::string& id) override { ids_.insert(id); }
  void release_id(const std::string& id) override { ids_.erase(id); }
  void resume() override;
  bool is_leaving() const override { return closed_ || stopping_; }
  bool has_input_ended() const override { return eof_; }
  bool can_take_output() const override;
  std::shared_ptr<void> keep_alive() override { return shared_from_this(); }

  /// Arms the hang-up watch on the output side: disconnects once the descriptor itself
  /// shows the hang-up, whatever else wakes the wait.
  void watch_hangup();
  bool paused() const;
  void read_more();
  void on_read(const boost::system::error_code& ec, std::size_t n);
  void on_eof();
  void process_lines();
  void handle_line(std::string_view line);
  void dispatch(request_line line);
  /// `id` for an answer to a line that was not parsed, or nullopt when it is in flight.
  std::optional<std::string> echo_id(const std::optional<std::string>& id) const;
  void start_run(request_line line);
  void on_run_done(std::uint64_t seq, boost::system::error_code ec, sandbox::run_result r);
  void start_blob_put(const std::string& id, blob_put_line put);
  void start_blob_get(const std::string& id, blob_get_line get);
  void start_replay(const std::string& id, replay_line replay);
  /// Runs `work` (which returns the answer line) on the daemon's pool, holding `id` in
  /// flight and reading no further line until the answer is queued.
  void start_pool_request(const std::string& id, std::function<std::string(std::size_t&)> work);
  void answer_service_stats(const std::string& id);
  /// `reserved`: bytes of `unwritten_total` held for this answer while it was made.
  void on_pool_done(const std::string& id, std::string line, std::size_t reserved);
  void queue_answer(std::string line);
  void write_next();
  void on_written(const boost::system::error_code& ec);
  void cancel_runs();
  void disconnect(const std::string& reason);
  void close_descriptors();
  void maybe_finish();
  void on_stop();
  void log(sandbox::log_level level, const std::string& message) const;

  service_context& ctx_;
  strand_t strand_;
  boost::asio::posix::stream_descriptor in_;
  boost::asio::posix::stream_descriptor out_;
  std::string name_;
  done_handler on_done_;

  std::array<char, 64 * 1024> chunk_{};
  line_reader reader_;
  bool reading_ = false;
  bool eof_ = false;       ///< no more requests (end of input, or shutdown)
  bool stopping_ = false;  ///< daemon shutdown
  bool closed_ = false;    ///< descriptors closed; answers are dropped
  bool finished_ = false;  ///< reported done

  std::map<std::uint64_t, run_entry> runs_;
  std::uint64_t next_seq_ = 0;
  std::set<std::string> ids_;  ///< ids of the requests in flight (runs, blob, sessions)
  bool pool_busy_ = false;     ///< a blob request (or replay) is on the pool

  connection_sessions sessions_;

  std::deque<std::string> wq_;  ///< answers not yet written, front first
  std::size_t wq_bytes_ = 0;    ///< also counted in `ctx_.unwritten_total`
  bool writing_ = false;
};

}  // namespace sandbox::service
