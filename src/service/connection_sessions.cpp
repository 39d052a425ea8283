// The sessions of one connection (service/connection_sessions.hpp).
#include "service/connection_sessions.hpp"

#include <fmt/format.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>

#include "sandbox/runtime.hpp"

namespace sandbox::service {

namespace asio = boost::asio;
using boost::system::error_code;

connection_sessions::connection_sessions(session_host& host, service_context& ctx,
                                         asio::any_io_executor executor, const std::string& name)
    : host_(host), ctx_(ctx), executor_(std::move(executor)), name_(name) {}

void connection_sessions::log(sandbox::log_level level, const std::string& message) const {
  ctx_.log(level, message);
}

void connection_sessions::release_write_bytes(std::size_t n) {
  write_bytes_ -= n;
  ctx_.session_write_bytes -= n;
}

bool connection_sessions::reserve_slot(const std::string& id) {
  const auto& limits = ctx_.limits;
  const std::size_t open = sessions_.size() + interps_.size() + opening_;
  if (open >= limits.max_sessions_per_client) {
    host_.send(error_line(id, "capacity",
                          fmt::format("this connection has {} sessions open (at most {})", open,
                                      limits.max_sessions_per_client)));
    return false;
  }
  if (ctx_.sessions.fetch_add(1) >= limits.max_sessions) {
    ctx_.sessions -= 1;
    host_.send(error_line(id, "capacity",
                          fmt::format("the daemon has {} sessions open (at most {})",
                                      limits.max_sessions, limits.max_sessions)));
    return false;
  }
  return true;
}

void connection_sessions::open(std::string id, session_open_line request) {
  if (!reserve_slot(id)) return;
  ++opening_;
  host_.hold_id(id);
  try {
    ctx_.rt.async_open_session(
        std::move(request.request), std::move(request.ticket),
        asio::bind_executor(executor_, [keep = host_.keep_alive(), this, id](
                                           error_code ec, sandbox::session_start start) mutable {
          on_opened(id, ec, std::move(start));
        }));
  } catch (...) {
    --opening_;
    host_.release_id(id);
    ctx_.sessions -= 1;
    throw;
  }
}

void connection_sessions::on_opened(const std::string& id, error_code ec,
                                    sandbox::session_start start) {
  --opening_;
  host_.release_id(id);
  if (ec || !start.session) {
    ctx_.sessions -= 1;
    const auto c = ec && start.code == sandbox::code::ok ? sandbox::code::internal : start.code;
    std::string message =
        start.message.empty() ? std::string("the session could not be started") : start.message;
    // The runtime's invalid_request at open is about the request (its `tool`); name it as
    // the wire does, like the decoder's messages.
    if (c == sandbox::code::invalid_request) message = "session_open.request: " + message;
    host_.send(error_line(id, sandbox::to_string(c), message));
    host_.resume();
    return;
  }
  const std::string sid = start.session->id();
  auto& e = sessions_[sid];
  e.s = std::move(start.session);
  e.buf = std::make_shared<std::vector<char>>(ctx_.limits.session_read_chunk_bytes);
  if (host_.is_leaving()) {
    // The client went away (or the daemon stops) while the server started: stop it at once.
    log(sandbox::log_level::info,
        fmt::format("serve: {}: session {} opened after the client left; closing it", name_, sid));
    close_entry(sid, e);
    host_.resume();
    return;
  }
  log(sandbox::log_level::info, fmt::format("serve: {}: session {} opened", name_, sid));
  host_.send(answer_line(id, "session", json_string(sid)));
  if (host_.has_input_ended()) {
    // The client's input ended (shutdown(SHUT_WR), end of stdin) while the server started
    // (queued for a slot, or starting): close_all() already ran and no session_close can
    // come, so it is closed now, like the others (kill-and-confirm). The client still reads
    // the answer and output read before the kill; the connection then ends.
    log(sandbox::log_level::info,
        fmt::format("serve: {}: session {} opened after end of input; closing it", name_, sid));
    close_entry(sid, e);
  }
  host_.resume();
}

connection_sessions::entry* connection_sessions::find(const std::string& id, const std::string& sid,
                                                      const std::string& op_name) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) {
    // Also another connection's session: sessions belong to the connection that opened them.
    host_.send(error_line(
        id, "session_not_found",
        fmt::format("{}.session: no session {} on this connection", op_name, quote_id(sid))));
    return nullptr;
  }
  if (it->second.closing) {
    host_.send(error_line(id, "session_ended",
                          fmt::format("{}.session: the session is closing", op_name)));
    return nullptr;
  }
  return &it->second;
}

void connection_sessions::write(std::string id, session_write_line request) {
  entry* e = find(id, request.session, "session_write");
  if (e == nullptr) return;
  if (e->stdin_closed || e->close_stdin_id) {
    host_.send(error_line(id, "session_ended", "session_write: the session's stdin is closed"));
    return;
  }
  host_.hold_id(id);
  write_bytes_ += request.data.size();
  ctx_.session_write_bytes += request.data.size();
  e->writes.push_back({std::move(id), std::move(request.data)});
  write_next(request.session);
}

void connection_sessions::write_next(const std::string& sid) {
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
      host_.release_id(id);
      host_.send(answer_line(id, "stdin_closed", "true"));
    }
    return;
  }
  e.writing = true;
  // The data stays in the queue's front element (a deque never moves it) until the handler.
  const std::string& data = e.writes.front().data;
  e.s->async_write(asio::buffer(data),
                   asio::bind_executor(
                       executor_, [keep = host_.keep_alive(), this, sid](
                                      error_code ec, std::size_t n) { on_written(sid, ec, n); }));
}

void connection_sessions::on_written(const std::string& sid, error_code ec, std::size_t n) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  auto& e = it->second;
  e.writing = false;
  write_op op = std::move(e.writes.front());
  e.writes.pop_front();
  release_write_bytes(op.data.size());
  host_.release_id(op.id);
  if (!ec) {
    host_.send(answer_line(op.id, "written", std::to_string(n)));
  } else if (ec == asio::error::broken_pipe) {
    host_.send(error_line(op.id, "session_ended",
                          fmt::format("session_write: the server's stdin is closed ({} of {} "
                                      "bytes accepted)",
                                      n, op.data.size())));
  } else {
    host_.send(error_line(op.id, "session_ended",
                          fmt::format("session_write: the session ended ({} of {} bytes accepted)",
                                      n, op.data.size())));
  }
  if (e.closing) {
    maybe_erase(sid);
  } else {
    write_next(sid);
  }
  host_.resume();
}

void connection_sessions::close_stdin(std::string id, const std::string& sid) {
  entry* e = find(id, sid, "session_close_stdin");
  if (e == nullptr) return;
  if (e->stdin_closed || e->close_stdin_id) {
    host_.send(answer_line(id, "stdin_closed", "true"));  // idempotent, like close_stdin()
    return;
  }
  host_.hold_id(id);
  e->close_stdin_id = std::move(id);
  write_next(sid);  // closes now when no write is waiting
}

void connection_sessions::close(std::string id, const std::string& sid) {
  entry* e = find(id, sid, "session_close");
  if (e == nullptr) return;
  host_.hold_id(id);
  e->close_id = std::move(id);
  close_entry(sid, *e);
}

void connection_sessions::close_entry(const std::string& sid, entry& e) {
  if (e.closing) return;
  e.closing = true;
  // Writes not yet handed to the session will never be: answer them now.
  const std::size_t keep = e.writing ? 1 : 0;
  while (e.writes.size() > keep) {
    write_op op = std::move(e.writes.back());
    e.writes.pop_back();
    release_write_bytes(op.data.size());
    host_.release_id(op.id);
    host_.send(error_line(op.id, "session_ended",
                          "session_write: the session was closed before this write"));
  }
  if (e.close_stdin_id) {
    host_.release_id(*e.close_stdin_id);
    host_.send(answer_line(*e.close_stdin_id, "stdin_closed", "true"));
    e.close_stdin_id.reset();
  }
  e.s->async_close(asio::bind_executor(
      executor_, [keep = host_.keep_alive(), this, sid](error_code, sandbox::session_result r) {
        on_closed(sid, std::move(r));
      }));
}

void connection_sessions::on_closed(const std::string& sid, sandbox::session_result r) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  auto& e = it->second;
  e.ended = true;
  ctx_.sessions -= 1;
  log(sandbox::log_level::info,
      fmt::format("serve: {}: session {} closed ({})", name_, sid, sandbox::to_string(r.end)));
  if (e.close_id) {
    host_.release_id(*e.close_id);
    host_.send(answer_line(*e.close_id, "session_result", sandbox::encode(r)));
    e.close_id.reset();
  }
  maybe_erase(sid);
  host_.resume();
}

void connection_sessions::pump_reads() {
  for (auto& [sid, e] : sessions_) {
    // Read only while the client's outgoing budget has room: otherwise the server's output
    // stays in its own pipe (and the server blocks on it), never in the daemon.
    if (!host_.can_take_output()) return;
    if (e.reading || e.out_done || e.ended) continue;
    e.reading = true;
    e.s->async_read_some(
        asio::buffer(*e.buf),
        asio::bind_executor(executor_, [keep = host_.keep_alive(), this, sid = sid, buf = e.buf](
                                           error_code ec, std::size_t n) { on_read(sid, ec, n); }));
  }
}

void connection_sessions::on_read(const std::string& sid, error_code ec, std::size_t n) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  auto& e = it->second;
  e.reading = false;
  if (n > 0) {
    ctx_.session_stdout_bytes += n;
    if (!e.ended) host_.send(session_stdout_event(sid, std::string_view(e.buf->data(), n)));
  }
  if (ec) {
    e.out_done = true;
    if (!e.ended) host_.send(session_eof_event(sid));
  }
  maybe_erase(sid);
  host_.resume();
}

void connection_sessions::maybe_erase(const std::string& sid) {
  auto it = sessions_.find(sid);
  if (it == sessions_.end()) return;
  const auto& e = it->second;
  // Handlers of the session still outstanding refer to the entry (and its buffers).
  if (e.ended && !e.reading && !e.writing) sessions_.erase(it);
}

void connection_sessions::close_all() {
  std::size_t n = 0;
  for (auto& [sid, e] : sessions_) {
    if (e.closing) continue;
    ++n;
    close_entry(sid, e);
  }
  for (auto& [sid, e] : interps_) {
    if (e.closing) continue;
    ++n;
    close_interp(sid, e);
  }
  if (n > 0)
    log(sandbox::log_level::info, fmt::format("serve: {}: closing {} session(s)", name_, n));
}

// --- interpreters ----------------------------------------------------------------------------

void connection_sessions::interp_open(std::string id, interp_open_line request) {
  if (!reserve_slot(id)) return;
  ++opening_;
  host_.hold_id(id);
  try {
    ctx_.rt.async_open_interpreter(
        std::move(request.request), std::move(request.ticket),
        asio::bind_executor(executor_, [keep = host_.keep_alive(), this, id](
                                           error_code ec, sandbox::interpreter_start start) {
          on_interp_opened(id, ec, std::move(start));
        }));
  } catch (...) {
    --opening_;
    host_.release_id(id);
    ctx_.sessions -= 1;
    throw;
  }
}

void connection_sessions::on_interp_opened(const std::string& id, error_code ec,
                                           sandbox::interpreter_start start) {
  --opening_;
  host_.release_id(id);
  if (ec || !start.interpreter) {
    ctx_.sessions -= 1;
    const auto c = ec && start.code == sandbox::code::ok ? sandbox::code::internal : start.code;
    std::string message =
        start.message.empty() ? std::string("the interpreter could not be started") : start.message;
    if (c == sandbox::code::invalid_request) message = "interp_open: " + message;
    host_.send(error_line(id, sandbox::to_string(c), message));
    host_.resume();
    return;
  }
  const std::string sid = start.interpreter->id();
  auto& e = interps_[sid];
  e.in = std::move(start.interpreter);
  if (host_.is_leaving() || host_.has_input_ended()) {
    // No interp_close can come any more (close_all() already ran): closed at once.
    log(sandbox::log_level::info,
        fmt::format("serve: {}: interpreter {} opened after the client left; closing it", name_,
                    sid));
    if (!host_.is_leaving()) host_.send(answer_line(id, "interpreter", json_string(sid)));
    close_interp(sid, e);
    host_.resume();
    return;
  }
  log(sandbox::log_level::info, fmt::format("serve: {}: interpreter {} opened", name_, sid));
  host_.send(answer_line(id, "interpreter", json_string(sid)));
  host_.resume();
}

connection_sessions::interp_entry* connection_sessions::find_interp(const std::string& id,
                                                                    const std::string& sid,
                                                                    const std::string& op_name) {
  auto it = interps_.find(sid);
  if (it == interps_.end()) {
    // Also another connection's interpreter: they belong to the connection that opened them.
    host_.send(error_line(
        id, "session_not_found",
        fmt::format("{}.session: no interpreter {} on this connection", op_name, quote_id(sid))));
    return nullptr;
  }
  if (it->second.closing) {
    host_.send(error_line(id, "session_ended",
                          fmt::format("{}.session: the interpreter is closing", op_name)));
    return nullptr;
  }
  return &it->second;
}

void connection_sessions::interp_execute(std::string id, interp_execute_line request) {
  interp_entry* e = find_interp(id, request.session, "interp_execute");
  if (e == nullptr) return;
  host_.hold_id(id);
  ++e->executing;
  // The interpreter answers a second cell while one runs with in_progress, and a cell after
  // its end with operation_aborted (the result then says so): both are answered as results.
  e->in->async_execute(
      std::move(request.cell),
      asio::bind_executor(executor_, [keep = host_.keep_alive(), this, id, sid = request.session](
                                         error_code ec, sandbox::cell_result r) {
        host_.release_id(id);
        if (ec == asio::error::in_progress) {
          host_.send(error_line(id, "capacity", "interp_execute: a cell is already running"));
        } else {
          host_.send(answer_line(id, "cell_result", encode_cell_result(r)));
        }
        auto it = interps_.find(sid);
        if (it != interps_.end()) {
          --it->second.executing;
          maybe_erase_interp(sid);
        }
        host_.resume();
      }));
}

void connection_sessions::interp_close(std::string id, const std::string& sid) {
  interp_entry* e = find_interp(id, sid, "interp_close");
  if (e == nullptr) return;
  host_.hold_id(id);
  e->close_id = std::move(id);
  close_interp(sid, *e);
}

void connection_sessions::close_interp(const std::string& sid, interp_entry& e) {
  if (e.closing) return;
  e.closing = true;
  e.in->async_close(asio::bind_executor(
      executor_, [keep = host_.keep_alive(), this, sid](error_code, sandbox::session_result r) {
        auto it = interps_.find(sid);
        if (it == interps_.end()) return;
        auto& en = it->second;
        en.ended = true;
        ctx_.sessions -= 1;
        log(sandbox::log_level::info, fmt::format("serve: {}: interpreter {} closed ({})", name_,
                                                  sid, sandbox::to_string(r.end)));
        if (en.close_id) {
          host_.release_id(*en.close_id);
          host_.send(answer_line(*en.close_id, "session_result", sandbox::encode(r)));
          en.close_id.reset();
        }
        maybe_erase_interp(sid);
        host_.resume();
      }));
}

void connection_sessions::maybe_erase_interp(const std::string& sid) {
  auto it = interps_.find(sid);
  if (it == interps_.end()) return;
  if (it->second.ended && it->second.executing == 0) interps_.erase(it);
}

}  // namespace sandbox::service
