// `sandboxctl serve` as its clients see it: runs over the socket with their ids echoed,
// malformed lines refused without harm to the daemon, answers in completion order, host-wide
// caps shared by separate client processes, cancellation of a disconnected client's runs (no
// process or cgroup of the run remains), backpressure on a client that does not read, the
// socket's mode and life cycle, SIGTERM, stdio mode, the warm pools in `service_stats`, and
// the Python client example.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_harness.hpp"
#include "service_harness.hpp"

using nlohmann::json;
using svctest::eventually;
using svctest::python;
using svctest::run_line;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t max_line = (1U << 20) + (64U << 10);

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string message_of(const json& answer) {
  if (answer.contains("error")) return answer["error"].value("message", "");
  if (answer.contains("result")) return answer["result"].value("message", "");
  return {};
}

std::vector<std::string> with_flags(std::vector<std::string> args, const fs::path& state) {
  auto f = svctest::store_flags(state);
  args.insert(args.end(), f.begin(), f.end());
  return args;
}

}  // namespace

TEST_CASE("a run over the socket is answered with its id; the socket is mode 0660", "[service]") {
  svctest::daemon d;
  struct stat st {};
  REQUIRE(::lstat(d.socket().c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 07777) == 0660);
  CHECK(st.st_uid == ::geteuid());

  svctest::client c(d.socket());
  c.send(run_line("first", python("print(6 * 7)")));
  auto a = c.answer();
  INFO(a.dump());
  CHECK(a.size() == 2);
  CHECK(a["id"] == "first");
  REQUIRE(a.contains("result"));
  CHECK(a["result"]["code"] == "ok");
  CHECK(a["result"]["exit_code"] == 0);
  CHECK(a["result"]["stdout"]["summary"] == "42\n");
  CHECK(a["result"]["isolation"] == "process");
}

TEST_CASE("malformed lines are answered invalid_request and the daemon keeps serving",
          "[service]") {
  svctest::daemon d;
  svctest::client c(d.socket());
  auto expect_error = [&](const std::string& line, const json& id, const std::string& part) {
    c.send(line);
    auto a = c.answer();
    INFO("line: " << line.substr(0, 160) << "\nanswer: " << a.dump().substr(0, 400));
    CHECK(a["id"] == id);
    REQUIRE(a.contains("error"));
    CHECK(a["error"]["code"] == "invalid_request");
    CHECK(contains(message_of(a), part));
  };
  expect_error("{not json\n", nullptr, "malformed JSON");
  expect_error("[1,2]\n", nullptr, "expected a JSON object");
  expect_error("{\"id\":\"a\"}\x01\n", "a", "malformed JSON");
  expect_error(R"({"ticket":{},"request":{}})"
               "\n",
               nullptr, "id: required field is missing");
  expect_error(R"({"id":7,"ticket":{},"request":{}})"
               "\n",
               nullptr, "id: expected a string");
  expect_error(R"({"id":"","ticket":{},"request":{}})"
               "\n",
               nullptr, "id: expected 1 to 128");
  expect_error(json{{"id", std::string(129, 'x')}, {"ticket", {}}, {"request", {}}}.dump() + "\n",
               nullptr, "id: expected 1 to 128");
  expect_error(R"({"id":"d","id":"e","ticket":{},"request":{}})"
               "\n",
               nullptr, "duplicate field");
  expect_error(R"({"id":"u","ticket":{},"request":{},"extra":1})"
               "\n",
               "u", "unknown field 'extra'");
  expect_error(R"({"id":"m","ticket":{}})"
               "\n",
               "m", "request: required field is missing");
  expect_error(R"({"id":"b","blob_put":{"tenant":"acme","data_b64":"!!!!"}})"
               "\n",
               "b", "not valid base64");
  expect_error(R"({"id":"b","blob_put":{"tenant":"../x","data_b64":""}})"
               "\n",
               "b", "invalid tenant");
  expect_error(R"({"id":"g","blob_get":{"tenant":"acme","blob":"sha256:12"}})"
               "\n",
               "g", "blob_get.blob");
  expect_error(R"({"id":"g","blob_get":{"tenant":"acme","blob":"x"},"request":{}})"
               "\n",
               "g", "unknown field 'request'");

  // A line that does not parse but starts with a readable id ({"id":"<no escapes>"...) is
  // answered under that id: NaN, too deep, invalid UTF-8, trailing garbage, too long.
  expect_error("{\"id\":\"nan\",\"ticket\":{},\"request\":{\"timeout_ms\":NaN}}\n", "nan",
               "malformed JSON");
  expect_error(
      "  { \"id\" : \"deep\", \"x\":" + std::string(30, '[') + std::string(30, ']') + "}\n", "deep",
      "nesting deeper");
  expect_error("{\"id\":\"utf\",\"x\":\"\xff\"}\n", "utf", "UTF-8");
  expect_error("{\"id\":\"trail\"} x\n", "trail", "malformed JSON");
  expect_error(R"({"id":"big-id","request":")" + std::string(max_line, 'a') + "\"}\n", "big-id",
               "longer than");
  // ... but only an id that the rules allow, written without escapes.
  expect_error("{\"id\":\"a\\u0041\",x}\n", nullptr, "malformed JSON");
  expect_error("{\"id\":\"" + std::string(129, 'x') + "\",x}\n", nullptr, "malformed JSON");
  expect_error("{\"id\":\"\",x}\n", nullptr, "malformed JSON");
  expect_error("{\"x\":1,\"id\":\"second\",x}\n", nullptr, "malformed JSON");

  // An over-long line, sent whole: refused by its length, never parsed or buffered whole.
  std::string big = R"({"id":"big","request":")" + std::string(max_line, 'a') + "\"}\n";
  expect_error(big, "big", "longer than " + std::to_string(max_line) + " bytes");
  // One that streams in for 3 MiB before its newline: one answer, at the newline.
  c.send(std::string(3U << 20, '{'));
  c.send("\n");
  auto a = c.answer();
  CHECK(a["id"] == nullptr);
  CHECK(contains(message_of(a), "longer than"));
  c.send("{\"id\":\"stream\",\"x\":\"" + std::string(3U << 20, 'a'));
  c.send("\"}\n");
  a = c.answer();
  CHECK(a["id"] == "stream");
  CHECK(contains(message_of(a), "longer than"));

  // The documents inside are decoded as `sandboxctl run` does: a run_result with the code.
  c.send(run_line("r1", {{"runtime", "python3"}, {"source", "x"}, {"bogus", 1}}));
  a = c.answer();
  CHECK(a["id"] == "r1");
  CHECK(a["result"]["code"] == "invalid_request");
  CHECK(contains(message_of(a), "request: unknown field 'bogus'"));
  c.send(
      json{{"id", "t1"}, {"ticket", {{"tenant", "acme"}}}, {"request", python("print(1)")}}.dump() +
      "\n");
  a = c.answer();
  CHECK(a["id"] == "t1");
  CHECK(a["result"]["code"] == "invalid_request");
  CHECK(contains(message_of(a), "ticket: "));
  c.send(run_line("big-source", python(std::string(40000, '#'))));
  a = c.answer();
  CHECK(a["result"]["code"] == "source_too_large");

  // Blob requests: another tenant's blob is not found, like an absent one.
  c.send(json{{"id", "p"}, {"blob_put", {{"tenant", "acme"}, {"data_b64", svctest::base64("hi")}}}}
             .dump() +
         "\n");
  a = c.answer();
  REQUIRE(a.contains("blob"));
  const std::string blob = a["blob"];
  c.send(json{{"id", "q"}, {"blob_get", {{"tenant", "other"}, {"blob", blob}}}}.dump() + "\n");
  a = c.answer();
  CHECK(a["error"]["code"] == "blob_not_found");
  c.send(json{{"id", "r"}, {"blob_get", {{"tenant", "acme"}, {"blob", blob}}}}.dump() + "\n");
  a = c.answer();
  CHECK(a["data_b64"] == svctest::base64("hi"));

  // An id still in flight cannot be reused; the refusal is answered with id null (under
  // "dup", a client would take it for the first request's answer), naming the id.
  c.send(run_line("dup", python("import time\ntime.sleep(1.5)\nprint('dup')")));
  c.send(run_line("dup", python("print(2)")));
  a = c.answer();
  CHECK(a["id"] == nullptr);
  CHECK(a["error"]["code"] == "invalid_request");
  CHECK(contains(message_of(a), "id 'dup' is still in flight"));
  // A line that does not parse but starts with that id is not answered under it either.
  c.send("{\"id\":\"dup\",\"x\":NaN}\n");
  a = c.answer();
  CHECK(a["id"] == nullptr);
  CHECK(a["error"]["code"] == "invalid_request");
  a = c.answer();
  CHECK(a["id"] == "dup");
  CHECK(a["result"]["stdout"]["summary"] == "dup\n");
  // Every id is shown escaped in the message.
  c.send(run_line("sl", python("import time\ntime.sleep(1.5)")));
  c.send(run_line("sl", python("print(2)")));
  c.send(run_line("e\u202e\x01", python("import time\ntime.sleep(1.5)")));
  c.send(run_line("e\u202e\x01", python("print(2)")));
  std::vector<json> got;
  for (int i = 0; i < 4; ++i) got.push_back(c.answer());
  int refusals = 0;
  for (const auto& g : got) {
    if (!g.contains("error")) continue;
    ++refusals;
    CHECK(g["id"] == nullptr);
    const std::string m = message_of(g);
    CHECK((contains(m, "id 'sl' is") || contains(m, "id 'e\\u202e\\x01' is")));
    CHECK_FALSE(contains(m, "\u202e"));
  }
  CHECK(refusals == 2);

  // After all that, the same connection and a new one still run code.
  c.send(run_line("after", python("print('still here')")));
  a = c.answer();
  CHECK(a["id"] == "after");
  CHECK(a["result"]["code"] == "ok");
  CHECK(a["result"]["stdout"]["summary"] == "still here\n");
  svctest::client c2(d.socket());
  c2.send(run_line("other", python("print('new connection')")));
  CHECK(c2.answer()["result"]["stdout"]["summary"] == "new connection\n");
}

TEST_CASE("concurrent runs complete out of order, each answer with its own id", "[service]") {
  svctest::daemon d;
  svctest::client c(d.socket());
  c.send(run_line("slow", python("import time\ntime.sleep(3)\nprint('slow')")));
  for (int i = 1; i <= 3; ++i) {
    const std::string id = "fast-" + std::to_string(i);
    c.send(run_line(id, python("print('" + id + "')")));
  }
  std::vector<std::string> order;
  std::map<std::string, json> results;
  for (int i = 0; i < 4; ++i) {
    auto a = c.answer();
    REQUIRE(a.contains("result"));
    order.push_back(a["id"]);
    results[a["id"]] = a["result"];
  }
  INFO("completion order: " << json(order).dump());
  CHECK(order.front() != "slow");
  CHECK(order.back() == "slow");
  REQUIRE(results.size() == 4);
  for (const auto& [id, r] : results) {
    INFO(id);
    CHECK(r["code"] == "ok");
    CHECK(r["stdout"]["summary"] == id + "\n");
  }
}

TEST_CASE("two client processes share one daemon's caps", "[service]") {
  svctest::daemon d({"--max-running", "1"});
  // Each client process connects, says it is ready, waits for "go", then runs a snippet
  // that prints when it started and ended (host clock) and prints its run_result.
  const std::string script = R"py(
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from agent_sandbox import Client
sock, ready, go, ticket = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
src = "import time\ns = time.time()\ntime.sleep(1)\nprint(s, time.time())\n"
with Client(sock) as sb:
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.002)
    result = sb.run(ticket, {"runtime": "python3", "source": src}, timeout=120)
    print(json.dumps(result.to_json()))
)py";
  const fs::path go = clitest::scratch() / "go";
  std::vector<svctest::process> procs;
  std::vector<fs::path> ready;
  for (int i = 0; i < 2; ++i) {
    ready.push_back(clitest::scratch() / ("ready-" + std::to_string(i)));
    procs.push_back(svctest::spawn({"/usr/bin/python3", "-c", script,
                                    SANDBOX_SOURCE_DIR "/clients/python/src", d.socket().string(),
                                    ready.back().string(), go.string(), svctest::ticket().dump()}));
  }
  REQUIRE(eventually([&] { return fs::exists(ready[0]) && fs::exists(ready[1]); }, 60s));
  clitest::write_scratch("go", "");
  std::vector<json> results;
  for (const auto& p : procs) {
    auto o = svctest::wait(p);
    INFO("client stdout: " << o.out << "\nstderr: " << o.err);
    REQUIRE(o.status == 0);
    results.push_back(json::parse(o.out));
  }
  for (const auto& r : results) REQUIRE(r["code"] == "ok");
  // With one slot host-wide, the second run waited for the whole first one: the runs do
  // not overlap, and the second's queue wait covers the first's duration.
  std::sort(results.begin(), results.end(), [](const json& a, const json& b) {
    return a["queue_wait_ms"].get<std::int64_t>() < b["queue_wait_ms"].get<std::int64_t>();
  });
  const json& first = results[0];
  const json& second = results[1];
  INFO("first: " << first.dump().substr(0, 600) << "\nsecond: " << second.dump().substr(0, 600));
  double s1 = 0, e1 = 0, s2 = 0, e2 = 0;
  std::istringstream(first["stdout"]["summary"].get<std::string>()) >> s1 >> e1;
  std::istringstream(second["stdout"]["summary"].get<std::string>()) >> s2 >> e2;
  CHECK(s2 >= e1);
  CHECK(second["queue_wait_ms"].get<std::int64_t>() >=
        first["usage"]["wall_ms"].get<std::int64_t>());
}

TEST_CASE("a run queued past the daemon's queue deadline ends queue_timeout", "[service]") {
  svctest::daemon d({"--max-running", "1", "--queue-deadline-ms", "300"});
  const auto instances = d.instances();
  REQUIRE_FALSE(instances.empty());
  svctest::client a(d.socket());
  a.send(run_line("long", python("import time\ntime.sleep(3)\nprint('long')")));
  // Once the first run holds the only slot (its cgroup exists), the second must queue.
  REQUIRE(eventually([&] { return !svctest::run_cgroups(instances).empty(); }, 30s));
  svctest::client b(d.socket());
  b.send(run_line("late", python("print('late')")));
  auto late = b.answer();
  INFO(late.dump());
  CHECK(late["id"] == "late");
  CHECK(late["result"]["code"] == "queue_timeout");
  CHECK(late["result"]["queue"]["position"] == 1);
  CHECK(contains(message_of(late), "in the queue without a free slot"));
  auto first = a.answer();
  CHECK(first["id"] == "long");
  CHECK(first["result"]["code"] == "ok");
}

TEST_CASE("service_stats lists the warm pools with their figures and a stopped class's error",
          "[service][pool]") {
  // Two process-level python3 classes: a plain one of one instance at the default memory
  // limit (which a request that leaves it unset matches), and a pre-started one of 128 MiB
  // whose preload list names a module the image lacks, so it stops at its first preparation.
  const auto config = clitest::write_scratch(
      "svc-pools.json",
      R"({"v":1,"warm_pool":[{"runtime":"python3","size":1},)"
      R"({"runtime":"python3","size":2,"memory_limit_bytes":134217728,"prestart":true,)"
      R"("preload":["json","os.nope"]}]})");
  svctest::daemon d({"--config", config.string()});
  svctest::client c(d.socket());
  int asked = 0;
  // The `pools` member, its objects' members in the order the daemon wrote them.
  auto pools = [&] {
    const std::string id = "stats-" + std::to_string(++asked);
    c.send(json{{"id", id}, {"service_stats", json::object()}}.dump() + "\n");
    const auto l = c.read_line();
    REQUIRE(l.has_value());
    auto a = nlohmann::ordered_json::parse(*l);
    REQUIRE(a["id"] == id);
    return a["service_stats"]["pools"];
  };
  auto members = [](const nlohmann::ordered_json& o) {
    std::vector<std::string> out;
    for (auto it = o.begin(); it != o.end(); ++it) out.push_back(it.key());
    return out;
  };
  nlohmann::ordered_json p;
  const bool settled = eventually(
      [&] {
        p = pools();
        return p.size() == 2 && p[0]["ready"] == 1 && p[1].contains("error") &&
               p[1]["starting"] == 0;
      },
      60s);
  INFO(p.dump() << "\ndaemon log:\n" << d.log());
  REQUIRE(settled);
  const std::vector<std::string> order{"isolation", "runtime",  "memory_limit_bytes", "size",
                                       "ready",     "starting", "handed_out",         "failed"};
  CHECK(members(p[0]) == order);
  CHECK(p[0]["isolation"] == "process");
  CHECK(p[0]["runtime"] == "python3");
  CHECK(p[0]["memory_limit_bytes"] == 268435456);
  CHECK(p[0]["size"] == 1);
  CHECK(p[0]["starting"] == 0);
  CHECK(p[0]["handed_out"] == 0);
  CHECK(p[0]["failed"] == 0);
  auto with_error = order;
  with_error.emplace_back("error");
  CHECK(members(p[1]) == with_error);
  CHECK(p[1]["isolation"] == "process");
  CHECK(p[1]["memory_limit_bytes"] == 134217728);
  CHECK(p[1]["size"] == 2);
  CHECK(p[1]["ready"] == 0);
  CHECK(p[1]["handed_out"] == 0);
  CHECK(p[1]["failed"].get<std::uint64_t>() >= 1);
  CHECK(contains(p[1]["error"].get<std::string>(),
                 "importing preload module 'os.nope' raised 'ModuleNotFoundError: No module "
                 "named 'os.nope'"));
  const auto failed = p[1]["failed"].get<std::uint64_t>();

  // A run of the plain class is handed its instance, which is refilled; one of the stopped
  // class runs cold, and the class stays as it was.
  c.send(run_line("warm", python("print('warm')")));
  auto warm = c.answer();
  INFO(warm.dump());
  CHECK(warm["result"]["code"] == "ok");
  auto cold_request = python("print('cold')");
  cold_request["memory_limit_bytes"] = 134217728;
  c.send(run_line("cold", cold_request));
  auto cold = c.answer();
  INFO(cold.dump());
  CHECK(cold["result"]["code"] == "ok");
  CHECK(cold["result"]["stdout"]["summary"] == "cold\n");
  const bool refilled = eventually(
      [&] {
        p = pools();
        return p.size() == 2 && p[0]["handed_out"] == 1 && p[0]["ready"] == 1;
      },
      60s);
  INFO(p.dump());
  REQUIRE(refilled);
  CHECK(p[0]["failed"] == 0);
  CHECK(p[1]["handed_out"] == 0);
  CHECK(p[1]["ready"] == 0);
  CHECK(p[1]["starting"] == 0);
  CHECK(p[1]["failed"] == failed);
}

TEST_CASE("a client that disconnects has its runs killed", "[service]") {
  svctest::daemon d;
  const auto instances = d.instances();
  REQUIRE_FALSE(instances.empty());
  {
    svctest::client c(d.socket());
    c.send(run_line("long", python("import time\ntime.sleep(7)\nprint('too late')")));
    REQUIRE(eventually([&] { return !svctest::run_processes(instances).empty(); }, 30s));
    CHECK_FALSE(svctest::run_cgroups(instances).empty());
  }  // disconnects
  // The sandboxed processes are gone and the run's cgroups removed, well before the
  // snippet's own end.
  CHECK(eventually(
      [&] {
        return svctest::run_processes(instances).empty() && svctest::run_cgroups(instances).empty();
      },
      5s));
  CHECK(eventually([&] { return contains(d.log(), "cancelling 1 run(s)"); }, 5s));

  // A client that only closes its sending side still gets its answers, then EOF.
  svctest::client c(d.socket());
  c.send(run_line("half", python("import time\ntime.sleep(0.5)\nprint('half-closed')")));
  c.shutdown_write();
  auto a = c.answer();
  CHECK(a["id"] == "half");
  CHECK(a["result"]["code"] == "ok");
  CHECK(a["result"]["stdout"]["summary"] == "half-closed\n");
  CHECK(c.closed_by_peer());
}

TEST_CASE("a client at its in-flight cap is not read, yet its hang-up still cancels its runs",
          "[service]") {
  // One slot: the first run holds it, the other 63 queue; with 64 in flight the daemon reads
  // nothing more from this client and has nothing to write to it.
  svctest::daemon d({"--max-running", "1", "--queue-deadline-ms", "60000"});
  const auto instances = d.instances();
  REQUIRE_FALSE(instances.empty());
  {
    svctest::client c(d.socket());
    std::string lines;
    for (int i = 0; i < 70; ++i) {
      lines += run_line("r" + std::to_string(i), python("import time\ntime.sleep(7)"));
    }
    c.send(lines);
    REQUIRE(eventually([&] { return !svctest::run_processes(instances).empty(); }, 30s));
    svctest::sleep_ms(300);
    CHECK_FALSE(c.read_line(200ms).has_value());  // nothing answered: all in flight or unread
  }
  CHECK(eventually(
      [&] {
        return svctest::run_processes(instances).empty() && svctest::run_cgroups(instances).empty();
      },
      5s));
  CHECK(eventually([&] { return contains(d.log(), "cancelling 64 run(s)"); }, 5s));
  // The daemon serves the next client at once (the queue was emptied).
  svctest::client c(d.socket());
  c.send(run_line("next", python("print('next')")));
  auto a = c.answer();
  CHECK(a["result"]["stdout"]["summary"] == "next\n");
}

TEST_CASE("a client that stops reading is read no further; its answers all arrive later",
          "[service]") {
  svctest::daemon d;
  svctest::client c(d.socket());
  std::string data(700U << 10, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7919) >> 3);
  const std::string b64 = svctest::base64(data);
  c.send(json{{"id", "put"}, {"blob_put", {{"tenant", "acme"}, {"data_b64", b64}}}}.dump() + "\n");
  auto put = c.answer();
  REQUIRE(put.contains("blob"));
  const std::string blob = put["blob"];

  // 60 answers of ~0.9 MiB each would be 56 MiB if the daemon queued them all for a client
  // that does not read; it stops reading this client's lines instead.
  constexpr int n = 60;
  std::string lines;
  for (int i = 0; i < n; ++i) {
    lines +=
        json{{"id", "g" + std::to_string(i)}, {"blob_get", {{"tenant", "acme"}, {"blob", blob}}}}
            .dump() +
        "\n";
  }
  const std::uint64_t before = d.rss_bytes();
  REQUIRE(before > 0);
  c.send(lines);
  svctest::sleep_ms(1500);  // time to queue them all, were it unbounded
  const std::uint64_t during = d.rss_bytes();
  INFO("daemon RSS before " << before << ", while the client does not read " << during);
  CHECK(during < before + (24U << 20));
  for (int i = 0; i < n; ++i) {
    auto a = c.answer();
    CHECK(a["id"] == "g" + std::to_string(i));
    CHECK(a.value("data_b64", "") == b64);
  }
}

TEST_CASE("many clients that do not read cannot grow the daemon past its answer budget",
          "[service]") {
  svctest::daemon d;
  std::string data(700U << 10, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7919) >> 5);
  const std::string b64 = svctest::base64(data);
  std::string blob;
  {
    svctest::client c(d.socket());
    c.send(json{{"id", "put"}, {"blob_put", {{"tenant", "acme"}, {"data_b64", b64}}}}.dump() +
           "\n");
    auto put = c.answer();
    REQUIRE(put.contains("blob"));
    blob = put["blob"];
  }
  // 250 clients ask for two ~0.9 MiB answers each and read nothing: ~470 MiB if the daemon
  // held them all; each stays under its own pause limit, so only the daemon-wide budget
  // (128 MiB) can refuse, with `capacity`.
  constexpr int clients = 250;
  std::vector<std::unique_ptr<svctest::client>> cs;
  const std::uint64_t before = d.rss_bytes();
  for (int i = 0; i < clients; ++i) {
    cs.push_back(std::make_unique<svctest::client>(d.socket()));
    std::string lines;
    for (int k = 0; k < 2; ++k) {
      lines +=
          json{{"id", "g" + std::to_string(k)}, {"blob_get", {{"tenant", "acme"}, {"blob", blob}}}}
              .dump() +
          "\n";
    }
    cs.back()->send(lines);
  }
  svctest::sleep_ms(2000);
  const std::uint64_t during = d.rss_bytes();
  INFO("daemon RSS before " << before << ", while no client reads " << during);
  CHECK(during < before + (256U << 20));
  // Nothing is lost: every request gets its answer, the data or `capacity`.
  int data_answers = 0, capacity = 0;
  for (auto& c : cs) {
    for (int k = 0; k < 2; ++k) {
      auto a = c->answer();
      CHECK(a["id"] == "g" + std::to_string(k));
      if (a.contains("data_b64")) {
        CHECK(a["data_b64"] == b64);
        ++data_answers;
      } else {
        CHECK(a["error"]["code"] == "capacity");
        ++capacity;
      }
    }
  }
  CHECK(data_answers + capacity == 2 * clients);
  CHECK(capacity > 0);
  CHECK(data_answers > 100);
}

// The daemon notices a client's hang-up through a wait on its socket, which must never be
// taken for the hang-up itself: Asio completes such a wait when it recycles another, just
// closed connection's descriptor state for this one (the reason "many clients that do not
// read …" once lost an answer: a client connecting as the blob_put client left was dropped
// as "disconnected"), and an out-of-band byte completes it too. Here, deterministically: an
// out-of-band byte wakes the watch while the client is read, and while it is paused.
TEST_CASE("a wake-up of the daemon's hang-up watch that is no hang-up keeps the client served",
          "[service]") {
  svctest::daemon d;
  svctest::client c(d.socket());
  auto stats_line = [](const std::string& id) {
    return json{{"id", id}, {"service_stats", json::object()}}.dump() + "\n";
  };
  c.send(stats_line("before"));
  CHECK(c.answer()["id"] == "before");
  c.send_oob('!');
  c.send(stats_line("after"));
  auto a = c.answer();
  CHECK(a["id"] == "after");
  CHECK(a.contains("service_stats"));

  // Paused (an answer of ~0.9 MiB and a second one unread: over the 1 MiB pause), the watch
  // is all that looks at the socket; woken without a hang-up, the client stays.
  std::string data(700U << 10, 'p');
  c.send(
      json{{"id", "put"}, {"blob_put", {{"tenant", "acme"}, {"data_b64", svctest::base64(data)}}}}
          .dump() +
      "\n");
  const std::string blob = c.answer()["blob"];
  std::string gets;
  for (int k = 0; k < 3; ++k) {
    gets +=
        json{{"id", "g" + std::to_string(k)}, {"blob_get", {{"tenant", "acme"}, {"blob", blob}}}}
            .dump() +
        "\n";
  }
  c.send(gets);
  svctest::sleep_ms(300);
  c.send_oob('?');
  svctest::sleep_ms(300);
  for (int k = 0; k < 3; ++k) {
    auto g = c.answer();
    CHECK(g["id"] == "g" + std::to_string(k));
    CHECK(g.contains("data_b64"));
  }
  c.send(stats_line("last"));
  CHECK(c.answer()["id"] == "last");
  // A real hang-up is still seen (the daemon's start-up probe is one disconnect already).
  auto disconnects = [&] {
    const std::string log = d.log();
    std::size_t n = 0;
    for (auto at = log.find("client disconnected"); at != std::string::npos;
         at = log.find("client disconnected", at + 1)) {
      ++n;
    }
    return n;
  };
  const std::size_t before = disconnects();
  c.close();
  CHECK(eventually([&] { return disconnects() > before; }, 10s));
}

// The race itself: clients that connect while others disconnect. Every connection asks one
// cheap question and must get its answer before it closes; before the hang-up watch
// confirmed what woke it, 300 to 900 of these 4000 were dropped unanswered. (A daemon starved
// of CPU may hold more closed connections than it has released yet, and so refuse newcomers
// at its connection cap with `capacity`: an answer, counted apart.)
TEST_CASE("clients that connect while others disconnect are all answered", "[service]") {
  svctest::daemon d;
  constexpr int threads = 16;
  constexpr int per_thread = 250;
  std::atomic<int> answered{0};
  std::atomic<int> refused{0};  // the daemon's connection cap (256), were it ever reached
  std::atomic<int> lost{0};
  std::mutex mu;
  std::vector<std::string> samples;  // what the first lost ones got instead
  auto note = [&](std::string what) {
    ++lost;
    std::lock_guard lock(mu);
    if (samples.size() < 5) samples.push_back(std::move(what));
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        try {
          svctest::client c(d.socket());
          const std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
          try {
            c.send(json{{"id", id}, {"service_stats", json::object()}}.dump() + "\n");
          } catch (const std::exception&) {
            // At the connection cap the daemon answers and closes at once, so the send can
            // fail (EPIPE) with the refusal already waiting to be read: read it below.
          }
          auto line = c.read_line(60s);
          auto a = json::parse(line.value_or(""), nullptr, false);
          // A refusal at the connection cap has "id": null (value("id", "") would throw on it).
          const bool has_id = a.is_object() && a.contains("id");
          if (has_id && a["id"].is_string() && a["id"].get<std::string>() == id) {
            ++answered;
          } else if (has_id && a["id"].is_null() && a.contains("error") && a["error"].is_object() &&
                     a["error"].value("code", "") == "capacity") {
            ++refused;  // at the connection cap: answered and closed, as documented
          } else {
            note(line ? "the line " + line->substr(0, 200) : std::string("no line"));
          }
        } catch (const std::exception& e) {
          note(e.what());
        }
      }
    });
  }
  for (auto& th : ts) th.join();
  std::string what;
  for (const auto& w : samples) what += w + "\n";
  INFO("lost ones got:\n" << what);
  INFO(refused << " refused at the connection cap");
  CHECK(lost == 0);
  CHECK(answered + refused == threads * per_thread);
  CHECK(answered > 0);
}

TEST_CASE("the socket path: a non-socket is refused, a live socket too, a stale one replaced",
          "[service]") {
  const fs::path state = clitest::scratch() / "state-path";
  auto file = clitest::write_scratch("not-a-socket", "keep me");
  auto o = clitest::sandboxctl(with_flags({"serve", "--socket", file.string()}, state), {}, 60s);
  INFO(o.err);
  CHECK(o.status == 1);
  CHECK(contains(o.err, "is not a socket"));
  CHECK(clitest::read_file(file) == "keep me");

  // Usage errors.
  CHECK(clitest::sandboxctl({"serve"}).status == 2);
  CHECK(clitest::sandboxctl({"serve", "--stdio", "--socket", file.string()}).status == 2);
  CHECK(clitest::sandboxctl({"serve", "--stdio", "--max-running", "x"}).status == 2);

  // A stale socket (nobody listening) is replaced.
  const fs::path stale = clitest::scratch() / "stale.sock";
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, stale.c_str(), sizeof addr.sun_path - 1);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    ::close(fd);
  }
  svctest::daemon d({}, stale);
  svctest::client c(d.socket());
  c.send(run_line("x", python("print('replaced')")));
  CHECK(c.answer()["result"]["stdout"]["summary"] == "replaced\n");

  // A socket someone listens on is not taken over.
  o = clitest::sandboxctl(with_flags({"serve", "--socket", stale.string()}, state), {}, 60s);
  CHECK(o.status == 1);
  CHECK(contains(o.err, "another server is listening"));
  c.send(run_line("y", python("print('still mine')")));
  CHECK(c.answer()["result"]["stdout"]["summary"] == "still mine\n");
}

TEST_CASE("SIGTERM cancels the runs, answers them, removes the socket and exits 0", "[service]") {
  svctest::daemon d;
  const auto instances = d.instances();
  REQUIRE_FALSE(instances.empty());
  svctest::client c(d.socket());
  c.send(run_line("long", python("import time\ntime.sleep(7)")));
  REQUIRE(eventually([&] { return !svctest::run_processes(instances).empty(); }, 30s));
  const int status = d.signal_and_wait(SIGTERM, 20s);
  INFO(d.log());
  CHECK(status == 0);
  CHECK_FALSE(fs::exists(d.socket()));
  CHECK(svctest::run_processes(instances).empty());
  CHECK(svctest::run_cgroups(instances).empty());
  // The client was told its run was cancelled, then the connection closed.
  auto line = c.read_line(5s);
  REQUIRE(line.has_value());
  auto a = json::parse(*line);
  CHECK(a["id"] == "long");
  CHECK(a["result"]["code"] == "internal");
  CHECK(contains(message_of(a), "cancelled"));
  CHECK(c.closed_by_peer());
}

TEST_CASE("stdio mode: lines on stdin, answers on stdout, exit 0 at the end of input",
          "[service]") {
  const fs::path state = clitest::scratch() / "state-stdio";
  std::string input =
      run_line("s1", python("import time\ntime.sleep(1)\nprint('one')")) +
      run_line("s2", python("print('two')")) + "not json\n" +
      json{{"id", "p"}, {"blob_put", {{"tenant", "acme"}, {"data_b64", svctest::base64("x")}}}}
          .dump() +
      "\n" + run_line("s3", python("print('three')"));
  input.pop_back();  // the last line without its newline still counts
  auto o = clitest::sandboxctl(with_flags({"serve", "--stdio"}, state), input, 120s);
  INFO("stdout: " << o.out << "\nstderr: " << o.err);
  CHECK(o.status == 0);
  std::map<std::string, json> answers;
  std::vector<json> errors;
  std::istringstream lines(o.out);
  std::string line;
  while (std::getline(lines, line)) {
    auto a = json::parse(line);
    if (a["id"].is_null()) {
      errors.push_back(a);
    } else {
      answers[a["id"]] = a;
    }
  }
  REQUIRE(answers.size() == 4);
  CHECK(answers["s1"]["result"]["stdout"]["summary"] == "one\n");
  CHECK(answers["s2"]["result"]["stdout"]["summary"] == "two\n");
  CHECK(answers["s3"]["result"]["stdout"]["summary"] == "three\n");
  CHECK(answers["p"]["blob"].get<std::string>().rfind("sha256:", 0) == 0);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0]["error"]["code"] == "invalid_request");
}

TEST_CASE("the Python client example runs the freight walkthrough through the daemon",
          "[service]") {
  svctest::daemon d;
  auto p = svctest::spawn({"/usr/bin/python3",
                           SANDBOX_SOURCE_DIR "/examples/python_client/freight_via_daemon.py",
                           "--socket", d.socket().string()});
  auto o = svctest::wait(p);
  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon: " << d.log());
  CHECK(o.status == 0);
  CHECK(contains(o.out, "code:      ok"));
  CHECK(contains(o.out, "\"total_usd\": \"3541.44\""));
  CHECK(contains(o.out, "code:      network_disabled"));
  CHECK(contains(o.out, "dns api.freight-rates.example port 53, refused"));
}

TEST_CASE(
    "the Python client never waits forever: unsendable lines fail at once, unparsable "
    "ones under their id",
    "[service]") {
  svctest::daemon d;
  auto p = svctest::spawn({"/usr/bin/python3",
                           SANDBOX_SOURCE_DIR "/examples/python_client/client_limits_test.py",
                           "--socket", d.socket().string()});
  auto o = svctest::wait(p);
  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon: " << d.log());
  CHECK(o.status == 0);
  CHECK_FALSE(contains(o.out, "FAIL"));
  CHECK(contains(o.out, "ok   20-deep nesting"));
}

// --- signed tickets ------------------------------------------------------------------------

namespace {

/// RFC 3339 UTC of now + `ahead`, e.g. "2026-11-30T12:10:00Z".
std::string utc_in(std::chrono::seconds ahead) {
  const std::time_t t =
      std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() + ahead);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// `sandboxctl ticket sign` of `ticket` with `key` (and `parent`, a signed document path).
json sign(const json& ticket, const fs::path& key, const std::string& name,
          const std::optional<fs::path>& parent = std::nullopt) {
  auto plain = clitest::write_scratch(name, ticket.dump());
  std::vector<std::string> args{"ticket", "sign", "--key", key.string()};
  if (parent) args.insert(args.end(), {"--parent", parent->string()});
  args.push_back(plain.string());
  auto o = clitest::sandboxctl(args);
  INFO(o.err);
  REQUIRE(o.status == 0);
  return json::parse(o.out);
}

std::string line_with(const std::string& id, const json& ticket, const json& request) {
  return json{{"id", id}, {"ticket", ticket}, {"request", request}}.dump() + "\n";
}

}  // namespace

TEST_CASE("with --trusted-keys the daemon accepts only signed tickets", "[service][ticket]") {
  const fs::path keys = clitest::scratch() / "svc-keys";
  fs::create_directories(keys);
  for (const char* kid : {"issuer-1", "issuer-2"}) {
    REQUIRE(
        clitest::sandboxctl({"ticket", "keygen", "--kid", kid, "--out", keys.string()}).status ==
        0);
  }
  // The daemon trusts issuer-1 only (its public key file); issuer-2 is unknown to it.
  svctest::daemon d({"--trusted-keys", (keys / "issuer-1.pub.pem").string()});
  svctest::client c(d.socket());
  auto result_of = [&](const std::string& line) {
    c.send(line);
    auto a = c.answer();
    INFO(a.dump().substr(0, 400));
    REQUIRE(a.contains("result"));
    return a["result"];
  };

  // Unsigned: refused before anything starts.
  auto r = result_of(run_line("unsigned", python("print(1)")));
  CHECK(r["code"] == "action_denied");
  CHECK(contains(r["message"], "ticket: unsigned ticket"));

  // Signed by a trusted key: runs.
  const json doc = sign(svctest::ticket(), keys / "issuer-1.pem", "svc-ticket.json");
  r = result_of(line_with("signed", doc, python("print(6 * 7)")));
  CHECK(r["code"] == "ok");
  CHECK(r["stdout"]["summary"] == "42\n");

  // Tampered, unknown key, expired.
  json tampered = doc;
  tampered["ticket"]["tenant"] = "other";
  r = result_of(line_with("tampered", tampered, python("print(1)")));
  CHECK(r["code"] == "action_denied");
  CHECK(r["message"] == "ticket: signed ticket: bad signature (key 'issuer-1')");
  r = result_of(line_with("unknown", sign(svctest::ticket(), keys / "issuer-2.pem", "svc-2.json"),
                          python("print(1)")));
  CHECK(r["code"] == "action_denied");
  CHECK(r["message"] == "ticket: signed ticket: unknown key id 'issuer-2'");
  json expiring = svctest::ticket();
  expiring["expires_at"] = "2020-01-01T00:00:00Z";
  r = result_of(line_with("expired", sign(expiring, keys / "issuer-1.pem", "svc-old.json"),
                          python("print(1)")));
  CHECK(r["code"] == "action_denied");
  CHECK(r["message"] == "ticket: signed ticket: expired");

  // A derived ticket with its chain: verified and used. This host may have no container
  // level (then runtime_unavailable); with one, the pin to an image the host does not have
  // answers digest_mismatch — resuming an approved run on another image never runs.
  const std::string source = "print(6 * 7)";
  auto src_file = clitest::write_scratch("svc-source.py", source);
  auto put = clitest::sandboxctl(
      {"blob", "put", src_file.string(), "--blob-dir", (clitest::scratch() / "sha").string()});
  REQUIRE(put.status == 0);
  const std::string source_sha256 = put.out.substr(7, 64);
  const std::string other_image = "sha256:" + std::string(64, '0');
  auto parent_path = clitest::write_scratch("svc-parent.json", doc.dump());
  json derived{{"v", 1},
               {"id", "d-svc"},
               {"tenant", "acme"},
               {"actions", {"code.execute", "code.network"}},
               {"isolation", "container"},
               {"max_timeout_ms", 8000},
               {"max_memory_bytes", 268435456},
               {"runtime_digest", other_image},
               {"egress", {"api.example.com"}},
               {"expires_at", utc_in(std::chrono::seconds(600))},
               {"derived_from", {"svc-test"}},
               {"approval",
                {{"ticket_id", "svc-test"},
                 {"tenant", "acme"},
                 {"domains", {"api.example.com"}},
                 {"timeout_ms", 8000},
                 {"memory_limit_bytes", 268435456},
                 {"files_in", json::array()},
                 {"source_sha256", source_sha256},
                 {"source_bytes", source.size()},
                 {"isolation", "container"},
                 {"runtime", {{"name", "python3"}, {"digest", other_image}}}}}};
  const json derived_doc = sign(derived, keys / "issuer-1.pem", "svc-derived.json", parent_path);
  json net = python(source);
  net["network"] = true;
  net["egress"] = {"api.example.com"};
  r = result_of(line_with("resume", derived_doc, net));
  INFO(r.dump());
  CHECK((r["code"] == "digest_mismatch" || r["code"] == "runtime_unavailable"));
  // The same chain with the parent link altered: refused as a whole.
  json broken = derived_doc;
  broken["parent"]["ticket"]["max_timeout_ms"] = 60000;
  r = result_of(line_with("broken", broken, net));
  CHECK(r["code"] == "action_denied");
  CHECK(r["message"] == "ticket: signed ticket: parent: bad signature (key 'issuer-1')");
  // A network request under the plain signed ticket: the daemon defers to the client's
  // approval service (approval_required with the question), where the host has a container
  // level; without one, nothing could run it anyway (runtime_unavailable).
  r = result_of(line_with("ask", doc, net));
  if (r["code"] == "approval_required") {
    CHECK(r["approval"]["ticket_id"] == "svc-test");
    CHECK(r["approval"]["domains"] == json::array({"api.example.com"}));
    CHECK(r["approval"]["source_sha256"] == source_sha256);
  } else {
    CHECK(r["code"] == "runtime_unavailable");
    CHECK(r["approval"].is_null());
  }
  // Another program under the approved ticket: refused by the approval it carries.
  r = result_of(line_with("other-source", derived_doc, [&] {
    json other = net;
    other["source"] = "print('other')";
    return other;
  }()));
  CHECK(r["code"] == "action_denied");
  CHECK(r["message"] == "source: not the source the ticket's approval is for");
}

TEST_CASE(
    "replay over the socket answers the stored result; receipts verify; GC keeps pinned "
    "blobs and replay names a collected one",
    "[service][replay]") {
  const fs::path keys = clitest::scratch() / "svc-receipt-keys";
  fs::create_directories(keys);
  if (!fs::exists(keys / "rcpt.pem")) {
    REQUIRE(
        clitest::sandboxctl({"ticket", "keygen", "--kid", "rcpt", "--out", keys.string()}).status ==
        0);
  }
  svctest::daemon d({"--receipt-key", (keys / "rcpt.pem").string()});
  svctest::client c(d.socket());
  const json t = svctest::ticket("replaytest");
  // Random output: a second execution would print something else, a replay cannot.
  c.send(json{{"id", "run"},
              {"ticket", t},
              {"request", python("import random; print(random.random())")},
              {"record", true}}
             .dump() +
         "\n");
  const json a = c.answer();
  INFO(a.dump().substr(0, 600));
  REQUIRE(a.contains("result"));
  REQUIRE(a["result"]["code"] == "ok");
  REQUIRE(a.contains("record"));
  const json record = a["record"];
  CHECK(record["result"] == a["result"]);
  CHECK(record["tenant"] == "replaytest");
  CHECK(record["record_id"] == a["result"]["run_id"]);

  // The receipt verifies against the daemon's public key, alone and inside its result; a
  // result whose figures were edited does not match it.
  REQUIRE(a["result"].contains("receipt"));
  const auto pub = (keys / "rcpt.pub.pem").string();
  auto result_file = clitest::write_scratch("svc-result.json", a["result"].dump());
  auto ok = clitest::sandboxctl({"receipt", "verify", "--trusted-keys", pub, result_file.string()});
  INFO(ok.err);
  CHECK(ok.status == 0);
  CHECK(json::parse(ok.out)["run_id"] == a["result"]["run_id"]);
  json edited = a["result"];
  edited["usage"]["cpu_ms"] = edited["usage"]["cpu_ms"].get<std::int64_t>() + 1;
  auto bad =
      clitest::sandboxctl({"receipt", "verify", "--trusted-keys", pub,
                           clitest::write_scratch("svc-edited.json", edited.dump()).string()});
  CHECK(bad.status == 1);
  CHECK(contains(bad.err, "usage differs"));
  json forged = a["result"]["receipt"];
  forged["receipt"]["code"] = "timeout";
  bad = clitest::sandboxctl({"receipt", "verify", "--trusted-keys", pub,
                             clitest::write_scratch("svc-forged.json", forged.dump()).string()});
  CHECK(bad.status == 1);
  CHECK(contains(bad.err, "receipt: bad signature (key 'rcpt')"));

  auto replay = [&](const std::string& id) {
    c.send(json{{"id", id}, {"replay", {{"ticket", t}, {"record", record}}}}.dump() + "\n");
    auto r = c.answer();
    INFO(r.dump().substr(0, 600));
    REQUIRE(r.contains("result"));
    return r["result"];
  };
  CHECK(replay("replay-1") == a["result"]);

  // Pin the record's blobs, then collect everything unpinned of the tenant: replay still works.
  const std::string blob_dir = (clitest::scratch() / "blobs").string();
  std::vector<std::string> blobs{a["result"]["stdout"]["blob"], a["result"]["stderr"]["blob"]};
  for (const auto& f : a["result"]["files_out"]) blobs.push_back(f["blob"]);
  for (const auto& b : blobs) {
    if (b.empty()) continue;
    auto p = clitest::sandboxctl({"blob", "pin", b, "--holder", record["record_id"], "--tenant",
                                  "replaytest", "--blob-dir", blob_dir});
    INFO(p.err);
    REQUIRE(p.status == 0);
  }
  auto gc = clitest::sandboxctl(
      {"blob", "gc", "--older-than", "0s", "--tenant", "replaytest", "--blob-dir", blob_dir});
  INFO(gc.err);
  REQUIRE(gc.status == 0);
  CHECK(contains(gc.out, "kept "));
  CHECK(replay("replay-2") == a["result"]);

  // Unpinned and collected: replay says which blob is gone, and never runs the code again.
  for (const auto& b : blobs) {
    if (b.empty()) continue;
    REQUIRE(clitest::sandboxctl({"blob", "unpin", b, "--holder", record["record_id"], "--tenant",
                                 "replaytest", "--blob-dir", blob_dir})
                .status == 0);
  }
  gc = clitest::sandboxctl(
      {"blob", "gc", "--older-than", "0s", "--tenant", "replaytest", "--blob-dir", blob_dir});
  REQUIRE(gc.status == 0);
  CHECK(contains(gc.out, "removed "));
  const json gone = replay("replay-3");
  CHECK(gone["code"] == "blob_not_found");
  CHECK(gone["message"] == "replay: result.stdout.blob " + blobs[0] + " not found");

  // Another tenant's ticket, and a malformed record, are refused with their codes.
  c.send(
      json{{"id", "other"}, {"replay", {{"ticket", svctest::ticket("acme")}, {"record", record}}}}
          .dump() +
      "\n");
  auto other = c.answer();
  CHECK(other["result"]["code"] == "action_denied");
  json broken = record;
  broken["request_sha256"] = "nope";
  c.send(json{{"id", "broken"}, {"replay", {{"ticket", t}, {"record", broken}}}}.dump() + "\n");
  auto b = c.answer();
  CHECK(b["result"]["code"] == "invalid_request");
  CHECK(contains(b["result"]["message"], "replay.record: run record: request_sha256"));
  c.send(json{{"id", "extra"}, {"replay", {{"ticket", t}, {"record", record}, {"x", 1}}}}.dump() +
         "\n");
  auto e = c.answer();
  CHECK(e["error"]["code"] == "invalid_request");
  CHECK(contains(e["error"]["message"], "replay: unknown field 'x'"));
}

TEST_CASE("the Python client checkpoints a run's record and replays it on a new connection",
          "[service][replay]") {
  svctest::daemon d;
  const std::string script = R"py(
import json, sys
sys.path.insert(0, sys.argv[1])
from agent_sandbox import Client
sock, ticket, checkpoint = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
src = "import secrets\nprint(secrets.token_hex(8))\n"
with Client(sock) as sb:
    result, record = sb.run_with_record(ticket, {"runtime": "python3", "source": src}, timeout=120)
with open(checkpoint, "w") as f:
    json.dump(record, f)
# "Restart": a new connection, the record read back from the checkpoint file.
with open(checkpoint) as f:
    record = json.load(f)
with Client(sock) as sb:
    again = sb.replay(ticket, record, timeout=60)
print(json.dumps({"first": result.to_json(), "again": again.to_json()}))
)py";
  auto p =
      svctest::spawn({"/usr/bin/python3", "-c", script, SANDBOX_SOURCE_DIR "/clients/python/src",
                      d.socket().string(), svctest::ticket().dump(),
                      (clitest::scratch() / "py-checkpoint.json").string()});
  auto o = svctest::wait(p);
  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon: " << d.log());
  REQUIRE(o.status == 0);
  const json out = json::parse(o.out);
  CHECK(out["first"]["code"] == "ok");
  CHECK(out["again"] == out["first"]);  // the random token was not produced a second time
}

TEST_CASE(
    "a registered tool runs over the socket: the model's bytes on stdin, the name from "
    "the daemon's registry; a ticket without the tool is refused",
    "[service][tools]") {
  // The "tools" image (tools/setup.sh) holds cmark; the registry comes from --config.
  const auto config = clitest::write_scratch(
      "svc-tools.json",
      R"({"v":1,"tools":[{"name":"markdown","image":"tools","binary":"/usr/bin/cmark"}]})");
  svctest::daemon d({"--config", config.string()});
  svctest::client c(d.socket());
  json t = svctest::ticket("toolsvc");
  t["actions"] = {"tool.run"};
  t["tools"] = {"markdown"};
  c.send(json{{"id", "md"},
              {"ticket", t},
              {"request", {{"tool", "markdown"}, {"stdin", "# Quote\n\n*ocean*, 24 days\n"}}}}
             .dump() +
         "\n");
  const json a = c.answer();
  INFO(a.dump().substr(0, 800));
  REQUIRE(a.contains("result"));
  CHECK(a["id"] == "md");
  CHECK(a["result"]["code"] == "ok");
  CHECK(a["result"]["stdout"]["summary"] == "<h1>Quote</h1>\n<p><em>ocean</em>, 24 days</p>\n");
  CHECK(a["result"]["runtime"]["name"] == "markdown");

  // The same ticket cannot run code, and a ticket for code cannot run the tool.
  c.send(json{{"id", "code-under-tool-ticket"}, {"ticket", t}, {"request", python("print(1)")}}
             .dump() +
         "\n");
  const json b = c.answer();
  INFO(b.dump().substr(0, 800));
  REQUIRE(b.contains("result"));
  CHECK(b["result"]["code"] == "action_denied");
  c.send(json{{"id", "tool-under-code-ticket"},
              {"ticket", svctest::ticket("toolsvc")},
              {"request", {{"tool", "markdown"}, {"stdin", "x"}}}}
             .dump() +
         "\n");
  const json e = c.answer();
  INFO(e.dump().substr(0, 800));
  REQUIRE(e.contains("result"));
  CHECK(e["result"]["code"] == "action_denied");
  CHECK(contains(e["result"].value("message", ""), "tool.run"));
}
