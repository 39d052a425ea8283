// Private: MCP's Streamable HTTP transport (revision 2025-06-18) for `sandboxctl mcp
// --http ADDR | --http-socket PATH` (docs/mcp.md), on Boost.Beast. One endpoint path
// (`/mcp`): POST carries one JSON-RPC message (a request is answered with one
// `application/json` response; a notification or response with 202), DELETE ends a session,
// GET is 405 (the server sends no messages of its own). Sessions (`Mcp-Session-Id`) are made
// by `initialize`; each is an `mcp::session`, the same code as stdio's.
//
// Listens on loopback TCP or a unix socket only: the server has no authentication of its
// own, so who may connect is the whole access control. Origin (and, on TCP, Host) must be a
// loopback name (DNS rebinding). Every bound is per transport: body and header size, open
// connections, sessions, idle session expiry, a request read timeout, a response write
// timeout. A client that closes its connection while its request is in flight cancels it
// (the run is killed and confirmed gone), as `notifications/cancelled` would.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "mcp/jsonrpc.hpp"
#include "mcp/server.hpp"

namespace sandbox::mcp {

/// How the HTTP transport listens and what it bounds.
struct http_options {
  /// A loopback TCP address to listen on (port 0: the kernel picks one); unset: `socket_path`.
  std::optional<boost::asio::ip::tcp::endpoint> tcp;
  /// The unix socket to listen on when `tcp` is unset: created mode 0660 as the daemon's
  /// (a stale socket there is replaced; anything else is refused), removed at the end.
  std::string socket_path;
  std::string endpoint = "/mcp";                ///< the one path served (a query is ignored)
  std::size_t max_body_bytes = max_line_bytes;  ///< larger: 413 and parse error (8 MiB)
  std::size_t max_header_bytes = 16 * 1024;     ///< larger: 431 (16 KiB)
  std::size_t max_connections = 64;  ///< open at once; beyond it a request is answered 503
  std::size_t max_sessions = 32;     ///< live at once; an `initialize` beyond it is 503
  /// A session with no run in flight and no request for this long ends (later: 404).
  std::chrono::milliseconds session_idle_timeout = std::chrono::minutes(30);
  /// A request must be read in full within this, counted from when the connection is ready
  /// for it (slowloris; an idle keep-alive connection is closed after it too).
  std::chrono::milliseconds read_timeout = std::chrono::seconds(30);
  /// A response must be taken by the client within this, else the connection is closed.
  std::chrono::milliseconds write_timeout = std::chrono::seconds(30);
  /// Called once listening, with the address also printed on stderr
  /// (`http://127.0.0.1:PORT/mcp` or `unix:PATH`); may be empty.
  std::function<void(const std::string& address)> listening;
};

/// The HTTP transport on `context` (which must outlive it). `start` fails (false, said on
/// stderr) when it cannot bind.
std::unique_ptr<transport> make_http_transport(const server_context& context, http_options options);

/// Parses `--http`: `127.0.0.1:PORT` (any 127.0.0.0/8 address) or `[::1]:PORT`, port 0 to
/// 65535. Returns the endpoint, or why not (a name, a missing port, an address that is not
/// loopback).
std::variant<boost::asio::ip::tcp::endpoint, std::string> parse_loopback_address(
    std::string_view text);

/// Whether a Host header names a loopback host (`localhost`, 127.0.0.0/8, `[::1]`) and,
/// when it carries a port, `port`.
bool is_loopback_host(std::string_view host, unsigned short port);

/// Whether an Origin header is a loopback origin: `http` or `https`, a loopback host, any
/// port. `null` and every other origin are not.
bool is_loopback_origin(std::string_view origin);

/// Whether an Accept header lists both `application/json` and `text/event-stream` (by name;
/// a `q=0` entry does not count), as the transport requires of a POST.
bool accepts_json_and_sse(std::string_view accept);

}  // namespace sandbox::mcp
