// Sessions' stdio at every level (sandbox/session.hpp): the server gets an ordinary pipe as
// its stdin whatever carries the bytes to it (a pipe from the host, or under gVisor packets on
// sandbox-init's control stream), cannot reach that control channel from inside — a forged
// stdin_ack written to PID 1's descriptors would let it claim credit it never earned — and
// the bytes arrive exactly (NULs, every byte value, more than the host's buffer and the
// credit window), then EOF at close_stdin. The server is the suite's "session-probe" entry
// (backends.cpp); its report is checked against what the host itself saw.
#include <boost/asio/buffer.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "conformance/suite.hpp"

using nlohmann::json;
using sandbox::code;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

/// tool.run for the probe, at the backend's own level (the entry asks for process only).
sandbox::ticket probe_ticket(sandbox::isolation level) {
  return sandbox::ticket_issuer{}
      .issue(
          {.id = "conformance-session",
           .tenant = "conformance",
           .execute = false,
           .isolation = level,
           .max_timeout = 600000ms,  // a session's lifetime ceiling (several servers start slowly)
           .max_memory_bytes = 1ULL << 30,
           .tools = {conformance::session_probe_tool_name}})
      .value();
}

// Reads until `pending` holds a newline (or EOF/error); returns the line.
std::string read_line(sandbox::session& s, std::string& pending) {
  std::vector<char> buf(65536);
  while (pending.find('\n') == std::string::npos) {
    std::promise<std::pair<boost::system::error_code, std::size_t>> p;
    s.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
      p.set_value({ec, n});
    });
    auto [ec, n] = p.get_future().get();
    pending.append(buf.data(), n);
    if (ec) break;
  }
  const auto nl = pending.find('\n');
  std::string line = pending.substr(0, nl);
  pending.erase(0, nl == std::string::npos ? pending.size() : nl + 1);
  return line;
}

}  // namespace

TEST_CASE("session stdio: a plain pipe inside, the control channel out of reach, bytes exact",
          "[session][core]") {
  CONFORMANCE_BACKEND(b);
  auto st = b.rt()
                .async_open_session({.tool = conformance::session_probe_tool_name},
                                    probe_ticket(b.profile().level), asio::use_future)
                .get();
  INFO("open: code=" << to_string(st.code) << " message=" << st.message);
  REQUIRE(st.code == code::ok);
  REQUIRE(st.session);
  auto& s = *st.session;
  std::string pending;

  // 1. From inside: stdin is a pipe; sandbox-init's descriptors cannot be opened; the server
  //    holds nothing beyond 0-2.
  const std::string line = read_line(s, pending);
  const auto report = json::parse(line, nullptr, false);
  INFO("report: " << line);
  if (!report.is_object()) {
    auto r = s.async_close(asio::use_future).get();
    FAIL("no report; the server's stderr: " << r.result.std_err.summary);
  }
  CHECK(report["stdin_fifo"] == true);
  // PID 1's control channel (fd 3) cannot be opened at any level; where PID 1's descriptors
  // are visible at all (gVisor has no hidepid), its 0 and 1 are /dev/null by then.
  CHECK(report["ctl"]["/proc/1/fd/3"].get<std::string>().rfind("opened", 0) != 0);
  for (const auto& [path, what] : report["ctl"].items()) {
    INFO(path << ": " << what);
    const auto w = what.get<std::string>();
    CHECK((w.rfind("opened", 0) != 0 || w == "opened /dev/null"));
  }
  CHECK(report["fds"].empty());

  // 2. Bytes exact both ways, past the host's buffer and the credit window, then EOF.
  std::string data(200 * 1024 + 13, '\0');
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<char>((i * 131 + i / 256) & 0xff);
  for (std::size_t i = 0; i < data.size(); i += 97) data[i] = '\0';
  std::promise<std::pair<boost::system::error_code, std::size_t>> wrote;
  s.async_write(asio::buffer(data), [&](boost::system::error_code ec, std::size_t n) {
    wrote.set_value({ec, n});
  });
  std::thread closer([&] {
    auto [ec, n] = wrote.get_future().get();
    CHECK(!ec);
    CHECK(n == data.size());
    s.close_stdin();
  });
  const std::string tail = "eof " + std::to_string(data.size()) + "\n";
  std::vector<char> buf(65536);
  while (pending.size() < data.size() + tail.size()) {
    std::promise<std::pair<boost::system::error_code, std::size_t>> p;
    s.async_read_some(asio::buffer(buf), [&](boost::system::error_code ec, std::size_t n) {
      p.set_value({ec, n});
    });
    auto [ec, n] = p.get_future().get();
    pending.append(buf.data(), n);
    if (ec) break;
  }
  closer.join();
  REQUIRE(pending.size() == data.size() + tail.size());
  CHECK(pending.compare(0, data.size(), data) == 0);
  CHECK(pending.substr(data.size()) == tail);
  // Where stdin travels as control-stream frames (gvisor, microvm), the count moves on the
  // init's acks, which may arrive after the echo (another channel): wait for them, bounded.
  for (int i = 0; i < 500 && s.stats().bytes_to_server < data.size(); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  CHECK(s.stats().bytes_to_server == data.size());
  CHECK(!s.stats().ended);  // EOF was close_stdin's, not the server's end

  auto r = s.async_close(asio::use_future).get();
  INFO("session: end=" << to_string(r.end) << " code=" << to_string(r.result.code)
                       << " message=" << r.result.message);
  CHECK(r.end == sandbox::session_end::closed);
  CHECK(r.result.code == code::ok);
  CHECK(r.result.isolation == b.profile().level);
  CHECK(r.bytes_to_server == data.size());
  st.session.reset();
}
