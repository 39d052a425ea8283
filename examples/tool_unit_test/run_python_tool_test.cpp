// Unit tests of the run_python tool with the fake backend: no process is started, yet every
// way a run can end (including timeout, OOM, blocked network) is exercised. Links only
// sandbox::testing and Catch2.
#include "run_python_tool.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <csignal>

#include "sandbox/testing/fake_backend.hpp"

using namespace std::chrono_literals;
using sandbox::code;
using sandbox::testing::fake_backend;
using sandbox::testing::result_with;
using sandbox::testing::scripted_run;

namespace {

sandbox::ticket conversation_ticket() {
  sandbox::ticket_spec spec;
  spec.id = "conv-1";
  spec.tenant = "acme";
  spec.isolation = sandbox::isolation::gvisor;
  auto t = sandbox::ticket_issuer{}.issue(spec);
  REQUIRE(t.has_value());
  return *t;
}

/// A fake runtime plus the tool under test.
struct fixture {
  explicit fixture(sandbox::policy policy = {})
      : fake(std::make_shared<fake_backend>()),
        rt(make(fake, std::move(policy))),
        tool(rt, conversation_ticket()) {}

  static sandbox::runtime make(std::shared_ptr<fake_backend> f, sandbox::policy policy) {
    auto rt = sandbox::testing::make_runtime(std::move(f), std::move(policy));
    REQUIRE(rt.has_value());
    return std::move(*rt);
  }

  std::shared_ptr<fake_backend> fake;
  sandbox::runtime rt;
  example::run_python_tool tool;
};

bool contains(const std::string& s, std::string_view needle) {
  return s.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("a successful run replies with its output", "[tool]") {
  fixture f;
  f.fake->otherwise().respond_stdout("42\n");
  auto reply = f.tool.call(R"j({"code": "print(6*7)"})j");
  CHECK(reply == "exit code 0\nstdout:\n42\n");

  auto seen = f.fake->requests();  // a copy: requests() returns by value
  REQUIRE(seen.size() == 1);
  const auto& req = seen[0].request;
  CHECK(req.runtime == "python3");
  CHECK(req.source == "print(6*7)");
  CHECK(req.timeout == 5000ms);  // the tool's default
  CHECK_FALSE(req.network);
  CHECK(seen[0].tenant == "acme");
}

TEST_CASE("non-zero exit and stderr are reported", "[tool]") {
  fixture f;
  f.fake->otherwise().respond(
      scripted_run{.exit_code = 1, .std_err = "Traceback ...\nZeroDivisionError\n"});
  auto reply = f.tool.call(R"j({"code": "1/0"})j");
  CHECK(contains(reply, "exit code 1"));
  CHECK(contains(reply, "stderr:\nTraceback ...\nZeroDivisionError\n"));
}

TEST_CASE("timeouts, OOM, too many processes, network and seccomp become explanations", "[tool]") {
  fixture f;
  f.fake->on_source_contains("while True")
      .respond(result_with(code::timeout, {.std_out = "partial\n"}));
  f.fake->on_source_contains("bytearray").respond(result_with(code::oom));
  f.fake->on_source_contains("urlopen").respond(
      result_with(code::network_disabled,
                  {.std_err = "URLError\n",
                   .egress_attempts = {{.protocol = "dns", .host = "example.com", .port = 443}}}));
  f.fake->on_source_contains("ptrace").respond(result_with(code::seccomp_violation));
  f.fake->on_source_contains("os.fork").respond(result_with(code::pids_limit));

  auto timeout = f.tool.call(R"j({"code": "while True: pass", "timeout_seconds": 3})j");
  CHECK(contains(timeout, "ran longer than 3000 ms"));
  CHECK(contains(timeout, "partial"));
  CHECK(f.fake->requests().back().request.timeout == 3000ms);

  auto oom = f.tool.call(R"j({"code": "bytearray(10**12)"})j");
  CHECK(contains(oom, "ran out of memory (limit 256 MiB)"));

  auto net = f.tool.call(R"j({"code": "urlopen('https://example.com')"})j");
  CHECK(contains(net, "network access is disabled"));
  CHECK(contains(net, "example.com:443"));

  auto sec = f.tool.call(R"j({"code": "ptrace()"})j");
  CHECK(contains(sec, "forbidden operation (ptrace)"));

  auto bomb = f.tool.call(R"j({"code": "for _ in range(10**6): os.fork()"})j");
  CHECK(contains(bomb, "started too many processes"));
}

TEST_CASE("input files travel as blobs; output files are listed", "[tool]") {
  fixture f;
  auto blobs = f.rt.blobs();
  // The fake "program" reads its input from the blob store, as the sandbox would.
  f.fake->otherwise().respond_with([blobs](const sandbox::admitted& a) {
    scripted_run run;
    for (const auto& in : a.request.files_in) {
      run.std_out += in.name + ": " + blobs->get(a.tenant, in.blob).value();
    }
    run.files_out = {{"summary.txt", "2 rows"}};
    return run;
  });
  auto reply = f.tool.call(R"j({"code": "...", "files": {"data.csv": "a,b\n1,2\n"}})j");
  CHECK(contains(reply, "data.csv: a,b\n1,2\n"));
  CHECK(contains(reply, "output file summary.txt (6 bytes)"));
  auto seen = f.fake->requests();
  REQUIRE(seen.size() == 1);
  const auto& in = seen[0].request.files_in;
  REQUIRE(in.size() == 1);
  CHECK(in[0].name == "data.csv");
  CHECK(in[0].blob == sandbox::blob_id_of("a,b\n1,2\n"));
}

TEST_CASE("bad arguments are answered without running anything", "[tool]") {
  fixture f;
  CHECK(contains(f.tool.call("not json"), "not valid JSON"));
  CHECK(contains(f.tool.call("[1]"), "expected a JSON object"));
  CHECK(contains(f.tool.call("{}"), "'code' is required"));
  CHECK(contains(f.tool.call(R"j({"code": 1})j"), "'code' must be a string"));
  CHECK(contains(f.tool.call(R"j({"code": "", "timeout_seconds": 0})j"), "between 1 and 3600"));
  CHECK(contains(f.tool.call(R"j({"code": "", "shell": true})j"), "unknown field 'shell'"));
  CHECK(contains(f.tool.call(R"j({"code": "", "files": {"a": 1}})j"), "must be a string"));
  CHECK(f.fake->requests().empty());
}

TEST_CASE("requests the sandbox rejects are explained", "[tool]") {
  sandbox::policy policy;
  policy.max_source_bytes = 32;
  fixture f(policy);
  auto too_long = f.tool.call(R"j({"code": ")j" + std::string(40, 'x') + R"j("})j");
  CHECK(contains(too_long, "the request was rejected"));
  auto bad_name = f.tool.call(R"j({"code": "", "files": {"../etc/passwd": "x"}})j");
  CHECK(contains(bad_name, "the request was rejected"));
  CHECK(f.fake->requests().empty());
}

TEST_CASE("the coroutine form, and cancelling it", "[tool]") {
  using namespace boost::asio::experimental::awaitable_operators;
  fixture f;
  f.fake->on_source_contains("slow").respond(scripted_run{.delay = 1h});
  f.fake->otherwise().respond_stdout("fast\n");
  boost::asio::io_context io;
  std::string fast;
  std::string slow;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        fast = co_await f.tool.async_call(R"j({"code": "print('fast')"})j");
        boost::asio::steady_timer deadline(co_await boost::asio::this_coro::executor, 10ms);
        auto v = co_await (f.tool.async_call(R"j({"code": "slow"})j") ||
                           deadline.async_wait(boost::asio::use_awaitable));
        slow = v.index() == 0 ? std::get<0>(v) : "deadline";
      },
      boost::asio::detached);
  io.run();
  CHECK(fast == "exit code 0\nstdout:\nfast\n");
  CHECK(slow == "deadline");
}
