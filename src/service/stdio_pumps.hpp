// Serving one client on the daemon's own stdin/stdout (private to the service room).
//
// Two pump threads copy between descriptors 0/1 and private pipes, and the connection reads
// and writes the pipes: so the connection code is the same as for a socket, the caller's
// file descriptions never become non-blocking, and regular files (which epoll refuses) work
// too. Descriptors 0 and 1 then point at /dev/null, so nothing else reads requests or
// writes into the answer stream.
#pragma once

#include <future>
#include <string>

namespace sandbox::service {

/// The connection's side of the pumps.
struct stdio_pipes {
  int in = -1;   ///< the requests (read end of the input pump's pipe)
  int out = -1;  ///< the answers (write end of the output pump's pipe)
  /// Ready once the output pump has handed everything to stdout, or its reader left.
  std::future<void> out_done;
};

/// Starts the two pump threads (detached). Empty on success, else why not ("cannot set up
/// stdin/stdout: ...").
std::string start_stdio_pumps(stdio_pipes& pipes);

}  // namespace sandbox::service
