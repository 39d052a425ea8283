// A real MCP client's first exchange with a stdio server in a session (shared by the levels'
// session tests): `initialize`, `notifications/initialized`, `tools/list`, and a `tools/call`
// of the server's `echo` tool, each response checked. The server is the reference MCP
// "everything" server (the "mcp" image, tools/setup.sh).
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sandbox/sandbox.hpp"

namespace mcptest {

/// Reads newline-delimited JSON-RPC messages until the response with `id`; returns it.
/// `pending` keeps what was read past it.
inline nlohmann::json read_response(sandbox::session& s, std::string& pending, int id) {
  std::vector<char> buf(65536);
  for (int guard = 0; guard < 10000; ++guard) {
    for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
      auto msg = nlohmann::json::parse(pending.substr(0, nl), nullptr, false);
      pending.erase(0, nl + 1);
      REQUIRE(!msg.is_discarded());
      if (msg.contains("id") && msg["id"] == id) return msg;
    }
    std::promise<std::pair<boost::system::error_code, std::size_t>> p;
    s.async_read_some(boost::asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
      p.set_value({ec, n});
    });
    auto [ec, n] = p.get_future().get();
    REQUIRE(!ec);
    pending.append(buf.data(), n);
  }
  FAIL("no response with id " << id);
  return {};
}

/// Writes `line` and a newline, all of it.
inline void write_line(sandbox::session& s, const std::string& line) {
  const std::string data = line + "\n";
  REQUIRE(s.async_write(boost::asio::buffer(data), boost::asio::use_future).get() == data.size());
}

/// The exchange; `message` is what the echo tool is asked to return.
inline void initialize_list_and_call(sandbox::session& s, const std::string& message) {
  std::string pending;
  write_line(
      s,
      R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"agent-sandbox-test","version":"1"}}})");
  auto init = read_response(s, pending, 1);
  REQUIRE(init.contains("result"));
  CHECK(init["result"]["protocolVersion"] == "2024-11-05");
  CHECK(init["result"]["serverInfo"]["name"] == "example-servers/everything");
  write_line(s, R"({"jsonrpc":"2.0","method":"notifications/initialized"})");
  write_line(s, R"({"jsonrpc":"2.0","id":2,"method":"tools/list"})");
  auto list = read_response(s, pending, 2);
  REQUIRE(list.contains("result"));
  bool has_echo = false;
  for (const auto& t : list["result"]["tools"]) has_echo |= t["name"] == "echo";
  CHECK(has_echo);
  nlohmann::json call = {{"jsonrpc", "2.0"},
                         {"id", 3},
                         {"method", "tools/call"},
                         {"params", {{"name", "echo"}, {"arguments", {{"message", message}}}}}};
  write_line(s, call.dump());
  auto answer = read_response(s, pending, 3);
  CHECK(answer.dump().find(message) != std::string::npos);
}

}  // namespace mcptest
