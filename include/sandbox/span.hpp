// Observability: one span per run (OpenTelemetry-shaped attributes) and host log lines.
//
// Span attributes always present: `sandbox.run_id`, `sandbox.tenant`, `sandbox.ticket_id`,
// `sandbox.isolation`, `sandbox.timeout` (ms), `sandbox.runtime`, `sandbox.runtime_digest`,
// `error_code`, `sandbox.exit_code` (when exited), `sandbox.usage.setup_ms`,
// `sandbox.usage.wall_ms`, `sandbox.usage.cpu_ms`, `sandbox.usage.peak_memory_bytes`,
// `sandbox.egress_attempts`, `sandbox.oom_kills`.
// A session (sandbox/session.hpp) records one span named `sandbox.session` at its end, with
// the same attributes (`sandbox.timeout` is its maximum lifetime, `sandbox.usage.wall_ms` its
// life) plus `sandbox.session.end` (session_end's wire name), `sandbox.session.bytes_to_server`,
// `sandbox.session.bytes_from_server` and `sandbox.queue_wait_ms`; also for a session that
// never started (its `error_code` says why).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

namespace sandbox {

/// One finished run, as a span.
struct span {
  std::string name = "sandbox.run";
  std::chrono::system_clock::time_point start;
  std::chrono::system_clock::time_point end;
  std::map<std::string, std::variant<std::string, std::int64_t, bool>> attributes;
  bool operator==(const span&) const = default;
};

/// Receives spans. Called once per run, from the runtime's executor, after the result is
/// final and before the run's handler is invoked. Must not block for long; must not throw.
class span_sink {
 public:
  virtual ~span_sink() = default;
  virtual void record(const span& s) noexcept = 0;
};

/// A sink that appends each span as one JSON line to the file at `path` (opened with
/// O_APPEND; created mode 0600). Thread-safe. Returns nullptr if the file cannot be opened.
std::shared_ptr<span_sink> make_jsonl_span_sink(const std::string& path);

/// A sink that writes JSON lines to an already open descriptor it does not own (e.g. 2).
std::shared_ptr<span_sink> make_jsonl_span_sink(int fd);

/// The JSON form of a span as written by the JSON-lines sink (no trailing newline).
std::string to_json_line(const span& s);

/// Severity of host log lines.
enum class log_level : std::uint8_t { debug, info, warning, error };

/// Receives host log lines: these may name host paths, syscalls and errno (never shown to the
/// sandboxed code or put in results). Must be thread-safe.
using log_sink = std::function<void(log_level, std::string_view)>;

/// A log sink writing "agent-sandbox: <level>: <line>" to stderr for levels ≥ `min`.
log_sink make_stderr_log_sink(log_level min = log_level::warning);

}  // namespace sandbox
