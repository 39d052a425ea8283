// A run's evidence and its classification (evidence.hpp).
#include "core/run/evidence.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cctype>

#include "core/egress/secret_scan.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {

void egress_log::record(egress_attempt a, bool network_granted) {
  if (network_granted && a.protocol != "https" && a.protocol != "http" && !a.allowed &&
      a.reason != secret_misuse_reason) {
    // Seen outside the proxy (seccomp notification, the DNS sink): refused even in a network run.
    a.reason = a.protocol == "dns" ? "DNS from inside is not allowed: use the proxy"
                                   : "direct connection not allowed: use the proxy";
  }
  if (std::find(attempts_.begin(), attempts_.end(), a) != attempts_.end() ||
      attempts_.size() >= max_records) {
    ++dropped_;
    return;
  }
  attempts_.push_back(std::move(a));
}

egress_attempt reported_dns_query(std::string_view payload) {
  std::string name(payload.substr(0, 255));
  const bool clean = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
           c == '\\';
  });
  return {.protocol = "dns",
          .host = clean ? name : std::string("(unreadable name)"),
          .address = "",
          .port = 53,
          .allowed = false,
          .reason = "network disabled"};
}

run_verdict classify(const run_evidence& ev, const run_bounds& b) {
  run_verdict v;
  if (ev.main_status) {
    const int st = *ev.main_status;
    if (WIFEXITED(st)) v.exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) v.signal = WTERMSIG(st);
  } else if (ev.started) {
    v.signal = SIGKILL;  // we killed it before it exited
  }
  auto set = [&](sandbox::code c, std::string message) {
    v.code = c;
    v.message = std::move(message);
    return v;
  };
  // The run machine's own outcomes: nothing of the program decides them.
  if (ev.blob_missing) {
    return set(sandbox::code::blob_not_found,
               fmt::format("files_in[{}].blob: blob not found", *ev.blob_missing));
  }
  if (ev.teardown_failed) return set(sandbox::code::internal, "sandbox teardown failed");
  if (ev.internal_error) return set(sandbox::code::internal, *ev.internal_error);
  if (ev.cancelled) return set(sandbox::code::internal, "run cancelled");
  if (ev.idle_timed_out) {
    return set(sandbox::code::timeout,
               fmt::format("idle for {} ms (no byte either way); all processes were killed",
                           b.idle_timeout.count()));
  }
  if (ev.supervisor_lost && !ev.timed_out && ev.oom_kills == 0 && ev.pids_limit_hits > 0) {
    // The sandbox's own kernel ended at the run's pids limit (gVisor: its sentry panics
    // when it cannot start a host task): the program's processes used the limit up.
    return set(sandbox::code::pids_limit,
               "too many processes: the sandbox reached the run's pids limit and ended with "
               "it; all processes were killed");
  }
  if (ev.supervisor_lost && !ev.timed_out && ev.oom_kills == 0) {
    v.supervisor_lost = true;
    return set(sandbox::code::internal,
               "the sandbox ended unexpectedly before the program did; all processes were "
               "killed");
  }
  // DESIGN.md's order, from our own evidence.
  const bool main_killed =
      !ev.main_status || (WIFSIGNALED(*ev.main_status) && WTERMSIG(*ev.main_status) == SIGKILL);
  if (ev.timed_out) {
    return set(sandbox::code::timeout,
               fmt::format("timed out after {} ms; all processes were killed", b.timeout.count()));
  }
  if (ev.oom_kills > 0 && (ev.oom_triggered || main_killed)) {
    return set(sandbox::code::oom,
               fmt::format("memory limit of {} bytes exceeded; all processes were killed",
                           b.memory_limit_bytes));
  }
  if (ev.violation) {
    v.violation = ev.violation;
    return set(sandbox::code::seccomp_violation,
               fmt::format("forbidden system call '{}'; all processes were killed", *ev.violation));
  }
  if (!ev.egress.attempts().empty() && !ev.network_granted) {
    return set(sandbox::code::network_disabled,
               fmt::format("network access is disabled for this run; {} attempt(s) refused",
                           ev.egress.attempts().size() + ev.egress.dropped()));
  }
  return set(sandbox::code::ok, {});
}

namespace {

std::chrono::milliseconds ms_between(run_times::clock::time_point a,
                                     run_times::clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a);
}

std::int64_t us(run_times::clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

run_usage measure_usage(const run_evidence& ev, const run_times& t, const cgroup_stats& s) {
  run_usage u;
  u.cpu = std::chrono::milliseconds(s.cpu_usage_usec / 1000);
  u.peak_memory_bytes = s.peak_memory_bytes;
  if (ev.started) {
    u.setup = ms_between(t.t0, t.started);
    const auto end = ev.main_status && t.main_exit < t.ended ? t.main_exit : t.ended;
    u.wall = std::max(std::chrono::milliseconds(0), ms_between(t.started, end));
  } else {
    u.setup = ms_between(t.t0, t.ended);
  }
  return u;
}

std::string setup_breakdown(const run_times& t, std::string_view init_times) {
  std::string line =
      fmt::format("setup breakdown us: t0={} cgroup={} workspace={} spawned={} config_sent={}",
                  us(t.t0), us(t.cgroup), us(t.workspace), us(t.spawned), us(t.config_sent));
  for (auto [k, v] : init_protocol::parse_config(init_times)) line += fmt::format(" {}={}", k, v);
  line += fmt::format(" started={}", us(t.started));
  return line;
}

std::string teardown_breakdown(const run_times& t, bool main_exited,
                               run_times::clock::time_point delivered, bool removed) {
  const auto exited = main_exited ? t.main_exit : t.ended;
  return fmt::format(
      "teardown breakdown us: exited={} finish={} dead={} collected={} destroyed={} "
      "delivered={} cgroup_busy={}",
      us(exited), us(t.ended), us(t.dead), us(t.collected), us(t.destroyed), us(delivered),
      removed ? 0 : 1);
}

session_end classify_session_end(const session_evidence& e, run_result& r) {
  if (e.close_requested && !e.idle_timed_out && !e.timed_out && r.code == sandbox::code::ok) {
    return session_end::closed;
  }
  if (e.idle_timed_out) return session_end::idle_timeout;
  if (e.timed_out) {
    return e.lifetime_ends_at_ticket_expiry ? session_end::ticket_expired
                                            : session_end::max_lifetime;
  }
  if (r.code == sandbox::code::oom) return session_end::oom;
  if (r.code == sandbox::code::seccomp_violation) return session_end::seccomp_violation;
  if (r.code == sandbox::code::pids_limit) return session_end::failed;
  if (e.killed) {
    r.code = sandbox::code::internal;
    r.message = "session killed (its owner went away or the runtime shut down)";
    return session_end::killed;
  }
  if (r.code == sandbox::code::internal) return session_end::failed;
  return session_end::server_exited;
}

}  // namespace sandbox::detail
