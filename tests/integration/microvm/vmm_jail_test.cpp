// The VMM's confinement, seen from outside while a run is live: QEMU's root is the prepared
// VMM root (its executable, libraries, firmware, /dev/null, a procfs of its own pid
// namespace), read-only; no other host path is visible to it.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "integration/microvm/microvm_harness.hpp"

namespace fs = std::filesystem;
using sandbox::code;

namespace {

// Is `p` (a path inside the VMM's root) one of the files the root may hold?
bool allowed_file(const std::string& p) {
  if (p == "/dev/null" || p == "/dev/kvm") return true;
  if (p.rfind("/usr/", 0) != 0 && p.rfind("/lib", 0) != 0) return false;
  const auto name = fs::path(p).filename().string();
  if (p.find("/bin/qemu-system-") != std::string::npos) return true;  // the executable
  if (p.find("/share/qemu/") != std::string::npos)                    // the microvm firmware
    return name == "bios-microvm.bin" || name == "qboot.rom";
  return name.find(".so") != std::string::npos;  // the loader, libraries, the TCG module
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

}  // namespace

TEST_CASE("microvm: the VMM sees only its own root (no host path, read-only, own procfs)",
          "[microvm]") {
  // A marker the VMM must not see, in a directory every run can traverse.
  const std::string marker = "/tmp/mvtest-vmm-marker-" + std::to_string(::getpid());
  { std::ofstream(marker) << "host"; }
  sandbox::run_request base;
  base.timeout = mvtest::must_finish();
  sandbox::run_result r;
  std::thread runner(
      [&] { r = mvtest::run("import time\ntime.sleep(3)\nprint('slept')\n", base); });
  // The VMM's root is switched before QEMU's exec, and it joins the run cgroup before that:
  // once a qemu-system process is in this backend's run cgroup, its view is final.
  int pid = -1;
  for (int i = 0; i < 1200 && pid < 0; ++i) {
    auto pids = mvtest::vmm_pids();
    if (!pids.empty())
      pid = pids.front();
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<std::string> files, mounts;
  std::string status, proc_entries;
  bool host_paths_absent = true, marker_absent = true;
  if (pid > 0) {
    const fs::path root = fs::path("/proc") / std::to_string(pid) / "root";
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(root, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      auto rel = "/" + it->path().lexically_relative(root).string();
      if (rel == "/proc") it.disable_recursion_pending();
      if (it->is_symlink(ec) || it->is_directory(ec)) continue;
      files.push_back(rel);
    }
    for (const char* p : {"/etc/passwd", "/etc", "/home", "/root", "/var/lib/agent-sandbox", "/tmp",
                          "/sys", "/run", "/usr/bin/python3", "/usr/bin/env"}) {
      struct stat st {};
      if (::lstat((root.string() + p).c_str(), &st) == 0) {
        UNSCOPED_INFO("visible to the VMM: " << p);
        host_paths_absent = false;
      }
    }
    struct stat st {};
    marker_absent = ::lstat((root.string() + marker).c_str(), &st) != 0;
    for (const auto& e : fs::directory_iterator(root / "proc", ec)) {
      proc_entries += e.path().filename().string() + " ";
    }
    std::istringstream mi(read_text(fs::path("/proc") / std::to_string(pid) / "mountinfo"));
    for (std::string line; std::getline(mi, line);) {
      // id parent major:minor root mountpoint options ...
      std::istringstream f(line);
      std::string id, parent, dev, mroot, point, opts;
      f >> id >> parent >> dev >> mroot >> point >> opts;
      mounts.push_back(point + " " + opts.substr(0, opts.find(',')));
    }
    status = read_text(fs::path("/proc") / std::to_string(pid) / "status");
  }
  runner.join();
  fs::remove(marker);

  REQUIRE(pid > 0);
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "slept\n");
  INFO("files in the VMM's root: " << files.size());
  for (const auto& f : files) {
    INFO(f);
    CHECK(allowed_file(f));
  }
  CHECK(std::find(files.begin(), files.end(), "/dev/null") != files.end());
  CHECK(std::count_if(files.begin(), files.end(), [](const std::string& f) {
          return f.find("/bin/qemu-system-") != std::string::npos;
        }) == 1);
  CHECK(host_paths_absent);
  CHECK(marker_absent);
  // Its procfs is its own pid namespace's, pids only: QEMU is pid 1 there.
  INFO("/proc of the VMM: " << proc_entries);
  CHECK(proc_entries.find("1 ") != std::string::npos);
  CHECK(proc_entries.find("sys ") == std::string::npos);
  CHECK(proc_entries.find("kcore ") == std::string::npos);
  CHECK(proc_entries.find("meminfo ") == std::string::npos);
  // Mounts: the root read-only, /dev/null (and /dev/kvm under KVM) read-only, /proc.
  std::sort(mounts.begin(), mounts.end());
  INFO("mounts: " << [&] {
    std::string s;
    for (const auto& m : mounts) s += m + "; ";
    return s;
  }());
  CHECK(std::find(mounts.begin(), mounts.end(), "/ ro") != mounts.end());
  CHECK(std::find(mounts.begin(), mounts.end(), "/dev/null ro") != mounts.end());
  CHECK(std::find(mounts.begin(), mounts.end(), "/proc rw") != mounts.end());
  for (const auto& m : mounts) {
    const auto point = m.substr(0, m.find(' '));
    CHECK((point == "/" || point == "/dev/null" || point == "/dev/kvm" || point == "/proc"));
  }
  // Still the run's uid (not root) with no_new_privs.
  CHECK(status.find("\nUid:\t0\t") == std::string::npos);
  CHECK(status.find("NoNewPrivs:\t1") != std::string::npos);
}
