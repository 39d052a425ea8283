// Sessions through `sandboxctl serve` (docs/protocol.md, "Sessions over the daemon"): a `cat`
// server from the daemon's registry (--config's `tools` section) echoes bytes exactly, stdout
// of a server whose client does not read stays in the server's pipe (the daemon's own
// counters stay bounded), a client that disconnects has its sessions killed (no process or
// cgroup left), the session caps, and bad session lines refused with their code while the
// daemon keeps serving.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_harness.hpp"
#include "service_harness.hpp"

using nlohmann::json;
using svctest::eventually;
using namespace std::chrono_literals;

namespace {

/// The registry every test's daemon gets: `cat` (echoes stdin), `flood` (writes stdout
/// forever, reads nothing) and `drip` (a byte every 50 ms, never a newline), all in the
/// python3 image.
std::filesystem::path session_config() {
  return clitest::write_scratch("svc-sessions.json", R"({"v":1,"tools":[
    {"name":"cat","image":"python3","binary":"/bin/cat"},
    {"name":"flood","image":"python3","binary":"/usr/bin/python3",
     "args":["-c","import sys\nb = b'x' * 65536\nwhile True:\n    sys.stdout.buffer.write(b)\n"]},
    {"name":"drip","image":"python3","binary":"/usr/bin/python3",
     "args":["-c","import sys, time\nwhile True:\n    sys.stdout.buffer.write(b'x')\n    sys.stdout.flush()\n    time.sleep(0.05)\n"]}
  ]})");
}

json session_ticket() {
  json t = svctest::ticket("sessvc");
  t["actions"] = {"tool.run"};
  t["tools"] = {"cat", "flood"};
  t["max_timeout_ms"] = 600000;  // a session's lifetime ceiling: longer than any case here
  return t;
}

/// The daemon of the running test, for its log in failure messages.
const svctest::daemon* g_daemon = nullptr;

std::string line(const json& j) { return j.dump() + "\n"; }

/// Standard base64 (padded) decoded; FAILs on anything else.
std::string unbase64(const std::string& in) {
  static const std::string alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (in.size() % 4 != 0) FAIL("not padded base64: " << in.substr(0, 80));
  std::string out;
  std::uint32_t v = 0;
  int bits = 0;
  for (char ch : in) {
    if (ch == '=') break;
    const auto pos = alphabet.find(ch);
    if (pos == std::string::npos) FAIL("not base64: " << in.substr(0, 80));
    v = (v << 6) | static_cast<std::uint32_t>(pos);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 0xff);
    }
  }
  return out;
}

/// Opens a session of `tool`; REQUIREs success and returns its id.
std::string open_session(svctest::client& c, const std::string& tool,
                         const std::string& id = "open") {
  c.send(line({{"id", id},
               {"session_open", {{"ticket", session_ticket()}, {"request", {{"tool", tool}}}}}}));
  const json a = c.answer();
  INFO(a.dump());
  REQUIRE(a["id"] == id);
  REQUIRE(a.contains("session"));
  return a["session"];
}

/// Reads lines until the answer with `id` (empty: until the eof event); stdout events of
/// `sid` on the way are appended to `out` (decoded), an eof event sets `eof`.
json answer_of(svctest::client& c, const std::string& id, const std::string& sid, std::string& out,
               bool& eof) {
  for (;;) {
    auto l = c.read_line(60s);
    if (!l) {
      FAIL("no answer while waiting for " << id << " (" << out.size()
                                          << " bytes of stdout so far); daemon log:\n"
                                          << (g_daemon ? g_daemon->log() : std::string()));
    }
    const json a = json::parse(*l);
    if (a.contains("id")) {
      if (a["id"] == id) return a;
      FAIL("unexpected answer " << a.dump().substr(0, 400));
    }
    REQUIRE(a["session"] == sid);
    if (a.contains("stdout")) {
      out += unbase64(a["stdout"].get<std::string>());
    } else {
      REQUIRE(a["eof"] == true);
      eof = true;
      if (id.empty()) return a;
    }
  }
}

json stats(svctest::client& c) {
  c.send(line({{"id", "stats"}, {"service_stats", json::object()}}));
  const json a = c.answer();
  REQUIRE(a["id"] == "stats");
  return a["service_stats"];
}

}  // namespace

TEST_CASE("a session through the daemon echoes bytes exactly; bad session lines are refused",
          "[service][session]") {
  svctest::daemon d({"--config", session_config().string()});
  g_daemon = &d;
  svctest::client c(d.socket());
  const std::string sid = open_session(c, "cat");

  // Every byte value, NULs included, more than the session's stdin buffer and the pipe hold
  // (so writes wait for the server): sent as several writes, all before reading anything.
  std::string data(300U << 10, '\0');
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<char>((i * 131 + i / 256) & 0xff);
  constexpr std::size_t piece = 48U << 10;
  std::string lines;
  int writes = 0;
  for (std::size_t off = 0; off < data.size(); off += piece, ++writes) {
    lines += line({{"id", "w" + std::to_string(writes)},
                   {"session_write",
                    {{"session", sid}, {"data_b64", svctest::base64(data.substr(off, piece))}}}});
  }
  c.send(lines);
  std::string out;
  bool eof = false;
  std::size_t written = 0;
  for (int i = 0; i < writes; ++i) {
    const json a = answer_of(c, "w" + std::to_string(i), sid, out, eof);
    INFO(a.dump());
    REQUIRE(a.contains("written"));
    written += a["written"].get<std::size_t>();
  }
  CHECK(written == data.size());
  // UTF-8 text goes in as it is.
  c.send(line({{"id", "text"}, {"session_write", {{"session", sid}, {"text", "h\xc3\xa9llo\n"}}}}));
  CHECK(answer_of(c, "text", sid, out, eof)["written"] == 7);
  c.send(line({{"id", "eof"}, {"session_close_stdin", {{"session", sid}}}}));
  CHECK(answer_of(c, "eof", sid, out, eof)["stdin_closed"] == true);
  if (!eof) answer_of(c, "", sid, out, eof);
  REQUIRE(out.size() == data.size() + 7);
  CHECK(out == data + "h\xc3\xa9llo\n");

  // Refused lines, each with its code and the field named; the session is untouched.
  struct refused {
    json line;
    std::string code;
    std::string message_part;
  };
  const std::vector<refused> cases{
      {{{"id", "x1"}, {"session_write", {{"session", "nope"}, {"text", "x"}}}},
       "session_not_found",
       "session_write.session: no session 'nope'"},
      {{{"id", "x2"}, {"session_close", {{"session", "nope"}}}},
       "session_not_found",
       "session_close.session"},
      {{{"id", "x3"}, {"session_close_stdin", {{"session", "nope"}}}},
       "session_not_found",
       "session_close_stdin.session"},
      {{{"id", "x4"}, {"session_write", {{"text", "x"}}}},
       "invalid_request",
       "session_write.session: required field is missing"},
      {{{"id", "x5"}, {"session_write", {{"session", sid}, {"text", "x"}, {"data_b64", "eA=="}}}},
       "invalid_request",
       "exactly one of data_b64 and text"},
      {{{"id", "x6"}, {"session_write", {{"session", sid}, {"data_b64", "eA="}}}},
       "invalid_request",
       "session_write.data_b64: not valid base64"},
      {{{"id", "x7"}, {"session_write", {{"session", 7}, {"text", "x"}}}},
       "invalid_request",
       "session_write.session: expected a string"},
      {{{"id", "x8"},
        {"session_open",
         {{"ticket", session_ticket()}, {"request", {{"tool", "cat"}, {"binary", "/bin/sh"}}}}}},
       "invalid_request",
       "session_open.request: unknown field 'binary'"},
      {{{"id", "x9"}, {"session_open", {{"request", {{"tool", "cat"}}}}}},
       "invalid_request",
       "session_open.ticket: required field is missing"},
      {{{"id", "x10"},
        {"session_open", {{"ticket", session_ticket()}, {"request", {{"tool", "sh"}}}}}},
       "invalid_request",
       "tool"},
      {{{"id", "x11"},
        {"session_open", {{"ticket", svctest::ticket("sessvc")}, {"request", {{"tool", "cat"}}}}}},
       "action_denied",
       "tool.run"},
      {{{"id", "x12"}, {"session_close", {{"session", sid}}}, {"extra", 1}},
       "invalid_request",
       "unknown field 'extra'"},
      {{{"id", "x13"}, {"service_stats", {{"all", true}}}},
       "invalid_request",
       "service_stats: unknown field 'all'"},
  };
  for (const auto& r : cases) {
    c.send(line(r.line));
    const json a = c.answer();
    INFO(r.line.dump() << " → " << a.dump());
    CHECK(a["id"] == r.line["id"]);
    REQUIRE(a.contains("error"));
    CHECK(a["error"]["code"] == r.code);
    CHECK(a["error"]["message"].get<std::string>().find(r.message_part) != std::string::npos);
  }
  c.send("{\"id\":\"bad\",\"session_write\":{\"session\":\"" + sid + "\",\"text\":NaN}}\n");
  const json bad = c.answer();
  CHECK(bad["id"] == "bad");
  CHECK(bad["error"]["code"] == "invalid_request");

  // Writing after close_stdin is refused; closing answers the session's result.
  c.send(line({{"id", "late"}, {"session_write", {{"session", sid}, {"text", "x"}}}}));
  CHECK(c.answer()["error"]["code"] == "session_ended");
  c.send(line({{"id", "close"}, {"session_close", {{"session", sid}}}}));
  const json closed = answer_of(c, "close", sid, out, eof);
  INFO(closed.dump());
  REQUIRE(closed.contains("session_result"));
  const json& r = closed["session_result"];
  CHECK((r["end"] == "closed" || r["end"] == "server_exited"));
  CHECK(r["result"]["code"] == "ok");
  CHECK(r["bytes_to_server"] == data.size() + 7);
  CHECK(r["bytes_from_server"] == data.size() + 7);
  // The session is gone; the daemon serves on.
  c.send(line({{"id", "gone"}, {"session_close", {{"session", sid}}}}));
  CHECK(c.answer()["error"]["code"] == "session_not_found");
  const json s = stats(c);
  CHECK(s["sessions"] == 0);
  CHECK(s["pools"] == json::array());  // a daemon without warm pools
  const std::string again = open_session(c, "cat", "again");
  CHECK(again != sid);
}

TEST_CASE(
    "a client that does not read its session's stdout: the output waits in the server's "
    "pipe, not in the daemon",
    "[service][session]") {
  svctest::daemon d({"--config", session_config().string()});
  svctest::client c(d.socket());
  svctest::client watcher(d.socket());
  const std::string sid = open_session(c, "flood");
  // The server writes without end; the daemon reads only while this client's unwritten
  // answers are under 1 MiB, so its count of bytes read stops growing.
  std::uint64_t last = 0;
  REQUIRE(eventually(
      [&] {
        const std::uint64_t now = stats(watcher)["session_stdout_bytes"];
        const bool still = now > 0 && now == last;
        last = now;
        if (!still) svctest::sleep_ms(300);
        return still;
      },
      60s));
  const json s = stats(watcher);
  INFO(s.dump());
  // At most the pause threshold plus one event and the socket's own buffers, never the
  // server's unbounded output.
  CHECK(s["unwritten_bytes"].get<std::uint64_t>() <= (1U << 20) + (32U << 10));
  CHECK(s["session_stdout_bytes"].get<std::uint64_t>() < (8U << 20));
  CHECK(s["sessions"] == 1);

  // Reading resumes the flow: 4 MiB more arrive, byte-exact.
  std::uint64_t got = 0;
  while (got < last + (4U << 20)) {
    const json a = c.answer();
    REQUIRE(a["session"] == sid);
    const std::string bytes = unbase64(a["stdout"].get<std::string>());
    REQUIRE(bytes.find_first_not_of('x') == std::string::npos);
    got += bytes.size();
  }
  CHECK(stats(watcher)["session_stdout_bytes"].get<std::uint64_t>() > last);
  c.send(line({{"id", "close"}, {"session_close", {{"session", sid}}}}));
  for (;;) {
    const json a = c.answer();
    if (!a.contains("id")) continue;
    INFO(a.dump().substr(0, 600));
    REQUIRE(a["id"] == "close");
    CHECK(a["session_result"]["end"] == "closed");
    break;
  }
}

// A wake-up of the daemon's hang-up watch that is no hang-up (here an out-of-band byte, as
// a recycled descriptor state's stale event does in a busy daemon) once counted as a
// disconnect, which also kills the client's sessions: the session must live on.
TEST_CASE("a client's session survives a wake-up of the hang-up watch that is no hang-up",
          "[service][session]") {
  svctest::daemon d({"--config", session_config().string()});
  g_daemon = &d;
  svctest::client c(d.socket());
  const std::string sid = open_session(c, "cat");
  c.send_oob('!');
  c.send(line({{"id", "w"}, {"session_write", {{"session", sid}, {"text", "still here\n"}}}}));
  std::string out;
  bool eof = false;
  CHECK(answer_of(c, "w", sid, out, eof)["written"] == 11);
  // The echo comes back (stdout events have no id: read them until it is whole).
  while (out.size() < 11 && !eof) {
    auto l = c.read_line(60s);
    REQUIRE(l);
    const json ev = json::parse(*l);
    REQUIRE(ev["session"] == sid);
    if (ev.contains("stdout")) out += unbase64(ev["stdout"].get<std::string>());
    if (ev.contains("eof")) eof = true;
  }
  CHECK(out == "still here\n");
  c.send(line({{"id", "close"}, {"session_close", {{"session", sid}}}}));
  CHECK(answer_of(c, "close", sid, out, eof)["session_result"]["end"] == "closed");
  g_daemon = nullptr;
}

TEST_CASE("a client that disconnects has its sessions killed; the session caps hold",
          "[service][session]") {
  svctest::daemon d(
      {"--config", session_config().string(), "--client-max-sessions", "1", "--max-sessions", "2"});
  const auto instances = d.instances();
  REQUIRE_FALSE(instances.empty());
  {
    svctest::client c(d.socket());
    open_session(c, "cat");
    c.send(
        line({{"id", "second"},
              {"session_open", {{"ticket", session_ticket()}, {"request", {{"tool", "cat"}}}}}}));
    const json a = c.answer();
    INFO(a.dump());
    CHECK(a["error"]["code"] == "capacity");
    REQUIRE(eventually([&] { return !svctest::run_processes(instances).empty(); }, 30s));
    CHECK_FALSE(svctest::run_cgroups(instances).empty());
  }  // disconnects
  CHECK(eventually(
      [&] {
        return svctest::run_processes(instances).empty() && svctest::run_cgroups(instances).empty();
      },
      10s));
  CHECK(eventually([&] { return d.log().find("closing 1 session(s)") != std::string::npos; }, 5s));
  // The end of a client's input (it shut down its sending side) closes its sessions as well
  // (no session_close can come any more); the daemon then ends the connection.
  {
    svctest::client c(d.socket());
    open_session(c, "cat", "half-closed");
    REQUIRE(eventually([&] { return !svctest::run_processes(instances).empty(); }, 30s));
    c.shutdown_write();
    CHECK(c.closed_by_peer(30s));
  }
  CHECK(eventually(
      [&] {
        return svctest::run_processes(instances).empty() && svctest::run_cgroups(instances).empty();
      },
      10s));
  // The daemon-wide cap: two clients hold both sessions; a third is refused.
  svctest::client a(d.socket()), b(d.socket()), c(d.socket());
  CHECK(eventually([&] { return stats(c)["sessions"] == 0; }, 10s));
  open_session(a, "cat");
  open_session(b, "cat");
  c.send(line({{"id", "third"},
               {"session_open", {{"ticket", session_ticket()}, {"request", {{"tool", "cat"}}}}}}));
  const json third = c.answer();
  INFO(third.dump());
  CHECK(third["error"]["code"] == "capacity");
}

TEST_CASE("the Python client drives an MCP server through the daemon: initialize, tools/list",
          "[service][session][mcp]") {
  // The reference MCP "everything" server from the "mcp" image (tools/setup.sh builds it).
  const auto config = clitest::write_scratch("svc-sessions-mcp.json", R"({"v":1,"tools":[
    {"name":"mcp-everything","image":"mcp","binary":"/usr/bin/node",
     "args":["/opt/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js","stdio"]}
  ]})");
  svctest::daemon d({"--config", config.string()});
  const auto instances = d.instances();
  json t = svctest::ticket("sessvc");
  t["actions"] = {"tool.run"};
  t["tools"] = {"mcp-everything"};
  auto p = svctest::spawn({"/usr/bin/python3",
                           SANDBOX_SOURCE_DIR "/examples/python_client/mcp_via_daemon.py",
                           d.socket().string(), t.dump()});
  auto o = svctest::wait(p);
  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon: " << d.log());
  if (o.status != 0 && o.err.find("not installed") != std::string::npos) {
    if (clitest::must_work()) FAIL("the mcp image is not installed (tools/setup.sh builds it)");
    WARN("mcp image not installed: skipped");
    return;
  }
  REQUIRE(o.status == 0);
  const json out = json::parse(o.out);
  CHECK(out["server"] == "example-servers/everything");
  CHECK(out["protocol"] == "2024-11-05");
  const auto tools = out["tools"].get<std::vector<std::string>>();
  CHECK(std::find(tools.begin(), tools.end(), "echo") != tools.end());
  CHECK(out["session_result"]["end"] == "closed");
  CHECK(out["session_result"]["result"]["code"] == "ok");
  // Nothing of the server is left.
  CHECK(eventually(
      [&] {
        return svctest::run_processes(instances).empty() && svctest::run_cgroups(instances).empty();
      },
      10s));
}

// --- end of input while a session_open is in progress ------------------------------------------
//
// With one scheduler slot, a second session_open waits in the queue until the first session
// ends, and the first ends only when the client's input ends (close_sessions): so the second
// opens, deterministically, after the daemon's "closing sessions" step ran. It must be closed
// at once (kill-and-confirm), and the connection (or the stdio daemon) must then finish. The
// second server is `flood`, a chatty server that never idles: left open, it would live to its
// max_lifetime holding the only slot.

namespace {

json open_line(const std::string& id, const std::string& tool) {
  return {
      {"id", id},
      {"session_open",
       {{"ticket", session_ticket()}, {"request", {{"tool", tool}, {"idle_timeout_ms", 600000}}}}}};
}

/// What a client read from the daemon until the end: the answers by id, the sessions that
/// sent their eof event, and their stdout bytes.
struct transcript {
  std::map<std::string, json> answers;
  std::set<std::string> eof;
  std::map<std::string, std::size_t> stdout_bytes;
  bool ended = false;  ///< the whole input was read to its end

  void add(const std::string& l) {
    const json a = json::parse(l);
    if (a.contains("id")) {
      answers[a["id"].is_string() ? a["id"].get<std::string>() : "null"] = a;
    } else if (a.contains("eof")) {
      eof.insert(a["session"].get<std::string>());
    } else {
      stdout_bytes[a["session"].get<std::string>()] += a["stdout"].get<std::string>().size();
    }
  }

  /// Checks the two sessions `a` (cat) and `b` (flood): both answered with a session id, and
  /// `log` (the daemon's) says both were closed by the daemon ("closed (closed)": neither idle
  /// timeout nor max_lifetime). No eof event is required: a session killed before its stdout
  /// ended has none.
  void check_both_closed(const std::string& log) const {
    INFO("answers: " << json(answers).dump().substr(0, 2000));
    REQUIRE(answers.count("a") == 1);
    REQUIRE(answers.count("b") == 1);
    REQUIRE(answers.at("a").contains("session"));
    REQUIRE(answers.at("b").contains("session"));
    CHECK(answers.size() == 2);
    for (const char* id : {"a", "b"}) {
      const std::string sid = answers.at(id)["session"].get<std::string>();
      CHECK(log.find("session " + sid + " closed (closed)") != std::string::npos);
    }
  }
};

}  // namespace

TEST_CASE(
    "a session_open that completes after the client's input ended is closed at once; "
    "the connection then ends",
    "[service][session][eof]") {
  svctest::daemon d({"--config", session_config().string(), "--max-running", "1",
                     "--max-session-slots", "2",  // the one slot binds, not the session cap
                     "--queue-deadline-ms", "120000"});
  g_daemon = &d;
  const auto instances = d.instances();
  REQUIRE_FALSE(instances.empty());
  svctest::client c(d.socket());
  c.send(line(open_line("a", "cat")) + line(open_line("b", "flood")));
  c.shutdown_write();
  // Everything until the daemon closes the connection; a session left open would keep it
  // open (flood never stops), so the bound is on the whole transcript.
  transcript t;
  const auto end = std::chrono::steady_clock::now() + 180s;
  while (std::chrono::steady_clock::now() < end) {
    auto l = c.read_line(60s);
    if (!l) {
      t.ended = c.closed_by_peer(1s);  // EOF, not 60 s of silence
      break;
    }
    t.add(*l);
  }
  INFO("daemon log:\n" << d.log());
  REQUIRE(std::chrono::steady_clock::now() < end);
  CHECK(t.ended);
  REQUIRE(eventually([&] { return d.log().find(": done") != std::string::npos; }, 30s));
  t.check_both_closed(d.log());
  CHECK(d.log().find("opened after end of input; closing it") != std::string::npos);
  CHECK(d.log().find("(idle_timeout)") == std::string::npos);
  CHECK(d.log().find("(max_lifetime)") == std::string::npos);
  CHECK(eventually(
      [&] {
        return svctest::run_processes(instances).empty() && svctest::run_cgroups(instances).empty();
      },
      30s));
  // The slot is free again: a new client's session opens.
  svctest::client again(d.socket());
  open_session(again, "cat", "again");
  g_daemon = nullptr;
}

TEST_CASE(
    "stdio mode: a session_open that completes after the end of stdin is closed at once; "
    "the daemon exits 0",
    "[service][session][eof]") {
  const std::filesystem::path state = clitest::scratch() / "state-stdio-eof";
  std::vector<std::string> args = {"serve",
                                   "--stdio",
                                   "-v",
                                   "--config",
                                   session_config().string(),
                                   "--max-running",
                                   "1",
                                   "--max-session-slots",  // the one slot binds
                                   "2",
                                   "--queue-deadline-ms",
                                   "120000"};
  const auto f = svctest::store_flags(state);
  args.insert(args.end(), f.begin(), f.end());
  // Without the fix the daemon never exits: killed at the limit (status 137).
  auto o =
      clitest::sandboxctl(args, line(open_line("a", "cat")) + line(open_line("b", "flood")), 120s);
  INFO("stderr: " << o.err << "\nstdout (start): " << o.out.substr(0, 2000));
  CHECK(o.status == 0);
  transcript t;
  std::istringstream lines(o.out);
  std::string l;
  while (std::getline(lines, l)) t.add(l);
  t.check_both_closed(o.err);
  CHECK(o.err.find("opened after end of input; closing it") != std::string::npos);
  CHECK(o.err.find("(idle_timeout)") == std::string::npos);
  CHECK(o.err.find("(max_lifetime)") == std::string::npos);
}

TEST_CASE(
    "session_open: a duration <= 0 and an unknown tool are refused under the request's "
    "wire names",
    "[service][session]") {
  svctest::daemon d({"--config", session_config().string()});
  svctest::client c(d.socket());
  auto refusal = [&](const json& request) {
    c.send(line(
        {{"id", "o"}, {"session_open", {{"ticket", session_ticket()}, {"request", request}}}}));
    const json a = c.answer();
    INFO(a.dump());
    REQUIRE(a["id"] == "o");
    CHECK(a["error"]["code"] == "invalid_request");
    return a["error"]["message"].get<std::string>();
  };
  for (std::int64_t v : {0LL, -1LL, -9223372036854775807LL - 1}) {
    CHECK(refusal({{"tool", "cat"}, {"max_lifetime_ms", v}}) ==
          "session_open.request: max_lifetime_ms: must be > 0");
    CHECK(refusal({{"tool", "cat"}, {"idle_timeout_ms", v}}) ==
          "session_open.request: idle_timeout_ms: must be > 0");
  }
  CHECK(refusal({{"tool", "nope"}}) ==
        "session_open.request: tool: no registered tool named 'nope'");
  CHECK(stats(c)["sessions"] == 0);
}

TEST_CASE(
    "the Python client: a timed-out open_session leaves no session; readline's timeout "
    "and line bound end the call without losing bytes",
    "[service][session][python]") {
  svctest::daemon d({"--config", session_config().string(), "--max-running", "1",
                     "--max-session-slots", "2",  // the one slot binds, not the session cap
                     "--queue-deadline-ms", "120000"});
  const auto instances = d.instances();
  auto p = svctest::spawn({"/usr/bin/python3",
                           SANDBOX_SOURCE_DIR "/examples/python_client/session_limits_test.py",
                           "--socket", d.socket().string()});
  auto o = svctest::wait(p, 300s);
  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon: " << d.log());
  CHECK(o.status == 0);
  CHECK(o.out.find("FAIL") == std::string::npos);
  CHECK(o.out.find("ok   timed-out open: its session is closed once it opened") !=
        std::string::npos);
  CHECK(o.out.find("ok   readline(max_bytes): the bytes read are kept for read()") !=
        std::string::npos);
  CHECK(d.log().find("(idle_timeout)") == std::string::npos);
  CHECK(eventually(
      [&] {
        return svctest::run_processes(instances).empty() && svctest::run_cgroups(instances).empty();
      },
      30s));
}

TEST_CASE("a session through the daemon obeys its ticket's max_timeout_ms and expires_at",
          "[service][session][ticket]") {
  svctest::daemon d({"--config", session_config().string()});
  g_daemon = &d;
  svctest::client c(d.socket());
  // Opens `cat` under `ticket`, waits for its output's end (the session ends by itself: it
  // never idles out within the daemon's 2 min default), then closes it for its result.
  auto live_until_end = [&](const json& ticket, const std::string& tag) {
    c.send(line({{"id", "open-" + tag},
                 {"session_open", {{"ticket", ticket}, {"request", {{"tool", "cat"}}}}}}));
    const json a = c.answer();
    INFO(a.dump());
    REQUIRE(a.contains("session"));
    const std::string sid = a["session"];
    std::string out;
    bool eof = false;
    answer_of(c, "", sid, out, eof);  // the eof event: the server was killed
    CHECK(eof);
    c.send(line({{"id", "close-" + tag}, {"session_close", {{"session", sid}}}}));
    return answer_of(c, "close-" + tag, sid, out, eof)["session_result"];
  };
  {
    json t = session_ticket();
    t["max_timeout_ms"] = 1000;
    const json r = live_until_end(t, "short");
    INFO(r.dump());
    CHECK(r["end"] == "max_lifetime");
    CHECK(r["result"]["code"] == "timeout");
    CHECK(r["result"]["timeout_ms"] == 1000);
  }
  {
    json t = session_ticket();
    const auto at = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() + 3s);
    std::tm tm{};
    ::gmtime_r(&at, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    t["expires_at"] = buf;
    const json r = live_until_end(t, "expiring");
    INFO(r.dump());
    CHECK(r["end"] == "ticket_expired");
    CHECK(r["result"]["code"] == "timeout");
    CHECK(r["result"]["timeout_ms"].get<std::int64_t>() <= 3000);
  }
}
