// The run machine's classification (core/run/evidence.hpp): one row per evidence combination
// and the code and message it must give. DESIGN.md's order (timeout → oom → pids_limit →
// seccomp_violation → network_disabled → ok) comes from our own evidence only: a program that
// prints "timeout", exits 137 or raises SIGKILL on itself ends `ok`.
#include <signal.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/run/evidence.hpp"

namespace {

using sandbox::code;
using sandbox::detail::classify;
using sandbox::detail::run_bounds;
using sandbox::detail::run_evidence;
using namespace std::chrono_literals;

// Wait statuses as waitid/waitpid report them.
constexpr int exited(int c) { return c << 8; }
constexpr int signaled(int s) { return s; }

constexpr run_bounds bounds{
    .timeout = 5000ms, .idle_timeout = 2000ms, .memory_limit_bytes = 64ULL << 20};

sandbox::egress_attempt udp(std::string addr) {
  return {.protocol = "udp",
          .host = "",
          .address = std::move(addr),
          .port = 53,
          .allowed = false,
          .reason = "network disabled"};
}

struct row {
  const char* what;
  run_evidence ev;
  code want;
  std::string message;
  std::optional<int> exit_code = std::nullopt;
  std::optional<int> signal = std::nullopt;
};

run_evidence started(std::optional<int> status) {
  run_evidence e;
  e.started = true;
  e.main_status = status;
  return e;
}

template <class F>
run_evidence with(run_evidence e, F f) {
  f(e);
  return e;
}

}  // namespace

TEST_CASE("classify: one code per evidence combination, in DESIGN.md's order", "[classify]") {
  const std::string timeout_msg = "timed out after 5000 ms; all processes were killed";
  const std::string oom_msg = "memory limit of 67108864 bytes exceeded; all processes were killed";
  const std::string pids_msg =
      "too many processes: the sandbox reached the run's pids limit and ended with it; all "
      "processes were killed";
  const std::vector<row> rows = {
      {"a clean exit", started(exited(0)), code::ok, "", 0},
      {"a non-zero exit is still ok", started(exited(3)), code::ok, "", 3},
      {"exit 137 (as if killed) is the program's own", started(exited(137)), code::ok, "", 137},
      {"SIGKILL raised on itself, nothing counted", started(signaled(SIGKILL)), code::ok, "",
       std::nullopt, SIGKILL},
      {"our deadline", with(started(std::nullopt), [](auto& e) { e.timed_out = true; }),
       code::timeout, timeout_msg, std::nullopt, SIGKILL},
      {"deadline and an OOM kill: timeout first",
       with(started(std::nullopt),
            [](auto& e) {
              e.timed_out = true;
              e.oom_kills = 1;
              e.oom_triggered = true;
            }),
       code::timeout, timeout_msg, std::nullopt, SIGKILL},
      {"OOM event ended the run",
       with(started(std::nullopt),
            [](auto& e) {
              e.oom_kills = 1;
              e.oom_triggered = true;
            }),
       code::oom, oom_msg, std::nullopt, SIGKILL},
      {"OOM killer took the main process",
       with(started(signaled(SIGKILL)), [](auto& e) { e.oom_kills = 2; }), code::oom, oom_msg,
       std::nullopt, SIGKILL},
      {"OOM kill of a child, main exited by itself, not triggered",
       with(started(exited(0)), [](auto& e) { e.oom_kills = 1; }), code::ok, "", 0},
      {"OOM kill of a child, main exited by itself, triggered",
       with(started(exited(1)),
            [](auto& e) {
              e.oom_kills = 1;
              e.oom_triggered = true;
            }),
       code::oom, oom_msg, 1},
      {"triggered without a counted kill is no OOM",
       with(started(exited(0)), [](auto& e) { e.oom_triggered = true; }), code::ok, "", 0},
      {"a forbidden call", with(started(std::nullopt), [](auto& e) { e.violation = "ptrace"; }),
       code::seccomp_violation, "forbidden system call 'ptrace'; all processes were killed",
       std::nullopt, SIGKILL},
      {"OOM before a violation",
       with(started(std::nullopt),
            [](auto& e) {
              e.violation = "ptrace";
              e.oom_kills = 1;
            }),
       code::oom, oom_msg, std::nullopt, SIGKILL},
      {"timeout before a violation",
       with(started(std::nullopt),
            [](auto& e) {
              e.violation = "ptrace";
              e.timed_out = true;
            }),
       code::timeout, timeout_msg, std::nullopt, SIGKILL},
      {"egress in a run without network",
       with(started(exited(0)),
            [](auto& e) {
              e.egress.record(udp("192.0.2.1"), false);
              e.egress.record(udp("192.0.2.1"), false);  // a repeat: counted, not listed
              e.egress.record(udp("192.0.2.2"), false);
            }),
       code::network_disabled, "network access is disabled for this run; 3 attempt(s) refused", 0},
      {"a violation before egress",
       with(started(std::nullopt),
            [](auto& e) {
              e.egress.record(udp("192.0.2.1"), false);
              e.violation = "mount";
            }),
       code::seccomp_violation, "forbidden system call 'mount'; all processes were killed",
       std::nullopt, SIGKILL},
      {"egress in a network run is no refusal",
       with(started(exited(0)),
            [](auto& e) {
              e.network_granted = true;
              e.egress.record(udp("192.0.2.1"), true);
            }),
       code::ok, "", 0},
      {"an input blob vanished (nothing started)",
       with(run_evidence{},
            [](auto& e) {
              e.blob_missing = 2;
              e.internal_error = "x";
            }),
       code::blob_not_found, "files_in[2].blob: blob not found"},
      {"teardown failed beats the run machine's own failure",
       with(started(std::nullopt),
            [](auto& e) {
              e.teardown_failed = true;
              e.internal_error = "sandbox setup failed";
              e.timed_out = true;
            }),
       code::internal, "sandbox teardown failed", std::nullopt, SIGKILL},
      {"the run machine's own failure beats the deadline",
       with(run_evidence{},
            [](auto& e) {
              e.internal_error = "sandbox setup failed";
              e.timed_out = true;
              e.cancelled = true;
            }),
       code::internal, "sandbox setup failed"},
      {"cancelled", with(started(std::nullopt), [](auto& e) { e.cancelled = true; }),
       code::internal, "run cancelled", std::nullopt, SIGKILL},
      {"a session idle past its timeout",
       with(started(std::nullopt),
            [](auto& e) {
              e.idle_timed_out = true;
              e.timed_out = true;
            }),
       code::timeout, "idle for 2000 ms (no byte either way); all processes were killed",
       std::nullopt, SIGKILL},
      {"sandbox-init went away before the program",
       with(started(std::nullopt), [](auto& e) { e.supervisor_lost = true; }), code::internal,
       "the sandbox ended unexpectedly before the program did; all processes were killed",
       std::nullopt, SIGKILL},
      {"supervisor lost after our deadline: timeout",
       with(started(std::nullopt),
            [](auto& e) {
              e.supervisor_lost = true;
              e.timed_out = true;
            }),
       code::timeout, timeout_msg, std::nullopt, SIGKILL},
      {"supervisor lost with an OOM kill: oom",
       with(started(std::nullopt),
            [](auto& e) {
              e.supervisor_lost = true;
              e.oom_kills = 1;
            }),
       code::oom, oom_msg, std::nullopt, SIGKILL},
      // gVisor's sentry dies when the run cgroup refuses it a host task (pids.max): the
      // refusals counted in pids.events explain the loss, unless our timer or the OOM
      // killer came first.
      {"supervisor lost at the pids limit: pids_limit",
       with(started(std::nullopt),
            [](auto& e) {
              e.supervisor_lost = true;
              e.pids_limit_hits = 3;
            }),
       code::pids_limit, pids_msg, std::nullopt, SIGKILL},
      {"supervisor lost at the pids limit after our deadline: timeout",
       with(started(std::nullopt),
            [](auto& e) {
              e.supervisor_lost = true;
              e.pids_limit_hits = 1;
              e.timed_out = true;
            }),
       code::timeout, timeout_msg, std::nullopt, SIGKILL},
      {"supervisor lost at the pids limit with an OOM kill: oom",
       with(started(std::nullopt),
            [](auto& e) {
              e.supervisor_lost = true;
              e.pids_limit_hits = 1;
              e.oom_kills = 1;
            }),
       code::oom, oom_msg, std::nullopt, SIGKILL},
      {"pids limit hit while the sandbox lived (EAGAIN inside): the program's own end",
       with(started(exited(1)), [](auto& e) { e.pids_limit_hits = 40; }), code::ok, "", 1},
      {"pids limit hit while the sandbox lived, then our deadline: timeout",
       with(started(std::nullopt),
            [](auto& e) {
              e.pids_limit_hits = 40;
              e.timed_out = true;
            }),
       code::timeout, timeout_msg, std::nullopt, SIGKILL},
      {"never started: no signal, no exit code",
       with(run_evidence{}, [](auto& e) { e.internal_error = "sandbox setup failed"; }),
       code::internal, "sandbox setup failed"},
  };
  for (const auto& r : rows) {
    INFO(r.what);
    auto v = classify(r.ev, bounds);
    CHECK(v.code == r.want);
    CHECK(v.message == r.message);
    CHECK(v.exit_code == r.exit_code);
    CHECK(v.signal == r.signal);
    CHECK(v.supervisor_lost == (r.message.rfind("the sandbox ended unexpectedly", 0) == 0));
    CHECK(v.violation.has_value() == (r.want == code::seccomp_violation));
  }
}

TEST_CASE("classify: the violation is named in the verdict", "[classify]") {
  auto e = started(std::nullopt);
  e.violation = "x32:connect";
  auto v = classify(e, bounds);
  REQUIRE(v.violation);
  CHECK(*v.violation == "x32:connect");
}

TEST_CASE("egress log: each attempt once, at most 64, the rest counted", "[classify][egress]") {
  sandbox::detail::egress_log log;
  for (int i = 0; i < 100; ++i) log.record(udp("192.0.2." + std::to_string(i % 80)), false);
  CHECK(log.attempts().size() == sandbox::detail::egress_log::max_records);
  CHECK(log.dropped() == 100 - 64);
  CHECK(log.attempts().front().address == "192.0.2.0");
  CHECK(log.attempts().front().reason == "network disabled");
}

TEST_CASE("egress log: outside the proxy a network run is told to use it", "[classify][egress]") {
  sandbox::detail::egress_log log;
  log.record(udp("192.0.2.1"), true);
  log.record({.protocol = "dns",
              .host = "example.com",
              .address = "",
              .port = 53,
              .allowed = false,
              .reason = "network disabled"},
             true);
  log.record({.protocol = "https",
              .host = "example.com",
              .address = "",
              .port = 443,
              .allowed = false,
              .reason = "not in the allowlist"},
             true);
  REQUIRE(log.attempts().size() == 3);
  CHECK(log.attempts()[0].reason == "direct connection not allowed: use the proxy");
  CHECK(log.attempts()[1].reason == "DNS from inside is not allowed: use the proxy");
  CHECK(log.attempts()[2].reason == "not in the allowlist");  // the proxy's own verdict
}

TEST_CASE("usage: setup and wall time from the run's clock", "[classify]") {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::time_point(1000ms);
  sandbox::detail::run_times t{
      .t0 = t0, .started = t0 + 300ms, .main_exit = t0 + 1300ms, .ended = t0 + 1500ms};
  sandbox::detail::cgroup_stats s{.oom_kills = 0,
                                  .peak_memory_bytes = 4096,
                                  .cpu_usage_usec = 250'999,
                                  .peak_is_sampled = false};
  auto u = sandbox::detail::measure_usage(started(exited(0)), t, s);
  CHECK(u.setup == 300ms);
  CHECK(u.wall == 1000ms);  // to the main process's exit
  CHECK(u.cpu == 250ms);
  CHECK(u.peak_memory_bytes == 4096);
  u = sandbox::detail::measure_usage(started(std::nullopt), t, s);
  CHECK(u.wall == 1200ms);  // killed: to the end
  u = sandbox::detail::measure_usage(run_evidence{}, t, s);
  CHECK(u.setup == 1500ms);  // never started: setup to the end
  CHECK(u.wall == 0ms);
}

TEST_CASE("session end: from the run's verdict and the session's evidence", "[classify]") {
  using sandbox::session_end;
  using sandbox::detail::classify_session_end;
  using sandbox::detail::session_evidence;
  struct srow {
    const char* what;
    session_evidence e;
    code in;
    session_end want;
    code out;
  };
  const std::vector<srow> rows = {
      {"closed on request", {.close_requested = true}, code::ok, session_end::closed, code::ok},
      {"closed, but the server was killed by OOM first",
       {.close_requested = true},
       code::oom,
       session_end::oom,
       code::oom},
      {"idle",
       {.close_requested = true, .idle_timed_out = true},
       code::timeout,
       session_end::idle_timeout,
       code::timeout},
      {"lifetime", {.timed_out = true}, code::timeout, session_end::max_lifetime, code::timeout},
      {"ticket expiry",
       {.timed_out = true, .lifetime_ends_at_ticket_expiry = true},
       code::timeout,
       session_end::ticket_expired,
       code::timeout},
      {"seccomp",
       {},
       code::seccomp_violation,
       session_end::seccomp_violation,
       code::seccomp_violation},
      {"killed", {.killed = true}, code::internal, session_end::killed, code::internal},
      {"killed while exiting ok", {.killed = true}, code::ok, session_end::killed, code::internal},
      {"failed", {}, code::internal, session_end::failed, code::internal},
      {"the sandbox ended at the pids limit",
       {},
       code::pids_limit,
       session_end::failed,
       code::pids_limit},
      {"exited by itself", {}, code::ok, session_end::server_exited, code::ok},
      {"exited after egress",
       {},
       code::network_disabled,
       session_end::server_exited,
       code::network_disabled},
  };
  for (const auto& r : rows) {
    INFO(r.what);
    sandbox::run_result res;
    res.code = r.in;
    CHECK(classify_session_end(r.e, res) == r.want);
    CHECK(res.code == r.out);
    if (r.want == session_end::killed) {
      CHECK(res.message == "session killed (its owner went away or the runtime shut down)");
    }
  }
}

TEST_CASE("egress log: a DNS query sandbox-init reported is never copied raw",
          "[classify][egress]") {
  using sandbox::detail::reported_dns_query;
  auto a = reported_dns_query("probe.invalid");
  CHECK(a.protocol == "dns");
  CHECK(a.host == "probe.invalid");
  CHECK(a.port == 53);
  CHECK(!a.allowed);
  CHECK(a.reason == "network disabled");
  CHECK(reported_dns_query("x\\032y.example").host == "x\\032y.example");  // escaped inside
  CHECK(reported_dns_query("evil\nname").host == "(unreadable name)");
  CHECK(reported_dns_query("").host == "(unreadable name)");
  CHECK(reported_dns_query(std::string(300, 'a')).host == std::string(255, 'a'));
}
