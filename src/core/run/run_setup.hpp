// The first half of a run's setup (private to src/): host resources, channels and the launch
// of sandbox-init, up to the point where the run wires the channels to its own objects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/run/cgroup.hpp"
#include "core/run/control_channel.hpp"
#include "core/run/evidence.hpp"
#include "core/run/launcher.hpp"
#include "core/run/run_resources.hpp"
#include "core/run/session_stdio.hpp"
#include "sandbox/backend.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/// What `run_setup::launch` made, for the run to wire up.
struct launch_outcome {
  unique_fd ctl;       ///< the host end of the control channel; none when setup failed before
  unique_fd out, err;  ///< the host (read) ends of the program's stdout and stderr
  /// `stdio_over_control`: the write ends, sent to sandbox-init with the configuration
  /// (`a` = 1); none otherwise (the launcher handed them to sandbox-init itself).
  unique_fd child_out, child_err;
  std::unique_ptr<launched> made;  ///< what the launch made; null when setup failed
  std::string error;               ///< why setup failed (host log only); empty when it did not
};

/// How staging a run's inputs went (`run_setup::stage`).
struct staging_outcome {
  enum class kind {
    ok,
    blob_missing,     ///< an input blob vanished from the store (`index`)
    digest_mismatch,  ///< a stored blob's content is not what its id names (`index`)
    failed,           ///< any other failure (`error`, host log only)
  } what = kind::ok;
  std::size_t index = 0;  ///< the files_in entry
  std::string error;

  /// Writes what the caller can act on into the run's evidence `ev` — a missing blob, a
  /// damaged blob store (the content on disk is not what the id names: a host fault, logged
  /// as an error through `log`, but one the field is named for) — after which the run ends.
  /// Returns a setup failure's text (host log only), or empty.
  std::string note(run_evidence& ev,
                   const std::function<void(log_level, const std::string&)>& log) const;
};

/// What a run's `config` and `go` carry besides its job and the launcher's traits.
struct program_facts {
  bool selftest = false;          ///< the start-up self-test's probe run
  bool session = false;           ///< a session run
  std::uint32_t uid = 0;          ///< the program's uid and gid
  bool userns = false;            ///< the run has a user namespace (unprivileged host)
  bool network = false;           ///< is_network_granted
  bool proxy_served = false;      ///< the host serves the run's egress proxy
  std::string_view run_ca_pem{};  ///< a run with secrets: its CA certificate (go_params)
};

/**
 * Steps 0–5 of a run's setup, in order: 0. the shared lock on the image, 1. the uid, 2. the
 * run cgroup with its limits (before any process exists), 3. the workspace skeleton, 4. the
 * channels (control socket, stdout/stderr pipes or sockets, a session's stdin pipe in pipe
 * mode) and the inputs' unpredictable directory name, 5. the launcher starts sandbox-init in
 * the run's namespaces and cgroup. What it acquires goes to the run's `run_resources` at
 * once (removed with the rest at teardown, whatever happens later).
 *
 * Then, on the run's control channel: the configuration (step 7), the inputs staged into the
 * workspace at activation, and the program (`go`).
 *
 * It owns the names the run's resources carry: the instance id (a warm-pool instance keeps
 * its template's), the cgroup's path and the inputs' directory name. Not thread-safe (the
 * run's strand); no asynchronous operation.
 */
class run_setup {
 public:
  /// What the backend shares with its runs' setup (outlives the call).
  struct host {
    launcher& l;
    const launcher_traits& traits;
    cgroup_host& cgroups;
    const std::string& cgroup_parent;        ///< e.g. "/agent-sandbox"
    const std::string& backend_instance_id;  ///< names the run cgroups of this backend
    const std::filesystem::path& runs_dir;   ///< the workspaces' parent
  };

  /**
   * Runs steps 0–5 for `job`. `stdin_pipe`: a session in pipe mode (its stdin pipe is made
   * with the channels), else nullptr. `times` gets the cgroup and workspace steps' times.
   * On failure `error` says why; `ctl` (and the stream ends) are set only once the channels
   * exist, so that the run still reads what a failed launch wrote (its host log shows it).
   */
  launch_outcome launch(const host& h, run_resources& res, const run_job& job, bool selftest,
                        bool network, session_stdio* stdin_pipe, run_times& times);

  /// Step 7: sends the configuration (init_messages.hpp), with `stdio_fds` (the program's
  /// stdout and stderr) when the launcher left them to sandbox-init. `launcher_entries`: the
  /// launch's own configuration entries. Returns why it failed, or empty.
  std::string send_config(control_channel& ctl, const run_job& job, const program_facts& f,
                          std::string_view launcher_entries, std::span<const int> stdio_fds);
  /// Stages the program text (or a tool run's stdin) and the input files into `ws`.
  staging_outcome stage(const run_workspace& ws, const run_job& job);
  /// Sends the program (`go`); a session's program gets its stdin (`stdio`: in pipe mode the
  /// pipe's read end goes along and, sent or not, is closed here after). Returns why it
  /// failed, or empty — without sending anything for a network run on a stream-controlled
  /// instance whose host does not serve the proxy (it has no network namespace of its own).
  std::string send_go(control_channel& ctl, const run_job& job, const launcher_traits& t,
                      const program_facts& f, session_stdio& stdio);

  /// "in-<16 hex>": the inputs' directory under /sandbox (set by `launch`, step 4).
  const std::string& input_name() const noexcept { return input_name_; }

 private:
  std::string instance_id_;  ///< names the cgroup and workspace (the template's run id)
  std::string cgroup_path_;  ///< the run cgroup's path inside each hierarchy
  std::string input_name_;
};

}  // namespace sandbox::detail
