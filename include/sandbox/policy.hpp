// Host policy: the ceilings and defaults that apply to every request, whatever its ticket
// says. A request may ask for less; a ticket may lower a ceiling further; nothing raises one.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/registry.hpp"

namespace sandbox {

/// Host-wide limits. Defaults are the protocol's (docs/protocol.md).
struct policy {
  // --- admission ------------------------------------------------------------------------
  std::uint64_t max_source_bytes = 32 * 1024;    ///< longer source → source_too_large
  std::chrono::milliseconds max_timeout{8000};   ///< timeouts above are clamped
  std::uint64_t max_memory_bytes = 1ULL << 30;   ///< memory limits above are clamped
  std::uint64_t min_memory_bytes = 32ULL << 20;  ///< below → invalid_request
  std::uint32_t max_input_files = 16;            ///< more `files_in` → invalid_request
  /// Total bytes of a request's input files (each name counts); more → invalid_request.
  /// Inputs are staged on the host's disk for the run, so this bounds what one run costs it.
  std::uint64_t max_input_bytes = 64ULL << 20;
  std::uint32_t max_output_files = 256;          ///< `files_out.max_files` above → clamped
  std::uint64_t max_output_bytes = 64ULL << 20;  ///< `files_out.max_bytes` above → clamped
  /// Environment variable names a request may set. Names the sandbox sets itself (`PATH`,
  /// `HOME`, `LANG`, `SANDBOX_*`) and loader variables (`LD_*`) are refused even if listed.
  std::set<std::string> allowed_env;
  std::uint32_t max_env_vars = 32;           ///< more `env` entries → invalid_request
  std::uint32_t max_env_value_bytes = 4096;  ///< longer value → invalid_request
  /// Bytes of a registered tool run's standard input (`run_request::std_in`, or the blob
  /// named by `stdin_blob`); more → invalid_request. Default 1 MiB.
  std::uint64_t max_stdin_bytes = 1ULL << 20;

  // --- what every run gets ----------------------------------------------------------------
  std::uint64_t stream_capture_bytes = 1ULL << 20;  ///< stdout / stderr each kept up to this
  std::uint32_t summary_bytes = 4096;               ///< `stream_capture.summary` at most
  std::uint32_t max_pids = 64;                      ///< processes + threads of one run
  /// CPU bandwidth; 1000 = one CPU; 0 = no CPU limit (which ranks above every number when
  /// a profile's value is held against `ceilings.cpu_quota_millicores`).
  std::uint32_t cpu_quota_millicores = 1000;
  std::uint32_t max_open_files = 256;  ///< RLIMIT_NOFILE inside
  /// tmpfs sizes for /tmp, $HOME and /dev/shm. Each is additionally capped at an eighth of
  /// the run's memory limit (the output directory at a quarter), so filling them all gives
  /// ENOSPC rather than an OOM kill.
  std::uint64_t tmp_bytes = 64ULL << 20;
  std::uint64_t home_bytes = 16ULL << 20;
  std::uint64_t shm_bytes = 16ULL << 20;
  std::uint32_t tmpfs_inodes = 4096;  ///< inode cap of each tmpfs
  /// After the main process exits, how long its descendants may keep stdout/stderr open
  /// before everything is killed (DESIGN.md, life of a run, step 6). A main process that
  /// exited before the deadline ends the run as it exited even when the deadline passes
  /// during this grace. The configuration file accepts at most 10 s.
  std::chrono::milliseconds exit_grace{100};
  /// Budget for preparing the sandbox (before the user code starts); over it → internal.
  std::chrono::milliseconds setup_budget{10000};
  /// Budget for killing and confirming the run's cgroup empty; over it → internal.
  std::chrono::milliseconds teardown_budget{5000};

  // --- workload profiles (sandbox/registry.hpp) --------------------------------------------
  /// Named limit sets a registry entry or a ticket may choose (never a request). The
  /// per-run values above stay the defaults of a run without a profile.
  std::map<std::string, workload_profile> profiles;
  /// The most a profile may raise each per-run value to; a profile value above its ceiling is
  /// clamped to it (`effective_limits` says which were, and the runtime logs it once, at
  /// creation). The defaults allow a browser-sized run; a ceiling below the per-run default
  /// bounds only profiles, never the default itself.
  struct profile_ceilings {
    std::uint32_t max_pids = 1024;
    std::uint32_t cpu_quota_millicores = 4000;  ///< 0: no ceiling (a profile may ask 0 = no limit)
    std::uint32_t max_open_files = 4096;
    std::uint64_t tmp_bytes = 1ULL << 30;
    std::uint64_t home_bytes = 256ULL << 20;
    std::uint64_t shm_bytes = 1ULL << 30;
    std::uint32_t tmpfs_inodes = 65536;
    bool operator==(const profile_ceilings&) const = default;
  } ceilings;

  bool operator==(const policy&) const = default;
};

/// A policy's per-run values under a workload profile: what a run's cgroup, rlimits and
/// tmpfs mounts get (`limits`), and which profile fields were above their ceiling and
/// lowered to it (`clamped`, JSON field names, e.g. "max_pids").
struct effective_limits_result {
  sandbox::policy limits;
  std::vector<std::string> clamped;
};

/**
 * Resolves `base` + the profile named `profile` into the per-run limits every backend applies
 * (process and OCI alike: pids.max, cpu, RLIMIT_NOFILE, /tmp, $HOME and /dev/shm sizes and
 * inodes). Each field the profile sets replaces the policy's value, clamped to
 * `base.ceilings`; unset fields keep the policy's. An empty `profile` gives `base` unchanged.
 * `std::nullopt` when `profile` is not empty and not in `base.profiles` (admission refuses
 * such runs first). Pure. The profile's `memory_limit_bytes` and `timeout` are request
 * defaults, applied by admission (sandbox/admission.hpp), not here.
 */
std::optional<effective_limits_result> effective_limits(const policy& base,
                                                        const std::string& profile);

/// True for a profile or tool name: 1..64 characters of `[a-z0-9._-]`, starting with a
/// letter or digit.
bool is_valid_registry_name(std::string_view name) noexcept;

/**
 * The first problem with registry entry `e` under `p`, as "<field>: <reason>" (JSON field
 * names, e.g. "binary: must be an absolute path without '..'"), or `std::nullopt`: name
 * syntax, image name, absolute `binary` without `.`/`..` components or NUL, no NUL in
 * `args`, `profile` empty or in `p.profiles`, `env` names allowed like a request's
 * (`policy::allowed_env`, not reserved) with values within `max_env_value_bytes`, and
 * `egress` entries that are egress patterns (`canonical_egress_pattern`), at most
 * `max_egress_patterns` after canonicalization. Whether the image is installed is checked by
 * the runtime.
 */
std::optional<std::string> check_tool_entry(const tool_entry& e, const policy& p);

/**
 * The first problem with runtime definition `r`, as "<field>: <reason>", or `std::nullopt`:
 * `name` and `image` (empty: the image named like the runtime) are registry names; `argv`
 * holds 1..256 arguments without NUL, each at most 4096 bytes, the first an absolute path
 * without empty, `.` or `..` components (exec'd directly inside the image, never through a
 * shell), exactly one other the placeholder `{source}`; `source_name` is 1..255 bytes of
 * UTF-8 without `/` or control characters, not `.`, `..`, `out` or `in-*` (the run's own
 * entries of /sandbox). Whether the image is installed and holds `argv[0]` is checked by the
 * runtime.
 */
std::optional<std::string> check_runtime_spec(const runtime_spec& r);

}  // namespace sandbox
