// Private: the interpreter session bound to one MCP session (`run_cell`, docs/mcp.md). It is
// opened lazily, under the server's ticket, by the first `run_cell` (its runtime fixed then),
// kept across calls, and closed — the sandbox killed and confirmed gone — when the MCP
// session ends. A cell that loses the state ends it: the next call opens a fresh one and its
// result says so and why; so does one after the interpreter ended by itself (idle timeout,
// lifetime) or after `reset`. Cells run one at a time: a call while one runs (or while the
// session opens or resets) is refused with a `capacity` tool error, never queued.
//
// Threads: lives on `server_context::executor` (one thread); every member is called there and
// every completion is made there.
#pragma once

#include <boost/asio/cancellation_signal.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "mcp/tools.hpp"
#include "sandbox/interpreter.hpp"

namespace sandbox::mcp {

struct server_context;

/// The interpreter of one MCP session. Not copyable or movable (completions refer to it).
/// Destroy it only after `async_close` completed, or when `run` was never called.
class interpreter_binding {
 public:
  /// Bound to `context` (its runtime, ticket and executor), which must outlive it.
  explicit interpreter_binding(const server_context& context);
  interpreter_binding(const interpreter_binding&) = delete;
  interpreter_binding& operator=(const interpreter_binding&) = delete;
  ~interpreter_binding();

  /// The completion of `run`: the `tools/call` result, or nullopt when the call was
  /// cancelled (through `cancel`) or the binding is closing — nothing to answer.
  using run_handler = std::function<void(std::optional<nlohmann::json> result)>;

  /**
   * Runs one cell: opens the session first when there is none (or it ended, or `reset`),
   * then executes. `done` is called exactly once, never inside this call: with a tool error
   * `capacity: ...` at once when a call is already running; `invalid_request: ...` when
   * `runtime` differs from the open session's and `reset` is not set; the interpreter's
   * refusal when it cannot be opened (`action_denied`, `runtime_unavailable`, `capacity`,
   * `queue_timeout`, ...); else `cell_call_result`. Emitting `cancel` (any type) while it
   * runs interrupts the cell as the interpreter does at a timeout (SIGINT, then the kill)
   * and completes with nullopt; the next call's result says what happened to it.
   */
  void run(const cell_arguments& call, const tool_context& tools,
           boost::asio::cancellation_slot cancel, run_handler done);

  /// Whether a `run` is in progress (opening, resetting or executing).
  bool is_busy() const noexcept { return busy_; }

  /**
   * Closes the session (its sandbox killed and confirmed gone; a running cell completes
   * with nullopt), waits for one still opening and closes it too, and calls `done` once
   * nothing of it is left. Called once; a later `run` completes with nullopt.
   */
  void async_close(std::function<void()> done);

 private:
  struct call_state;
  void step(const std::shared_ptr<call_state>& st);
  void open(const std::shared_ptr<call_state>& st, const std::string& runtime);
  void execute(const std::shared_ptr<call_state>& st);
  void retire(std::string why, std::function<void()> then);
  void finish(const std::shared_ptr<call_state>& st, std::optional<nlohmann::json> result);
  void settle();

  const server_context& c_;
  std::shared_ptr<sandbox::interpreter> in_;  ///< the open session, if any
  std::string runtime_;                       ///< its runtime
  std::uint64_t cells_ = 0;                   ///< cells it ran
  bool fresh_ = false;                        ///< opened for the call now running
  std::string previous_ended_;                ///< why the last session is gone (next fresh)
  std::string cancelled_before_;              ///< what happened to a cancelled cell
  bool busy_ = false;
  bool opening_ = false;
  std::size_t closes_ = 0;  ///< closes in progress (reset, lost state, the end)
  bool closing_ = false;
  std::function<void()> closed_;  ///< async_close's `done`, until nothing is left
};

}  // namespace sandbox::mcp
