// `sandboxctl serve`: the service-mode daemon (docs/protocol.md, "Service mode").
//
// Structure:
//   - one io_context run by a few threads; one runtime on it (so one scheduler: the caps are
//     host-wide for every client of this daemon);
//   - `service` (on its own strand): the listening socket, signals, the set of connections,
//     the shutdown sequence;
//   - `connection` (on its own strand): reads lines from a client with a bounded buffer,
//     starts runs through `runtime::async_run` (each with its own cancellation signal), runs
//     blob requests on a small thread pool (they do blocking file I/O), and writes answers as
//     they complete. Backpressure: no line is read while the client has `max_in_flight` runs
//     in flight, a blob request pending, or `output_pause_bytes` of answers unwritten; a
//     client whose unwritten answers pass `max_output_bytes` is disconnected.
//   - A client that disconnects (its socket hung up) has every run in flight cancelled; the
//     runtime kills each one and confirms it dead before completing it.
//   - Sessions (`session_open` …, sandbox/session.hpp) belong to their connection: each has at
//     most one stdout read outstanding, started only while the connection's unwritten answers
//     are under `output_pause_bytes` (so a server's output waits in its own pipe, never in the
//     daemon), and a queue of writes handed to the session one at a time (each answered once
//     the session's stdin buffer took it). A disconnect closes them all (kill-and-confirm).
//   - stdio mode: two pump threads copy between the daemon's stdin/stdout and private pipes,
//     so the connection code is the same, the caller's file descriptions never become
//     non-blocking, and regular files (which epoll refuses) work too.
#include "serve.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/program_options.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "cli_util.hpp"
#include "core/confirmed_wait.hpp"
#include "core/json_strict.hpp"
#include "sandbox/sandbox.hpp"

namespace sandboxctl {

namespace {

namespace asio = boost::asio;
namespace po = boost::program_options;
using json = nlohmann::json;
using boost::system::error_code;
using strand_t = asio::strand<asio::io_context::executor_type>;

constexpr int exit_ok = 0;
constexpr int exit_fail = 1;
constexpr int exit_usage = 2;

/// How long a shutdown may take to cancel runs and write their answers before the daemon
/// stops anyway (the runtime's destructor then kills what is left, synchronously).
constexpr auto shutdown_grace = std::chrono::seconds(10);

// --- base64 (RFC 4648, standard alphabet, padded) ----------------------------------------

constexpr std::string_view b64_alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  auto byte = [&](std::size_t i) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(in[i]));
  };
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    std::uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
    out += b64_alphabet[(v >> 18) & 63];
    out += b64_alphabet[(v >> 12) & 63];
    out += b64_alphabet[(v >> 6) & 63];
    out += b64_alphabet[v & 63];
  }
  if (in.size() - i == 1) {
    std::uint32_t v = byte(i) << 16;
    out += b64_alphabet[(v >> 18) & 63];
    out += b64_alphabet[(v >> 12) & 63];
    out += "==";
  } else if (in.size() - i == 2) {
    std::uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8);
    out += b64_alphabet[(v >> 18) & 63];
    out += b64_alphabet[(v >> 12) & 63];
    out += b64_alphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// Strict decoding: length a multiple of 4, padding only at the end, no whitespace, and the
// unused bits of the last group zero (so every byte string has exactly one accepted form).
std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int pad = 0;
    if (last && in[i + 3] == '=') pad = in[i + 2] == '=' ? 2 : 1;
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      int d = 0;
      if (k >= 4 - pad) {
        if (in[i + k] != '=') return std::nullopt;
      } else {
        d = value(in[i + k]);
        if (d < 0) return std::nullopt;
      }
      v = (v << 6) | static_cast<std::uint32_t>(d);
    }
    if ((pad == 1 && (v & 0xff) != 0) || (pad == 2 && (v & 0xffff) != 0)) return std::nullopt;
    out += static_cast<char>((v >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
  }
  return out;
}

// --- answer lines --------------------------------------------------------------------------

/**
 * The id of a line that could not be parsed (malformed JSON, too deep, too long, ...), when
 * it can be read without parsing: the line starts, after optional whitespace, with
 * `{"id":"<id>"` (JSON whitespace allowed between the tokens), and <id> is a valid id
 * (1..max_id_bytes bytes of valid UTF-8) written without escapes or control characters. Its
 * error answer then carries that id (docs/protocol.md, "Service mode"), so a client that
 * matches answers by id learns which request failed.
 */
std::optional<std::string> leading_id(std::string_view line, std::size_t max_id_bytes = 128) {
  std::size_t i = 0;
  auto skip_ws = [&] {
    while (i < line.size() &&
           (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) {
      ++i;
    }
  };
  auto expect = [&](std::string_view token) {
    skip_ws();
    if (line.substr(i, token.size()) != token) return false;
    i += token.size();
    return true;
  };
  if (!expect("{") || !expect("\"id\"") || !expect(":") || !expect("\"")) return std::nullopt;
  const std::size_t start = i;
  while (i < line.size() && line[i] != '"') {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c == '\\' || c < 0x20 || i - start >= max_id_bytes) return std::nullopt;
    ++i;
  }
  if (i >= line.size() || i == start) return std::nullopt;
  std::string_view id = line.substr(start, i - start);
  if (!sandbox::is_valid_utf8(id)) return std::nullopt;
  return std::string(id);
}

std::string json_string(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

/// `{"id":<id or null>,"<key>":<value_json>}` and a newline.
std::string answer_line(const std::optional<std::string>& id, std::string_view key,
                        std::string_view value_json) {
  std::string s;
  s.reserve(value_json.size() + key.size() + (id ? id->size() : 4) + 16);
  s += R"({"id":)";
  s += id ? json_string(*id) : std::string("null");
  s += ",\"";
  s += key;
  s += "\":";
  s += value_json;
  s += "}\n";
  return s;
}

std::string error_line(const std::optional<std::string>& id, std::string_view code,
                       std::string_view message) {
  nlohmann::ordered_json e;
  e["code"] = std::string(code);
  e["message"] = std::string(message);
  return answer_line(id, "error", e.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string result_line(const std::string& id, const sandbox::run_result& r) {
  return answer_line(id, "result", sandbox::encode(r));
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

/// POLLHUP / POLLERR on `fd` right now: the peer of a socket closed, or the reader of a pipe
/// went away.
bool is_hung_up(int fd) {
  return (sandbox::detail::poll_events_now(fd, 0) & (POLLHUP | POLLERR)) != 0;
}

/// The hang-up watch's confirmation (sandbox::detail::async_wait_confirmed): true when `fd`
/// is hung up. What else can wake the watch is consumed here, so that it does not wake it
/// again at once: a unix socket's out-of-band byte (MSG_OOB, no part of the protocol) is
/// discarded; one that cannot be (true as well) ends the connection.
bool hangup_confirmed(int fd) {
  const short revents = sandbox::detail::poll_events_now(fd, POLLPRI);
  if ((revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) return true;
  if ((revents & POLLPRI) == 0) return false;  // a wake-up with nothing behind it
  std::array<char, 16> oob{};
  ssize_t n = 0;
  do {
    n = ::recv(fd, oob.data(), oob.size(), MSG_OOB | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  return n <= 0 && (sandbox::detail::poll_events_now(fd, POLLPRI) & POLLPRI) != 0;
}

bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t w = ::write(fd, data, size);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    size -= static_cast<std::size_t>(w);
  }
  return true;
}

class service;

// --- connection ------------------------------------------------------------------------------

/// One client: a byte stream in (`in_`) and one out (`out_`), which for a socket are two
/// descriptors of the same socket. All state lives on `strand_`.
class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(service& svc, asio::io_context& io, int in_fd, int out_fd, std::string name);
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  /// Starts reading and watching for hang-up. Call once, right after construction.
  void start();
  /// Daemon shutdown: stop reading, cancel every run, write the answers, then close.
  /// Thread-safe.
  void stop();

 private:
  struct run_entry {
    std::string id;
    std::unique_ptr<asio::cancellation_signal> cancel;
    /// `"record": true` on the run line: the answer also carries the run's record
    /// (sandbox/record.hpp), made from this request and ticket, for the client to checkpoint.
    std::optional<std::pair<sandbox::run_request, sandbox::ticket>> record_of;
  };

  /// One open session of this connection (sandbox/session.hpp), keyed by its wire id.
  struct session_write_op {
    std::string id;    ///< the `session_write` line's id
    std::string data;  ///< bytes for the server's stdin
  };
  struct session_entry {
    std::shared_ptr<sandbox::session> s;
    std::shared_ptr<std::vector<char>> buf;  ///< stdout chunk of the outstanding read
    bool reading = false;                    ///< an async_read_some is outstanding
    bool writing = false;                    ///< the front of `writes` is in async_write
    bool out_done = false;                   ///< stdout ended (eof event sent)
    bool closing = false;                    ///< async_close started: no more requests
    bool ended = false;                      ///< async_close completed
    std::deque<session_write_op> writes;
    std::optional<std::string> close_stdin_id;  ///< `session_close_stdin` waiting for writes
    bool stdin_closed = false;
    std::optional<std::string> close_id;  ///< the `session_close` line's id
  };

  sandbox::log_sink& log();
  const service_limits& limits() const;
  /// Arms the hang-up watch on the output side: disconnects once the descriptor itself
  /// shows the hang-up (`hangup_confirmed`), whatever else wakes the wait.
  void watch_hangup();
  bool paused() const;
  void read_more();
  void on_read(const error_code& ec, std::size_t n);
  void on_eof();
  void process_lines();
  void handle_line(std::string_view line);
  /// `id` for an answer to a line that was not parsed, or nullopt when it is in flight.
  std::optional<std::string> echo_id(const std::optional<std::string>& id) const;
  void start_run(std::string id, const json& doc);
  void start_blob_put(std::string id, const json& op);
  void start_blob_get(std::string id, const json& op);
  void start_replay(std::string id, const json& op);
  void start_session_open(std::string id, const json& op);
  void on_session_opened(const std::string& id, error_code ec, sandbox::session_start start);
  /// The entry named by `op.session` (`op_name.session` in messages); queues the error
  /// answer and returns null when there is none (or it is closing).
  session_entry* find_session(const std::string& id, const json& op, const std::string& op_name,
                              std::string& sid);
  void start_session_write(std::string id, const json& op);
  void start_session_close_stdin(std::string id, const json& op);
  void start_session_close(std::string id, const json& op);
  void start_service_stats(std::string id, const json& op);
  void write_session(const std::string& sid);
  void on_session_written(const std::string& sid, error_code ec, std::size_t n);
  void close_session(const std::string& sid, session_entry& e);
  void on_session_closed(const std::string& sid, sandbox::session_result r);
  /// Starts a stdout read on every session that has none, while the answer budget has room.
  void pump_session_reads();
  void on_session_read(const std::string& sid, error_code ec, std::size_t n);
  void maybe_erase_session(const std::string& sid);
  void close_sessions();
  /// The ticket of a request line's `ticket` member: verified against the trusted keys
  /// when the daemon has them, else decoded as a plain ticket. Rejections say "ticket: …".
  boost::system::result<sandbox::ticket, sandbox::rejection> ticket_of(const json& ticket_doc);
  void on_run_done(std::uint64_t seq, error_code ec, sandbox::run_result r);
  /// `reserved`: bytes of service::unwritten_total() held for this answer while it was made.
  void on_blob_done(const std::string& id, std::string line, std::size_t reserved = 0);
  void queue_answer(std::string line);
  void write_next();
  void on_written(const error_code& ec);
  void resume();
  void cancel_runs();
  void disconnect(const std::string& reason);
  void close_descriptors();
  void maybe_finish();
  void on_stop();

  service& svc_;
  strand_t strand_;
  asio::posix::stream_descriptor in_;
  asio::posix::stream_descriptor out_;
  std::string name_;

  std::array<char, 64 * 1024> chunk_{};
  std::string rbuf_;         // bytes read and not yet consumed, from rpos_
  std::size_t rpos_ = 0;     // start of the first unconsumed line
  std::size_t scan_ = 0;     // where the search for the next newline resumes
  bool discarding_ = false;  // inside an over-long line: dropping bytes up to its newline
  std::optional<std::string> discard_id_;  // that line's leading id (`leading_id`), if any
  bool reading_ = false;
  bool eof_ = false;       // no more requests (end of input, or shutdown)
  bool stopping_ = false;  // daemon shutdown
  bool closed_ = false;    // descriptors closed; answers are dropped
  bool finished_ = false;  // reported to the service

  std::map<std::uint64_t, run_entry> runs_;
  std::uint64_t next_seq_ = 0;
  std::set<std::string> ids_;  // ids of runs and blob requests in flight
  bool blob_busy_ = false;

  std::map<std::string, session_entry> sessions_;
  std::uint32_t opening_ = 0;            ///< session_open lines not completed yet
  std::size_t session_write_bytes_ = 0;  ///< bytes in the sessions' `writes` queues

  std::deque<std::string> wq_;
  std::size_t wq_bytes_ = 0;  ///< also counted in service::unwritten_total()
  bool writing_ = false;
};

// --- service ---------------------------------------------------------------------------------

/// The daemon: listening socket (or the stdio connection), signals, connections, shutdown.
class service {
 public:
  /// Unwritten answer bytes of every connection (they add and subtract their own).
  std::atomic<std::size_t>& unwritten_total() noexcept { return unwritten_total_; }
  /// Sessions open or opening, every connection together (`max_sessions`).
  std::atomic<std::size_t>& sessions() noexcept { return sessions_; }
  /// Stdout bytes read from every session's server since the start (`service_stats`).
  std::atomic<std::uint64_t>& session_stdout_bytes() noexcept { return session_stdout_bytes_; }
  /// Bytes of `session_write` data waiting in the daemon, every connection together.
  std::atomic<std::size_t>& session_write_bytes() noexcept { return session_write_bytes_; }

  service(asio::io_context& io, sandbox::runtime& rt, asio::thread_pool& pool,
          const serve_options& options)
      : io_(io),
        rt_(rt),
        pool_(pool),
        options_(options),
        log_(options.runtime.log ? options.runtime.log
                                 : sandbox::make_stderr_log_sink(sandbox::log_level::warning)),
        strand_(asio::make_strand(io)),
        acceptor_(strand_),
        signals_(strand_, SIGINT, SIGTERM, SIGHUP),
        retry_timer_(strand_),
        grace_timer_(strand_) {}

  /// Binds and listens on the socket path (mode 0660, created under umask 077 first so it is
  /// never more open than that). Empty on success, else why not.
  std::string listen(int fd) {
    error_code ec;
    acceptor_.assign(asio::local::stream_protocol(), fd, ec);
    if (ec) {
      ::close(fd);
      return "cannot watch the socket: " + ec.message();
    }
    return {};
  }

  /// Starts serving: signals, then accepting (socket mode) or the stdio connection.
  void start(int stdio_in = -1, int stdio_out = -1) {
    stdio_ = stdio_in >= 0;
    wait_signal();
    if (stdio_) {
      auto c = std::make_shared<connection>(*this, io_, stdio_in, stdio_out, "stdio client");
      conns_.insert(c);
      c->start();
    } else {
      wait_accept();
    }
  }

  /// Stops the daemon (thread-safe): see `serve`.
  void stop(std::string why) {
    asio::post(strand_, [this, why = std::move(why)] { on_stop(why); });
  }

  /// A connection is done (closed, nothing in flight). Thread-safe.
  void connection_done(std::shared_ptr<connection> c) {
    asio::post(strand_, [this, c = std::move(c)] {
      conns_.erase(c);
      if ((stdio_ || stopping_) && conns_.empty()) finish();
    });
  }

  sandbox::runtime& rt() { return rt_; }
  asio::thread_pool& pool() { return pool_; }
  const service_limits& limits() const { return options_.limits; }
  const sandbox::ticket_verifier& trusted_keys() const { return options_.trusted_keys; }
  sandbox::log_sink& log() { return log_; }

 private:
  void wait_signal() {
    signals_.async_wait([this](const error_code& ec, int sig) {
      if (ec) return;
      if (stopping_) {
        log_(sandbox::log_level::warning,
             fmt::format("serve: signal {} again: stopping without waiting", sig));
        finish();
        return;
      }
      on_stop(fmt::format("signal {}", sig));
      wait_signal();  // a second signal stops at once
    });
  }

  void wait_accept() {
    acceptor_.async_wait(asio::socket_base::wait_read, [this](const error_code& ec) {
      if (ec || stopping_) return;
      accept_ready();
    });
  }

  void accept_ready() {
    for (;;) {
      int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        // Out of descriptors or memory: try again later instead of spinning.
        log_(sandbox::log_level::warning,
             fmt::format("serve: accept4: {}; retrying in 200 ms", std::strerror(errno)));
        retry_timer_.expires_after(std::chrono::milliseconds(200));
        retry_timer_.async_wait([this](const error_code& ec) {
          if (!ec && !stopping_) wait_accept();
        });
        return;
      }
      adopt(fd);
    }
    wait_accept();
  }

  void adopt(int fd) {
    if (conns_.size() >= options_.limits.max_connections) {
      std::string line = error_line(std::nullopt, "capacity", "too many connections");
      (void)::send(fd, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ::close(fd);
      log_(sandbox::log_level::warning, "serve: connection refused: too many connections");
      return;
    }
    std::string name = fmt::format("client {}", ++clients_);
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      name += fmt::format(" (pid {}, uid {})", cred.pid, cred.uid);
    }
    int out = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (out < 0) {
      log_(sandbox::log_level::warning,
           fmt::format("serve: fcntl(F_DUPFD_CLOEXEC): {}", std::strerror(errno)));
      ::close(fd);
      return;
    }
    try {
      auto c = std::make_shared<connection>(*this, io_, fd, out, name);
      conns_.insert(c);
      log_(sandbox::log_level::info, "serve: " + name + " connected");
      c->start();
    } catch (const std::exception& e) {
      log_(sandbox::log_level::error, "serve: cannot serve " + name + ": " + e.what());
    }
  }

  void on_stop(const std::string& why) {
    if (stopping_) return;
    stopping_ = true;
    log_(sandbox::log_level::warning,
         fmt::format("serve: stopping ({}); cancelling the runs of {} connection(s)", why,
                     conns_.size()));
    error_code ec;
    acceptor_.close(ec);
    retry_timer_.cancel();
    for (const auto& c : conns_) c->stop();
    if (conns_.empty()) {
      finish();
      return;
    }
    grace_timer_.expires_after(shutdown_grace);
    grace_timer_.async_wait([this](const error_code& e) {
      if (e) return;
      log_(sandbox::log_level::warning, "serve: shutdown grace period over; stopping now");
      finish();
    });
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    error_code ec;
    signals_.cancel(ec);
    grace_timer_.cancel();
    retry_timer_.cancel();
    acceptor_.close(ec);
    io_.stop();
  }

  asio::io_context& io_;
  sandbox::runtime& rt_;
  asio::thread_pool& pool_;
  std::atomic<std::size_t> unwritten_total_{0};
  std::atomic<std::size_t> sessions_{0};
  std::atomic<std::uint64_t> session_stdout_bytes_{0};
  std::atomic<std::size_t> session_write_bytes_{0};
  const serve_options& options_;
  sandbox::log_sink log_;
  strand_t strand_;
  asio::local::stream_protocol::acceptor acceptor_;
  asio::signal_set signals_;
  asio::steady_timer retry_timer_;
  asio::steady_timer grace_timer_;
  std::set<std::shared_ptr<connection>> conns_;
  std::uint64_t clients_ = 0;
  bool stdio_ = false;
  bool stopping_ = false;
  bool finished_ = false;
};

// --- connection: implementation ----------------------------------------------------------

connection::connection(service& svc, asio::io_context& io, int in_fd, int out_fd, std::string name)
    : svc_(svc),
      strand_(asio::make_strand(io)),
      in_(strand_),
      out_(strand_),
      name_(std::move(name)) {
  error_code ec;
  in_.assign(in_fd, ec);
  if (ec) {
    ::close(in_fd);
    ::close(out_fd);
    throw std::runtime_error("cannot watch the input: " + ec.message());
  }
  out_.assign(out_fd, ec);
  if (ec) {
    ::close(out_fd);
    throw std::runtime_error("cannot watch the output: " + ec.message());
  }
}

sandbox::log_sink& connection::log() { return svc_.log(); }
const service_limits& connection::limits() const { return svc_.limits(); }

void connection::start() {
  asio::dispatch(strand_, [self = shared_from_this()] {
    self->watch_hangup();
    // A hang-up before the wait was queued would have been missed (edge-triggered): check.
    if (is_hung_up(self->out_.native_handle())) {
      self->disconnect("client disconnected");
      return;
    }
    self->read_more();
  });
}

void connection::stop() {
  asio::post(strand_, [self = shared_from_this()] { self->on_stop(); });
}

void connection::watch_hangup() {
  // Completes on EPOLLHUP/EPOLLERR of the output side even while reading is paused, so a
  // client that disconnects (closes its socket, or the reader of our stdout goes away) has
  // its runs and sessions ended at once. Confirmed on the descriptor itself: a bare wake-up
  // (Asio applies another, closed descriptor's events to a recycled one; see
  // core/confirmed_wait.hpp) once dropped live clients with their requests unanswered
  // whenever one client disconnected while another connected.
  sandbox::detail::async_wait_confirmed(
      out_, asio::posix::descriptor_base::wait_error, hangup_confirmed,
      [self = shared_from_this()](const error_code& ec) {
        if (ec || self->closed_) return;
        self->disconnect(is_hung_up(self->out_.native_handle())
                             ? "client disconnected"
                             : "out-of-band data that cannot be discarded");
      });
}

void connection::on_stop() {
  stopping_ = true;
  if (closed_) return;
  eof_ = true;
  rbuf_.clear();
  rpos_ = scan_ = 0;
  discarding_ = false;
  error_code ec;
  in_.close(ec);  // no more requests; a pending read completes with operation_aborted
  cancel_runs();
  close_sessions();
  maybe_finish();
}

bool connection::paused() const {
  // ids_ holds every request in flight: runs, the blob request, session lines.
  return blob_busy_ || ids_.size() >= limits().max_in_flight ||
         wq_bytes_ >= limits().output_pause_bytes ||
         session_write_bytes_ >= limits().session_write_pause_bytes;
}

void connection::read_more() {
  if (closed_ || eof_ || reading_ || paused()) return;
  reading_ = true;
  in_.async_read_some(
      asio::buffer(chunk_),
      [self = shared_from_this()](const error_code& ec, std::size_t n) { self->on_read(ec, n); });
}

void connection::on_read(const error_code& ec, std::size_t n) {
  reading_ = false;
  if (closed_ || stopping_) {
    maybe_finish();
    return;
  }
  if (ec == asio::error::eof) {
    on_eof();
    return;
  }
  if (ec) {
    disconnect("read failed: " + ec.message());
    return;
  }
  rbuf_.append(chunk_.data(), n);
  process_lines();
  read_more();
  maybe_finish();
}

void connection::on_eof() {
  eof_ = true;
  // A last line without its newline still counts (and ends an over-long line).
  if (rbuf_.size() > rpos_ || discarding_) rbuf_ += '\n';
  // EOF with the socket hung up is a disconnect; without, the client only closed its
  // sending side (shutdown(SHUT_WR)) and still reads the answers.
  if (is_hung_up(out_.native_handle())) {
    disconnect("client disconnected");
    return;
  }
  process_lines();
  // No session_close can come any more: the sessions are closed (kill-and-confirm) now, their
  // output up to then still delivered.
  close_sessions();
  maybe_finish();
}

void connection::process_lines() {
  const std::size_t max_line = limits().max_line_bytes;
  while (!closed_ && !stopping_ && !paused()) {
    if (discarding_) {
      auto nl = rbuf_.find('\n', rpos_);
      if (nl == std::string::npos) {
        rbuf_.clear();
        rpos_ = scan_ = 0;
        break;
      }
      rpos_ = scan_ = nl + 1;
      discarding_ = false;
      queue_answer(error_line(echo_id(discard_id_), "invalid_request",
                              fmt::format("line is longer than {} bytes", max_line)));
      discard_id_.reset();
      continue;
    }
    auto nl = rbuf_.find('\n', std::max(scan_, rpos_));
    if (nl == std::string::npos) {
      if (rbuf_.size() - rpos_ > max_line) {
        // Never buffer an over-long line: drop what we have and the rest up to its newline
        // (keeping only its leading id, for the answer).
        discard_id_ = leading_id(std::string_view(rbuf_).substr(rpos_), limits().max_id_bytes);
        discarding_ = true;
        rbuf_.clear();
        rpos_ = scan_ = 0;
        continue;
      }
      scan_ = rbuf_.size();
      break;
    }
    std::string_view line(rbuf_.data() + rpos_, nl - rpos_);
    rpos_ = scan_ = nl + 1;
    if (line.size() > max_line) {
      queue_answer(error_line(echo_id(leading_id(line, limits().max_id_bytes)), "invalid_request",
                              fmt::format("line is longer than {} bytes", max_line)));
      continue;
    }
    handle_line(line);
  }
  // Compact: drop consumed bytes once they are all consumed or the prefix is large.
  if (rpos_ > 0 && (rpos_ >= rbuf_.size() || rpos_ >= chunk_.size())) {
    rbuf_.erase(0, rpos_);
    scan_ = scan_ > rpos_ ? scan_ - rpos_ : 0;
    rpos_ = 0;
  }
}

std::optional<std::string> connection::echo_id(const std::optional<std::string>& id) const {
  // An id in flight is not echoed: the error would be taken for that request's answer.
  if (!id || ids_.count(*id) != 0) return std::nullopt;
  return id;
}

void connection::handle_line(std::string_view line) {
  std::optional<std::string> id;
  try {
    // Blank lines (and a trailing CR) are tolerated: they carry no request.
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.remove_suffix(1);
    }
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;

    // Strict parse of the envelope (duplicate keys, invalid UTF-8, trailing garbage and the
    // like are refused, as for every protocol document). One level more than a request may
    // have, since the request sits one level down.
    json doc;
    sandbox::decode_options dopt;
    dopt.max_document_bytes = limits().max_line_bytes;
    dopt.max_depth = dopt.max_depth + 1;
    if (auto err = sandbox::detail::parse_strict(line, dopt, doc)) {
      // Two ids: neither is the line's own.
      const bool two_ids = *err == "duplicate field 'id'";
      // The parser counts the line's own level; the documents in it (ticket, request) have
      // the documented limit, which is what the message names (docs/protocol.md, "Lines").
      if (err->rfind("nesting deeper than ", 0) == 0) {
        *err = fmt::format(
            "nesting deeper than {} levels (a document in the line; {} counting "
            "the line itself)",
            dopt.max_depth - 1, dopt.max_depth);
      }
      queue_answer(error_line(two_ids ? std::nullopt
                                      : echo_id(leading_id(line, limits().max_id_bytes)),
                              "invalid_request", *err));
      return;
    }
    if (!doc.is_object()) {
      queue_answer(error_line(std::nullopt, "invalid_request", "expected a JSON object"));
      return;
    }
    const json* idv = sandbox::detail::find_member(doc, "id");
    if (idv == nullptr) {
      queue_answer(error_line(std::nullopt, "invalid_request", "id: required field is missing"));
      return;
    }
    if (!idv->is_string()) {
      queue_answer(error_line(std::nullopt, "invalid_request", "id: expected a string"));
      return;
    }
    const auto& s = idv->get_ref<const std::string&>();
    if (s.empty() || s.size() > limits().max_id_bytes) {
      queue_answer(error_line(std::nullopt, "invalid_request",
                              fmt::format("id: expected 1 to {} bytes", limits().max_id_bytes)));
      return;
    }
    id = s;

    // Session and stats lines: `{"id":…, "<op>":{…}}`, nothing else beside the id.
    static constexpr std::array<std::string_view, 5> session_ops{
        "session_open", "session_write", "session_close_stdin", "session_close", "service_stats"};
    for (auto op : session_ops) {
      if (sandbox::detail::find_member(doc, op) == nullptr) continue;
      try {
        sandbox::detail::check_known_fields(doc, "", {"id", op});
      } catch (const sandbox::detail::decode_error& e) {
        queue_answer(error_line(id, "invalid_request", e.what()));
        return;
      }
      if (ids_.count(*id) != 0) {
        queue_answer(error_line(
            std::nullopt, "invalid_request",
            fmt::format("id: a request with id {} is still in flight",
                        escape_format_chars(sandbox::detail::quote_for_message(*id, 64)))));
        return;
      }
      const json& body = doc[std::string(op)];
      if (op == "session_open") {
        start_session_open(*id, body);
      } else if (op == "session_write") {
        start_session_write(*id, body);
      } else if (op == "session_close_stdin") {
        start_session_close_stdin(*id, body);
      } else if (op == "session_close") {
        start_session_close(*id, body);
      } else {
        start_service_stats(*id, body);
      }
      return;
    }

    const bool put = sandbox::detail::find_member(doc, "blob_put") != nullptr;
    const bool get = !put && sandbox::detail::find_member(doc, "blob_get") != nullptr;
    const bool replay = !put && !get && sandbox::detail::find_member(doc, "replay") != nullptr;
    try {
      if (put) {
        sandbox::detail::check_known_fields(doc, "", {"id", "blob_put"});
      } else if (get) {
        sandbox::detail::check_known_fields(doc, "", {"id", "blob_get"});
      } else if (replay) {
        sandbox::detail::check_known_fields(doc, "", {"id", "replay"});
      } else {
        sandbox::detail::check_known_fields(doc, "", {"id", "ticket", "request", "record"});
        if (const json* rec = sandbox::detail::find_member(doc, "record")) {
          sandbox::detail::as_bool(*rec, "record");
        }
        sandbox::detail::require_member(doc, "", "ticket");
        sandbox::detail::require_member(doc, "", "request");
      }
    } catch (const sandbox::detail::decode_error& e) {
      queue_answer(error_line(id, "invalid_request", e.what()));
      return;
    }
    if (ids_.count(*id) != 0) {
      // Answered with id null: under its own id, a client matching answers by id would hand
      // this error to the request in flight, and then get a second answer it cannot place.
      queue_answer(error_line(
          std::nullopt, "invalid_request",
          fmt::format("id: a request with id {} is still in flight",
                      escape_format_chars(sandbox::detail::quote_for_message(*id, 64)))));
      return;
    }
    if (put) {
      start_blob_put(*id, doc["blob_put"]);
    } else if (get) {
      start_blob_get(*id, doc["blob_get"]);
    } else if (replay) {
      start_replay(*id, doc["replay"]);
    } else {
      start_run(*id, doc);
    }
  } catch (const std::exception& e) {
    log()(sandbox::log_level::error, "serve: " + name_ + ": " + e.what());
    queue_answer(error_line(id, "internal", "internal error"));
  }
}

boost::system::result<sandbox::ticket, sandbox::rejection> connection::ticket_of(
    const json& ticket_doc) {
  // Without trusted keys, the ticket is trusted as `sandboxctl run` trusts ticket files: the
  // socket's permissions decide who may send one. With them, only a signed document whose
  // whole chain verifies is a ticket.
  boost::system::result<sandbox::ticket, sandbox::rejection> ticket =
      sandbox::rejection{sandbox::code::internal, "internal error"};
  if (const auto& keys = svc_.trusted_keys(); !keys.empty()) {
    if (!ticket_doc.is_object() || sandbox::detail::find_member(ticket_doc, "sig") == nullptr) {
      ticket = sandbox::rejection{sandbox::code::action_denied,
                                  "unsigned ticket: this daemon accepts only signed tickets"};
    } else {
      ticket = keys.verify(dump(ticket_doc), std::chrono::system_clock::now());
    }
  } else {
    ticket = sandbox::ticket_issuer{}.decode(dump(ticket_doc));
  }
  if (!ticket) {
    auto rej = ticket.error();
    rej.message = "ticket: " + rej.message;
    return rej;
  }
  return ticket;
}

void connection::start_run(std::string id, const json& doc) {
  auto ticket = ticket_of(doc["ticket"]);
  if (!ticket) {
    queue_answer(result_line(id, sandbox::rejected_result(ticket.error())));
    return;
  }
  auto request = sandbox::decode_run_request(dump(doc["request"]));
  if (!request) {
    auto rej = request.error();
    rej.message = "request: " + rej.message;
    queue_answer(result_line(id, sandbox::rejected_result(rej)));
    return;
  }
  const std::uint64_t seq = ++next_seq_;
  auto& entry = runs_[seq];
  entry.id = id;
  entry.cancel = std::make_unique<asio::cancellation_signal>();
  if (const json* rec = sandbox::detail::find_member(doc, "record"); rec && rec->get<bool>()) {
    entry.record_of.emplace(*request, *ticket);
  }
  ids_.insert(id);
  // The completion is re-posted to the strand, so that it never runs inside an `emit`
  // below (which would erase the signal being emitted).
  try {
    svc_.rt().async_run(
        std::move(*request), std::move(*ticket),
        asio::bind_cancellation_slot(
            entry.cancel->slot(),
            asio::bind_executor(strand_, [self = shared_from_this(), seq](
                                             error_code ec, sandbox::run_result r) mutable {
              asio::post(self->strand_, [self, seq, ec, r = std::move(r)]() mutable {
                self->on_run_done(seq, ec, std::move(r));
              });
            })));
  } catch (...) {
    // Not started (out of memory): forget it, so the connection can still finish.
    runs_.erase(seq);
    ids_.erase(id);
    throw;
  }
}

void connection::on_run_done(std::uint64_t seq, error_code ec, sandbox::run_result r) {
  auto it = runs_.find(seq);
  if (it == runs_.end()) return;
  std::string id = std::move(it->second.id);
  auto record_of = std::move(it->second.record_of);
  runs_.erase(it);
  ids_.erase(id);
  if (ec && !stopping_) {
    log()(sandbox::log_level::info,
          fmt::format("serve: {}: run {} ended: {}", name_, r.run_id, ec.message()));
  }
  if (record_of) {
    // {"id":…,"result":{…},"record":{…}}: the record embeds the same result.
    std::string line = result_line(id, r);
    line.pop_back();  // "}\n"
    line.pop_back();
    line += ",\"record\":";
    line += sandbox::encode(sandbox::make_run_record(record_of->first, record_of->second, r));
    line += "}\n";
    queue_answer(std::move(line));
  } else {
    queue_answer(result_line(id, r));
  }
  resume();
}

void connection::start_blob_put(std::string id, const json& op) {
  std::string tenant;
  std::string data;
  try {
    sandbox::detail::as_object(op, "blob_put");
    sandbox::detail::check_known_fields(op, "blob_put", {"tenant", "data_b64"});
    tenant = sandbox::detail::as_string(sandbox::detail::require_member(op, "blob_put", "tenant"),
                                        "blob_put.tenant");
    const auto& d = sandbox::detail::require_member(op, "blob_put", "data_b64");
    if (!d.is_string()) sandbox::detail::fail("blob_put.data_b64", "expected a string");
    const auto& b64 = d.get_ref<const std::string&>();
    if (b64.size() / 4 * 3 > limits().max_blob_put_bytes + 2) {
      queue_answer(error_line(
          id, "too_large",
          fmt::format("blob_put.data_b64: more than {} bytes", limits().max_blob_put_bytes)));
      return;
    }
    auto decoded = base64_decode(b64);
    if (!decoded) sandbox::detail::fail("blob_put.data_b64", "not valid base64 (RFC 4648, padded)");
    data = std::move(*decoded);
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  if (!sandbox::is_valid_tenant(tenant)) {
    queue_answer(error_line(id, "invalid_request", "blob_put.tenant: invalid tenant name"));
    return;
  }
  if (data.size() > limits().max_blob_put_bytes) {
    queue_answer(error_line(
        id, "too_large",
        fmt::format("blob_put.data_b64: more than {} bytes", limits().max_blob_put_bytes)));
    return;
  }
  blob_busy_ = true;
  ids_.insert(id);
  asio::post(svc_.pool(), [self = shared_from_this(), blobs = svc_.rt().blobs(), id,
                           tenant = std::move(tenant), data = std::move(data)] {
    std::string line;
    try {
      auto r =
          blobs ? blobs->put(tenant, data)
                : sandbox::result<std::string>(sandbox::make_error_code(sandbox::errc::io_error));
      if (r) {
        line = answer_line(id, "blob", json_string(*r));
      } else if (r.error() == sandbox::make_error_code(sandbox::errc::quota_exceeded)) {
        line = error_line(id, "quota_exceeded", "the tenant's blob quota is exhausted");
      } else if (r.error() == sandbox::make_error_code(sandbox::errc::invalid_argument)) {
        line = error_line(id, "invalid_request", "blob_put.tenant: invalid tenant name");
      } else {
        self->log()(sandbox::log_level::error,
                    "serve: blob put for " + tenant + ": " + r.error().message());
        line = error_line(id, "internal", "the blob could not be stored");
      }
    } catch (const std::exception&) {
      line = error_line(id, "internal", "internal error");
    }
    asio::post(self->strand_, [self, id, line = std::move(line)]() mutable {
      self->on_blob_done(id, std::move(line));
    });
  });
}

void connection::start_blob_get(std::string id, const json& op) {
  std::string tenant;
  std::string blob;
  try {
    sandbox::detail::as_object(op, "blob_get");
    sandbox::detail::check_known_fields(op, "blob_get", {"tenant", "blob"});
    tenant = sandbox::detail::as_string(sandbox::detail::require_member(op, "blob_get", "tenant"),
                                        "blob_get.tenant");
    blob = sandbox::detail::as_string(sandbox::detail::require_member(op, "blob_get", "blob"),
                                      "blob_get.blob");
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  if (!sandbox::is_valid_tenant(tenant)) {
    queue_answer(error_line(id, "invalid_request", "blob_get.tenant: invalid tenant name"));
    return;
  }
  if (!sandbox::is_valid_blob_id(blob)) {
    queue_answer(error_line(id, "invalid_request",
                            "blob_get.blob: expected sha256: and 64 lowercase hex digits"));
    return;
  }
  blob_busy_ = true;
  ids_.insert(id);
  const std::size_t cap = limits().max_blob_get_bytes;
  const std::size_t budget = limits().max_total_output_bytes;
  auto* total = &svc_.unwritten_total();
  asio::post(svc_.pool(), [self = shared_from_this(), blobs = svc_.rt().blobs(), id, cap, budget,
                           total, tenant = std::move(tenant), blob = std::move(blob)] {
    std::string line;
    std::size_t reserved = 0;
    try {
      using sandbox::errc;
      using sandbox::make_error_code;
      auto fail = [&](const boost::system::error_code& ec) {
        if (ec == make_error_code(errc::not_found)) {
          // Also for another tenant's blob: its existence is not revealed.
          return error_line(id, "blob_not_found", "no such blob for this tenant");
        }
        if (ec == make_error_code(errc::invalid_argument)) {
          return error_line(id, "invalid_request", "blob_get: invalid tenant or blob id");
        }
        self->log()(sandbox::log_level::error,
                    "serve: blob get " + blob + " for " + tenant + ": " + ec.message());
        return error_line(id, "internal", "the blob could not be read");
      };
      if (!blobs) {
        line = fail(make_error_code(errc::io_error));
      } else if (auto size = blobs->size(tenant, blob); !size) {
        line = fail(size.error());
      } else if (*size > cap) {
        line = error_line(
            id, "too_large",
            fmt::format("the blob has {} bytes; blob_get returns at most {}", *size, cap));
      } else if (reserved = *size / 3 * 4 + 4096 + id.size();
                 total->fetch_add(reserved) + reserved > budget) {
        // Every connection's unwritten answers together stay within the daemon-wide budget,
        // so clients that do not read cannot grow the daemon without bound. (Reserved until
        // the answer is queued; then it counts as what it is.)
        line = error_line(id, "capacity",
                          "the daemon holds too many unread answers; retry after reading yours");
      } else if (auto bytes = blobs->get(tenant, blob); !bytes) {
        line = fail(bytes.error());
      } else if (bytes->size() > cap) {  // replaced between size() and get()
        line = error_line(id, "too_large", fmt::format("blob_get returns at most {} bytes", cap));
      } else {
        std::string b64 = base64_encode(*bytes);
        line = answer_line(id, "data_b64", "\"" + b64 + "\"");
      }
    } catch (const std::exception&) {
      line = error_line(id, "internal", "internal error");
    }
    asio::post(self->strand_, [self, id, reserved, line = std::move(line)]() mutable {
      self->on_blob_done(id, std::move(line), reserved);
    });
  });
}

// `op` (the value of line member `name`) is an object holding exactly `fields`, every one of
// them: throws decode_error naming the first fault, as the codec's decoders do.
void require_exactly(const json& op, const std::string& name,
                     std::initializer_list<std::string_view> fields) {
  sandbox::detail::as_object(op, name);
  sandbox::detail::check_known_fields(op, name, fields);
  for (auto f : fields) sandbox::detail::require_member(op, name, f);
}

// `{"id":…, "replay":{"ticket":{…}, "record":{…run record…}}}`: answers like a run (a
// `result` line), with the stored result and nothing executed, or a rejected result
// (`blob_not_found` naming the collected blob, `action_denied` for another tenant's record,
// `invalid_request` for a malformed record). The blob checks are file I/O: on the pool.
void connection::start_replay(std::string id, const json& op) {
  try {
    require_exactly(op, "replay", {"ticket", "record"});
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  auto ticket = ticket_of(op["ticket"]);
  if (!ticket) {
    queue_answer(result_line(id, sandbox::rejected_result(ticket.error())));
    return;
  }
  auto record = sandbox::decode_run_record(dump(op["record"]));
  if (!record) {
    auto rej = record.error();
    rej.message = "replay.record: " + rej.message;
    queue_answer(result_line(id, sandbox::rejected_result(rej)));
    return;
  }
  blob_busy_ = true;
  ids_.insert(id);
  asio::post(svc_.pool(), [self = shared_from_this(), blobs = svc_.rt().blobs(), id,
                           record = std::move(*record), ticket = std::move(*ticket)] {
    std::string line;
    try {
      auto r = blobs ? sandbox::replay_run(*blobs, record, ticket)
                     : boost::system::result<sandbox::run_result, sandbox::rejection>(
                           sandbox::rejection{sandbox::code::internal, "no blob store"});
      line = result_line(id, r ? *r : sandbox::rejected_result(r.error()));
    } catch (const std::exception&) {
      line = error_line(id, "internal", "internal error");
    }
    asio::post(self->strand_, [self, id, line = std::move(line)]() mutable {
      self->on_blob_done(id, std::move(line));
    });
  });
}

// --- sessions ------------------------------------------------------------------------------
//
// `{"id":…,"session_open":{"ticket":T,"request":SESSION_REQUEST}}` → `{"id":…,"session":S}`;
// `session_write` → `{"id":…,"written":N}` once the session's stdin buffer took every byte;
// `session_close_stdin` → `{"id":…,"stdin_closed":true}` after the writes before it;
// `session_close` → `{"id":…,"session_result":{…}}`. Stdout arrives as events without an id:
// `{"session":S,"stdout":B64}`, then `{"session":S,"eof":true}` once it ended.

void connection::start_session_open(std::string id, const json& op) {
  try {
    require_exactly(op, "session_open", {"ticket", "request"});
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  auto ticket = ticket_of(op["ticket"]);
  if (!ticket) {
    queue_answer(error_line(id, sandbox::to_string(ticket.error().code),
                            "session_open." + ticket.error().message));
    return;
  }
  auto request = sandbox::decode_session_request(dump(op["request"]));
  if (!request) {
    queue_answer(
        error_line(id, "invalid_request", "session_open.request: " + request.error().message));
    return;
  }
  if (sessions_.size() + opening_ >= limits().max_sessions_per_client) {
    queue_answer(
        error_line(id, "capacity",
                   fmt::format("this connection has {} sessions open (at most {})",
                               sessions_.size() + opening_, limits().max_sessions_per_client)));
    return;
  }
  if (svc_.sessions().fetch_add(1) >= limits().max_sessions) {
    svc_.sessions() -= 1;
    queue_answer(error_line(id, "capacity",
                            fmt::format("the daemon has {} sessions open (at most {})",
                                        limits().max_sessions, limits().max_sessions)));
    return;
  }
  ++opening_;
  ids_.insert(id);
  try {
    svc_.rt().async_open_session(
        std::move(*request), std::move(*ticket),
        asio::bind_executor(strand_, [self = shared_from_this(), id](
                                         error_code ec, sandbox::session_start start) mutable {
          self->on_session_opened(id, ec, std::move(start));
        }));
  } catch (...) {
    --opening_;
    ids_.erase(id);
    svc_.sessions() -= 1;
    throw;
  }
}

void connection::on_session_opened(const std::string& id, error_code ec,
                                   sandbox::session_start start) {
  --opening_;
  ids_.erase(id);
  if (ec || !start.session) {
    svc_.sessions() -= 1;
    const auto c = ec && start.code == sandbox::code::ok ? sandbox::code::internal : start.code;
    std::string message =
        start.message.empty() ? std::string("the session could not be started") : start.message;
    // The runtime's invalid_request at open is about the request (its `tool`); name it as
    // the wire does, like the decoder's messages.
    if (c == sandbox::code::invalid_request) message = "session_open.request: " + message;
    queue_answer(error_line(id, sandbox::to_string(c), message));
    resume();
    return;
  }
  const std::string sid = start.session->id();
  auto& e = sessions_[sid];
  e.s = std::move(start.session);
  e.buf = std::make_shared<std::vector<char>>(limits().session_read_chunk_bytes);
  if (closed_ || stopping_) {
    // The client went away (or the daemon stops) while the server started: stop it at once.
    log()(
        sandbox::log_level::info,
        fmt::format("serve: {}: session {} opened after the client left; closing it", name_, sid));
    close_session(sid, e);
    maybe_finish();
    return;
  }
  log()(sandbox::log_level::info, fmt::format("serve: {}: session {} opened", name_, sid));
  queue_answer(answer_line(id, "session", json_string(sid)));
  if (eof_) {
    // The client's input ended (shutdown(SHUT_WR), end of stdin) while the server started
    // (queued for a slot, or starting): close_sessions() already ran and no session_close
    // can come, so it is closed now, like the others (kill-and-confirm). The client still
    // reads the answer and output read before the kill; the connection then ends.
    log()(sandbox::log_level::info,
          fmt::format("serve: {}: session {} opened after end of input; closing it", name_, sid));
    close_session(sid, e);
  }
  resume();
}

connection::session_entry* connection::find_session(const std::string& id, const json& op,
                                                    const std::string& op_name, std::string& sid) {
  try {
    sandbox::detail::as_object(op, op_name);
    sid = sandbox::detail::as_string(sandbox::detail::require_member(op, op_name, "session"),
                                     op_name + ".session");
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return nullptr;
  }
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) {
    // Also another connection's session: sessions belong to the connection that opened them.
    queue_answer(
        error_line(id, "session_not_found",
                   fmt::format("{}.session: no session {} on this connection", op_name,
                               escape_format_chars(sandbox::detail::quote_for_message(sid, 64)))));
    return nullptr;
  }
  if (it->second.closing) {
    queue_answer(error_line(id, "session_ended",
                            fmt::format("{}.session: the session is closing", op_name)));
    return nullptr;
  }
  return &it->second;
}

void connection::start_session_write(std::string id, const json& op) {
  std::string data;
  try {
    sandbox::detail::as_object(op, "session_write");
    sandbox::detail::check_known_fields(op, "session_write", {"session", "data_b64", "text"});
    const json* b64 = sandbox::detail::find_member(op, "data_b64");
    const json* text = sandbox::detail::find_member(op, "text");
    if ((b64 == nullptr) == (text == nullptr)) {
      sandbox::detail::fail("session_write", "expected exactly one of data_b64 and text");
    }
    if (text != nullptr) {
      data = sandbox::detail::as_string(*text, "session_write.text");
    } else {
      if (!b64->is_string()) sandbox::detail::fail("session_write.data_b64", "expected a string");
      auto decoded = base64_decode(b64->get_ref<const std::string&>());
      if (!decoded) {
        sandbox::detail::fail("session_write.data_b64", "not valid base64 (RFC 4648, padded)");
      }
      data = std::move(*decoded);
    }
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  std::string sid;
  session_entry* e = find_session(id, op, "session_write", sid);
  if (e == nullptr) return;
  if (e->stdin_closed || e->close_stdin_id) {
    queue_answer(error_line(id, "session_ended", "session_write: the session's stdin is closed"));
    return;
  }
  ids_.insert(id);
  session_write_bytes_ += data.size();
  svc_.session_write_bytes() += data.size();
  e->writes.push_back({std::move(id), std::move(data)});
  write_session(sid);
}

void connection::write_session(const std::string& sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  auto& e = it->second;
  if (e.writing || e.closing) return;
  if (e.writes.empty()) {
    if (e.close_stdin_id) {
      // Every write before the close_stdin line was accepted: now the server gets EOF.
      e.s->close_stdin();
      e.stdin_closed = true;
      std::string id = std::move(*e.close_stdin_id);
      e.close_stdin_id.reset();
      ids_.erase(id);
      queue_answer(answer_line(id, "stdin_closed", "true"));
    }
    return;
  }
  e.writing = true;
  // The data stays in the queue's front element (a deque never moves it) until the handler.
  const std::string& data = e.writes.front().data;
  e.s->async_write(
      asio::buffer(data),
      asio::bind_executor(strand_, [self = shared_from_this(), sid](error_code ec, std::size_t n) {
        self->on_session_written(sid, ec, n);
      }));
}

void connection::on_session_written(const std::string& sid, error_code ec, std::size_t n) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  auto& e = it->second;
  e.writing = false;
  session_write_op op = std::move(e.writes.front());
  e.writes.pop_front();
  session_write_bytes_ -= op.data.size();
  svc_.session_write_bytes() -= op.data.size();
  ids_.erase(op.id);
  if (!ec) {
    queue_answer(answer_line(op.id, "written", std::to_string(n)));
  } else if (ec == asio::error::broken_pipe) {
    queue_answer(error_line(op.id, "session_ended",
                            fmt::format("session_write: the server's stdin is closed ({} of {} "
                                        "bytes accepted)",
                                        n, op.data.size())));
  } else {
    queue_answer(
        error_line(op.id, "session_ended",
                   fmt::format("session_write: the session ended ({} of {} bytes accepted)", n,
                               op.data.size())));
  }
  if (e.closing) {
    maybe_erase_session(sid);
  } else {
    write_session(sid);
  }
  resume();
}

void connection::start_session_close_stdin(std::string id, const json& op) {
  std::string sid;
  try {
    sandbox::detail::as_object(op, "session_close_stdin");
    sandbox::detail::check_known_fields(op, "session_close_stdin", {"session"});
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  session_entry* e = find_session(id, op, "session_close_stdin", sid);
  if (e == nullptr) return;
  if (e->stdin_closed || e->close_stdin_id) {
    queue_answer(answer_line(id, "stdin_closed", "true"));  // idempotent, like close_stdin()
    return;
  }
  ids_.insert(id);
  e->close_stdin_id = std::move(id);
  write_session(sid);  // closes now when no write is waiting
}

void connection::start_session_close(std::string id, const json& op) {
  std::string sid;
  try {
    sandbox::detail::as_object(op, "session_close");
    sandbox::detail::check_known_fields(op, "session_close", {"session"});
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  session_entry* e = find_session(id, op, "session_close", sid);
  if (e == nullptr) return;
  ids_.insert(id);
  e->close_id = std::move(id);
  close_session(sid, *e);
}

void connection::close_session(const std::string& sid, session_entry& e) {
  if (e.closing) return;
  e.closing = true;
  // Writes not yet handed to the session will never be: answer them now.
  const std::size_t keep = e.writing ? 1 : 0;
  while (e.writes.size() > keep) {
    session_write_op op = std::move(e.writes.back());
    e.writes.pop_back();
    session_write_bytes_ -= op.data.size();
    svc_.session_write_bytes() -= op.data.size();
    ids_.erase(op.id);
    queue_answer(error_line(op.id, "session_ended",
                            "session_write: the session was closed before this write"));
  }
  if (e.close_stdin_id) {
    ids_.erase(*e.close_stdin_id);
    queue_answer(answer_line(*e.close_stdin_id, "stdin_closed", "true"));
    e.close_stdin_id.reset();
  }
  e.s->async_close(asio::bind_executor(
      strand_, [self = shared_from_this(), sid](error_code, sandbox::session_result r) mutable {
        self->on_session_closed(sid, std::move(r));
      }));
}

void connection::on_session_closed(const std::string& sid, sandbox::session_result r) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  auto& e = it->second;
  e.ended = true;
  svc_.sessions() -= 1;
  log()(sandbox::log_level::info,
        fmt::format("serve: {}: session {} closed ({})", name_, sid, sandbox::to_string(r.end)));
  if (e.close_id) {
    ids_.erase(*e.close_id);
    queue_answer(answer_line(*e.close_id, "session_result", sandbox::encode(r)));
    e.close_id.reset();
  }
  maybe_erase_session(sid);
  resume();
}

void connection::pump_session_reads() {
  if (closed_) return;
  for (auto& [sid, e] : sessions_) {
    // Read only while the client's outgoing budget has room: otherwise the server's output
    // stays in its own pipe (and the server blocks on it), never in the daemon.
    if (wq_bytes_ >= limits().output_pause_bytes) return;
    if (e.reading || e.out_done || e.ended) continue;
    e.reading = true;
    e.s->async_read_some(asio::buffer(*e.buf),
                         asio::bind_executor(strand_, [self = shared_from_this(), sid = sid,
                                                       buf = e.buf](error_code ec, std::size_t n) {
                           self->on_session_read(sid, ec, n);
                         }));
  }
}

void connection::on_session_read(const std::string& sid, error_code ec, std::size_t n) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  auto& e = it->second;
  e.reading = false;
  if (n > 0) {
    svc_.session_stdout_bytes() += n;
    if (!e.ended) {
      std::string line = R"({"session":)" + json_string(sid) + R"(,"stdout":")" +
                         base64_encode(std::string_view(e.buf->data(), n)) + "\"}\n";
      queue_answer(std::move(line));
    }
  }
  if (ec) {
    e.out_done = true;
    if (!e.ended)
      queue_answer(R"({"session":)" + json_string(sid) +
                   R"(,"eof":true})"
                   "\n");
  }
  maybe_erase_session(sid);
  resume();
}

void connection::maybe_erase_session(const std::string& sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  const auto& e = it->second;
  // Handlers of the session still outstanding refer to the entry (and its buffers).
  if (e.ended && !e.reading && !e.writing) sessions_.erase(it);
}

void connection::close_sessions() {
  std::size_t n = 0;
  for (auto& [sid, e] : sessions_) {
    if (e.closing) continue;
    ++n;
    close_session(sid, e);
  }
  if (n > 0)
    log()(sandbox::log_level::info, fmt::format("serve: {}: closing {} session(s)", name_, n));
}

void connection::start_service_stats(std::string id, const json& op) {
  try {
    sandbox::detail::as_object(op, "service_stats");
    sandbox::detail::check_known_fields(op, "service_stats", {});
  } catch (const sandbox::detail::decode_error& e) {
    queue_answer(error_line(id, "invalid_request", e.what()));
    return;
  }
  nlohmann::ordered_json j;
  j["sessions"] = svc_.sessions().load();
  j["session_stdout_bytes"] = svc_.session_stdout_bytes().load();
  j["session_write_bytes"] = svc_.session_write_bytes().load();
  j["unwritten_bytes"] = svc_.unwritten_total().load();
  queue_answer(answer_line(id, "service_stats", j.dump()));
}

void connection::on_blob_done(const std::string& id, std::string line, std::size_t reserved) {
  svc_.unwritten_total() -= reserved;
  blob_busy_ = false;
  ids_.erase(id);
  queue_answer(std::move(line));
  resume();
}

void connection::queue_answer(std::string line) {
  if (closed_) return;
  if (wq_bytes_ + line.size() > limits().max_output_bytes) {
    disconnect(fmt::format("does not read its answers ({} bytes unwritten)", wq_bytes_));
    return;
  }
  wq_bytes_ += line.size();
  svc_.unwritten_total() += line.size();
  wq_.push_back(std::move(line));
  write_next();
}

void connection::write_next() {
  if (writing_ || wq_.empty() || closed_) return;
  writing_ = true;
  asio::async_write(
      out_, asio::buffer(wq_.front()),
      [self = shared_from_this()](const error_code& ec, std::size_t) { self->on_written(ec); });
}

void connection::on_written(const error_code& ec) {
  writing_ = false;
  if (closed_) {
    maybe_finish();
    return;
  }
  if (ec) {
    disconnect("write failed: " + ec.message());
    return;
  }
  wq_bytes_ -= wq_.front().size();
  svc_.unwritten_total() -= wq_.front().size();
  wq_.pop_front();
  write_next();
  resume();
}

void connection::resume() {
  process_lines();
  read_more();
  pump_session_reads();
  maybe_finish();
}

void connection::cancel_runs() {
  // Completions are always posted (see start_run), so runs_ does not change under us.
  for (auto& [seq, entry] : runs_) entry.cancel->emit(asio::cancellation_type::terminal);
}

void connection::close_descriptors() {
  error_code ec;
  in_.close(ec);
  out_.close(ec);
}

void connection::disconnect(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  log()(sandbox::log_level::info,
        fmt::format(
            "serve: {}: {}{}", name_, reason,
            runs_.empty() ? std::string() : fmt::format("; cancelling {} run(s)", runs_.size())));
  close_descriptors();
  // Keep the buffer of a write in progress alive until its handler has run.
  while (wq_.size() > (writing_ ? 1U : 0U)) wq_.pop_back();
  svc_.unwritten_total() -= wq_bytes_;
  wq_bytes_ = 0;
  rbuf_.clear();
  rbuf_.shrink_to_fit();
  rpos_ = scan_ = 0;
  cancel_runs();
  close_sessions();
  maybe_finish();
}

void connection::maybe_finish() {
  if (finished_) return;
  const bool idle = runs_.empty() && !blob_busy_ && sessions_.empty() && opening_ == 0;
  if (!closed_) {
    // Graceful end: no more requests, everything answered and written.
    if (!(eof_ && idle && rpos_ >= rbuf_.size() && wq_.empty() && !writing_)) return;
    closed_ = true;
    log()(sandbox::log_level::info, "serve: " + name_ + ": done");
    close_descriptors();
  }
  if (!idle || reading_ || writing_) return;
  finished_ = true;
  svc_.connection_done(shared_from_this());
}

// --- socket path -----------------------------------------------------------------------------

/// Checks `path` before starting: absent is fine; a stale socket (nobody accepts on it) is
/// removed; anything else is refused. Empty on success, else why not.
std::string clear_socket_path(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return fmt::format("cannot inspect {}: {}", quote_name(path.string()), std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return fmt::format("{} exists and is not a socket; refusing to replace it", quote_name(path.string()));
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fmt::format("socket: {}", std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.string().size());
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int err = errno;
  ::close(fd);
  if (rc == 0) return fmt::format("another server is listening on {}", quote_name(path.string()));
  if (err != ECONNREFUSED) {
    return fmt::format("{} is a socket that cannot be probed: {}", quote_name(path.string()),
                       std::strerror(err));
  }
  // Stale: nobody listens. Remove it, unless it was replaced meanwhile.
  struct stat again {};
  if (::lstat(path.c_str(), &again) == 0 && again.st_ino == st.st_ino &&
      again.st_dev == st.st_dev && ::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return fmt::format("cannot remove the stale socket {}: {}", quote_name(path.string()),
                       std::strerror(errno));
  }
  return {};
}

/// Creates the listening socket at `path` with mode 0660. Returns the descriptor (and the
/// file's identity in `st`) or -1 with `why` set.
int bind_socket(const std::filesystem::path& path, struct stat& st, std::string& why) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    why = fmt::format("socket: {}", std::strerror(errno));
    return -1;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.string().size());
  // The file is created owner-only (umask 077: never more open than intended, not even for
  // an instant), then widened to the group.
  mode_t old = ::umask(077);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int err = errno;
  ::umask(old);
  if (rc != 0) {
    why = fmt::format("cannot bind {}: {}", quote_name(path.string()), std::strerror(err));
    ::close(fd);
    return -1;
  }
  if (::chmod(path.c_str(), 0660) != 0 || ::lstat(path.c_str(), &st) != 0 ||
      !S_ISSOCK(st.st_mode)) {
    why = fmt::format("cannot set the mode of {}: {}", quote_name(path.string()), std::strerror(errno));
    ::unlink(path.c_str());
    ::close(fd);
    return -1;
  }
  if (::listen(fd, 128) != 0) {
    why = fmt::format("listen: {}", std::strerror(errno));
    ::unlink(path.c_str());
    ::close(fd);
    return -1;
  }
  return fd;
}

// --- stdio pumps -------------------------------------------------------------------------------

// Copies `src` to `dst` until end of input or an error; closes both.
void pump_in(int src, int dst) {
  std::array<char, 64 * 1024> buf{};
  for (;;) {
    ssize_t r = ::read(src, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || !write_all(dst, buf.data(), static_cast<std::size_t>(r))) break;
  }
  ::close(src);
  ::close(dst);
}

// Copies `src` (our answers) to `dst` (the daemon's stdout) until `src` ends, or until the
// reader of `dst` goes away (then closing `src` tells the connection: EPOLLERR).
void pump_out(int src, int dst) {
  std::array<char, 64 * 1024> buf{};
  for (;;) {
    std::array<pollfd, 2> p{pollfd{src, POLLIN, 0}, pollfd{dst, 0, 0}};
    int n = ::poll(p.data(), p.size(), -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (p[1].revents & (POLLHUP | POLLERR)) != 0) break;
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    ssize_t r = ::read(src, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || !write_all(dst, buf.data(), static_cast<std::size_t>(r))) break;
  }
  ::close(src);
  ::close(dst);
}

}  // namespace

// --- serve ---------------------------------------------------------------------------------------

int serve(const serve_options& options) {
  auto log = options.runtime.log ? options.runtime.log
                                 : sandbox::make_stderr_log_sink(sandbox::log_level::warning);
  ::signal(SIGPIPE, SIG_IGN);  // a client gone while we write: EPIPE, not death

  if (!options.stdio) {
    const auto& p = options.socket_path;
    if (p.empty()) {
      std::cerr << "sandboxctl: serve: give --socket PATH or --stdio\n";
      return exit_usage;
    }
    if (p.string().size() >= sizeof(sockaddr_un{}.sun_path)) {
      std::cerr << fmt::format("sandboxctl: serve: socket path is longer than {} bytes\n",
                               sizeof(sockaddr_un{}.sun_path) - 1);
      return exit_usage;
    }
    if (auto why = clear_socket_path(p); !why.empty()) {
      std::cerr << "sandboxctl: serve: " << why << "\n";
      return exit_fail;
    }
  }

  // Destruction order matters: the service (connections, acceptor) and the runtime go
  // before the io_context their I/O objects and handlers belong to.
  asio::io_context io;
  std::optional<asio::thread_pool> blob_pool;  // started once the runtime is up (below)
  std::optional<sandbox::runtime> rt;
  std::optional<service> svc;
  {
    sandbox::runtime_options rt_options = options.runtime;
    if (!options.trusted_keys.empty() && !rt_options.approver) {
      // With signed tickets, a network request whose ticket lacks code.network is answered
      // approval_required with its approval request: the client's approval service (which
      // holds a trusted key) can then derive and sign the ticket, and the client resubmits.
      // Without keys a client could grant itself anything, so nothing changes there.
      rt_options.approver = sandbox::make_callback_approver(
          [](sandbox::approval_request, sandbox::approval_callback answer) {
            answer(sandbox::approval_decision::defer(
                "resume with a derived ticket signed by a trusted key"));
          });
    }
    auto created = sandbox::runtime::create(io.get_executor(), std::move(rt_options));
    if (!created) {
      std::cerr << "sandboxctl: serve: cannot start the runtime: " << created.error().message()
                << "\n";
      return exit_fail;
    }
    rt.emplace(std::move(*created));
  }
  bool any_backend = false;
  for (const auto& b : rt->backends()) {
    if (b.registered) {
      any_backend = true;
    } else {
      log(sandbox::log_level::warning,
          fmt::format("serve: backend {} unavailable: {}", b.name, b.reason));
    }
  }
  if (!any_backend) {
    log(sandbox::log_level::warning,
        "serve: no backend registered; runs answer runtime_unavailable");
  }
  // Threads start only now: the runtime's start-up (its self-test starts a sandbox) runs
  // while this process is still single-threaded.
  blob_pool.emplace(2);
  svc.emplace(io, *rt, *blob_pool, options);

  int stdio_in = -1, stdio_out = -1;
  std::future<void> out_pump_done;
  struct stat sock_st {};
  if (options.stdio) {
    // Private copies of stdin/stdout for the pumps; 0 and 1 become /dev/null so nothing else
    // reads requests or writes into the answer stream.
    int src = ::fcntl(0, F_DUPFD_CLOEXEC, 3);
    int dst = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
    std::array<int, 2> in_pipe{-1, -1}, out_pipe{-1, -1};
    if (src < 0 || dst < 0 || ::pipe2(in_pipe.data(), O_CLOEXEC) != 0 ||
        ::pipe2(out_pipe.data(), O_CLOEXEC) != 0) {
      std::cerr << "sandboxctl: serve: cannot set up stdin/stdout: " << std::strerror(errno)
                << "\n";
      return exit_fail;
    }
    int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::close(devnull);
    }
    std::thread(pump_in, src, in_pipe[1]).detach();
    std::packaged_task<void()> task([r = out_pipe[0], dst] { pump_out(r, dst); });
    out_pump_done = task.get_future();
    std::thread(std::move(task)).detach();
    stdio_in = in_pipe[0];
    stdio_out = out_pipe[1];
  } else {
    std::string why;
    int fd = bind_socket(options.socket_path, sock_st, why);
    if (fd < 0 && why.find("Address already in use") != std::string::npos) {
      // Someone created the path since the check: judge it again, once.
      if (auto w = clear_socket_path(options.socket_path); w.empty()) {
        fd = bind_socket(options.socket_path, sock_st, why);
      } else {
        why = w;
      }
    }
    if (fd < 0) {
      std::cerr << "sandboxctl: serve: " << why << "\n";
      return exit_fail;
    }
    if (auto w = svc->listen(fd); !w.empty()) {
      std::cerr << "sandboxctl: serve: " << w << "\n";
      ::unlink(options.socket_path.c_str());
      return exit_fail;
    }
  }

  try {
    svc->start(stdio_in, stdio_out);
  } catch (const std::exception& e) {
    std::cerr << "sandboxctl: serve: cannot start: " << e.what() << "\n";
    if (!options.stdio) ::unlink(options.socket_path.c_str());
    return exit_fail;
  }
  if (options.stdio) {
    log(sandbox::log_level::info, "serve: serving on stdin/stdout");
  } else {
    std::cerr << "sandboxctl: serving on " << display_name(options.socket_path.string()) << "\n";
  }

  // Run the io_context; a handler that throws is logged and the loop goes on.
  auto run_io = [&io, &log] {
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        log(sandbox::log_level::error, std::string("serve: handler failed: ") + e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < std::max(1U, options.threads); ++i) threads.emplace_back(run_io);
  run_io();
  for (auto& t : threads) t.join();

  // Cleanup. The socket file goes first (it is ours only if it is still the one we bound).
  if (!options.stdio) {
    struct stat now {};
    if (::lstat(options.socket_path.c_str(), &now) == 0 && now.st_ino == sock_st.st_ino &&
        now.st_dev == sock_st.st_dev) {
      ::unlink(options.socket_path.c_str());
    }
  }
  blob_pool->stop();
  blob_pool->join();
  svc.reset();
  rt.reset();  // kills whatever is still running (after a cut-short shutdown) and waits
  if (out_pump_done.valid()) {
    // Our end of the answer pipe is closed (or about to be, with the io_context); give the
    // pump a moment to hand the last answers to stdout.
    out_pump_done.wait_for(std::chrono::seconds(5));
  }
  return exit_ok;
}

std::string read_config(const std::string& path, std::string& text) {
  constexpr std::size_t max_config_bytes = 1U << 20;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fmt::format("cannot read {}: {}", quote_name(path), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool dir = S_ISDIR(st.st_mode);
    ::close(fd);
    return fmt::format("{} is {}", quote_name(path), dir ? "a directory" : "not a regular file");
  }
  std::array<char, 65536> buf{};
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return fmt::format("cannot read {}: {}", quote_name(path), std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf.data(), static_cast<std::size_t>(n));
    if (text.size() > max_config_bytes) {
      ::close(fd);
      return fmt::format("{} is larger than {} bytes", quote_name(path), max_config_bytes);
    }
  }
  ::close(fd);
  return {};
}

namespace {

}  // namespace

int cmd_serve(const std::vector<std::string>& args) {
  std::string socket, state_dir, image_dir, blob_dir, cgroup_parent, config_path;
  std::vector<std::string> trusted_keys;
  std::string receipt_key;
  bool stdio = false, verbose = false, help = false;
  // Numbers are read as text and checked strictly below: "-1" must not wrap to 2^32-1.
  std::string max_running, max_queued, tenant_max_running, tenant_max_queued, queue_deadline_ms;
  std::string max_sessions, client_max_sessions;
  std::string max_session_slots, tenant_max_session_slots;  // scheduler slots for sessions
  po::options_description d("serve options");
  d.add_options()("socket", po::value(&socket), "listen on this unix socket (mode 0660)")(
      "stdio", po::bool_switch(&stdio), "serve one client on stdin/stdout")(
      "state-dir", po::value(&state_dir), "per-host state directory")(
      "image-dir", po::value(&image_dir), "image store directory")("blob-dir", po::value(&blob_dir),
                                                                   "blob store directory")(
      "cgroup-parent", po::value(&cgroup_parent), "parent cgroup of runs")(
      "config", po::value(&config_path),
      "host configuration JSON: scheduler classes, warm pools, policy (docs/operations.md); "
      "the flags below override it")("max-running", po::value(&max_running),
                                     "runs starting or running at once, host-wide")(
      "max-queued", po::value(&max_queued), "runs queued at once, host-wide")(
      "tenant-max-running", po::value(&tenant_max_running), "runs of one tenant at once")(
      "tenant-max-queued", po::value(&tenant_max_queued), "queued runs of one tenant")(
      "queue-deadline-ms", po::value(&queue_deadline_ms), "longest wait for a slot")(
      "max-sessions", po::value(&max_sessions), "sessions open at once, all clients (default 64)")(
      "max-session-slots", po::value(&max_session_slots),
      "scheduler slots sessions may hold, host-wide (default: half of max-running)")(
      "tenant-max-session-slots", po::value(&tenant_max_session_slots),
      "scheduler slots one tenant's sessions may hold (default: half of tenant-max-running)")(
      "client-max-sessions", po::value(&client_max_sessions),
      "sessions one client may have open at once (default 8)")(
      "trusted-keys", po::value(&trusted_keys),
      "accept only tickets signed by these Ed25519 public keys: a <kid>.pub.pem file, or a "
      "directory of them (repeatable)")(
      "receipt-key", po::value(&receipt_key),
      "sign an execution receipt for every run with this Ed25519 private key (<kid>.pem, as "
      "`ticket keygen` writes it); results then carry \"receipt\"")(
      "verbose,v", po::bool_switch(&verbose), "host log lines on stderr")(
      "help,h", po::bool_switch(&help), "this text");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "sandboxctl: serve: " << e.what() << "\n(see sandboxctl serve --help)\n";
    return exit_usage;
  }
  if (help) {
    std::cout << "usage: sandboxctl serve (--socket PATH | --stdio) [options]\n\n"
                 "Serves the JSON protocol, one request per line (docs/protocol.md,\n"
                 "\"Service mode\"). Without --trusted-keys, clients' tickets are trusted: the\n"
                 "socket's permissions (0660) are the access control; with it, only signed\n"
                 "tickets that verify are accepted. SIGINT/SIGTERM: cancel every run, remove\n"
                 "the socket, exit 0.\n\n"
              << d;
    return exit_ok;
  }
  auto usage = [](const std::string& m) {
    std::cerr << "sandboxctl: serve: " << m << "\n(see sandboxctl serve --help)\n";
    return exit_usage;
  };
  if (stdio == !socket.empty()) return usage("give either --socket PATH or --stdio");
  constexpr std::uint32_t u32_max = std::numeric_limits<std::uint32_t>::max();
  // The same ranges as the configuration file's fields (docs/operations.md).
  std::optional<std::uint32_t> max_running_n, max_queued_n, tenant_max_running_n,
      tenant_max_queued_n;
  std::optional<std::int64_t> queue_deadline_n;
  std::optional<std::uint32_t> max_sessions_n, client_max_sessions_n;
  std::optional<std::uint32_t> max_session_slots_n, tenant_max_session_slots_n;
  try {
    if (vm.count("max-session-slots") != 0) {
      max_session_slots_n =
          parse_number<std::uint32_t>("max-session-slots", max_session_slots, 0, u32_max);
    }
    if (vm.count("tenant-max-session-slots") != 0) {
      tenant_max_session_slots_n = parse_number<std::uint32_t>(
          "tenant-max-session-slots", tenant_max_session_slots, 0, u32_max);
    }
    if (vm.count("max-sessions") != 0) {
      max_sessions_n = parse_number<std::uint32_t>("max-sessions", max_sessions, 0, u32_max);
    }
    if (vm.count("client-max-sessions") != 0) {
      client_max_sessions_n =
          parse_number<std::uint32_t>("client-max-sessions", client_max_sessions, 0, u32_max);
    }
    if (vm.count("max-running") != 0) {
      max_running_n = parse_number<std::uint32_t>("max-running", max_running, 0, u32_max);
    }
    if (vm.count("max-queued") != 0) {
      max_queued_n = parse_number<std::uint32_t>("max-queued", max_queued, 0, u32_max);
    }
    if (vm.count("tenant-max-running") != 0) {
      tenant_max_running_n =
          parse_number<std::uint32_t>("tenant-max-running", tenant_max_running, 1, u32_max);
    }
    if (vm.count("tenant-max-queued") != 0) {
      tenant_max_queued_n =
          parse_number<std::uint32_t>("tenant-max-queued", tenant_max_queued, 0, u32_max);
    }
    if (vm.count("queue-deadline-ms") != 0) {
      queue_deadline_n =
          parse_number<std::int64_t>("queue-deadline-ms", queue_deadline_ms, 1, max_duration_ms);
    }
  } catch (const usage_error& e) {
    return usage(e.what());
  }

  serve_options o;
  o.stdio = stdio;
  if (!socket.empty()) o.socket_path = std::filesystem::absolute(socket);
  o.runtime = sandbox::default_runtime_options();
  if (!state_dir.empty()) o.runtime.state_dir = std::filesystem::absolute(state_dir);
  if (!image_dir.empty()) o.runtime.image_dir = std::filesystem::absolute(image_dir);
  if (!blob_dir.empty()) o.runtime.blob_dir = std::filesystem::absolute(blob_dir);
  if (!cgroup_parent.empty()) o.runtime.process.cgroup_parent = cgroup_parent;
  o.runtime.log = sandbox::make_stderr_log_sink(verbose ? sandbox::log_level::debug
                                                        : sandbox::log_level::warning);
  if (!receipt_key.empty()) {
    auto signer = sandbox::receipt_signer::load(std::filesystem::absolute(receipt_key));
    if (!signer) {
      return usage(fmt::format("--receipt-key {}: {}", quote_name(receipt_key),
                               signer.error().message()));
    }
    o.runtime.receipt_signer = std::make_shared<const sandbox::receipt_signer>(std::move(*signer));
  }
  if (!config_path.empty()) {
    // A bad configuration is not a bad command line: exit 2 as documented, but without the
    // pointer to --help, and with a plain reason instead of the stream library's text.
    auto bad_config = [](const std::string& m) {
      std::cerr << "sandboxctl: serve: --config: " << m << "\n";
      return exit_usage;
    };
    std::string text;
    if (auto why = read_config(config_path, text); !why.empty()) return bad_config(why);
    if (auto applied = sandbox::apply_config(text, o.runtime); !applied) {
      return bad_config(applied.error().message);
    }
  }
  for (const auto& path : trusted_keys) {
    auto loaded = o.trusted_keys.load_keys(std::filesystem::absolute(path));
    if (!loaded) {
      std::cerr << "sandboxctl: serve: --trusted-keys " << quote_name(path) << ": "
                << loaded.error().message() << "\n";
      return exit_usage;
    }
  }
  if (max_sessions_n) o.limits.max_sessions = *max_sessions_n;
  if (client_max_sessions_n) o.limits.max_sessions_per_client = *client_max_sessions_n;
  auto& s = o.runtime.scheduler;
  if (max_running_n) s.max_running = *max_running_n;
  if (max_queued_n) s.max_queued = *max_queued_n;
  if (tenant_max_running_n) s.default_class.max_running = *tenant_max_running_n;
  if (tenant_max_queued_n) s.default_class.max_queued = *tenant_max_queued_n;
  if (max_session_slots_n) s.max_session_slots = *max_session_slots_n;
  if (tenant_max_session_slots_n) s.default_class.max_session_slots = *tenant_max_session_slots_n;
  if (queue_deadline_n) s.default_class.queue_deadline = std::chrono::milliseconds(*queue_deadline_n);
  return serve(o);
}

}  // namespace sandboxctl
