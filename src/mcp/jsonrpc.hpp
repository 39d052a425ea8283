// Private: the JSON-RPC 2.0 framing of `sandboxctl mcp` (docs/mcp.md). One message per line
// of stdin, one per line of stdout (MCP's stdio transport). Pure: no I/O, so every hostile
// line (too long, not JSON, not an object, a batch, a wrong "jsonrpc", a bad id) is unit
// tested (tests/unit/mcp/jsonrpc_test.cpp).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>

namespace sandbox::mcp {

/// The JSON-RPC 2.0 error codes the server answers with.
enum class rpc_error : int {
  parse_error = -32700,       ///< the line is not JSON (or is over `max_line_bytes`)
  invalid_request = -32600,   ///< not a request object, or sent before `initialize`
  method_not_found = -32601,  ///< a method the server does not implement
  invalid_params = -32602,    ///< unknown tool, arguments that do not fit its input schema
  internal_error = -32603,    ///< the server failed (store error): never the run's outcome
  server_error = -32000,      ///< refused by the HTTP transport (origin, session, capacity)
};

/// Longest line read from stdin, newline excluded, in bytes: 8 MiB (a request file's cap,
/// enough for `put_file` of ~6 MiB of base64). A longer line is discarded up to its newline
/// and answered with `parse_error` and id null.
constexpr std::size_t max_line_bytes = 8ULL << 20;

/// Deepest nesting of arrays and objects a line may have: MCP messages and every tool's
/// arguments are far shallower. A deeper line is refused with `parse_error` and id null
/// before it is parsed.
constexpr std::size_t max_depth = 64;

/// One message the client sent, checked for shape.
struct message {
  /// The request id (a string or an integer); null for a notification.
  nlohmann::json id;
  bool is_notification = false;  ///< no "id" member: never answered
  bool is_response = false;      ///< a response to a request of ours (the server sends none)
  std::string method;            ///< empty for a response
  nlohmann::json params = nlohmann::json::object();  ///< "params", an object (default {})
};

/// A line that must be answered with an error: the whole response line (newline excluded).
struct refusal {
  std::string line;
};

/**
 * Parses one line of stdin. Returns the message, or the error response to write: a line
 * that is not strict JSON (a duplicate key, invalid UTF-8, a byte order mark, a comment,
 * trailing content: the daemon's reader), or nests deeper than `max_depth` → `parse_error`; an
 * array (a batch: removed from MCP in 2025-06-18), a non-object, "jsonrpc" other than "2.0", an id
 * that is neither a string nor an integer, a missing or non-string "method", "params" that is not
 * an object → `invalid_request`, with the request's id when it could be read and null otherwise. A
 * notification that is malformed is answered too (with id null): the client learns its line was
 * dropped.
 */
std::variant<message, refusal> parse_line(std::string_view line);

/// The response line `{"jsonrpc":"2.0","id":ID,"result":RESULT}`.
std::string result_line(const nlohmann::json& id, nlohmann::json result);

/// The response line `{"jsonrpc":"2.0","id":ID,"error":{"code":CODE,"message":MESSAGE}}`;
/// `id` null when it could not be read. `message` may be any bytes: it is made valid UTF-8.
std::string error_line(const nlohmann::json& id, rpc_error code, std::string_view message);

/// The notification line `{"jsonrpc":"2.0","method":METHOD,"params":PARAMS}`.
std::string notification_line(std::string_view method, nlohmann::json params);

}  // namespace sandbox::mcp
