// The process backend's factory (private to src/): namespaces + cgroup + seccomp, with
// `sandbox-init` as PID 1 of every run. See docs/architecture.md.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "sandbox/backend.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/span.hpp"

namespace sandbox::detail {

/// What the runtime hands the process backend.
struct process_backend_context {
  boost::asio::any_io_executor executor;  ///< timers and I/O of every run
  process_backend_options options;
  std::filesystem::path state_dir;  ///< per-host runtime state (work dirs, locks)
  log_sink log;                     ///< host log lines
  sandbox::policy policy;           ///< limits of warm-pool instances
  /// Runtime name → its spec and unpacked image root (for warm-pool templates); nullopt when
  /// the runtime or its image is unavailable.
  std::function<std::optional<std::pair<runtime_spec, std::filesystem::path>>(std::string_view)>
      resolve_runtime;
};

/**
 * Runs the start-up self-test (a real sandbox: namespaces, /proc, cgroup limits, seccomp
 * with user notification, privilege drop) and returns the backend, or — when a guarantee
 * cannot be had on this host — a one-line reason naming the missing capability. Before the
 * self-test it reclaims what crashed earlier hosts left behind (their run cgroups and work
 * dirs; a host is known dead when its lock in `state_dir` is free).
 */
std::variant<std::shared_ptr<backend>, std::string> make_process_backend(
    const process_backend_context& ctx);

}  // namespace sandbox::detail
