// The interpreter session bound to one MCP session (interpreter_binding.hpp).
#include "mcp/interpreter_binding.hpp"

#include <fmt/format.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/post.hpp>
#include <iostream>
#include <utility>

#include "mcp/session.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox::mcp {
namespace {

// Why a session that ended by itself is gone, for the next fresh session's result.
std::string ended_words(session_end end) {
  switch (end) {
    case session_end::idle_timeout:
      return "the previous session ended: it was idle longer than the host's idle timeout";
    case session_end::max_lifetime:
      return "the previous session ended: it reached its maximum lifetime";
    case session_end::ticket_expired:
      return "the previous session ended: the ticket expired";
    default:
      return fmt::format("the previous session ended ({})", to_string(end));
  }
}

}  // namespace

/// One `run` in progress.
struct interpreter_binding::call_state {
  cell_arguments call;
  std::string default_runtime;             ///< when neither the call nor an open session names one
  boost::asio::cancellation_slot outer;    ///< the caller's (`run`'s `cancel`)
  boost::asio::cancellation_signal inner;  ///< handed to the interpreter while executing
  bool cancelled = false;
  bool executing = false;
  int reopened = 0;  ///< fresh sessions opened because one ended just before the cell
  run_handler done;
};

interpreter_binding::interpreter_binding(const server_context& context) : c_(context) {}

interpreter_binding::~interpreter_binding() {
  // Only reached without async_close when the owner broke its contract: still, never leave
  // an interpreter running until its idle timeout.
  if (in_) in_->async_close([in = in_](boost::system::error_code, const session_result&) {});
}

void interpreter_binding::run(const cell_arguments& call, const tool_context& tools,
                              boost::asio::cancellation_slot cancel, run_handler done) {
  if (busy_ || closing_) {
    std::optional<nlohmann::json> answer;
    if (!closing_) {
      answer = error_result(
          "capacity: a cell of this session is running (or its interpreter session is "
          "opening); cells run one at a time: call again once it answered");
    }
    boost::asio::post(c_.executor,
                      [done = std::move(done), answer = std::move(answer)] { done(answer); });
    return;
  }
  busy_ = true;
  auto st = std::make_shared<call_state>();
  st->call = call;
  st->default_runtime = default_cell_runtime(tools);
  st->outer = cancel;
  st->done = std::move(done);
  if (cancel.is_connected()) {
    cancel.assign([w = std::weak_ptr<call_state>(st)](boost::asio::cancellation_type t) {
      if (auto s = w.lock()) {
        s->cancelled = true;
        // While the cell runs, the interpreter interrupts it (then kills it); before, the
        // call stops at its next step.
        if (s->executing) s->inner.emit(t);
      }
    });
  }
  boost::asio::post(c_.executor, [this, st] { step(st); });
}

void interpreter_binding::step(const std::shared_ptr<call_state>& st) {
  if (closing_ || st->cancelled) return finish(st, std::nullopt);
  if (in_ && (st->call.reset || in_->ended())) {
    std::string why;
    if (st->call.reset) why = "the previous session was closed at the client's request (reset)";
    st->call.reset = false;
    return retire(std::move(why), [this, st] { step(st); });
  }
  const std::string runtime = st->call.runtime.value_or(in_ ? runtime_ : st->default_runtime);
  if (in_ && runtime != runtime_) {
    return finish(st, error_result(fmt::format(
                          "invalid_request: runtime: this MCP session's interpreter runs '{}'; "
                          "call with reset: true to start over with '{}' (the state is lost)",
                          runtime_, runtime)));
  }
  if (!in_) return open(st, runtime);
  execute(st);
}

void interpreter_binding::open(const std::shared_ptr<call_state>& st, const std::string& runtime) {
  opening_ = true;
  c_.runtime.async_open_interpreter(
      {.runtime = runtime}, c_.ticket,
      boost::asio::bind_executor(c_.executor, [this, st, runtime](boost::system::error_code ec,
                                                                  interpreter_start s) {
        opening_ = false;
        if (s.interpreter) {
          in_ = std::move(s.interpreter);
          runtime_ = runtime;
          cells_ = 0;
          fresh_ = true;
          std::cerr << "sandboxctl: mcp: interpreter " << in_->id() << " (" << runtime
                    << ") opened\n";
          if (closing_) {
            retire({}, {});
            return finish(st, std::nullopt);
          }
          // A cancelled call leaves the fresh session for the next one.
          if (st->cancelled) return finish(st, std::nullopt);
          return execute(st);
        }
        const auto c = ec && s.code == code::ok ? code::internal : s.code;
        finish(st,
               error_result(fmt::format(
                   "{}: {}", to_string(c == code::ok ? code::internal : c),
                   s.message.empty() ? "the interpreter session could not be opened" : s.message)));
      }));
}

void interpreter_binding::execute(const std::shared_ptr<call_state>& st) {
  st->executing = true;
  const std::uint64_t n = ++cells_;
  const bool fresh = std::exchange(fresh_, false);
  std::string previous = fresh ? std::exchange(previous_ended_, {}) : std::string();
  std::string cancelled_before = std::exchange(cancelled_before_, {});
  auto in = in_;
  std::string runtime = runtime_;
  in->async_execute(
      {.code = st->call.code, .timeout = st->call.timeout},
      boost::asio::bind_cancellation_slot(
          st->inner.slot(),
          boost::asio::bind_executor(
              c_.executor,
              [this, st, in, n, fresh, runtime = std::move(runtime), previous = std::move(previous),
               cancelled_before = std::move(cancelled_before)](boost::system::error_code ec,
                                                               cell_result r) mutable {
                st->executing = false;
                if (ec == boost::asio::error::operation_aborted && !st->cancelled &&
                    r.session_ended) {
                  // The session ended just before the cell (its idle timer, its lifetime):
                  // nothing ran; the cell goes to a fresh one.
                  cancelled_before_ = std::move(cancelled_before);
                  if (++st->reopened > 1) {
                    return finish(st, error_result("internal: the interpreter session ended "
                                                   "before the cell could run"));
                  }
                  if (in_ == in) return retire({}, [this, st] { step(st); });
                  return step(st);
                }
                if (ec == boost::asio::error::in_progress) {  // (busy_ keeps this away)
                  return finish(st, error_result("capacity: a cell of this session is running"));
                }
                const bool lost = r.state == interpreter_state::lost || r.session_ended;
                if (st->cancelled) {
                  cancelled_before_ =
                      fmt::format("it was cancelled: {}{}{} (state {})", to_string(r.code),
                                  r.message.empty() ? "" : ": ", r.message, to_string(r.state));
                }
                if (lost && in_ == in) {
                  retire(st->cancelled ? "the previous session ended when the cell of a "
                                         "cancelled call was killed"
                                       : fmt::format("the previous session ended when a cell "
                                                     "lost its state ({})",
                                                     to_string(r.code)),
                         {});
                }
                if (st->cancelled) return finish(st, std::nullopt);
                const cell_session_info info{.runtime = std::move(runtime),
                                             .cell = n,
                                             .fresh = fresh,
                                             .previous_ended = std::move(previous),
                                             .cancelled_before = std::move(cancelled_before)};
                finish(st, cell_call_result(r, info, *c_.runtime.blobs(), c_.ticket.tenant()));
              })));
}

void interpreter_binding::retire(std::string why, std::function<void()> then) {
  auto in = std::exchange(in_, nullptr);
  if (!in) {
    if (then) then();
    return;
  }
  ++closes_;
  // Said at once: a next call may open a fresh session before this one is confirmed gone.
  if (!why.empty()) previous_ended_ = why;
  in->async_close(boost::asio::bind_executor(
      c_.executor, [this, in, why = std::move(why), then = std::move(then)](
                       boost::system::error_code, const session_result& r) {
        std::cerr << "sandboxctl: mcp: interpreter " << in->id() << " closed (" << to_string(r.end)
                  << "), its sandbox gone\n";
        if (why.empty()) previous_ended_ = ended_words(r.end);
        --closes_;
        if (then) then();
        settle();
      }));
}

void interpreter_binding::finish(const std::shared_ptr<call_state>& st,
                                 std::optional<nlohmann::json> result) {
  if (closing_) result.reset();
  busy_ = false;
  if (st->outer.is_connected()) st->outer.clear();
  auto done = std::move(st->done);
  done(std::move(result));
  settle();
}

void interpreter_binding::async_close(std::function<void()> done) {
  if (closing_) return;
  closing_ = true;
  closed_ = std::move(done);
  if (in_) retire({}, {});
  settle();
}

void interpreter_binding::settle() {
  if (!closing_ || busy_ || opening_ || closes_ != 0 || !closed_) return;
  // Last: `done` may end the owner.
  auto done = std::exchange(closed_, nullptr);
  done();
}

}  // namespace sandbox::mcp
