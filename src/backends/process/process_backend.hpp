// The process backend's factory (private to src/): namespaces + cgroup + seccomp, with
// `sandbox-init` as PID 1 of every run, spawned by the host itself. The run machine is
// shared with the OCI backends (core/run/machine.hpp). See docs/architecture.md.
#pragma once

#include <memory>
#include <string>
#include <variant>

#include "core/run/machine.hpp"

namespace sandbox::detail {

/// What the runtime hands the process backend.
using process_backend_context = run_machine_context;

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
