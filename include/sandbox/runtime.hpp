// The runtime: what an agent host links and calls once per tool call.
//
// One `runtime` per host process. It owns the registered backends (one per isolation level,
// each admitted only after its start-up self-test passed on this host), the blob store, the
// image store and the policy, and runs requests asynchronously on a Boost.Asio executor:
//
//   boost::asio::io_context io;
//   auto rt = sandbox::runtime::create(io.get_executor(), {});
//   if (!rt) { /* rt.error() says why (e.g. no backend could be registered) */ }
//   rt->async_run(request, ticket, [](boost::system::error_code ec, sandbox::run_result r) {
//     // r.code == sandbox::code::ok, r.std_out.summary == "1\n", ...
//   });
//   io.run();
//
// Also works with `boost::asio::use_future` and `boost::asio::use_awaitable`.
//
// The options of each built-in isolation level (`process_backend_options`,
// `oci_backend_options`, `microvm_backend_options`), of warm pools and of the egress proxy are
// declared in sandbox/backend_options.hpp (included here), so that the levels' code reads
// them without the facade; `backend_status` is declared in sandbox/backend.hpp.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/result.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/admission.hpp"
#include "sandbox/approval.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/backend_options.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/error.hpp"
#include "sandbox/image_store.hpp"
#include "sandbox/interpreter.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/receipt.hpp"
#include "sandbox/record.hpp"
#include "sandbox/registry.hpp"
#include "sandbox/scheduler.hpp"
#include "sandbox/session.hpp"
#include "sandbox/span.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox {

/// Everything a runtime is configured with. Defaults work for root and ordinary users.
struct runtime_options {
  /// Per-host state: run work dirs, locks. Empty: `/run/agent-sandbox` for root, else
  /// `$XDG_RUNTIME_DIR/agent-sandbox` or `/tmp/agent-sandbox-<uid>`.
  std::filesystem::path state_dir;
  /// Image store. Empty: `/var/lib/agent-sandbox/images` for root, else
  /// `$XDG_DATA_HOME/agent-sandbox/images` (default `~/.local/share/…`), falling back to the
  /// root store opened read-only when that one exists and the user's does not.
  std::filesystem::path image_dir;
  /// Blob store directory (ignored when `blobs` is set). Empty: `/var/lib/agent-sandbox/blobs`
  /// for root, else `$XDG_DATA_HOME/agent-sandbox/blobs`.
  std::filesystem::path blob_dir;
  std::shared_ptr<blob_store> blobs;    ///< use this store instead of opening `blob_dir`
  std::shared_ptr<image_store> images;  ///< use this store instead of opening `image_dir`
  sandbox::policy policy;
  /// Global and per-tenant caps, queue limits and deadlines (sandbox/scheduler.hpp).
  scheduler_options scheduler;
  std::vector<runtime_spec> runtimes = default_runtimes();
  /// Registered tools (sandbox/registry.hpp), picked by `run_request::tool`. Each is checked
  /// at creation (`check_tool_entry`, names unique) and its image resolved to its current
  /// digest like a runtime's (`fixed_digests` is looked up by the entry's `image`); a
  /// faulty entry makes `create` fail with `invalid_argument`, the log naming the entry and
  /// field. An entry whose image is not installed (or cannot be unpacked) is kept, like a
  /// runtime without its image: a warning is logged and its runs answer
  /// `runtime_unavailable` until a runtime is created after the image was built.
  /// Default: none.
  std::vector<tool_entry> tools;
  /// For fakes and tests: runtime name → image digest to use instead of asking the image
  /// store (runs then get an empty `rootfs`). When non-empty and `images` is null, no image
  /// store is opened at all.
  std::map<std::string, std::string> fixed_digests;
  /// Register the process backend (after its self-test). Off for fake-only runtimes.
  bool process_backend = true;
  /// Self-test each enabled level only when a run or session first needs it, instead of
  /// every one in `create`: before admission, the runtime tries the enabled levels not yet
  /// tried from the weakest the request may use (`required_level`) upward, and stops at the
  /// first that registers — the level `create` would have chosen too. `backends()` then lists
  /// only the levels tried so far. For one-shot processes (`sandboxctl run`, which would
  /// otherwise boot a VM for a process-level run when microvm is enabled): the run that
  /// triggers a self-test waits for it on the runtime's executor. Default false.
  bool levels_on_demand = false;
  /// Reuse a level's start-up self-test pass recorded on this boot (in the level's state
  /// directory, `selftest/<level>.json`) when nothing it depended on has changed: the boot
  /// id, the host kernel, this library's build, the cgroup layout, the level's options and
  /// the content of its binaries (the OCI runtime; QEMU, mkfs.erofs, the guest kernel and
  /// initramfs). A record that is not the effective uid's, is writable by group or others,
  /// or does not parse, or lies in a directory that is not the uid's and 0700 (or whose
  /// parent others may write) is ignored and the test runs. Failures are never recorded.
  /// `probe_backends` (`sandboxctl doctor`) always tests. False: test at every start
  /// (docs/operations.md, "Start-up self-test"). Default true.
  bool reuse_self_test_verdict = true;
  /// The process level's cgroups, uid range, sandbox-init and warm pools; the other
  /// built-in levels use its cgroup parent and root and its uid range too
  /// (sandbox/backend_options.hpp).
  process_backend_options process;
  /// The `container` level (crun by default, or runc), registered when `enabled`
  /// (sandbox/backend_options.hpp).
  oci_backend_options container{
      .enabled = false, .runtime = "crun", .path = {}, .platform = "ptrace", .warm_pool = {}};
  /// The `gvisor` level (runsc), registered when `enabled` (sandbox/backend_options.hpp).
  oci_backend_options gvisor{
      .enabled = false, .runtime = "runsc", .path = {}, .platform = "ptrace", .warm_pool = {}};
  /// The `microvm` level (QEMU microvm), registered when `enabled`
  /// (sandbox/backend_options.hpp).
  microvm_backend_options microvm;
  /// Network runs' egress proxy (pinned names, ports, per-run budgets;
  /// sandbox/backend_options.hpp).
  egress_proxy_options egress;
  /// Host-held secrets by name (`is_valid_secret_name`; at most `max_secrets`;
  /// sandbox/secrets.hpp): each checked by `check_secret_definition` and its value read from
  /// its file when the runtime is created (a definition or file refused: `create` fails with
  /// `invalid_argument`, logged naming the secret and why, never the value). Tickets grant
  /// them and requests name them; a run sees only a placeholder. Empty (the default): none.
  std::map<std::string, secret_definition> secrets;
  std::shared_ptr<span_sink> spans;  ///< receives one span per run; may be null
  log_sink log;                      ///< host log lines; empty: warnings and errors to stderr
  /// Long-lived sessions (sandbox/session.hpp): their lifetime, idle and buffer limits. The
  /// servers a session may start are the registry's entries (`tools`).
  session_options sessions;
  /// Interpreter sessions (sandbox/interpreter.hpp): interrupt grace and per-cell caps. Their
  /// lifetimes and idle timeouts are `sessions`'.
  interpreter_options interpreters;
  /// Asked when a network request's ticket lacks `code.network` (sandbox/approval.hpp).
  /// Null (the default): such requests are `action_denied`.
  std::shared_ptr<sandbox::approver> approver;
  /// Signs an execution receipt for every run that a backend ran (sandbox/receipt.hpp),
  /// carried in `run_result::receipt`. Null (the default): no receipts.
  std::shared_ptr<const sandbox::receipt_signer> receipt_signer;
};

/// Defaults resolved for the current user (the paths above).
runtime_options default_runtime_options();

/**
 * Applies a host configuration document to `options` (JSON; docs/operations.md,
 * "Configuration"): `scheduler` (caps, queue limits, tenant classes with weights and queue
 * deadlines, tenant → class), `warm_pool` (pool classes), `policy` (ceilings and per-run
 * limits, `profiles`, profile `ceilings`, `max_stdin_bytes`), `runtimes` (language runtimes
 * the host defines, each checked by `check_runtime_spec`; one named like a runtime already in
 * `options.runtimes` replaces it: `[{"name": "python3-data", "image": "python3-data",
 * "argv": ["/usr/bin/python3", "-I", "{source}"], "source_name": "main.py"}]`), `tools` (the
 * registry:
 * `[{"name": "markdown", "image": "tools", "binary": "/usr/bin/cmark", "args": [],
 * "isolation": "process", "profile": "small"}]`, each checked like `check_tool_entry`),
 * `backends` (the container and gvisor levels), `egress` (network runs' proxy:
 * `egress_proxy_options`, e.g. `{"pinned_hosts": {"api.internal.example": ["10.0.0.7"]},
 * "connect_ports": [443, 8443], "max_connections": 16}`), `sessions` (session lifetimes
 * and buffers: `session_options`; the registry's entries are the session servers). For example:
 *
 *   {"v": 1,
 *    "scheduler": {"max_running": 16, "classes": {"gold": {"max_running": 8, "weight": 3}},
 *                  "tenant_classes": {"acme": "gold"}},
 *    "warm_pool": [{"runtime": "python3", "size": 4}],
 *    "policy": {"max_timeout_ms": 8000, "allowed_env": ["TZ"]}}
 *
 * Strict like the protocol: unknown fields, wrong types and out-of-range values give an
 * `invalid_request` rejection naming the field, and then nothing is applied.
 */
boost::system::result<void, rejection> apply_config(std::string_view json,
                                                    runtime_options& options);

namespace detail {
class runtime_impl;
}

/// Runs requests under tickets. Thread-safe. Move-only. Destroying it kills every live run
/// (their handlers complete with `operation_aborted` if the executor still runs; their spans
/// are recorded from the destroying thread). A runtime on an external executor may outlive
/// its execution context (nothing is posted to a context that is gone), but its runs then
/// never complete.
class runtime {
 public:
  /**
   * Creates a runtime whose handlers and timers run on `executor`. Opens the stores, makes
   * sure the configured runtimes' current images are unpacked, reclaims what a crashed
   * earlier host left behind (cgroups, work dirs), and registers each backend whose
   * self-test passes. A runtime with no backend is still created (so `add_backend` can add
   * one); until one is added every run answers `runtime_unavailable`, and `backends()` (or
   * `probe_backends`) says why each backend was refused. Errors: `invalid_argument` (an
   * empty executor, a relative store path, a runtime definition that fails
   * `check_runtime_spec` or repeats a name, a registry entry that fails `check_tool_entry`;
   * logged naming the field), `io_error`, `permission_denied` (the blob or image store
   * cannot be opened).
   */
  static result<runtime> create(boost::asio::any_io_executor executor,
                                runtime_options options = default_runtime_options());

  /// Like `create`, but the runtime owns a private io_context run by one internal thread.
  static result<runtime> create(runtime_options options = default_runtime_options());

  runtime(runtime&&) noexcept;
  runtime& operator=(runtime&&) noexcept;
  ~runtime();

  /**
   * Admits `request` under `ticket`, asks the approver when the request needs the network
   * and the ticket does not grant it (sandbox/approval.hpp: `approval_denied`,
   * `approval_required`, or the run proceeds under the approved derived ticket), waits for a
   * slot (sandbox/scheduler.hpp: `capacity` at once when the queue is full, `queue_timeout`
   * past the tenant's deadline), and runs it. A run waiting for approval holds no slot. Completes
   * once with `(error_code, run_result)` on the handler's associated executor (default: the
   * runtime's), never inside this call. Admission failures and every way the run can end are in
   * `run_result.code`; the error code is only `operation_aborted` (cancelled via the handler's
   * cancellation slot, or the runtime was destroyed) — the run is killed and confirmed dead before
   * that completion, and its result has code `internal` with what is known (run id; limits once
   * admitted). Thread-safe: may be called from any thread.
   */
  template <class CompletionToken>
  auto async_run(run_request request, ticket ticket, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, run_result)>(
        [this](auto handler, run_request r, sandbox::ticket t) {
          do_run(std::move(r), std::move(t), std::move(handler));
        },
        token, std::move(request), std::move(ticket));
  }

  /**
   * Starts a session of the registered server `request.tool` (sandbox/session.hpp) under
   * `ticket`: the entry's image (its current digest, checked against the entry's and the
   * ticket's pins), binary and fixed argv, at the stronger of the entry's and the ticket's
   * isolation level (at least `container` when the entry has egress), under the entry's
   * workload profile, with the lifetime and idle timeout clamped to
   * `runtime_options::sessions`. The entry is one of the registry's (`runtime_options::tools`,
   * checked and resolved at creation), its image the one resolved then. The ticket must be
   * unexpired and grant `tool.run` for the entry (as for a tool run: `ticket_spec::tools`).
   * Completes once with `(error_code, session_start)` on the handler's
   * associated executor (default: the runtime's), never inside this call, when the server
   * has started or could not (`session_start::code`). A session holds a scheduler slot of
   * its ticket's tenant (the same class and caps as its runs) from before its server starts
   * until it ends; waiting for one past the class's queue deadline is `queue_timeout`, a full
   * queue `capacity`. One span (`sandbox.session`) is recorded per session, at its end.
   * Thread-safe.
   */
  template <class CompletionToken>
  auto async_open_session(session_request request, ticket ticket, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, session_start)>(
        [this](auto handler, session_request r, sandbox::ticket t) {
          do_open_session(std::move(r), std::move(t), std::move(handler));
        },
        token, std::move(request), std::move(ticket));
  }

  /**
   * Opens an interpreter session (sandbox/interpreter.hpp) of the language runtime
   * `request.runtime` under `ticket`: admitted like a run of that runtime (`code.execute`,
   * the ticket's level, its image and pins), then started like a session (a scheduler slot of
   * the tenant held for its whole life, the host's and tenant's session caps, one
   * `sandbox.session` span at its end, lifetime and idle timeout from
   * `runtime_options::sessions`). Completes once with `(error_code, interpreter_start)` on
   * the handler's associated executor, never inside this call. Thread-safe.
   */
  template <class CompletionToken>
  auto async_open_interpreter(interpreter_request request, ticket ticket, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, interpreter_start)>(
        [this](auto handler, interpreter_request r, sandbox::ticket t) {
          do_open_interpreter(std::move(r), std::move(t), std::move(handler));
        },
        token, std::move(request), std::move(ticket));
  }

  /// Blocking form of `async_run`; returns the result even when the run was aborted. Must
  /// not be called from a thread that is the only one running the runtime's executor (it
  /// would wait for itself): on the private thread of a runtime made by `create(options)`
  /// it returns `internal` at once instead; with an external executor some other thread
  /// must be running it.
  run_result run(run_request request, const ticket& ticket);

  /**
   * The stored result of `record` without executing anything (`replay_run` on this
   * runtime's blob store): for a host that checkpointed the record and restarted. Returns
   * the rejection `replay_run` documents: `action_denied` (ticket of another tenant),
   * `blob_not_found` naming the field and blob id that was collected, `invalid_request`
   * (a record whose parts disagree), `internal` (store failure). Thread-safe.
   */
  boost::system::result<run_result, rejection> replay(const run_record& record,
                                                      const ticket& ticket) const;

  /// Adds a backend (e.g. `sandbox::testing::fake_backend`). It serves its level from now on,
  /// replacing one registered at the same level.
  void add_backend(std::shared_ptr<backend> b);

  /// Status of every backend this runtime tried to register, with reasons, weakest level
  /// first, then those given to `add_backend` (each replacing the status of its level): one
  /// per level the options enable (`process_backend`, `container.enabled`,
  /// `gvisor.enabled`, `microvm.enabled`); a level they leave off has none, and with
  /// `levels_on_demand` neither has one no run or session has needed yet (in the order they
  /// were tried). A level whose
  /// backend was not built into this library is refused with "not built into this library
  /// (SANDBOX_BACKEND_<LEVEL>=OFF)". Thread-safe.
  std::vector<backend_status> backends() const;

  /// What admission sees: registered levels and runtimes with installed digests. A runtime
  /// name keeps the image that was current when this runtime was created for its whole life,
  /// and runs only that one: a request or ticket pinning any other `runtime_digest` gets
  /// `digest_mismatch` (to roll an image, create a new runtime).
  host_catalog catalog() const;

  /// The blob store runs read inputs from and write outputs to.
  std::shared_ptr<blob_store> blobs() const;

  /// The image store (null for runtimes created without one).
  std::shared_ptr<image_store> images() const;

  const sandbox::policy& policy() const;

  /// Every backend's warm pools, one per class, each with its backend's level: ready,
  /// starting, handed out, failed, and why a class stopped (`pool_stats::error`).
  /// Thread-safe.
  std::vector<pool_stats> warm_pool_stats() const;

  /// Scheduler figures: slots held, runs queued, dispatches, queue timeouts, rejections.
  sandbox::scheduler_stats queue_stats() const;

 private:
  explicit runtime(std::shared_ptr<detail::runtime_impl> impl);
  void do_run(
      run_request request, ticket ticket,
      boost::asio::any_completion_handler<void(boost::system::error_code, run_result)> handler);
  void do_open_session(
      session_request request, ticket ticket,
      boost::asio::any_completion_handler<void(boost::system::error_code, session_start)> handler);
  void do_open_interpreter(
      interpreter_request request, ticket ticket,
      boost::asio::any_completion_handler<void(boost::system::error_code, interpreter_start)>
          handler);
  std::shared_ptr<detail::runtime_impl> impl_;
};

/**
 * Runs the self-test of every level `options` enables without creating a runtime, for
 * diagnostics (`sandboxctl doctor`), and returns their statuses weakest level first: each
 * registered (its self-test passed; the backend is then shut down) or refused with the
 * reason, as `runtime::backends()` would report them. The process level is listed even when
 * `process_backend` is false ("disabled (runtime_options::process_backend is false)"); the
 * other levels only when enabled. A probe starts no warm pool and uses the default policy.
 * It always runs the self-tests, whatever `reuse_self_test_verdict` says, and records each
 * pass for later starts to reuse. Blocks for the self-tests (a microvm probe boots one VM);
 * never fails (reasons are in the statuses). Thread-safe.
 */
std::vector<backend_status> probe_backends(const runtime_options& options);

}  // namespace sandbox
