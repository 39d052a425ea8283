// The deployment audit: does this host, at one isolation level, give the guarantees the
// library promises? (`sandboxctl audit`, docs/operations.md "Audit").
//
// An audit has two halves. `gather_audit_evidence` does things: it runs real snippets through
// a `runtime` at the chosen level (a Python probe that reports from inside the sandbox, a
// memory hog, a sleeper, a run under a ticket that does not grant it, a run whose ticket pins
// another image) and asks the pure core to decode malformed requests. `evaluate_audit` is
// pure: it turns that evidence into named checks. The probe's output is data from an
// untrusted program: it is parsed strictly, and every verdict about limits and codes comes
// from the host's own `run_result`s, never from what the probe claims about them. What the
// probe says about its own view (environment, seccomp, capabilities, sockets, routes, forks)
// is accepted only when the host's evidence of the same run agrees: the probe echoes a
// per-audit nonce, and at the levels whose backend records direct egress (process,
// container) every address the probe tried must be in the run's `egress_attempts` and the
// run must end `network_disabled`. An image that lies with a real interpreter can still fake
// those observations (docs/security.md, "What an audit proves"); the report names the image
// digest it ran so the operator knows which image the verdict is about. A third half,
// `evaluate_audit`'s configuration checks, reads the effective policy, workload profiles and
// registered tools on the host and needs no run at all.
//
//   auto rt = sandbox::runtime::create(options);
//   auto report = sandbox::evaluate_audit(sandbox::gather_audit_evidence(*rt, {}));
//   std::cout << sandbox::format_audit_table(report);
//   return report.passed() ? 0 : 1;
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/code.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/registry.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox {

/// One named check of an audit.
struct audit_check {
  /// Stable name, e.g. "environment", "seccomp", "pids_limit" (docs/operations.md lists them).
  std::string name;
  bool passed = false;
  /// What was seen: on failure the reason, naming the offending value ("host variable
  /// AWS_SECRET_ACCESS_KEY in the environment"); on success a short confirmation.
  std::string detail;
  bool operator==(const audit_check&) const = default;
};

/// Every check of one audit, in a fixed order.
struct audit_report {
  sandbox::isolation isolation = sandbox::isolation::process;  ///< the level audited
  std::vector<audit_check> checks;
  /// Manifest digest of the image the probe ran (`run_result::runtime.digest`; "" when it
  /// did not run): the verdict is about this image, not about whatever the store holds later.
  std::string image_digest;
  /// True when `image_digest` is the image store's current digest of the audited runtime.
  bool image_current = false;
  /// True when every check passed (and there is at least one).
  bool passed() const noexcept;
  /// Names of the checks that failed, in order.
  std::vector<std::string> failed() const;
  bool operator==(const audit_report&) const = default;
};

/// What the audit runs and with which limits.
struct audit_options {
  sandbox::isolation isolation = sandbox::isolation::process;  ///< the level to audit
  /// Runtime the snippets run with: must be a Python 3 runtime (the probe is Python).
  std::string runtime = "python3";
  /// Tenant the audit's runs and blobs belong to.
  std::string tenant = "audit";
  /// Memory limit of the memory check's run, bytes (it tries to allocate far more). Must be
  /// at least the policy's `min_memory_bytes`. Default 64 MiB.
  std::uint64_t memory_limit_bytes = 64ULL << 20;
  /// Timeout of the timeout check's run (it sleeps 60 s). Default 1000 ms.
  std::chrono::milliseconds timeout{1000};
  /// How far past its timeout the sleeper may end and still pass (the kill, teardown and a
  /// busy host). Default 20 s: this is a sanity bound, not a performance goal.
  std::chrono::milliseconds timeout_slack{20000};
  /// Unix socket paths and abstract names ("@name") of the host the probe tries to connect
  /// to, besides the well-known ones. Empty: the host's sockets are discovered (a bounded
  /// scan of /run, /var/run, /tmp and /proc/net/unix).
  std::vector<std::string> host_sockets;
  /// Host addresses (numeric) the probe tries to reach. Empty: the host's own non-loopback
  /// interface addresses (getifaddrs) and one public address (1.1.1.1).
  std::vector<std::string> host_addresses;
};

/// What the audit saw, before any verdict. Filled by `gather_audit_evidence`; tests build
/// it by hand to make each check fail.
struct audit_evidence {
  sandbox::isolation isolation = sandbox::isolation::process;
  /// The runtime's status of the backend at this level (nullopt: none was tried, e.g. not
  /// enabled in the configuration).
  std::optional<backend_status> backend;
  std::string runtime;                   ///< the runtime name the runs used
  std::string current_digest;            ///< the image store's current digest of it ("": none)
  std::uint32_t max_pids = 0;            ///< the policy's per-run pids limit
  std::uint64_t memory_limit_bytes = 0;  ///< the memory check's requested limit
  std::chrono::milliseconds timeout{0};  ///< the timeout check's requested timeout
  std::chrono::milliseconds timeout_slack{0};
  /// The probe's run (its ticket pins `current_digest`) and its full stdout (from the
  /// stdout blob, not the summary); the probe prints one JSON object.
  run_result probe;
  std::string probe_stdout;
  run_result memory;        ///< allocates far past `memory_limit_bytes`: expected `oom`
  run_result timeout_run;   ///< sleeps past `timeout`: expected `timeout`
  run_result denied;        ///< under a ticket without `code.execute`: `action_denied`
  run_result pin_mismatch;  ///< under a ticket pinning another digest: `digest_mismatch`
  /// What the protocol decoder said about a request with an unknown field / an unknown
  /// version: the rejection's message, or nullopt when it (wrongly) accepted it.
  std::optional<std::string> unknown_field_rejection;
  std::optional<std::string> bad_version_rejection;
  /// The per-audit random nonce embedded in the probe (32 hex digits); the probe's report
  /// must carry `audit_probe_proof(nonce)` as its `proof`. Empty: the probe check fails.
  std::string nonce;
  /// The addresses the probe tried to reach (`audit_options::host_addresses` or the
  /// discovered ones). At process and container, each must appear in `probe.egress_attempts`
  /// (or be accounted for by `probe.egress_attempts_dropped`).
  std::vector<std::string> probe_addresses;
  /// The runtime's effective policy (its workload profiles and ceilings included) and its
  /// registered tools, for the configuration checks.
  sandbox::policy policy;
  std::vector<tool_entry> tools;
  /// The host's hard RLIMIT_NOFILE, which no run's `max_open_files` may exceed (nullopt:
  /// unlimited).
  std::optional<std::uint64_t> host_max_open_files;
};

/// The longest `policy::exit_grace` the `exit_grace` check accepts: 10 s. Past it, a run's
/// leftover descendants may hold a slot for that long after its main process exited.
inline constexpr std::chrono::milliseconds audit_max_exit_grace{10000};

/**
 * Runs the audit's snippets through `rt` at `options.isolation` and collects the evidence.
 * Blocking: call it from a thread that does not run `rt`'s executor (a runtime made by
 * `runtime::create(options)` runs its own). Never throws for what the runs do; a backend
 * missing at the level leaves the run results as `runtime_unavailable` (the checks then
 * fail, naming the backend's refusal reason). Takes a few seconds (five runs, one of them
 * waits for its timeout).
 */
audit_evidence gather_audit_evidence(runtime& rt, const audit_options& options);

/**
 * The verdict, from evidence alone (pure). Checks, in order: `backend` (registered at the
 * level after its self-test), `probe` (the probe ran at exactly this level and printed one
 * well-formed report), `environment` (only the protocol's variables: PATH, HOME, LANG,
 * SANDBOX_INPUT_DIR, SANDBOX_OUTPUT_DIR), `seccomp` (mode 2), `no_new_privs` (1),
 * `capabilities` (inheritable, permitted, effective, bounding, ambient all zero),
 * `no_host_socket` (no socket file in view, no host unix or abstract socket connects),
 * `no_route_out` (only `lo`, no address reachable), `pids_limit` (fork refused within the
 * limit), `memory_limit` (`oom`), `timeout` (`timeout`, ended near the limit), `ticket`
 * (`action_denied` with nothing run), `protocol` (unknown field and version refused, the
 * field named), `image_pinned` (the run's digest is the store's current one; a ticket
 * pinning another gets `digest_mismatch`); then the host's configuration: `cpu_limit` (a
 * non-zero CPU quota for the policy and every workload profile's effective limits),
 * `exit_grace` (at most `audit_max_exit_grace`), `tmpfs_sizes` (tmp, home and shm each at
 * most `max_memory_bytes`, for the policy and every profile), `open_files` (1 ..
 * `host_max_open_files`, policy and every profile), `profiles` (every profile resolves; pids
 * and inodes non-zero; its memory and timeout defaults within the policy's range), `tools`
 * (every registered tool passes `check_tool_entry` under the policy).
 * The `probe` check passes only when the run ended well at exactly this level, the report
 * is well-formed, carries the nonce's proof, and (process, container) the host recorded an
 * egress attempt to every probed address and the run ended `network_disabled`. Sets
 * `image_digest` and `image_current`.
 */
audit_report evaluate_audit(const audit_evidence& evidence);

/// The Python source of the in-sandbox probe, with `host_sockets` and `host_addresses`
/// (as in `audit_options`; at most 64 of each) embedded as data; it forks at most
/// `max_forks` times. It prints one JSON object (keys: v, env_names, status, seccomp_mode,
/// no_new_privs, socket_files, unix_connected, interfaces, reachable, forks, fork_error,
/// proof); `proof` is computed in Python from `nonce` (see `audit_probe_proof`).
std::string audit_probe_source(const std::vector<std::string>& host_sockets,
                               const std::vector<std::string>& host_addresses,
                               std::uint32_t max_forks, const std::string& nonce = {});

/// The `proof` a probe built with `nonce` must report: the lowercase hex SHA-256 of
/// "agent-sandbox-audit:" + nonce + ":" + the decimal length of `nonce`. It binds a report to
/// one audit (a canned report fails); it does not prove the report true (docs/security.md).
std::string audit_probe_proof(const std::string& nonce);

/// A human table: one line per check (name, PASS/FAIL, detail), then a summary line.
std::string format_audit_table(const audit_report& report);

/// The report as one line of JSON: `{"v":1,"isolation":"process","passed":false,
/// "image_digest":"sha256:…","image_current":true,"failed":["seccomp"],
/// "checks":[{"name":"seccomp","passed":false,"detail":"..."}, ...]}`.
std::string encode_audit_report(const audit_report& report);

}  // namespace sandbox
