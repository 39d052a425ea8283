// What the session tests of every level share (tests/integration/process/session_test.cpp
// and tests/integration/oci/session_test.cpp): the registry entries they start (the same
// servers at the process, container and gvisor levels, by name suffix), one runtime per
// executable, and the checks each level runs: byte-exact stdio, MCP over stdio, close_stdin
// as EOF, a server that does not read, a server that closes its stdin. Each case checks that
// nothing of it is left on the host.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/buffer.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>

#include "integration/common/mcp_exchange.hpp"
#include "integration/harness.hpp"

namespace sessiontest {

using sandbox::code;
using sandbox::session_end;
using namespace std::chrono_literals;
namespace asio = boost::asio;

inline sandbox::tool_entry py_entry(std::string name, std::string script,
                                    sandbox::isolation level = sandbox::isolation::process) {
  return {.name = std::move(name),
          .image = "python3",
          .image_digest = std::nullopt,
          .binary = "/usr/bin/python3",
          .args = {"-u", "-c", std::move(script)},
          .input = sandbox::tool_input::stdin_bytes,
          .isolation = level,
          .profile = {},
          .egress = {},
          .env = {}};
}

// The servers these tests start: registry entries of the host (the test).
inline std::vector<sandbox::tool_entry> entries() {
  std::vector<sandbox::tool_entry> e;
  e.push_back({.name = "cat",
               .image = "python3",
               .image_digest = std::nullopt,
               .binary = "/bin/cat",
               .args = {},
               .input = sandbox::tool_input::stdin_bytes,
               .isolation = sandbox::isolation::process,
               .profile = {},
               .egress = {},
               .env = {}});
  auto crun_cat = e.back();
  crun_cat.name = "cat-container";
  crun_cat.isolation = sandbox::isolation::container;
  e.push_back(crun_cat);
  // Never reads its stdin, never writes.
  e.push_back(py_entry("sleeper", "import time\ntime.sleep(3600)"));
  // Writes without end, whether anyone reads or not.
  e.push_back(py_entry("flood", "import sys\nwhile True: sys.stdout.write('x' * 65536)"));
  // Floods its stderr (reads nothing, writes no stdout).
  e.push_back(py_entry("stderr-flood",
                       "import sys\nb = b'e' * 65536\nwhile True: sys.stderr.buffer.write(b)"));
  // Children that try to outlive the session: setsid'd, SIGTERM ignored, double-forked.
  e.push_back(py_entry("forker", R"PY(
import os, signal, sys, time
for i in range(3):
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            while True: time.sleep(1)
        while True: time.sleep(1)
print('forked', flush=True)
sys.stdin.read()
time.sleep(3600)
)PY"));
  // The reference MCP "everything" server, installed from npm into the "mcp" image at image
  // build time (tools/setup.sh: sandboxctl image build mcp --npm …), speaking stdio.
  sandbox::tool_entry mcp{
      .name = "mcp-everything",
      .image = "mcp",
      .image_digest = std::nullopt,
      .binary = "/usr/bin/node",
      .args = {"/opt/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
               "stdio"},
      .input = sandbox::tool_input::stdin_bytes,
      .isolation = sandbox::isolation::process,
      .profile = {},
      .egress = {},
      .env = {}};
  e.push_back(mcp);
  mcp.name = "mcp-everything-container";
  mcp.isolation = sandbox::isolation::container;
  e.push_back(mcp);
  // Closes its stdin, says so on stdout and stderr, and lives on.
  e.push_back(py_entry("stdin-closer", R"PY(
import os, sys, time
os.close(0)
sys.stderr.write('stdin closed on purpose\n'); sys.stderr.flush()
print('closed', flush=True)
time.sleep(3600)
)PY"));
  // Closes its stdout at once and lives on.
  e.push_back(py_entry("early-close", "import os, time\nos.close(1)\ntime.sleep(3600)"));
  // Reads its stdin to EOF, reports what it got (length, CRC-32, NULs) and lives on: the EOF
  // it saw is the host's close_stdin, not its own end.
  e.push_back(py_entry("eof-reporter", R"PY(
import sys, time, zlib
d = sys.stdin.buffer.read()
print(len(d), zlib.crc32(d), d.count(0), flush=True)
time.sleep(3600)
)PY"));
  // The same servers at the gvisor level ("<name>-gvisor"; "<name>-container" at crun).
  for (const char* name : {"cat", "sleeper", "stdin-closer", "eof-reporter", "mcp-everything"}) {
    auto it = std::find_if(e.begin(), e.end(), [&](const auto& x) { return x.name == name; });
    auto g = *it;
    g.name = std::string(name) + "-gvisor";
    g.isolation = sandbox::isolation::gvisor;
    e.push_back(g);
  }
  auto eof_container =
      *std::find_if(e.begin(), e.end(), [](const auto& x) { return x.name == "eof-reporter"; });
  eof_container.name = "eof-reporter-container";
  eof_container.isolation = sandbox::isolation::container;
  e.push_back(eof_container);
  return e;
}

// The level a test entry asks for, by its name's suffix (see entries()).
inline sandbox::isolation level_of(const std::string& tool) {
  auto ends = [&](std::string_view suffix) {
    return tool.size() >= suffix.size() &&
           tool.compare(tool.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends("-gvisor")) return sandbox::isolation::gvisor;
  if (ends("-container")) return sandbox::isolation::container;
  return sandbox::isolation::process;
}

// CRC-32 (IEEE, as zlib.crc32) of `data`.
inline std::uint32_t crc32(const std::string& data) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

// Waits (bounded) until our descriptor count has been stable for a while: a container run's
// `<runtime> delete` is started off the result's path, and its pipes must not be counted by
// the next case's host snapshot.
inline void settle_fds() {
  int last = -1, same = 0;
  for (int i = 0; i < 250 && same < 10; ++i) {
    const int now = itest::count_fds();
    same = now == last ? same + 1 : 0;
    last = now;
    std::this_thread::sleep_for(20ms);
  }
}

struct session_fixture {
  std::string state_root;
  std::optional<sandbox::runtime> rt;
  std::string why;
};

// The OCI levels the executable's fixture enables (defined by each session test file).
bool fixture_enables_oci_levels();

// One runtime (own io thread) for every case of an executable: the process level, the OCI
// levels when the executable asks for them, the entries.
inline session_fixture& fixture() {
  static session_fixture f = [] {
    session_fixture s;
    auto opts = itest::private_runtime_options(&s.state_root);
    opts.container.enabled = fixture_enables_oci_levels();
    opts.gvisor.enabled = fixture_enables_oci_levels();
    opts.tools = entries();
    opts.sessions.idle_timeout = 60s;
    opts.sessions.stdin_buffer_bytes = 16 * 1024;
    auto made = sandbox::runtime::create(opts);
    if (!made) {
      s.why = made.error().message();
    } else {
      s.rt.emplace(std::move(*made));
      // The container backend's self-test leaves a `crun delete` in flight (its pipes are
      // ours for a moment): let it finish before any case snapshots our descriptors.
      settle_fds();
    }
    return s;
  }();
  return f;
}

inline sandbox::runtime& runtime() {
  auto& f = fixture();
  REQUIRE(f.rt.has_value());
  return *f.rt;
}

// The host's state, after the shared runtime exists (its own descriptors and cgroups are not
// a case's leftovers).
inline itest::host_snapshot snapshot() {
  runtime();
  return itest::snapshot();
}

inline bool has_level(sandbox::isolation level) {
  for (const auto& b : runtime().backends()) {
    if (b.isolation == level && b.registered) return true;
  }
  return false;
}

// The container level (crun): needs root (docs/architecture.md); as root it must work in CI.
inline bool has_container() {
  if (has_level(sandbox::isolation::container)) return true;
  if (itest::must_work() && ::geteuid() == 0) FAIL("container backend unavailable under CI=true");
  WARN("container backend unavailable: skipped");
  return false;
}

// The gvisor level: needs root and runsc (docs/architecture.md); as root it must work in CI.
inline bool has_gvisor() {
  if (has_level(sandbox::isolation::gvisor)) return true;
  if (itest::must_work() && ::geteuid() == 0) FAIL("gvisor backend unavailable under CI=true");
  WARN("gvisor backend unavailable: skipped");
  return false;
}

// A ticket granting tool.run for every entry of the host's registry (tenant "itest").
inline sandbox::ticket tool_ticket() {
  return sandbox::ticket_issuer{}
      .issue({.id = "itest-tools",
              .tenant = "itest",
              .execute = false,
              .isolation = sandbox::isolation::process,
              .max_timeout = 600000ms,  // the lifetime ceiling
              .max_memory_bytes = 1ULL << 30,
              .tools = {"*"}})
      .value();
}

inline sandbox::session_start open(sandbox::runtime& rt, sandbox::session_request req,
                                   const sandbox::ticket& t = tool_ticket()) {
  return rt.async_open_session(std::move(req), t, asio::use_future).get();
}

inline sandbox::session_result close(sandbox::session& s) {
  return s.async_close(asio::use_future).get();
}

// Reads until EOF (or an error); returns the bytes and the final error.
inline std::pair<std::string, boost::system::error_code> read_all(sandbox::session& s,
                                                                  std::size_t limit = 64u << 20) {
  std::string out;
  std::vector<char> buf(70000);
  for (;;) {
    std::promise<std::pair<boost::system::error_code, std::size_t>> p;
    s.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
      p.set_value({ec, n});
    });
    auto [ec, n] = p.get_future().get();
    out.append(buf.data(), n);
    if (ec || out.size() > limit) return {out, ec};
  }
}

// Waits (bounded) until `pred` holds; a wait, not a timing assertion.
template <class Pred>
inline bool eventually(Pred pred, std::chrono::milliseconds bound = 20s) {
  auto until = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

inline void byte_exact_echo(const std::string& tool) {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = tool});
  REQUIRE(st.code == code::ok);
  REQUIRE(st.session);
  std::string data(1 << 20, '\0');
  std::mt19937 gen(42);
  for (auto& c : data) c = static_cast<char>(gen() & 0xff);
  for (std::size_t i = 0; i < data.size(); i += 997) data[i] = '\0';  // NULs for sure
  auto s = st.session;
  std::promise<std::pair<boost::system::error_code, std::size_t>> wrote;
  s->async_write(asio::buffer(data), [&](boost::system::error_code ec, std::size_t n) {
    wrote.set_value({ec, n});
  });
  // Read concurrently (cat blocks on a full stdout pipe otherwise), then close stdin.
  std::thread closer([&] {
    auto [ec, n] = wrote.get_future().get();
    CHECK(!ec);
    CHECK(n == data.size());
    s->close_stdin();
  });
  auto [echo, ec] = read_all(*s);
  closer.join();
  CHECK(ec == asio::error::eof);
  REQUIRE(echo.size() == data.size());
  CHECK(echo == data);
  auto r = close(*s);
  CHECK(r.result.isolation == level_of(tool));
  CHECK((r.end == session_end::server_exited || r.end == session_end::closed));
  CHECK(r.result.code == code::ok);
  CHECK(r.bytes_to_server == data.size());
  CHECK(r.bytes_from_server == data.size());
  CHECK(r.result.std_out.blob.empty());
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

// Reads until a newline; returns the line without it (and keeps what follows in `pending`).
inline std::string read_line(sandbox::session& s, std::string& pending) {
  std::vector<char> buf(4096);
  while (pending.find('\n') == std::string::npos) {
    std::promise<std::pair<boost::system::error_code, std::size_t>> p;
    s.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
      p.set_value({ec, n});
    });
    auto [ec, n] = p.get_future().get();
    if (ec) return pending;
    pending.append(buf.data(), n);
  }
  auto nl = pending.find('\n');
  std::string line = pending.substr(0, nl);
  pending.erase(0, nl + 1);
  return line;
}

inline void mcp_initialize_and_list(const std::string& tool) {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = tool});
  if (st.code == code::runtime_unavailable &&
      st.message.find("not installed") != std::string::npos) {
    if (itest::must_work()) FAIL("the mcp image is not installed (tools/setup.sh builds it)");
    WARN("mcp image not installed: skipped (" << st.message << ")");
    return;
  }
  INFO(st.message);
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  mcptest::initialize_list_and_call(*s, "hi from the sandbox");
  auto r = close(*s);
  CHECK(r.result.isolation == level_of(tool));
  CHECK(r.end == session_end::closed);
  CHECK(r.result.code == code::ok);
  CHECK(r.result.egress_attempts.empty());
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

// close_stdin is EOF for the server, after every byte (binary: NULs and all byte values,
// more than the host's buffer and the pipe hold) — and the server lives on past it.
inline void stdin_close_is_eof(const std::string& tool) {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = tool});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  std::string data(300 * 1024 + 7, '\0');
  std::mt19937 gen(7);
  for (auto& c : data) c = static_cast<char>(gen() & 0xff);
  for (std::size_t i = 0; i < data.size(); i += 101) data[i] = '\0';
  std::size_t nuls = 0;
  for (char c : data) nuls += c == '\0' ? 1 : 0;
  auto n = s->async_write(asio::buffer(data), asio::use_future).get();
  CHECK(n == data.size());
  s->close_stdin();
  std::string pending;
  const std::string line = read_line(*s, pending);
  CHECK(line == std::to_string(data.size()) + " " + std::to_string(crc32(data)) + " " +
                    std::to_string(nuls));
  CHECK(!s->stats().ended);  // it saw EOF and lives on
  CHECK(s->stats().bytes_to_server == data.size());
  // Writes after close_stdin are refused.
  std::promise<boost::system::error_code> p;
  s->async_write(asio::buffer(data, 1),
                 [&](boost::system::error_code e, std::size_t) { p.set_value(e); });
  CHECK(p.get_future().get() == asio::error::broken_pipe);
  auto r = close(*s);
  CHECK(r.result.isolation == level_of(tool));
  CHECK(r.end == session_end::closed);
  CHECK(r.bytes_to_server == data.size());
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

// A server that never reads its stdin while the host writes 4 MiB: the write waits with the
// host's buffer at capacity, and what reached the server is only what its pipe (and, under
// gVisor, sandbox-init's credit window) holds.
inline void unread_stdin_waits(const std::string& tool) {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = tool});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  std::string data(4 << 20, 'a');
  std::atomic<bool> done{false};
  boost::system::error_code write_ec;
  std::size_t accepted = 0;
  s->async_write(asio::buffer(data), [&](boost::system::error_code ec, std::size_t n) {
    write_ec = ec;
    accepted = n;
    done = true;
  });
  // The pipe fills, then the host's buffer: the write waits with the buffer at capacity.
  REQUIRE(eventually([&] {
    auto x = s->stats();
    return x.write_waiting && x.stdin_buffered == x.stdin_capacity;
  }));
  auto x = s->stats();
  CHECK(!done.load());
  CHECK(x.stdin_capacity == 16 * 1024);
  CHECK(x.bytes_to_server < data.size());  // the pipe took what it holds, no more
  CHECK(x.bytes_to_server + x.stdin_buffered < data.size());
  // In the pipe at most: a pipe's largest size (1 MiB, fs.pipe-max-size's default).
  CHECK(x.bytes_to_server <= (1u << 20));
  // Still waiting a while later: the pipe (and, under gVisor, sandbox-init's window) may
  // take a little more meanwhile, never the 4 MiB.
  std::this_thread::sleep_for(200ms);
  auto y = s->stats();
  CHECK(y.write_waiting);
  CHECK(!done.load());
  CHECK(y.stdin_buffered <= y.stdin_capacity);
  CHECK(y.bytes_to_server <= (1u << 20));
  auto r = close(*s);
  CHECK(r.result.isolation == level_of(tool));
  CHECK(r.end == session_end::closed);
  CHECK(r.result.code == code::ok);
  REQUIRE(eventually([&] { return done.load(); }));
  CHECK(write_ec == asio::error::operation_aborted);
  CHECK(accepted < data.size());
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

// A server that closes its stdin: writes fail with broken_pipe, never a signal.
inline void closed_stdin_breaks_writes(const std::string& tool) {
  auto before = snapshot();
  auto st = open(runtime(), {.tool = tool});
  REQUIRE(st.code == code::ok);
  auto s = st.session;
  std::string pending;
  REQUIRE(read_line(*s, pending) == "closed");
  // The pipe has no reader now: the write fails (EPIPE), and the host process gets no
  // SIGPIPE (this test would die of it).
  std::string data(256 * 1024, 'z');
  std::promise<std::pair<boost::system::error_code, std::size_t>> p;
  s->async_write(asio::buffer(data), [&](boost::system::error_code ec, std::size_t n) {
    p.set_value({ec, n});
  });
  auto [ec, n] = p.get_future().get();
  CHECK(ec == asio::error::broken_pipe);
  CHECK(n <= data.size());
  CHECK(s->stats().bytes_to_server == 0);
  // A later write is refused at once.
  std::promise<boost::system::error_code> p2;
  s->async_write(asio::buffer(data),
                 [&](boost::system::error_code e, std::size_t) { p2.set_value(e); });
  CHECK(p2.get_future().get() == asio::error::broken_pipe);
  auto r = close(*s);
  CHECK(r.result.isolation == level_of(tool));
  CHECK(r.end == session_end::closed);
  // stderr is captured like a run's, as a blob.
  CHECK(r.result.std_err.summary == "stdin closed on purpose\n");
  auto stored = runtime().blobs()->get("itest", r.result.std_err.blob);
  REQUIRE(stored.has_value());
  CHECK(*stored == "stdin closed on purpose\n");
  s.reset();
  st.session.reset();
  itest::check_host_unchanged(before);
}

}  // namespace sessiontest
