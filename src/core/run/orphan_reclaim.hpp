// The start-up reclaim of what crashed hosts left behind (private to src/).
#pragma once

#include <filesystem>
#include <string>

#include "core/run/cgroup.hpp"
#include "core/run/launcher.hpp"
#include "sandbox/span.hpp"

namespace sandbox::detail {

/// Where the reclaim looks, and who it is.
struct reclaim_scope {
  const std::filesystem::path& state_dir;  ///< the backend's state directory
  const std::string& instance_id;          ///< this backend instance's id (alive, never reclaimed)
  const cgroup_host& cgroups;              ///< the run cgroups' parent
  launcher& l;                             ///< told to reclaim its own (`launcher::start`)
  const log_sink& log;                     ///< host log lines (may be empty)
};

/**
 * Reclaims run cgroups and work dirs of hosts that died: an instance is dead when its lock
 * file in the state directory's `instances/` can be locked (flock is released when its
 * process dies). Cgroups of instances without a lock here belong to hosts using another
 * state directory (possibly alive): they are left alone. A launcher's host mount in a work
 * dir (the OCI output tmpfs) is detached first, so the removal never crosses into another
 * filesystem. Then the launcher reclaims its own (`launcher::start`, told which instances
 * are alive), and the dead instances' lock files go. Best effort: failures are logged.
 * Called once, at start-up, before any run.
 */
void reclaim_orphans(const reclaim_scope& s);

}  // namespace sandbox::detail
