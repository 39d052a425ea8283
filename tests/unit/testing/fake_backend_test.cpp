// The scripted fake backend: every code, streams and files as real blobs, rules, recorded
// requests, never-inline completion, cancellation.
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <csignal>
#include <future>

#include "sandbox/sandbox.hpp"
#include "unit/runtime/runtime_test_support.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using sandbox::code;
using sandbox::run_result;
using sandbox::test::make_fake_runtime;
using sandbox::test::make_ticket;
using sandbox::test::py;
using sandbox::testing::fake_backend;
using sandbox::testing::fake_digest;
using sandbox::testing::result_with;
using sandbox::testing::scripted_run;

namespace {

/// A job as the runtime would build it, for driving the fake directly.
sandbox::run_job direct_job(const asio::any_io_executor& ex,
                            std::shared_ptr<sandbox::blob_store> blobs) {
  sandbox::run_job job;
  job.run_id = "0123456789abcdef";
  job.admitted.request = py("print(1)");
  job.admitted.tenant = "acme";
  job.admitted.ticket_id = "t-acme";
  job.admitted.isolation = sandbox::isolation::microvm;
  job.admitted.runtime = {"python3", fake_digest("python3")};
  job.blobs = std::move(blobs);
  job.executor = ex;
  return job;
}

}  // namespace

TEST_CASE("the fake can script every code", "[fake]") {
  auto fake = std::make_shared<fake_backend>();
  auto rt = make_fake_runtime(fake);
  auto t = make_ticket();
  for (std::size_t i = 0; i < sandbox::code_names.size(); ++i) {
    const auto c = static_cast<code>(i);
    fake->on([](const sandbox::admitted&) { return true; }).times(1).respond(result_with(c));
    auto r = rt.run(py("x"), t);
    INFO(sandbox::to_string(c));
    CHECK(r.code == c);
    CHECK(r.message.empty() == (c == code::ok));
    CHECK(sandbox::test::is_run_id(r.run_id));
    CHECK(r.runtime.digest == fake_digest("python3"));
  }
  CHECK(fake->requests().size() == sandbox::code_names.size());
  // All the one-shot rules are used up: the fallback answers.
  CHECK(rt.run(py("x"), t).code == code::ok);
}

TEST_CASE("result_with fills matching details", "[fake]") {
  auto timeout = result_with(code::timeout);
  CHECK(timeout.signal == SIGKILL);
  CHECK_FALSE(timeout.exit_code.has_value());
  CHECK_FALSE(timeout.message.empty());

  auto oom = result_with(code::oom);
  CHECK(oom.signal == SIGKILL);
  CHECK(oom.oom_kills == 1);

  auto sec = result_with(code::seccomp_violation);
  CHECK(sec.signal == SIGSYS);
  CHECK(sec.violation == "ptrace");
  CHECK(sec.message.find("ptrace") != std::string::npos);
  auto sec2 = result_with(code::seccomp_violation, {.violation = "mount"});
  CHECK(sec2.violation == "mount");

  auto net = result_with(code::network_disabled, {.std_err = "URLError\n"});
  REQUIRE(net.egress_attempts.size() == 1);
  CHECK_FALSE(net.egress_attempts[0].allowed);
  CHECK(net.std_err == "URLError\n");

  auto custom = result_with(code::timeout, {.message = "mine", .signal = SIGTERM});
  CHECK(custom.message == "mine");
  CHECK(custom.signal == SIGTERM);

  auto ok = result_with(code::ok, {.exit_code = 2});
  CHECK(ok.exit_code == 2);
  CHECK(ok.message.empty());
}

TEST_CASE("streams and output files are real blobs", "[fake]") {
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond(scripted_run{
      .std_out = "42\n",
      .std_err = "warn\tx\x01\n",
      .files_out = {{"z.txt", "zed"}, {"a.csv", "a,b\n"}},
  });
  auto rt = make_fake_runtime(fake);
  auto r = rt.run(py("print(42)"), make_ticket("acme"));
  REQUIRE(r.code == code::ok);
  CHECK(r.exit_code == 0);
  CHECK(r.std_out.summary == "42\n");
  CHECK(r.std_out.blob == sandbox::blob_id_of("42\n"));
  CHECK(r.std_out.bytes == 3);
  CHECK(r.std_out.total_bytes == 3);
  CHECK_FALSE(r.std_out.truncated);
  CHECK(rt.blobs()->get("acme", r.std_out.blob).value() == "42\n");
  CHECK(r.std_err.summary == "warn\tx\\x01\n");  // control characters escaped, \t and \n kept
  CHECK(rt.blobs()->get("acme", r.std_err.blob).value() == "warn\tx\x01\n");  // byte-exact

  REQUIRE(r.files_out.size() == 2);  // in name order, like the collector
  CHECK(r.files_out[0].name == "a.csv");
  CHECK(r.files_out[0].bytes == 4);
  CHECK(rt.blobs()->get("acme", r.files_out[0].blob).value() == "a,b\n");
  CHECK(r.files_out[1].name == "z.txt");
  CHECK(rt.blobs()->get("acme", r.files_out[1].blob).value() == "zed");
  // Another tenant cannot read them.
  CHECK_FALSE(rt.blobs()->get("other", r.files_out[1].blob).has_value());
}

TEST_CASE("captures are capped and summaries cut", "[fake]") {
  auto fake = std::make_shared<fake_backend>();
  std::string big;
  for (int i = 0; i < 100; ++i) big += "line " + std::to_string(i) + " é\n";
  fake->otherwise().respond(scripted_run{.std_out = big});
  sandbox::policy policy;
  policy.stream_capture_bytes = 100;
  policy.summary_bytes = 80;
  auto rt = make_fake_runtime(fake, policy);
  auto r = rt.run(py("x"), make_ticket());
  CHECK(r.std_out.bytes == 100);
  CHECK(r.std_out.total_bytes == big.size());
  CHECK(r.std_out.truncated);
  CHECK(rt.blobs()->get("acme", r.std_out.blob).value() == big.substr(0, 100));
  CHECK(r.std_out.summary.size() <= 80);
  CHECK(sandbox::is_valid_utf8(r.std_out.summary));
  CHECK(r.std_out.summary.find("bytes omitted") != std::string::npos);
  CHECK(r.std_out.summary.rfind("line 0 ", 0) == 0);                  // head
  CHECK(r.std_out.summary.find("line 99 é\n") != std::string::npos);  // tail
}

TEST_CASE("output files obey the request's limits", "[fake]") {
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond(scripted_run{
      .files_out = {{"a", "1"}, {"b", "22"}, {"c", std::string(100, 'c')}, {"d/e", "x"}},
      .files_dropped = {{.name_display = "link", .reason = sandbox::drop_reason::not_regular_file}},
  });
  auto rt = make_fake_runtime(fake);
  auto req = py("x");
  req.files_out = {.max_files = 2, .max_bytes = 50};
  auto r = rt.run(req, make_ticket());
  REQUIRE(r.files_out.size() == 2);
  CHECK(r.files_out[0].name == "a");
  CHECK(r.files_out[1].name == "b");
  REQUIRE(r.files_dropped.size() == 3);
  CHECK(r.files_dropped[0].name_display == "c");
  CHECK(r.files_dropped[0].reason == sandbox::drop_reason::count_limit);
  CHECK(r.files_dropped[1].reason == sandbox::drop_reason::bad_name);
  CHECK(r.files_dropped[2].reason == sandbox::drop_reason::not_regular_file);

  req.files_out = {.max_files = 16, .max_bytes = 50};
  r = rt.run(req, make_ticket());
  REQUIRE(r.files_out.size() == 2);
  CHECK(r.files_dropped[0].name_display == "c");
  CHECK(r.files_dropped[0].reason == sandbox::drop_reason::bytes_limit);
}

TEST_CASE("rules: order, times, respond_with, recorded requests", "[fake]") {
  auto fake = std::make_shared<fake_backend>();
  fake->on_source_contains("urlopen").respond(
      result_with(code::network_disabled, {.std_err = "URLError\n"}));
  fake->on_source_contains("once").times(1).respond_stdout("first\n");
  fake->on([](const sandbox::admitted& a) { return !a.request.files_in.empty(); })
      .respond_with([](const sandbox::admitted& a) {
        return scripted_run{.std_out = a.request.files_in[0].name + "\n"};
      });
  fake->otherwise().respond_stdout("default\n");
  auto rt = make_fake_runtime(fake);
  auto t = make_ticket("acme");

  auto net = rt.run(py("import urllib; urlopen('x')"), t);
  CHECK(net.code == code::network_disabled);
  CHECK(net.std_err.summary == "URLError\n");
  REQUIRE(net.egress_attempts.size() == 1);

  CHECK(rt.run(py("once"), t).std_out.summary == "first\n");
  CHECK(rt.run(py("once"), t).std_out.summary == "default\n");

  auto id = rt.blobs()->put("acme", "data");
  REQUIRE(id.has_value());
  auto req = py("read");
  req.files_in = {{.name = "input.csv", .blob = *id}};
  req.timeout = 30s;
  CHECK(rt.run(req, t).std_out.summary == "input.csv\n");

  auto seen = fake->requests();
  REQUIRE(seen.size() == 4);
  CHECK(seen[0].request.source == "import urllib; urlopen('x')");
  CHECK(seen[3].tenant == "acme");
  CHECK(seen[3].ticket_id == "t-acme");
  CHECK(seen[3].request.timeout == 8000ms);  // clamped to the ticket's ceiling
  CHECK(seen[3].timeout_clamped);
}

TEST_CASE("a rule that throws answers internal", "[fake]") {
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond_with(
      [](const sandbox::admitted&) -> scripted_run { throw std::runtime_error("boom"); });
  auto rt = make_fake_runtime(fake);
  auto r = rt.run(py("x"), make_ticket());
  CHECK(r.code == code::internal);
  CHECK(r.message.find("boom") == std::string::npos);
}

TEST_CASE("the fake never completes inside async_execute", "[fake]") {
  asio::io_context io;
  auto fake = std::make_shared<fake_backend>();
  fake->otherwise().respond_stdout("hi\n");
  int calls = 0;
  run_result got;
  fake->async_execute(direct_job(io.get_executor(), sandbox::make_memory_blob_store()),
                      [&](boost::system::error_code ec, run_result r) {
                        CHECK_FALSE(ec);
                        ++calls;
                        got = std::move(r);
                      });
  CHECK(calls == 0);
  io.run();
  CHECK(calls == 1);
  CHECK(got.std_out.summary == "hi\n");
  CHECK(got.run_id == "0123456789abcdef");
  CHECK(fake->requests().size() == 1);
}

TEST_CASE("a held fake run ends on cancellation or after its delay", "[fake]") {
  asio::io_context io;
  auto fake = std::make_shared<fake_backend>();
  fake->on_source_contains("hold").respond(scripted_run{.std_out = "late\n", .delay = 1h});
  fake->otherwise().respond(scripted_run{.std_out = "soon\n", .delay = 1ms});
  auto blobs = sandbox::make_memory_blob_store();

  SECTION("cancelled") {
    asio::cancellation_signal cancel;
    auto job = direct_job(io.get_executor(), blobs);
    job.admitted.request.source = "hold";
    boost::system::error_code got;
    int calls = 0;
    fake->async_execute(std::move(job),
                        asio::bind_cancellation_slot(
                            cancel.slot(), [&](boost::system::error_code ec, run_result r) {
                              got = ec;
                              CHECK(r.code == code::internal);
                              CHECK(r.std_out.summary.empty());
                              ++calls;
                            }));
    io.poll();
    CHECK(calls == 0);
    cancel.emit(asio::cancellation_type::terminal);
    io.run();  // returns: the timer was cancelled, nothing else holds the io_context
    CHECK(calls == 1);
    CHECK(got == asio::error::operation_aborted);
  }
  SECTION("delay passes") {
    int calls = 0;
    fake->async_execute(direct_job(io.get_executor(), blobs),
                        [&](boost::system::error_code ec, run_result r) {
                          CHECK_FALSE(ec);
                          CHECK(r.std_out.summary == "soon\n");
                          ++calls;
                        });
    io.run();
    CHECK(calls == 1);
  }
  SECTION("without an executor in the job") {
    auto f = fake->async_execute(direct_job({}, blobs), asio::use_future);
    CHECK(f.get().std_out.summary == "soon\n");
  }
}
