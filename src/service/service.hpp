// Service mode: one daemon per host owns the runtime (and so the host-wide scheduler caps);
// agent processes talk to it over a unix socket (or the daemon's stdin/stdout) with the
// protocol's JSON documents, one line per request and one line per answer (docs/protocol.md,
// "Service mode"). This header is the room's whole face for the CLI (`sandboxctl serve`):
// the options and `run_service`.
//
// Without trusted keys, the daemon trusts the tickets its clients send, exactly as
// `sandboxctl run` trusts ticket files: whoever can connect to the socket decides what runs,
// so the socket's permissions (0660: the daemon's user and group) are the access control.
// With trusted keys, it accepts only signed ticket documents whose chain verifies against
// them (sandbox/signed_ticket.hpp); an unsigned ticket is `action_denied`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "sandbox/runtime.hpp"
#include "sandbox/signed_ticket.hpp"

namespace sandbox::service {

/// Bounds that keep one client from growing the daemon without limit. Defaults are the
/// documented protocol limits (docs/protocol.md, "Service mode").
struct service_limits {
  /// Longest request line in bytes, without its newline; longer lines are discarded as they
  /// stream in (never buffered) and answered `invalid_request` with `"id": null`.
  std::size_t max_line_bytes = (1U << 20) + (64U << 10);
  std::size_t max_id_bytes = 128;  ///< `id` is a string of 1..max_id_bytes bytes
  /// Runs of one connection in flight at once; at the cap the daemon reads no further lines
  /// from that client until one completes (backpressure through the socket buffer).
  std::uint32_t max_in_flight = 64;
  /// Unwritten answer bytes of one connection at which the daemon stops reading its lines.
  std::size_t output_pause_bytes = 1U << 20;
  /// Unwritten answer bytes of one connection beyond which the client is considered stuck:
  /// it is disconnected and its runs are cancelled.
  std::size_t max_output_bytes = 32U << 20;
  std::size_t max_blob_put_bytes = 768U << 10;  ///< decoded bytes of one `blob_put`
  std::size_t max_blob_get_bytes = 8U << 20;    ///< largest blob `blob_get` returns
  std::size_t max_connections = 256;            ///< beyond: answered `capacity` and closed
  /// Unwritten answer bytes of all connections together beyond which `blob_get` is answered
  /// `capacity` (the rest of an answer is small): bounds the daemon's memory when many
  /// clients do not read, whatever each stays under.
  std::size_t max_total_output_bytes = 128U << 20;
  /// Sessions (`session_open`) of one connection open or opening at once; beyond: the open
  /// is answered `capacity`.
  std::uint32_t max_sessions_per_client = 8;
  /// Sessions of all connections together; beyond: `capacity`.
  std::uint32_t max_sessions = 64;
  /// Bytes of `session_write` data a connection has waiting for its sessions' stdin buffers
  /// at which the daemon stops reading its lines (the write answers are the backpressure).
  std::size_t session_write_pause_bytes = 1U << 20;
  /// Most stdout bytes one `{"session":S,"stdout":…}` event carries (before base64). A
  /// session's stdout is read only while the connection's unwritten answers are under
  /// `output_pause_bytes`, so a server's output is never buffered beyond that.
  std::size_t session_read_chunk_bytes = 16U << 10;
};

/// How the daemon is started.
struct serve_options {
  /// Unix socket to listen on. Must not exist, or be a stale socket (nobody listening),
  /// which is replaced. Created mode 0660 (owner and group), removed on exit.
  std::filesystem::path socket_path;
  /// Serve one client on stdin/stdout instead of a socket. End of stdin means "no more
  /// requests": the daemon finishes the runs in flight, writes their answers and exits.
  bool stdio = false;
  /// A listening unix stream socket inherited from the service manager (socket activation:
  /// `take_activated_socket`, service/systemd.hpp), served instead of `socket_path` (which
  /// stays empty). Taken over, and never unlinked: the socket unit owns its file, and the
  /// socket outlives the daemon (connections made while it restarts wait in the backlog).
  int listen_fd = -1;
  /// The inherited socket's address or name, for the log line (e.g. "/run/x.sock").
  std::string listen_description;
  /**
   * Take over the cgroup the daemon was started in, delegated by its service manager
   * (systemd `Delegate=yes`): before anything else, move into the leaf `<own>/daemon` and put
   * runs under `<own>/runs` (overriding `runtime.process.cgroup_parent`);
   * `detail::enter_delegated_cgroup`. Pure cgroup v2 only; anything else stops the daemon
   * with the reason (exit 1).
   */
  bool cgroup_delegated = false;
  sandbox::runtime_options runtime;  ///< stores, scheduler caps, policy, log sink
  service_limits limits;
  unsigned threads = 2;  ///< threads running the daemon's io_context (≥ 1)
  /// Trusted ticket-signing public keys. Empty (the default): tickets are trusted as sent.
  /// Non-empty: every run's ticket must be a signed document that verifies against them
  /// (`ticket_verifier::verify`, at the moment the line is read); anything else, an unsigned
  /// ticket included, is answered with an `action_denied` result. A network request whose
  /// ticket lacks `code.network` is then answered `approval_required` with its approval
  /// request (unless `runtime.approver` is set), for the client to resume under a derived
  /// ticket signed by a trusted key.
  sandbox::ticket_verifier trusted_keys;
  /// Called once, on the calling thread, when the daemon serves: the socket is bound and
  /// listening (or stdin/stdout are set up) and the runtime is up. May be empty.
  std::function<void()> on_ready;
};

/// How `run_service` ended.
struct service_exit {
  /// 0 after a clean shutdown; 1 when the daemon could not start (socket path in use or not
  /// a socket, runtime failure, a delegated cgroup that cannot be used); 2 for unusable
  /// options (no socket path, a path too long).
  int status = 0;
  /// Why it could not start, for the operator ("cannot bind '/run/x.sock': ..."); empty
  /// after a clean shutdown.
  std::string error;
};

/**
 * Runs the daemon until SIGINT, SIGTERM or SIGHUP (or, with `stdio`, until stdin ends and
 * every answer is written, or stdout is closed). On a signal it stops accepting, cancels
 * every run in flight (each is killed and confirmed dead), writes the answers it can within
 * a few seconds, removes the socket and returns. Host log lines go to `runtime.log` (a
 * stderr sink at `warning` when empty).
 *
 * Must be called at most once per process, from the main thread while it is still
 * single-threaded (the runtime's start-up self-test starts a sandbox before any thread of
 * the daemon exists); it installs signal handling (SIGPIPE ignored; SIGINT/SIGTERM/SIGHUP
 * caught while it runs) and, with `stdio`, points descriptors 0 and 1 at /dev/null. Under a
 * service manager ($NOTIFY_SOCKET, sd_notify(3)) it reports READY=1 once it serves and
 * STOPPING=1 once it no longer does (before the runtime's clean-up), and unsets the variable
 * so no run inherits it.
 */
service_exit run_service(const serve_options& options);

}  // namespace sandbox::service
