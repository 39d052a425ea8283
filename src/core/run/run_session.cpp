// The public face of a session run (run_session.hpp).
#include "core/run/run_session.hpp"

#include <boost/asio/error.hpp>

namespace sandbox::detail {

namespace asio = boost::asio;

run_session::run_session(std::weak_ptr<session_front> front, std::function<void()> cancel,
                         std::string id, std::shared_ptr<session_shared> shared,
                         asio::any_io_executor ex)
    : front_(std::move(front)),
      cancel_(std::move(cancel)),
      id_(std::move(id)),
      shared_(std::move(shared)),
      ex_(std::move(ex)) {}

run_session::~run_session() {
  if (cancel_) cancel_();
}

void run_session::close_stdin() {
  if (auto f = front_.lock()) f->post_close_stdin(f);
}

session_stats run_session::stats() const {
  if (auto f = front_.lock()) return f->stats();
  std::lock_guard lock(shared_->mu);
  auto s = shared_->last;
  s.ended = true;
  return s;
}

void run_session::usage(bool reset_peak, session_front::usage_handler h) {
  if (auto f = front_.lock()) return f->post_usage(f, reset_peak, std::move(h));
  post_completion(ex_, std::move(h), boost::system::error_code(asio::error::operation_aborted),
                  session_usage{});
}

void run_session::stage_inputs(std::vector<input_file> files, session_front::stage_handler h) {
  if (auto f = front_.lock()) return f->post_stage_inputs(f, std::move(files), std::move(h));
  post_completion(ex_, std::move(h), sandbox::code::internal, std::string("the session is over"));
}

void run_session::do_write(asio::const_buffer d, session_front::io_handler h) {
  if (auto f = front_.lock()) return f->post_write(f, d, std::move(h));
  gone(std::move(h));
}

void run_session::do_read(asio::mutable_buffer b, session_front::io_handler h) {
  if (auto f = front_.lock()) return f->post_read(f, b, std::move(h));
  gone(std::move(h));
}

void run_session::do_close(session_front::close_handler h) {
  if (auto f = front_.lock()) return f->post_close(f, std::move(h));
  std::optional<session_result> res;
  {
    std::lock_guard lock(shared_->mu);
    res = shared_->result;
  }
  if (res) return post_completion(ex_, std::move(h), boost::system::error_code{}, *res);
  // The run went without a result: its execution context was destroyed, so there is no
  // executor to post to (every process was killed by the runtime's shutdown).
  session_result killed;
  killed.end = session_end::killed;
  killed.result.code = sandbox::code::internal;
  killed.result.message = "session killed (the runtime shut down)";
  std::move(h)(asio::error::operation_aborted, std::move(killed));
}

void run_session::gone(session_front::io_handler h) {
  bool have_result;
  {
    std::lock_guard lock(shared_->mu);
    have_result = shared_->result.has_value();
  }
  if (have_result) {
    return post_completion(ex_, std::move(h),
                           boost::system::error_code(asio::error::operation_aborted),
                           std::size_t{0});
  }
  std::move(h)(asio::error::operation_aborted, 0);
}

}  // namespace sandbox::detail
