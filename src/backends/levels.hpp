// The one table of the built-in isolation levels (private to src/). crun's
// `custom-handler.c` is the model: one static table naming every handler. For each level it
// says which `sandbox::isolation` it serves, whether its backend was built into this library
// (the `SANDBOX_BACKEND_*` options), which runtime option enables it, and how its backend is
// made. The runtime registers its backends (`runtime::create`) and probes them
// (`probe_backends`, `sandboxctl doctor`) through this table alone; no other file above the
// backends names a level's factory.
//
// This room sits between the levels (src/backends/<level>) and the facade (src/runtime), and
// may not include `sandbox/runtime.hpp`: the runtime hands it the pieces of
// `runtime_options` the levels read as a `level_options`.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "core/run/machine.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/backend_options.hpp"
#include "sandbox/code.hpp"

namespace sandbox::detail {

/// The pieces of `runtime_options` (sandbox/runtime.hpp) the built-in levels read, filled by
/// the runtime: for registration from its own state, for a probe with a throwaway executor.
struct level_options {
  /// What every level's backend gets: the executor its runs' timers and I/O use, the process
  /// level's options (cgroup parent and root, uid range, and that level's warm pools, which
  /// the other levels replace with their own), the state directory, the log, the policy and
  /// the runtime resolver for warm-pool templates, the egress proxy's options.
  run_machine_context context;
  bool process = true;              ///< `runtime_options::process_backend`
  oci_backend_options container;    ///< `runtime_options::container` (crun or runc)
  oci_backend_options gvisor;       ///< `runtime_options::gvisor` (runsc)
  microvm_backend_options microvm;  ///< `runtime_options::microvm`
};

/// What a level's factory gives: its backend, once the start-up self-test passed on this
/// host, or a one-line reason naming what is missing.
using level_made = std::variant<std::shared_ptr<backend>, std::string>;

/// One built-in level: a row of the table. Plain data and function pointers; immutable.
struct builtin_level {
  sandbox::isolation isolation;  ///< the level its backend serves
  std::string_view name;         ///< the level's name, as `to_string(isolation)`
  /// The CMake option that builds its backend into the library, e.g. "SANDBOX_BACKEND_OCI".
  std::string_view build_option;
  bool built;  ///< whether `build_option` was ON for this library
  /// The runtime option that enables it, as messages name it, e.g.
  /// "runtime_options::process_backend" or "runtime_options::gvisor.enabled".
  std::string_view enabled_by;
  /// Enabled unless the host turns it off (the process level); the others are off unless the
  /// host turns them on. A probe lists a level that is off only when it is on by default.
  bool on_by_default;
  /// Whether `o` enables the level.
  bool (*enabled)(const level_options& o);
  /// The name its status carries under `o`: the level's, or the OCI runtime's ("crun").
  std::string (*backend_name)(const level_options& o);
  /// Makes the backend under `o`: runs the level's factory (`make_process_backend`,
  /// `make_oci_backend`, `make_microvm_backend`), and so its self-test. Called only when
  /// `built`; may throw (`try_level` turns that into a refusal).
  level_made (*make)(const level_options& o);
};

/// The built-in levels, weakest first (the order of `sandbox::isolation`), each exactly once.
/// Thread-safe (a static table).
std::span<const builtin_level> builtin_levels() noexcept;

/// What became of trying one level: its status and, only when `status.registered`, the
/// backend, which the caller owns (and must `shutdown()` if it does not keep it).
struct level_attempt {
  backend_status status;
  std::shared_ptr<backend> made;
};

/**
 * Tries `l` under `o` (whether `o` enables it is the caller's question): a level not built
 * into this library is refused with "not built into this library (<build option>=OFF)";
 * otherwise its factory runs its self-test on `o.context.executor`. A factory that returns
 * no backend, a backend of another level (shut down here), an empty reason, or an exception
 * ("self-test threw: ...") becomes a refusal with a reason. Blocks for the self-test; as
 * thread-safe as the factories are. Throws only `std::bad_alloc` (building the status).
 */
level_attempt try_level(const builtin_level& l, const level_options& o);

/// The status a probe reports for a level that is on by default and that `o` turned off:
/// "disabled (<enabled_by> is false)". Throws only `std::bad_alloc`.
backend_status disabled_status(const builtin_level& l, const level_options& o);

}  // namespace sandbox::detail
