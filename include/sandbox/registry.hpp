// Registered tools and workload profiles: programs other than a language interpreter that run
// on bytes a model supplied (a regex engine, a Markdown renderer, a stdio MCP server, a
// headless browser), configured by the host and picked by name.
//
// The model can only pick a name: the image, the binary, its argv, the isolation level, the
// limits (a workload profile) and the egress policy all come from the host's registry
// (`runtime_options::tools`, or the configuration file's `tools` section). Bytes from the
// model reach the program only on its standard input or as input files, never as arguments
// and never through a shell.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sandbox/code.hpp"

namespace sandbox {

/**
 * How a runtime name becomes a command inside the sandbox: a language runtime the model's
 * source runs under (`run_request::runtime`). `python3` and `node` are every host's
 * (`default_runtimes`, sandbox/backend.hpp); a host defines more in `runtime_options::runtimes`
 * or the configuration document's `runtimes` section, each checked by `check_runtime_spec`.
 */
struct runtime_spec {
  std::string name;  ///< wire name, e.g. "python3": 1..64 of [a-z0-9._-] (is_valid_registry_name)
  /// Interpreter argv inside the image; exactly one element is "{source}", replaced by the
  /// path of the source file. Absolute path first, exec'd directly: never through a shell.
  std::vector<std::string> argv;
  std::string source_name = "main";  ///< file name the source is stored under, e.g. "main.py"
  /// Image in the store (its current digest); empty: the image named like the runtime. Lets
  /// several runtimes share one image with different interpreter flags.
  std::string image;
  bool operator==(const runtime_spec&) const = default;
};

/**
 * A named set of per-run limits, chosen by the host for a registry entry or a ticket, never
 * by a request (e.g. "snippet": the policy's defaults; "browser": more pids, memory and
 * `/dev/shm`). Every field that is set replaces the policy's per-run value
 * (sandbox/policy.hpp) and is then clamped to the policy's ceiling for it; unset fields keep
 * the policy's value.
 */
struct workload_profile {
  std::optional<std::uint32_t> max_pids;  ///< processes + threads of one run
  /// CPU bandwidth; 1000 = one CPU; 0 = no limit, above any non-zero ceiling (so clamped
  /// to it).
  std::optional<std::uint32_t> cpu_quota_millicores;
  std::optional<std::uint32_t> max_open_files;  ///< RLIMIT_NOFILE inside
  std::optional<std::uint64_t> tmp_bytes;       ///< /tmp tmpfs size
  std::optional<std::uint64_t> home_bytes;      ///< $HOME tmpfs size
  std::optional<std::uint64_t> shm_bytes;       ///< /dev/shm tmpfs size
  std::optional<std::uint32_t> tmpfs_inodes;    ///< inode cap of each tmpfs
  /// Memory limit of a run under this profile: the default when the request leaves its own
  /// unset (and of sessions), and the most a request gets (one asking more is clamped to it);
  /// then clamped to the ticket's and policy's ceilings like a request's.
  std::optional<std::uint64_t> memory_limit_bytes;
  /// Timeout of a run under this profile: the default when the request sets none, and the
  /// most a request gets; then clamped like a request's.
  std::optional<std::chrono::milliseconds> timeout;
  bool operator==(const workload_profile&) const = default;
};

/// How the model's bytes reach a registered tool's program.
enum class tool_input : std::uint8_t {
  stdin_bytes,  ///< the request's `stdin` is the program's standard input (EOF after it)
  files_only,   ///< only input files (`files_in`); standard input is empty
};

/**
 * One registry entry: a program in a runtime image, run with a fixed argv. Used for one-shot
 * registered tools (`run_request.tool`) and for long-lived sessions (sandbox/session.hpp).
 */
struct tool_entry {
  /// The name a request picks: 1..64 characters of `[a-z0-9._-]`, starting with a letter or
  /// digit.
  std::string name;
  /// Image in the image store (a runtime image name, e.g. "python3", "tools", "mcp").
  std::string image;
  /// Optional pin: the manifest digest the image must have (`sha256:…`); a host whose
  /// current image differs refuses the entry's runs with `digest_mismatch`.
  std::optional<std::string> image_digest;
  /// Absolute path of the program inside the image (argv[0]); no `..` components.
  std::string binary;
  /// Arguments after argv[0], fixed by the host. Never contain model bytes.
  std::vector<std::string> args;
  tool_input input = tool_input::stdin_bytes;
  /// The least isolation level its runs get (a ticket may demand more).
  sandbox::isolation isolation = sandbox::isolation::process;
  /// Workload profile name (`policy::profiles`); empty: the policy's per-run values.
  std::string profile;
  /// Host names the program may reach through the egress proxy (sandbox/egress.hpp
  /// patterns): the entry's own network policy, not the host's. Empty: no network.
  std::vector<std::string> egress;
  /// Extra environment variables, fixed by the host (same rules as a request's `env`).
  std::vector<std::pair<std::string, std::string>> env;
  bool operator==(const tool_entry&) const = default;
};

}  // namespace sandbox
