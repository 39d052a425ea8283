// The MCP tools of `sandboxctl mcp` (src/mcp/tools.hpp): schemas made from the host's
// limits, strict argument decoding, and results mapped onto MCP content (images by their
// magic bytes, other files as links, isError with the stable code first).
#include "mcp/tools.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "protocol/base64url.hpp"

namespace {

using nlohmann::json;
namespace mcp = sandbox::mcp;

sandbox::ticket ticket_with(std::chrono::milliseconds max_timeout, bool execute = true) {
  return sandbox::ticket_issuer{}
      .issue({.id = "t", .tenant = "acme", .execute = execute, .max_timeout = max_timeout})
      .value();
}

sandbox::host_catalog catalog() {
  sandbox::host_catalog c;
  c.levels = {sandbox::isolation::process};
  c.runtimes = {{"python3", "sha256:aa"}, {"node", "sha256:bb"}, {"absent", std::nullopt}};
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

TEST_CASE("mcp tools: run_code's schema carries the host's limits", "[mcp]") {
  sandbox::policy p;
  p.max_source_bytes = 1234;
  p.max_timeout = std::chrono::milliseconds(8000);
  const auto t = ticket_with(std::chrono::milliseconds(3000));
  const auto cat = catalog();
  auto tools = mcp::list_tools({.policy = p, .catalog = cat, .ticket = t});
  const json* run = find_tool(tools, "run_code");
  REQUIRE(run != nullptr);
  const auto& props = (*run)["inputSchema"]["properties"];
  CHECK(props["source"]["maxLength"] == 1234);
  CHECK(props["timeout_ms"]["maximum"] == 3000);               // the ticket's ceiling is lower
  CHECK(props["runtime"]["enum"] == json{"node", "python3"});  // installed ones only
  CHECK((*run)["inputSchema"]["required"] == json{"runtime", "source"});
  CHECK(find_tool(tools, "put_file") != nullptr);
  CHECK(find_tool(tools, "get_file") != nullptr);
  CHECK(find_tool(tools, "run_tool") == nullptr);  // no registered tool

  // A ticket without code.execute gets no run_code.
  const auto no_exec = ticket_with(std::chrono::milliseconds(3000), false);
  auto fewer = mcp::list_tools({.policy = p, .catalog = cat, .ticket = no_exec});
  CHECK(find_tool(fewer, "run_code") == nullptr);
}

TEST_CASE("mcp tools: run_code's arguments are decoded strictly", "[mcp]") {
  sandbox::policy p;
  const auto t = ticket_with(std::chrono::milliseconds(3000));
  const auto cat = catalog();
  auto blobs = sandbox::make_memory_blob_store();
  const mcp::tool_context c{.policy = p, .catalog = cat, .ticket = t};
  auto ok = mcp::decode_run_arguments(
      {{"runtime", "python3"},
       {"source", "print(1)"},
       {"timeout_ms", 500},
       {"files", {{"a.txt", {{"text", "hi"}}}, {"b.bin", {{"base64", "AAH/"}}}}}},
      c, false, *blobs);
  REQUIRE(std::holds_alternative<sandbox::run_request>(ok));
  const auto& req = std::get<sandbox::run_request>(ok);
  CHECK(req.runtime == "python3");
  CHECK(req.timeout == std::chrono::milliseconds(500));
  REQUIRE(req.files_in.size() == 2);
  CHECK(blobs->get("acme", req.files_in[0].blob).value() == "hi");
  CHECK(blobs->get("acme", req.files_in[1].blob).value() == std::string("\0\1\xff", 3));

  auto bad = [&](const json& args) {
    auto r = mcp::decode_run_arguments(args, c, false, *blobs);
    REQUIRE(std::holds_alternative<mcp::bad_arguments>(r));
    return std::get<mcp::bad_arguments>(r).message;
  };
  CHECK(bad({{"source", "x"}}) == "runtime: required");
  // Outside the enum the schema states: refused here, not left to admission.
  CHECK(bad({{"runtime", "absent"}, {"source", "x"}}) ==
        "runtime: not one of the runtimes listed (\"absent\")");
  CHECK(bad({{"runtime", "ruby"}, {"source", "x"}}) ==
        "runtime: not one of the runtimes listed (\"ruby\")");
  CHECK(bad({{"runtime", 3}, {"source", "x"}}) == "runtime: expected a string");
  CHECK(bad({{"runtime", "python3"}, {"source", "x"}, {"timeout_ms", 0}}) ==
        "timeout_ms: must be at least 1");
  CHECK(bad({{"runtime", "python3"}, {"source", "x"}, {"timeout_ms", 3001}}) ==
        "timeout_ms: must be at most 3000");
  CHECK(bad({{"runtime", "python3"}, {"source", "x"}, {"timeout_ms", "5"}}) ==
        "timeout_ms: expected an integer");
  CHECK(bad({{"runtime", "python3"}, {"source", "x"}, {"ticket", "mine"}}) ==
        "ticket: not an argument of this tool");
  CHECK(bad({{"runtime", "python3"}, {"source", "x"}, {"files", {{"a", {{"base64", "!!"}}}}}}) ==
        "files.a.base64: not valid base64");
  CHECK(bad({{"runtime", "python3"}, {"source", "x"}, {"files", {{"a", "text"}}}}) ==
        "files.a: expected one of \"text\", \"base64\", \"blob_id\"");
}

TEST_CASE("mcp tools: run_code offers the granted secrets by name, never a value", "[mcp]") {
  sandbox::policy p;
  const auto t = sandbox::ticket_issuer{}
                     .issue({.id = "t",
                             .tenant = "acme",
                             .execute = true,
                             .max_timeout = std::chrono::milliseconds(3000),
                             .egress = {"api.freight-rates.example"},
                             .secrets = {"rates-api", "granted-only"}},
                            sandbox::network_grant{})
                     .value();
  auto cat = catalog();
  cat.secrets["rates-api"] = {.file = "/etc/agent-sandbox/secrets/rates",
                              .domains = {"api.freight-rates.example"},
                              .header = "Authorization: Bearer {value}"};
  cat.secrets["host-only"] = {.file = "/etc/agent-sandbox/secrets/other",
                              .domains = {"other.example"},
                              .header = "X-Key: {value}"};
  const mcp::tool_context c{.policy = p, .catalog = cat, .ticket = t};
  // Granted and defined: offered. Granted only, or defined only: not.
  CHECK(mcp::offered_secrets(c) == std::vector<std::string>{"rates-api"});
  auto tools = mcp::list_tools(c);
  const json* run = find_tool(tools, "run_code");
  REQUIRE(run != nullptr);
  const auto& secrets = (*run)["inputSchema"]["properties"]["secrets"];
  CHECK(secrets["items"]["enum"] == json{"rates-api"});
  const std::string about = secrets["description"].get<std::string>();
  CHECK(about.find("$SANDBOX_SECRET_RATES_API in the Authorization header to "
                   "api.freight-rates.example") != std::string::npos);
  CHECK(about.find("/etc/agent-sandbox") == std::string::npos);  // no file, no template
  CHECK(about.find("Bearer") == std::string::npos);
  CHECK(about.find("host-only") == std::string::npos);

  auto blobs = sandbox::make_memory_blob_store();
  auto ok = mcp::decode_run_arguments(
      {{"runtime", "python3"}, {"source", "x"}, {"network", true}, {"secrets", {"rates-api"}}}, c,
      false, *blobs);
  REQUIRE(std::holds_alternative<sandbox::run_request>(ok));
  CHECK(std::get<sandbox::run_request>(ok).secrets == std::vector<std::string>{"rates-api"});
  auto bad = [&](const json& secrets, const mcp::tool_context& ctx) {
    auto r = mcp::decode_run_arguments(
        {{"runtime", "python3"}, {"source", "x"}, {"secrets", secrets}}, ctx, false, *blobs);
    REQUIRE(std::holds_alternative<mcp::bad_arguments>(r));
    return std::get<mcp::bad_arguments>(r).message;
  };
  CHECK(bad({"granted-only"}, c) == "secrets: not one of the secrets listed (\"granted-only\")");
  CHECK(bad({"host-only"}, c) == "secrets: not one of the secrets listed (\"host-only\")");
  CHECK(bad("rates-api", c) == "secrets: expected an array of strings");
  CHECK(bad({3}, c) == "secrets: expected an array of strings");
  CHECK(bad({"rates-api", "rates-api"}, c) == "secrets: \"rates-api\" named twice");
  // run_tool takes no secrets.
  auto tool_args =
      mcp::decode_run_arguments({{"tool", "x"}, {"secrets", {"rates-api"}}}, c, true, *blobs);
  REQUIRE(std::holds_alternative<mcp::bad_arguments>(tool_args));
  CHECK(std::get<mcp::bad_arguments>(tool_args).message == "secrets: not an argument of this tool");

  // A ticket that grants none: no property, and the argument is refused.
  const auto plain = ticket_with(std::chrono::milliseconds(3000));
  const mcp::tool_context none{.policy = p, .catalog = cat, .ticket = plain};
  auto fewer = mcp::list_tools(none);
  CHECK_FALSE((*find_tool(fewer, "run_code"))["inputSchema"]["properties"].contains("secrets"));
  CHECK(bad({"rates-api"}, none) == "secrets: not one of the secrets listed (\"rates-api\")");
}

TEST_CASE("mcp tools: base64 round-trips and refuses what is not base64", "[mcp]") {
  for (std::string s : {std::string(), std::string("f"), std::string("fo"), std::string("foo"),
                        std::string("foob"), std::string("\0\xff\x10", 3)}) {
    CHECK(sandbox::detail::base64_decode(sandbox::detail::base64_encode(s)) == s);
  }
  CHECK(sandbox::detail::base64_encode("foobar") == "Zm9vYmFy");
  CHECK(sandbox::detail::base64_encode("fo") == "Zm8=");
  CHECK_FALSE(sandbox::detail::base64_decode("Zm8"));       // no padding
  CHECK_FALSE(sandbox::detail::base64_decode("Z=m8"));      // padding inside
  CHECK_FALSE(sandbox::detail::base64_decode("Zm8=Zm8="));  // padding before the end
  CHECK_FALSE(sandbox::detail::base64_decode("Zm 8"));
}

TEST_CASE("mcp tools: results map onto MCP content", "[mcp]") {
  auto blobs = sandbox::make_memory_blob_store();
  const auto png = png_magic + "rest";
  const auto png_id = blobs->put("acme", png).value();
  const auto csv_id = blobs->put("acme", "a,b\n1,2\n").value();
  const auto jpeg_named_png = blobs->put("acme", std::string("\xff\xd8\xff\xe0rest")).value();
  sandbox::run_result r;
  r.code = sandbox::code::ok;
  r.exit_code = 0;
  r.std_out = {.summary = "42\n", .bytes = 3, .total_bytes = 3};
  r.files_out = {{.name = "chart.png", .blob = png_id, .bytes = png.size()},
                 {.name = "data.csv", .blob = csv_id, .bytes = 8},
                 {.name = "photo.png", .blob = jpeg_named_png, .bytes = 8}};
  auto res = mcp::call_result(r, *blobs, "acme");
  CHECK(res["isError"] == false);
  const auto& content = res["content"];
  REQUIRE(content.size() == 5);
  CHECK(content[0]["type"] == "text");
  CHECK(content[0]["text"].get<std::string>().starts_with("ok\n"));
  CHECK(content[0]["text"].get<std::string>().find("42\n") != std::string::npos);
  CHECK(content[1] == json{{"type", "image"},
                           {"data", sandbox::detail::base64_encode(png)},
                           {"mimeType", "image/png"}});
  CHECK(content[2]["type"] == "resource_link");
  CHECK(content[2]["uri"] == "urn:agent-sandbox:blob:" + csv_id);
  CHECK(content[2]["name"] == "data.csv");
  CHECK(content[3]["mimeType"] == "image/jpeg");  // magic bytes, not the name
  CHECK(content[4]["type"] == "text");            // the result JSON
  CHECK(json::parse(content[4]["text"].get<std::string>())["code"] == "ok");

  // Every other code is an error with the stable code first.
  sandbox::run_result t;
  t.code = sandbox::code::timeout;
  t.message = "killed after 100 ms";
  auto terr = mcp::call_result(t, *blobs, "acme");
  CHECK(terr["isError"] == true);
  CHECK(terr["content"][0]["text"].get<std::string>().starts_with("timeout: killed after"));

  sandbox::run_result a;
  a.code = sandbox::code::approval_required;
  a.approval =
      sandbox::approval_request{.ticket_id = "t", .tenant = "acme", .domains = {"example.com"}};
  auto aerr = mcp::call_result(a, *blobs, "acme");
  CHECK(aerr["isError"] == true);
  const auto text = aerr["content"][0]["text"].get<std::string>();
  CHECK(text.starts_with("approval_required"));
  CHECK(text.find("[example.com]") != std::string::npos);
  CHECK(text.find("never grants") != std::string::npos);
}

TEST_CASE("mcp tools: put_file and get_file keep to the tenant's blobs", "[mcp]") {
  auto blobs = sandbox::make_memory_blob_store();
  auto put = mcp::put_file({{"base64", sandbox::detail::base64_encode(std::string("\0\xff", 2))}},
                           *blobs, "acme", 1024);
  REQUIRE(std::holds_alternative<json>(put));
  const auto id = std::get<json>(put)["content"][0]["text"].get<std::string>();
  CHECK(id.starts_with("sha256:"));
  auto got = mcp::get_file({{"blob_id", "urn:agent-sandbox:blob:" + id}}, *blobs, "acme");
  REQUIRE(std::holds_alternative<json>(got));
  const auto& item = std::get<json>(got)["content"][0];
  CHECK(item["type"] == "resource");
  CHECK(sandbox::detail::base64_decode(item["resource"]["blob"].get<std::string>()) ==
        std::string("\0\xff", 2));
  // Another tenant's id is not found; a bad argument is refused.
  auto other = mcp::get_file({{"blob_id", id}}, *blobs, "other");
  REQUIRE(std::holds_alternative<json>(other));
  CHECK(std::get<json>(other)["isError"] == true);
  CHECK(
      std::get<json>(other)["content"][0]["text"].get<std::string>().starts_with("blob_not_found"));
  CHECK(std::holds_alternative<mcp::bad_arguments>(
      mcp::put_file({{"text", "a"}, {"base64", "YQ=="}}, *blobs, "acme", 1024)));
  auto big = mcp::put_file({{"text", std::string(2000, 'x')}}, *blobs, "acme", 1024);
  REQUIRE(std::holds_alternative<json>(big));
  CHECK(std::get<json>(big)["isError"] == true);
}

TEST_CASE("mcp tools: images past the inline caps become links", "[mcp]") {
  auto blobs = sandbox::make_memory_blob_store(1ULL << 30);
  sandbox::run_result r;
  r.code = sandbox::code::ok;
  // One image over the per-image cap, then five of 4 MiB: four fit in the 16 MiB total.
  const auto big = png_magic + std::string(mcp::max_inline_image_bytes, 'x');
  r.files_out.push_back(
      {.name = "big.png", .blob = blobs->put("acme", big).value(), .bytes = big.size()});
  for (int i = 0; i < 5; ++i) {
    const auto img = png_magic + std::string(mcp::max_inline_image_bytes - png_magic.size() - 8,
                                             static_cast<char>('a' + i));
    r.files_out.push_back({.name = std::to_string(i) + ".png",
                           .blob = blobs->put("acme", img).value(),
                           .bytes = img.size()});
  }
  auto res = mcp::call_result(r, *blobs, "acme");
  std::vector<std::string> kinds;
  for (const auto& c : res["content"]) kinds.push_back(c["type"].get<std::string>());
  CHECK(kinds == std::vector<std::string>{"text", "resource_link", "image", "image", "image",
                                          "image", "resource_link", "text"});
}
