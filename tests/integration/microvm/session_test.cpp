// Sessions at the microvm level: a long-lived server in its own VM, its stdin carried as
// sandbox-init's control-stream frames (relayed unchanged by the guest agent, under the
// credit window), its stdout streamed from the guest; closing kills the VM.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "integration/common/mcp_exchange.hpp"
#include "integration/microvm/microvm_harness.hpp"

using sandbox::code;
using sandbox::session_end;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

sandbox::tool_entry entry(std::string name, std::string image, std::string binary,
                          std::vector<std::string> args) {
  return {.name = std::move(name),
          .image = std::move(image),
          .image_digest = std::nullopt,
          .binary = std::move(binary),
          .args = std::move(args),
          .input = sandbox::tool_input::stdin_bytes,
          .isolation = sandbox::isolation::microvm,
          .profile = {},
          .egress = {},
          .env = {}};
}

// A runtime of its own with the servers these tests start registered at the microvm level.
struct session_runtime : mvtest::private_runtime {
  session_runtime()
      : private_runtime([](sandbox::runtime_options& o) {
          // No byte moves while the server starts (Node under emulation: minutes on a loaded
          // host), so the idle timeout is at least the calibrated must-finish deadline.
          o.sessions.idle_timeout =
              std::max<std::chrono::milliseconds>(120s, mvtest::must_finish());
          o.tools = {
              entry("cat", "python3", "/bin/cat", {}),
              entry("mcp-everything", "mcp", "/usr/bin/node",
                    {"/opt/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
                     "stdio"}),
          };
        }) {}
};

session_runtime& fixture() {
  static session_runtime s;
  return s;
}

bool available() { return fixture().available(); }

// Live VMMs of this fixture's runtime.
int vmms() { return static_cast<int>(mvtest::vmm_pids(fixture().state()).size()); }

sandbox::ticket tool_ticket() {
  return sandbox::ticket_issuer{}
      .issue({.id = "mvtest-tools",
              .tenant = "mvtest",
              .execute = false,
              .isolation = sandbox::isolation::microvm,
              .max_timeout = 600000ms,  // the sessions' lifetime ceiling
              .max_memory_bytes = 1ULL << 30,
              .tools = {"*"}})
      .value();
}

sandbox::session_start open(const std::string& tool) {
  return fixture().rt->async_open_session({.tool = tool}, tool_ticket(), asio::use_future).get();
}

// One read; the error (eof at the end) and the bytes.
std::pair<boost::system::error_code, std::string> read_some(sandbox::session& s) {
  std::vector<char> buf(65536);
  std::promise<std::pair<boost::system::error_code, std::size_t>> p;
  s.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
    p.set_value({ec, n});
  });
  auto [ec, n] = p.get_future().get();
  return {ec, std::string(buf.data(), n)};
}

}  // namespace

TEST_CASE("microvm: a session's stdio is byte-exact both ways; closing ends the VM",
          "[microvm][session]") {
  if (!available()) return;
  auto st = open("cat");
  INFO("open: " << to_string(st.code) << " " << st.message);
  REQUIRE(st.code == code::ok);
  CHECK(vmms() == 1);  // the session's own VM
  auto s = st.session;
  // Every byte value, NULs, more than the host's buffer and the 64 KiB credit window.
  std::string data(512 * 1024 + 3, '\0');
  std::mt19937 gen(11);
  for (auto& c : data) c = static_cast<char>(gen() & 0xff);
  for (std::size_t i = 0; i < data.size(); i += 509) data[i] = '\0';
  std::promise<std::pair<boost::system::error_code, std::size_t>> wrote;
  s->async_write(asio::buffer(data), [&](boost::system::error_code ec, std::size_t n) {
    wrote.set_value({ec, n});
  });
  std::thread closer([&] {
    auto [ec, n] = wrote.get_future().get();
    CHECK(!ec);
    CHECK(n == data.size());
    s->close_stdin();
  });
  std::string echo;
  boost::system::error_code ec;
  while (!ec && echo.size() <= data.size()) {
    auto [e, bytes] = read_some(*s);
    ec = e;
    echo += bytes;
  }
  closer.join();
  CHECK(ec == asio::error::eof);
  REQUIRE(echo.size() == data.size());
  CHECK(echo == data);
  auto r = s->async_close(asio::use_future).get();
  CHECK(r.result.isolation == sandbox::isolation::microvm);
  CHECK((r.end == session_end::server_exited || r.end == session_end::closed));
  CHECK(r.result.code == code::ok);
  CHECK(r.bytes_to_server == data.size());
  CHECK(r.bytes_from_server == data.size());
  s.reset();
  st.session.reset();
  // The VM is gone with the session (killed and confirmed before the close completes).
  CHECK(vmms() == 0);
}

TEST_CASE("microvm: MCP initialize, tools/list and a tool call over a session",
          "[microvm][session][mcp]") {
  if (!available()) return;
  auto st = open("mcp-everything");
  if (st.code == code::runtime_unavailable &&
      st.message.find("not installed") != std::string::npos) {
    if (mvtest::must_work()) FAIL("the mcp image is not installed (tools/setup.sh builds it)");
    WARN("mcp image not installed: skipped (" << st.message << ")");
    return;
  }
  INFO("open: " << to_string(st.code) << " " << st.message);
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  mcptest::initialize_list_and_call(*s, "hi from the microvm");
  auto r = s->async_close(asio::use_future).get();
  CHECK(r.result.isolation == sandbox::isolation::microvm);
  CHECK(r.end == session_end::closed);
  CHECK(r.result.code == code::ok);
}
