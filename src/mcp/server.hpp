// Private: the MCP server of `sandboxctl mcp` (docs/mcp.md), bound to one ticket for its
// whole life; the client never sends a ticket. The server owns what every transport shares
// (the io_context, the runtime, signal handling, the orderly end); a `transport` frames
// messages over one medium and hands them to sessions (session.hpp), which hold the
// dispatch, the tools and the runs. Two transports exist: stdio (stdio_transport.hpp) and
// Streamable HTTP (http_transport.hpp).
//
// Threads: one thread (the caller's) runs an io_context on which the runtime, every run's
// completion, every session and every transport's I/O happen (a transport may keep a
// thread of its own for blocking reads, posting what it reads). SIGINT, SIGTERM or SIGHUP,
// or the transport's own end (EOF on stdin), stop the transport: it cancels every run in
// flight, the runtime kills each and confirms it dead before its completion, and only then
// does `serve` return.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "mcp/session.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox::mcp {

/// The MCP protocol revision the server speaks (and answers with when a client asks for
/// one it does not know).
inline constexpr const char* protocol_revision = "2025-06-18";

/// Whether `revision` is one the server serves: 2025-06-18, 2025-03-26 or 2024-11-05.
bool is_known_revision(std::string_view revision) noexcept;

/// A medium MCP messages travel over: it frames them and hands them to sessions. Created by
/// `serve` once the runtime exists; lives on `server_context::executor`; every member is
/// called there.
class transport {
 public:
  virtual ~transport() = default;

  /**
   * Begins reading or accepting. `ended` is called (once, on the executor) when the medium
   * ends by itself (EOF on stdin, a client that stopped reading stdout); `serve` then stops
   * the transport. Returns false, having said why on stderr, when it cannot start (`serve`
   * then returns 1).
   */
  virtual bool start(std::function<void()> ended) = 0;

  /**
   * Stops taking messages and connections, cancels every run in flight of every session,
   * and calls `done` once each was confirmed gone and what remains to be written was written
   * or given up (a bounded wait). Called once.
   */
  virtual void async_stop(std::function<void()> done) = 0;
};

/// Makes the transport `serve` runs, on the context it is given (which outlives it).
using transport_factory = std::function<std::unique_ptr<transport>(const server_context&)>;

/// How `serve` is started.
struct server_options {
  sandbox::runtime_options runtime;  ///< the host's runtime (config, stores, approver)
  sandbox::ticket ticket;            ///< every call runs under it; its tenant owns the blobs
  /// Runs in flight at once in one session; a call beyond it is a tool error
  /// "capacity: ..." (the host scheduler's own caps still apply below it).
  std::size_t max_in_flight = 16;
};

/**
 * Creates the runtime (levels proved on demand; a network run without `code.network` ends
 * `approval_required` unless the host brings its own approver), makes the transport and
 * serves until SIGINT/SIGTERM/SIGHUP or the transport's end, then waits until every run in
 * flight is confirmed gone. Returns the exit status: 0 after a clean end, 1 when the runtime
 * or the transport could not start (said on stderr). Not thread-safe: call once per process
 * (it handles those signals and ignores SIGPIPE).
 */
int serve(server_options options, const transport_factory& make_transport);

}  // namespace sandbox::mcp
