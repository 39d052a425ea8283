// The start-up reclaim of what crashed hosts left behind (orphan_reclaim.hpp).
#include "core/run/orphan_reclaim.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <set>
#include <system_error>

#include "core/run/workspace.hpp"

namespace sandbox::detail {

void reclaim_orphans(const reclaim_scope& s) {
  auto instances = s.state_dir / "instances";
  // 1 dead, 0 alive, -1 unknown (no lock file here).
  auto liveness = [&](const std::string& inst) {
    if (inst == s.instance_id) return 0;
    auto lock = instances / (inst + ".lock");
    int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    bool dead = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    ::close(fd);
    return dead ? 1 : 0;
  };
  auto is_dead = [&](const std::string& inst) { return liveness(inst) == 1; };
  std::set<std::string> dead;
  for (const auto& name : s.cgroups.list()) {
    // r-<instance>-<run>
    if (name.size() < 3 || name.compare(0, 2, "r-") != 0) continue;
    auto dash = name.find('-', 2);
    if (dash == std::string::npos) continue;
    std::string inst = name.substr(2, dash - 2);
    if (!is_dead(inst)) continue;
    dead.insert(inst);
    if (auto d = s.cgroups.destroy(name); !d && s.log) {
      s.log(log_level::warning, "could not reclaim orphaned cgroup " + name);
    } else if (s.log) {
      s.log(log_level::info, "reclaimed orphaned cgroup " + name);
    }
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(s.state_dir / "runs", ec)) {
    std::string inst = e.path().filename().string();
    if (liveness(inst) != 0) {  // every live instance of this state dir holds its lock
      // A launcher's host mount in a work dir (the OCI output tmpfs) goes first: the removal
      // never crosses into another filesystem.
      for (const auto& run : std::filesystem::directory_iterator(e.path(), ec)) {
        ::umount2((run.path() / "out").c_str(), MNT_DETACH | UMOUNT_NOFOLLOW);
      }
      remove_tree(e.path());
      dead.insert(inst);
    }
  }
  s.l.start(s.instance_id, [&](const std::string& inst) { return liveness(inst) == 0; });
  for (const auto& inst : dead) ::unlink((instances / (inst + ".lock")).c_str());
}

}  // namespace sandbox::detail
