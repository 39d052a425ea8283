// `run_cell` of `sandboxctl mcp` (src/mcp/tools.hpp): its schema made from the host's limits
// and its Python runtimes, its arguments decoded strictly, and a cell's result mapped onto
// MCP content (the code and state first, whether the session is fresh, the value, figures as
// images, other outputs as links, isError for every code but ok).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "mcp/tools.hpp"
#include "protocol/base64url.hpp"

namespace {

using nlohmann::json;
namespace mcp = sandbox::mcp;
using namespace std::chrono_literals;

sandbox::ticket ticket_with(std::chrono::milliseconds max_timeout, bool execute = true) {
  return sandbox::ticket_issuer{}
      .issue({.id = "t", .tenant = "acme", .execute = execute, .max_timeout = max_timeout})
      .value();
}

sandbox::host_catalog catalog() {
  sandbox::host_catalog c;
  c.levels = {sandbox::isolation::process};
  c.runtimes = {{"python3", "sha256:aa"},
                {"python3-data", "sha256:cc"},
                {"python3-absent", std::nullopt},
                {"node", "sha256:bb"}};
  return c;
}

const json* find_tool(const json& tools, std::string_view name) {
  for (const auto& t : tools) {
    if (t["name"] == name) return &t;
  }
  return nullptr;
}

const std::string png_magic("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);

}  // namespace

TEST_CASE("mcp run_cell: the schema carries the limits and only installed Python runtimes",
          "[mcp]") {
  sandbox::policy p;
  p.max_source_bytes = 999;
  p.max_timeout = 8000ms;
  const auto t = ticket_with(3000ms);
  const auto cat = catalog();
  const mcp::tool_context c{.policy = p,
                            .catalog = cat,
                            .ticket = t,
                            .python_runtimes = {"python3-data", "python3", "python3-absent"}};
  auto tools = mcp::list_tools(c);
  const json* cell = find_tool(tools, "run_cell");
  REQUIRE(cell != nullptr);
  const auto& schema = (*cell)["inputSchema"];
  const auto& props = schema["properties"];
  CHECK(props["code"]["maxLength"] == 999);
  CHECK(props["timeout_ms"]["maximum"] == 3000);  // the ticket's ceiling is lower
  CHECK(props["timeout_ms"]["minimum"] == 1);
  CHECK(props["runtime"]["enum"] == json{"python3", "python3-data"});  // node: not Python
  CHECK(props["runtime"]["default"] == "python3");
  CHECK(props["reset"]["type"] == "boolean");
  CHECK_FALSE(props.contains("memory_bytes"));
  CHECK(schema["required"] == json{"code"});
  CHECK(schema["additionalProperties"] == false);
  CHECK(mcp::default_cell_runtime(c) == "python3");

  // Without python3, the first one offered is the default.
  const mcp::tool_context data_only{
      .policy = p, .catalog = cat, .ticket = t, .python_runtimes = {"python3-data"}};
  CHECK(mcp::default_cell_runtime(data_only) == "python3-data");

  // No installed Python runtime, or no code.execute: no run_cell.
  const mcp::tool_context none{
      .policy = p, .catalog = cat, .ticket = t, .python_runtimes = {"python3-absent"}};
  CHECK(find_tool(mcp::list_tools(none), "run_cell") == nullptr);
  CHECK(mcp::default_cell_runtime(none).empty());
  const auto no_exec = ticket_with(3000ms, false);
  const mcp::tool_context denied{
      .policy = p, .catalog = cat, .ticket = no_exec, .python_runtimes = {"python3"}};
  CHECK(find_tool(mcp::list_tools(denied), "run_cell") == nullptr);
}

TEST_CASE("mcp run_cell: arguments are decoded strictly", "[mcp]") {
  sandbox::policy p;
  p.max_source_bytes = 16;
  const auto t = ticket_with(3000ms);
  const auto cat = catalog();
  const mcp::tool_context c{
      .policy = p, .catalog = cat, .ticket = t, .python_runtimes = {"python3", "python3-data"}};
  auto ok = mcp::decode_cell_arguments(
      {{"code", "x = 1"}, {"timeout_ms", 500}, {"runtime", "python3-data"}, {"reset", true}}, c);
  REQUIRE(std::holds_alternative<mcp::cell_arguments>(ok));
  CHECK(std::get<mcp::cell_arguments>(ok) ==
        mcp::cell_arguments{
            .code = "x = 1", .timeout = 500ms, .runtime = "python3-data", .reset = true});
  auto plain = mcp::decode_cell_arguments({{"code", ""}}, c);
  REQUIRE(std::holds_alternative<mcp::cell_arguments>(plain));
  CHECK(std::get<mcp::cell_arguments>(plain) == mcp::cell_arguments{.code = ""});

  for (const auto& [args, names] : std::vector<std::pair<json, std::string>>{
           {json::object(), "code: required"},
           {{{"code", 5}}, "code: expected a string"},
           {{{"code", std::string(17, 'x')}}, "code: longer than 16 bytes"},
           {{{"code", "1"}, {"timeout_ms", 0}}, "timeout_ms: must be at least 1"},
           {{{"code", "1"}, {"timeout_ms", 3001}}, "timeout_ms: must be at most 3000"},
           {{{"code", "1"}, {"timeout_ms", "5"}}, "timeout_ms: expected an integer"},
           {{{"code", "1"}, {"runtime", "node"}}, "runtime: not one of the Python runtimes"},
           {{{"code", "1"}, {"runtime", "python3-absent"}}, "runtime: not one of the Python"},
           {{{"code", "1"}, {"reset", "yes"}}, "reset: expected a boolean"},
           {{{"code", "1"}, {"ticket", "mine"}}, "ticket: not an argument of this tool"},
           {{{"code", "1"}, {"memory_bytes", 1}}, "memory_bytes: not an argument"},
       }) {
    auto bad = mcp::decode_cell_arguments(args, c);
    INFO(args.dump());
    REQUIRE(std::holds_alternative<mcp::bad_arguments>(bad));
    CHECK(std::get<mcp::bad_arguments>(bad).message.starts_with(names));
  }
}

TEST_CASE("mcp run_cell: a cell's result maps onto MCP content", "[mcp]") {
  auto blobs = sandbox::make_memory_blob_store();
  const auto png = png_magic + "figure";
  const auto png_id = blobs->put("acme", png).value();
  const auto html_id = blobs->put("acme", "<b>hi</b>").value();
  const auto svg_id = blobs->put("acme", "<svg/>").value();
  const auto csv_id = blobs->put("acme", "a,b\n").value();

  sandbox::cell_result r;
  r.code = sandbox::code::ok;
  r.state = sandbox::interpreter_state::kept;
  r.value = "42";
  r.std_out = {.summary = "hi\n", .bytes = 3, .total_bytes = 3};
  r.usage.wall = 12ms;
  r.outputs = {{.mime_type = "image/png", .blob = png_id, .bytes = png.size()},
               {.mime_type = "text/html", .blob = html_id, .bytes = 9},
               {.mime_type = "image/png\n\"evil", .blob = svg_id, .bytes = 6}};
  r.files_out = {{.name = "data.csv", .blob = csv_id, .bytes = 4}};
  auto res = mcp::cell_call_result(r, {.runtime = "python3", .cell = 2}, *blobs, "acme");
  CHECK(res["isError"] == false);
  const auto& content = res["content"];
  REQUIRE(content.size() == 6);
  const auto text = content[0]["text"].get<std::string>();
  CHECK(text.starts_with("ok\nstate: kept\nsession: python3, cell 2\nwall 12 ms\n"));
  CHECK(text.find("--- value ---\n42\n") != std::string::npos);
  CHECK(text.find("--- stdout (3 bytes) ---\nhi\n") != std::string::npos);
  CHECK(content[1] == json{{"type", "image"},
                           {"data", sandbox::detail::base64_encode(png)},
                           {"mimeType", "image/png"}});
  CHECK(content[2]["type"] == "resource_link");
  CHECK(content[2]["uri"] == "urn:agent-sandbox:blob:" + html_id);
  CHECK(content[2]["mimeType"] == "text/html");
  // A claimed image that is not one is a link; a MIME type that is not a plain one is left out.
  CHECK(content[3]["type"] == "resource_link");
  CHECK_FALSE(content[3].contains("mimeType"));
  CHECK(content[4]["name"] == "data.csv");
  const auto encoded = json::parse(content[5]["text"].get<std::string>());
  CHECK(encoded["value"] == "42");
  CHECK(encoded["state"] == "kept");

  // A fresh session says so, and why the previous one is gone; an exception is an error
  // with its summary.
  sandbox::cell_result e;
  e.code = sandbox::code::error;
  e.state = sandbox::interpreter_state::kept;
  e.message = "the cell raised an exception";
  e.error = "ZeroDivisionError: division by zero";
  auto eres = mcp::cell_call_result(
      e,
      {.runtime = "python3",
       .cell = 1,
       .fresh = true,
       .previous_ended = "the previous session ended when a cell lost its state (ok)",
       .cancelled_before = "it was cancelled: internal (state kept)"},
      *blobs, "acme");
  CHECK(eres["isError"] == true);
  const auto etext = eres["content"][0]["text"].get<std::string>();
  CHECK(etext.starts_with("error: the cell raised an exception\nstate: kept\n"));
  CHECK(etext.find("previous call: it was cancelled: internal (state kept)\n") !=
        std::string::npos);
  CHECK(etext.find("session: fresh (python3): the previous session ended when a cell lost its "
                   "state (ok)\n") != std::string::npos);
  CHECK(etext.find("--- error ---\nZeroDivisionError: division by zero\n") != std::string::npos);

  // The interpreter exited: ok, but the state is lost and the text says the session is over.
  sandbox::cell_result x;
  x.code = sandbox::code::ok;
  x.state = sandbox::interpreter_state::lost;
  x.session_ended = true;
  x.exit_code = 3;
  x.message = "the interpreter exited; its state is lost";
  auto xres = mcp::cell_call_result(x, {.runtime = "python3", .cell = 4}, *blobs, "acme");
  CHECK(xres["isError"] == false);
  const auto xtext = xres["content"][0]["text"].get<std::string>();
  CHECK(xtext.find("state: lost (the interpreter session is over") != std::string::npos);
  CHECK(xtext.find("next run_cell starts a fresh session") != std::string::npos);
  CHECK(xtext.find("exit code: 3\n") != std::string::npos);

  // Every code but ok is an error with the stable code first.
  for (auto c : {sandbox::code::timeout, sandbox::code::oom, sandbox::code::internal,
                 sandbox::code::source_too_large, sandbox::code::seccomp_violation}) {
    sandbox::cell_result f;
    f.code = c;
    auto fres = mcp::cell_call_result(f, {.runtime = "python3", .cell = 1}, *blobs, "acme");
    CHECK(fres["isError"] == true);
    CHECK(fres["content"][0]["text"].get<std::string>().starts_with(
        std::string(sandbox::to_string(c))));
  }
}
