// Sessions and the scheduler (src/runtime/session.cpp): a session holds a scheduler slot of its
// tenant's class for its whole life — released when it is closed or ends by itself — and
// records one span at its end, like a run. Real servers in the process backend.
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <mutex>
#include <optional>
#include <thread>

#include "integration/harness.hpp"

using sandbox::code;
using sandbox::session_end;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

// Keeps every span it is given.
class collecting_sink final : public sandbox::span_sink {
 public:
  void record(const sandbox::span& s) noexcept override {
    std::lock_guard lk(mu_);
    spans_.push_back(s);
  }
  /// The span of run or session `id` (the last one), if any.
  std::optional<sandbox::span> find(const std::string& id) const {
    std::lock_guard lk(mu_);
    for (auto it = spans_.rbegin(); it != spans_.rend(); ++it) {
      auto a = it->attributes.find("sandbox.run_id");
      if (a != it->attributes.end() && std::get<std::string>(a->second) == id) return *it;
    }
    return std::nullopt;
  }
  /// Spans named `name` whose error_code is `code`.
  std::size_t count(const std::string& name, const std::string& error_code) const {
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    for (const auto& s : spans_) {
      auto a = s.attributes.find("error_code");
      if (s.name == name && a != s.attributes.end() &&
          std::get<std::string>(a->second) == error_code) {
        ++n;
      }
    }
    return n;
  }

 private:
  mutable std::mutex mu_;
  std::vector<sandbox::span> spans_;
};

std::string text(const sandbox::span& s, const std::string& key) {
  auto it = s.attributes.find(key);
  if (it == s.attributes.end()) return "(absent)";
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  if (const auto* v = std::get_if<std::int64_t>(&it->second)) return std::to_string(*v);
  return std::get<bool>(it->second) ? "true" : "false";
}

sandbox::ticket ticket_for(const std::string& tenant, bool execute = false) {
  return sandbox::ticket_issuer{}
      .issue({.id = "itest-" + tenant,
              .tenant = tenant,
              .execute = execute,
              .isolation = sandbox::isolation::process,
              .max_timeout = 600000ms,  // bounds a session's whole lifetime
              .max_memory_bytes = 1ULL << 30,
              .tools = {"*"}})
      .value();
}

sandbox::session_start open(sandbox::runtime& rt, sandbox::session_request req,
                            const sandbox::ticket& t) {
  return rt.async_open_session(std::move(req), t, asio::use_future).get();
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds bound = 20s) {
  auto until = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_CASE("session: holds a scheduler slot for its life; queue_timeout, capacity; one span each",
          "[session][scheduler]") {
  if (itest::rt() == nullptr) {
    if (itest::must_work()) FAIL("process backend unavailable: " << itest::why());
    WARN("process backend unavailable: skipped");
    return;
  }
  auto before = itest::snapshot();
  std::string root;
  auto opts = itest::private_runtime_options(&root);
  // Tenant "queued": one slot, a short queue deadline. Tenant "solo": one slot, no queue.
  opts.scheduler.max_running = 8;
  opts.scheduler.classes["queued"] = {
      .max_running = 1,
      .max_queued = 4,
      .weight = 1,
      .queue_deadline = 300ms,
      .max_session_slots = 4};  // (the slot binds here, not the session cap)
  opts.scheduler.classes["solo"] = {.max_running = 1,
                                    .max_queued = 0,
                                    .weight = 1,
                                    .queue_deadline = 300ms,
                                    .max_session_slots = 4};
  opts.scheduler.tenant_classes = {{"queued", "queued"}, {"solo", "solo"}};
  opts.tools = {{.name = "sleeper",
                 .image = "python3",
                 .image_digest = std::nullopt,
                 .binary = "/usr/bin/python3",
                 .args = {"-c", "import time\ntime.sleep(3600)"},
                 .input = sandbox::tool_input::stdin_bytes,
                 .isolation = sandbox::isolation::process,
                 .profile = {},
                 .egress = {},
                 .env = {}}};
  auto sink = std::make_shared<collecting_sink>();
  opts.spans = sink;
  {
    auto made = sandbox::runtime::create(opts);
    REQUIRE(made.has_value());
    auto& rt = *made;
    const auto queued = ticket_for("queued", true);
    const auto solo = ticket_for("solo", true);

    // 1. A session takes its tenant's one slot and keeps it while it lives.
    auto a = open(rt, {.tool = "sleeper"}, queued);
    REQUIRE(a.code == code::ok);
    REQUIRE(a.session);
    CHECK(rt.queue_stats().running == 1);

    // 2. Another session of the tenant waits for it, past its queue deadline: queue_timeout,
    //    nothing started; a run of the tenant too.
    auto b = open(rt, {.tool = "sleeper"}, queued);
    INFO("b: " << b.message);
    CHECK(b.code == code::queue_timeout);
    CHECK(!b.session);
    CHECK(!b.message.empty());
    auto run = rt.run({.runtime = "python3", .source = "print('hi')"}, queued);
    CHECK(run.code == code::queue_timeout);
    CHECK(rt.queue_stats().running == 1);

    // 3. Closing the session releases its slot: the tenant runs again.
    auto ra = a.session->async_close(asio::use_future).get();
    CHECK(ra.end == session_end::closed);
    REQUIRE(eventually([&] { return rt.queue_stats().running == 0; }));
    auto after_close = rt.run({.runtime = "python3", .source = "print('hi')"}, queued);
    CHECK(after_close.code == code::ok);
    CHECK(after_close.std_out.summary == "hi\n");

    // 4. A session that ends by itself (idle timeout) releases its slot at its end, while
    //    the host still holds the session object.
    auto c =
        open(rt, {.tool = "sleeper", .max_lifetime = std::nullopt, .idle_timeout = 300ms}, queued);
    REQUIRE(c.code == code::ok);
    CHECK(rt.queue_stats().running == 1);
    REQUIRE(eventually([&] { return c.session->stats().ended; }));
    REQUIRE(eventually([&] { return rt.queue_stats().running == 0; }));
    auto d = open(rt, {.tool = "sleeper"}, queued);
    REQUIRE(d.code == code::ok);

    // 5. A tenant with no queue: the second session is refused at once with capacity.
    auto e = open(rt, {.tool = "sleeper"}, solo);
    REQUIRE(e.code == code::ok);
    auto f = open(rt, {.tool = "sleeper"}, solo);
    INFO("f: " << f.message);
    CHECK(f.code == code::capacity);
    CHECK(!f.session);
    CHECK(rt.queue_stats().rejected >= 1);

    // 6. One span per session, at its end: named sandbox.session, with the run's attributes
    //    and the session's end and byte counts.
    auto rc = c.session->async_close(asio::use_future).get();
    CHECK(rc.end == session_end::idle_timeout);
    (void)d.session->async_close(asio::use_future).get();
    (void)e.session->async_close(asio::use_future).get();
    auto sa = sink->find(a.session->id());
    REQUIRE(sa.has_value());
    CHECK(sa->name == "sandbox.session");
    CHECK(text(*sa, "error_code") == "ok");
    CHECK(text(*sa, "sandbox.session.end") == "closed");
    CHECK(text(*sa, "sandbox.tenant") == "queued");
    CHECK(text(*sa, "sandbox.isolation") == "process");
    CHECK(text(*sa, "sandbox.runtime") == "sleeper");
    CHECK(text(*sa, "sandbox.session.bytes_to_server") == "0");
    CHECK(sa->end >= sa->start);
    auto sc = sink->find(c.session->id());
    REQUIRE(sc.has_value());
    CHECK(text(*sc, "error_code") == "timeout");
    CHECK(text(*sc, "sandbox.session.end") == "idle_timeout");
    // The refused ones: a span each, with the scheduler's code.
    CHECK(sink->count("sandbox.session", "queue_timeout") == 1);
    CHECK(sink->count("sandbox.session", "capacity") == 1);
    CHECK(sink->count("sandbox.run", "queue_timeout") == 1);
    CHECK(sink->count("sandbox.session", "ok") == 3);  // a, d, e
    REQUIRE(eventually([&] { return rt.queue_stats().running == 0; }));
  }
  itest::check_host_unchanged(before);
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}
