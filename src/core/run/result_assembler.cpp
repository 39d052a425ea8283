// Making a run's result (result_assembler.hpp).
#include "core/run/result_assembler.hpp"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "core/run/collector.hpp"
#include "sandbox/admission.hpp"

namespace sandbox::detail {

void result_assembler::snapshot(run_cgroup* cg, const agent_channel* agent, const launched* l) {
  if (!cg) return;
  if (auto st = cg->stats()) {
    stats_.oom_kills = std::max(stats_.oom_kills, st->oom_kills);
    stats_.cpu_usage_usec = std::max(stats_.cpu_usage_usec, st->cpu_usage_usec);
    stats_.peak_memory_bytes = std::max(stats_.peak_memory_bytes, st->peak_memory_bytes);
    stats_.peak_is_sampled = st->peak_is_sampled;
    stats_.pids_limit_hits = std::max(stats_.pids_limit_hits, st->pids_limit_hits);
  }
  // A guest's own report (microvm): the host cgroup holds the VMM, whose figures are the
  // VM's; the program's are the guest cgroup's, as trustworthy as the guest kernel.
  if (agent) {
    if (auto u = agent->usage()) {
      stats_.oom_kills = std::max<std::uint64_t>(stats_.oom_kills, u->oom_kills);
      stats_.cpu_usage_usec = u->cpu_usec;
      stats_.peak_memory_bytes = u->memory_peak_bytes;
      stats_.peak_is_sampled = true;
    }
    return;
  }
  // The CPU time of processes that joined only the v1 hierarchies (crun and runsc on a
  // hybrid host: our figure comes from the unified cpu.stat).
  if (stats_.cpu_usage_usec == 0) {
    if (auto cpu = l ? l->cpu_usage_usec() : std::nullopt) stats_.cpu_usage_usec = *cpu;
  }
}

void result_assembler::store_streams(const run_job& job, bool started, stream_capture_buffer& out,
                                     stream_capture_buffer& err, run_result& r) {
  if (!started && (out.total_bytes() > 0 || err.total_bytes() > 0)) {
    std::string text = err.summary() + out.summary();
    while (!text.empty() && text.back() == '\n') text.pop_back();
    log_(log_level::warning, "before the program started: " + text);
    out = stream_capture_buffer(job.policy.stream_capture_bytes, job.policy.summary_bytes);
    err = stream_capture_buffer(job.policy.stream_capture_bytes, job.policy.summary_bytes);
  }
  store_stream(job, out, r.std_out, "stdout");
  store_stream(job, err, r.std_err, "stderr");
}

void result_assembler::store_stream(const run_job& job, const stream_capture_buffer& cap,
                                    stream_capture& s, const char* name) {
  s.summary = cap.summary();
  s.bytes = cap.stored().size();
  s.total_bytes = cap.total_bytes();
  s.truncated = cap.truncated();
  auto id = job.blobs->put(job.admitted.tenant, cap.stored());
  if (id) {
    s.blob = *id;
    return;
  }
  // Nothing stored: say so (no blob, no bytes) rather than pretend.
  log_(log_level::warning, std::string("storing ") + name + " failed: " + id.error().message());
  s.blob.clear();
  s.bytes = 0;
  s.truncated = s.total_bytes > 0;
  unstored_ += unstored_.empty() ? name : std::string(" and ") + name;
}

void result_assembler::collect(const run_job& job, int out_dir_fd, const agent_channel* agent,
                               const log_sink& host_log, run_result& r) {
  collect_limits lim{job.admitted.request.files_out.max_files,
                     job.admitted.request.files_out.max_bytes};
  auto c = collect_outputs(out_dir_fd, lim, *job.blobs, job.admitted.tenant, host_log);
  r.files_out = std::move(c.files);
  r.files_dropped = std::move(c.dropped);
  // A guest's own drops (microvm): entries it kept in the VM. One list in name order, as
  // the collector makes it on the host levels.
  if (!agent) return;
  auto guest = agent->dropped();
  if (guest.empty()) return;
  r.files_dropped.insert(r.files_dropped.end(), std::make_move_iterator(guest.begin()),
                         std::make_move_iterator(guest.end()));
  std::stable_sort(
      r.files_dropped.begin(), r.files_dropped.end(),
      [](const dropped_file& a, const dropped_file& b) { return a.name_display < b.name_display; });
}

int result_assembler::open_output_dir(const std::filesystem::path& dir) {
  out_dir_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  return out_dir_ ? 0 : errno;
}

run_result result_assembler::make(teardown_inputs in) {
  run_result r;
  const bool started = in.ev.started;
  store_streams(in.job, started, in.out, in.err, r);
  in.guest.note_shortfall(r);
  if (out_dir_ && in.collect) collect(in.job, out_dir_.get(), in.guest.agent(), in.host_log, r);
  out_dir_.reset();
  classify(in.job, in.backend, std::move(in.ev), in.times, in.idle_timeout, r);
  return r;
}

void result_assembler::classify(const run_job& job, std::string_view backend, run_evidence ev,
                                const run_times& t, std::chrono::milliseconds idle_timeout,
                                run_result& r) {
  const auto& req = job.admitted.request;
  r.run_id = job.run_id;
  note_admitted(r, job.admitted);
  r.backend = std::string(backend);
  ev.oom_kills = stats_.oom_kills;
  r.oom_kills = static_cast<std::uint32_t>(stats_.oom_kills);
  r.usage = measure_usage(ev, t, stats_);
  r.egress_attempts = ev.egress.attempts();
  r.egress_attempts_dropped = ev.egress.dropped();
  auto v = sandbox::detail::classify(ev, {.timeout = req.timeout,
                                          .idle_timeout = idle_timeout,
                                          .memory_limit_bytes = req.memory_limit_bytes});
  r.exit_code = v.exit_code;
  r.signal = v.signal;
  r.code = v.code;
  if (v.code != sandbox::code::ok) r.message = std::move(v.message);
  if (v.violation) r.violation = std::move(v.violation);
  if (v.supervisor_lost) {
    log_(log_level::error, "the sandbox's supervisor ended before the program did");
  }
  if (v.code == sandbox::code::pids_limit) {
    log_(log_level::warning, fmt::format("the sandbox ended at the run cgroup's pids limit ({} "
                                         "fork(s) refused, pids.events)",
                                         ev.pids_limit_hits));
  }
  if (!unstored_.empty()) {
    r.message += (r.message.empty() ? "" : "; ") + unstored_ +
                 " could not be stored (blob store quota or error)";
  }
}

}  // namespace sandbox::detail
