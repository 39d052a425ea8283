// The backend interface: one isolation mechanism (process, OCI, microVM, or the fake used in
// tests). A backend only knows how to start, watch and destroy one isolated execution; it
// never decides policy — admission already did.
#pragma once

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/admission.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/code.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/secrets.hpp"
#include "sandbox/session.hpp"

namespace sandbox {

/// The runtimes every host knows: `python3` and `node` (images built by
/// `sandboxctl image build`).
std::vector<runtime_spec> default_runtimes();

/**
 * A host-held secret one run uses (`run_job::secrets`; sandbox/secrets.hpp). The program
 * gets only `placeholder`, in the environment variable `secret_env_name(name)`; the value
 * stays in the host process, for the run's egress proxy.
 */
struct run_secret {
  std::string name;              ///< the secret's name
  std::string placeholder;       ///< random per run: "sbx-secret-" and 32 lowercase hex digits
  secret_definition definition;  ///< where the value may go and the header that carries it
  /// The value (shared, read-only: never copied into anything a run returns).
  std::shared_ptr<const std::string> value;
  bool operator==(const run_secret&) const = default;
};

/// One admitted run, handed to a backend.
struct run_job {
  std::string run_id;                 ///< unique; safe for file and cgroup names ([a-z0-9-])
  sandbox::admitted admitted;         ///< the normalized request and its ticket's facts
  runtime_spec runtime;               ///< how to start the interpreter
  std::filesystem::path rootfs;       ///< unpacked image root (read-only); empty for fakes
  std::shared_ptr<blob_store> blobs;  ///< inputs are read from and outputs stored to here
  /// Host limits (pids, tmpfs, capture caps, grace): the policy under the run's workload
  /// profile (`effective_limits`).
  sandbox::policy policy;
  /// Registered tool runs: the program's standard input, staged read-only in the run's
  /// workspace as the `runtime.source_name` file (in place of a source) and opened as fd 0;
  /// EOF after it. Unset: fd 0 is /dev/null.
  std::optional<std::string> stdin_bytes;
  /// The host-held secrets the run uses (`admitted.request.secrets`, in that order), each
  /// with the placeholder made for this run. Empty for runs without secrets.
  std::vector<run_secret> secrets;
  /// Set on a pre-started warm-pool instance's template (`warm_pool_class::prestart`): the
  /// interpreter starts in the prepared instance and imports these modules, in order, before
  /// it waits for the run. Unset: the interpreter starts at hand-out (every other run).
  std::optional<std::vector<std::string>> prestart;
  /// The runtime's executor. Backends without an executor of their own (the fake) run their
  /// timers on it, so nothing of a run outlives the execution context it belongs to.
  boost::asio::any_io_executor executor;
};

/// What a backend needs beyond the `run_job` to run it as a session (sandbox/session.hpp).
/// The job's `runtime.argv` is the server's argv (used as is: no `{source}`), its
/// `admitted.request.timeout` the session's maximum lifetime.
struct session_job {
  std::chrono::milliseconds idle_timeout{std::chrono::minutes(2)};  ///< no byte either way
  std::uint32_t stdin_buffer_bytes = 64 * 1024;  ///< host-side stdin buffer (bytes)
  /// Set by the runtime when the lifetime (`run_job`'s `admitted.request.timeout`) ends at
  /// the ticket's `expires_at` rather than at a lifetime ceiling: the backend then reports
  /// the end as `session_end::ticket_expired` instead of `max_lifetime` (code `timeout`).
  bool lifetime_ends_at_ticket_expiry = false;
  /// Set by the runtime: the backend calls it exactly once, with the closing record, when
  /// the session is over — every process of it confirmed dead, or it never started — before
  /// any `async_close` handler is queued. The runtime records the session's span and
  /// releases its scheduler slot there. Must not block; never throws. A backend that drops
  /// it uncalled (refusing the session) releases the slot by dropping it; the runtime then
  /// records the span from the open's outcome. It may complete the record (the runtime
  /// adds the receipt, `runtime_options::receipt_signer`): the backend hands the record,
  /// as `on_end` left it, to every `async_close` handler.
  std::function<void(session_result&)> on_end;
};

/// One warm pool's figures (sandbox/runtime.hpp `warm_pool_class`).
struct pool_stats {
  /// The level whose backend keeps the pool: `runtime::warm_pool_stats` sets it from that
  /// backend's `isolation()` (a backend's own `warm_pool_stats` may leave the default).
  sandbox::isolation isolation = sandbox::isolation::process;
  std::string runtime;                   ///< runtime name the pool serves
  std::uint64_t memory_limit_bytes = 0;  ///< its limits class
  std::uint32_t size = 0;                ///< configured size (expected concurrent executions)
  std::uint32_t ready = 0;               ///< prepared, never used, waiting
  std::uint32_t starting = 0;            ///< being prepared (refills in flight)
  std::uint64_t handed_out = 0;          ///< instances given to runs so far
  std::uint64_t failed = 0;              ///< instances that failed to prepare or died idle
  /// Empty while the pool works; else why it stopped preparing for good (a pre-started
  /// class whose `preload` import raised: the module and the exception's summary). Its runs
  /// go cold.
  std::string error;
  bool operator==(const pool_stats&) const = default;
};

/// An isolation mechanism. Implementations are thread-safe.
class backend {
 public:
  virtual ~backend() = default;

  /// The level this backend provides.
  virtual sandbox::isolation isolation() const noexcept = 0;
  /// Short name for reports and spans, e.g. "process".
  virtual std::string_view name() const noexcept = 0;

  /**
   * Runs `job` and completes once with `(error_code, run_result)` on the handler's
   * associated executor. The result's `code` says how the run ended; the error code is only
   * for the operation itself (`operation_aborted` when cancelled through the handler's
   * cancellation slot — the run is killed first, and the result says what is known).
   * Before completing, every process of the run is dead and confirmed so.
   */
  template <class CompletionToken>
  auto async_execute(run_job job, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken,
                                       void(boost::system::error_code, run_result)>(
        [this](auto handler, run_job j) { do_execute(std::move(j), std::move(handler)); }, token,
        std::move(job));
  }

  /// Kills every live run of this backend now and waits (bounded by the policy's teardown
  /// budget) until they are confirmed dead. Called when the runtime is destroyed. Their
  /// handlers still complete, with `operation_aborted`, if their executor keeps running.
  virtual void shutdown() noexcept = 0;

  /// Warm pools of this backend (empty when it keeps none).
  virtual std::vector<pool_stats> warm_pool_stats() const { return {}; }

  using session_handler =
      boost::asio::any_completion_handler<void(boost::system::error_code, session_start)>;
  /**
   * Starts `job` as a long-lived session: the program's stdin and stdout are live pipes of
   * the returned `session`. Completes once (posted to the handler's associated executor, or
   * `job.executor`) when the program has started — `session_start::session` set — or could
   * not (`code` and `message` say why; nothing is left running). The default: the backend
   * has no sessions (`runtime_unavailable`).
   */
  virtual void open_session(run_job job, session_job s, session_handler handler) {
    (void)s;
    detail::post_completion(
        job.executor, std::move(handler), boost::system::error_code{},
        session_start{.session = nullptr,
                      .code = sandbox::code::runtime_unavailable,
                      .message = "the " + std::string(name()) + " backend does not run sessions"});
  }

 private:
  virtual void do_execute(
      run_job job,
      boost::asio::any_completion_handler<void(boost::system::error_code, run_result)> handler) = 0;
};

/**
 * Why a backend is or is not available on this host: what `runtime::backends()` and
 * `probe_backends` (sandbox/runtime.hpp) report for each level they tried, registered or
 * refused with the reason.
 */
struct backend_status {
  sandbox::isolation isolation = sandbox::isolation::process;  ///< the level tried
  /// The backend's name: the level's ("process", "microvm"), the OCI runtime's ("crun",
  /// "runc", "runsc") for the container and gvisor levels, or `backend::name()` of one
  /// given to `runtime::add_backend` (e.g. "fake").
  std::string name;
  bool registered = false;  ///< its self-test passed and it serves its level
  /// Empty when registered; else the missing capability, e.g. "seccomp user notification
  /// unavailable (kernel < 5.0?)", "cgroup pids controller not delegated", or "not built
  /// into this library (SANDBOX_BACKEND_OCI=OFF)".
  std::string reason;
  bool operator==(const backend_status&) const = default;
};

}  // namespace sandbox
