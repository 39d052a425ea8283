// Private: MCP's stdio transport for `sandboxctl mcp` (docs/mcp.md): newline-delimited
// JSON-RPC 2.0 on stdin and stdout (nothing else is ever written to stdout; logs go to
// stderr), one session for the life of the process.
//
// A reader thread only reads stdin and posts each line (at most `max_line_bytes`) to the
// server's executor, waiting while 16 MiB of lines are not yet handled (backpressure).
// Stdout is written asynchronously, so a client that stops reading never stalls the runs'
// timers, kills or signal handling; more than 64 MiB left unread, a failed write, or EOF on
// stdin end the transport. On its end every run is cancelled; the answers already queued are
// written for at most 5 s more.
#pragma once

#include <memory>

#include "mcp/server.hpp"

namespace sandbox::mcp {

/// Where the stdio transport reads and writes (neither descriptor is closed).
struct stdio_options {
  int in_fd = 0;   ///< read requests here
  int out_fd = 1;  ///< write responses here
};

/// The stdio transport on `context` (which must outlive it).
std::unique_ptr<transport> make_stdio_transport(const server_context& context,
                                                stdio_options options = {});

}  // namespace sandbox::mcp
