// Host-held secrets through the runtime (sandbox/secrets.hpp), with a backend that keeps the
// job it is handed: values read from root-only files at creation (a bad file refuses the
// runtime), each run given a fresh placeholder, the approval request naming secrets and
// destinations, and the value absent from results, spans and logs. The proxy's use of the
// value is tested against real backends (tests/integration).
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <mutex>
#include <string>

#include "sandbox/json.hpp"
#include "sandbox/sandbox.hpp"
#include "unit/runtime/runtime_test_support.hpp"
#include "unit/test_files.hpp"

namespace {

using sandbox::code;

const std::string value = "sk-live-UNIT-VALUE-7c1f9e";

/// A container-level backend that keeps every job and answers `ok`.
class keeping_backend final : public sandbox::backend {
 public:
  sandbox::isolation isolation() const noexcept override { return sandbox::isolation::container; }
  std::string_view name() const noexcept override { return "keeping"; }
  void shutdown() noexcept override {}
  std::vector<sandbox::run_job> jobs() {
    std::lock_guard lk(mu_);
    return jobs_;
  }

 private:
  void do_execute(
      sandbox::run_job job,
      boost::asio::any_completion_handler<void(boost::system::error_code, sandbox::run_result)>
          handler) override {
    sandbox::run_result r;
    r.code = code::ok;
    r.run_id = job.run_id;
    sandbox::note_admitted(r, job.admitted);
    // What a real run machine records for a placeholder sent where it may not go.
    if (!job.secrets.empty()) {
      r.egress_attempts.push_back({.protocol = "dns",
                                   .host = job.secrets[0].placeholder + ".evil.example",
                                   .address = "",
                                   .port = 53,
                                   .allowed = false,
                                   .reason = "secret_misuse"});
    }
    auto ex = job.executor;
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(job));
    }
    sandbox::detail::post_completion(ex, std::move(handler), boost::system::error_code{}, r);
  }
  std::mutex mu_;
  std::vector<sandbox::run_job> jobs_;
};

struct host {
  sandbox::test::temp_dir dir;
  std::string file;
  std::mutex log_mu;
  std::string log_text;
  std::shared_ptr<sandbox::test::recording_sink> spans =
      std::make_shared<sandbox::test::recording_sink>();

  explicit host(mode_t mode = 0600) {
    file = (dir.path / "rates-api").string();
    sandbox::test::write_text(file, value + "\n");
    REQUIRE(::chmod(file.c_str(), mode) == 0);
  }
  sandbox::runtime_options options(std::shared_ptr<sandbox::approver> approver = nullptr) {
    sandbox::runtime_options o;
    o.process_backend = false;
    o.blobs = sandbox::make_memory_blob_store();
    o.fixed_digests = {{"python3", sandbox::testing::fake_digest("python3")}};
    o.secrets = {{"rates-api",
                  {.file = file, .domains = {"api.rates.example"}, .header = "X-Key: {value}"}}};
    o.spans = spans;
    o.approver = std::move(approver);
    o.log = [this](sandbox::log_level, std::string_view line) {
      std::lock_guard lk(log_mu);
      log_text.append(line).append("\n");
    };
    return o;
  }
  std::string logs() {
    std::lock_guard lk(log_mu);
    return log_text;
  }
};

sandbox::run_request request() {
  return {.runtime = "python3",
          .source = "print(1)",
          .network = true,
          .egress = {"api.rates.example"},
          .secrets = {"rates-api"}};
}

sandbox::ticket ticket(bool network) {
  sandbox::ticket_spec s{.id = "t-sec", .tenant = "acme"};
  s.secrets = {"rates-api"};
  if (!network) return sandbox::ticket_issuer{}.issue(s).value();
  s.egress = {"api.rates.example"};
  return sandbox::ticket_issuer{}.issue(s, sandbox::network_grant{}).value();
}

bool is_placeholder(const std::string& p) {
  if (!p.starts_with("sbx-secret-") || p.size() != 11 + 32) return false;
  return p.find_first_not_of("0123456789abcdef", 11) == std::string::npos;
}

}  // namespace

TEST_CASE("secrets runtime: each run gets the value host-side and a fresh placeholder",
          "[secrets][runtime][fake]") {
  host h;
  auto rt = sandbox::runtime::create(h.options());
  REQUIRE(rt.has_value());
  auto backend = std::make_shared<keeping_backend>();
  rt->add_backend(backend);
  const auto first = rt->run(request(), ticket(true));
  const auto second = rt->run(request(), ticket(true));
  CHECK(first.code == code::ok);
  CHECK(second.code == code::ok);
  const auto jobs = backend->jobs();
  REQUIRE(jobs.size() == 2);
  for (const auto& j : jobs) {
    REQUIRE(j.secrets.size() == 1);
    CHECK(j.secrets[0].name == "rates-api");
    CHECK(is_placeholder(j.secrets[0].placeholder));
    REQUIRE(j.secrets[0].value);
    CHECK(*j.secrets[0].value == value);  // the final newline dropped
    CHECK(j.secrets[0].definition.domains == std::vector<std::string>{"api.rates.example"});
  }
  CHECK(jobs[0].secrets[0].placeholder != jobs[1].secrets[0].placeholder);
  // A run without secrets gets none.
  auto plain = request();
  plain.secrets.clear();
  CHECK(rt->run(plain, ticket(true)).code == code::ok);
  CHECK(backend->jobs().back().secrets.empty());
  // Nothing the runs returned or recorded holds the value.
  CHECK(sandbox::encode(first).find(value) == std::string::npos);
  CHECK(h.logs().find(value) == std::string::npos);
  REQUIRE(sandbox::test::eventually([&] { return h.spans->spans().size() == 3; }));
  int with_secrets = 0;
  for (const auto& s : h.spans->spans()) {
    CHECK(sandbox::to_json_line(s).find(value) == std::string::npos);
    // The span says how many secrets the run used and how often it misused a placeholder.
    if (!s.attributes.contains("sandbox.secrets")) continue;
    ++with_secrets;
    CHECK(std::get<std::int64_t>(s.attributes.at("sandbox.secrets")) == 1);
    CHECK(std::get<std::int64_t>(s.attributes.at("sandbox.secret_misuse")) == 1);
  }
  CHECK(with_secrets == 2);
}

TEST_CASE("secrets runtime: an ungranted or unknown secret never reaches a backend",
          "[secrets][runtime][fake]") {
  host h;
  auto rt = sandbox::runtime::create(h.options());
  REQUIRE(rt.has_value());
  auto backend = std::make_shared<keeping_backend>();
  rt->add_backend(backend);
  auto r =
      rt->run(request(), sandbox::ticket_issuer{}
                             .issue({.id = "t", .tenant = "acme", .egress = {"api.rates.example"}},
                                    sandbox::network_grant{})
                             .value());
  CHECK(r.code == code::action_denied);
  CHECK(r.message == "secrets: the ticket does not grant the secret 'rates-api'");
  auto unknown = request();
  unknown.secrets = {"ghost"};
  sandbox::ticket_spec s{.id = "t", .tenant = "acme", .egress = {"api.rates.example"}};
  s.secrets = {"ghost"};
  r = rt->run(unknown, sandbox::ticket_issuer{}.issue(s, sandbox::network_grant{}).value());
  CHECK(r.code == code::action_denied);
  CHECK(r.message == "secrets: no secret 'ghost' on this host");
  CHECK(backend->jobs().empty());
}

TEST_CASE("secrets runtime: a readable, linked or missing secret file refuses the runtime",
          "[secrets][runtime][fake]") {
  {
    host h(0644);
    auto rt = sandbox::runtime::create(h.options());
    CHECK(!rt.has_value());
    CHECK(h.logs().find("secrets['rates-api'].file:") != std::string::npos);
    CHECK(h.logs().find("accessible to group or others") != std::string::npos);
    CHECK(h.logs().find(value) == std::string::npos);
  }
  {
    host h;
    const auto link = (h.dir.path / "link").string();
    REQUIRE(::symlink(h.file.c_str(), link.c_str()) == 0);
    auto o = h.options();
    o.secrets.at("rates-api").file = link;
    CHECK(!sandbox::runtime::create(o).has_value());
    CHECK(h.logs().find("is a symbolic link") != std::string::npos);
  }
  {
    host h;
    auto o = h.options();
    o.secrets.at("rates-api").header = "X-Key: no mark";
    CHECK(!sandbox::runtime::create(o).has_value());
    CHECK(h.logs().find("secrets['rates-api'].header:") != std::string::npos);
  }
}

TEST_CASE("secrets runtime: the approval names each secret and where it goes, never the value",
          "[secrets][runtime][approval][fake]") {
  host h;
  std::mutex mu;
  std::optional<sandbox::approval_request> asked;
  auto approver = sandbox::make_callback_approver(
      [&](sandbox::approval_request q, sandbox::approval_callback answer) {
        {
          std::lock_guard lk(mu);
          asked = q;
        }
        answer(sandbox::approval_decision::defer("ask a human"));
      });
  auto rt = sandbox::runtime::create(h.options(approver));
  REQUIRE(rt.has_value());
  auto backend = std::make_shared<keeping_backend>();
  rt->add_backend(backend);
  const auto r = rt->run(request(), ticket(false));
  CHECK(r.code == code::approval_required);
  REQUIRE(r.approval);
  CHECK(r.approval->secrets ==
        std::vector<sandbox::approval_secret>{
            {.name = "rates-api", .domains = {"api.rates.example"}, .header = "X-Key"}});
  CHECK(sandbox::encode(r).find(value) == std::string::npos);
  CHECK(sandbox::encode(*r.approval).find(value) == std::string::npos);
  // Resume with a derived ticket that keeps it: the backend gets the value host-side.
  const auto derived = sandbox::ticket_issuer{}.derive(ticket(false), *r.approval);
  REQUIRE(derived.has_value());
  CHECK(derived->secrets() == std::vector<std::string>{"rates-api"});
  CHECK(rt->run(request(), *derived).code == code::ok);
  REQUIRE(backend->jobs().size() == 1);
  CHECK(*backend->jobs()[0].secrets.at(0).value == value);
  // A derived ticket that drops it refuses the run naming the secret.
  const auto narrowed = sandbox::ticket_issuer{}.derive(ticket(false), *r.approval,
                                                        {.secrets = std::vector<std::string>{}});
  REQUIRE(narrowed.has_value());
  const auto refused = rt->run(request(), *narrowed);
  CHECK(refused.code == code::action_denied);
  CHECK(refused.message == "secrets: the ticket does not grant the secret 'rates-api'");
}

TEST_CASE("secrets runtime: an approval that drops a secret runs without it",
          "[secrets][runtime][approval][fake]") {
  host h;
  const auto parent = ticket(false);
  auto approver = sandbox::make_callback_approver([&](sandbox::approval_request q,
                                                      sandbox::approval_callback answer) {
    // The human approves the network but not the key.
    auto d = sandbox::ticket_issuer{}.derive(parent, q, {.secrets = std::vector<std::string>{}});
    answer(d ? sandbox::approval_decision::approve(*d)
             : sandbox::approval_decision::deny("derive failed"));
  });
  auto rt = sandbox::runtime::create(h.options(approver));
  REQUIRE(rt.has_value());
  auto backend = std::make_shared<keeping_backend>();
  rt->add_backend(backend);
  const auto r = rt->run(request(), parent);
  CHECK(r.code == code::ok);
  REQUIRE(backend->jobs().size() == 1);
  CHECK(backend->jobs()[0].secrets.empty());
  CHECK(backend->jobs()[0].admitted.request.secrets.empty());
}
