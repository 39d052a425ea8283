// The JSON-RPC framing of `sandboxctl mcp` (src/mcp/jsonrpc.hpp): every hostile line gets a
// proper error response, with the id when it can be read and null otherwise.
#include "mcp/jsonrpc.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace {

using nlohmann::json;
using sandbox::mcp::message;
using sandbox::mcp::parse_line;
using sandbox::mcp::refusal;

// The error response a line is refused with, parsed.
json refused(std::string_view line) {
  auto r = parse_line(line);
  REQUIRE(std::holds_alternative<refusal>(r));
  return json::parse(std::get<refusal>(r).line);
}

}  // namespace

TEST_CASE("mcp jsonrpc: a request is parsed with its id, method and params", "[mcp]") {
  auto r = parse_line(R"({"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"a":1}})");
  REQUIRE(std::holds_alternative<message>(r));
  const auto& m = std::get<message>(r);
  CHECK(m.id == 7);
  CHECK(m.method == "tools/list");
  CHECK(m.params == json{{"a", 1}});
  CHECK_FALSE(m.is_notification);
  CHECK_FALSE(m.is_response);

  auto s = parse_line(R"({"jsonrpc":"2.0","id":"x","method":"ping"})");
  REQUIRE(std::holds_alternative<message>(s));
  CHECK(std::get<message>(s).id == "x");
  CHECK(std::get<message>(s).params == json::object());

  auto n = parse_line(R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  REQUIRE(std::holds_alternative<message>(n));
  CHECK(std::get<message>(n).is_notification);

  auto resp = parse_line(R"({"jsonrpc":"2.0","id":3,"result":{}})");
  REQUIRE(std::holds_alternative<message>(resp));
  CHECK(std::get<message>(resp).is_response);
}

TEST_CASE("mcp jsonrpc: hostile lines are refused with the right code and id", "[mcp]") {
  // Not JSON at all, truncated, binary: parse error, id null.
  for (std::string_view line : {std::string_view("garbage"), std::string_view("{\"jsonrpc\":"),
                                std::string_view("\x00\xff\xfe", 3), std::string_view("")}) {
    auto e = refused(line);
    CHECK(e["jsonrpc"] == "2.0");
    CHECK(e["id"].is_null());
    CHECK(e["error"]["code"] == -32700);
  }
  // A batch (removed from MCP in 2025-06-18) and non-objects: invalid request, id null.
  for (std::string_view line :
       {"[]", R"([{"jsonrpc":"2.0","id":1,"method":"ping"}])", "42", "\"ping\"", "null", "true"}) {
    auto e = refused(line);
    CHECK(e["id"].is_null());
    CHECK(e["error"]["code"] == -32600);
  }
  // Readable id: echoed.
  auto wrong_version = refused(R"({"jsonrpc":"1.0","id":5,"method":"ping"})");
  CHECK(wrong_version["id"] == 5);
  CHECK(wrong_version["error"]["code"] == -32600);
  auto no_version = refused(R"({"id":"a","method":"ping"})");
  CHECK(no_version["id"] == "a");
  auto bad_method = refused(R"({"jsonrpc":"2.0","id":6,"method":12})");
  CHECK(bad_method["id"] == 6);
  CHECK(bad_method["error"]["code"] == -32600);
  auto bad_params = refused(R"({"jsonrpc":"2.0","id":8,"method":"ping","params":[1]})");
  CHECK(bad_params["id"] == 8);
  CHECK(bad_params["error"]["code"] == -32600);
  // An id that is neither a string nor an integer cannot be echoed: null.
  for (std::string_view line : {R"({"jsonrpc":"2.0","id":{"x":1},"method":"ping"})",
                                R"({"jsonrpc":"2.0","id":1.5,"method":"ping"})",
                                R"({"jsonrpc":"2.0","id":[1],"method":"ping"})"}) {
    auto e = refused(line);
    CHECK(e["id"].is_null());
    CHECK(e["error"]["code"] == -32600);
  }
}

TEST_CASE("mcp jsonrpc: deep nesting and invalid UTF-8 never crash the framing", "[mcp]") {
  std::string deep(100000, '[');
  auto e = refused(deep);
  CHECK(e["id"].is_null());
  CHECK(e["error"]["code"] == -32700);
  CHECK(e["error"]["message"] == "parse error: nested deeper than 64");
  // 64 levels are fine; brackets inside strings (escaped quotes too) do not count.
  std::string ok = R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":)" +
                   std::string(62, '[') + std::string(62, ']') + "}}";
  CHECK(std::holds_alternative<message>(parse_line(ok)));
  std::string quoted = R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":"\")" +
                       std::string(1000, '[') + R"(\""}})";
  CHECK(std::holds_alternative<message>(parse_line(quoted)));
  // Invalid UTF-8 inside a string: a parse error.
  auto u = refused("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}");
  CHECK(u["error"]["code"] == -32700);
  // What the daemon's strict reader refuses, MCP refuses too (no parser differential with
  // a proxy that reads the first key and not the last): duplicate keys at any depth, a byte
  // order mark, comments, trailing content.
  for (std::string_view dup : {
           R"({"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"})",
           R"({"jsonrpc":"2.0","id":1,"id":2,"method":"ping"})",
           R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code",)"
           R"("arguments":{"source":"1","source":"2"}}})",
           "\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}",
           R"({"jsonrpc":"2.0","id":1,"method":"ping"} /* c */)",
           R"({"jsonrpc":"2.0","id":1,"method":"ping"} {})",
       }) {
    auto d = refused(dup);
    CHECK(d["id"].is_null());
    CHECK(d["error"]["code"] == -32700);
  }
  CHECK(refused(R"({"jsonrpc":"2.0","id":1,"method":"ping","method":"x"})")["error"]["message"]
            .get<std::string>()
            .find("duplicate") != std::string::npos);
  // A method name with invalid bytes echoed in an error stays valid JSON.
  auto line = sandbox::mcp::error_line(1, sandbox::mcp::rpc_error::method_not_found,
                                       "method not found: \xff\xfe");
  CHECK_NOTHROW(json::parse(line));
}

TEST_CASE("mcp jsonrpc: responses are one line of JSON-RPC 2.0", "[mcp]") {
  auto r = sandbox::mcp::result_line("q", json{{"tools", json::array()}});
  CHECK(r.find('\n') == std::string::npos);
  CHECK(json::parse(r) ==
        json{{"jsonrpc", "2.0"}, {"id", "q"}, {"result", {{"tools", json::array()}}}});
  auto e = json::parse(
      sandbox::mcp::error_line(nullptr, sandbox::mcp::rpc_error::invalid_params, "why\nnot"));
  CHECK(e["error"]["code"] == -32602);
  CHECK(e["error"]["message"] == "why\nnot");
}
