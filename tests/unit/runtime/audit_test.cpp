// The audit's verdicts (sandbox/audit.hpp): every check passes on good evidence and fails,
// naming the reason, on evidence from a deliberately weakened sandbox; the probe's report is
// parsed strictly; and the gathering runs end to end through a runtime (a fake backend whose
// probe answers are scripted, some of them leaky).
#include "sandbox/audit.hpp"

#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "sandbox/testing/fake_backend.hpp"

using nlohmann::json;
using sandbox::audit_evidence;
using sandbox::audit_report;
using sandbox::code;
using sandbox::evaluate_audit;
using sandbox::isolation;

namespace {

const std::string digest = "sha256:" + std::string(64, 'a');
const std::string nonce = "0123456789abcdef0123456789abcdef";

json good_probe_json() {
  return {{"v", 1},
          {"env_names", {"HOME", "LANG", "PATH", "SANDBOX_INPUT_DIR", "SANDBOX_OUTPUT_DIR"}},
          {"status",
           {{"Seccomp", "2"},
            {"NoNewPrivs", "1"},
            {"CapInh", "0000000000000000"},
            {"CapPrm", "0000000000000000"},
            {"CapEff", "0000000000000000"},
            {"CapBnd", "0000000000000000"},
            {"CapAmb", "0000000000000000"}}},
          {"seccomp_mode", 2},
          {"no_new_privs", 1},
          {"socket_files", json::array()},
          {"unix_connected", json::array()},
          {"interfaces", {"lo"}},
          {"reachable", json::array()},
          {"forks", 61},
          {"fork_error", "EAGAIN"},
          {"proof", sandbox::audit_probe_proof(nonce)}};
}

sandbox::egress_attempt refused_egress(std::string protocol, std::string address,
                                       std::uint16_t port) {
  return {.protocol = std::move(protocol),
          .host = "",
          .address = std::move(address),
          .port = port,
          .allowed = false,
          .reason = "network disabled",
          .bytes_up = 0,
          .bytes_down = 0};
}

sandbox::run_result ran_with(code c, std::optional<int> exit_code = 0) {
  sandbox::run_result r;
  r.code = c;
  r.exit_code = exit_code;
  r.backend = "process";
  r.isolation = isolation::process;
  r.runtime = {.name = "python3", .digest = digest};
  return r;
}

sandbox::run_result refused(code c) {
  sandbox::run_result r;
  r.code = c;
  r.message = "refused";
  return r;
}

audit_evidence good_evidence() {
  audit_evidence ev;
  ev.isolation = isolation::process;
  ev.backend = sandbox::backend_status{
      .isolation = isolation::process, .name = "process", .registered = true, .reason = {}};
  ev.runtime = "python3";
  ev.current_digest = digest;
  ev.max_pids = 64;
  ev.memory_limit_bytes = 64ULL << 20;
  ev.timeout = std::chrono::milliseconds(1000);
  ev.timeout_slack = std::chrono::milliseconds(20000);
  ev.probe = ran_with(code::network_disabled);
  ev.probe_stdout = good_probe_json().dump() + "\n";
  ev.nonce = nonce;
  ev.probe_addresses = {"192.0.2.7", "2001:db8::7"};
  ev.probe.egress_attempts = {refused_egress("udp", "192.0.2.7", 53),
                              refused_egress("tcp", "192.0.2.7", 22),
                              refused_egress("udp", "2001:db8::7", 53)};
  ev.host_max_open_files = 20000;
  ev.memory = ran_with(code::oom, std::nullopt);
  ev.memory.signal = 9;
  ev.timeout_run = ran_with(code::timeout, std::nullopt);
  ev.timeout_run.usage.wall = std::chrono::milliseconds(1003);
  ev.denied = refused(code::action_denied);
  ev.pin_mismatch = refused(code::digest_mismatch);
  ev.unknown_field_rejection = "unknown field \"audit_unknown_field\"";
  ev.bad_version_rejection = "v: unsupported protocol version 99";
  return ev;
}

const sandbox::audit_check& find(const audit_report& r, const std::string& name) {
  for (const auto& c : r.checks) {
    if (c.name == name) return c;
  }
  FAIL("no check " << name);
  throw std::logic_error("unreachable");
}

/// Evaluates `ev` and requires that exactly the checks in `failing` fail, the first of them
/// with a detail containing `detail_part`.
audit_report fails_only(const audit_evidence& ev, const std::vector<std::string>& failing,
                        const std::string& detail_part) {
  auto r = evaluate_audit(ev);
  INFO(sandbox::format_audit_table(r));
  CHECK_FALSE(r.passed());
  CHECK(r.failed() == failing);
  REQUIRE(!failing.empty());
  CHECK(find(r, failing.front()).detail.find(detail_part) != std::string::npos);
  return r;
}

audit_evidence with_probe(const std::function<void(json&)>& edit) {
  auto ev = good_evidence();
  json j = good_probe_json();
  edit(j);
  ev.probe_stdout = j.dump() + "\n";
  return ev;
}

const std::vector<std::string> probe_checks = {"probe",        "environment",  "seccomp",
                                               "no_new_privs", "capabilities", "no_host_socket",
                                               "no_route_out", "pids_limit"};

}  // namespace

TEST_CASE("audit: good evidence passes every check, in the documented order", "[audit]") {
  auto r = evaluate_audit(good_evidence());
  INFO(sandbox::format_audit_table(r));
  CHECK(r.passed());
  std::vector<std::string> names;
  for (const auto& c : r.checks) names.push_back(c.name);
  CHECK(names ==
        std::vector<std::string>{"backend",      "probe",        "environment",    "seccomp",
                                 "no_new_privs", "capabilities", "no_host_socket", "no_route_out",
                                 "pids_limit",   "memory_limit", "timeout",        "ticket",
                                 "protocol",     "image_pinned", "cpu_limit",      "exit_grace",
                                 "tmpfs_sizes",  "open_files",   "profiles",       "tools"});
  CHECK(r.failed().empty());
}

TEST_CASE("audit: a backend refused by its self-test fails, with its reason", "[audit]") {
  auto ev = good_evidence();
  ev.backend->registered = false;
  ev.backend->reason = "cgroup v2 pids controller not available in /sys/fs/cgroup/x";
  fails_only(ev, {"backend"}, "pids controller not available");
  ev.backend.reset();
  fails_only(ev, {"backend"}, "not enabled");
}

TEST_CASE("audit: a leaked host variable fails environment, naming it", "[audit]") {
  auto ev = with_probe([](json& j) { j["env_names"].push_back("AWS_SECRET_ACCESS_KEY"); });
  fails_only(ev, {"environment"}, "AWS_SECRET_ACCESS_KEY");
}

TEST_CASE("audit: seccomp off or strict mode fails seccomp", "[audit]") {
  fails_only(with_probe([](json& j) { j["seccomp_mode"] = 0; }), {"seccomp"}, "seccomp mode 0");
  fails_only(with_probe([](json& j) { j["seccomp_mode"] = 1; }), {"seccomp"}, "mode 1");
  // Without prctl the status line decides: a 0 there fails too.
  fails_only(with_probe([](json& j) {
               j["seccomp_mode"] = nullptr;
               j["status"]["Seccomp"] = "0";
             }),
             {"seccomp"}, "seccomp mode 0");
  // Neither source: unknown, which fails.
  fails_only(with_probe([](json& j) {
               j["seccomp_mode"] = nullptr;
               j["status"].erase("Seccomp");
             }),
             {"seccomp"}, "unknown");
}

TEST_CASE("audit: no_new_privs unset fails no_new_privs", "[audit]") {
  fails_only(with_probe([](json& j) { j["no_new_privs"] = 0; }), {"no_new_privs"}, "is 0");
  fails_only(with_probe([](json& j) {
               j["no_new_privs"] = nullptr;
               j["status"]["NoNewPrivs"] = "0";
             }),
             {"no_new_privs"}, "is 0");
}

TEST_CASE("audit: any capability held fails capabilities", "[audit]") {
  fails_only(with_probe([](json& j) { j["status"]["CapEff"] = "0000000000000400"; }),
             {"capabilities"}, "CapEff=0000000000000400");
  fails_only(with_probe([](json& j) { j["status"]["CapBnd"] = "000001ffffffffff"; }),
             {"capabilities"}, "CapBnd");
  fails_only(with_probe([](json& j) { j["status"].erase("CapPrm"); }), {"capabilities"},
             "CapPrm unknown");
  // gVisor has no ambient set: an absent CapAmb passes.
  auto ev = with_probe([](json& j) { j["status"].erase("CapAmb"); });
  CHECK(evaluate_audit(ev).passed());
}

TEST_CASE("audit: a reachable host socket or a socket file in view fails no_host_socket",
          "[audit]") {
  fails_only(with_probe([](json& j) { j["unix_connected"] = {"/var/run/docker.sock"}; }),
             {"no_host_socket"}, "/var/run/docker.sock");
  fails_only(with_probe([](json& j) { j["unix_connected"] = {"@/tmp/.X11-unix/X0"}; }),
             {"no_host_socket"}, "@/tmp/.X11-unix/X0");
  fails_only(with_probe([](json& j) { j["socket_files"] = {"/run/agent.sock"}; }),
             {"no_host_socket"}, "/run/agent.sock");
}

TEST_CASE("audit: an interface or a reachable address fails no_route_out", "[audit]") {
  fails_only(with_probe([](json& j) {
               j["interfaces"] = {"eth0", "lo"};
             }),
             {"no_route_out"}, "eth0");
  fails_only(with_probe([](json& j) { j["reachable"] = {"1.1.1.1"}; }), {"no_route_out"},
             "1.1.1.1");
}

TEST_CASE("audit: forks never refused, or refused past the limit, fail pids_limit", "[audit]") {
  fails_only(with_probe([](json& j) {
               j["forks"] = 192;
               j["fork_error"] = nullptr;
             }),
             {"pids_limit"}, "never refused");
  fails_only(with_probe([](json& j) { j["forks"] = 65; }), {"pids_limit"}, "65 forks");
  fails_only(with_probe([](json& j) { j["forks"] = -1; }), {"pids_limit"}, "-1 forks");
}

TEST_CASE("audit: a memory hog that is not killed fails memory_limit", "[audit]") {
  auto ev = good_evidence();
  ev.memory = ran_with(code::ok, 0);
  fails_only(ev, {"memory_limit"}, "ended ok (exit 0)");
}

TEST_CASE("audit: a sleeper that is not stopped, or stopped far too late, fails timeout",
          "[audit]") {
  auto ev = good_evidence();
  ev.timeout_run = ran_with(code::ok, 0);
  fails_only(ev, {"timeout"}, "ended ok");
  ev = good_evidence();
  ev.timeout_run.usage.wall = std::chrono::milliseconds(30000);
  fails_only(ev, {"timeout"}, "30000 ms");
  ev.timeout_run.usage.wall = std::chrono::milliseconds(10);
  fails_only(ev, {"timeout"}, "10 ms");
}

TEST_CASE("audit: a run under a ticket without code.execute that runs fails ticket", "[audit]") {
  auto ev = good_evidence();
  ev.denied = ran_with(code::ok, 0);
  fails_only(ev, {"ticket"}, "after it ran");
  // The right code is not enough when something ran.
  ev.denied = ran_with(code::action_denied, 0);
  fails_only(ev, {"ticket"}, "after it ran");
}

TEST_CASE("audit: a lenient decoder fails protocol", "[audit]") {
  auto ev = good_evidence();
  ev.unknown_field_rejection.reset();
  fails_only(ev, {"protocol"}, "unknown field was accepted");
  ev = good_evidence();
  ev.unknown_field_rejection = "malformed request";
  fails_only(ev, {"protocol"}, "does not name it");
  ev = good_evidence();
  ev.bad_version_rejection.reset();
  fails_only(ev, {"protocol"}, "version 99 was accepted");
}

TEST_CASE("audit: an unpinned or mismatched image fails image_pinned", "[audit]") {
  auto ev = good_evidence();
  ev.probe.runtime.digest = "sha256:" + std::string(64, 'b');
  fails_only(ev, {"image_pinned"}, "but the store's current one is");
  ev = good_evidence();
  ev.pin_mismatch = ran_with(code::ok, 0);
  fails_only(ev, {"image_pinned"}, "pinning another image ended ok");
  ev = good_evidence();
  ev.current_digest.clear();
  fails_only(ev, {"image_pinned"}, "no current image digest");
}

TEST_CASE("audit: the probe's report is parsed strictly; without one its checks fail", "[audit]") {
  const std::vector<std::pair<std::string, std::string>> bad_reports = {
      {"", "printed nothing"},
      {"not json\n", "not strict JSON"},
      {"[1]\n", "not a JSON object"},
      {"[[[[[[[[[[1]]]]]]]]]]\n", "nesting deeper"},
      // A repeated key is refused, not resolved (one parser keeps the first, another the last).
      {"{\"env_names\":[],\"env_names\":[\"AWS_SECRET_ACCESS_KEY\"]}\n", "duplicate"},
      {good_probe_json().dump() + "\n" + good_probe_json().dump() + "\n", "more than one line"},
  };
  for (const auto& [text, why] : bad_reports) {
    auto ev = good_evidence();
    ev.probe_stdout = text;
    fails_only(ev, probe_checks, why);
  }
  fails_only(with_probe([](json& j) { j["extra"] = 1; }), probe_checks, "unknown field extra");
  fails_only(with_probe([](json& j) { j.erase("forks"); }), probe_checks, "lacks field forks");
  fails_only(with_probe([](json& j) { j["forks"] = "61"; }), probe_checks, "wrong type");
  fails_only(with_probe([](json& j) { j["env_names"] = {1}; }), probe_checks,
             "env_names is not a list of strings");
  fails_only(with_probe([](json& j) { j["status"]["CapEff"] = 0; }), probe_checks,
             "status.CapEff is not a string");
  fails_only(with_probe([](json& j) { j["v"] = 2; }), probe_checks, "version");
  // A probe that crashed, or ran at another level, reports nothing trustworthy either.
  auto ev = good_evidence();
  ev.probe = ran_with(code::seccomp_violation, std::nullopt);
  fails_only(ev, probe_checks, "seccomp_violation");
  ev = good_evidence();
  ev.probe.isolation = isolation::gvisor;
  fails_only(ev, probe_checks, "ran at gvisor, not process");
  // A host value smuggled into a name cannot break the table: it is escaped.
  auto r = evaluate_audit(with_probe([](json& j) { j["env_names"].push_back("X\n\x1b[2J"); }));
  CHECK(find(r, "environment").detail.find('\n') == std::string::npos);
  CHECK(find(r, "environment").detail.find("\\x0a") != std::string::npos);
}

TEST_CASE("audit: table and JSON name the failing checks", "[audit]") {
  auto ev = good_evidence();
  ev.memory = ran_with(code::ok, 0);
  auto r = evaluate_audit(ev);
  auto table = sandbox::format_audit_table(r);
  CHECK(table.find("memory_limit") != std::string::npos);
  CHECK(table.find("FAIL") != std::string::npos);
  CHECK(table.find("FAILED: memory_limit") != std::string::npos);
  auto j = json::parse(sandbox::encode_audit_report(r));
  CHECK(j["v"] == 1);
  CHECK(j["isolation"] == "process");
  CHECK(j["passed"] == false);
  CHECK(j["failed"] == json{"memory_limit"});
  CHECK(j["checks"].size() == 20);
  CHECK(j["image_digest"] == digest);
  CHECK(j["image_current"] == true);
  CHECK(j["checks"][9]["name"] == "memory_limit");
  CHECK(j["checks"][9]["passed"] == false);
  auto ok = json::parse(sandbox::encode_audit_report(evaluate_audit(good_evidence())));
  CHECK(ok["passed"] == true);
  CHECK(ok["failed"].empty());
  CHECK(audit_report{}.passed() == false);  // no checks is not a pass
}

// --- end to end, through a runtime with a scripted backend -----------------------------------

namespace {

/// The nonce embedded in a probe's source (`NONCE = "..."`).
std::string nonce_of(const std::string& source) {
  const std::string mark = "NONCE = \"";
  auto at = source.find(mark);
  if (at == std::string::npos) return {};
  at += mark.size();
  return source.substr(at, source.find('"', at) - at);
}

/// A fake backend answering the audit's snippets like a sound process level: the probe
/// prints `probe` with the proof of the nonce it was given (unless `answer_nonce` is false)
/// and its connects to `tried` are recorded as refused egress.
std::shared_ptr<sandbox::testing::fake_backend> scripted(
    json probe, std::vector<std::string> tried = {"192.0.2.7"}, bool answer_nonce = true) {
  auto fake = std::make_shared<sandbox::testing::fake_backend>(isolation::process);
  fake->on_source_contains("# agent-sandbox audit probe")
      .respond_with([probe, tried, answer_nonce](const sandbox::admitted& a) {
        json j = probe;
        if (answer_nonce) j["proof"] = sandbox::audit_probe_proof(nonce_of(a.request.source));
        sandbox::testing::scripted_run r;
        r.std_out = j.dump() + "\n";
        for (const auto& t : tried) r.egress_attempts.push_back(refused_egress("udp", t, 53));
        return sandbox::testing::result_with(code::network_disabled, r);
      });
  fake->on_source_contains("# agent-sandbox audit: memory")
      .respond(sandbox::testing::result_with(code::oom));
  sandbox::testing::scripted_run slept = sandbox::testing::result_with(code::timeout);
  slept.usage.wall = std::chrono::milliseconds(1001);
  fake->on_source_contains("# agent-sandbox audit: timeout").respond(slept);
  return fake;
}

}  // namespace

TEST_CASE("audit: gathered through a runtime, a sound backend passes", "[audit]") {
  auto fake = scripted(good_probe_json());
  auto rt = sandbox::testing::make_runtime(fake);
  REQUIRE(rt.has_value());
  sandbox::audit_options o;
  o.host_sockets = {"/run/host.sock", "@abstract-name"};
  o.host_addresses = {"192.0.2.7"};
  auto ev = sandbox::gather_audit_evidence(*rt, o);
  auto r = evaluate_audit(ev);
  INFO(sandbox::format_audit_table(r));
  CHECK(r.passed());
  CHECK(ev.current_digest == sandbox::testing::fake_digest("python3"));
  // Only the three snippets reached the backend: the denied and mispinned runs were refused
  // at admission.
  auto seen = fake->requests();
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].request.source.find("/run/host.sock") != std::string::npos);
  CHECK(seen[0].request.source.find("@abstract-name") != std::string::npos);
  CHECK(seen[0].request.source.find("192.0.2.7") != std::string::npos);
  CHECK(seen[1].request.memory_limit_bytes == 64ULL << 20);
  CHECK(seen[2].request.timeout == std::chrono::milliseconds(1000));
  // Each audit draws its own nonce and embeds it in the probe.
  CHECK(ev.nonce.size() == 32);
  CHECK(nonce_of(seen[0].request.source) == ev.nonce);
  CHECK(ev.probe_addresses == std::vector<std::string>{"192.0.2.7"});
  auto again = sandbox::gather_audit_evidence(*rt, o);
  CHECK(again.nonce != ev.nonce);
  CHECK(r.image_digest == sandbox::testing::fake_digest("python3"));
  CHECK(r.image_current);
}

TEST_CASE("audit: gathered through a runtime, a canned report fails every probe check", "[audit]") {
  // The tester's fake interpreter: a script printing a perfect report it did not compute,
  // ending ok without a single connect attempt the host could record.
  sandbox::audit_options o;
  o.host_addresses = {"192.0.2.7"};
  SECTION("right report, no nonce answer, no egress") {
    auto rt = sandbox::testing::make_runtime(scripted(good_probe_json(), {}, false));
    REQUIRE(rt.has_value());
    fails_only(sandbox::gather_audit_evidence(*rt, o), probe_checks, "nonce");
  }
  SECTION("nonce answered, but the host recorded none of the connects") {
    auto rt = sandbox::testing::make_runtime(scripted(good_probe_json(), {"198.51.100.1"}));
    REQUIRE(rt.has_value());
    fails_only(sandbox::gather_audit_evidence(*rt, o), probe_checks,
               "no egress attempt to 192.0.2.7");
  }
}

TEST_CASE("audit: gathered through a runtime, a leaky backend fails with the reason", "[audit]") {
  json leaky = good_probe_json();
  leaky["env_names"].push_back("OPENAI_API_KEY");
  leaky["unix_connected"] = {"/run/host.sock"};
  auto fake = scripted(leaky);
  auto rt = sandbox::testing::make_runtime(fake);
  REQUIRE(rt.has_value());
  sandbox::audit_options o;
  o.host_sockets = {"/run/host.sock"};
  o.host_addresses = {"192.0.2.7"};
  auto r = evaluate_audit(sandbox::gather_audit_evidence(*rt, o));
  CHECK(r.failed() == std::vector<std::string>{"environment", "no_host_socket"});
  CHECK(find(r, "environment").detail.find("OPENAI_API_KEY") != std::string::npos);
  CHECK(find(r, "no_host_socket").detail.find("/run/host.sock") != std::string::npos);
}

TEST_CASE("audit: the probe source carries host targets as data, never as code", "[audit]") {
  auto src = sandbox::audit_probe_source({"/run/a'''b.sock", "/tmp/x\\y"}, {"10.0.0.1"}, 7);
  // A quote in a path cannot end the embedded string.
  CHECK(src.find("a'''b") == std::string::npos);
  CHECK(src.find("MAX_FORKS = 7") != std::string::npos);
  CHECK(src.find("@SOCKETS@") == std::string::npos);
  CHECK(src.find("@ADDRESSES@") == std::string::npos);
}

// --- the host's evidence against the probe's word (a hostile image's fake interpreter) -------

TEST_CASE("audit: a report that does not answer this audit's nonce fails every probe check",
          "[audit]") {
  // A canned report (no proof, another audit's proof, a proof off by one character) is not
  // the probe's: the checks resting on it fail, whatever it claims.
  fails_only(with_probe([](json& j) { j.erase("proof"); }), probe_checks, "lacks field proof");
  fails_only(with_probe([](json& j) { j["proof"] = 7; }), probe_checks, "wrong type");
  fails_only(with_probe([](json& j) {
               j["proof"] = sandbox::audit_probe_proof("ffffffffffffffffffffffffffffffff");
             }),
             probe_checks, "does not answer this audit's nonce");
  auto one_off = sandbox::audit_probe_proof(nonce);
  one_off.back() = one_off.back() == '0' ? '1' : '0';
  fails_only(with_probe([&](json& j) { j["proof"] = one_off; }), probe_checks,
             "does not answer this audit's nonce");
  auto ev = good_evidence();
  ev.nonce.clear();
  fails_only(ev, probe_checks, "no audit nonce");
  // The proof is what the probe's Python line computes (this vector from CPython's
  // hashlib: sha256 of "agent-sandbox-audit:ab:2").
  CHECK(sandbox::audit_probe_proof("ab") ==
        "dc2012c4621f5057959958b91f10d92465b14c2878f22b22cd30a1df4d0b7058");
}

TEST_CASE("audit: at process and container the host's egress record must back the probe",
          "[audit]") {
  for (auto level : {isolation::process, isolation::container}) {
    auto at = [&](audit_evidence ev) {
      ev.isolation = level;
      ev.backend->isolation = level;
      ev.probe.isolation = level;
      return ev;
    };
    CHECK(evaluate_audit(at(good_evidence())).passed());
    // The fake interpreter's run: ended ok, no attempt recorded.
    auto ev = at(good_evidence());
    ev.probe.code = code::ok;
    ev.probe.egress_attempts.clear();
    fails_only(ev, probe_checks, "a real probe ends network_disabled");
    // network_disabled, but one of the probed addresses never tried (one address differing).
    ev = at(good_evidence());
    ev.probe.egress_attempts.back().address = "2001:db8::8";
    fails_only(ev, probe_checks, "no egress attempt to 2001:db8::7");
    // Attempts the result had no room for account for missing ones, one for one.
    ev.probe.egress_attempts_dropped = 1;
    CHECK(evaluate_audit(ev).passed());
    ev.probe.egress_attempts.clear();
    fails_only(ev, probe_checks, "no egress attempt to 192.0.2.7, 2001:db8::7");
    // Other spellings of the same address match.
    ev = at(good_evidence());
    ev.probe_addresses = {"192.0.2.7", "2001:0db8:0:0::7"};
    CHECK(evaluate_audit(ev).passed());
    // No address probed: no host evidence, no pass.
    ev.probe_addresses.clear();
    fails_only(ev, probe_checks, "no address");
  }
}

TEST_CASE("audit: gVisor records no direct egress; the nonce still binds its report", "[audit]") {
  auto ev = good_evidence();
  ev.isolation = ev.backend->isolation = ev.probe.isolation = isolation::gvisor;
  ev.probe.code = code::ok;
  ev.probe.egress_attempts.clear();
  auto r = evaluate_audit(ev);
  INFO(sandbox::format_audit_table(r));
  CHECK(r.passed());
  CHECK(find(r, "probe").detail.find("records no direct egress") != std::string::npos);
  ev.probe_stdout = with_probe([](json& j) { j.erase("proof"); }).probe_stdout;
  fails_only(ev, probe_checks, "lacks field proof");
}

TEST_CASE("audit: the report names the image it audited and whether it is current", "[audit]") {
  auto r = evaluate_audit(good_evidence());
  CHECK(r.image_digest == digest);
  CHECK(r.image_current);
  CHECK(sandbox::format_audit_table(r).find("image audited: " + digest +
                                            " (the store's current one)") != std::string::npos);
  auto ev = good_evidence();
  ev.current_digest = "sha256:" + std::string(64, 'c');
  r = evaluate_audit(ev);
  CHECK(r.image_digest == digest);
  CHECK_FALSE(r.image_current);
  CHECK(sandbox::format_audit_table(r).find("not the store's current one") != std::string::npos);
  auto j = json::parse(sandbox::encode_audit_report(r));
  CHECK(j["image_digest"] == digest);
  CHECK(j["image_current"] == false);
}

// --- the host's effective configuration -------------------------------------------------------

TEST_CASE("audit: no CPU limit fails cpu_limit, naming where", "[audit]") {
  auto ev = good_evidence();
  ev.policy.cpu_quota_millicores = 0;
  fails_only(ev, {"cpu_limit"}, "policy.cpu_quota_millicores is 0");
  // A profile that keeps the policy's value inherits the missing limit and is named too.
  ev.policy.profiles["browser"] = sandbox::workload_profile{.max_pids = 256};
  fails_only(ev, {"cpu_limit"}, "policy.profiles.browser.cpu_quota_millicores is 0");
  ev.policy.cpu_quota_millicores = 1;
  CHECK(evaluate_audit(ev).passed());
}

TEST_CASE("audit: an unbounded exit grace fails exit_grace", "[audit]") {
  auto ev = good_evidence();
  ev.policy.exit_grace = std::chrono::milliseconds(3600000);
  fails_only(ev, {"exit_grace"}, "policy.exit_grace_ms is 3600000");
  ev.policy.exit_grace = sandbox::audit_max_exit_grace + std::chrono::milliseconds(1);
  fails_only(ev, {"exit_grace"}, "policy.exit_grace_ms is 10001");
  ev.policy.exit_grace = sandbox::audit_max_exit_grace;
  CHECK(evaluate_audit(ev).passed());
}

TEST_CASE("audit: a tmpfs larger than any run's memory fails tmpfs_sizes", "[audit]") {
  auto ev = good_evidence();
  ev.policy.tmp_bytes = 1ULL << 40;
  fails_only(ev, {"tmpfs_sizes"}, "policy.tmp_bytes is 1099511627776");
  ev = good_evidence();
  ev.policy.home_bytes = ev.policy.max_memory_bytes + 1;
  fails_only(ev, {"tmpfs_sizes"}, "policy.home_bytes");
  ev.policy.home_bytes = ev.policy.max_memory_bytes;
  CHECK(evaluate_audit(ev).passed());
  // A profile's effective size counts (within its ceiling, above the memory ceiling).
  ev = good_evidence();
  ev.policy.max_memory_bytes = 512ULL << 20;
  ev.policy.profiles["browser"] = sandbox::workload_profile{.shm_bytes = 768ULL << 20};
  fails_only(ev, {"tmpfs_sizes"}, "policy.profiles.browser.shm_bytes is 805306368");
}

TEST_CASE("audit: max_open_files above the host's hard limit or zero fails open_files", "[audit]") {
  auto ev = good_evidence();
  ev.policy.max_open_files = 1048576;
  fails_only(ev, {"open_files"}, "policy.max_open_files is 1048576 (above the host's hard");
  ev.policy.max_open_files = 20001;
  fails_only(ev, {"open_files"}, "20001");
  ev.policy.max_open_files = 20000;
  CHECK(evaluate_audit(ev).passed());
  ev.policy.max_open_files = 0;
  fails_only(ev, {"open_files"}, "policy.max_open_files is 0");
  ev = good_evidence();
  ev.host_max_open_files = 4096;
  ev.policy.ceilings.max_open_files = 8192;
  ev.policy.profiles["big"] = sandbox::workload_profile{.max_open_files = 5000};
  fails_only(ev, {"open_files"}, "policy.profiles.big.max_open_files is 5000");
}

TEST_CASE("audit: a profile whose limits cannot be had fails profiles", "[audit]") {
  auto ev = good_evidence();
  ev.policy.profiles["p"] = sandbox::workload_profile{.max_pids = 0};
  fails_only(ev, {"profiles"}, "policy.profiles.p.max_pids is 0");
  ev = good_evidence();
  ev.policy.profiles["p"] = sandbox::workload_profile{.tmpfs_inodes = 0};
  fails_only(ev, {"profiles"}, "policy.profiles.p.tmpfs_inodes is 0");
  ev = good_evidence();
  ev.policy.profiles["p"] =
      sandbox::workload_profile{.memory_limit_bytes = ev.policy.max_memory_bytes + 1};
  fails_only(ev, {"profiles"}, "policy.profiles.p.memory_limit_bytes");
  ev.policy.profiles["p"] = sandbox::workload_profile{.memory_limit_bytes = 1};
  fails_only(ev, {"profiles"}, "policy.profiles.p.memory_limit_bytes is 1");
  ev.policy.profiles["p"] = sandbox::workload_profile{.timeout = std::chrono::milliseconds(0)};
  fails_only(ev, {"profiles"}, "policy.profiles.p.timeout_ms is 0");
  ev.policy.profiles["p"] = sandbox::workload_profile{.timeout = ev.policy.max_timeout * 2};
  fails_only(ev, {"profiles"}, "policy.profiles.p.timeout_ms is 16000");
  ev.policy.profiles["p"] = sandbox::workload_profile{.timeout = ev.policy.max_timeout};
  CHECK(evaluate_audit(ev).passed());
}

TEST_CASE("audit: a registered tool the policy would refuse fails tools", "[audit]") {
  auto good_tool = sandbox::tool_entry{.name = "rg",
                                       .image = "tools",
                                       .image_digest = std::nullopt,
                                       .binary = "/usr/bin/rg",
                                       .args = {},
                                       .input = sandbox::tool_input::stdin_bytes,
                                       .isolation = isolation::container,
                                       .profile = "",
                                       .egress = {},
                                       .env = {}};
  auto ev = good_evidence();
  ev.tools = {good_tool};
  CHECK(evaluate_audit(ev).passed());
  ev.tools[0].profile = "absent";
  fails_only(ev, {"tools"}, "tools[0] (rg).profile");
  ev.tools[0] = good_tool;
  ev.tools[0].binary = "/usr/bin/../bin/rg";
  fails_only(ev, {"tools"}, "tools[0] (rg).binary");
  ev.tools[0] = good_tool;
  ev.tools[0].isolation = isolation::microvm;  // a level like the others now
  CHECK(evaluate_audit(ev).passed());
}

TEST_CASE("audit: the probe source embeds only the nonce's hex digits", "[audit]") {
  auto src = sandbox::audit_probe_source({}, {}, 7, "00ff\"+quit()+\"aa");
  CHECK(src.find("NONCE = \"00ffaa\"") != std::string::npos);
  CHECK(src.find("quit()") == std::string::npos);
  CHECK(src.find("@NONCE@") == std::string::npos);
}

// --- runtime creation: RLIMIT_NOFILE values the host cannot give ------------------------------

TEST_CASE("runtime: max_open_files above the host's hard limit is refused, ceilings clamped",
          "[audit][runtime]") {
  rlimit rl{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &rl) == 0);
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= 0xffffffffULL) {
    WARN("the hard RLIMIT_NOFILE is unbounded here: no value is above it");
    return;
  }
  const auto hard = static_cast<std::uint32_t>(rl.rlim_max);
  std::vector<std::string> logged;
  auto create = [&](sandbox::policy p) {
    sandbox::runtime_options o;
    o.blobs = sandbox::make_memory_blob_store();
    o.fixed_digests = {{"python3", sandbox::testing::fake_digest("python3")}};
    o.process_backend = false;
    o.policy = std::move(p);
    logged.clear();
    o.log = [&](sandbox::log_level, std::string_view l) { logged.emplace_back(l); };
    return sandbox::runtime::create(o);
  };
  auto logged_has = [&](const std::string& part) {
    INFO("looking for: " << part);
    for (const auto& l : logged) {
      if (l.find(part) != std::string::npos) return true;
    }
    return false;
  };
  // The policy's own value: every run would fail at sandbox-init's setrlimit. Refused.
  for (std::uint32_t over : {hard + 1, std::max<std::uint32_t>(hard + 1, 1048576)}) {
    sandbox::policy p;
    p.max_open_files = over;
    auto rt = create(p);
    REQUIRE_FALSE(rt.has_value());
    CHECK(rt.error() == sandbox::make_error_code(sandbox::errc::invalid_argument));
    CHECK(logged_has("policy.max_open_files: " + std::to_string(over) +
                     " is above the host's hard RLIMIT_NOFILE (" + std::to_string(hard) + ")"));
  }
  // At the limit: accepted.
  {
    sandbox::policy p;
    p.max_open_files = hard;
    p.ceilings.max_open_files = hard;
    CHECK(create(p).has_value());
  }
  // A ceiling above it is lowered to it, and a profile asking more is clamped (both logged),
  // so the profile's runs get what the host can give.
  {
    sandbox::policy p;
    p.ceilings.max_open_files = hard + 1;
    p.profiles["big"] = sandbox::workload_profile{.max_open_files = hard + 1};
    auto rt = create(p);
    REQUIRE(rt.has_value());
    CHECK(rt->policy().ceilings.max_open_files == hard);
    auto eff = sandbox::effective_limits(rt->policy(), "big");
    REQUIRE(eff.has_value());
    CHECK(eff->limits.max_open_files == hard);
    CHECK(logged_has("policy.ceilings.max_open_files: " + std::to_string(hard + 1) +
                     " is above the host's hard RLIMIT_NOFILE; clamped to " +
                     std::to_string(hard)));
    CHECK(logged_has("policy.profiles.big.max_open_files: above policy.ceilings.max_open_files"));
  }
}
