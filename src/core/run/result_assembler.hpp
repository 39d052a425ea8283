// Making a run's result (private to src/): once every process is dead, the run's captures,
// output directory, usage figures and evidence become its `run_result`.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "core/run/capture.hpp"
#include "core/run/cgroup.hpp"
#include "core/run/evidence.hpp"
#include "core/run/guest_link.hpp"
#include "core/run/launcher.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/span.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/**
 * Assembles one run's result: the usage figures (the largest seen: `snapshot`), the
 * program's streams stored as blobs before any output file (a program must not crowd its
 * own stdout/stderr out of the tenant's quota with files), the output files, and the
 * classification of the run's evidence (evidence.hpp `classify`) with admission's facts
 * (`note_admitted`) and the launcher's description.
 *
 * It owns the usage figures and the list of streams that could not be stored; the run owns
 * the captures, the evidence and the timestamps and hands them in. Not thread-safe (the
 * run's strand).
 */
class result_assembler {
 public:
  /// The run's host log (lines are prefixed with the run id there).
  using log_fn = std::function<void(log_level, const std::string&)>;

  explicit result_assembler(log_fn log) : log_(std::move(log)) {}

  /// Opens the output directory the launcher made on the host and holds it. Returns 0, or
  /// the errno.
  int open_output_dir(const std::filesystem::path& dir);
  /// sandbox-init's descriptor of the output tmpfs (`ready`): held unless a directory is
  /// held already (the launcher's host directory is the one).
  void offer_output_dir(unique_fd dir) {
    if (!out_dir_) out_dir_ = std::move(dir);
  }
  /// Closes the output directory (nothing is collected from it).
  void close_output_dir() noexcept { out_dir_.reset(); }

  /// Keeps the largest figures seen of `cg` (nullptr: none left), or a guest agent's own
  /// report (microvm: the host cgroup holds the VMM), or the launcher's CPU figure when the
  /// cgroup had none (processes that joined only v1 hierarchies). A later read may find the
  /// cgroup removed (an OCI runtime deletes it when it exits) or its counters no larger.
  void snapshot(run_cgroup* cg, const agent_channel* agent, const launched* l);
  /// The figures kept so far.
  const cgroup_stats& stats() const noexcept { return stats_; }

  /// Stores both streams as blobs of the job's tenant into `r`. `started` false: nothing of
  /// the program ran, so what came through the pipes is the launcher's (an OCI runtime's
  /// error names host paths): it goes to the host log and the captures are emptied first.
  void store_streams(const run_job& job, bool started, stream_capture_buffer& out,
                     stream_capture_buffer& err, run_result& r);
  /// Collects the output files from `out_dir_fd` into `r` (with the guest's own drops, in
  /// name order, when `agent` reported some). `host_log`: the collector's log.
  void collect(const run_job& job, int out_dir_fd, const agent_channel* agent,
               const log_sink& host_log, run_result& r);
  /// What the run hands in to make its result once every process is dead.
  struct teardown_inputs {
    const run_job& job;
    std::string_view backend;    ///< the launcher's description
    stream_capture_buffer& out;  ///< the program's stdout capture (emptied if not started)
    stream_capture_buffer& err;  ///< its stderr capture (likewise)
    const guest_link& guest;     ///< the guest agent's report and the streams' shortfall
    bool collect;                ///< collect the outputs (false: the teardown failed)
    const log_sink& host_log;    ///< the collector's log
    run_evidence ev;             ///< what the run saw (`ev.started`: the program ran)
    const run_times& times;
    std::chrono::milliseconds idle_timeout;  ///< a session's, for the message
  };
  /// The result of a run, in this order: the streams (`store_streams`; before any output
  /// file), the guest's stream shortfall, the output files (`collect`, from the output
  /// directory held, which is closed then), the classification (`classify`).
  run_result make(teardown_inputs in);

  /// Classifies `ev` into `r` (run id, admission's facts, `backend`, usage, egress, code,
  /// message, exit code or signal, violation), and notes streams that could not be stored.
  /// `ev.oom_kills` is taken from the kept figures.
  void classify(const run_job& job, std::string_view backend, run_evidence ev, const run_times& t,
                std::chrono::milliseconds idle_timeout, run_result& r);

 private:
  void store_stream(const run_job& job, const stream_capture_buffer& cap, stream_capture& s,
                    const char* name);

  log_fn log_;
  unique_fd out_dir_;  ///< the output directory the outputs are collected from
  cgroup_stats stats_;
  std::string unstored_;  ///< streams that could not be stored ("stdout and stderr")
};

}  // namespace sandbox::detail
