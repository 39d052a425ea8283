// Sessions' admission (src/runtime/session.cpp) without processes: the registry, the ticket and
// the host decide before any backend is asked; and the npm package pins of image builds.
#include "sandbox/session.hpp"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <functional>

#include "sandbox/json.hpp"
#include "sandbox/receipt.hpp"
#include "sandbox/signed_ticket.hpp"
#include "sandbox/testing/fake_backend.hpp"
#include "store/image_build.hpp"
#include "unit/runtime/runtime_test_support.hpp"

namespace asio = boost::asio;
using sandbox::code;
using sandbox::tool_entry;

namespace {

sandbox::tool_entry entry(std::string name) {
  return {.name = std::move(name),
          .image = "python3",
          .image_digest = std::nullopt,
          .binary = "/bin/cat",
          .args = {},
          .input = sandbox::tool_input::stdin_bytes,
          .isolation = sandbox::isolation::process,
          .profile = {},
          .egress = {},
          .env = {}};
}

sandbox::runtime_options options() {
  sandbox::runtime_options o;
  o.blobs = sandbox::make_memory_blob_store();
  o.fixed_digests = {{"python3", sandbox::testing::fake_digest("python3")}};
  o.process_backend = false;
  o.log = [](sandbox::log_level, std::string_view) {};
  o.fixed_digests["tools"] = sandbox::testing::fake_digest("tools");
  // The one registry (runtime_options::tools): faulty entries never get this far (runtime
  // creation refuses them: see "a faulty registry" below).
  o.tools = {entry("cat")};
  auto egress = entry("fetcher");
  egress.egress = {"API.Example.com.", "*.example.org"};
  o.tools.push_back(egress);
  auto gv = entry("strong");
  gv.isolation = sandbox::isolation::gvisor;
  o.tools.push_back(gv);
  return o;
}

// Opens on a runtime whose executor is `io` (run here, after the call: a completion
// inside the call would be seen).
sandbox::session_start open(asio::io_context& io, sandbox::runtime& rt,
                            sandbox::session_request req, const sandbox::ticket& t) {
  std::optional<sandbox::session_start> got;
  rt.async_open_session(std::move(req), t,
                        [&](boost::system::error_code ec, sandbox::session_start s) {
                          CHECK(!ec);
                          got = std::move(s);
                        });
  CHECK(!got.has_value());  // never completes inside the call
  io.restart();
  for (int i = 0; i < 1000 && !got; ++i) io.run_one_for(std::chrono::milliseconds(100));
  REQUIRE(got.has_value());
  return *got;
}

/// A ticket granting tool.run for `tools` (and code.execute only when `execute`).
sandbox::ticket tool_ticket(std::vector<std::string> tools = {"*"}, bool execute = false) {
  sandbox::ticket_spec spec;
  spec.id = "t-tools";
  spec.tenant = "acme";
  spec.execute = execute;
  spec.tools = std::move(tools);
  auto t = sandbox::ticket_issuer{}.issue(spec);
  REQUIRE(t.has_value());
  return *t;
}

}  // namespace

TEST_CASE("session admission: the request names an entry, nothing else", "[session]") {
  asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), options());
  REQUIRE(rt.has_value());
  auto t = tool_ticket();

  auto unknown = open(io, *rt, {.tool = "/bin/sh"}, t);
  CHECK(unknown.code == code::invalid_request);
  CHECK(unknown.message == "tool: no registered tool named '/bin/sh'");
  CHECK(!unknown.session);

  auto zero = open(io, *rt, {.tool = "cat", .max_lifetime = std::chrono::milliseconds(0)}, t);
  CHECK(zero.code == code::invalid_request);
  CHECK(zero.message.find("max_lifetime") != std::string::npos);
  auto neg = open(
      io, *rt,
      {.tool = "cat", .max_lifetime = std::nullopt, .idle_timeout = std::chrono::milliseconds(-5)},
      t);
  CHECK(neg.code == code::invalid_request);
  CHECK(neg.message.find("idle_timeout") != std::string::npos);
}

TEST_CASE("session registry: faulty entries refuse runtime creation, naming the field",
          "[session]") {
  struct faulty {
    const char* what;
    std::function<void(tool_entry&)> spoil;
    const char* logged;
  };
  const std::vector<faulty> cases{
      {"relative binary", [](tool_entry& e) { e.binary = "bin/cat"; }, "tools[1].binary: "},
      {"dots", [](tool_entry& e) { e.binary = "/usr/../bin/cat"; }, "tools[1].binary: "},
      {"bad egress",
       [](tool_entry& e) {
         e.egress = {"api.example.com", "not a host!"};
       },
       "tools[1].egress[1]: not a host name"},
      {"loader variable",
       [](tool_entry& e) {
         e.env = {{"LD_PRELOAD", "/tmp/x.so"}};
       },
       "tools[1].env['LD_PRELOAD']"}};
  for (const auto& c : cases) {
    INFO(c.what);
    auto o = options();
    std::vector<std::string> logged;
    o.log = [&](sandbox::log_level, std::string_view l) { logged.emplace_back(l); };
    auto bad = entry("bad");
    c.spoil(bad);
    o.tools = {entry("cat"), bad};
    asio::io_context io;
    auto rt = sandbox::runtime::create(io.get_executor(), o);
    CHECK_FALSE(rt.has_value());
    CHECK(std::any_of(logged.begin(), logged.end(),
                      [&](const std::string& l) { return l.find(c.logged) != std::string::npos; }));
  }
}

TEST_CASE("session registry: an entry's egress is kept canonical and needs container",
          "[session]") {
  asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), options());
  REQUIRE(rt.has_value());
  const auto cat = rt->catalog();
  REQUIRE(cat.tools.count("fetcher") == 1);
  CHECK(cat.tools.at("fetcher").entry.egress ==
        std::vector<std::string>{"api.example.com", "*.example.org"});
  // Only a process-level backend: the entry with egress is never run there.
  rt->add_backend(std::make_shared<sandbox::testing::fake_backend>(sandbox::isolation::process));
  auto net = open(io, *rt, {.tool = "fetcher"}, tool_ticket());
  CHECK(net.code == code::runtime_unavailable);
  CHECK(net.message.find("'container'") != std::string::npos);
}

TEST_CASE("session admission: the ticket decides whether, the host where", "[session]") {
  asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), options());
  REQUIRE(rt.has_value());

  // code.execute is not enough: a session is a registered tool's, granted by name.
  auto exec_only = sandbox::test::make_ticket();
  auto denied = open(io, *rt, {.tool = "cat"}, exec_only);
  CHECK(denied.code == code::action_denied);
  CHECK(denied.message == "tool: ticket does not grant tool.run for 'cat'");
  auto other = open(io, *rt, {.tool = "cat"}, tool_ticket({"markdown"}));
  CHECK(other.code == code::action_denied);

  sandbox::ticket_spec old;
  old.id = "t-old";
  old.tenant = "acme";
  old.tools = {"*"};
  old.expires_at = std::chrono::system_clock::now() - std::chrono::hours(1);
  auto expired = open(io, *rt, {.tool = "cat"}, sandbox::ticket_issuer{}.issue(old).value());
  CHECK(expired.code == code::action_denied);
  CHECK(expired.message == "ticket expired");

  // No backend registered at all: never a weaker level, never silently.
  auto t = tool_ticket({"cat", "strong"});
  auto none = open(io, *rt, {.tool = "cat"}, t);
  CHECK(none.code == code::runtime_unavailable);

  // A level that exists, whose backend keeps no sessions (the fake): refused, nothing
  // started.
  rt->add_backend(std::make_shared<sandbox::testing::fake_backend>(sandbox::isolation::gvisor));
  auto strong = open(io, *rt, {.tool = "strong"}, t);
  CHECK(strong.code == code::runtime_unavailable);
  CHECK(!strong.session);
}

TEST_CASE("image build: npm packages must be pinned to one exact version", "[session][image]") {
  using sandbox::detail::is_pinned_npm_package;
  CHECK(is_pinned_npm_package("@modelcontextprotocol/server-everything@2025.9.25"));
  CHECK(is_pinned_npm_package("left-pad@1.3.0"));
  CHECK(is_pinned_npm_package("pkg@1.0.0-beta.2"));
  for (const char* bad :
       {"left-pad", "left-pad@^1.3.0", "left-pad@latest", "left-pad@1.3", "left-pad@>=1.0.0",
        "@scope@1.0.0", "@scope/@1.0.0", "git+https://x/y@1.0.0", "../evil@1.0.0", "./x@1.0.0",
        "Left-Pad@1.0.0", "left pad@1.0.0", "x@1.0.0-", "x@1..0", "--registry=http://evil@1.0.0",
        "a@1.0.0 b@2.0.0"}) {
    INFO(bad);
    CHECK(!is_pinned_npm_package(bad));
  }
}

namespace {

// A session backend without processes: each open succeeds at once with a session that does
// nothing but end when closed (reporting its end through `session_job::on_end`, as the real
// backends do), or — `drop_on_end` — a backend that loses `on_end` uncalled.
class scripted_session_backend final : public sandbox::backend {
 public:
  explicit scripted_session_backend(bool drop_on_end = false) : drop_(drop_on_end) {}
  sandbox::isolation isolation() const noexcept override { return sandbox::isolation::process; }
  std::string_view name() const noexcept override { return "scripted"; }
  void shutdown() noexcept override {}
  std::atomic<int> opened{0};
  std::chrono::milliseconds last_lifetime{0};  ///< the last open's granted lifetime
  bool last_ends_at_expiry = false;            ///< and whether it ends at the ticket's expiry

  class scripted_session final : public sandbox::session {
   public:
    scripted_session(std::string id, std::function<void(sandbox::session_result&)> on_end,
                     boost::asio::any_io_executor ex)
        : id_(std::move(id)), on_end_(std::move(on_end)), ex_(std::move(ex)) {}
    const std::string& id() const noexcept override { return id_; }
    void close_stdin() override {}
    sandbox::session_stats stats() const override { return {}; }

   private:
    void do_write(boost::asio::const_buffer,
                  boost::asio::any_completion_handler<void(boost::system::error_code, std::size_t)>
                      h) override {
      sandbox::detail::post_completion(ex_, std::move(h), boost::system::error_code{},
                                       std::size_t{0});
    }
    void do_read(boost::asio::mutable_buffer,
                 boost::asio::any_completion_handler<void(boost::system::error_code, std::size_t)>
                     h) override {
      sandbox::detail::post_completion(ex_, std::move(h), boost::system::error_code{},
                                       std::size_t{0});
    }
    void do_close(boost::asio::any_completion_handler<void(boost::system::error_code,
                                                           sandbox::session_result)>
                      h) override {
      sandbox::session_result r;
      r.end = sandbox::session_end::closed;
      r.result.code = code::ok;
      r.bytes_to_server = 5;
      r.result.run_id = id_;
      r.result.backend = "scripted";
      if (auto f = std::move(on_end_)) f(r);
      on_end_ = nullptr;
      sandbox::detail::post_completion(ex_, std::move(h), boost::system::error_code{}, r);
    }
    std::string id_;
    std::function<void(sandbox::session_result&)> on_end_;
    boost::asio::any_io_executor ex_;
  };

  void open_session(sandbox::run_job job, sandbox::session_job sj,
                    session_handler handler) override {
    ++opened;
    last_lifetime = job.admitted.request.timeout;
    last_ends_at_expiry = sj.lifetime_ends_at_ticket_expiry;
    if (drop_) sj.on_end = nullptr;  // lost uncalled: the runtime must still free the slot
    auto s = std::make_shared<scripted_session>(job.run_id, std::move(sj.on_end), job.executor);
    sandbox::detail::post_completion(
        job.executor, std::move(handler), boost::system::error_code{},
        sandbox::session_start{.session = s, .code = code::ok, .message = {}});
  }

 private:
  void do_execute(sandbox::run_job,
                  boost::asio::any_completion_handler<void(boost::system::error_code,
                                                           sandbox::run_result)>) override {}
  bool drop_;
};

std::string attr(const sandbox::span& s, const std::string& key) {
  auto it = s.attributes.find(key);
  if (it == s.attributes.end()) return "(absent)";
  if (const auto* v = std::get_if<std::string>(&it->second)) return *v;
  if (const auto* v = std::get_if<std::int64_t>(&it->second)) return std::to_string(*v);
  return std::get<bool>(it->second) ? "true" : "false";
}

}  // namespace

TEST_CASE("session scheduling: a slot per session until its end; queue_timeout, capacity, spans",
          "[session][scheduler][runtime]") {
  asio::io_context io;
  auto o = options();
  auto sink = std::make_shared<sandbox::test::recording_sink>();
  o.spans = sink;
  o.scheduler.max_running = 1;
  o.scheduler.max_queued = 1;
  o.scheduler.default_class = {.max_running = 1,
                               .max_queued = 1,
                               .weight = 1,
                               .queue_deadline = std::chrono::milliseconds(50),
                               .max_session_slots = 3};  // the slots bind here, not this cap
  o.scheduler.max_session_slots = 3;
  auto rt = sandbox::runtime::create(io.get_executor(), o);
  REQUIRE(rt.has_value());
  auto backend = std::make_shared<scripted_session_backend>();
  rt->add_backend(backend);
  const auto t = tool_ticket({"cat"});

  auto a = open(io, *rt, {.tool = "cat"}, t);
  REQUIRE(a.code == code::ok);
  REQUIRE(a.session);
  CHECK(rt->queue_stats().running == 1);

  // The one slot is held: the next open waits past its deadline; nothing reached the backend.
  auto b = open(io, *rt, {.tool = "cat"}, t);
  CHECK(b.code == code::queue_timeout);
  CHECK(!b.session);
  CHECK(backend->opened == 1);

  // A full queue refuses at once: one open waits (its completion is not run yet), the next
  // finds the queue full.
  std::optional<sandbox::session_start> waiting;
  rt->async_open_session(
      {.tool = "cat"}, t,
      [&](boost::system::error_code, sandbox::session_start s) { waiting = std::move(s); });
  auto c = open(io, *rt, {.tool = "cat"}, t);
  CHECK(c.code == code::capacity);
  io.restart();
  for (int i = 0; i < 1000 && !waiting; ++i) io.run_one_for(std::chrono::milliseconds(100));
  REQUIRE(waiting.has_value());
  CHECK(waiting->code == code::queue_timeout);

  // The end releases the slot: the next open gets it.
  std::optional<sandbox::session_result> closed;
  a.session->async_close([&](boost::system::error_code, sandbox::session_result r) { closed = r; });
  io.restart();
  for (int i = 0; i < 1000 && !closed; ++i) io.run_one_for(std::chrono::milliseconds(100));
  REQUIRE(closed.has_value());
  for (int i = 0; i < 100 && rt->queue_stats().running != 0; ++i) {
    io.run_one_for(std::chrono::milliseconds(10));
  }
  CHECK(rt->queue_stats().running == 0);
  auto d = open(io, *rt, {.tool = "cat"}, t);
  CHECK(d.code == code::ok);
  CHECK(rt->queue_stats().running == 1);

  // One span per session: the closed one with its end and bytes, the refused ones with their
  // codes.
  auto spans = sink->spans();
  std::size_t closed_spans = 0, queue_timeouts = 0, capacities = 0;
  for (const auto& s : spans) {
    CHECK(s.name == "sandbox.session");
    CHECK(attr(s, "sandbox.tenant") == "acme");
    CHECK(attr(s, "sandbox.runtime") == "cat");
    const auto ec = attr(s, "error_code");
    if (ec == "ok") {
      ++closed_spans;
      CHECK(attr(s, "sandbox.run_id") == a.session->id());
      CHECK(attr(s, "sandbox.session.end") == "closed");
      CHECK(attr(s, "sandbox.session.bytes_to_server") == "5");
    }
    queue_timeouts += ec == "queue_timeout" ? 1 : 0;
    capacities += ec == "capacity" ? 1 : 0;
  }
  CHECK(closed_spans == 1);
  CHECK(queue_timeouts == 2);
  CHECK(capacities == 1);
}

TEST_CASE("session scheduling: a backend that loses on_end still gives the slot back",
          "[session][scheduler][runtime]") {
  asio::io_context io;
  auto o = options();
  auto sink = std::make_shared<sandbox::test::recording_sink>();
  o.spans = sink;
  o.scheduler.max_running = 1;
  auto rt = sandbox::runtime::create(io.get_executor(), o);
  REQUIRE(rt.has_value());
  rt->add_backend(std::make_shared<scripted_session_backend>(true));
  auto a = open(io, *rt, {.tool = "cat"}, tool_ticket({"cat"}));
  REQUIRE(a.code == code::ok);
  // Its on_end is gone with the open: the slot is free, the span says `internal`.
  io.restart();
  for (int i = 0; i < 100 && rt->queue_stats().running != 0; ++i) {
    io.run_one_for(std::chrono::milliseconds(10));
  }
  CHECK(rt->queue_stats().running == 0);
  auto spans = sink->spans();
  REQUIRE(spans.size() == 1);
  CHECK(attr(spans[0], "error_code") == "internal");
}

TEST_CASE("session admission: the ticket's max_timeout and expiry bound the lifetime",
          "[session][ticket]") {
  using namespace std::chrono_literals;
  asio::io_context io;
  auto rt = sandbox::runtime::create(io.get_executor(), options());
  REQUIRE(rt.has_value());
  auto backend = std::make_shared<scripted_session_backend>();
  rt->add_backend(backend);
  auto issue = [](std::chrono::milliseconds max_timeout,
                  std::optional<std::chrono::system_clock::time_point> expires) {
    sandbox::ticket_spec spec;
    spec.id = "t-time";
    spec.tenant = "acme";
    spec.execute = false;
    spec.tools = {"*"};
    spec.max_timeout = max_timeout;
    spec.expires_at = expires;
    auto t = sandbox::ticket_issuer{}.issue(spec);
    REQUIRE(t.has_value());
    return *t;
  };
  auto close_it = [&](sandbox::session_start& st) {
    std::optional<sandbox::session_result> r;
    st.session->async_close([&](boost::system::error_code, sandbox::session_result x) { r = x; });
    io.restart();
    for (int i = 0; i < 1000 && !r; ++i) io.run_one_for(std::chrono::milliseconds(100));
    REQUIRE(r.has_value());
  };

  // The ticket's ceiling bounds the request's lifetime and the host's default alike.
  auto a = open(io, *rt, {.tool = "cat", .max_lifetime = 60s, .idle_timeout = std::nullopt},
                issue(1000ms, std::nullopt));
  REQUIRE(a.code == code::ok);
  CHECK(backend->last_lifetime == 1000ms);
  CHECK(!backend->last_ends_at_expiry);
  close_it(a);
  auto b = open(io, *rt, {.tool = "cat"}, issue(2500ms, std::nullopt));
  REQUIRE(b.code == code::ok);
  CHECK(backend->last_lifetime == 2500ms);
  close_it(b);
  // Under the ceiling, the request's own lifetime stands.
  auto c = open(io, *rt, {.tool = "cat", .max_lifetime = 700ms, .idle_timeout = std::nullopt},
                issue(8000ms, std::nullopt));
  REQUIRE(c.code == code::ok);
  CHECK(backend->last_lifetime == 700ms);
  close_it(c);

  // An expiry sooner than the lifetime cuts it to the time left, flagged for the backend
  // (the end is reported as ticket_expired).
  auto d = open(io, *rt, {.tool = "cat", .max_lifetime = 600s, .idle_timeout = std::nullopt},
                issue(600000ms, std::chrono::system_clock::now() + 30s));
  REQUIRE(d.code == code::ok);
  CHECK(backend->last_ends_at_expiry);
  CHECK(backend->last_lifetime > 28s);
  CHECK(backend->last_lifetime <= 30s);
  close_it(d);
  // A later expiry does not touch the lifetime.
  auto e = open(io, *rt, {.tool = "cat", .max_lifetime = 5s, .idle_timeout = std::nullopt},
                issue(600000ms, std::chrono::system_clock::now() + 3600s));
  REQUIRE(e.code == code::ok);
  CHECK(!backend->last_ends_at_expiry);
  CHECK(backend->last_lifetime == 5s);
  close_it(e);

  // The wire name of the new end.
  CHECK(sandbox::to_string(sandbox::session_end::ticket_expired) == "ticket_expired");
  sandbox::session_result r;
  r.end = sandbox::session_end::ticket_expired;
  r.result.code = code::timeout;
  auto back = sandbox::decode_session_result(sandbox::encode(r));
  REQUIRE(back.has_value());
  CHECK(back->end == sandbox::session_end::ticket_expired);
}

TEST_CASE("session scheduling: sessions hold at most their share of the slots",
          "[session][scheduler][runtime]") {
  auto tenant_ticket = [](const std::string& tenant) {
    sandbox::ticket_spec spec;
    spec.id = "t-" + tenant;
    spec.tenant = tenant;
    spec.execute = false;
    spec.tools = {"*"};
    auto t = sandbox::ticket_issuer{}.issue(spec);
    REQUIRE(t.has_value());
    return *t;
  };
  auto close_it = [](asio::io_context& io, sandbox::session_start& st) {
    std::optional<sandbox::session_result> r;
    st.session->async_close([&](boost::system::error_code, sandbox::session_result x) { r = x; });
    io.restart();
    for (int i = 0; i < 1000 && !r; ++i) io.run_one_for(std::chrono::milliseconds(100));
    REQUIRE(r.has_value());
  };
  SECTION("configured caps: host-wide and per tenant, `capacity` at once beyond them") {
    asio::io_context io;
    auto o = options();
    o.scheduler.max_running = 6;
    o.scheduler.max_session_slots = 3;
    o.scheduler.default_class.max_running = 6;
    o.scheduler.default_class.max_session_slots = 2;
    auto rt = sandbox::runtime::create(io.get_executor(), o);
    REQUIRE(rt.has_value());
    auto backend = std::make_shared<scripted_session_backend>();
    rt->add_backend(backend);
    auto a1 = open(io, *rt, {.tool = "cat"}, tenant_ticket("a"));
    auto a2 = open(io, *rt, {.tool = "cat"}, tenant_ticket("a"));
    REQUIRE(a1.code == code::ok);
    REQUIRE(a2.code == code::ok);
    auto a3 = open(io, *rt, {.tool = "cat"}, tenant_ticket("a"));
    CHECK(a3.code == code::capacity);
    CHECK(a3.message.find("tenant at its session cap") != std::string::npos);
    auto b1 = open(io, *rt, {.tool = "cat"}, tenant_ticket("b"));
    REQUIRE(b1.code == code::ok);
    auto c1 = open(io, *rt, {.tool = "cat"}, tenant_ticket("c"));
    CHECK(c1.code == code::capacity);
    CHECK(c1.message.find("host at its session cap") != std::string::npos);
    CHECK(c1.message.find("limit 3") != std::string::npos);
    // Nothing of the refused ones reached the backend; 3 of the 6 slots stay for runs.
    CHECK(backend->opened == 3);
    CHECK(rt->queue_stats().running == 3);
    CHECK(rt->queue_stats().session_slots == 3);
    // A session's end gives its place back.
    close_it(io, a1);
    for (int i = 0; i < 100 && rt->queue_stats().session_slots != 2; ++i) {
      io.run_one_for(std::chrono::milliseconds(10));
    }
    CHECK(rt->queue_stats().session_slots == 2);
    auto c2 = open(io, *rt, {.tool = "cat"}, tenant_ticket("c"));
    CHECK(c2.code == code::ok);
    close_it(io, a2);
    close_it(io, b1);
    close_it(io, c2);
  }
  SECTION("defaults: half of max_running, host-wide and per tenant") {
    asio::io_context io;
    auto o = options();
    o.scheduler.max_running = 4;
    o.scheduler.default_class.max_running = 2;
    auto rt = sandbox::runtime::create(io.get_executor(), o);
    REQUIRE(rt.has_value());
    rt->add_backend(std::make_shared<scripted_session_backend>());
    auto a1 = open(io, *rt, {.tool = "cat"}, tenant_ticket("a"));
    REQUIRE(a1.code == code::ok);
    CHECK(open(io, *rt, {.tool = "cat"}, tenant_ticket("a")).code ==
          code::capacity);  // tenant cap: 1 of 2
    auto b1 = open(io, *rt, {.tool = "cat"}, tenant_ticket("b"));
    REQUIRE(b1.code == code::ok);
    CHECK(open(io, *rt, {.tool = "cat"}, tenant_ticket("c")).code ==
          code::capacity);  // host cap: 2 of 4
    CHECK(rt->queue_stats().running == 2);
    close_it(io, a1);
    close_it(io, b1);
  }
}

TEST_CASE("session receipts: a session's closing result carries a signed receipt",
          "[session][receipt]") {
  asio::io_context io;
  auto o = options();
  const auto pem = sandbox::generate_ed25519_key().value();
  o.receipt_signer = std::make_shared<const sandbox::receipt_signer>(
      sandbox::receipt_signer::from_pem("r1", pem.private_pem).value());
  auto rt = sandbox::runtime::create(io.get_executor(), o);
  REQUIRE(rt.has_value());
  rt->add_backend(std::make_shared<scripted_session_backend>());
  const auto t = tool_ticket({"cat"});
  auto st = open(io, *rt, {.tool = "cat"}, t);
  REQUIRE(st.code == code::ok);
  std::optional<sandbox::session_result> r;
  st.session->async_close([&](boost::system::error_code, sandbox::session_result x) { r = x; });
  io.restart();
  for (int i = 0; i < 1000 && !r; ++i) io.run_one_for(std::chrono::milliseconds(100));
  REQUIRE(r.has_value());
  REQUIRE(r->result.receipt.has_value());
  sandbox::receipt_verifier v;
  REQUIRE(v.add_key("r1", pem.public_pem).has_value());
  auto claims = v.verify(*r->result.receipt);
  REQUIRE(claims.has_value());
  CHECK(claims->run_id == st.session->id());
  CHECK(claims->tenant == "acme");
  CHECK(claims->ticket_id == t.id());
  CHECK(claims->code == code::ok);
  CHECK(claims->runtime == r->result.runtime);
  CHECK(claims->request_sha256.size() == 64);
  CHECK(!sandbox::receipt_mismatch(*claims, r->result).has_value());
  // A session that never started (refused) has no receipt to give: nothing ran.
  auto refused = open(io, *rt, {.tool = "nope"}, t);
  CHECK(refused.code == code::invalid_request);
}
