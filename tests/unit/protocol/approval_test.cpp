// Network by approval, through the runtime with the fake backend: no approver, approve,
// deny, defer and resume, a derived ticket broader than the approval, expiry, wrong digest,
// an approver that fails, drops or never answers, cancellation and destruction while a
// question is pending.
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/post.hpp>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>

#include "sandbox/sandbox.hpp"
#include "unit/runtime/runtime_test_support.hpp"

namespace asio = boost::asio;
using namespace std::chrono_literals;
using sandbox::approval_decision;
using sandbox::approval_request;
using sandbox::code;
using sandbox::run_result;
using sandbox::test::eventually;
using sandbox::test::make_ticket;
using sandbox::test::py;
using sandbox::testing::fake_backend;
using sandbox::testing::fake_digest;

namespace {

/// An approver scripted by the test: records each question and answers with `decide`
/// (nullptr: keep the answer callback for later).
struct scripted {
  std::mutex mu;
  std::vector<approval_request> asked;
  std::vector<sandbox::approval_callback> pending;
  std::function<std::optional<approval_decision>(const approval_request&)> decide;

  std::shared_ptr<sandbox::approver> approver() {
    return sandbox::make_callback_approver(
        [this](approval_request q, sandbox::approval_callback answer) {
          std::optional<approval_decision> d;
          {
            std::lock_guard lk(mu);
            asked.push_back(q);
            if (decide) d = decide(q);
            if (!d) pending.push_back(answer);
          }
          if (d) answer(std::move(*d));
        });
  }
  std::size_t asked_count() {
    std::lock_guard lk(mu);
    return asked.size();
  }
  approval_request last() {
    std::lock_guard lk(mu);
    return asked.back();
  }
};

sandbox::run_request net_py(std::string source = "print(1)",
                            std::vector<std::string> egress = {"api.example.com"}) {
  auto r = py(std::move(source));
  r.network = true;
  r.egress = std::move(egress);
  return r;
}

/// A fake runtime (container-level fake backend), with `s`'s approver when `with_approver`.
sandbox::runtime fake_runtime(std::shared_ptr<fake_backend> fake, scripted* s) {
  auto made =
      sandbox::testing::make_runtime(std::move(fake), {}, s != nullptr ? s->approver() : nullptr);
  REQUIRE(made.has_value());
  return std::move(*made);
}

struct fixture {
  std::shared_ptr<fake_backend> fake =
      std::make_shared<fake_backend>(sandbox::isolation::container);
  scripted s;
  sandbox::runtime rt;
  sandbox::ticket parent = make_ticket("acme");

  explicit fixture(bool with_approver = true)
      : rt(fake_runtime(fake, with_approver ? &s : nullptr)) {}
};

// The helpers below run inside approvers, on the runtime's thread: no Catch assertions
// there (they are not thread-safe); a failure throws, which ends the run
// `approval_required` and fails the test's own checks.

/// The derived ticket for `q`, as a host's approver mints it.
sandbox::ticket derive(const sandbox::ticket& parent, const approval_request& q,
                       sandbox::derive_options o = {}) {
  return sandbox::ticket_issuer{}.derive(parent, q, std::move(o)).value();
}

/// `t` re-decoded with `edit` applied to its JSON: a ticket the approver made up.
sandbox::ticket forged(const sandbox::ticket& t,
                       const std::function<void(nlohmann::ordered_json&)>& edit) {
  auto j = nlohmann::ordered_json::parse(sandbox::encode(t));
  edit(j);
  return sandbox::ticket_issuer{}.decode(j.dump()).value();
}

}  // namespace

TEST_CASE("no approver: a network request without code.network is action_denied", "[approval]") {
  fixture f(false);
  auto r = f.rt.run(net_py(), f.parent);
  CHECK(r.code == code::action_denied);
  CHECK(r.message == "network: ticket does not grant code.network");
  CHECK_FALSE(r.approval);
  CHECK(f.fake->requests().empty());
}

TEST_CASE("approve: the run proceeds under the derived ticket", "[approval]") {
  fixture f;
  auto blob = f.rt.blobs()->put("acme", "a,b\n1,2\n");
  REQUIRE(blob.has_value());
  f.s.decide = [&](const approval_request& q) {
    return approval_decision::approve(derive(f.parent, q));
  };
  auto req = net_py("print(open('data.csv').read())",
                    {"API.Example.com.", "*.cdn.example", "api.example.com"});
  req.files_in = {{.name = "data.csv", .blob = *blob}};
  req.timeout = 60s;  // clamped to the ticket's 8 s
  auto r = f.rt.run(req, f.parent);
  CHECK(r.code == code::ok);
  CHECK(r.message.empty());
  CHECK_FALSE(r.approval);

  // What the approver was asked: the run exactly as it would start.
  REQUIRE(f.s.asked_count() == 1);
  const approval_request q = f.s.last();
  CHECK(q.ticket_id == f.parent.id());
  CHECK(q.tenant == "acme");
  CHECK(q.domains == std::vector<std::string>{"api.example.com", "*.cdn.example"});
  CHECK(q.timeout == 8000ms);
  CHECK(q.memory_limit_bytes == 256ULL << 20);
  REQUIRE(q.files_in.size() == 1);
  CHECK(q.files_in[0].name == "data.csv");
  CHECK("sha256:" + q.files_in[0].sha256 == *blob);
  CHECK(q.files_in[0].sha256 == sandbox::blob_id_of("a,b\n1,2\n").substr(7));
  CHECK(q.files_in[0].bytes == 8);
  CHECK(q.source_sha256 == sandbox::blob_id_of(req.source).substr(7));
  CHECK(q.source_bytes == req.source.size());
  CHECK(q.isolation == sandbox::isolation::container);
  CHECK(q.runtime == sandbox::runtime_info{"python3", fake_digest("python3")});

  // What ran: under the derived ticket, at container level, the approved domains.
  REQUIRE(f.fake->requests().size() == 1);
  const auto ran = f.fake->requests()[0];
  CHECK(ran.ticket_id.rfind("d-", 0) == 0);
  CHECK(ran.tenant == "acme");
  CHECK(ran.isolation == sandbox::isolation::container);
  CHECK(ran.request.egress == q.domains);
  CHECK(ran.request.network);
  CHECK(r.isolation == sandbox::isolation::container);
}

TEST_CASE("approve fewer domains: the run reaches only those", "[approval]") {
  fixture f;
  f.s.decide = [&](const approval_request& q) {
    return approval_decision::approve(
        derive(f.parent, q, {.domains = std::vector<std::string>{"img.cdn.example"}}));
  };
  auto r = f.rt.run(net_py("print(1)", {"api.example.com", "*.cdn.example"}), f.parent);
  CHECK(r.code == code::ok);
  REQUIRE(f.fake->requests().size() == 1);
  CHECK(f.fake->requests()[0].request.egress == std::vector<std::string>{"img.cdn.example"});
}

TEST_CASE("deny: approval_denied, nothing runs", "[approval]") {
  fixture f;
  f.s.decide = [](const approval_request&) {
    return approval_decision::deny("not for \x1b[31mthis\x1b[0m task");
  };
  auto r = f.rt.run(net_py(), f.parent);
  CHECK(r.code == code::approval_denied);
  CHECK(r.message == "approval denied: not for \\x1b[31mthis\\x1b[0m task");
  CHECK_FALSE(r.approval);
  CHECK(sandbox::test::is_run_id(r.run_id));
  CHECK(f.fake->requests().empty());
  f.s.decide = [](const approval_request&) { return approval_decision::deny(); };
  CHECK(f.rt.run(net_py(), f.parent).message == "approval denied");
}

TEST_CASE("defer, checkpoint, resume with the derived ticket", "[approval]") {
  fixture f;
  f.s.decide = [](const approval_request&) { return approval_decision::defer("ask the owner"); };
  const auto req = net_py("import urllib.request\n");
  auto r = f.rt.run(req, f.parent);
  CHECK(r.code == code::approval_required);
  CHECK(r.message == "network needs approval: ask the owner");
  REQUIRE(r.approval.has_value());
  CHECK(*r.approval == f.s.last());
  CHECK(f.fake->requests().empty());

  // The host checkpoints the result (or just the approval request) as JSON...
  const std::string stored = sandbox::encode(r);
  auto back = sandbox::decode_run_result(stored);
  REQUIRE(back.has_value());
  CHECK(*back == r);
  const std::string question = sandbox::encode(*r.approval);
  auto q = sandbox::decode_approval_request(question);
  REQUIRE(q.has_value());
  CHECK(*q == *r.approval);

  // ... a human says yes later; the host mints the derived ticket and resubmits the same
  // request under it (on a runtime without any approver: the ticket grants the network).
  const auto derived = derive(f.parent, *q);
  fixture plain(false);
  auto resumed = plain.rt.run(req, derived);
  CHECK(resumed.code == code::ok);
  REQUIRE(plain.fake->requests().size() == 1);
  CHECK(plain.fake->requests()[0].ticket_id == derived.id());

  SECTION("another program under the derived ticket: action_denied") {
    auto r2 = plain.rt.run(net_py("print('something else')"), derived);
    CHECK(r2.code == code::action_denied);
    CHECK(r2.message == "source: not the source the ticket's approval is for");
  }
  SECTION("more domains than approved: action_denied") {
    auto more = req;
    more.egress.push_back("evil.example");
    auto r2 = plain.rt.run(more, derived);
    CHECK(r2.code == code::action_denied);
    CHECK(r2.message == "egress: 'evil.example' is not allowed by the ticket");
  }
  SECTION("the host rolled its image since: digest_mismatch") {
    sandbox::runtime_options o;
    o.blobs = sandbox::make_memory_blob_store();
    o.fixed_digests = {{"python3", "sha256:" + std::string(64, '7')}};
    o.process_backend = false;
    o.log = [](sandbox::log_level, std::string_view) {};
    auto rolled = sandbox::runtime::create(std::move(o));
    REQUIRE(rolled.has_value());
    auto fake2 = std::make_shared<fake_backend>(sandbox::isolation::container);
    rolled->add_backend(fake2);
    auto r2 = rolled->run(req, derived);
    CHECK(r2.code == code::digest_mismatch);
    CHECK(r2.message == "ticket.runtime_digest: does not match the installed image of 'python3'");
    CHECK(fake2->requests().empty());
  }
  SECTION("a request pinning another digest: digest_mismatch") {
    auto pinned = req;
    pinned.runtime_digest = "sha256:" + std::string(64, '7');
    auto r2 = plain.rt.run(pinned, derived);
    CHECK(r2.code == code::digest_mismatch);
    CHECK(r2.message == "runtime_digest: does not match ticket.runtime_digest");
  }
  SECTION("an expired derived ticket: action_denied") {
    const auto old = derive(f.parent, *q, {.now = std::chrono::system_clock::now() - 2h});
    auto r2 = plain.rt.run(req, old);
    CHECK(r2.code == code::action_denied);
    CHECK(r2.message == "ticket expired");
  }
}

TEST_CASE("a derived ticket broader than the approval is refused; nothing starts", "[approval]") {
  fixture f;
  const std::string other_digest = "sha256:" + std::string(64, 'b');
  struct forgery {
    std::string what;
    std::function<sandbox::ticket(const sandbox::ticket& parent, const approval_request& q)> make;
    std::string message;  // after "approval: derived ticket refused: "
  };
  const std::vector<forgery> forgeries{
      {"domains not requested",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) { j["egress"].push_back("evil.example"); });
       },
       "egress: 'evil.example' was not approved"},
      {"a wider wildcard",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) { j["egress"] = {"*.example.com"}; });
       },
       "egress: '*.example.com' was not approved"},
      {"isolation below container",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) { j["isolation"] = "process"; });
       },
       "isolation: below 'container' for a network ticket"},
      {"another tenant",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) {
           j["tenant"] = "other";
           j["approval"]["tenant"] = "other";
         });
       },
       "the derived ticket does not answer this approval request"},
      {"a longer timeout than the parent's",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) { j["max_timeout_ms"] = 8001; });
       },
       "max_timeout_ms: above the parent's"},
      {"more memory than the parent's",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) { j["max_memory_bytes"] = (512ULL << 20) + 1; });
       },
       "max_memory_bytes: above the parent's"},
      {"no expiry",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) { j.erase("expires_at"); });
       },
       "expires_at: a derived ticket must expire"},
      {"an expiry more than an hour away",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) {
           j["expires_at"] = sandbox::format_rfc3339(std::chrono::system_clock::now() + 2h);
         });
       },
       "expires_at: more than 3600 s from now"},
      {"no digest pin",
       [](auto& p, auto& q) {
         return forged(derive(p, q), [](auto& j) { j.erase("runtime_digest"); });
       },
       "runtime_digest: an approved ticket must pin the image"},
      {"another digest than the approval's",
       [&](auto& p, auto& q) {
         return forged(derive(p, q), [&](auto& j) { j["runtime_digest"] = other_digest; });
       },
       "runtime_digest: not the image the approval is for"},
      {"an answer to another question",
       [](auto& p, auto& q) {
         auto other = q;
         other.source_sha256 = std::string(64, '0');
         return derive(p, other);
       },
       "the derived ticket does not answer this approval request"},
      {"derived from another parent",
       [](auto&, auto& q) {
         auto other_parent = make_ticket("acme");  // same id and tenant, but...
         auto s = other_parent.spec();
         s.id = "t-other";
         auto p2 = *sandbox::ticket_issuer{}.issue(s);
         auto q2 = q;
         q2.ticket_id = "t-other";
         return derive(p2, q2);
       },
       "the derived ticket does not answer this approval request"},
      {"already expired",
       [](auto& p, auto& q) {
         return derive(p, q, {.now = std::chrono::system_clock::now() - 1h});
       },
       "the derived ticket is expired"},
  };
  for (const auto& fg : forgeries) {
    INFO(fg.what);
    f.s.decide = [&](const approval_request& q) {
      return approval_decision::approve(fg.make(f.parent, q));
    };
    auto r = f.rt.run(net_py(), f.parent);
    CHECK(r.code == code::action_denied);
    CHECK(r.message == "approval: derived ticket refused: " + fg.message);
  }
  // Approve without a ticket.
  f.s.decide = [](const approval_request&) {
    return approval_decision{sandbox::approval_verdict::approve, std::nullopt, {}};
  };
  auto r = f.rt.run(net_py(), f.parent);
  CHECK(r.code == code::action_denied);
  CHECK(r.message == "approval: approved without a derived ticket");
  CHECK(f.fake->requests().empty());
}

TEST_CASE("the approver is asked only about runs that could start", "[approval]") {
  fixture f;
  f.s.decide = [](const approval_request&) { return approval_decision::defer(); };
  auto req = net_py();
  req.files_in = {{.name = "a", .blob = "sha256:" + std::string(64, 'f')}};
  CHECK(f.rt.run(req, f.parent).code == code::blob_not_found);
  CHECK(f.rt.run(net_py("print(1)", {"not a host"}), f.parent).code == code::invalid_request);
  CHECK(f.rt.run(net_py("print(1)", {}), f.parent).code == code::invalid_request);
  CHECK(f.rt.run(net_py(std::string(40000, 'x')), f.parent).code == code::source_too_large);
  CHECK(f.rt.run(net_py(), make_ticket("acme", sandbox::isolation::process, false)).code ==
        code::action_denied);
  CHECK(f.s.asked_count() == 0);
  // A ticket that grants the network for the domains needs nobody.
  auto spec = f.parent.spec();
  spec.egress = {"api.example.com"};
  auto granted = sandbox::ticket_issuer{}.issue(spec, sandbox::network_grant{});
  REQUIRE(granted.has_value());
  CHECK(f.rt.run(net_py(), *granted).code == code::ok);
  CHECK(f.rt.run(py("print(1)"), f.parent).code == code::ok);
  CHECK(f.s.asked_count() == 0);
  // A granted ticket asking for more domains is denied, not sent to the approver.
  CHECK(f.rt.run(net_py("print(1)", {"other.example"}), *granted).code == code::action_denied);
  CHECK(f.s.asked_count() == 0);
}

TEST_CASE("an approver that answers later, from another thread", "[approval]") {
  fixture f;  // decide unset: every answer is kept for later
  std::promise<run_result> done;
  std::atomic<bool> failed{false};
  f.rt.async_run(net_py(), f.parent, [&](boost::system::error_code ec, run_result r) {
    failed = static_cast<bool>(ec);
    done.set_value(std::move(r));
  });
  REQUIRE(eventually([&] { return f.s.asked_count() == 1; }));
  auto fut = done.get_future();
  CHECK(fut.wait_for(50ms) == std::future_status::timeout);  // the run waits for the answer
  CHECK(f.fake->requests().empty());
  sandbox::approval_callback answer;
  {
    std::lock_guard lk(f.s.mu);
    answer = f.s.pending.back();
  }
  std::thread([&, answer] {
    answer(approval_decision::approve(derive(f.parent, f.s.last())));
    answer(approval_decision::deny("too late"));  // only the first answer counts
  }).join();
  auto r = fut.get();
  CHECK_FALSE(failed.load());
  CHECK(r.code == code::ok);
  CHECK(f.fake->requests().size() == 1);
}

TEST_CASE("an approver that drops the question: approval_required", "[approval]") {
  fixture f;
  f.s.decide = [](const approval_request&) { return std::nullopt; };
  std::promise<run_result> done;
  f.rt.async_run(net_py(), f.parent,
                 [&](boost::system::error_code, run_result r) { done.set_value(std::move(r)); });
  REQUIRE(eventually([&] { return f.s.asked_count() == 1; }));
  {
    std::lock_guard lk(f.s.mu);
    f.s.pending.clear();  // the last copy of the callback goes without being called
  }
  auto r = done.get_future().get();
  CHECK(r.code == code::approval_required);
  CHECK(r.message == "network needs approval: the approver gave no answer");
  CHECK(r.approval == f.s.last());
}

namespace {

/// An Asio-style approver: keeps the handler, withdraws its question on cancellation
/// (completing with operation_aborted), or fails on request.
class asio_approver final : public sandbox::approver {
 public:
  using handler_t =
      asio::any_completion_handler<void(boost::system::error_code, approval_decision)>;
  std::mutex mu;
  std::optional<handler_t> held;
  std::atomic<int> withdrawn{0};
  bool fail = false;
  bool throw_now = false;

 private:
  void do_approve(approval_request, handler_t handler) override {
    if (throw_now) throw std::runtime_error("approval service down");
    if (fail) {
      std::move(handler)(asio::error::connection_refused, approval_decision::defer());
      return;
    }
    auto slot = handler.get_cancellation_slot();
    std::lock_guard lk(mu);
    held.emplace(std::move(handler));
    if (slot.is_connected()) {
      slot.assign([this](asio::cancellation_type) {
        std::optional<handler_t> h;
        {
          std::lock_guard lk2(mu);
          if (!held) return;
          h = std::move(held);
          held.reset();
        }
        ++withdrawn;
        std::move (*h)(asio::error::operation_aborted, approval_decision::defer());
      });
    }
  }
};

}  // namespace

TEST_CASE("an approver that fails or throws: approval_required with the request", "[approval]") {
  auto a = std::make_shared<asio_approver>();
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::container);
  auto rt = sandbox::testing::make_runtime(fake, {}, a);
  REQUIRE(rt.has_value());
  a->fail = true;
  auto r = rt->run(net_py(), make_ticket("acme"));
  CHECK(r.code == code::approval_required);
  CHECK(r.message ==
        "network needs approval: the approver failed; ask again and resume with a derived "
        "ticket");
  CHECK(r.approval.has_value());
  a->fail = false;
  a->throw_now = true;
  r = rt->run(net_py(), make_ticket("acme"));
  CHECK(r.code == code::approval_required);
  CHECK(r.approval.has_value());
  CHECK(fake->requests().empty());
}

TEST_CASE("cancelling a run waiting for approval withdraws the question", "[approval]") {
  auto a = std::make_shared<asio_approver>();
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::container);
  auto rt = sandbox::testing::make_runtime(fake, {}, a);
  REQUIRE(rt.has_value());
  asio::cancellation_signal cancel;
  std::promise<std::pair<boost::system::error_code, run_result>> done;
  rt->async_run(
      net_py(), make_ticket("acme"),
      asio::bind_cancellation_slot(cancel.slot(), [&](boost::system::error_code ec, run_result r) {
        done.set_value({ec, std::move(r)});
      }));
  REQUIRE(eventually([&] {
    std::lock_guard lk(a->mu);
    return a->held.has_value();
  }));
  cancel.emit(asio::cancellation_type::terminal);
  auto [ec, r] = done.get_future().get();
  CHECK(ec == asio::error::operation_aborted);
  CHECK(r.code == code::internal);
  CHECK(r.message == "the run was cancelled");
  CHECK(eventually([&] { return a->withdrawn.load() == 1; }));
  CHECK(fake->requests().empty());
}

TEST_CASE("a late answer after cancellation is ignored", "[approval]") {
  fixture f;  // keeps every callback
  asio::cancellation_signal cancel;
  std::promise<boost::system::error_code> done;
  f.rt.async_run(
      net_py(), f.parent,
      asio::bind_cancellation_slot(
          cancel.slot(), [&](boost::system::error_code ec, run_result) { done.set_value(ec); }));
  REQUIRE(eventually([&] { return f.s.asked_count() == 1; }));
  cancel.emit(asio::cancellation_type::terminal);
  CHECK(done.get_future().get() == asio::error::operation_aborted);
  sandbox::approval_callback answer;
  {
    std::lock_guard lk(f.s.mu);
    answer = f.s.pending.back();
  }
  answer(approval_decision::approve(derive(f.parent, f.s.last())));
  // The runtime still works, and nothing ran for the cancelled run.
  CHECK(f.rt.run(py("print(1)"), f.parent).code == code::ok);
  CHECK(f.fake->requests().size() == 1);
  CHECK_FALSE(f.fake->requests()[0].request.network);
}

TEST_CASE("destroying the runtime while a question is pending", "[approval]") {
  scripted s;  // keeps every callback, outlives the runtime
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::container);
  std::weak_ptr<sandbox::approver> weak_approver;
  std::promise<boost::system::error_code> done;
  const auto parent = make_ticket("acme");
  {
    auto approver = s.approver();
    weak_approver = approver;
    auto rt = sandbox::testing::make_runtime(fake, {}, std::move(approver));
    REQUIRE(rt.has_value());
    rt->async_run(net_py(), parent,
                  [&](boost::system::error_code ec, run_result) { done.set_value(ec); });
    REQUIRE(eventually([&] { return s.asked_count() == 1; }));
  }  // the runtime goes while the approver holds the question
  CHECK(done.get_future().get() == asio::error::operation_aborted);
  // Nothing keeps the runtime alive through the held callback, and answering now is safe.
  CHECK(weak_approver.expired());
  sandbox::approval_callback answer;
  {
    std::lock_guard lk(s.mu);
    answer = s.pending.back();
    s.pending.clear();
  }
  answer(approval_decision::approve(derive(parent, s.last())));
  answer = nullptr;
  CHECK(fake->requests().empty());
}

TEST_CASE("approval requests round-trip through JSON, strictly", "[approval][json]") {
  approval_request q;
  q.ticket_id = "t-1";
  q.tenant = "acme";
  q.domains = {"api.example.com"};
  q.timeout = 2000ms;
  q.memory_limit_bytes = 1 << 28;
  q.files_in = {{.name = "d\xc3\xa9.csv", .sha256 = std::string(64, '1'), .bytes = 3}};
  q.source_sha256 = std::string(64, '2');
  q.source_bytes = 8;
  q.runtime = {"python3", "sha256:" + std::string(64, '3')};
  const std::string text = sandbox::encode(q);
  CHECK(text == R"({"v":1,"ticket_id":"t-1","tenant":"acme","domains":["api.example.com"],)"
                R"("timeout_ms":2000,"memory_limit_bytes":268435456,"files_in":[{"name":"dé.csv",)"
                R"("sha256":")" +
                    std::string(64, '1') + R"(","bytes":3}],"source_sha256":")" +
                    std::string(64, '2') +
                    R"(","source_bytes":8,"isolation":"container",)"
                    R"("runtime":{"name":"python3","digest":"sha256:)" +
                    std::string(64, '3') + R"("}})");
  auto back = sandbox::decode_approval_request(text);
  REQUIRE(back.has_value());
  CHECK(*back == q);
  auto error = [](const std::string& doc) {
    auto r = sandbox::decode_approval_request(doc);
    if (r) return std::string("<decoded>");
    CHECK(r.error().code == code::invalid_request);
    return r.error().message;
  };
  auto with = [&](const std::string& key, const std::string& value) {
    auto j = nlohmann::ordered_json::parse(text);
    if (value.empty()) {
      j.erase(key);
    } else {
      j[key] = nlohmann::ordered_json::parse(value);
    }
    return j.dump();
  };
  CHECK(error(with("v", "2")) == "v: unsupported protocol version 2 (this library speaks 1)");
  CHECK(error(with("extra", "1")) == "unknown field 'extra'");
  CHECK(error(with("domains", "[]")) == "domains: must not be empty");
  CHECK(error(with("domains", R"(["a.example","a.example"])")) ==
        "domains[1]: duplicate 'a.example'");
  CHECK(error(with("isolation", R"("process")")) ==
        "isolation: must be at least 'container' (network never runs weaker)");
  CHECK(error(with("source_sha256", R"("XYZ")")) ==
        "source_sha256: expected 64 lowercase hex digits");
  CHECK(error(with("timeout_ms", "0")) == "timeout_ms: must be greater than 0");
  CHECK(error(with("tenant", "")) == "tenant: required field is missing");
  CHECK(error(with("files_in", R"([{"name":"a/b","sha256":")" + std::string(64, '1') +
                                   R"(","bytes":1}])")) == "files_in[0].name: contains '/'");
  CHECK(error("[]") == "expected a JSON object");
  CHECK(error("{").rfind("malformed JSON", 0) == 0);
  // A result carrying one.
  run_result r;
  r.code = code::approval_required;
  r.approval = q;
  auto rb = sandbox::decode_run_result(sandbox::encode(r));
  REQUIRE(rb.has_value());
  CHECK(rb->approval == q);
  auto rj = nlohmann::ordered_json::parse(sandbox::encode(r));
  rj["approval"]["domains"] = nlohmann::ordered_json::array();
  CHECK(sandbox::decode_run_result(rj.dump()).error().message ==
        "approval.domains: must not be empty");
}
