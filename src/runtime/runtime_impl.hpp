// The runtime's private state and the state of one run in flight (private to src/).
//
// Ownership: a `runtime` handle holds its `runtime_impl` through a shared_ptr; every run in
// flight (`run_op`) holds another, so the impl outlives the handle while runs finish. The
// impl knows its runs only through weak pointers (for aborting them at shutdown); a run is
// kept alive by the handlers that will complete it (queued in an execution context, or held
// by a backend), so destroying the execution context releases it.
//
// Threads: every member function is thread-safe. `run_op::start` and the backend completion
// run on the runtime's executor; cancellation requests arrive on whatever thread emits the
// caller's cancellation signal and are forwarded to the runtime's executor.
#pragma once

#include <atomic>
#include <boost/asio/any_completion_executor.hpp>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "backends/levels.hpp"
#include "runtime/scheduler.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox::detail {

using run_handler =
    boost::asio::any_completion_handler<void(boost::system::error_code, run_result)>;

class run_op;
struct run_machine_context;
struct level_options;

/// The levels' share of `o` (backends/levels.hpp) around `ctx`: which levels it enables and
/// their options.
level_options level_options_of(const runtime_options& o, run_machine_context ctx);

class runtime_impl : public std::enable_shared_from_this<runtime_impl> {
 public:
  /// `own_io` is set for runtimes made by `create(options)`: the impl then runs it on one
  /// thread (started by `start_thread`) until `shutdown`.
  runtime_impl(boost::asio::any_io_executor executor,
               std::shared_ptr<boost::asio::io_context> own_io, log_sink log);
  ~runtime_impl();
  runtime_impl(const runtime_impl&) = delete;
  runtime_impl& operator=(const runtime_impl&) = delete;

  /// Starts the private thread (own io_context only). Errors: `io_error`.
  boost::system::error_code start_thread() noexcept;
  /// Opens stores, resolves runtimes, registers backends. Errors as `runtime::create`.
  boost::system::error_code init(runtime_options options) noexcept;
  /// Shuts every backend down, aborts every run in flight, and (own io_context) stops and
  /// joins the private thread. Idempotent; never throws.
  void shutdown() noexcept;

  /// `runtime::do_run`: never completes inline; never throws.
  void start_run(run_request request, ticket ticket, run_handler handler) noexcept;
  /// `runtime::run` (blocking).
  run_result run_blocking(run_request request, const ticket& ticket);

  void add_backend(std::shared_ptr<backend> b);
  std::vector<backend_status> backends() const;
  host_catalog catalog() const;
  std::shared_ptr<blob_store> blobs() const { return blobs_; }
  std::shared_ptr<image_store> images() const { return images_; }
  const sandbox::policy& policy() const noexcept { return policy_; }

  // --- used by run_op ---------------------------------------------------------------------
  const boost::asio::any_io_executor& executor() const noexcept { return executor_; }
  /// The secrets of admitted request `a` (`a.request.secrets`, in order), each with a fresh
  /// random placeholder; `std::nullopt` when a name is not defined here (admission refused
  /// those already) or the host's randomness failed.
  std::optional<std::vector<run_secret>> run_secrets(const admitted& a) const;
  /// False once the executor's execution context has begun to shut down (or is destroyed):
  /// nothing may be posted to it any more.
  bool executor_alive() const noexcept { return ctx_alive_ && ctx_alive_->load(); }
  void log(log_level level, std::string_view line) const noexcept;
  void record_span(const run_op& op, boost::system::error_code ec,
                   const run_result& r) const noexcept;
  /// Hands a finished span (a session's: src/runtime/session.cpp) to the span sink, if any.
  void record_span(const span& s) const noexcept;
  void unregister(std::uint64_t key) noexcept;
  /// The backend registered at exactly `level`; null when none.
  std::shared_ptr<backend> backend_at(sandbox::isolation level) const;
  /// The backend of the weakest registered level at or above `need`; null when none.
  std::shared_ptr<backend> backend_at_least(sandbox::isolation need) const;
  /// With `runtime_options::levels_on_demand`: tries the enabled levels not yet tried from
  /// `need` upward, weakest first, until one at or above `need` is registered and no untried
  /// level is weaker than it (the level an eager runtime would pick). Blocks for the
  /// self-tests; one caller at a time. A no-op when every enabled level was tried, or
  /// without the option. Never throws.
  void ensure_level(sandbox::isolation need) noexcept;
  /// Every registered backend, weakest level first.
  std::vector<std::shared_ptr<backend>> registered() const;
  const runtime_spec* spec(std::string_view name) const noexcept;
  std::filesystem::path rootfs_of(std::string_view name) const;
  /// How a registered tool is started: its binary and args as the argv, its image's root;
  /// `std::nullopt` for an unknown name or an image that is not unpacked.
  std::optional<std::pair<runtime_spec, std::filesystem::path>> tool_launch(
      std::string_view name) const;
  const std::shared_ptr<blob_store>& blob_store_ref() const noexcept { return blobs_; }
  const std::shared_ptr<scheduler>& sched() const noexcept { return scheduler_; }
  /// Sessions' registry and limits (sandbox/session.hpp). Immutable after init().
  const session_options& sessions() const noexcept { return sessions_; }
  /// Interpreter sessions' limits (sandbox/interpreter.hpp). Immutable after init().
  const interpreter_options& interpreters() const noexcept { return interpreters_; }
  /// The host's approver (null: none). Immutable after init().
  const std::shared_ptr<sandbox::approver>& approver() const noexcept { return approver_; }
  /// Signs each run's receipt; null when receipts are off.
  const std::shared_ptr<const sandbox::receipt_signer>& receipt_signer() const noexcept {
    return receipt_signer_;
  }

 private:
  boost::system::error_code open_stores(runtime_options& o);
  /// Checks each runtime definition (`check_runtime_spec`, unique names) and resolves its
  /// image's current digest, unpacked, with `argv[0]` in it (else its runs answer
  /// `runtime_unavailable`). `invalid_argument` (logged, naming the definition and field)
  /// for the first fault.
  boost::system::error_code resolve_runtimes(const runtime_options& o);
  /// Checks the registry (`check_tool_entry`, unique names, the image installed) and
  /// resolves each entry's image like a runtime's. `invalid_argument` (logged, naming the
  /// entry and field) for the first fault.
  boost::system::error_code resolve_tools(const runtime_options& o);
  /// Checks each secret definition (`check_secret_definition`, name syntax, at most
  /// `max_secrets`) and reads its value from its file (`read_secret_file`), into
  /// `secret_values_` and the catalog. `invalid_argument` (logged, naming the secret and the
  /// reason, never the value) for the first fault.
  boost::system::error_code resolve_secrets(const runtime_options& o);
  /// Logs, once, each profile field above its ceiling (clamped at every run).
  void log_clamped_profiles() const;
  /// Holds `policy_`'s RLIMIT_NOFILE values to the host's hard limit (no run can raise its own
  /// above it): `max_open_files` above it refuses creation (invalid_argument, the field named
  /// in the log); `ceilings.max_open_files` above it is lowered to it with a warning, so
  /// profiles are then clamped like any value above its ceiling.
  boost::system::error_code check_open_files_limit();
  /// What every level's backend gets from this runtime: its executor, `o.process`, the state
  /// directory, log, policy, egress options, and a resolver of its runtimes (warm pools).
  run_machine_context backend_context(const runtime_options& o);
  /// Registers the backend of every level `o` enables, through the levels table
  /// (backends/levels.hpp): each after its self-test passed, or its refusal recorded and
  /// logged. Levels `o` leaves off get no status.
  void register_levels(const runtime_options& o);
  /// Tries one level (`try_level`) and registers its backend or records its refusal; a
  /// backend made after `shutdown` began is shut down instead.
  void register_level(const builtin_level& l, const level_options& lo);
  /// Logs a refusal and adds `st` to the statuses; refreshes the catalog's levels.
  void record_status(backend_status st);
  void refresh_levels_locked();

  boost::asio::any_io_executor executor_;
  std::shared_ptr<std::atomic<bool>> ctx_alive_;
  std::shared_ptr<boost::asio::io_context> own_io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> own_work_;
  std::thread thread_;

  // Immutable after init().
  sandbox::policy policy_;
  std::vector<runtime_spec> specs_;
  std::map<std::string, std::filesystem::path, std::less<>> rootfs_;       ///< by runtime name
  std::map<std::string, std::filesystem::path, std::less<>> tool_rootfs_;  ///< by tool name
  /// The secrets' values by name (read once at creation; only ever handed to run_job).
  std::map<std::string, std::shared_ptr<const std::string>, std::less<>> secret_values_;
  std::shared_ptr<blob_store> blobs_;
  std::shared_ptr<image_store> images_;
  std::shared_ptr<span_sink> spans_;
  std::shared_ptr<scheduler> scheduler_;
  std::shared_ptr<sandbox::approver> approver_;
  std::shared_ptr<const sandbox::receipt_signer> receipt_signer_;
  session_options sessions_;
  interpreter_options interpreters_;
  log_sink log_;

  // Levels enabled but not yet tried (`levels_on_demand`), weakest first, guarded by
  // demand_mu_, which ensure_level holds while it tries one; and the options to try them
  // with, set by init() only (without the option: empty, and ensure_level returns at once).
  std::mutex demand_mu_;
  std::vector<const builtin_level*> untried_levels_;
  std::optional<level_options> demand_options_;

  mutable std::mutex mu_;  // guards everything below
  std::map<sandbox::isolation, std::shared_ptr<backend>> backends_;
  std::vector<std::shared_ptr<backend>> retired_;  ///< replaced by add_backend; still shut down
  std::vector<backend_status> statuses_;
  host_catalog catalog_;
  bool shutting_down_ = false;
  std::uint64_t next_key_ = 0;
  std::unordered_map<std::uint64_t, std::weak_ptr<run_op>> ops_;
};

/// One run in flight, from `async_run` until its handler is handed to its executor.
class run_op : public std::enable_shared_from_this<run_op> {
 public:
  run_op(std::shared_ptr<runtime_impl> rt, run_request request, sandbox::ticket ticket,
         run_handler handler);
  ~run_op();
  run_op(const run_op&) = delete;
  run_op& operator=(const run_op&) = delete;

  /// Installs the forwarder in the caller's cancellation slot (initiating thread).
  void connect_cancellation();
  /// Admission, blob checks, backend launch. Runs on the runtime's executor.
  void start() noexcept;
  /// The caller's cancellation slot fired (any thread).
  void cancel(boost::asio::cancellation_type type) noexcept;
  /// The runtime is being destroyed: complete now with `operation_aborted` (posted).
  void abort(std::string_view message) noexcept;

  std::uint64_t key = 0;
  const sandbox::ticket& ticket() const noexcept { return ticket_; }
  const std::string& run_id() const noexcept { return run_id_; }
  /// The request as submitted (never moved from: admission copies what it keeps).
  const run_request& request() const noexcept { return request_; }
  std::chrono::system_clock::time_point started() const noexcept { return started_; }
  /// What the runtime knows of the run (isolation, timeout, runtime), for spans.
  run_result known() const;

 private:
  struct completion {
    run_handler handler;
    boost::asio::any_completion_executor executor;
    boost::asio::any_completion_executor work;
  };
  std::optional<completion> take_locked();
  void on_backend_done(boost::system::error_code ec, run_result r) noexcept;
  /// Completes with operation_aborted now (posted). `lk` holds `mu_` and is released.
  void abort_locked(std::unique_lock<std::recursive_mutex>& lk, std::string_view message) noexcept;
  void finish(boost::system::error_code ec, run_result r, bool post) noexcept;
  void deliver(completion c, boost::system::error_code ec, run_result r, bool post) noexcept;
  run_result aborted_result(std::string_view message) const;
  void fill_known(run_result& r) const;
  /// Records what admission decided (level, image, clamped limits) for every later result,
  /// through `note_admitted` (sandbox/admission.hpp), which `fill_known` then copies.
  void remember_admitted(const admitted& adm);
  void start_impl();
  /// Step 2: every input blob exists for the tenant (their sizes into `sizes`), else the run
  /// is finished and false returned.
  bool check_inputs(const admitted& adm, std::vector<std::uint64_t>& sizes);
  /// Steps 3-4: the backend at the admitted level, then a scheduler slot, then `launch`.
  void proceed(admitted adm);
  /// Asks the approver about `adm` (a network run whose ticket lacks code.network).
  void ask_approval(const admitted& adm, const std::vector<std::uint64_t>& sizes);
  /// The approver answered (any thread): re-posted to the runtime's executor.
  void post_approval(boost::system::error_code ec, approval_decision d) noexcept;
  /// The approver's answer, on the runtime's executor.
  void on_approval(boost::system::error_code ec, approval_decision d) noexcept;
  void on_approval_impl(boost::system::error_code ec, approval_decision d);
  void launch(std::shared_ptr<backend> b, run_job job);

 public:
  /// Owned by the approver's handler (and only by it): the cancellation signal its slot is
  /// bound to (so the signal outlives the handler) and the run, weakly (an approver that
  /// keeps the handler never keeps the run or the runtime alive). Destroyed unanswered (the
  /// approver dropped the handler): the run ends as if deferred.
  struct approval_wait {
    boost::asio::cancellation_signal signal;
    std::weak_ptr<run_op> op;
    std::atomic<bool> answered{false};
    approval_wait() = default;
    approval_wait(const approval_wait&) = delete;
    approval_wait& operator=(const approval_wait&) = delete;
    ~approval_wait();
  };

 private:
  std::shared_ptr<runtime_impl> rt_;
  run_request request_;
  sandbox::ticket ticket_;
  std::string run_id_;
  std::chrono::system_clock::time_point started_;

  mutable std::recursive_mutex mu_;  // guards everything below (recursive: a backend that completes
                                     // inline, against its contract, must not deadlock us)
  std::optional<run_handler> handler_;
  boost::asio::any_completion_executor handler_ex_;
  boost::asio::any_completion_executor handler_work_;
  bool done_ = false;
  bool backend_started_ = false;
  std::optional<std::uint64_t> queued_id_;  ///< while waiting for a scheduler slot
  std::shared_ptr<scheduler::slot> slot_;   ///< held from dispatch until the backend ends
  boost::asio::cancellation_signal backend_cancel_;
  run_result known_;
  std::optional<approval_request> approval_;    ///< the question asked, once asked
  std::weak_ptr<approval_wait> approval_wait_;  ///< while the approver holds its handler
  /// Keeps the run alive while only the approver's (weak) handler refers to it; released
  /// when the run completes or the answer arrives. The runtime's shutdown aborts the run, which
  /// breaks this cycle.
  std::shared_ptr<run_op> awaiting_self_;
};

/// 16 random lowercase hex characters (getrandom).
std::string new_run_id();

/**
 * Starts an admitted session (src/runtime/session.cpp): its tracker (span, receipt), a
 * session place and a scheduler slot of the ticket's tenant held for its whole life, then the
 * backend's `open_session` with `job` (its argv used as is, its timeout the lifetime, cut to
 * the ticket's expiry). `handler` completes once, as `runtime::async_open_session` says.
 * Shared by registered-server sessions and interpreter sessions (sandbox/interpreter.hpp).
 */
void start_session(
    const std::shared_ptr<runtime_impl>& impl, const ticket& t, std::shared_ptr<backend> chosen,
    run_job job, std::chrono::milliseconds idle, std::uint32_t stdin_buffer_bytes,
    boost::asio::any_completion_handler<void(boost::system::error_code, session_start)> handler);

}  // namespace sandbox::detail
