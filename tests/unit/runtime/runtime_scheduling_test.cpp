// Scheduling through the runtime (fake backend): bulkheads, queue deadlines, capacity with a
// retry hint, cancellation of a queued run, and the wait reported in results.
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <catch2/catch.hpp>
#include <future>

#include "sandbox/sandbox.hpp"
#include "sandbox/testing/fake_backend.hpp"

using namespace std::chrono_literals;
using sandbox::code;

namespace {

sandbox::runtime make(std::shared_ptr<sandbox::testing::fake_backend> fake,
                      sandbox::scheduler_options sched) {
  sandbox::runtime_options o;
  o.blobs = sandbox::make_memory_blob_store();
  o.fixed_digests = {{"python3", sandbox::testing::fake_digest("python3")}};
  o.process_backend = false;
  o.scheduler = std::move(sched);
  auto rt = sandbox::runtime::create(std::move(o));
  REQUIRE(rt.has_value());
  rt->add_backend(fake);
  return std::move(*rt);
}

sandbox::ticket ticket(const std::string& tenant) {
  return sandbox::ticket_issuer{}.issue({.id = "t", .tenant = tenant}).value();
}

using outcome = std::pair<boost::system::error_code, sandbox::run_result>;

std::future<outcome> start(sandbox::runtime& rt, const std::string& tenant,
                           const std::string& src = "print(1)") {
  auto p = std::make_shared<std::promise<outcome>>();
  auto f = p->get_future();
  rt.async_run(sandbox::run_request{.runtime = "python3", .source = src}, ticket(tenant),
               [p](boost::system::error_code ec, sandbox::run_result r) {
                 p->set_value({ec, std::move(r)});
               });
  return f;
}

}  // namespace

TEST_CASE("runtime scheduling: a tenant's bulkhead serializes its runs", "[runtime][scheduler]") {
  auto fake = std::make_shared<sandbox::testing::fake_backend>();
  fake->otherwise().respond({.std_out = "done\n", .delay = 100ms});
  auto rt = make(fake, {.max_running = 8, .default_class = {.max_running = 1}});
  std::vector<std::future<outcome>> fs;
  for (int i = 0; i < 3; ++i) fs.push_back(start(rt, "acme"));
  std::vector<std::chrono::milliseconds> waits;
  for (auto& f : fs) {
    auto [ec, r] = f.get();
    CHECK_FALSE(ec);
    CHECK(r.code == code::ok);
    waits.push_back(r.queue_wait);
  }
  std::sort(waits.begin(), waits.end());
  CHECK(waits[0] < 50ms);    // the first ran at once
  CHECK(waits[2] >= 150ms);  // the third waited for the two before it (2 × 100 ms)
  CHECK(rt.queue_stats().dispatched == 3);
}

TEST_CASE("runtime scheduling: past the tenant's deadline → queue_timeout with figures",
          "[runtime][scheduler]") {
  auto fake = std::make_shared<sandbox::testing::fake_backend>();
  fake->otherwise().respond({.std_out = "done\n", .delay = 400ms});
  auto rt =
      make(fake, {.max_running = 1, .default_class = {.max_running = 1, .queue_deadline = 50ms}});
  auto first = start(rt, "acme");
  auto second = start(rt, "acme");
  auto [ec2, r2] = second.get();
  CHECK_FALSE(ec2);
  CHECK(r2.code == code::queue_timeout);
  REQUIRE(r2.queue);
  CHECK(r2.queue->position == 1);
  CHECK(r2.message.find("waited") != std::string::npos);
  CHECK(r2.queue_wait >= 50ms);
  CHECK(first.get().second.code == code::ok);
  CHECK(fake->requests().size() == 1);  // the timed-out run never reached the backend
}

TEST_CASE("runtime scheduling: a full queue answers capacity at once, with a retry hint",
          "[runtime][scheduler]") {
  auto fake = std::make_shared<sandbox::testing::fake_backend>();
  fake->otherwise().respond({.std_out = "done\n", .delay = 300ms});
  auto rt = make(fake, {.max_running = 1, .max_queued = 1});
  auto a = start(rt, "acme");
  auto b = start(rt, "other");
  auto c = start(rt, "third");
  auto [ec, r] = c.get();
  CHECK(r.code == code::capacity);
  REQUIRE(r.queue);
  CHECK(r.queue->length == 1);
  CHECK(r.queue->retry_after > 0ms);
  CHECK(r.message.find("retry after") != std::string::npos);
  CHECK(a.get().second.code == code::ok);
  CHECK(b.get().second.code == code::ok);
  CHECK(rt.queue_stats().rejected == 1);
}

TEST_CASE("runtime scheduling: cancelling a queued run frees its place at once",
          "[runtime][scheduler]") {
  auto fake = std::make_shared<sandbox::testing::fake_backend>();
  fake->otherwise().respond({.std_out = "done\n", .delay = 300ms});
  auto rt = make(fake, {.max_running = 1, .max_queued = 1});
  auto running = start(rt, "acme");
  boost::asio::cancellation_signal cancel;
  auto p = std::make_shared<std::promise<outcome>>();
  auto queued = p->get_future();
  rt.async_run(sandbox::run_request{.runtime = "python3", .source = "print(2)"}, ticket("acme"),
               boost::asio::bind_cancellation_slot(
                   cancel.slot(), [p](boost::system::error_code ec, sandbox::run_result r) {
                     p->set_value({ec, std::move(r)});
                   }));
  // Wait until it is queued, then cancel it.
  for (int i = 0; i < 200 && rt.queue_stats().queued == 0; ++i) std::this_thread::sleep_for(1ms);
  REQUIRE(rt.queue_stats().queued == 1);
  cancel.emit(boost::asio::cancellation_type::terminal);
  auto [ec, r] = queued.get();
  CHECK(ec == boost::asio::error::operation_aborted);
  CHECK(rt.queue_stats().queued == 0);
  // The place is free: another run queues instead of getting capacity.
  auto next = start(rt, "acme");
  CHECK(running.get().second.code == code::ok);
  CHECK(next.get().second.code == code::ok);
}
