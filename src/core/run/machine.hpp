// The run machine (private to src/): the backend of every level, all of which run the
// program under sandbox-init. The process level, the OCI levels (container: crun, runc;
// gvisor: runsc) and the microvm level share everything of a run's life — cgroup, uid,
// workspace, the control channel, capture, evidence, deadlines, kill-and-confirm, output
// collection, classification, warm pools — and differ only in how sandbox-init is started:
// a `launcher` (launcher.hpp). See docs/architecture.md.
#pragma once

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "core/egress/egress_proxy.hpp"
#include "core/run/cgroup.hpp"
#include "core/run/init_messages.hpp"
#include "core/run/launcher.hpp"
#include "core/run/self_test_cache.hpp"
#include "core/run/workspace.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/backend_options.hpp"
#include "sandbox/span.hpp"
#include "wire/init_protocol.hpp"

namespace sandbox::detail {

/// What the runtime hands a backend built on sandbox-init.
struct run_machine_context {
  boost::asio::any_io_executor executor;  ///< timers and I/O of every run
  process_backend_options options;        ///< cgroup parent/root, uid range, warm pools
  std::filesystem::path state_dir;        ///< per-host runtime state (work dirs, locks)
  log_sink log;                           ///< host log lines
  sandbox::policy policy;                 ///< limits of warm-pool instances
  /// Runtime name → its spec and unpacked image root (for warm-pool templates); nullopt when
  /// the runtime or its image is unavailable.
  std::function<std::optional<std::pair<runtime_spec, std::filesystem::path>>(std::string_view)>
      resolve_runtime;
  egress_proxy_options egress;  ///< network runs' egress proxy
  /// The mount table the cgroup layout is read from. Tests point it (with
  /// `options.cgroup_root`) at a fake cgroupfs to see the self-test refuse a weak host.
  std::filesystem::path mountinfo = "/proc/self/mountinfo";
  /// Reuse a pass of the start-up self-test recorded on this boot under the same key
  /// (self_test_cache.hpp) instead of testing again. False: always test, and record a pass
  /// (`probe_backends`, so `sandboxctl doctor`; `runtime_options::reuse_self_test_verdict`).
  bool reuse_self_test_verdict = true;
  /// What the level's self-test depends on besides the run machine's own key parts: its
  /// binaries and configuration. Filled by the level's factory.
  self_test_dependencies self_test_deps;
};

/**
 * Opens the state directory (a subdirectory per backend name), the cgroups and the uid
 * pool, reclaims what crashed hosts left behind, runs the start-up self-test through
 * `launcher` (a real sandbox: the probe checks uid, capabilities, no_new_privs, seccomp,
 * and that an egress attempt is recorded) — or reuses a pass recorded on this boot under
 * the same key (`ctx.reuse_self_test_verdict`, self_test_cache.hpp) — and returns the
 * backend, or a one-line reason.
 */
std::variant<std::shared_ptr<backend>, std::string> make_run_machine(const run_machine_context& ctx,
                                                                     std::shared_ptr<launcher> l);

/// A descriptor of the sandbox-init executable: a sealed memfd holding the copy built into
/// the library, or `path` opened O_PATH when given. -1 on failure.
int open_init_executable(const std::filesystem::path& path);

/// Writes `content` to an existing file (no create); false on any failure.
bool write_existing_file(const std::string& path, std::string_view content);

}  // namespace sandbox::detail
