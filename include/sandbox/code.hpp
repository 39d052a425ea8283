// Stable outcome codes and isolation levels.
//
// `code` is how a sandboxed run ended, as carried on the wire in `run_result.code`
// (DESIGN.md, "Codes"). The wire strings never change; new codes may be added.
// `isolation` is the ordered set of isolation levels a ticket may demand.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sandbox {

/// How a run ended. Admission codes are decided before anything starts; the run codes
/// (`timeout`, `oom`, `pids_limit`, `seccomp_violation`, `network_disabled`, `ok`) come only
/// from the sandbox's own evidence, in that order of precedence (DESIGN.md, "Codes come from
/// our evidence"). New codes are appended (the numeric values are not wire values).
enum class code : std::uint8_t {
  ok,                   ///< ran to completion; see `exit_code` / `signal`
  invalid_request,      ///< malformed or out-of-range request, unknown field/runtime/version
  source_too_large,     ///< source over the policy cap (rejected, never truncated)
  action_denied,        ///< ticket lacks `code.execute` or `code.network` (no approver), or is
                        ///< expired, tampered, or wrongly derived
  approval_required,    ///< network needs a human decision: `run_result::approval` says what
  approval_denied,      ///< the approver said no (sandbox/approval.hpp)
  network_disabled,     ///< the code attempted egress in a run without network
  timeout,              ///< our wall-clock timer fired; everything killed and confirmed dead
  oom,                  ///< the run cgroup's OOM killer fired and killed the run
  seccomp_violation,    ///< our seccomp filter recorded a forbidden call and the run was killed
  output_limit,         ///< reserved: policies that fail instead of truncating outputs
  blob_not_found,       ///< an input blob is absent (or belongs to another tenant)
  queue_timeout,        ///< waited in the queue past its deadline (scheduler)
  capacity,             ///< the host's queue is full (scheduler)
  runtime_unavailable,  ///< no backend at the ticket's level or stronger, or no image
  digest_mismatch,      ///< the pinned runtime digest is not the installed one
  internal,             ///< anything else; details only in host logs
  /// The run's pids limit was reached and the sandbox itself ended with it: gVisor's kernel
  /// needs host tasks for the program's processes and dies when it cannot start one (the
  /// run cgroup's pids.events counted the refusals). Never at the levels whose program gets
  /// EAGAIN from the limit and goes on. After `timeout` and `oom` in precedence.
  pids_limit,
  /// An interpreter cell (sandbox/interpreter.hpp) raised an exception: its traceback summary
  /// is in `cell_result::error`; the interpreter lives on. Never a run's code.
  error,
};

inline constexpr std::array<std::string_view, 19> code_names{
    "ok",
    "invalid_request",
    "source_too_large",
    "action_denied",
    "approval_required",
    "approval_denied",
    "network_disabled",
    "timeout",
    "oom",
    "seccomp_violation",
    "output_limit",
    "blob_not_found",
    "queue_timeout",
    "capacity",
    "runtime_unavailable",
    "digest_mismatch",
    "internal",
    "pids_limit",
    "error",
};

/// Wire string of `c`, e.g. `"network_disabled"`.
constexpr std::string_view to_string(code c) noexcept {
  return code_names[static_cast<std::size_t>(c)];
}

/// Parses a wire string; `std::nullopt` for an unknown one.
constexpr std::optional<code> code_from_string(std::string_view s) noexcept {
  for (std::size_t i = 0; i < code_names.size(); ++i) {
    if (code_names[i] == s) return static_cast<code>(i);
  }
  return std::nullopt;
}

/// Isolation levels, weakest first. A ticket names the minimum; the runtime may run
/// stronger, never weaker (DESIGN.md, "Isolation levels").
enum class isolation : std::uint8_t {
  process,    ///< namespaces + cgroup + seccomp (src/backends/process)
  container,  ///< short-lived OCI container via crun/runc
  gvisor,     ///< OCI via runsc: a user-space kernel
  microvm,    ///< one VM per run
};

inline constexpr std::array<std::string_view, 4> isolation_names{"process", "container", "gvisor",
                                                                 "microvm"};

/// Wire string of `level`, e.g. `"process"`.
constexpr std::string_view to_string(isolation level) noexcept {
  return isolation_names[static_cast<std::size_t>(level)];
}

/// Parses a wire string; `std::nullopt` for an unknown one.
constexpr std::optional<isolation> isolation_from_string(std::string_view s) noexcept {
  for (std::size_t i = 0; i < isolation_names.size(); ++i) {
    if (isolation_names[i] == s) return static_cast<isolation>(i);
  }
  return std::nullopt;
}

/// True when `have` is at least as strong as `need`.
constexpr bool is_at_least(isolation have, isolation need) noexcept {
  return static_cast<std::uint8_t>(have) >= static_cast<std::uint8_t>(need);
}

}  // namespace sandbox
