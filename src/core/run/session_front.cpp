// A session run's front (session_front.hpp).
#include "core/run/session_front.hpp"

#include <boost/asio/dispatch.hpp>

#include "core/run/evidence.hpp"

namespace sandbox::detail {

namespace asio = boost::asio;
using clock = std::chrono::steady_clock;

session_front::session_front(asio::strand<asio::any_io_executor> strand, bool stream,
                             control_channel& ctl, stream_reader& out)
    : strand_(strand),
      stdio_(strand, stream, ctl, out),
      out_(out),
      idle_timer_(strand),
      close_timer_(strand) {}

void session_front::begin(session_job sj, std::shared_ptr<sandbox::session> session,
                          std::shared_ptr<session_shared> shared, open_handler opened,
                          asio::any_io_executor ex, std::chrono::milliseconds exit_grace,
                          std::weak_ptr<void> owner, hooks h) {
  active_ = true;
  exit_grace_ = exit_grace;
  shared_ = std::move(shared);
  sjob_ = std::move(sj);
  ex_ = std::move(ex);
  owner_ = owner;
  h_ = std::move(h);
  stdio_.begin(sjob_.stdin_buffer_bytes, ex_, std::move(owner),
               {.activity = [this] { touch(); },
                .stdout_ended = [this] { h_.maybe_end_after_exit(); },
                .ending = [this] { return h_.ending(); }});
  open_session_ = std::move(session);
  open_handler_.emplace(std::move(opened));
}

void session_front::post_write(std::shared_ptr<void> keep, asio::const_buffer d, io_handler h) {
  asio::dispatch(strand_, [keep = std::move(keep), this, d, h = std::move(h)]() mutable {
    stdio_.write(d, std::move(h));
  });
}

void session_front::post_read(std::shared_ptr<void> keep, asio::mutable_buffer b, io_handler h) {
  asio::dispatch(strand_, [keep = std::move(keep), this, b, h = std::move(h)]() mutable {
    stdio_.read(b, std::move(h));
  });
}

void session_front::post_close_stdin(std::shared_ptr<void> keep) {
  asio::dispatch(strand_, [keep = std::move(keep), this] { stdio_.close_stdin(); });
}

void session_front::post_close(std::shared_ptr<void> keep, close_handler h) {
  asio::dispatch(
      strand_, [keep = std::move(keep), this, h = std::move(h)]() mutable { close(std::move(h)); });
}

void session_front::post_usage(std::shared_ptr<void> keep, bool reset_peak, usage_handler h) {
  asio::dispatch(strand_, [keep = std::move(keep), this, reset_peak, h = std::move(h)]() mutable {
    std::optional<session_usage> u;
    if (h_.usage && !result_ && !h_.ending()) u = h_.usage(reset_peak);
    if (!u) {
      return post_completion(ex_, std::move(h),
                             boost::system::error_code(asio::error::operation_aborted),
                             session_usage{});
    }
    post_completion(ex_, std::move(h), boost::system::error_code{}, *u);
  });
}

void session_front::post_stage_inputs(std::shared_ptr<void> keep, std::vector<input_file> files,
                                      stage_handler h) {
  asio::dispatch(strand_, [keep = std::move(keep), this, files = std::move(files),
                           h = std::move(h)]() mutable {
    std::string message = "the session is over";
    sandbox::code c = sandbox::code::internal;
    if (h_.stage_inputs && !result_ && !h_.ending()) c = h_.stage_inputs(files, message);
    post_completion(ex_, std::move(h), c, std::move(message));
  });
}

void session_front::close(close_handler h) {
  if (result_) {
    post_completion(ex_, std::move(h), boost::system::error_code{}, *result_);
    return;
  }
  close_handlers_.push_back(std::move(h));
  if (close_requested_ || h_.ending()) return;  // (ending already: as it ends)
  close_requested_ = true;
  // stdin closes now (buffered bytes are dropped: the host is done); stdout no longer
  // holds the end back; the server gets the exit grace to go by itself, then the kill.
  // (Stream mode: the bytes in flight stay counted until sandbox-init acknowledges
  // them; only the unsent rest is dropped.)
  stdio_.drop_for_close();
  out_.mark_closed();
  close_timer_.expires_after(exit_grace_);
  // The pending wait keeps the run alive (a strong reference to the owner).
  close_timer_.async_wait([keep = owner_.lock(), this](boost::system::error_code ec) {
    if (!ec && keep) h_.finish();
  });
  h_.maybe_end_after_exit();
}

void session_front::touch() { last_activity_ = clock::now(); }

void session_front::arm_idle_timer() {
  auto due = last_activity_ + sjob_.idle_timeout;
  idle_timer_.expires_at(due);
  // The pending wait keeps the run alive (a strong reference to the owner).
  idle_timer_.async_wait([keep = owner_.lock(), this](boost::system::error_code ec) {
    if (ec || !keep || h_.ending()) return;
    if (clock::now() - last_activity_ < sjob_.idle_timeout) return arm_idle_timer();
    // A server that exited with output the host never read ends as exited, not idle.
    if (!h_.main_exited()) idle_timed_out_ = true;
    h_.finish();
  });
}

void session_front::started() {
  touch();
  arm_idle_timer();
  if (!open_handler_) return;
  auto h = std::move(*open_handler_);
  open_handler_.reset();
  auto s = std::move(open_session_);
  post_completion(ex_, std::move(h), boost::system::error_code{},
                  session_start{.session = std::move(s), .code = sandbox::code::ok, .message = {}});
}

void session_front::cancel_timers() {
  idle_timer_.cancel();
  close_timer_.cancel();
}

void session_front::done(run_result r, bool timed_out, bool killed) {
  session_result sr;
  sr.end =
      classify_session_end({.close_requested = close_requested_,
                            .idle_timed_out = idle_timed_out_,
                            .timed_out = timed_out,
                            .lifetime_ends_at_ticket_expiry = sjob_.lifetime_ends_at_ticket_expiry,
                            .killed = killed},
                           r);
  r.std_out = {};
  r.std_out.total_bytes = stdio_.bytes_from_server();
  sr.bytes_to_server = stdio_.bytes_to_server();
  sr.bytes_from_server = stdio_.bytes_from_server();
  sr.result = std::move(r);
  // The runtime's span, scheduler slot and receipt (session_job::on_end): once, before
  // the record is kept and before any handler.
  if (auto on_end = std::move(sjob_.on_end)) {
    sjob_.on_end = nullptr;
    on_end(sr);
  }
  result_ = sr;
  ended_ = true;
  if (shared_) {
    std::lock_guard lock(shared_->mu);
    shared_->result = sr;
    shared_->last = stats();
  }
  stdio_.fail_pending_write(asio::error::operation_aborted);
  if (open_handler_) {
    // Never started: the open fails with the run's code (never `ok`).
    auto h = std::move(*open_handler_);
    open_handler_.reset();
    open_session_.reset();
    session_start st{
        .session = nullptr,
        .code = sr.result.code == sandbox::code::ok ? sandbox::code::internal : sr.result.code,
        .message = sr.result.message.empty() ? "the server did not start" : sr.result.message};
    post_completion(ex_, std::move(h), boost::system::error_code{}, std::move(st));
  }
  auto handlers = std::move(close_handlers_);
  close_handlers_.clear();
  for (auto& h : handlers) post_completion(ex_, std::move(h), boost::system::error_code{}, sr);
}

}  // namespace sandbox::detail
