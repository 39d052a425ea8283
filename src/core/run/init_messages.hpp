// The messages the run machine sends sandbox-init (private to src/): the `config` and `go`
// payloads of wire/init_protocol.hpp, as pure functions of the run's job and what the run
// machine decided for it (uid, the inputs' directory name, whether the host already serves
// the egress proxy). Nothing here starts a process or touches a descriptor, so every entry is
// unit-tested (tests/unit/core/run/init_messages_test.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/backend.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {

/// Sizes and limits inside one run's sandbox, derived from its request and the policy
/// (bytes, counts). Every tmpfs size has a 64 KiB floor: tmpfs reads size=0 as unlimited.
struct sandbox_size_set {
  std::uint64_t tmp_bytes = 0, home_bytes = 0, shm_bytes = 0, out_bytes = 0;
  std::uint64_t tmpfs_inodes = 0, out_inodes = 0, nofile = 0, fsize_bytes = 0;
};

/// The sizes of `job`'s sandbox: /tmp, $HOME and /dev/shm at the policy's sizes capped at an
/// eighth of the memory limit each, the output tmpfs at files_out.max_bytes + 1 MiB capped
/// at a quarter, inodes from the policy and files_out.max_files, RLIMIT_NOFILE from the
/// policy, RLIMIT_FSIZE 1 GiB.
sandbox_size_set sandbox_sizes(const run_job& job);

/// True when `job` runs with the network (admission granted it and named the domains); never
/// for the start-up self-test.
bool is_network_granted(const run_job& job, bool selftest) noexcept;

/// What the `config` payload is made of besides the job.
struct config_params {
  bool selftest = false;          ///< the start-up self-test's probe run
  std::string_view input_name{};  ///< "in-<16 hex>": the inputs' directory under /sandbox
  std::uint32_t uid = 0;          ///< the program's uid and gid
  bool userns = false;            ///< the run has a user namespace (unprivileged host)
  /// The launcher's own entries (launched::config: host or guest paths, `launch=oci`, …),
  /// appended after the run machine's.
  std::string_view launcher_entries{};
};

/// The `config` payload for `job`: mode, names, uid/gid, userns, the sizes of
/// `sandbox_sizes(job)`, then the launcher's entries.
std::string config_payload(const run_job& job, const config_params& p);

/// The environment every run's program starts with ("NAME=value", in order), before the
/// network's and the request's own variables; `input_name` as in `config_params`.
std::vector<std::string> base_env(std::string_view input_name);

/// What the `go` payload is made of besides the job.
struct go_params {
  bool selftest = false;          ///< the probe's argv instead of the runtime's
  bool session = false;           ///< a session: the runtime's argv as is (no `{source}`)
  std::string_view input_name{};  ///< as in config_params
  std::uint32_t uid = 0;          ///< told to the probe, which checks it from the inside
  std::string_view probe_path{};  ///< argv[0] of the probe (launcher_traits::probe_path)
  bool probe_in_gvisor = false;   ///< the probe reads PID 1's environ as gVisor shows it
  bool network = false;           ///< is_network_granted
  /// The host serves the run's egress proxy already (the launcher made the network
  /// namespace); else sandbox-init is asked to make the listener (`egress_proxy`).
  bool proxy_served = false;
  std::string_view node_proxy_preload_path{};  ///< NODE_OPTIONS' preload; empty: none
  /// Network runs of a launcher whose runs have no file of the preload: its content, which
  /// sandbox-init writes to `init_protocol::node_proxy_path` (= `node_proxy_preload_path`).
  std::string_view node_proxy_preload{};
  /// A run with secrets: its CA certificate (PEM), which sandbox-init writes to
  /// `init_protocol::run_ca_path`; the trust-store variables then name that file.
  std::string_view run_ca_pem{};
};

/**
 * The `go` payload for `job`: the program's argv (the probe's; a session's as is; else the
 * runtime's with "{source}" replaced by the source's path, and `stdin=` for a registered
 * tool's standard input), the fixed environment of DESIGN.md (PATH, HOME, LANG,
 * SANDBOX_INPUT_DIR, SANDBOX_OUTPUT_DIR), for a network run the proxy variables (and
 * NODE_OPTIONS with the preload when there is one; then the request's own NODE_OPTIONS is
 * dropped), and the request's variables.
 */
std::string go_payload(const run_job& job, const go_params& p);

/// Header plus payload of one message, as one packet (`a` as the header's; `b` = 0).
std::string init_packet(init_protocol::msg type, std::uint32_t a, std::string_view payload);

/// What each sandbox-init setup step needs from the host, for self-test reasons and host
/// logs, e.g. "mounting tmpfs".
const char* describe_step(init_protocol::step s) noexcept;

}  // namespace sandbox::detail
