// A scripted backend for unit-testing tools that call the sandbox (target `sandbox::testing`).
//
// It starts no process: each run is answered by the first rule whose matcher accepts the
// request, and every request it saw is recorded. It can produce every code, including the
// ones only real sandboxes produce (`timeout`, `oom`, `seccomp_violation`,
// `network_disabled`), so a tool's error handling can be tested without a kernel.
//
//   auto fake = std::make_shared<sandbox::testing::fake_backend>();
//   fake->on_source_contains("urlopen").respond(sandbox::testing::result_with(
//       sandbox::code::network_disabled, {.std_out = "", .std_err = "URLError\n"}));
//   fake->otherwise().respond_stdout("42\n");
//   auto rt = sandbox::testing::make_runtime(fake);   // memory blob store, fake runtimes
//   auto r = rt->run(request, ticket);                 // r.std_out.summary == "42\n"
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/backend.hpp"
#include "sandbox/runtime.hpp"

namespace sandbox::testing {

/// Scripted outcome: what the fake "ran". Streams and output files are stored as blobs in the
/// runtime's blob store, so results look exactly like real ones.
struct scripted_run {
  sandbox::code code = sandbox::code::ok;
  std::string message;
  std::optional<int> exit_code = 0;
  std::optional<int> signal;
  std::string std_out;
  std::string std_err;
  std::vector<std::pair<std::string, std::string>> files_out;  ///< name → content
  std::vector<dropped_file> files_dropped;
  std::vector<egress_attempt> egress_attempts;
  std::optional<std::string> violation;
  std::uint32_t oom_kills = 0;
  run_usage usage;
  /// How long the fake "runs" before completing (default 0: it completes on the next turn of
  /// the executor). A run holding here ends early, with `operation_aborted`, when it is
  /// cancelled or its runtime is destroyed.
  std::chrono::milliseconds delay{0};
};

/// A scripted outcome with `code` (and a matching default message / signal).
scripted_run result_with(sandbox::code code, scripted_run base = {});

/// A backend answering from rules. Thread-safe.
class fake_backend : public backend {
 public:
  /// One rule: a matcher and what to answer. Set rules up before the runs they answer
  /// start: a rule's setters are not synchronized with runs in flight.
  class rule {
   public:
    /// Answers matching requests with `run`.
    rule& respond(scripted_run run);
    /// Answers with `stdout_text` on stdout, exit code 0.
    rule& respond_stdout(std::string stdout_text);
    /// Computes the answer from the admitted request (e.g. echo an input file back).
    rule& respond_with(std::function<scripted_run(const admitted&)> fn);
    /// Matches only the first `n` requests, then lets later rules answer.
    rule& times(std::size_t n);

   private:
    friend class fake_backend;
    std::function<bool(const admitted&)> matcher_;
    std::function<scripted_run(const admitted&)> answer_;
    std::size_t remaining_ = static_cast<std::size_t>(-1);
  };

  explicit fake_backend(sandbox::isolation level = sandbox::isolation::microvm);

  /// A rule for requests accepted by `matcher`. Rules are tried in the order added.
  rule& on(std::function<bool(const admitted&)> matcher);
  /// A rule for requests whose source contains `needle`.
  rule& on_source_contains(std::string needle);
  /// The rule used when no other matches (default: `ok`, empty output).
  rule& otherwise();

  /// Every request this backend ran, in order (admitted form: clamped limits, tenant).
  std::vector<admitted> requests() const;

  sandbox::isolation isolation() const noexcept override { return level_; }
  std::string_view name() const noexcept override { return "fake"; }
  /// Does nothing: the fake holds no process. A run held by its `delay` ends when it is
  /// cancelled (the runtime cancels every run in flight when it is destroyed).
  void shutdown() noexcept override {}

 private:
  void do_execute(run_job job,
                  boost::asio::any_completion_handler<void(boost::system::error_code, run_result)>
                      handler) override;
  sandbox::isolation level_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<rule>> rules_;
  rule fallback_;
  std::vector<admitted> seen_;
};

/// Fake image digests used by `make_runtime` for "python3" and "node".
std::string fake_digest(std::string_view runtime_name);

/**
 * A runtime with an in-memory blob store, no image store, runtimes "python3" and "node"
 * (digests from `fake_digest`), and `fake` registered as its only backend (a microvm-level
 * fake serves every ticket level). Runs on a private io_context thread. `approver`, when
 * set, is installed as `runtime_options::approver` (to test a tool's approval flow).
 */
result<runtime> make_runtime(std::shared_ptr<fake_backend> fake, sandbox::policy policy = {},
                             std::shared_ptr<sandbox::approver> approver = nullptr);

}  // namespace sandbox::testing
