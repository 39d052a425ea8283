// The Streamable HTTP transport of `sandboxctl mcp` (src/mcp/http_transport.hpp), driven over
// a real unix socket (and loopback TCP for the Host check) by a raw HTTP client, with the
// fake backend behind the runtime: every framing edge case gets its status and JSON-RPC
// error, and a disconnect, a DELETE or the server's stop end the runs in flight.
#include "mcp/http_transport.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "sandbox/testing/fake_backend.hpp"
#include "unit/runtime/runtime_test_support.hpp"

namespace {

namespace asio = boost::asio;
namespace mcp = sandbox::mcp;
using json = nlohmann::json;
using namespace std::chrono_literals;

// One parsed HTTP response; status 0 when the server closed the connection instead.
struct reply {
  int status = 0;
  std::map<std::string, std::string> headers;  ///< names lowercased
  std::string body;
  json rpc() const { return json::parse(body); }
};

// A blocking HTTP/1.1 client on one connection (unix socket or loopback TCP). Reads time out
// after 20 s, so that a server that hangs fails the test instead of hanging it.
class client {
 public:
  explicit client(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    set_timeout();
  }
  explicit client(unsigned short port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    set_timeout();
  }
  client(const client&) = delete;
  ~client() { close(); }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send(std::string_view bytes) {
    while (!bytes.empty()) {
      const auto n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;  // the server closed: the reply says so
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  // The next response, or status 0 at EOF.
  reply read() {
    reply r;
    std::size_t end;
    while ((end = in_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) return r;
    }
    std::string head = in_.substr(0, end);
    in_.erase(0, end + 4);
    r.status = std::stoi(head.substr(9, 3));
    std::size_t pos = head.find("\r\n");
    while (pos != std::string::npos) {
      const auto next = head.find("\r\n", pos + 2);
      const auto line = head.substr(pos + 2, next == std::string::npos ? next : next - pos - 2);
      const auto colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
      pos = next;
    }
    const auto length = std::stoul(r.headers.count("content-length") ? r.headers["content-length"]
                                                                     : std::string("0"));
    while (in_.size() < length) {
      if (!fill()) return {};
    }
    r.body = in_.substr(0, length);
    in_.erase(0, length);
    return r;
  }

  // Whether the server closed the connection (EOF or reset) with nothing more to read.
  bool closed_by_server() {
    if (!in_.empty()) return false;
    return !fill();
  }

 private:
  void set_timeout() {
    timeval tv{.tv_sec = 20, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  bool fill() {
    char buf[65536];
    const auto n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<std::size_t>(n));
    return true;
  }
  int fd_ = -1;
  std::string in_;
};

const std::string accept_both = "Accept: application/json, text/event-stream\r\n";

// A POST of `body` to /mcp with the right headers plus `extra` (whole header lines).
std::string post(const std::string& body, const std::string& extra = "",
                 const std::string& accept = accept_both) {
  return "POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + accept +
         extra + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string rpc(const json& id, const std::string& method, json params = json::object()) {
  json m{{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}};
  if (!id.is_null()) m["id"] = id;
  return m.dump();
}

const json init_params = {{"protocolVersion", "2025-06-18"},
                          {"capabilities", json::object()},
                          {"clientInfo", {{"name", "unit"}, {"version", "1"}}}};

std::string session_header(const std::string& sid) { return "Mcp-Session-Id: " + sid + "\r\n"; }

std::string hold_call(int id) {
  return rpc(id, "tools/call",
             {{"name", "run_code"}, {"arguments", {{"runtime", "python3"}, {"source", "hold"}}}});
}

// The transport on a unix socket (or TCP) over a runtime with the fake backend, its
// io_context run by a thread of its own. Runs whose source contains "hold" last 60 s unless
// cancelled.
struct http_bed {
  explicit http_bed(mcp::http_options o = {}, std::size_t max_in_flight = 16) {
    fake->on_source_contains("hold").respond({.delay = 60s});
    fake->otherwise().respond_stdout("42\n");
    sandbox::runtime_options ro;
    ro.blobs = sandbox::make_memory_blob_store();
    ro.fixed_digests = {{"python3", sandbox::testing::fake_digest("python3")}};
    ro.process_backend = false;
    auto r = sandbox::runtime::create(io.get_executor(), std::move(ro));
    REQUIRE(r.has_value());
    rt.emplace(std::move(*r));
    rt->add_backend(fake);
    context.emplace(mcp::server_context{.runtime = *rt,
                                        .ticket = ticket,
                                        .executor = io.get_executor(),
                                        .max_in_flight = max_in_flight});
    dir = std::filesystem::temp_directory_path() /
          ("mcp-http-" + std::to_string(::getpid()) + "-" + std::to_string(++counter));
    std::filesystem::create_directories(dir);
    if (!o.tcp) o.socket_path = (dir / "mcp.sock").string();
    path = o.socket_path;
    o.listening = [this](const std::string& address) {
      if (address.rfind("http://", 0) == 0) {
        port = static_cast<unsigned short>(
            std::stoul(address.substr(address.rfind(':') + 1, address.find("/mcp"))));
      }
    };
    t = mcp::make_http_transport(*context, std::move(o));
    REQUIRE(t->start([] {}));
    thread = std::thread([this] { io.run(); });
  }

  // Stops the transport (every run cancelled and confirmed gone) and waits for it.
  void stop() {
    if (!thread.joinable()) return;
    asio::post(io, [this] { t->async_stop([this] { io.stop(); }); });
    thread.join();
  }

  ~http_bed() {
    stop();
    t.reset();
    rt.reset();
    std::filesystem::remove_all(dir);
  }

  // A new initialized session; its id.
  std::string open_session() {
    client c(path);
    c.send(post(rpc(1, "initialize", init_params)));
    auto r = c.read();
    REQUIRE(r.status == 200);
    REQUIRE(r.headers.count("mcp-session-id") == 1);
    return r.headers["mcp-session-id"];
  }

  inline static int counter = 0;
  std::shared_ptr<sandbox::testing::fake_backend> fake =
      std::make_shared<sandbox::testing::fake_backend>();
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::optional<sandbox::runtime> rt;
  sandbox::ticket ticket = sandbox::test::make_ticket();
  std::optional<mcp::server_context> context;
  std::unique_ptr<mcp::transport> t;
  std::filesystem::path dir;
  std::string path;
  unsigned short port = 0;
  std::thread thread;
};

}  // namespace

TEST_CASE("mcp http: --http takes loopback addresses only", "[mcp][http]") {
  auto ok = mcp::parse_loopback_address("127.0.0.1:0");
  REQUIRE(std::holds_alternative<asio::ip::tcp::endpoint>(ok));
  CHECK(std::get<asio::ip::tcp::endpoint>(ok).port() == 0);
  auto v6 = mcp::parse_loopback_address("[::1]:8080");
  REQUIRE(std::holds_alternative<asio::ip::tcp::endpoint>(v6));
  CHECK(std::get<asio::ip::tcp::endpoint>(v6).address().to_string() == "::1");
  for (const char* bad : {"0.0.0.0:80", "192.168.1.2:80", "[::]:80", "localhost:80", "127.0.0.1",
                          "127.0.0.1:70000", "::1:80", ""}) {
    INFO(bad);
    CHECK(std::holds_alternative<std::string>(mcp::parse_loopback_address(bad)));
  }
  CHECK_THAT(std::get<std::string>(mcp::parse_loopback_address("0.0.0.0:80")),
             Catch::Contains("not a loopback address"));
}

TEST_CASE("mcp http: Host, Origin and Accept checks", "[mcp][http]") {
  CHECK(mcp::is_loopback_host("127.0.0.1:8080", 8080));
  CHECK(mcp::is_loopback_host("localhost", 8080));
  CHECK(mcp::is_loopback_host("[::1]:8080", 8080));
  CHECK_FALSE(mcp::is_loopback_host("127.0.0.1:8081", 8080));
  CHECK_FALSE(mcp::is_loopback_host("evil.example:8080", 8080));
  CHECK_FALSE(mcp::is_loopback_host("", 8080));

  CHECK(mcp::is_loopback_origin("http://localhost:6274"));
  CHECK(mcp::is_loopback_origin("https://127.0.0.1"));
  CHECK(mcp::is_loopback_origin("http://[::1]:3000"));
  CHECK_FALSE(mcp::is_loopback_origin("null"));
  CHECK_FALSE(mcp::is_loopback_origin("http://evil.example"));
  CHECK_FALSE(mcp::is_loopback_origin("http://localhost.evil.example"));
  CHECK_FALSE(mcp::is_loopback_origin("file://localhost"));

  CHECK(mcp::accepts_json_and_sse("application/json, text/event-stream"));
  CHECK(mcp::accepts_json_and_sse("text/event-stream;q=0.9,Application/JSON"));
  CHECK_FALSE(mcp::accepts_json_and_sse("application/json"));
  CHECK_FALSE(mcp::accepts_json_and_sse("*/*"));
  CHECK_FALSE(mcp::accepts_json_and_sse("application/json, text/event-stream;q=0"));
  CHECK_FALSE(mcp::accepts_json_and_sse(""));
}

TEST_CASE("mcp http: a session from initialize to DELETE", "[mcp][http]") {
  http_bed bed;
  client c(bed.path);
  c.send(post(rpc(1, "initialize", init_params)));
  auto init = c.read();
  REQUIRE(init.status == 200);
  CHECK(init.headers["content-type"] == "application/json");
  CHECK(init.rpc()["result"]["protocolVersion"] == "2025-06-18");
  const auto sid = init.headers["mcp-session-id"];
  CHECK(sid.size() == 64);
  CHECK(sid.find_first_not_of("0123456789abcdef") == std::string::npos);

  c.send(post(rpc(nullptr, "notifications/initialized"), session_header(sid)));
  auto note = c.read();
  CHECK(note.status == 202);
  CHECK(note.body.empty());

  c.send(post(rpc(2, "tools/call",
                  {{"name", "run_code"}, {"arguments", {{"runtime", "python3"}, {"source", "1"}}}}),
              session_header(sid) + "MCP-Protocol-Version: 2025-06-18\r\n"));
  auto call = c.read();
  REQUIRE(call.status == 200);
  CHECK(call.rpc()["id"] == 2);
  CHECK(call.rpc()["result"]["isError"] == false);

  // A response from the client (the server asks nothing): 202 as well.
  c.send(post(R"({"jsonrpc":"2.0","id":9,"result":{}})", session_header(sid)));
  CHECK(c.read().status == 202);

  SECTION("no session id: 400") {
    c.send(post(rpc(3, "ping")));
    auto r = c.read();
    CHECK(r.status == 400);
    CHECK(r.rpc()["error"]["code"] == -32600);
    CHECK(r.rpc()["id"] == 3);
  }
  SECTION("an unknown session id: 404") {
    c.send(post(rpc(3, "ping"), session_header(std::string(64, 'a'))));
    auto r = c.read();
    CHECK(r.status == 404);
    CHECK(r.rpc()["error"]["code"] == -32000);
  }
  SECTION("initialize with a session id: 400") {
    c.send(post(rpc(3, "initialize", init_params), session_header(sid)));
    CHECK(c.read().status == 400);
  }
  SECTION("DELETE ends it: later requests 404, a second DELETE 404, none without id 400") {
    c.send("DELETE /mcp HTTP/1.1\r\nHost: localhost\r\n" + session_header(sid) + "\r\n");
    CHECK(c.read().status == 204);
    c.send(post(rpc(3, "ping"), session_header(sid)));
    CHECK(c.read().status == 404);
    c.send("DELETE /mcp HTTP/1.1\r\nHost: localhost\r\n" + session_header(sid) + "\r\n");
    CHECK(c.read().status == 404);
    c.send("DELETE /mcp HTTP/1.1\r\nHost: localhost\r\n\r\n");
    CHECK(c.read().status == 400);
  }
}

TEST_CASE("mcp http: wrong method, path, Origin, version, Accept, type and body", "[mcp][http]") {
  http_bed bed;
  const auto sid = bed.open_session();
  client c(bed.path);
  auto expect = [&](const std::string& bytes, int status, int code) {
    INFO(bytes.substr(0, 200));
    c.send(bytes);
    auto r = c.read();
    CHECK(r.status == status);
    REQUIRE_FALSE(r.body.empty());
    CHECK(r.rpc()["error"]["code"] == code);
    return r;
  };
  auto get = expect("GET /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n",
                    405, -32000);
  CHECK(get.headers["allow"] == "POST, DELETE");
  expect("PUT /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n", 405, -32000);
  expect("POST /other HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n", 404, -32000);
  expect(post(rpc(1, "ping"), session_header(sid) + "Origin: http://evil.example\r\n"), 403,
         -32000);
  expect(post(rpc(1, "ping"), session_header(sid) + "Origin: null\r\n"), 403, -32000);
  expect(post(rpc(1, "ping"), session_header(sid) + "MCP-Protocol-Version: 1999-01-01\r\n"), 400,
         -32600);
  expect(post(rpc(1, "ping"), session_header(sid), ""), 406, -32600);
  expect(post(rpc(1, "ping"), session_header(sid), "Accept: application/json\r\n"), 406, -32600);
  expect("POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n" + accept_both +
             "Content-Length: 2\r\n\r\n{}",
         415, -32600);
  expect(post("[" + rpc(1, "ping") + "]", session_header(sid)), 400, -32600);
  expect(post("not json", session_header(sid)), 400, -32700);
  expect(post("", session_header(sid)), 400, -32700);
  // The connection survived every refusal above; a loopback Origin is fine.
  c.send(post(rpc(7, "ping"), session_header(sid) + "Origin: http://localhost:6274\r\n"));
  auto ok = c.read();
  CHECK(ok.status == 200);
  CHECK(ok.rpc()["id"] == 7);
}

TEST_CASE("mcp http: oversized body and headers are refused and the connection ends",
          "[mcp][http]") {
  mcp::http_options o;
  o.max_body_bytes = 1024;
  http_bed bed(o);
  {
    client c(bed.path);
    c.send("POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
           accept_both + "Content-Length: 9437184\r\n\r\n");
    auto r = c.read();
    CHECK(r.status == 413);
    CHECK(r.rpc()["error"]["code"] == -32700);
    CHECK(c.closed_by_server());
  }
  {
    client c(bed.path);  // chunked, past the cap while it streams
    c.send("POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
           accept_both + "Transfer-Encoding: chunked\r\n\r\n800\r\n" + std::string(2048, ' ') +
           "\r\n");
    CHECK(c.read().status == 413);
  }
  {
    client c(bed.path);
    c.send("POST /mcp HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + std::string(20000, 'x') +
           "\r\n\r\n");
    auto r = c.read();
    CHECK(r.status == 431);
    CHECK(c.closed_by_server());
  }
  {
    client c(bed.path);
    c.send("NOT HTTP AT ALL\r\n\r\n");
    CHECK(c.read().status == 400);
  }
}

TEST_CASE("mcp http: chunked bodies and pipelined requests", "[mcp][http]") {
  http_bed bed;
  const auto sid = bed.open_session();
  client c(bed.path);
  const auto body = rpc(5, "ping");
  const auto half = body.size() / 2;
  char size1[16];
  char size2[16];
  std::snprintf(size1, sizeof size1, "%zx", half);
  std::snprintf(size2, sizeof size2, "%zx", body.size() - half);
  c.send("POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
         accept_both + session_header(sid) + "Transfer-Encoding: chunked\r\n\r\n" + size1 + "\r\n" +
         body.substr(0, half) + "\r\n" + size2 + "\r\n" + body.substr(half) + "\r\n0\r\n\r\n");
  auto chunked = c.read();
  CHECK(chunked.status == 200);
  CHECK(chunked.rpc()["id"] == 5);

  // Three requests in one write: answered in order on the one connection.
  c.send(post(rpc(10, "ping"), session_header(sid)) +
         post(rpc(11, "tools/list"), session_header(sid)) +
         post(rpc(12, "ping"), session_header(sid)));
  CHECK(c.read().rpc()["id"] == 10);
  auto list = c.read();
  CHECK(list.rpc()["id"] == 11);
  CHECK(list.rpc()["result"]["tools"].is_array());
  CHECK(c.read().rpc()["id"] == 12);
}

TEST_CASE("mcp http: a slow client gets 408, an idle one is closed", "[mcp][http]") {
  mcp::http_options o;
  o.read_timeout = 300ms;
  http_bed bed(o);
  client slow(bed.path);
  slow.send("POST /mcp HTTP/1.1\r\nHost: loc");  // and never more
  auto r = slow.read();
  CHECK(r.status == 408);
  CHECK(slow.closed_by_server());

  client idle(bed.path);
  CHECK(idle.closed_by_server());
}

TEST_CASE("mcp http: a disconnect mid-run cancels the run", "[mcp][http]") {
  http_bed bed({}, 1);  // one call in flight per session: the slot frees only once it is gone
  const auto sid = bed.open_session();
  {
    client c(bed.path);
    c.send(post(hold_call(1), session_header(sid)));
    REQUIRE(sandbox::test::eventually([&] { return bed.fake->requests().size() == 1; }));
  }  // closed mid-run
  client again(bed.path);
  // Until the cancelled run is confirmed gone, its slot answers "capacity".
  bool freed = sandbox::test::eventually([&] {
    again.send(
        post(rpc(2, "tools/call",
                 {{"name", "run_code"}, {"arguments", {{"runtime", "python3"}, {"source", "1"}}}}),
             session_header(sid)));
    auto r = again.read();
    return r.status == 200 && r.rpc()["result"]["isError"] == false;
  });
  CHECK(freed);
}

TEST_CASE("mcp http: DELETE kills the session's runs before it answers", "[mcp][http]") {
  http_bed bed;
  const auto sid = bed.open_session();
  client running(bed.path);
  running.send(post(hold_call(1), session_header(sid)));
  REQUIRE(sandbox::test::eventually([&] { return bed.fake->requests().size() == 1; }));
  client deleting(bed.path);
  deleting.send("DELETE /mcp HTTP/1.1\r\nHost: localhost\r\n" + session_header(sid) + "\r\n");
  CHECK(deleting.read().status == 204);
  // The call in flight is not answered: its connection ends.
  CHECK(running.read().status == 0);
}

TEST_CASE("mcp http: caps on sessions and connections", "[mcp][http]") {
  mcp::http_options o;
  o.max_sessions = 2;
  o.max_connections = 2;
  http_bed bed(o);
  const auto a = bed.open_session();
  bed.open_session();
  {
    client c(bed.path);
    c.send(post(rpc(1, "initialize", init_params)));
    auto r = c.read();
    CHECK(r.status == 503);
    CHECK(r.rpc()["error"]["code"] == -32000);
  }
  // Two connections open at once are served (once the ones above are seen closed).
  std::optional<client> one;
  REQUIRE(sandbox::test::eventually([&] {
    one.emplace(bed.path);
    one->send(post(rpc(1, "ping"), session_header(a)));
    return one->read().status == 200;
  }));
  client two(bed.path);
  two.send(post(rpc(1, "ping"), session_header(a)));
  CHECK(two.read().status == 200);
  client three(bed.path);  // over max_connections: answered, then closed
  three.send(post(rpc(1, "ping"), session_header(a)));
  auto r = three.read();
  CHECK(r.status == 503);
  CHECK(r.headers["retry-after"] == "1");
  CHECK(three.closed_by_server());
}

TEST_CASE("mcp http: an idle session expires", "[mcp][http]") {
  mcp::http_options o;
  o.session_idle_timeout = 200ms;
  http_bed bed(o);
  const auto sid = bed.open_session();
  // Every request renews the session, so the test leaves it alone for a while first (five
  // times the timeout; the sweep runs every 50 ms).
  std::this_thread::sleep_for(1s);
  client c(bed.path);
  c.send(post(rpc(1, "ping"), session_header(sid)));
  CHECK(c.read().status == 404);
}

TEST_CASE("mcp http: on TCP the Host must be this loopback server", "[mcp][http]") {
  mcp::http_options o;
  o.tcp = asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0);
  http_bed bed(o);
  REQUIRE(bed.port != 0);
  client c(bed.port);
  auto with_host = [&](const std::string& host) {
    c.send("POST /mcp HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\n" +
           accept_both +
           "Content-Length: " + std::to_string(rpc(1, "initialize", init_params).size()) +
           "\r\n\r\n" + rpc(1, "initialize", init_params));
    return c.read().status;
  };
  CHECK(with_host("evil.example:" + std::to_string(bed.port)) == 403);
  CHECK(with_host("127.0.0.1:" + std::to_string(bed.port + 1)) == 403);
  CHECK(with_host("127.0.0.1:" + std::to_string(bed.port)) == 200);
  CHECK(with_host("localhost:" + std::to_string(bed.port)) == 200);
}

TEST_CASE("mcp http: stopping cancels every run and removes the socket", "[mcp][http]") {
  http_bed bed;
  const auto sid = bed.open_session();
  client running(bed.path);
  running.send(post(hold_call(1), session_header(sid)));
  REQUIRE(sandbox::test::eventually([&] { return bed.fake->requests().size() == 1; }));
  bed.stop();  // returns only once the held run completed (cancelled)
  CHECK(running.read().status == 0);
  CHECK_FALSE(std::filesystem::exists(bed.path));
}
