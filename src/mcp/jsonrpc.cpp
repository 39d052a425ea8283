// The JSON-RPC 2.0 framing of `sandboxctl mcp` (jsonrpc.hpp).
#include "mcp/jsonrpc.hpp"

#include <fmt/format.h>

#include "protocol/json_strict.hpp"

namespace sandbox::mcp {
namespace {

// JSON text of `j`; invalid UTF-8 in any string becomes U+FFFD rather than an exception.
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Whether `line` nests arrays and objects deeper than `max_depth`, counted outside strings.
// Checked before parsing: the parser would build every level first (a line of millions of
// '[' takes hundreds of MiB and seconds before it is refused).
bool nests_deeper_than(std::string_view line, std::size_t max_depth) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return false;
}

bool is_valid_id(const nlohmann::json& id) {
  return id.is_string() || id.is_number_integer() || id.is_number_unsigned();
}

}  // namespace

std::variant<message, refusal> parse_line(std::string_view line) {
  if (nests_deeper_than(line, max_depth)) {
    return refusal{error_line(nullptr, rpc_error::parse_error,
                              fmt::format("parse error: nested deeper than {}", max_depth))};
  }
  // The daemon's strict reader: a duplicate key, invalid UTF-8, a byte order mark or a
  // comment is refused, never read one way here and another way by a proxy in front.
  nlohmann::json j;
  if (auto why = sandbox::detail::parse_strict(
          line, {.max_document_bytes = max_line_bytes, .max_depth = max_depth}, j)) {
    return refusal{error_line(nullptr, rpc_error::parse_error, "parse error: " + *why)};
  }
  if (j.is_array()) {
    return refusal{error_line(nullptr, rpc_error::invalid_request,
                              "invalid request: JSON-RPC batches are not supported")};
  }
  if (!j.is_object()) {
    return refusal{
        error_line(nullptr, rpc_error::invalid_request, "invalid request: not a JSON object")};
  }
  message m;
  const bool has_id = j.contains("id");
  // An id that cannot be echoed is answered with null (JSON-RPC 2.0, section 5).
  nlohmann::json id = has_id && is_valid_id(j["id"]) ? j["id"] : nlohmann::json(nullptr);
  auto bad = [&](std::string_view why) {
    return refusal{error_line(id, rpc_error::invalid_request,
                              std::string("invalid request: ") + std::string(why))};
  };
  auto v = j.find("jsonrpc");
  if (v == j.end() || !v->is_string() || v->get<std::string>() != "2.0") {
    return bad("\"jsonrpc\" must be \"2.0\"");
  }
  if (has_id && !is_valid_id(j["id"])) return bad("\"id\" must be a string or an integer");
  if (!j.contains("method") && (j.contains("result") || j.contains("error"))) {
    if (!has_id) return bad("a response without \"id\"");
    m.id = id;
    m.is_response = true;
    return m;
  }
  auto method = j.find("method");
  if (method == j.end() || !method->is_string()) return bad("\"method\" must be a string");
  m.method = method->get<std::string>();
  if (auto p = j.find("params"); p != j.end()) {
    if (!p->is_object()) return bad("\"params\" must be an object");
    m.params = *p;
  }
  m.id = id;
  m.is_notification = !has_id;
  return m;
}

std::string result_line(const nlohmann::json& id, nlohmann::json result) {
  return dump({{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}});
}

std::string error_line(const nlohmann::json& id, rpc_error code, std::string_view message) {
  return dump({{"jsonrpc", "2.0"},
               {"id", id},
               {"error", {{"code", static_cast<int>(code)}, {"message", std::string(message)}}}});
}

std::string notification_line(std::string_view method, nlohmann::json params) {
  return dump({{"jsonrpc", "2.0"}, {"method", std::string(method)}, {"params", std::move(params)}});
}

}  // namespace sandbox::mcp
