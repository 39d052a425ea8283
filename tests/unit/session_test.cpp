// Sessions' admission (src/core/session.cpp) without processes: the registry, the ticket and
// the host decide before any backend is asked; and the npm package pins of image builds.
#include "sandbox/session.hpp"

#include <algorithm>
#include <functional>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include "core/image_build.hpp"
#include "sandbox/testing/fake_backend.hpp"
#include "unit/runtime_test_support.hpp"

namespace asio = boost::asio;
using sandbox::code;
using sandbox::tool_entry;

namespace {

sandbox::tool_entry entry(std::string name) {
  return {.name = std::move(name),
          .image = "python3",
          .image_digest = std::nullopt,
          .binary = "/bin/cat",
          .args = {},
          .input = sandbox::tool_input::stdin_bytes,
          .isolation = sandbox::isolation::process,
          .profile = {},
          .egress = {},
          .env = {}};
}

sandbox::runtime_options options() {
  sandbox::runtime_options o;
  o.blobs = sandbox::make_memory_blob_store();
  o.fixed_digests = {{"python3", sandbox::testing::fake_digest("python3")}};
  o.process_backend = false;
  o.log = [](sandbox::log_level, std::string_view) {};
  o.fixed_digests["tools"] = sandbox::testing::fake_digest("tools");
  // The one registry (runtime_options::tools): faulty entries never get this far (runtime
  // creation refuses them: see "a faulty registry" below).
  o.tools = {entry("cat")};
  auto egress = entry("fetcher");
  egress.egress = {"API.Example.com.", "*.example.org"};
  o.tools.push_back(egress);
  auto gv = entry("strong");
  gv.isolation = sandbox::isolation::gvisor;
  o.tools.push_back(gv);
  return o;
}

// Opens on a runtime whose executor is `io` (run here, after the call: a completion
// inside the call would be seen).
sandbox::session_start open(asio::io_context& io, sandbox::runtime& rt,
                            sandbox::session_request req, const sandbox::ticket& t) {
  std::optional<sandbox::session_start> got;
  rt.async_open_session(std::move(req), t,
                        [&](boost::system::error_code ec, sandbox::session_start s) {
                          CHECK(!ec);
                          got = std::move(s);
                        });
  CHECK(!got.has_value());  // never completes inside the call
  io.restart();
  for (int i = 0; i < 1000 && !got; ++i) io.run_one_for(std::chrono::milliseconds(100));
  REQUIRE(got.has_value());
  return *got;
}

/// A ticket granting tool.run for `tools` (and code.execute only when `execute`).
sandbox::ticket tool_ticket(std::vector<std::string> tools = {"*"}, bool execute = false) {
  sandbox::ticket_spec spec;
  spec.id = "t-tools";
  spec.tenant = "acme";
  spec.execute = execute;
  spec.tools = std::move(tools);
  auto t = sandbox::ticket_issuer{}.issue(spec);
  REQUIRE(t.has_value());
  return *t;
}

}  // namespace

TEST_CASE("session admission: the request names an entry, nothing else", "[session]") {
  asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), options());
  REQUIRE(rt.has_value());
  auto t = tool_ticket();

  auto unknown = open(io, *rt, {.tool = "/bin/sh"}, t);
  CHECK(unknown.code == code::invalid_request);
  CHECK(unknown.message == "tool: no registered tool named '/bin/sh'");
  CHECK(!unknown.session);

  auto zero = open(io, *rt, {.tool = "cat", .max_lifetime = std::chrono::milliseconds(0)}, t);
  CHECK(zero.code == code::invalid_request);
  CHECK(zero.message.find("max_lifetime") != std::string::npos);
  auto neg = open(
      io, *rt,
      {.tool = "cat", .max_lifetime = std::nullopt, .idle_timeout = std::chrono::milliseconds(-5)},
      t);
  CHECK(neg.code == code::invalid_request);
  CHECK(neg.message.find("idle_timeout") != std::string::npos);

}

TEST_CASE("session registry: faulty entries refuse runtime creation, naming the field",
          "[session]") {
  struct faulty {
    const char* what;
    std::function<void(tool_entry&)> spoil;
    const char* logged;
  };
  const std::vector<faulty> cases{
      {"relative binary", [](tool_entry& e) { e.binary = "bin/cat"; }, "tools[1].binary: "},
      {"dots", [](tool_entry& e) { e.binary = "/usr/../bin/cat"; }, "tools[1].binary: "},
      {"bad egress", [](tool_entry& e) { e.egress = {"api.example.com", "not a host!"}; },
       "tools[1].egress[1]: not a host name"},
      {"loader variable", [](tool_entry& e) { e.env = {{"LD_PRELOAD", "/tmp/x.so"}}; },
       "tools[1].env['LD_PRELOAD']"}};
  for (const auto& c : cases) {
    INFO(c.what);
    auto o = options();
    std::vector<std::string> logged;
    o.log = [&](sandbox::log_level, std::string_view l) { logged.emplace_back(l); };
    auto bad = entry("bad");
    c.spoil(bad);
    o.tools = {entry("cat"), bad};
    asio::io_context io;
    auto rt = sandbox::runtime::create(io.get_executor(), o);
    CHECK_FALSE(rt.has_value());
    CHECK(std::any_of(logged.begin(), logged.end(), [&](const std::string& l) {
      return l.find(c.logged) != std::string::npos;
    }));
  }
}

TEST_CASE("session registry: an entry's egress is kept canonical and needs container",
          "[session]") {
  asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), options());
  REQUIRE(rt.has_value());
  const auto cat = rt->catalog();
  REQUIRE(cat.tools.count("fetcher") == 1);
  CHECK(cat.tools.at("fetcher").entry.egress ==
        std::vector<std::string>{"api.example.com", "*.example.org"});
  // Only a process-level backend: the entry with egress is never run there.
  rt->add_backend(std::make_shared<sandbox::testing::fake_backend>(sandbox::isolation::process));
  auto net = open(io, *rt, {.tool = "fetcher"}, tool_ticket());
  CHECK(net.code == code::runtime_unavailable);
  CHECK(net.message.find("'container'") != std::string::npos);
}

TEST_CASE("session admission: the ticket decides whether, the host where", "[session]") {
  asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), options());
  REQUIRE(rt.has_value());

  // code.execute is not enough: a session is a registered tool's, granted by name.
  auto exec_only = sandbox::test::make_ticket();
  auto denied = open(io, *rt, {.tool = "cat"}, exec_only);
  CHECK(denied.code == code::action_denied);
  CHECK(denied.message == "tool: ticket does not grant tool.run for 'cat'");
  auto other = open(io, *rt, {.tool = "cat"}, tool_ticket({"markdown"}));
  CHECK(other.code == code::action_denied);

  sandbox::ticket_spec old;
  old.id = "t-old";
  old.tenant = "acme";
  old.tools = {"*"};
  old.expires_at = std::chrono::system_clock::now() - std::chrono::hours(1);
  auto expired = open(io, *rt, {.tool = "cat"}, sandbox::ticket_issuer{}.issue(old).value());
  CHECK(expired.code == code::action_denied);
  CHECK(expired.message == "ticket expired");

  // No backend registered at all: never a weaker level, never silently.
  auto t = tool_ticket({"cat", "strong"});
  auto none = open(io, *rt, {.tool = "cat"}, t);
  CHECK(none.code == code::runtime_unavailable);

  // A level that exists, whose backend keeps no sessions (the fake): refused, nothing
  // started.
  rt->add_backend(std::make_shared<sandbox::testing::fake_backend>(sandbox::isolation::gvisor));
  auto strong = open(io, *rt, {.tool = "strong"}, t);
  CHECK(strong.code == code::runtime_unavailable);
  CHECK(!strong.session);
}

TEST_CASE("image build: npm packages must be pinned to one exact version", "[session][image]") {
  using sandbox::detail::is_pinned_npm_package;
  CHECK(is_pinned_npm_package("@modelcontextprotocol/server-everything@2025.9.25"));
  CHECK(is_pinned_npm_package("left-pad@1.3.0"));
  CHECK(is_pinned_npm_package("pkg@1.0.0-beta.2"));
  for (const char* bad :
       {"left-pad", "left-pad@^1.3.0", "left-pad@latest", "left-pad@1.3", "left-pad@>=1.0.0",
        "@scope@1.0.0", "@scope/@1.0.0", "git+https://x/y@1.0.0", "../evil@1.0.0", "./x@1.0.0",
        "Left-Pad@1.0.0", "left pad@1.0.0", "x@1.0.0-", "x@1..0", "--registry=http://evil@1.0.0",
        "a@1.0.0 b@2.0.0"}) {
    INFO(bad);
    CHECK(!is_pinned_npm_package(bad));
  }
}
