// Long-lived sessions: a registered server (e.g. a stdio MCP server) started inside a sandbox
// and talked to over its standard input and output for as long as the host needs it.
//
// The model can only pick a name: `session_request::tool` names a registry entry
// (sandbox/registry.hpp `tool_entry`, configured by the host in `runtime_options::tools`,
// the same registry as one-shot registered tools)
// that fixes the image, the binary, its argv, the isolation level, the workload profile and
// the egress policy. The server runs exactly like a one-shot run's program (same run machine:
// its own cgroup, uid, namespaces, seccomp filter, kill-and-confirm), except that its stdin is
// a live pipe from the host and its stdout is read by the host as it comes:
//
//   rt.async_open_session({.tool = "mcp-everything"}, ticket,
//       [](boost::system::error_code ec, sandbox::session_start s) {
//         if (ec || !s.session) { /* s.code, s.message say why */ return; }
//         s.session->async_write(boost::asio::buffer(line), ...);   // JSON-RPC request
//         s.session->async_read_some(boost::asio::buffer(buf), ...); // its answer
//         s.session->async_close([](auto ec, sandbox::session_result r) { ... });
//       });
//
// Bytes are passed byte-exact both ways, at every isolation level (under gVisor the stdin
// bytes travel through sandbox-init's control stream). Host memory stays bounded whatever the
// server or the host does: writes are accepted into a bounded buffer
// (`session_options::stdin_buffer_bytes`) and wait while it is full (the server does not
// read); stdout is read straight into the caller's buffer, so a server whose host does not
// read blocks on its own pipe. A session holds a scheduler slot while it lives and records
// one span (`sandbox.session`) at its end, like a run.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sandbox/code.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/registry.hpp"

namespace sandbox {

/// What the model (or the agent host on its behalf) asks for: a registered server by name.
struct session_request {
  /// A `tool_entry::name` in `runtime_options::tools`; anything else is
  /// `invalid_request` ("tool: no registered tool named …").
  std::string tool;
  /// Maximum lifetime (wall clock from the server's start). Unset: the host's default
  /// (`session_options::default_lifetime`); clamped to `session_options::max_lifetime` and
  /// to the ticket's `max_timeout` (for a session the ticket's ceiling bounds its whole
  /// life). A session also ends when its ticket expires (`ticket::expires_at`): then with
  /// `session_end::ticket_expired`. ≤ 0 is `invalid_request`.
  std::optional<std::chrono::milliseconds> max_lifetime;
  /// Idle timeout: the session ends when no byte moved either way for this long. Unset: the
  /// host's default (`session_options::idle_timeout`); clamped to it. ≤ 0 is
  /// `invalid_request`.
  std::optional<std::chrono::milliseconds> idle_timeout;
  bool operator==(const session_request&) const = default;
};

/// Host configuration of sessions (`runtime_options::sessions`, the configuration file's
/// `sessions` section). The servers a session may start are the registry's entries
/// (`runtime_options::tools`; `tool_entry::input` does not apply: a session's stdin is live).
struct session_options {
  std::chrono::milliseconds default_lifetime{std::chrono::minutes(10)};
  std::chrono::milliseconds max_lifetime{std::chrono::hours(1)};    ///< ceiling of any request
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(2)};  ///< default and ceiling
  /// Bytes the host buffers towards the server's stdin (beyond the pipe's own 64 KiB).
  std::uint32_t stdin_buffer_bytes = 64 * 1024;
  bool operator==(const session_options&) const = default;
};

/// How a session ended.
enum class session_end : std::uint8_t {
  closed,             ///< the host called `async_close` (the server was stopped; not an error)
  server_exited,      ///< the server exited (and closed its output) by itself
  idle_timeout,       ///< no byte moved for the idle timeout (code `timeout`)
  max_lifetime,       ///< the maximum lifetime elapsed (code `timeout`)
  oom,                ///< the session's memory limit was hit (code `oom`)
  seccomp_violation,  ///< a forbidden system call (code `seccomp_violation`)
  killed,             ///< the session object was destroyed, or the runtime shut down
  failed,             ///< the sandbox failed (code `internal`, or `pids_limit` at gvisor)
  /// The ticket expired (`ticket::expires_at`) while the session lived (code `timeout`): a
  /// ticket stops granting anything when it expires, a live session included.
  ticket_expired,
};

/// Wire name of a `session_end` ("closed", "server_exited", "idle_timeout", …).
std::string_view to_string(session_end e) noexcept;

/// The closing record of a session: every process of it is dead and confirmed so.
struct session_result {
  session_end end = session_end::failed;
  /// As a run's: `code` (ok, timeout, oom, seccomp_violation, network_disabled, internal),
  /// exit code or signal of the server, usage (wall = the session's life), egress attempts,
  /// stderr as a blob (capped like a run's; past the cap a live session's stderr is read
  /// and discarded at most 1 MiB/s, so a flooding server blocks on its own pipe instead of
  /// costing the host CPU). `std_out.total_bytes` counts the bytes the host
  /// read; stdout is never stored (`std_out.blob` is empty). `timeout` is the lifetime
  /// granted: min(request or default, `session_options::max_lifetime`, the ticket's
  /// `max_timeout`, the time left until the ticket's `expires_at`). With a
  /// `runtime_options::receipt_signer`, `receipt` is the signed receipt of the session (as
  /// a run's: its request's `tool` is the entry's name, `timeout_ms` the lifetime granted).
  run_result result;
  std::uint64_t bytes_to_server = 0;    ///< bytes the server read from its stdin
  std::uint64_t bytes_from_server = 0;  ///< bytes the host read from the server's stdout
  bool operator==(const session_result&) const = default;
};

/// Buffer figures of a live session (for monitoring and tests; a snapshot, thread-safe).
struct session_stats {
  std::uint64_t bytes_to_server = 0;    ///< written into the server's stdin pipe so far
  std::uint64_t bytes_from_server = 0;  ///< read from its stdout by the host so far
  std::uint32_t stdin_buffered = 0;     ///< bytes accepted, not yet in the pipe (≤ capacity)
  std::uint32_t stdin_capacity = 0;     ///< `session_options::stdin_buffer_bytes`
  bool write_waiting = false;           ///< an `async_write` waits for buffer space
  bool ended = false;                   ///< the session is over (result available)
  bool operator==(const session_stats&) const = default;
};

/**
 * One live session. Obtained from `runtime::async_open_session`. Thread-safe; handlers run
 * on their associated executor (default: the runtime's). At most one `async_write` and one
 * `async_read_some` may be outstanding at a time (a second completes with
 * `boost::asio::error::in_progress`). Destroying the last reference kills the server (and
 * everything it started) and confirms it dead.
 */
class session {
 public:
  virtual ~session() = default;

  /// The session's run id (names its cgroup and spans).
  virtual const std::string& id() const noexcept = 0;

  /**
   * Writes `data` to the server's stdin. Completes with `(error_code, bytes)` once every byte
   * is accepted into the host's bounded buffer (it waits while that is full: the server does
   * not read). The caller keeps `data` alive until then. Errors: `broken_pipe` (the server
   * closed its stdin or stdin was closed), `operation_aborted` (the session ended: bytes =
   * what was accepted), `in_progress`.
   */
  template <class CompletionToken>
  auto async_write(boost::asio::const_buffer data, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, std::size_t)>(
        [this](auto h, boost::asio::const_buffer d) { do_write(d, std::move(h)); }, token, data);
  }

  /**
   * Reads what the server wrote to stdout: completes with `(error_code, bytes)` as soon as
   * some bytes are there (byte-exact, at most `buffer.size()`). `boost::asio::error::eof`
   * once the server (and every process holding its stdout) closed it; `operation_aborted`
   * when the session ended first; `in_progress`. The caller keeps `buffer` alive until then.
   */
  template <class CompletionToken>
  auto async_read_some(boost::asio::mutable_buffer buffer, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, std::size_t)>(
        [this](auto h, boost::asio::mutable_buffer b) { do_read(b, std::move(h)); }, token, buffer);
  }

  /// Closes the server's stdin once the buffered bytes are written (EOF for the server).
  virtual void close_stdin() = 0;

  /**
   * Ends the session: stdin is closed, the server gets the policy's exit grace to exit by
   * itself, then everything of it is killed and confirmed dead. Completes once with the
   * `session_result` (also when the session had ended by itself before: then `end` says
   * how). Calling it again completes with the same result.
   */
  template <class CompletionToken>
  auto async_close(CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, session_result)>(
        [this](auto h) { do_close(std::move(h)); }, token);
  }

  /// A snapshot of the buffer figures.
  virtual session_stats stats() const = 0;

 private:
  virtual void do_write(
      boost::asio::const_buffer data,
      boost::asio::any_completion_handler<void(boost::system::error_code, std::size_t)> h) = 0;
  virtual void do_read(
      boost::asio::mutable_buffer data,
      boost::asio::any_completion_handler<void(boost::system::error_code, std::size_t)> h) = 0;
  virtual void do_close(
      boost::asio::any_completion_handler<void(boost::system::error_code, session_result)> h) = 0;
};

namespace detail {
/// Completes `h(args...)` never inline: posted to `fallback`, then dispatched to the
/// handler's associated executor (an `any_completion_handler`'s cannot be posted to).
template <class Handler, class Executor, class... Args>
void post_completion(const Executor& fallback, Handler h, Args... args) {
  boost::asio::post(fallback, [h = std::move(h), fallback, args...]() mutable {
    auto ex = boost::asio::get_associated_executor(h, fallback);
    boost::asio::dispatch(ex, [h = std::move(h), args...]() mutable { std::move(h)(args...); });
  });
}
}  // namespace detail

/// What `runtime::async_open_session` completes with.
struct session_start {
  /// The live session; null when it was refused or the server failed to start.
  std::shared_ptr<sandbox::session> session;
  /// `ok` with a session; else why not: `invalid_request` (unknown tool, bad limits),
  /// `action_denied` (ticket expired, or no `tool.run` for this entry: `ticket_spec::tools`
  /// must name it or hold "*"), `runtime_unavailable` (no
  /// backend at the level, the entry's image absent, a backend without sessions),
  /// `digest_mismatch` (the entry's or ticket's pin differs from the image),
  /// `queue_timeout` (no scheduler slot of the tenant's class within its queue deadline: a
  /// session holds one for its whole life), `capacity` (the scheduler's queue is full, or
  /// the host's or the tenant's session cap is reached: `scheduler_options::
  /// max_session_slots`, `tenant_class_limits::max_session_slots`),
  /// `internal`.
  sandbox::code code = sandbox::code::ok;
  std::string message;  ///< short, sanitized; names the field for `invalid_request`
};

}  // namespace sandbox
