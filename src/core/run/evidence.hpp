// What the run machine saw of one run, and the code it makes of it (private to src/).
//
// A run collects `run_evidence` as things happen — its own timer fired, the run cgroup's OOM
// counter rose, the seccomp filter reported a forbidden call, sandbox-init reported the main
// process's wait status, an egress attempt was recorded — and, once every process is dead,
// `classify` turns it into the result's code, message, exit code or signal, in DESIGN.md's
// order: the run machine's own failures first (blob_not_found, teardown failed, internal,
// cancelled, idle timeout, supervisor lost), then timeout → oom → seccomp_violation →
// network_disabled → ok. A lost supervisor is explained by the evidence where it can be: our
// timer (timeout), the OOM killer (oom), the run cgroup's pids limit (pids_limit: gVisor's
// kernel dies when it cannot start a host task); only an unexplained one is internal.
// Nothing the program prints or its exit status alone can produce timeout, oom,
// pids_limit or seccomp_violation: those need the evidence. Pure, and table-tested
// (tests/unit/core/run/classify_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/run/cgroup.hpp"
#include "sandbox/code.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/session.hpp"

namespace sandbox::detail {

/**
 * The egress attempts of one run, as the result lists them: each distinct attempt once, at
 * most `max_records`; repeats and attempts past the cap are only counted (`dropped`). An
 * attempt seen outside the proxy (seccomp notification, the DNS sink) in a network run gets
 * the reason "use the proxy": it is refused even there. Not thread-safe (the run's strand).
 */
class egress_log {
 public:
  /// Most attempts listed in a result.
  static constexpr std::size_t max_records = 64;

  /// Records `a`; `network_granted`: the run has the network (is_network_granted).
  void record(egress_attempt a, bool network_granted);
  /// The distinct attempts, in the order first seen.
  const std::vector<egress_attempt>& attempts() const noexcept { return attempts_; }
  /// Attempts not listed: repeats, and those past `max_records`.
  std::uint32_t dropped() const noexcept { return dropped_; }

 private:
  std::vector<egress_attempt> attempts_;
  std::uint32_t dropped_ = 0;
};

/**
 * The egress attempt of a DNS query sandbox-init reported (stream mode: it serves the run's
 * DNS sink itself, `dns`). As untrusted as anything from inside: the name (at most 255
 * bytes) was escaped there; anything but letters, digits, '.', '-', '_' and backslash is recorded
 * as "(unreadable name)", never copied raw.
 */
egress_attempt reported_dns_query(std::string_view payload);

/// What one run's own evidence says. Filled on the run's strand; read by `classify`.
struct run_evidence {
  bool started = false;              ///< sandbox-init reported `started`: the program ran
  std::optional<int> main_status{};  ///< the main process's wait status (sandbox-init `exited`)
  bool timed_out = false;            ///< our deadline fired before the main process exited
  bool idle_timed_out = false;       ///< a session's idle timer fired (no byte either way)
  std::uint64_t oom_kills = 0;       ///< the run cgroup's OOM-kill counter (largest seen)
  bool oom_triggered = false;        ///< an OOM event ended the run (a kill was counted)
  /// Forks refused at the run cgroup's pids.max, read when the run began to end (before our
  /// kill, which may lower pids.max itself).
  std::uint64_t pids_limit_hits = 0;
  std::optional<std::string> violation{};  ///< the first forbidden call the filter reported
  egress_log egress{};                     ///< attempts recorded (seccomp, DNS sink, proxy)
  bool network_granted = false;            ///< is_network_granted: attempts are then not a refusal
  bool cancelled = false;                  ///< the caller cancelled (or its session went away)
  bool supervisor_lost = false;            ///< sandbox-init went away before the program ended
  bool teardown_failed = false;            ///< processes survived the kill past the teardown budget
  /// The run machine's own failure (sanitized message for the result), e.g. "sandbox setup
  /// failed".
  std::optional<std::string> internal_error{};
  std::optional<std::size_t> blob_missing{};  ///< index in files_in of a vanished input blob
};

/// The request's bounds the messages name.
struct run_bounds {
  std::chrono::milliseconds timeout{0};       ///< the run's (clamped) timeout
  std::chrono::milliseconds idle_timeout{0};  ///< a session's idle timeout
  std::uint64_t memory_limit_bytes = 0;       ///< the run's memory limit
};

/// How a run ended, from its evidence.
struct run_verdict {
  sandbox::code code = sandbox::code::ok;
  std::string message{};                   ///< empty for `ok`
  std::optional<int> exit_code{};          ///< the main process exited with this status
  std::optional<int> signal{};             ///< it was killed by this signal (SIGKILL: by us)
  std::optional<std::string> violation{};  ///< for `seccomp_violation`: the call's name
  /// The code is the "supervisor lost" `internal`: the sandbox itself failed (the run
  /// machine logs it as an error). Not for `pids_limit`: the program's processes did that.
  bool supervisor_lost = false;
};

/**
 * The verdict of `ev`, in this order: blob_not_found, teardown failed (internal), the run
 * machine's own failure (internal), cancelled (internal), a session's idle timeout
 * (timeout), supervisor lost — pids_limit when the run cgroup refused forks at its pids
 * limit, else internal; neither when the deadline or an OOM kill explains it — then
 * timeout → oom (a kill was counted and it ended the run or killed the main process)
 * → seccomp_violation → network_disabled (attempts in a run without the network) → ok.
 * Exit code and signal come from the main process's wait status; a run that started and
 * never reported one was killed by us (SIGKILL).
 */
run_verdict classify(const run_evidence& ev, const run_bounds& b);

/// When the steps of one run happened (steady clock), for its usage and the debug log's
/// setup and teardown breakdowns.
struct run_times {
  using clock = std::chrono::steady_clock;
  clock::time_point t0{};  ///< setup began (a pooled run's: its hand-out)
  clock::time_point cgroup{}, workspace{}, spawned{}, config_sent{};  ///< setup steps done
  clock::time_point started{};                         ///< sandbox-init reported `started`
  clock::time_point main_exit{};                       ///< sandbox-init reported `exited`
  clock::time_point ended{};                           ///< the run machine began ending the run
  clock::time_point dead{}, collected{}, destroyed{};  ///< teardown steps done
};

/// Setup (t0 to start, or to the end when the program never started), wall time (start to
/// the main process's exit, or to the end when it was killed first), CPU and peak memory.
run_usage measure_usage(const run_evidence& ev, const run_times& t, const cgroup_stats& s);

/// The debug log's line on where the setup time went: the host's steps and sandbox-init's
/// own phase timestamps (`init_times`, its `started` payload; the same monotonic clock), µs.
std::string setup_breakdown(const run_times& t, std::string_view init_times);

/// The debug log's line on where the time between the program's exit and the result went
/// (µs); `delivered`: when the result was handed over; `removed`: false while the run cgroup
/// was still busy.
std::string teardown_breakdown(const run_times& t, bool main_exited,
                               run_times::clock::time_point delivered, bool removed);

/// What decides how a session ended, besides its run's result.
struct session_evidence {
  bool close_requested = false;                 ///< the host called async_close
  bool idle_timed_out = false;                  ///< the idle timer ended it
  bool timed_out = false;                       ///< its lifetime (the run's deadline) ended it
  bool lifetime_ends_at_ticket_expiry = false;  ///< session_job's flag
  bool killed = false;  ///< cancelled (its object destroyed) or runtime shutdown
};

/**
 * How a session ended, from its run's verdict in `r` and `e`: closed (on request, code ok),
 * idle_timeout, max_lifetime or ticket_expired, oom, seccomp_violation, killed, failed
 * (internal or pids_limit: the sandbox ended under the server), else server_exited. A killed
 * session's `r` becomes `internal` with a message saying so.
 */
session_end classify_session_end(const session_evidence& e, run_result& r);

}  // namespace sandbox::detail
