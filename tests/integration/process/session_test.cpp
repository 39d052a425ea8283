// Sessions (sandbox/session.hpp) at the process level: long-lived servers with live stdio.
// Each case drives a real server in a real sandbox and then checks that nothing of it is
// left on the host. The same checks at the container and gvisor levels:
// tests/integration/oci/session_test.cpp.
#include "integration/common/session_support.hpp"

using namespace sessiontest;

bool sessiontest::fixture_enables_oci_levels() { return false; }

TEST_CASE("session: MCP initialize and tools/list over stdio (process)", "[session][mcp]") {
  mcp_initialize_and_list("mcp-everything");
}

TEST_CASE("session: the fixture runtime exists", "[session]") {
  INFO(fixture().why);
  REQUIRE(fixture().rt.has_value());
}

TEST_CASE("session: stdio is byte-exact both ways (process)", "[session]") {
  byte_exact_echo("cat");
}

TEST_CASE("session: the model picks only a name; the ticket decides", "[session]") {
  auto unknown = open(runtime(), {.tool = "/bin/sh"});
  CHECK(unknown.code == code::invalid_request);
  CHECK(unknown.message.find("tool") != std::string::npos);
  CHECK(!unknown.session);

  auto bad_idle =
      open(runtime(), {.tool = "cat", .max_lifetime = std::nullopt, .idle_timeout = 0ms});
  CHECK(bad_idle.code == code::invalid_request);
  CHECK(bad_idle.message.find("idle_timeout") != std::string::npos);

  // code.execute alone does not start a server: tool.run must name it.
  auto denied = open(runtime(), {.tool = "cat"}, itest::ticket());
  CHECK(denied.code == code::action_denied);
  CHECK(!denied.session);
}

TEST_CASE("session: a server that does not read makes writes wait; host memory bounded",
          "[session]") {
  unread_stdin_waits("sleeper");
}

TEST_CASE("session: close_stdin is EOF for the server, after every byte (process)", "[session]") {
  stdin_close_is_eof("eof-reporter");
}

TEST_CASE("session: a host that does not read blocks the server on its pipe", "[session]") {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = "flood"});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  // Nothing is read: the host holds none of the output (it is read into the caller's
  // buffer only), and the server stays alive, blocked.
  std::vector<char> buf(4096);
  std::promise<std::size_t> got;
  s->async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
    CHECK(!ec);
    got.set_value(n);
  });
  auto n = got.get_future().get();
  CHECK(n > 0);
  CHECK(n <= buf.size());
  auto x = s->stats();
  CHECK(x.bytes_from_server == n);
  CHECK(!x.ended);
  auto r = close(*s);
  CHECK(r.end == session_end::closed);
  CHECK(r.bytes_from_server == n);
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

TEST_CASE("session: the idle timeout ends it with timeout; everything confirmed dead",
          "[session]") {
  auto before = snapshot();
  auto st =
      open(runtime(), {.tool = "sleeper", .max_lifetime = std::nullopt, .idle_timeout = 300ms});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  std::vector<char> buf(16);
  auto [out, ec] = read_all(*s);  // ends when the session does
  CHECK(out.empty());
  // The killed server's stdout closes (EOF), or teardown closes the host's end first.
  CHECK((ec == asio::error::eof || ec == asio::error::operation_aborted));
  auto r = close(*s);
  CHECK(r.end == session_end::idle_timeout);
  CHECK(r.result.code == code::timeout);
  CHECK(r.result.message.find("idle") != std::string::npos);
  CHECK(r.result.signal == SIGKILL);
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

TEST_CASE("session: the maximum lifetime ends it with timeout", "[session]") {
  auto before = snapshot();
  auto st =
      open(runtime(), {.tool = "sleeper", .max_lifetime = 300ms, .idle_timeout = std::nullopt});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  REQUIRE(eventually([&] { return s->stats().ended; }));
  auto r = close(*s);
  CHECK(r.end == session_end::max_lifetime);
  CHECK(r.result.code == code::timeout);
  CHECK(r.result.timeout == 300ms);
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

TEST_CASE("session: the ticket's max_timeout bounds the lifetime; its expiry ends it",
          "[session][ticket]") {
  auto before = snapshot();
  {
    // A ticket whose ceiling is 400 ms: a session asking for a minute lives 400 ms.
    auto t = sandbox::ticket_issuer{}
                 .issue({.id = "itest-short",
                         .tenant = "itest",
                         .execute = false,
                         .isolation = sandbox::isolation::process,
                         .max_timeout = 400ms,
                         .max_memory_bytes = 1ULL << 30,
                         .tools = {"*"}})
                 .value();
    auto st = open(runtime(), {.tool = "sleeper", .max_lifetime = 60s, .idle_timeout = 60s}, t);
    REQUIRE(st.code == code::ok);
    REQUIRE(eventually([&] { return st.session->stats().ended; }));
    auto r = close(*st.session);
    CHECK(r.end == session_end::max_lifetime);
    CHECK(r.result.code == code::timeout);
    CHECK(r.result.timeout == 400ms);
    CHECK(r.result.timeout_clamped);
  }
  {
    // A ticket that expires in ~2 s (whole seconds): the session ends at its expiry, as
    // ticket_expired, long before its own lifetime and idle timeout.
    sandbox::ticket_spec spec{.id = "itest-expiring",
                              .tenant = "itest",
                              .execute = false,
                              .isolation = sandbox::isolation::process,
                              .max_timeout = 600s,
                              .max_memory_bytes = 1ULL << 30,
                              .tools = {"*"}};
    spec.expires_at = std::chrono::system_clock::now() + 3s;
    auto t = sandbox::ticket_issuer{}.issue(spec).value();
    auto st = open(runtime(), {.tool = "sleeper", .max_lifetime = 600s, .idle_timeout = 60s}, t);
    REQUIRE(st.code == code::ok);
    REQUIRE(eventually([&] { return st.session->stats().ended; }));
    auto r = close(*st.session);
    CHECK(r.end == session_end::ticket_expired);
    CHECK(r.result.code == code::timeout);
    CHECK(r.result.timeout <= 3000ms);
    CHECK(r.result.signal == SIGKILL);
    // What it was granted ended no earlier than the expiry (whole seconds of the ticket).
    CHECK(std::chrono::system_clock::now() >= *t.expires_at());
  }
  itest::check_host_unchanged(before);
}

TEST_CASE("registry: an entry whose binary is missing or not executable is flagged, refused",
          "[session][registry]") {
  runtime();  // the shared fixture: the image store and backends work here
  std::string root;
  auto opts = itest::private_runtime_options(&root);
  auto make = [](std::string name, std::string binary) {
    return sandbox::tool_entry{.name = std::move(name),
                               .image = "python3",
                               .image_digest = std::nullopt,
                               .binary = std::move(binary),
                               .args = {},
                               .input = sandbox::tool_input::stdin_bytes,
                               .isolation = sandbox::isolation::process,
                               .profile = {},
                               .egress = {},
                               .env = {}};
  };
  // A missing file, a directory, a file without an execute bit; and one that resolves
  // inside the image through a link (/usr/bin/python3 is one).
  opts.tools = {make("missing", "/bin/no-such-binary"), make("directory", "/usr"),
                make("not-exec", "/etc/passwd"), make("link", "/usr/bin/python3")};
  auto made = sandbox::runtime::create(opts);
  REQUIRE(made.has_value());
  auto& rt = *made;
  const auto cat = rt.catalog();
  CHECK(cat.tools.at("missing").unusable.find("'/bin/no-such-binary' is missing") !=
        std::string::npos);
  CHECK(cat.tools.at("directory").unusable.find("not a regular executable file") !=
        std::string::npos);
  CHECK(cat.tools.at("not-exec").unusable.find("not a regular executable file") !=
        std::string::npos);
  CHECK(cat.tools.at("link").unusable.empty());
  for (const char* name : {"missing", "directory", "not-exec"}) {
    INFO(name);
    auto st = open(rt, {.tool = name});
    CHECK(st.code == code::runtime_unavailable);
    CHECK(!st.session);
    CHECK(st.message.find("binary: '") != std::string::npos);
    CHECK(st.message.find(root) == std::string::npos);  // never a host path
    // A one-shot run of the entry: the same answer, before anything starts.
    sandbox::run_request req;
    req.tool = name;
    req.std_in = "x";
    auto r = rt.run(req, tool_ticket());
    CHECK(r.code == code::runtime_unavailable);
    CHECK(r.message.find("binary: '") != std::string::npos);
  }
}

TEST_CASE("session: stderr past its cap is drained at a bounded rate", "[session][stderr]") {
  auto before = snapshot();
  const auto t0 = std::chrono::steady_clock::now();
  auto st = open(runtime(), {.tool = "stderr-flood"});
  REQUIRE(st.code == code::ok);
  // Let it flood for a while (a wait, not a timing assertion).
  std::this_thread::sleep_for(2500ms);
  auto r = close(*st.session);
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  const auto& err = r.result.std_err;
  INFO("stderr read: " << err.total_bytes << " bytes");
  // It did flood past the cap (1 MiB kept, flagged)...
  CHECK(err.truncated);
  CHECK(err.total_bytes > err.bytes);
  // ... but past the cap the host read at most 1 MiB/s of the session's life (the drain
  // rate, init_backend.cpp), plus one 64 KiB read in flight and the pipe left at the end:
  // unthrottled, this server writes gigabytes in that time.
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
  const std::uint64_t bound =
      err.bytes + (1ULL << 20) * static_cast<std::uint64_t>(ms) / 1000 + 4 * 65536;
  CHECK(err.total_bytes <= bound);
  st.session.reset();
  itest::check_host_unchanged(before);
}

TEST_CASE("session: children that try to outlive close are all killed", "[session]") {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = "forker"});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  std::string pending;
  CHECK(read_line(*s, pending) == "forked");
  auto r = close(*s);
  CHECK(r.end == session_end::closed);
  CHECK(r.result.code == code::ok);
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);  // no process of a sandbox uid, no cgroup left
}

TEST_CASE("session: a server that closes stdout early gives EOF; close still kills it",
          "[session]") {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = "early-close"});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  auto [out, ec] = read_all(*s);
  CHECK(out.empty());
  CHECK(ec == asio::error::eof);
  CHECK(!s->stats().ended);
  auto r = close(*s);
  CHECK(r.end == session_end::closed);
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

TEST_CASE("session: a server that closes its stdin makes writes fail with broken_pipe",
          "[session]") {
  closed_stdin_breaks_writes("stdin-closer");
}

TEST_CASE("session: dropping the session object kills the server", "[session]") {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = "forker"});
  REQUIRE(st.code == code::ok);
  st.session.reset();
  itest::check_host_unchanged(before);
}

TEST_CASE("session: destroying the runtime kills a live session", "[session]") {
  auto before = snapshot();
  std::string root;
  auto opts = itest::private_runtime_options(&root);
  opts.tools = entries();
  std::shared_ptr<sandbox::session> s;
  {
    auto rt = sandbox::runtime::create(opts);
    REQUIRE(rt.has_value());
    auto st = open(*rt, {.tool = "forker"});
    REQUIRE(st.code == code::ok);
    s = st.session;
    std::vector<char> buf(64);
    std::promise<std::size_t> got;
    s->async_read_some(asio::buffer(buf),
                       [&](boost::system::error_code, std::size_t n) { got.set_value(n); });
    CHECK(got.get_future().get() > 0);
  }  // the runtime goes with the session still open
  itest::check_host_unchanged(before);
  s.reset();
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}
