// Interpreter sessions: a live Python interpreter for one ticket (one conversation), fed cells
// one at a time and destroyed at its end. State lives only inside the session; nothing is
// carried to another one.
//
//   rt.async_open_interpreter({.runtime = "python3-data"}, ticket,
//       [](boost::system::error_code ec, sandbox::interpreter_start s) {
//         if (ec || !s.interpreter) { /* s.code, s.message say why */ return; }
//         s.interpreter->async_execute({.code = "x = 41"}, ...);
//         s.interpreter->async_execute({.code = "x + 1"}, ...);   // cell_result::value "42"
//         s.interpreter->async_close(...);
//       });
//
// The interpreter runs a small driver program that the host ships (it is passed on the
// interpreter's command line, never read from the image) inside a session sandbox
// (sandbox/session.hpp: same run machine, cgroup, seccomp filter, kill-and-confirm). The
// driver and the cell's code share one process, so everything the driver sends is untrusted:
// it reaches the host as bounded, newline-delimited frames tagged with a random nonce per
// cell, on the driver's own copy of the session's stdout. The host drops frames of other
// cells and lines over the frame cap, caps every figure it keeps, and takes a cell's `code`
// (timeout, oom, seccomp_violation, the interpreter's exit) and `state` only from its own
// evidence: its timer, and whether the sandbox is still alive. A forged frame can only
// mislead about its own cell's outputs.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/code.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/session.hpp"

namespace sandbox {

/// What opening an interpreter asks for: a language runtime by name (one of
/// `runtime_options::runtimes` whose interpreter is Python, e.g. "python3" or a host-defined
/// "python3-data"). The ticket must grant `code.execute`, like a run of that runtime.
struct interpreter_request {
  std::string runtime = "python3";
  /// Maximum lifetime; unset: `session_options::default_lifetime`. Clamped like a session's
  /// (`session_options::max_lifetime`, the ticket's `max_timeout`, its expiry). ≤ 0:
  /// `invalid_request`.
  std::optional<std::chrono::milliseconds> max_lifetime;
  /// Idle timeout between cells; unset: `session_options::idle_timeout`, and clamped to it.
  /// A running cell is never idle. ≤ 0: `invalid_request`.
  std::optional<std::chrono::milliseconds> idle_timeout;
  bool operator==(const interpreter_request&) const = default;
};

/// One cell.
struct cell_request {
  std::string code;  ///< Python source; at most the policy's `max_source_bytes`
  /// Unset: the policy's `default_timeout`. Clamped to the ticket's `max_timeout` and to the
  /// session's remaining lifetime. ≤ 0: `invalid_request`.
  std::optional<std::chrono::milliseconds> timeout;
  /**
   * Input files added to the session's input directory (`$SANDBOX_INPUT_DIR`, read-only
   * inside) before the cell runs, by blob id only; they stay for the session's life. Checked
   * as a run's `files_in` (names, duplicates, blob id syntax: `invalid_request`; a blob that
   * is not the ticket's tenant's: `blob_not_found`), and the session's inputs together stay
   * within the policy's `max_input_files` and `max_input_bytes` (`invalid_request`). A name
   * the session already has is accepted again only for the same blob (nothing is copied);
   * with another blob it is `invalid_request`. Refused at the gvisor and microvm levels
   * (`runtime_unavailable`: their input directory is fixed at start). Any refusal: the cell
   * does not run, the state is kept.
   */
  std::vector<input_file> files_in;
  bool operator==(const cell_request&) const = default;
};

/// Whether the interpreter's state (variables, imports, files) survived the cell, from the
/// host's evidence: `kept` only when the sandbox is alive and the driver answered for this
/// cell; `lost` when the sandbox ended (then the session is over).
enum class interpreter_state : std::uint8_t { kept, lost };

/// Wire name: "kept" or "lost".
std::string_view to_string(interpreter_state s) noexcept;

/// A rich output of a cell: a matplotlib figure (image/png) or a `display()`ed value.
struct rich_output {
  std::string mime_type;    ///< e.g. "image/png", "text/html", "text/plain"
  std::string blob;         ///< blob id of the bytes (the ticket's tenant's)
  std::uint64_t bytes = 0;  ///< their size
  bool operator==(const rich_output&) const = default;
};

/// What one cell gave.
struct cell_result {
  /**
   * `ok`; `error` (the cell raised: `error` holds the summary; state kept); `timeout` (our
   * timer fired: the cell was interrupted — state kept — or, not yielding within
   * `interpreter_options::interrupt_grace`, the sandbox was killed — state lost);
   * `oom`, `seccomp_violation`, `pids_limit`, `internal` (the sandbox ended under the cell:
   * state lost); `invalid_request` (bad cell: nothing ran, state kept); `source_too_large`;
   * `ok` with `state` lost and `exit_code` set when the cell made the interpreter exit;
   * `network_disabled` (the host refused network attempts during the cell — the
   * interpreter lives on, state kept — where the level records them, as a run's code is).
   */
  sandbox::code code = sandbox::code::internal;
  interpreter_state state = interpreter_state::lost;
  bool session_ended = false;  ///< the session is over (`state` is then lost)
  std::string message;         ///< short, sanitized, host-written
  /// The exception's summary (last frames of the cell and `Type: message`), at most 4 KiB,
  /// as the driver reported it (untrusted: the cell's own words).
  std::string error;
  std::string value;  ///< repr of the last expression (empty when none or None), ≤ 4 KiB
  bool value_truncated = false;
  /// The cell's stdout and stderr: summary, blob (up to the policy's
  /// `stream_capture_bytes`), total as reported by the driver.
  stream_capture std_out;
  stream_capture std_err;
  /// Regular files written or changed in `$SANDBOX_OUTPUT_DIR` during the cell (names
  /// relative to it), up to the policy's output caps.
  std::vector<output_file> files_out;
  std::vector<rich_output> outputs;  ///< figures and displayed values, in order, capped
  bool outputs_truncated = false;    ///< files or rich outputs over a cap were dropped
  /// Frames the host dropped during the cell: another cell's nonce, malformed, over the
  /// frame cap (a sign of a cell writing on the driver's channel).
  std::uint64_t frames_dropped = 0;
  std::optional<int> exit_code;  ///< the interpreter's exit status, when it exited
  std::optional<int> signal;     ///< the signal that ended it, when one did
  /**
   * From the host's evidence: `wall` from sending the cell to its answer (host clock);
   * `cpu` the session cgroup's CPU time during the cell (every process of the session,
   * children left from earlier cells included); `peak_memory_bytes` the cgroup's highest
   * memory use during the cell where the host can restart the kernel's peak counter (cgroup
   * v1, or v2 without memory.peak), else — and for a cell that ended the session — the
   * session's peak so far. `setup` is 0. All 0 for a cell that did not run.
   */
  run_usage usage;
  bool operator==(const cell_result&) const = default;
};

/// Host limits of interpreter sessions (`runtime_options::interpreters`).
struct interpreter_options {
  /// After a cell's SIGINT, how long it may take to yield before the sandbox is killed.
  std::chrono::milliseconds interrupt_grace{1000};
  std::uint32_t max_value_bytes = 4096;          ///< cap of `cell_result::value`
  std::uint32_t max_outputs = 16;                ///< rich outputs kept per cell
  std::uint64_t max_cell_file_bytes = 32 << 20;  ///< files + rich outputs bytes per cell
  bool operator==(const interpreter_options&) const = default;
};

/**
 * A live interpreter. From `runtime::async_open_interpreter`. Thread-safe; handlers run on
 * their associated executor (default: the runtime's). One cell at a time: a second
 * `async_execute` while one runs completes with `boost::asio::error::in_progress`.
 * Destroying the last reference kills the sandbox.
 */
class interpreter {
 public:
  virtual ~interpreter() = default;
  /// The session's run id.
  virtual const std::string& id() const noexcept = 0;
  /// Whether the session is over (a cell lost the state, idle timeout, lifetime, close).
  virtual bool ended() const noexcept = 0;

  /**
   * Runs one cell. Completes with `(error_code, cell_result)`: the error code is
   * `in_progress` (a cell runs) or `operation_aborted` (the session was over before the
   * cell: the result then has code `invalid_request`, `state` lost, `session_ended`; or the
   * cell was cancelled);
   * every outcome of the cell itself is in the result.
   *
   * Per-operation cancellation (the handler's cancellation slot, any type; emit it on the
   * handler's executor) interrupts the running cell as its timeout does: SIGINT, then, when
   * it does not yield within `interpreter_options::interrupt_grace`, the sandbox is killed.
   * It completes with `operation_aborted` and a result with code `internal` (or `timeout`
   * when the timer had fired first) whose `state` says whether the interpreter lived on.
   */
  template <class CompletionToken>
  auto async_execute(cell_request cell, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, cell_result)>(
        [this](auto h, cell_request c) { do_execute(std::move(c), std::move(h)); }, token,
        std::move(cell));
  }

  /// Ends the session (the sandbox is killed and confirmed dead) and completes with its
  /// `session_result`; again: the same result.
  template <class CompletionToken>
  auto async_close(CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, session_result)>(
        [this](auto h) { do_close(std::move(h)); }, token);
  }

 private:
  virtual void do_execute(
      cell_request cell,
      boost::asio::any_completion_handler<void(boost::system::error_code, cell_result)> h) = 0;
  virtual void do_close(
      boost::asio::any_completion_handler<void(boost::system::error_code, session_result)> h) = 0;
};

/// What `runtime::async_open_interpreter` completes with.
struct interpreter_start {
  std::shared_ptr<sandbox::interpreter> interpreter;  ///< null when refused
  /// `ok`, or as `session_start::code` — `invalid_request` (unknown runtime, not a Python
  /// runtime, bad limits), `action_denied` (no `code.execute`, expired), `runtime_unavailable`,
  /// `digest_mismatch`, `queue_timeout`, `capacity`, `internal`.
  sandbox::code code = sandbox::code::ok;
  std::string message;
};

}  // namespace sandbox
