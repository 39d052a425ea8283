// Private: one MCP session of `sandboxctl mcp` (docs/mcp.md), whatever carries it. A session
// is the JSON-RPC dispatch (initialize, ping, tools/list, tools/call, cancellation), the
// tools and their ceilings, and the lifecycle of the runs it started. Transports
// (stdio_transport.hpp, http_transport.hpp) only frame messages: each hands a session what
// it read and writes back what the session answers, so both serve the same code.
//
// Threads: a session lives on one executor (`server_context::executor`, one thread); every
// member is called there and every reply is made there, run completions included.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "mcp/interpreter_binding.hpp"
#include "mcp/jsonrpc.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox::mcp {

/// What every session of one server shares. The runtime and the ticket outlive every session.
struct server_context {
  sandbox::runtime& runtime;              ///< runs every call (its scheduler's caps apply)
  const sandbox::ticket& ticket;          ///< every call runs under it; its tenant owns the blobs
  boost::asio::any_io_executor executor;  ///< the one thread sessions and transports live on
  /// Runs in flight at once in one session; a call beyond it is a tool error "capacity: ..."
  /// (the host scheduler's own caps still apply below it).
  std::size_t max_in_flight = 16;
  /// The configured runtimes whose interpreter is Python (`is_python_runtime`), for
  /// `run_cell`; empty: no `run_cell`.
  std::vector<std::string> python_runtimes = {};
};

/// The answer to one message: the response line (newline excluded), or nullopt when there is
/// none to send (a notification, a response, a request the client cancelled or that the
/// session's close cut off).
using reply_handler = std::function<void(std::optional<std::string> line)>;

/// One client's MCP session: dispatch, tools, the runs in flight and the interpreter session
/// bound to it (`run_cell`, interpreter_binding.hpp). Not copyable or movable (its runs'
/// completions refer to it). Destroy it only after `async_close` completed, or when nothing
/// was started.
class session {
 public:
  /// A session bound to `context`, which must outlive it.
  explicit session(const server_context& context);
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  ~session();

  /**
   * Handles one message. `reply` is called exactly once: at once for everything but a
   * `tools/call` that runs code, which is answered when its run completes (or with nullopt
   * when it was cancelled). After `async_close` began every message is answered nullopt.
   */
  void handle(const message& m, reply_handler reply);

  /// Parses one line (`parse_line`) and handles it; a refused line is answered with its error,
  /// a blank line with nullopt.
  void handle_line(std::string_view line, reply_handler reply);

  /// Cancels the request `id` in flight as `notifications/cancelled` does: the runtime kills
  /// its run and confirms it gone (a `run_cell`'s cell is interrupted, then killed when it
  /// does not yield), and the request is answered nullopt. Returns false when no such
  /// request is in flight.
  bool cancel(const nlohmann::json& id);

  /// Cancels every run in flight, closes the bound interpreter session, and calls `done` once
  /// each run and the interpreter's sandbox were confirmed gone (at once when there is
  /// nothing). Called once; later messages are answered nullopt.
  void async_close(std::function<void()> done);

  /// Runs started and not yet completed.
  std::size_t in_flight() const noexcept { return in_flight_.size(); }

  /// Whether an `initialize` request succeeded.
  bool is_initialized() const noexcept { return initialized_; }

 private:
  void handle_notification(const message& m);
  void initialize(const message& m, reply_handler& reply);
  void call(const message& m, reply_handler reply);
  void settle_if_closed();
  void run_cell(const message& m, const nlohmann::json& args, reply_handler reply);
  /// Admits a call that runs code: registered in flight under its id's key, with the signal
  /// that cancels it; or refused through `reply` (an id already in flight, or this client's
  /// cap on calls in flight) and nullptr.
  std::shared_ptr<boost::asio::cancellation_signal> admit(const message& m, reply_handler& reply);
  /// The end of an admitted call: out of flight, and answered `answer` — or nullopt when the
  /// client cancelled it or the session is closing (MCP, "Cancellation").
  void finish(const std::string& key, const reply_handler& reply,
              std::optional<std::string> answer);

  const server_context& c_;
  std::map<std::string, std::shared_ptr<boost::asio::cancellation_signal>> in_flight_;
  std::set<std::string> cancelled_;  ///< keys cancelled by the client: answered nullopt
  std::function<void()> closed_;     ///< async_close's `done`, until every run completed
  interpreter_binding interpreter_;  ///< run_cell's interpreter session
  bool interpreter_closed_ = false;  ///< its async_close completed
  bool initialized_ = false;
  bool closing_ = false;
};

}  // namespace sandbox::mcp
