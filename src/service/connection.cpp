// One client of the daemon (service/connection.hpp).
#include "service/connection.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "sandbox/runtime.hpp"
#include "service/blob_requests.hpp"
#include "sys/confirmed_wait.hpp"

namespace sandbox::service {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

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

}  // namespace

connection::connection(service_context& ctx, asio::io_context& io, int in_fd, int out_fd,
                       std::string name, done_handler on_done)
    : ctx_(ctx),
      strand_(asio::make_strand(io)),
      in_(strand_),
      out_(strand_),
      name_(std::move(name)),
      on_done_(std::move(on_done)),
      reader_(ctx.limits.max_line_bytes, ctx.limits.max_id_bytes, chunk_.size()),
      sessions_(*this, ctx, strand_, name_) {
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

void connection::log(sandbox::log_level level, const std::string& message) const {
  ctx_.log(level, message);
}

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
  // sys/confirmed_wait.hpp) once dropped live clients with their requests unanswered
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
  reader_.clear();
  error_code ec;
  in_.close(ec);  // no more requests; a pending read completes with operation_aborted
  cancel_runs();
  sessions_.close_all();
  maybe_finish();
}

bool connection::paused() const {
  // ids_ holds every request in flight: runs, the blob request, session lines.
  const auto& limits = ctx_.limits;
  return pool_busy_ || ids_.size() >= limits.max_in_flight ||
         wq_bytes_ >= limits.output_pause_bytes ||
         sessions_.write_bytes() >= limits.session_write_pause_bytes;
}

bool connection::can_take_output() const {
  return !closed_ && wq_bytes_ < ctx_.limits.output_pause_bytes;
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
  reader_.append(std::string_view(chunk_.data(), n));
  process_lines();
  read_more();
  maybe_finish();
}

void connection::on_eof() {
  eof_ = true;
  reader_.end_input();
  // EOF with the socket hung up is a disconnect; without, the client only closed its
  // sending side (shutdown(SHUT_WR)) and still reads the answers.
  if (is_hung_up(out_.native_handle())) {
    disconnect("client disconnected");
    return;
  }
  process_lines();
  // No session_close can come any more: the sessions are closed (kill-and-confirm) now, their
  // output up to then still delivered.
  sessions_.close_all();
  maybe_finish();
}

void connection::process_lines() {
  while (!closed_ && !stopping_ && !paused()) {
    line_event e = reader_.next();
    if (e.what == line_event::kind::none) break;
    if (e.what == line_event::kind::too_long) {
      queue_answer(line_too_long_line(echo_id(e.id), ctx_.limits.max_line_bytes));
      continue;
    }
    handle_line(e.text);
  }
  reader_.compact();
}

std::optional<std::string> connection::echo_id(const std::optional<std::string>& id) const {
  // An id in flight is not echoed: the error would be taken for that request's answer.
  if (!id || ids_.count(*id) != 0) return std::nullopt;
  return id;
}

void connection::handle_line(std::string_view line) {
  std::optional<std::string> id;
  try {
    auto read = read_request_line(line, ctx_.limits, ids_);
    if (auto* refused = std::get_if<answer>(&read)) {
      queue_answer(std::move(refused->line));
    } else if (auto* request = std::get_if<request_line>(&read)) {
      id = request->id;
      dispatch(std::move(*request));
    }
  } catch (const std::exception& e) {
    log(sandbox::log_level::error, "serve: " + name_ + ": " + e.what());
    queue_answer(error_line(id, "internal", "internal error"));
  }
}

void connection::dispatch(request_line line) {
  // Each operation's members are read first; a refusal is answered at once.
  auto refused = [this](auto& read) {
    if (auto* a = std::get_if<answer>(&read)) {
      queue_answer(std::move(a->line));
      return true;
    }
    return false;
  };
  const std::string& id = line.id;
  switch (line.kind) {
    case request_kind::run:
      start_run(std::move(line));
      return;
    case request_kind::blob_put: {
      auto read = read_blob_put(line, ctx_.limits);
      if (!refused(read)) start_blob_put(id, std::get<blob_put_line>(std::move(read)));
      return;
    }
    case request_kind::blob_get: {
      auto read = read_blob_get(line);
      if (!refused(read)) start_blob_get(id, std::get<blob_get_line>(std::move(read)));
      return;
    }
    case request_kind::replay: {
      auto read = read_replay(line, ctx_.trusted_keys);
      if (!refused(read)) start_replay(id, std::get<replay_line>(std::move(read)));
      return;
    }
    case request_kind::session_open: {
      auto read = read_session_open(line, ctx_.trusted_keys);
      if (!refused(read)) sessions_.open(id, std::get<session_open_line>(std::move(read)));
      return;
    }
    case request_kind::session_write: {
      auto read = read_session_write(line);
      if (!refused(read)) sessions_.write(id, std::get<session_write_line>(std::move(read)));
      return;
    }
    case request_kind::session_close_stdin:
    case request_kind::session_close: {
      auto read = read_session_ref(line);
      if (refused(read)) return;
      const auto& sid = std::get<std::string>(read);
      if (line.kind == request_kind::session_close) {
        sessions_.close(id, sid);
      } else {
        sessions_.close_stdin(id, sid);
      }
      return;
    }
    case request_kind::interp_open: {
      auto read = read_interp_open(line, ctx_.trusted_keys);
      if (!refused(read)) sessions_.interp_open(id, std::get<interp_open_line>(std::move(read)));
      return;
    }
    case request_kind::interp_execute: {
      auto read = read_interp_execute(line);
      if (!refused(read)) {
        sessions_.interp_execute(id, std::get<interp_execute_line>(std::move(read)));
      }
      return;
    }
    case request_kind::interp_close: {
      auto read = read_interp_close(line);
      if (!refused(read)) sessions_.interp_close(id, std::get<std::string>(read));
      return;
    }
    case request_kind::service_stats:
      if (auto a = read_service_stats(line)) {
        queue_answer(std::move(a->line));
      } else {
        answer_service_stats(id);
      }
      return;
  }
}

void connection::start_run(request_line line) {
  auto read = read_run(line, ctx_.trusted_keys);
  if (auto* a = std::get_if<answer>(&read)) {
    queue_answer(std::move(a->line));
    return;
  }
  auto& run = std::get<run_line>(read);
  const std::uint64_t seq = ++next_seq_;
  auto& entry = runs_[seq];
  entry.id = line.id;
  entry.cancel = std::make_unique<asio::cancellation_signal>();
  if (line.record) entry.record_of.emplace(run.request, run.ticket);
  ids_.insert(line.id);
  // The completion is re-posted to the strand, so that it never runs inside an `emit`
  // below (which would erase the signal being emitted).
  try {
    ctx_.rt.async_run(
        std::move(run.request), std::move(run.ticket),
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
    ids_.erase(line.id);
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
    log(sandbox::log_level::info,
        fmt::format("serve: {}: run {} ended: {}", name_, r.run_id, ec.message()));
  }
  if (record_of) {
    queue_answer(result_with_record_line(id, r, record_of->first, record_of->second));
  } else {
    queue_answer(result_line(id, r));
  }
  resume();
}

void connection::start_pool_request(const std::string& id,
                                    std::function<std::string(std::size_t&)> work) {
  pool_busy_ = true;
  ids_.insert(id);
  asio::post(ctx_.pool, [self = shared_from_this(), id, work = std::move(work)] {
    std::size_t reserved = 0;
    std::string line = work(reserved);
    asio::post(self->strand_, [self, id, reserved, line = std::move(line)]() mutable {
      self->on_pool_done(id, std::move(line), reserved);
    });
  });
}

void connection::start_blob_put(const std::string& id, blob_put_line put) {
  start_pool_request(
      id, [&ctx = ctx_, blobs = ctx_.rt.blobs(), id, put = std::move(put)](std::size_t&) {
        return answer_blob_put(blobs.get(), id, put, ctx.log);
      });
}

void connection::start_blob_get(const std::string& id, blob_get_line get) {
  start_pool_request(
      id, [&ctx = ctx_, blobs = ctx_.rt.blobs(), id, get = std::move(get)](std::size_t& reserved) {
        return answer_blob_get(blobs.get(), id, get, ctx.limits, ctx.unwritten_total, reserved,
                               ctx.log);
      });
}

// `{"id":…, "replay":{"ticket":{…}, "record":{…run record…}}}`: answers like a run (a
// `result` line), with the stored result and nothing executed. The blob checks are file I/O:
// on the pool.
void connection::start_replay(const std::string& id, replay_line replay) {
  start_pool_request(id, [blobs = ctx_.rt.blobs(), id, replay = std::move(replay)](std::size_t&) {
    return answer_replay(blobs.get(), id, replay);
  });
}

void connection::answer_service_stats(const std::string& id) {
  nlohmann::ordered_json j;
  j["sessions"] = ctx_.sessions.load();
  j["session_stdout_bytes"] = ctx_.session_stdout_bytes.load();
  j["session_write_bytes"] = ctx_.session_write_bytes.load();
  j["unwritten_bytes"] = ctx_.unwritten_total.load();
  // One object per warm pool class, members in the documented order; `error` only once the
  // class stopped (its runs go cold).
  j["pools"] = nlohmann::ordered_json::array();
  for (const auto& p : ctx_.rt.warm_pool_stats()) {
    nlohmann::ordered_json o;
    o["isolation"] = std::string(to_string(p.isolation));
    o["runtime"] = p.runtime;
    o["memory_limit_bytes"] = p.memory_limit_bytes;
    o["size"] = p.size;
    o["ready"] = p.ready;
    o["starting"] = p.starting;
    o["handed_out"] = p.handed_out;
    o["failed"] = p.failed;
    if (!p.error.empty()) o["error"] = p.error;
    j["pools"].push_back(std::move(o));
  }
  // `error` comes from inside a sandbox (escaped there); never let a stray byte throw here.
  queue_answer(
      answer_line(id, "service_stats",
                  j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)));
}

void connection::on_pool_done(const std::string& id, std::string line, std::size_t reserved) {
  ctx_.unwritten_total -= reserved;
  pool_busy_ = false;
  ids_.erase(id);
  queue_answer(std::move(line));
  resume();
}

void connection::queue_answer(std::string line) {
  if (closed_) return;
  if (wq_bytes_ + line.size() > ctx_.limits.max_output_bytes) {
    disconnect(fmt::format("does not read its answers ({} bytes unwritten)", wq_bytes_));
    return;
  }
  wq_bytes_ += line.size();
  ctx_.unwritten_total += line.size();
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
  ctx_.unwritten_total -= wq_.front().size();
  wq_.pop_front();
  write_next();
  resume();
}

void connection::resume() {
  process_lines();
  read_more();
  sessions_.pump_reads();
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
  log(sandbox::log_level::info,
      fmt::format(
          "serve: {}: {}{}", name_, reason,
          runs_.empty() ? std::string() : fmt::format("; cancelling {} run(s)", runs_.size())));
  close_descriptors();
  // Keep the buffer of a write in progress alive until its handler has run.
  while (wq_.size() > (writing_ ? 1U : 0U)) wq_.pop_back();
  ctx_.unwritten_total -= wq_bytes_;
  wq_bytes_ = 0;
  reader_.clear();
  cancel_runs();
  sessions_.close_all();
  maybe_finish();
}

void connection::maybe_finish() {
  if (finished_) return;
  const bool idle = runs_.empty() && !pool_busy_ && sessions_.empty();
  if (!closed_) {
    // Graceful end: no more requests, everything answered and written.
    if (!(eof_ && idle && !reader_.has_pending() && wq_.empty() && !writing_)) return;
    closed_ = true;
    log(sandbox::log_level::info, "serve: " + name_ + ": done");
    close_descriptors();
  }
  if (!idle || reading_ || writing_) return;
  finished_ = true;
  on_done_(shared_from_this());
}

}  // namespace sandbox::service
