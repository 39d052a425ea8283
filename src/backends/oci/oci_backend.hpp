// The OCI backends' factory (private to src/): `container` (crun, runc) and `gvisor` (runsc).
// sandbox-init runs as the container's process, started by the OCI runtime from a bundle
// generated per run (bundle.hpp); everything else of a run is the shared machine of
// core/run/machine.hpp. See docs/architecture.md, "OCI backends".
#pragma once

#include <memory>
#include <string>
#include <variant>

#include "core/run/machine.hpp"
#include "sandbox/backend_options.hpp"

namespace sandbox::detail {

/**
 * Checks the runtime binary (absolute path, executable, `--version` answers), then runs the
 * shared start-up self-test through it and returns the backend, or a one-line reason: "runsc
 * not found at /usr/bin/runsc", "crun: needs root", a self-test failure. `ctx.options` are
 * the process backend's (cgroup parent/root, uid range); the warm pools are `oci`'s.
 */
std::variant<std::shared_ptr<backend>, std::string> make_oci_backend(
    const run_machine_context& ctx, const oci_backend_options& oci);

}  // namespace sandbox::detail
