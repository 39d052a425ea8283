// Host policy: the ceilings and defaults that apply to every request, whatever its ticket
// says. A request may ask for less; a ticket may lower a ceiling further; nothing raises one.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

namespace sandbox {

/// Host-wide limits. Defaults are the protocol's (docs/protocol.md).
struct policy {
  // --- admission ------------------------------------------------------------------------
  std::uint64_t max_source_bytes = 32 * 1024;       ///< longer source → source_too_large
  std::chrono::milliseconds max_timeout{8000};      ///< timeouts above are clamped
  std::uint64_t max_memory_bytes = 1ULL << 30;      ///< memory limits above are clamped
  std::uint64_t min_memory_bytes = 32ULL << 20;     ///< below → invalid_request
  std::uint32_t max_input_files = 16;               ///< more `files_in` → invalid_request
  /// Total bytes of a request's input files (each name counts); more → invalid_request.
  /// Inputs are staged on the host's disk for the run, so this bounds what one run costs it.
  std::uint64_t max_input_bytes = 64ULL << 20;
  std::uint32_t max_output_files = 256;             ///< `files_out.max_files` above → clamped
  std::uint64_t max_output_bytes = 64ULL << 20;     ///< `files_out.max_bytes` above → clamped
  /// Environment variable names a request may set. Names the sandbox sets itself (`PATH`,
  /// `HOME`, `LANG`, `SANDBOX_*`) and loader variables (`LD_*`) are refused even if listed.
  std::set<std::string> allowed_env;
  std::uint32_t max_env_vars = 32;                  ///< more `env` entries → invalid_request
  std::uint32_t max_env_value_bytes = 4096;         ///< longer value → invalid_request

  // --- what every run gets ----------------------------------------------------------------
  std::uint64_t stream_capture_bytes = 1ULL << 20;  ///< stdout / stderr each kept up to this
  std::uint32_t summary_bytes = 4096;               ///< `stream_capture.summary` at most
  std::uint32_t max_pids = 64;                      ///< processes + threads of one run
  std::uint32_t cpu_quota_millicores = 1000;        ///< CPU bandwidth; 1000 = one CPU
  std::uint32_t max_open_files = 256;               ///< RLIMIT_NOFILE inside
  /// tmpfs sizes for /tmp, $HOME and /dev/shm. Each is additionally capped at an eighth of
  /// the run's memory limit (the output directory at a quarter), so filling them all gives
  /// ENOSPC rather than an OOM kill.
  std::uint64_t tmp_bytes = 64ULL << 20;
  std::uint64_t home_bytes = 16ULL << 20;
  std::uint64_t shm_bytes = 16ULL << 20;
  std::uint32_t tmpfs_inodes = 4096;                ///< inode cap of each tmpfs
  /// After the main process exits, how long its descendants may keep stdout/stderr open
  /// before everything is killed (DESIGN.md, life of a run, step 6).
  std::chrono::milliseconds exit_grace{100};
  /// Budget for preparing the sandbox (before the user code starts); over it → internal.
  std::chrono::milliseconds setup_budget{10000};
  /// Budget for killing and confirming the run's cgroup empty; over it → internal.
  std::chrono::milliseconds teardown_budget{5000};

  bool operator==(const policy&) const = default;
};

}  // namespace sandbox
