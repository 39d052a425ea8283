// What every connection of one daemon shares (private to the service room): the runtime and
// its stores, the pool that runs blob requests, the limits, the trusted keys, the host log
// and the daemon-wide counters. The server owns it; a connection reaches the daemon only
// through it (and its done handler), never through the server itself.
#pragma once

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <cstddef>
#include <cstdint>

#include "sandbox/runtime.hpp"
#include "sandbox/signed_ticket.hpp"
#include "sandbox/span.hpp"
#include "service/service.hpp"

namespace sandbox::service {

/// Shared by the server and every connection; outlives them all (`run_service` owns it).
/// The references are set once; the counters are atomics because each connection updates
/// them from its own strand.
struct service_context {
  sandbox::runtime& rt;                          ///< the one runtime (one scheduler, host-wide)
  boost::asio::thread_pool& pool;                ///< blob requests (blocking file I/O) run here
  const service_limits& limits;                  ///< `serve_options::limits`
  const sandbox::ticket_verifier& trusted_keys;  ///< empty: tickets are trusted as sent
  sandbox::log_sink log;                         ///< host log lines ("serve: ...")

  /// Unwritten answer bytes of every connection (each adds and subtracts its own), checked
  /// against `max_total_output_bytes` before a `blob_get` answer is made.
  std::atomic<std::size_t> unwritten_total{0};
  /// Sessions open or opening, every connection together (`max_sessions`).
  std::atomic<std::size_t> sessions{0};
  /// Stdout bytes read from every session's server since the start (`service_stats`).
  std::atomic<std::uint64_t> session_stdout_bytes{0};
  /// Bytes of `session_write` data waiting in the daemon, every connection together.
  std::atomic<std::size_t> session_write_bytes{0};
};

}  // namespace sandbox::service
