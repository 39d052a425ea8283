// A fake cgroupfs for unit tests: plain files in a temp dir, plus a `sys::ops` that adds
// what plain files cannot do. `mkdir` under a fake mount fills the new directory with the
// control files a kernel would show (from a per-mount template); `rmdir` refuses a
// "populated" directory (cgroup.procs not empty) with EBUSY and otherwise deletes the control
// files first; `kill` never signals anything, it records the call and runs a hook. Every
// write is recorded as (path, bytes), in order, so tests assert exactly what went where.
// Errors are injected per path and call.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "sys/sys.hpp"
#include "unit/test_files.hpp"

namespace sandbox::test {

namespace fs = std::filesystem;

/// Control files of a fresh cgroup2 directory with memory, pids and cpu enabled (6.x).
inline std::vector<std::pair<std::string, std::string>> v2_template() {
  return {
      {"cgroup.controllers", "cpu memory pids\n"},
      {"cgroup.subtree_control", ""},
      {"cgroup.procs", ""},
      {"cgroup.events", "populated 0\nfrozen 0\n"},
      {"cgroup.freeze", "0\n"},
      {"cgroup.kill", ""},
      {"cgroup.type", "domain\n"},
      {"memory.max", "max\n"},
      {"memory.swap.max", "max\n"},
      {"memory.oom.group", "0\n"},
      {"memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"},
      {"memory.current", "0\n"},
      {"memory.peak", "0\n"},
      {"pids.max", "max\n"},
      {"pids.current", "0\n"},
      {"cpu.max", "max 100000\n"},
      {"cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"},
  };
}

/// Control files of the hybrid layout's cgroup2 directory (no controllers).
inline std::vector<std::pair<std::string, std::string>> unified_template() {
  return {
      {"cgroup.controllers", ""},
      {"cgroup.subtree_control", ""},
      {"cgroup.procs", ""},
      {"cgroup.events", "populated 0\nfrozen 0\n"},
      {"cgroup.freeze", "0\n"},
      {"cgroup.kill", ""},
      {"cpu.stat", "usage_usec 0\nuser_usec 0\nsystem_usec 0\n"},
  };
}

inline std::vector<std::pair<std::string, std::string>> v1_memory_template() {
  return {
      {"cgroup.procs", ""},
      {"cgroup.event_control", ""},
      {"memory.limit_in_bytes", "9223372036854771712\n"},
      {"memory.memsw.limit_in_bytes", "9223372036854771712\n"},
      {"memory.max_usage_in_bytes", "0\n"},
      {"memory.usage_in_bytes", "0\n"},
      {"memory.failcnt", "0\n"},
      {"memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"},
      {"memory.swappiness", "60\n"},
  };
}

inline std::vector<std::pair<std::string, std::string>> v1_pids_template() {
  return {{"cgroup.procs", ""}, {"pids.max", "max\n"}, {"pids.current", "0\n"}};
}

inline std::vector<std::pair<std::string, std::string>> v1_cpu_template() {
  return {{"cgroup.procs", ""},
          {"cpu.cfs_period_us", "100000\n"},
          {"cpu.cfs_quota_us", "-1\n"},
          {"cpu.shares", "1024\n"}};
}

inline std::vector<std::pair<std::string, std::string>> v1_cpuacct_template() {
  return {{"cgroup.procs", ""}, {"cpuacct.usage", "0\n"}};
}

inline std::vector<std::pair<std::string, std::string>> v1_freezer_template() {
  return {{"cgroup.procs", ""}, {"freezer.state", "THAWED\n"}};
}

/// Removes `name` from a template (to emulate an older kernel).
inline void drop(std::vector<std::pair<std::string, std::string>>& t, const std::string& name) {
  std::erase_if(t, [&](const auto& kv) { return kv.first == name; });
}

/// The fake filesystem and its system calls. Install with `sys::scoped_override`.
class fake_cgroupfs : public detail::sys::ops {
 public:
  temp_dir tmp;
  fs::path root;       ///< <tmp>/cg: the `root` given to cgroup_host::open
  fs::path mountinfo;  ///< <tmp>/mountinfo
  std::string mountinfo_text;

  /// (path, bytes) of every successful write(2), in order.
  std::vector<std::pair<std::string, std::string>> writes;
  /// pid and signal of every kill(2) call (nothing is ever signalled).
  std::vector<std::pair<pid_t, int>> kills;
  int sleeps = 0;  ///< sleep_for calls (which return at once)

  /// Errors to inject: path → errno, consumed one per call (a queue per path).
  std::map<std::string, std::vector<int>> open_write_errors;  ///< open(O_WRONLY) of path
  std::map<std::string, std::vector<int>> write_errors;       ///< write(2) to path
  std::map<std::string, std::vector<int>> mkdir_errors;
  std::map<std::string, std::vector<int>> rmdir_errors;
  std::map<std::string, std::vector<int>> access_errors;  ///< faccessat with W_OK

  /// Called after each successful write (e.g. cgroup.kill → set "populated 0").
  std::function<void(const std::string& path, const std::string& bytes)> on_write;
  /// Called for each kill(2) (e.g. remove the pid from cgroup.procs, "fork" a new one).
  std::function<void(pid_t, int)> on_kill;

  fake_cgroupfs() : root(tmp.path / "cg"), mountinfo(tmp.path / "mountinfo") {
    fs::create_directories(root);
  }

  /// Adds a mount: creates its directory with `files` (the root cgroup's files) and
  /// remembers `child_files` as what `mkdir` creates below it.
  void add_mount(const std::string& rel, const std::string& fstype, const std::string& opts,
                 std::vector<std::pair<std::string, std::string>> root_files,
                 std::vector<std::pair<std::string, std::string>> child_files) {
    fs::path mp = rel.empty() ? root : root / rel;
    fs::create_directories(mp);
    for (const auto& [f, c] : root_files) write_text(mp / f, c);
    templates_.emplace_back(mp.string(), std::move(child_files));
    mountinfo_text += std::to_string(30 + templates_.size()) +
                      " 23 0:" + std::to_string(40 + templates_.size()) + " / " + mp.string() +
                      " rw,nosuid,nodev,noexec,relatime shared:9 - " + fstype + " " + fstype + " " +
                      opts + "\n";
    write_text(mountinfo, mountinfo_text);
  }

  /// Replaces the template of the mount at `rel` (tests of older kernels).
  void set_template(const std::string& rel,
                    std::vector<std::pair<std::string, std::string>> child_files) {
    fs::path mp = rel.empty() ? root : root / rel;
    for (auto& [m, t] : templates_) {
      if (m == mp.string()) t = std::move(child_files);
    }
  }

  /// The v2-only layout: one cgroup2 mount at root with memory, pids and cpu available.
  void make_v2(bool with_peak = true, bool with_kill = true) {
    auto child = v2_template();
    if (!with_peak) drop(child, "memory.peak");
    if (!with_kill) drop(child, "cgroup.kill");
    add_mount("", "cgroup2", "rw,nsdelegate,memory_recursiveprot",
              {{"cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n"},
               {"cgroup.subtree_control", ""},
               {"cgroup.procs", "1\n"},
               {"memory.stat", ""},
               {"cpu.stat", "usage_usec 1\n"}},
              child);
  }

  /// The hybrid layout of the project's build machines (cpu and cpuacct separate).
  void make_hybrid(bool with_kill = true) {
    add_mount("memory", "cgroup", "rw,memory", {{"cgroup.procs", ""}}, v1_memory_template());
    add_mount("pids", "cgroup", "rw,pids", {{"cgroup.procs", ""}}, v1_pids_template());
    add_mount("cpu", "cgroup", "rw,cpu", {{"cgroup.procs", ""}}, v1_cpu_template());
    add_mount("cpuacct", "cgroup", "rw,cpuacct", {{"cgroup.procs", ""}}, v1_cpuacct_template());
    add_mount("freezer", "cgroup", "rw,freezer", {{"cgroup.procs", ""}}, v1_freezer_template());
    add_mount("systemd", "cgroup", "rw,xattr,name=systemd", {{"cgroup.procs", ""}}, {});
    auto unified = unified_template();
    if (!with_kill) drop(unified, "cgroup.kill");
    add_mount("unified", "cgroup2", "rw,nsdelegate",
              {{"cgroup.controllers", "hugetlb\n"}, {"cgroup.subtree_control", ""}}, unified);
  }

  /// Writes recorded for files named `name` (e.g. "cgroup.kill").
  std::vector<std::string> writes_to(const std::string& name) const {
    std::vector<std::string> out;
    for (const auto& [p, b] : writes) {
      if (fs::path(p).filename() == name) out.push_back(b);
    }
    return out;
  }
  /// Writes recorded for the exact path `p`.
  std::vector<std::string> writes_to_path(const fs::path& p) const {
    std::vector<std::string> out;
    for (const auto& [w, b] : writes) {
      if (w == p.string()) out.push_back(b);
    }
    return out;
  }
  /// Index of the first write to a file named `name`, or -1.
  int first_write_index(const std::string& name) const {
    for (std::size_t i = 0; i < writes.size(); ++i) {
      if (fs::path(writes[i].first).filename() == name) return static_cast<int>(i);
    }
    return -1;
  }

  // --- sys::ops -------------------------------------------------------------------------
  int open(const char* path, int flags, mode_t mode) noexcept override {
    if ((flags & O_ACCMODE) != O_RDONLY) {
      if (int e = take(open_write_errors, path)) return fail(e);
    }
    int fd = ops::open(path, flags, mode);
    if (fd >= 0) {
      std::lock_guard lock(mu_);
      fd_paths_[fd] = path;
    }
    return fd;
  }
  ssize_t write(int fd, const void* buf, std::size_t count) noexcept override {
    std::string path;
    {
      std::lock_guard lock(mu_);
      auto it = fd_paths_.find(fd);
      if (it != fd_paths_.end()) path = it->second;
    }
    if (!path.empty()) {
      if (int e = take(write_errors, path)) return fail(e);
    }
    ssize_t n = ops::write(fd, buf, count);
    if (n > 0 && !path.empty()) {
      std::string bytes(static_cast<const char*>(buf), static_cast<std::size_t>(n));
      writes.emplace_back(path, bytes);
      if (on_write) on_write(path, bytes);
    }
    return n;
  }
  int close(int fd) noexcept override {
    {
      std::lock_guard lock(mu_);
      fd_paths_.erase(fd);
    }
    return ops::close(fd);
  }
  int mkdir(const char* path, mode_t mode) noexcept override {
    if (int e = take(mkdir_errors, path)) return fail(e);
    int r = ops::mkdir(path, mode);
    if (r != 0) return r;
    fs::path p(path);
    for (const auto& [m, files] : templates_) {
      if (p.string().rfind(m + "/", 0) == 0) {
        for (const auto& [f, c] : files) write_text(p / f, c);
      }
    }
    return 0;
  }
  int rmdir(const char* path) noexcept override {
    if (int e = take(rmdir_errors, path)) return fail(e);
    fs::path p(path);
    std::error_code ec;
    if (!fs::is_directory(p, ec)) return fail(ENOENT);
    if (fs::exists(p / "cgroup.procs") && !read_text(p / "cgroup.procs").empty()) {
      return fail(EBUSY);
    }
    for (const auto& e : fs::directory_iterator(p, ec)) {
      if (e.is_directory()) return fail(EBUSY);  // child cgroups
    }
    for (const auto& e : fs::directory_iterator(p, ec)) fs::remove(e.path(), ec);
    return ops::rmdir(path);
  }
  int faccessat(int dirfd, const char* path, int mode, int flags) noexcept override {
    if ((mode & W_OK) != 0) {
      if (int e = take(access_errors, path)) return fail(e);
    }
    return ops::faccessat(dirfd, path, mode, flags);
  }
  int kill(pid_t pid, int sig) noexcept override {
    kills.emplace_back(pid, sig);
    if (on_kill) on_kill(pid, sig);
    return 0;
  }
  void sleep_for(std::timespec) noexcept override { ++sleeps; }

 private:
  static int fail(int e) {
    errno = e;
    return -1;
  }
  int take(std::map<std::string, std::vector<int>>& m, const std::string& path) {
    std::lock_guard lock(mu_);
    auto it = m.find(path);
    if (it == m.end() || it->second.empty()) return 0;
    int e = it->second.front();
    it->second.erase(it->second.begin());
    return e;
  }

  std::mutex mu_;
  std::map<int, std::string> fd_paths_;
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> templates_;
};

/// Removes `pid` from the cgroup.procs file at `procs` (a killed process leaving).
inline void remove_pid(const fs::path& procs, pid_t pid) {
  std::string text = read_text(procs);
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line != std::to_string(pid)) out += line + "\n";
  }
  write_text(procs, out);
}

}  // namespace sandbox::test
