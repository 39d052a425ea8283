// Private: the MCP server of `sandboxctl mcp` (docs/mcp.md) over stdio: newline-delimited
// JSON-RPC 2.0 on stdin and stdout (nothing else is ever written to stdout; logs go to
// stderr), bound to one ticket for its whole life. The client never sends a ticket.
//
// Threads: one thread (the caller's) runs an io_context on which the runtime, every run's
// completion and every write to stdout happen; one reader thread only reads stdin and posts
// each line to it. So a `tools/call` in flight never blocks `ping`, another call or a
// `notifications/cancelled` (the runtime's `async_run` runs them concurrently, under the
// host's scheduler caps). EOF on stdin (the client is gone), SIGINT, SIGTERM or SIGHUP
// cancel every run in flight; the runtime kills each and confirms it dead before its
// completion, and only then does `serve_stdio` return.
#pragma once

#include <cstddef>

#include "sandbox/runtime.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox::mcp {

/// The MCP protocol revision the server speaks (and answers with when a client asks for
/// one it does not know).
inline constexpr const char* protocol_revision = "2025-06-18";

/// How `serve_stdio` is started.
struct server_options {
  sandbox::runtime_options runtime;  ///< the host's runtime (config, stores, approver)
  sandbox::ticket ticket;            ///< every call runs under it; its tenant owns the blobs
  int in_fd = 0;                     ///< read requests here (not closed)
  int out_fd = 1;                    ///< write responses here (not closed)
  /// Runs in flight at once from this client; a call beyond it is a tool error
  /// "capacity: ..." (the host scheduler's own caps still apply below it).
  std::size_t max_in_flight = 16;
};

/**
 * Serves one MCP client on `in_fd`/`out_fd` until EOF on `in_fd` or SIGINT/SIGTERM/SIGHUP,
 * then kills every run in flight and waits until each is confirmed gone. Returns the exit
 * status: 0 after a clean end, 1 when the runtime could not be created (said on stderr).
 * Not thread-safe: call once per process (it handles signals and ignores SIGPIPE).
 */
int serve_stdio(server_options options);

}  // namespace sandbox::mcp
