// `sandboxctl doctor`: which backends work on this host, and why not; host tuning hints.
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/cli_util.hpp"
#include "cli/verbs.hpp"

namespace sandboxctl {
namespace {

// Host tuning the operator may want (never applied by us: it is a host-wide kernel setting).
// Moving a process between cgroups takes a global lock whose write side waits for an RCU
// grace period unless some cgroup hierarchy is mounted with `favordynmods` (Linux ≥ 6.1;
// Documentation/admin-guide/cgroup-v2.rst); every run pays that wait once when it attaches.
void doctor_tuning_hints() {
  std::ifstream mounts("/proc/self/mounts");
  std::string dev, dir, type, opts, line;
  std::string cgroup2_dir;
  bool favored = false, any_cgroup = false;
  while (std::getline(mounts, line)) {
    std::istringstream in(line);
    if (!(in >> dev >> dir >> type >> opts)) continue;
    if (type != "cgroup" && type != "cgroup2") continue;
    any_cgroup = true;
    if (("," + opts + ",").find(",favordynmods,") != std::string::npos) favored = true;
    if (type == "cgroup2" && cgroup2_dir.empty()) cgroup2_dir = dir;
  }
  if (!any_cgroup || favored) return;
  std::cout << fmt::format(
      "hint: no cgroup hierarchy is mounted with favordynmods, so each run's cgroup attach waits "
      "for an RCU grace period (milliseconds on a busy host); as root: mount -o "
      "remount,favordynmods {} (see docs/operations.md, Tuning)\n",
      cgroup2_dir.empty() ? "<a cgroup mount>" : cgroup2_dir);
}

}  // namespace

int cmd_doctor(const std::vector<std::string>& args) {
  common_flags c;
  auto d = common_options(c);
  parse(args, d, {});
  auto statuses = sandbox::probe_backends(options_from(c));
  bool any = false;
  for (const auto& s : statuses) {
    std::cout << fmt::format("{:<10} {:<8} {}\n", to_string(s.isolation),
                             s.registered ? "ok" : "refused", s.reason);
    any = any || s.registered;
  }
  doctor_tuning_hints();
  return any ? exit_ok : exit_fail;
}

}  // namespace sandboxctl
