// A "run_python" tool as an agent runtime would implement it on top of agent-sandbox.
//
// The model calls the tool with JSON arguments; the tool turns them into a `run_request`,
// runs it under the ticket the host granted for this conversation, and turns the
// `run_result` into the text the model reads next. Everything that can go wrong — bad
// arguments, a rejected request, a timeout, an attempt to reach the network — becomes a
// short reply the model can act on; nothing throws.
//
// Tool-call arguments:
//   {"code": "print(6*7)",               required: the Python program
//    "timeout_seconds": 5,               optional, 1..3600 (default: options.default_timeout)
//    "files": {"data.csv": "a,b\n1,2"}}  optional: input files by name and content
//
// run_python_tool_test.cpp tests it with the fake backend only (`sandbox::testing`), which
// is the point of this example: a tool's error handling is tested without any sandbox.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <string>
#include <string_view>
#include <variant>

#include "sandbox/runtime.hpp"

namespace example {

class run_python_tool {
 public:
  struct options {
    std::chrono::milliseconds default_timeout{5000};  ///< when the call names none
  };

  /// `rt` must outlive the tool. `ticket` is what the host granted this conversation.
  run_python_tool(sandbox::runtime& rt, sandbox::ticket ticket, options opts);
  run_python_tool(sandbox::runtime& rt, sandbox::ticket ticket)
      : run_python_tool(rt, std::move(ticket), options{}) {}

  /// Runs the tool call and returns the reply for the model. Blocks the calling thread
  /// (which must not be the runtime's own). Thread-safe; never throws.
  std::string call(std::string_view arguments_json) const;

  /// Coroutine form: suspends instead of blocking; resumes on the coroutine's executor.
  /// Cancelling the coroutine (e.g. `co_await (tool.async_call(a) || timer.async_wait(...))`)
  /// kills the run; the reply then says it was cancelled.
  boost::asio::awaitable<std::string> async_call(std::string arguments_json) const;

  /// The request for `arguments_json` (input files stored as blobs of the ticket's tenant),
  /// or the error reply for arguments that cannot be used.
  std::variant<sandbox::run_request, std::string> build_request(
      std::string_view arguments_json) const;

  /// The reply for a finished run: stdout/stderr summaries, exit status, output files, or an
  /// explanation of why the code did not run to completion.
  static std::string format_reply(const sandbox::run_result& r);

 private:
  sandbox::runtime& rt_;
  sandbox::ticket ticket_;
  options opts_;
};

}  // namespace example
