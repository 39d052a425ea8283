// Unit tests of registered tools and workload profiles: entry checks, effective limits,
// admission of tool runs, ticket grants (JSON, derivation), the config file's sections, the
// request's wire form, and a tool run through a runtime with the fake backend.
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "sandbox/admission.hpp"
#include "sandbox/json.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/signed_ticket.hpp"

using namespace std::string_literals;
using namespace std::chrono_literals;
using sandbox::code;
using sandbox::isolation;
using sandbox::run_request;
using sandbox::ticket_spec;
using sandbox::tool_entry;

namespace {

const std::string tools_digest = "sha256:" + std::string(64, 'd');
const std::string python_digest = "sha256:" + std::string(64, 'a');
const std::string blob = "sha256:" + std::string(64, 'c');

tool_entry markdown() {
  return tool_entry{.name = "markdown", .image = "tools", .binary = "/usr/bin/cmark"};
}

sandbox::policy policy() {
  sandbox::policy p;
  p.profiles["big"] = {.max_pids = 512,
                       .shm_bytes = 256ULL << 20,
                       .memory_limit_bytes = 768ULL << 20,
                       .timeout = 5000ms};
  p.profiles["huge"] = {.max_pids = 100000, .tmpfs_inodes = 10};
  p.profiles["small"] = {.memory_limit_bytes = 64ULL << 20};
  p.allowed_env = {"TZ"};
  return p;
}

sandbox::host_catalog catalog(tool_entry e = markdown(),
                              std::optional<std::string> digest = tools_digest) {
  sandbox::host_catalog c{.levels = {isolation::process, isolation::container, isolation::gvisor},
                          .runtimes = {{"python3", python_digest}},
                          .tools = {}};
  const std::string name = e.name;
  c.tools.emplace(name, sandbox::host_catalog::tool{.entry = std::move(e), .digest = digest});
  return c;
}

sandbox::ticket ticket(ticket_spec s) {
  auto t = sandbox::ticket_issuer{}.issue(s);
  REQUIRE(t.has_value());
  return *t;
}

ticket_spec tool_spec(std::vector<std::string> tools = {"markdown"}) {
  return ticket_spec{.id = "t-1", .tenant = "acme", .execute = false, .tools = std::move(tools)};
}

std::variant<sandbox::admitted, sandbox::rejection> admit(
    const run_request& r, const sandbox::ticket& t, const sandbox::host_catalog& c = catalog(),
    const sandbox::policy& p = policy()) {
  return sandbox::admit(r, t, p, c, std::chrono::system_clock::now());
}

sandbox::rejection rejected(const std::variant<sandbox::admitted, sandbox::rejection>& v) {
  REQUIRE(std::holds_alternative<sandbox::rejection>(v));
  return std::get<sandbox::rejection>(v);
}

sandbox::admitted admitted(const std::variant<sandbox::admitted, sandbox::rejection>& v) {
  if (auto* r = std::get_if<sandbox::rejection>(&v)) FAIL("rejected: " << r->message);
  return std::get<sandbox::admitted>(v);
}

/// A backend that records each job (argv, stdin, limits) and answers `ok`.
class recording_backend final : public sandbox::backend {
 public:
  std::vector<sandbox::run_job> jobs() const {
    std::lock_guard lk(mu_);
    return jobs_;
  }
  sandbox::isolation isolation() const noexcept override { return sandbox::isolation::process; }
  std::string_view name() const noexcept override { return "recording"; }
  void shutdown() noexcept override {}

 private:
  void do_execute(
      sandbox::run_job job,
      boost::asio::any_completion_handler<void(boost::system::error_code, sandbox::run_result)>
          handler) override {
    auto ex = job.executor;
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(job));
    }
    boost::asio::post(ex, [h = std::move(handler)]() mutable {
      sandbox::run_result r;
      r.code = code::ok;
      std::move(h)(boost::system::error_code{}, std::move(r));
    });
  }
  mutable std::mutex mu_;
  std::vector<sandbox::run_job> jobs_;
};

}  // namespace

TEST_CASE("registry: entries are checked field by field", "[registry]") {
  const auto p = policy();
  CHECK_FALSE(sandbox::check_tool_entry(markdown(), p));
  auto why = [&](auto mutate) {
    tool_entry e = markdown();
    mutate(e);
    auto problem = sandbox::check_tool_entry(e, p);
    return problem.value_or("(accepted)");
  };
  CHECK(why([](tool_entry& e) { e.name = "Markdown"; }).rfind("name: ", 0) == 0);
  CHECK(why([](tool_entry& e) { e.name = ""; }).rfind("name: ", 0) == 0);
  CHECK(why([](tool_entry& e) { e.name = std::string(65, 'a'); }).rfind("name: ", 0) == 0);
  CHECK(why([](tool_entry& e) { e.image = "../x"; }).rfind("image: ", 0) == 0);
  CHECK(why([](tool_entry& e) { e.image_digest = "sha256:x"; }).rfind("image_digest: ", 0) == 0);
  for (const char* bin : {"cmark", "", "/usr/../bin/sh", "/usr/bin/..", "/usr//bin/cmark",
                          "/usr/./bin/cmark", "/usr/bin/"}) {
    INFO(bin);
    CHECK(why([&](tool_entry& e) { e.binary = bin; }).rfind("binary: ", 0) == 0);
  }
  CHECK(why([](tool_entry& e) { e.binary = "/usr/bin/cm\0ark"s; }).rfind("binary: ", 0) == 0);
  CHECK(why([](tool_entry& e) { e.args = {"-a", "b\0c"s}; }) == "args[1]: contains NUL");
  CHECK(why([](tool_entry& e) { e.profile = "nope"; }).rfind("profile: ", 0) == 0);
  CHECK(why([](tool_entry& e) { e.profile = "big"; }) == "(accepted)");
  // An entry's own egress: patterns, canonicalized by the runtime; anything else refused.
  CHECK(why([](tool_entry& e) {
          e.egress = {"api.example.com", "*.Example.ORG."};
        }) == "(accepted)");
  CHECK(why([](tool_entry& e) {
          e.egress = {"api.example.com", "http://x"};
        }).rfind("egress[1]: not a host name", 0) == 0);
  CHECK(why([](tool_entry& e) {
          for (int i = 0; i < 33; ++i) e.egress.push_back("h" + std::to_string(i) + ".example");
        }).rfind("egress: 33 patterns", 0) == 0);
  CHECK(why([](tool_entry& e) { e.env = {{"TZ", "UTC"}}; }) == "(accepted)");
  CHECK(why([](tool_entry& e) {
          e.env = {{"LD_PRELOAD", "/x"}};
        }).find("reserved") != std::string::npos);
  CHECK(why([](tool_entry& e) {
          e.env = {{"OTHER", "x"}};
        }).find("not allowed") != std::string::npos);
}

TEST_CASE("profiles: effective limits replace, clamp and keep", "[registry]") {
  const auto p = policy();
  auto none = sandbox::effective_limits(p, "");
  REQUIRE(none);
  CHECK(none->limits == p);
  CHECK(none->clamped.empty());
  CHECK_FALSE(sandbox::effective_limits(p, "nope"));

  auto big = sandbox::effective_limits(p, "big");
  REQUIRE(big);
  CHECK(big->limits.max_pids == 512);
  CHECK(big->limits.shm_bytes == 256ULL << 20);
  CHECK(big->limits.tmp_bytes == p.tmp_bytes);  // unset: the policy's
  CHECK(big->limits.max_open_files == p.max_open_files);
  CHECK(big->clamped.empty());

  auto huge = sandbox::effective_limits(p, "huge");
  REQUIRE(huge);
  CHECK(huge->limits.max_pids == p.ceilings.max_pids);  // above the ceiling: clamped
  CHECK(huge->limits.tmpfs_inodes == 10);               // lowering is always allowed
  CHECK(huge->clamped == std::vector<std::string>{"max_pids"});
}

TEST_CASE("profiles: a CPU quota of 0 (no limit) is above every non-zero ceiling", "[registry]") {
  auto p = policy();
  p.profiles["unlimited"] = {.cpu_quota_millicores = 0u};
  p.profiles["two"] = {.cpu_quota_millicores = 2000u};
  auto u = sandbox::effective_limits(p, "unlimited");
  REQUIRE(u);
  CHECK(u->limits.cpu_quota_millicores == p.ceilings.cpu_quota_millicores);
  CHECK(u->clamped == std::vector<std::string>{"cpu_quota_millicores"});
  // A ceiling of 0 is no ceiling: any quota stands, "no limit" included.
  p.ceilings.cpu_quota_millicores = 0;
  CHECK(sandbox::effective_limits(p, "two")->limits.cpu_quota_millicores == 2000);
  CHECK(sandbox::effective_limits(p, "two")->clamped.empty());
  CHECK(sandbox::effective_limits(p, "unlimited")->limits.cpu_quota_millicores == 0);
  // A small ceiling bounds both.
  p.ceilings.cpu_quota_millicores = 500;
  CHECK(sandbox::effective_limits(p, "two")->limits.cpu_quota_millicores == 500);
  CHECK(sandbox::effective_limits(p, "unlimited")->limits.cpu_quota_millicores == 500);
}

TEST_CASE("admission: a tool run is admitted with its entry's facts", "[registry][admission]") {
  auto a = admitted(admit(run_request{.tool = "markdown", .std_in = "# hi"}, ticket(tool_spec())));
  CHECK(a.runtime == sandbox::runtime_info{"markdown", tools_digest});
  CHECK(a.isolation == isolation::process);
  CHECK(a.profile.empty());
  CHECK(a.request.std_in == "# hi");

  // The entry's level and profile; the profile's timeout and memory as defaults.
  tool_entry e = markdown();
  e.isolation = isolation::container;
  e.profile = "big";
  e.env = {{"TZ", "UTC"}};
  auto b = admitted(admit(run_request{.tool = "markdown"}, ticket(tool_spec()), catalog(e)));
  CHECK(b.isolation == isolation::container);
  CHECK(b.profile == "big");
  CHECK(b.request.timeout == 5000ms);
  CHECK(b.request.memory_limit_bytes == 512ULL << 20);  // 768 MiB, clamped to the ticket's
  CHECK(b.memory_clamped);
  CHECK(b.request.env == std::map<std::string, std::string>{{"TZ", "UTC"}});
  // A request may ask less than the profile's values...
  auto c = admitted(
      admit(run_request{.timeout = 1000ms, .memory_limit_bytes = 64ULL << 20, .tool = "markdown"},
            ticket(tool_spec()), catalog(e)));
  CHECK(c.request.timeout == 1000ms);
  CHECK(c.request.memory_limit_bytes == 64ULL << 20);
  CHECK_FALSE(c.timeout_clamped);
  // ...never more: the model cannot lift the host's limits of a tool (or of any run under a
  // profile), even within the ticket's ceilings.
  auto more = admitted(
      admit(run_request{.timeout = 7000ms, .memory_limit_bytes = 300ULL << 20, .tool = "markdown"},
            ticket(tool_spec()), catalog(e)));
  CHECK(more.request.timeout == 5000ms);
  CHECK(more.timeout_clamped);
  e.profile = "small";
  auto less_mem =
      admitted(admit(run_request{.memory_limit_bytes = 300ULL << 20, .tool = "markdown"},
                     ticket(tool_spec()), catalog(e)));
  CHECK(less_mem.request.memory_limit_bytes == 64ULL << 20);
  CHECK(less_mem.memory_clamped);
  e.profile = "big";
  // The ticket's level when stronger.
  auto s = tool_spec();
  s.isolation = isolation::gvisor;
  CHECK(admitted(admit(run_request{.tool = "markdown"}, ticket(s), catalog(e))).isolation ==
        isolation::gvisor);
  // A ticket's profile applies to code runs and to tools without one of their own.
  auto t = ticket_spec{.id = "t-2", .tenant = "acme", .tools = {"*"}, .profile = "huge"};
  CHECK(admitted(admit(run_request{.runtime = "python3", .source = "1"}, ticket(t))).profile ==
        "huge");
  CHECK(admitted(admit(run_request{.tool = "markdown"}, ticket(t))).profile == "huge");
  CHECK(admitted(admit(run_request{.tool = "markdown"}, ticket(t), catalog(e))).profile == "big");
}

TEST_CASE("admission: tool run faults get their codes, naming the field", "[registry][admission]") {
  const auto t = ticket(tool_spec());
  auto expect = [&](const run_request& r, code c, const std::string& prefix,
                    const sandbox::ticket& tk, const sandbox::host_catalog& cat) {
    auto rej = rejected(admit(r, tk, cat));
    INFO(rej.message);
    CHECK(rej.code == c);
    CHECK(rej.message.rfind(prefix, 0) == 0);
  };
  auto check = [&](const run_request& r, code c, const std::string& prefix) {
    expect(r, c, prefix, t, catalog());
  };
  check({.runtime = "python3", .source = "1", .tool = "markdown"}, code::invalid_request,
        "runtime: ");
  check({.source = "x", .tool = "markdown"}, code::invalid_request, "source: ");
  check({.network = true, .egress = {"a.example"}, .tool = "markdown"}, code::invalid_request,
        "network: ");
  // The environment is the entry's: a request naming any variable, even an allowed one, is
  // refused.
  check({.env = {{"TZ", "UTC"}}, .tool = "markdown"}, code::invalid_request,
        "env: a tool run's environment is its registry entry's");
  check({.tool = "Mark down"}, code::invalid_request, "tool: ");
  check({.tool = "markdown", .std_in = "a", .stdin_blob = blob}, code::invalid_request,
        "stdin_blob: ");
  check({.tool = "markdown", .std_in = std::string((1 << 20) + 1, 'x')}, code::invalid_request,
        "stdin: ");
  check({.tool = "markdown", .stdin_blob = "sha256:nope"}, code::invalid_request, "stdin_blob: ");
  check({.runtime = "python3", .source = "1", .std_in = "x"}, code::invalid_request, "stdin: ");
  check({.runtime = "python3", .source = "1", .stdin_blob = blob}, code::invalid_request,
        "stdin_blob: ");
  check({.tool = "regex"}, code::action_denied, "tool: ");  // not granted (nor registered)
  // Granted by "*" but not registered: unknown.
  expect({.tool = "regex"}, code::invalid_request, "tool: ", ticket(tool_spec({"*"})), catalog());
  // A code ticket grants no tool, a tool ticket no code.
  expect({.tool = "markdown"}, code::action_denied,
         "tool: ", ticket({.id = "t-3", .tenant = "acme"}), catalog());
  expect({.runtime = "python3", .source = "1"}, code::action_denied, "ticket does not grant", t,
         catalog());
  // The image: absent, or not the pinned one.
  expect({.tool = "markdown"}, code::runtime_unavailable, "tool: ", t,
         catalog(markdown(), std::nullopt));
  tool_entry pinned = markdown();
  pinned.image_digest = "sha256:" + std::string(64, 'e');
  expect({.tool = "markdown"}, code::digest_mismatch, "tool: ", t, catalog(pinned));
  expect({.runtime_digest = python_digest, .tool = "markdown"}, code::digest_mismatch,
         "runtime_digest: ", t, catalog());
  // No backend at the entry's level.
  tool_entry micro = markdown();
  micro.isolation = isolation::microvm;
  expect({.tool = "markdown"}, code::runtime_unavailable, "isolation: ", t, catalog(micro));
  // A tool that reads only files takes no stdin.
  tool_entry files = markdown();
  files.input = sandbox::tool_input::files_only;
  expect({.tool = "markdown", .std_in = "x"}, code::invalid_request,
         "stdin: tool 'markdown' reads only input files", t, catalog(files));
  expect({.tool = "markdown", .stdin_blob = blob}, code::invalid_request, "stdin_blob: ", t,
         catalog(files));
  CHECK(std::holds_alternative<sandbox::admitted>(admit({.tool = "markdown"}, t, catalog(files))));
  // A ticket naming a profile the host lacks.
  expect({.tool = "markdown"}, code::invalid_request, "ticket.profile: ",
         ticket({.id = "t-4", .tenant = "acme", .tools = {"markdown"}, .profile = "gone"}),
         catalog());
}

TEST_CASE("tickets: tool grants and profiles in JSON, issue and derivation", "[registry][ticket]") {
  sandbox::ticket_issuer issuer;
  auto t = ticket({.id = "t-1",
                   .tenant = "acme",
                   .tools = {"markdown", "regex", "markdown"},
                   .profile = "big"});
  CHECK(t.allows(sandbox::action::tool_run));
  CHECK(t.allows_tool("regex"));
  CHECK_FALSE(t.allows_tool("other"));
  CHECK(t.tools() == std::vector<std::string>{"markdown", "regex"});  // duplicates dropped
  const std::string json = sandbox::encode(t);
  CHECK(json.find(R"("actions":["code.execute","tool.run"])") != std::string::npos);
  CHECK(json.find(R"("tools":["markdown","regex"])") != std::string::npos);
  CHECK(json.find(R"("profile":"big")") != std::string::npos);
  auto back = issuer.decode(json);
  REQUIRE(back.has_value());
  CHECK(*back == t);

  CHECK_FALSE(issuer.issue({.id = "x", .tenant = "acme", .tools = {"Bad Name"}}).has_value());
  CHECK_FALSE(issuer.issue({.id = "x", .tenant = "acme", .profile = "Bad"}).has_value());
  const std::pair<const char*, const char*> bad[] = {
      {R"({"id":"x","tenant":"a","actions":["tool.run"],"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1})",
       "actions: tool.run needs a non-empty 'tools' list"},
      {R"({"id":"x","tenant":"a","actions":[],"tools":["md"],"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1})",
       "tools: only a ticket granting tool.run may list tools"},
      {R"({"id":"x","tenant":"a","actions":["tool.run"],"tools":["a b"],"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1})",
       "tools[0]: not a tool name or '*'"},
      {R"({"id":"x","tenant":"a","actions":["tool.run"],"tools":[],"isolation":"process","max_timeout_ms":1,"max_memory_bytes":1})",
       "tools: must not be empty"},
      {R"({"id":"x","tenant":"a","actions":["code.execute"],"profile":"","isolation":"process","max_timeout_ms":1,"max_memory_bytes":1})",
       "profile: must not be empty"},
  };
  for (const auto& [doc, msg] : bad) {
    INFO(doc);
    auto r = issuer.decode(doc);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().message.rfind(msg, 0) == 0);
  }

  // Derivation: a derived (approved network) ticket keeps the parent's profile and gets no
  // tools; check_derivation refuses a switched profile and tools the parent lacks.
  sandbox::approval_request ap{.ticket_id = "t-1",
                               .tenant = "acme",
                               .domains = {"a.example"},
                               .timeout = 1000ms,
                               .memory_limit_bytes = 64ULL << 20,
                               .source_sha256 = std::string(64, 'a'),
                               .runtime = {"python3", python_digest}};
  const auto now = std::chrono::system_clock::now();
  auto d = issuer.derive(t, ap, {.now = now});
  REQUIRE(d.has_value());
  CHECK(d->profile() == "big");
  CHECK(d->tools().empty());
  CHECK_FALSE(sandbox::check_derivation(t, *d, now));

  auto forged = [&](ticket_spec s) {
    nlohmann::json j = nlohmann::json::parse(sandbox::encode(*d));
    j["profile"] = s.profile;
    if (!s.tools.empty()) {
      j["tools"] = s.tools;
      j["actions"].push_back("tool.run");
    }
    if (s.profile.empty()) j.erase("profile");
    auto r = issuer.decode(j.dump());
    REQUIRE(r.has_value());
    return *r;
  };
  CHECK(sandbox::check_derivation(t, forged({.profile = "huge"}), now) ==
        "profile: differs from the parent's");
  CHECK(sandbox::check_derivation(t, forged({.profile = ""}), now) ==
        "profile: differs from the parent's");
  CHECK_FALSE(sandbox::check_derivation(t, forged({.tools = {"regex"}, .profile = "big"}), now));
  CHECK(sandbox::check_derivation(t, forged({.tools = {"other"}, .profile = "big"}), now) ==
        "tools: 'other' is not granted by the parent");
  CHECK(sandbox::check_derivation(t, forged({.tools = {"*"}, .profile = "big"}), now) ==
        "tools: '*' is not granted by the parent");
}

TEST_CASE("tickets: a signed ticket carries its tools and profile, and covers them",
          "[registry][ticket][signed]") {
  const auto pem = sandbox::generate_ed25519_key().value();
  const auto signer = sandbox::ticket_signer::from_pem("k1", pem.private_pem).value();
  sandbox::ticket_verifier v;
  REQUIRE(v.add_key("k1", pem.public_pem).has_value());
  const auto t = ticket(
      {.id = "t-s", .tenant = "acme", .execute = false, .tools = {"markdown"}, .profile = "big"});
  const std::string doc = signer.sign(t).value();
  const auto now = std::chrono::system_clock::now();
  auto back = v.verify(doc, now);
  REQUIRE(back.has_value());
  CHECK(*back == t);
  CHECK(back->allows_tool("markdown"));
  CHECK(back->profile() == "big");
  // Widening the tools or switching the profile breaks the signature.
  for (auto edit : {+[](nlohmann::ordered_json& j) { j["ticket"]["tools"] = {"*"}; },
                    +[](nlohmann::ordered_json& j) { j["ticket"]["profile"] = "huge"; },
                    +[](nlohmann::ordered_json& j) { j["ticket"].erase("profile"); }}) {
    auto j = nlohmann::ordered_json::parse(doc);
    edit(j);
    auto r = v.verify(j.dump(), now);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == code::action_denied);
    CHECK(r.error().message == "signed ticket: bad signature (key 'k1')");
  }
}

TEST_CASE("protocol: a tool request's wire form round-trips", "[registry][json]") {
  run_request r{.files_in = {{"p.txt", blob}}, .tool = "markdown", .std_in = "a\0b\xc3\xa9"s};
  const std::string text = sandbox::encode(r);
  CHECK(text.find(R"("runtime")") == std::string::npos);
  CHECK(text.find(R"("tool":"markdown")") != std::string::npos);
  auto back = sandbox::decode_run_request(text);
  REQUIRE(back.has_value());
  CHECK(*back == r);
  auto b = sandbox::decode_run_request(R"({"tool":"regex","stdin_blob":")" + blob + R"("})");
  REQUIRE(b.has_value());
  CHECK(b->stdin_blob == blob);
  CHECK(b->runtime.empty());
  // Without a tool, runtime and source stay required.
  auto c = sandbox::decode_run_request(R"({"stdin":"x"})");
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().message == "runtime: required field is missing");
  auto d = sandbox::decode_run_request(R"({"tool":"regex","stdin":1})");
  REQUIRE_FALSE(d.has_value());
  CHECK(d.error().message.rfind("stdin: ", 0) == 0);
}

TEST_CASE("config: policy.profiles, ceilings and the tools section", "[registry][config]") {
  sandbox::runtime_options o;
  auto r = sandbox::apply_config(R"({"v":1,
    "policy": {"allowed_env": ["TZ"], "max_stdin_bytes": 4096,
               "ceilings": {"max_pids": 256, "shm_bytes": 134217728},
               "profiles": {"browser": {"max_pids": 300, "shm_bytes": 67108864,
                                        "memory_limit_bytes": 536870912, "timeout_ms": 6000}}},
    "tools": [{"name": "markdown", "image": "tools", "binary": "/usr/bin/cmark",
               "args": ["--safe"], "isolation": "container", "profile": "browser",
               "env": {"TZ": "UTC"}},
              {"name": "regex", "image": "tools", "binary": "/usr/bin/pcre2grep",
               "input": "files", "image_digest": ")" +
                                     tools_digest + R"("}]})",
                                 o);
  if (!r) FAIL(r.error().message);
  CHECK(o.policy.max_stdin_bytes == 4096);
  CHECK(o.policy.ceilings.max_pids == 256);
  CHECK(o.policy.ceilings.shm_bytes == 128ULL << 20);
  CHECK(o.policy.ceilings.tmp_bytes == sandbox::policy{}.ceilings.tmp_bytes);
  const auto& b = o.policy.profiles.at("browser");
  CHECK(b.max_pids == 300u);
  CHECK(b.shm_bytes == 64ULL << 20);
  CHECK(b.timeout == 6000ms);
  CHECK_FALSE(b.tmp_bytes);
  REQUIRE(o.tools.size() == 2);
  CHECK(o.tools[0] == tool_entry{.name = "markdown",
                                 .image = "tools",
                                 .binary = "/usr/bin/cmark",
                                 .args = {"--safe"},
                                 .isolation = isolation::container,
                                 .profile = "browser",
                                 .env = {{"TZ", "UTC"}}});
  CHECK(o.tools[1].input == sandbox::tool_input::files_only);
  CHECK(o.tools[1].image_digest == tools_digest);
  // Clamped at run time (the profile asks 300, the ceiling says 256).
  CHECK(sandbox::effective_limits(o.policy, "browser")->limits.max_pids == 256);

  const std::pair<std::string, std::string> bad[] = {
      {R"({"policy":{"profiles":{"Big":{}}}})", "policy.profiles.Big: not a profile name"},
      {R"({"policy":{"profiles":{"big":{"max_pid":3}}}})",
       "policy.profiles.big: unknown field 'max_pid'"},
      {R"({"policy":{"profiles":{"big":{"max_pids":2}}}})",
       "policy.profiles.big.max_pids: must be at least 8"},
      {R"({"policy":{"profiles":{"big":{"timeout_ms":0}}}})",
       "policy.profiles.big.timeout_ms: must be at least 1"},
      {R"({"policy":{"ceilings":{"shm":1}}})", "policy.ceilings: unknown field 'shm'"},
      {R"({"tools":[{"name":"md","image":"tools"}]})",
       "tools[0].binary: required field is missing"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"bin/cmark"}]})",
       "tools[0].binary: must be an absolute path"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/a/../b"}]})",
       "tools[0].binary: must be an absolute path"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/b","profile":"nope"}]})",
       "tools[0].profile: no workload profile"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/b","egress":["a b"]}]})",
       "tools[0].egress[0]: not a host name"},
      {R"({"sessions":{"idle_timeout_ms":0}})", "sessions.idle_timeout_ms: must be positive"},
      {R"({"sessions":{"max_lifetime_ms":1000,"default_lifetime_ms":2000}})",
       "sessions.default_lifetime_ms: above max_lifetime_ms"},
      {R"({"sessions":{"stdin_buffer":1}})", "sessions: unknown field"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/b","env":{"LD_PRELOAD":"x"}}]})",
       "tools[0].env['LD_PRELOAD']: reserved name"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/b","input":"pipe"}]})",
       "tools[0].input: expected"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/b","isolation":"vm"}]})",
       "tools[0].isolation: unknown isolation level"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/b"},{"name":"md","image":"tools","binary":"/c"}]})",
       "tools[1].name: duplicate of tools[0].name"},
      {R"({"tools":[{"name":"md","image":"tools","binary":"/b","extra":1}]})",
       "tools[0]: unknown field 'extra'"},
  };
  for (const auto& [doc, msg] : bad) {
    INFO(doc);
    sandbox::runtime_options before;
    auto res = sandbox::apply_config(doc, before);
    REQUIRE_FALSE(res.has_value());
    CHECK(res.error().message.rfind(msg, 0) == 0);
    CHECK(before.tools.empty());
    CHECK(before.policy == sandbox::policy{});
  }
}

TEST_CASE("runtime: a tool run reaches the backend with its argv, stdin and limits",
          "[registry][runtime][fake]") {
  auto opts = sandbox::runtime_options{};
  opts.process_backend = false;
  opts.blobs = sandbox::make_memory_blob_store();
  opts.fixed_digests = {{"python3", python_digest}, {"tools", tools_digest}};
  opts.policy = policy();
  tool_entry e = markdown();
  e.args = {"--unsafe"};
  e.profile = "big";
  opts.tools = {e};
  opts.log = [](sandbox::log_level, std::string_view) {};
  auto rt = sandbox::runtime::create(opts);
  REQUIRE(rt.has_value());
  auto rec = std::make_shared<recording_backend>();
  rt->add_backend(rec);
  std::vector<sandbox::run_job> seen;
  auto refresh = [&] { seen = rec->jobs(); };
  CHECK(rt->catalog().tools.at("markdown").digest == tools_digest);

  const std::string bytes = "\0\xff\xfe# x\n"s;
  auto id = rt->blobs()->put("acme", bytes);
  REQUIRE(id.has_value());
  auto res = rt->run({.tool = "markdown", .stdin_blob = *id}, ticket(tool_spec()));
  REQUIRE(res.code == code::ok);
  refresh();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].runtime.argv == std::vector<std::string>{"/usr/bin/cmark", "--unsafe"});
  CHECK(seen[0].stdin_bytes == bytes);
  CHECK(seen[0].policy.max_pids == 512);
  CHECK(seen[0].policy.shm_bytes == 256ULL << 20);

  // Text stdin; no stdin at all.
  REQUIRE(rt->run({.tool = "markdown", .std_in = "# t"}, ticket(tool_spec())).code == code::ok);
  refresh();
  CHECK(seen.back().stdin_bytes == "# t");
  CHECK(seen.back().admitted.runtime == sandbox::runtime_info{"markdown", tools_digest});
  REQUIRE(rt->run({.tool = "markdown"}, ticket(tool_spec())).code == code::ok);
  refresh();
  CHECK_FALSE(seen.back().stdin_bytes);

  // A blob of another tenant, or absent; one over the cap.
  auto other = rt->blobs()->put("other", "x");
  REQUIRE(other.has_value());
  auto r1 = rt->run({.tool = "markdown", .stdin_blob = *other}, ticket(tool_spec()));
  CHECK(r1.code == code::blob_not_found);
  CHECK(r1.message == "stdin_blob: blob not found");
  auto big = rt->blobs()->put("acme", std::string((1 << 20) + 1, 'x'));
  REQUIRE(big.has_value());
  auto r2 = rt->run({.tool = "markdown", .stdin_blob = *big}, ticket(tool_spec()));
  CHECK(r2.code == code::invalid_request);
  CHECK(r2.message.rfind("stdin_blob: 1048577 bytes, over the limit", 0) == 0);
  refresh();
  CHECK(seen.size() == 3);  // none of the refused ones reached the backend

  // A code run under a ticket's profile gets the profile's limits too.
  REQUIRE(rt->run({.runtime = "python3", .source = "1"},
                  ticket({.id = "t-9", .tenant = "acme", .profile = "huge"}))
              .code == code::ok);
  refresh();
  CHECK(seen.back().policy.max_pids == sandbox::policy{}.ceilings.max_pids);
  CHECK(seen.back().policy.tmpfs_inodes == 10);
}

TEST_CASE("runtime: a faulty registry refuses to create the runtime", "[registry][runtime]") {
  auto base = sandbox::runtime_options{};
  base.process_backend = false;
  base.blobs = sandbox::make_memory_blob_store();
  base.fixed_digests = {{"python3", python_digest}, {"tools", tools_digest}};
  std::vector<std::string> logged;
  base.log = [&](sandbox::log_level, std::string_view l) { logged.emplace_back(l); };
  auto with = [&](std::vector<tool_entry> tools) {
    auto o = base;
    o.tools = std::move(tools);
    logged.clear();
    return sandbox::runtime::create(o);
  };
  tool_entry bad = markdown();
  bad.binary = "/usr/../bin/sh";
  CHECK_FALSE(with({bad}).has_value());
  CHECK(std::any_of(logged.begin(), logged.end(), [](const std::string& l) {
    return l.find("tools[0].binary: ") != std::string::npos;
  }));
  // An entry whose image is not installed does not stop the host: its runs are refused.
  tool_entry missing = markdown();
  missing.name = "renderer";
  missing.image = "absent";
  {
    auto rt = with({missing, markdown()});
    REQUIRE(rt.has_value());
    CHECK(std::any_of(logged.begin(), logged.end(), [](const std::string& l) {
      return l.find("tools[0].image: no image absent") != std::string::npos;
    }));
    auto cat = rt->catalog();
    REQUIRE(cat.tools.count("renderer") == 1);
    CHECK_FALSE(cat.tools.at("renderer").digest.has_value());
    CHECK(cat.tools.at("markdown").digest == tools_digest);
  }
  auto dup = with({markdown(), markdown()});
  REQUIRE_FALSE(dup.has_value());
  CHECK(dup.error() == make_error_code(sandbox::errc::invalid_argument));
  CHECK(with({markdown()}).has_value());
}
