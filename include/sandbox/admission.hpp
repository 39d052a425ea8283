// Admission: the pure decision whether a request may start, and with which effective limits.
// Nothing is started, read or written here; the function is deterministic and cheap, so it is
// unit-tested exhaustively and fuzzed.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sandbox/code.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/registry.hpp"
#include "sandbox/secrets.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox {

/// What this host can run, as admission sees it.
struct host_catalog {
  /// Isolation levels with a registered (self-tested) backend.
  std::vector<sandbox::isolation> levels;
  /// Configured runtime names → manifest digest of the installed image (`std::nullopt` when
  /// the runtime is configured but its image is absent).
  std::map<std::string, std::optional<std::string>> runtimes;
  /// One registered tool as admission sees it.
  struct tool {
    tool_entry entry;  ///< as registered (validated by `check_tool_entry`)
    /// Manifest digest of the entry's image, installed now; `std::nullopt` when absent.
    std::optional<std::string> digest;
    /// Why the entry cannot run although its image is installed (its `binary` is missing in
    /// the image, or not a regular executable file: checked at runtime creation, resolved
    /// within the image's root), e.g. "binary: '/bin/nope' is missing in the image
    /// 'python3'"; empty when it can. Its runs and sessions answer `runtime_unavailable`
    /// with this message.
    std::string unusable;
    bool operator==(const tool&) const = default;
  };
  /// Registered tools by name (`runtime_options::tools`).
  std::map<std::string, tool> tools;
  /// The host's secrets by name (`runtime_options::secrets`, checked, their values loaded):
  /// where each may go, never its value.
  std::map<std::string, secret_definition> secrets;
  bool operator==(const host_catalog&) const = default;
};

/// A request that passed admission, with everything normalized.
struct admitted {
  run_request request;           ///< timeout and memory limit already clamped; `v` is 1
  std::string tenant;            ///< from the ticket
  std::string ticket_id;         ///< from the ticket
  sandbox::isolation isolation;  ///< the weakest registered level ≥ the ticket's minimum
  runtime_info runtime;          ///< name and installed digest
  bool timeout_clamped = false;
  bool memory_clamped = false;
  bool files_out_clamped = false;  ///< `files_out` limits were lowered to the policy's
  /// The workload profile the run gets (`effective_limits`): a tool run's entry's, else the
  /// ticket's; empty: the policy's per-run values.
  std::string profile;
  /// The ticket's L7 rules (`ticket::egress_rules`) that apply to the run's `egress`: those
  /// whose host shares a name with one of its domains, in the ticket's order. The run's
  /// egress proxy enforces them. Empty for a run without the network.
  std::vector<egress_rule> egress_rules;
  bool operator==(const admitted&) const = default;
};

/**
 * Decides whether `request` may run under `ticket` on this host at time `now`. Returns
 * either the normalized `admitted` request or a `rejection`, checking in this order:
 *
 * A tool run (`request.tool` set) is checked the same way, with these differences: step 1
 * refuses `runtime`, `source`, `network`, `egress` beside `tool` (naming the field), and
 * `std_in` with `stdin_blob`, `std_in` over `policy.max_stdin_bytes`, a malformed
 * `stdin_blob`; `std_in`/`stdin_blob` in a run that is not a tool run; step 3 needs
 * `tool.run` for the name (`ticket::allows_tool`) instead of `code.execute`; step 4 needs
 * the name in `catalog.tools` (else `invalid_request`), and no stdin for an entry whose
 * `input` is `files_only`; step 5 uses the level
 * max(entry's, ticket's) and the entry's image (absent: `runtime_unavailable`); step 6
 * compares the entry's `image_digest`, the ticket's and the request's pins with the
 * entry's installed image. The admitted run's `runtime` is the tool's name and image digest,
 * its `profile` the entry's (else the ticket's), its `env` the entry's. A profile (entry or ticket)
 * not in `policy.profiles` is `invalid_request`; the profile's `timeout` and `memory_limit_bytes`
 * replace the request's when the request left the protocol defaults (2000 ms, 256 MiB), and bound a
 * request that asked more (clamped, `timeout_clamped`/`memory_clamped`), before the ticket's and
 * policy's clamping. A tool run's request may not set `env` (`invalid_request`: the environment is
 * the entry's).
 *
 * 1. `invalid_request` — version ≠ 1, empty runtime, timeout ≤ 0; `egress` non-empty
 *    without `network`, or empty with it, an entry that is not an egress pattern
 *    (`egress[i]: …`), more than `max_egress_patterns` distinct ones; memory below the
 *    policy minimum, bad `files_in` (count, names, duplicates, blob id syntax), bad
 *    `files_out`, `env` names not allowed, bad `runtime_digest` syntax; `secrets` without
 *    `network` or in a tool run, a name that is not a secret name, a duplicate, more than
 *    `max_secrets`; the message names the field.
 * 2. `source_too_large` — `source` longer than `policy.max_source_bytes` (never truncated).
 * 3. `action_denied` — the ticket is expired at `now` ("ticket expired"); no
 *    `code.execute`; `network` without `code.network`; a canonical egress pattern the
 *    ticket's `egress` does not cover (`egress_subset`; the message names the first one); a
 *    ticket derived from an approval (`ticket::approval()`) and a request that is not the
 *    approved run (runtime, source or inputs differ); the ticket's memory ceiling is below
 *    the policy's minimum; a secret the ticket does not grant ("secrets: the ticket does not
 *    grant the secret 'x'") or this host does not define (`catalog.secrets`: "secrets: no
 *    secret 'x' on this host"), checked also pending approval (an approval never adds a
 *    secret); under an approved ticket, a secret the approval does not show.
 * 4. `invalid_request` — runtime name not configured on this host.
 * 5. `runtime_unavailable` — no backend at the ticket's level or stronger (a network run
 *    needs `container` or stronger: the process level never gets the host's network); or
 *    the runtime's image is not installed.
 * 6. `digest_mismatch` — the ticket pins `runtime_digest` and the installed image of the
 *    request's runtime has another digest (message `ticket.runtime_digest: …`); then the
 *    request's `runtime_digest` is set and differs from the ticket's pin; then it is set and
 *    differs from the installed digest. Only the installed (current) image ever runs, so a
 *    pin, the ticket's or the request's, can only confirm it.
 *
 * Then clamps the timeout to min(ticket, policy) and the memory limit likewise, recording
 * that in the flags, and replaces `egress` by its canonical form. Blob existence is not
 * checked here (that needs the store). Pure and deterministic: the same arguments always
 * give the same answer.
 */
std::variant<admitted, rejection> admit(const run_request& request, const ticket& ticket,
                                        const policy& policy, const host_catalog& catalog,
                                        std::chrono::system_clock::time_point now);

/// `admit` at `std::chrono::system_clock::now()` (so not deterministic for an expiring
/// ticket; tests and replays pass `now`).
std::variant<admitted, rejection> admit(const run_request& request, const ticket& ticket,
                                        const policy& policy, const host_catalog& catalog);

/**
 * What `admit` would answer once an approval granted the request's domains: for a network
 * request whose ticket lacks `code.network`, every check of `admit` except the network grant
 * (step 3's `code.network` and domain checks), so the admitted request says what the run
 * would get (level at least `container`, clamped limits, canonical egress). For any other
 * request exactly `admit`. The runtime asks its approver only when this admits
 * (sandbox/approval.hpp).
 */
std::variant<admitted, rejection> admit_pending_approval(const run_request& request,
                                                         const ticket& ticket, const policy& policy,
                                                         const host_catalog& catalog,
                                                         std::chrono::system_clock::time_point now);

/// The weakest isolation level a run of `request` under `ticket` may use here, as step 5 of
/// `admit` decides it: the ticket's level; for a tool run, its registry entry's in `catalog`
/// when that is stronger (a tool `catalog` does not hold: the ticket's); at least
/// `container` for a network request or a tool whose entry has its own egress. Never fails:
/// whether a backend serves that level is `admit`'s question.
isolation required_level(const run_request& request, const ticket& ticket,
                         const host_catalog& catalog);

/// The `runtime_unavailable` message for a request that needs level `need` where no backend
/// at that level or stronger is registered: names the level and what serves one (the host
/// enables it in its configuration and its start-up self-test passes; `sandboxctl doctor`
/// says which), nothing of the host itself.
std::string no_backend_message(isolation need);

/// The result to return for a rejected request: `code` and `message` from `r`, everything
/// else empty; `run_id` as given.
run_result rejected_result(const rejection& r, std::string run_id = {});

/**
 * Writes into `r` what admission decided for a run, which every result of an admitted run
 * reports whoever makes it (a backend, the runtime for a cancelled or aborted run, the fake
 * backend): `isolation`, `runtime` (name and image digest), `timeout`,
 * `memory_limit_bytes`, `timeout_clamped` and `memory_clamped`. Leaves every other field
 * as it is.
 */
void note_admitted(run_result& r, const admitted& a);

}  // namespace sandbox
