// The public face of a session run (private to src/): the `sandbox::session` the runtime
// hands out for a run in session mode.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <functional>
#include <memory>
#include <string>

#include "core/run/session_front.hpp"
#include "sandbox/session.hpp"

namespace sandbox::detail {

/**
 * Forwards to its run's session front while the run lives (a run keeps itself alive by its
 * pending operations until its end), then answers from what the run left in
 * `session_shared`. Destroying it cancels the run (`cancel`).
 *
 * Thread-safety: any thread, as `sandbox::session` says: each call locks the run (`front`
 * shares the run's ownership) and the front dispatches it to the run's strand; `stats` reads
 * atomics, or the shared record under its mutex.
 */
class run_session final : public sandbox::session {
 public:
  /// `front`: the run's session front (an aliasing pointer into the run); `cancel`: cancels
  /// the run (any thread); `ex`: the session's executor.
  run_session(std::weak_ptr<session_front> front, std::function<void()> cancel, std::string id,
              std::shared_ptr<session_shared> shared, boost::asio::any_io_executor ex);
  ~run_session() override;

  const std::string& id() const noexcept override { return id_; }
  void close_stdin() override;
  session_stats stats() const override;

  /// The session's usage so far (session_front::post_usage); `operation_aborted` once it
  /// ended. For an interpreter's per-cell figures.
  void usage(bool reset_peak, session_front::usage_handler h);
  /// Stages input files into the live session (session_front::post_stage_inputs); a
  /// session that is over answers `internal`.
  void stage_inputs(std::vector<input_file> files, session_front::stage_handler h);

 private:
  void do_write(boost::asio::const_buffer d, session_front::io_handler h) override;
  void do_read(boost::asio::mutable_buffer b, session_front::io_handler h) override;
  void do_close(session_front::close_handler h) override;
  void gone(session_front::io_handler h);

  std::weak_ptr<session_front> front_;
  std::function<void()> cancel_;
  std::string id_;
  std::shared_ptr<session_shared> shared_;
  boost::asio::any_io_executor ex_;
};

}  // namespace sandbox::detail
