// Per-run cgroups on cgroup v2, hybrid and v1 (see cgroup.hpp for the layouts).
//
// Every filesystem call goes through `detail::sys`, so the unit tests drive this file against
// a fake cgroupfs tree (plain files) and inject what plain files cannot do (EBUSY on rmdir,
// EINTR, a missing cgroup.kill). Writes open the control file without O_CREAT: a control file
// that does not exist means the kernel lacks the feature, and we never create files in a
// cgroupfs. Reads are bounded; loops are bounded by pass counts, never by the sandboxed
// code's good will.
#include "core/run/cgroup.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <set>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "sys/sys.hpp"

namespace sandbox::detail {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t small_file_max = 64 * 1024;   // stat/events files are ~1 KiB
constexpr std::size_t procs_file_max = 1 << 20;     // ~140k pids; the rest next pass
constexpr std::size_t mountinfo_max = 8 << 20;      // hosts with thousands of mounts
constexpr std::uint64_t cpu_period_usec = 100000;   // 100 ms, the kernel's default
constexpr std::uint64_t cpu_min_quota_usec = 1000;  // the kernel refuses less than 1 ms
constexpr int kill_max_passes = 1000;               // each pass must find a new process
constexpr std::size_t list_max = 100000;

// Needed controllers, in the order they are written to cgroup.subtree_control.
constexpr const char* memory_ctrl = "memory";
constexpr const char* pids_ctrl = "pids";
constexpr const char* cpu_ctrl = "cpu";
constexpr const char* cpuacct_ctrl = "cpuacct";
constexpr const char* freezer_ctrl = "freezer";

std::string errno_text(int e) { return std::system_category().message(e); }

/// The `errc` of an error code this file made (io_error for any other).
errc errc_of_code(const boost::system::error_code& ec) noexcept {
  return ec.category() == sandbox::error_category() ? static_cast<errc>(ec.value())
                                                    : errc::io_error;
}

/// Maps an errno of a cgroupfs call to the documented error codes.
errc errc_of(int e) noexcept {
  switch (e) {
    case EACCES:
    case EPERM:
    case EROFS:
      return errc::permission_denied;
    case ENOENT:
      return errc::not_found;
    case EEXIST:
      return errc::already_exists;
    case EBUSY:
      return errc::busy;
    case ENOSYS:
    case EOPNOTSUPP:
      return errc::unsupported;
    default:
      return errc::io_error;
  }
}

void emit(const log_sink& log, log_level level, const std::string& line) {
  if (log) log(level, line);
}

/// Reads at most `max` bytes of the file at `p` into `out`. Returns 0 or an errno.
/// O_NONBLOCK: a fake or hostile tree holding a FIFO cannot block us.
int read_file(const fs::path& p, std::string& out, std::size_t max) {
  auto& s = sys::get();
  unique_fd fd(sys::retry_eintr(
      [&] { return s.open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0); }));
  if (!fd) return errno;
  out.clear();
  char buf[4096];
  while (out.size() < max) {
    std::size_t want = std::min(sizeof buf, max - out.size());
    ssize_t n = sys::retry_eintr([&] { return s.read(fd.get(), buf, want); });
    if (n < 0) return errno;
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return 0;
}

/// Writes `value` to the existing control file `p` in one write(2), as the kernel expects.
/// Returns 0 or an errno (EIO for a short write).
int write_file(const fs::path& p, std::string_view value) {
  auto& s = sys::get();
  unique_fd fd(sys::retry_eintr([&] {
    return s.open(p.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0);
  }));
  if (!fd) return errno;
  ssize_t n = sys::retry_eintr([&] { return s.write(fd.get(), value.data(), value.size()); });
  if (n < 0) return errno;
  if (static_cast<std::size_t>(n) != value.size()) return EIO;
  return 0;
}

/// An error result of `result<bool>` (a bare error_code would be ambiguous with bool).
result<bool> bool_error(errc e) {
  return result<bool>(boost::system::in_place_error, make_error_code(e));
}

bool path_exists(const fs::path& p) {
  return sys::get().faccessat(AT_FDCWD, p.c_str(), F_OK, AT_EACCESS) == 0;
}

std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t' || v.front() == '\n')) {
    v.remove_prefix(1);
  }
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\n')) {
    v.remove_suffix(1);
  }
  return v;
}

std::optional<std::uint64_t> parse_u64(std::string_view v) {
  v = trim(v);
  std::uint64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size() || v.empty()) return std::nullopt;
  return out;
}

/// The value of the line "`key` <number>" in a flat-keyed file (memory.events, cpu.stat,
/// memory.oom_control, cgroup.events, pids.events).
std::optional<std::uint64_t> keyed_value(std::string_view text, std::string_view key) {
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      return parse_u64(line.substr(key.size() + 1));
    }
  }
  return std::nullopt;
}

/// Splits on spaces/newlines (cgroup.controllers, cgroup.subtree_control).
std::set<std::string> words(std::string_view text) {
  std::set<std::string> out;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\n')) ++i;
    std::size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != '\n') ++j;
    if (j > i) out.emplace(text.substr(i, j - i));
    i = j;
  }
  return out;
}

/// Pids listed in a cgroup.procs text (one decimal per line; junk lines ignored).
std::vector<pid_t> parse_pids(std::string_view text) {
  std::vector<pid_t> out;
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    pid_t pid = 0;
    auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), pid);
    if (ec == std::errc() && ptr == line.data() + line.size() && !line.empty()) {
      out.push_back(pid);
    }
  }
  return out;
}

// --- mountinfo -------------------------------------------------------------------------

struct mount_entry {
  std::string mountpoint;
  std::string fstype;
  std::vector<std::string> super_options;
};

/// Undoes mountinfo's octal escapes (\040 space, \011 tab, \012 newline, \134 backslash).
std::string unescape_mountinfo(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\\' && i + 3 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '3' &&
        in[i + 2] >= '0' && in[i + 2] <= '7' && in[i + 3] >= '0' && in[i + 3] <= '7') {
      out.push_back(
          static_cast<char>((in[i + 1] - '0') * 64 + (in[i + 2] - '0') * 8 + (in[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

/// Parses proc(5) mountinfo lines:
/// `id parent maj:min root mountpoint options [optional...] - fstype source superoptions`.
/// Malformed lines are skipped.
std::vector<mount_entry> parse_mountinfo(std::string_view text) {
  std::vector<mount_entry> out;
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    std::vector<std::string_view> f;
    std::size_t i = 0;
    while (i < line.size() && f.size() < 64) {
      while (i < line.size() && line[i] == ' ') ++i;
      std::size_t j = i;
      while (j < line.size() && line[j] != ' ') ++j;
      if (j > i) f.push_back(line.substr(i, j - i));
      i = j;
    }
    std::size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 6 || dash + 1 >= f.size()) continue;  // no "-" or no fstype
    mount_entry m;
    m.mountpoint = unescape_mountinfo(f[4]);
    m.fstype = std::string(f[dash + 1]);
    std::string_view opts = f.size() > dash + 3 ? f[dash + 3] : std::string_view();
    while (!opts.empty()) {
      std::size_t c = opts.find(',');
      m.super_options.emplace_back(opts.substr(0, c));
      opts = c == std::string_view::npos ? std::string_view() : opts.substr(c + 1);
    }
    out.push_back(std::move(m));
  }
  return out;
}

/// `path` is `root` or below it (string comparison on normalized absolute paths).
bool is_under(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

std::string normalize(const fs::path& p) {
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool valid_run_name(std::string_view name) {
  if (name.empty() || name.size() > 128 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
  });
}

bool has(const std::vector<std::string>& v, std::string_view c) {
  return std::find(v.begin(), v.end(), c) != v.end();
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (const auto& s : v) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

}  // namespace

// --- run_cgroup ------------------------------------------------------------------------

struct run_cgroup::state {
  struct part {
    fs::path dir;
    std::vector<std::string> controllers;
    bool is_v2 = false;
    bool removed = false;
    bool has(std::string_view c) const { return detail::has(controllers, c); }
  };
  std::vector<part> parts;  // the cgroup2 directory first
  std::vector<fs::path> dirs;
  log_sink log;
  bool has_cgroup_kill = false;
  bool has_memory_peak = false;
  unique_fd oom_fd;
  mutable std::atomic<std::uint64_t> sampled_peak{0};

  const part* v2() const {
    for (const auto& p : parts) {
      if (p.is_v2) return &p;
    }
    return nullptr;
  }
  const part* with(std::string_view c) const {
    for (const auto& p : parts) {
      if (p.has(c)) return &p;
    }
    return nullptr;
  }
  void warn(const std::string& line) const { emit(log, log_level::warning, "cgroup: " + line); }
};

run_cgroup::run_cgroup(run_cgroup&&) noexcept = default;
run_cgroup& run_cgroup::operator=(run_cgroup&&) noexcept = default;
run_cgroup::~run_cgroup() = default;

const std::vector<fs::path>& run_cgroup::dirs() const noexcept {
  static const std::vector<fs::path> none;
  return s_ ? s_->dirs : none;
}

fs::path run_cgroup::procs_dir() const {
  if (!s_ || s_->parts.empty()) return {};
  for (const auto& p : s_->parts) {
    if (!p.is_v2) return p.dir;
  }
  return s_->parts.front().dir;
}

std::optional<fs::path> run_cgroup::unified_dir() const {
  if (!s_) return std::nullopt;
  const auto* p = s_->v2();
  if (p == nullptr) return std::nullopt;
  return p->dir;
}

int run_cgroup::oom_event_fd() const noexcept { return s_ ? s_->oom_fd.get() : -1; }

void run_cgroup::drain_oom_event_fd() const noexcept {
  if (!s_ || !s_->oom_fd) return;
  // Non-blocking descriptor: read until EAGAIN (eventfd: one 8-byte read; inotify: events).
  alignas(8) char buf[4096];
  for (int i = 0; i < 64; ++i) {
    ssize_t n = sys::get().read(s_->oom_fd.get(), buf, sizeof buf);
    if (n <= 0 && !(n < 0 && errno == EINTR)) break;
  }
}

result<void> run_cgroup::attach(pid_t pid) const { return attach_parts(pid, true); }

result<void> run_cgroup::attach_except_unified(pid_t pid) const { return attach_parts(pid, false); }

int run_cgroup::open_unified_dir() const noexcept {
  if (!s_) return -1;
  const auto* v2 = s_->v2();
  if (v2 == nullptr) return -1;
  return sys::retry_eintr(
      [&] { return sys::get().open(v2->dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0); });
}

result<void> run_cgroup::attach_parts(pid_t pid, bool unified) const {
  if (!s_ || pid <= 0) return make_error_code(errc::invalid_argument);
  const std::string value = std::to_string(pid);
  for (const auto& p : s_->parts) {
    if (p.is_v2 && !unified) continue;
    fs::path file = p.dir / "cgroup.procs";
    if (int e = write_file(file, value); e != 0) {
      s_->warn(fmt::format("write(\"{}\", \"{}\"): {}", file.string(), value, errno_text(e)));
      return make_error_code(e == ESRCH                              ? errc::not_found
                             : errc_of(e) == errc::permission_denied ? errc::permission_denied
                                                                     : errc::io_error);
    }
  }
  return {};
}

result<void> run_cgroup::kill_all() const {
  if (!s_) return make_error_code(errc::invalid_argument);
  const state& st = *s_;
  const auto* v2 = st.v2();
  // 1. cgroup.kill (5.14+): the kernel kills the whole subtree, forks in flight included.
  //    On a hybrid host a process can be in the v1 hierarchies only (an OCI runtime that
  //    does not see the unified mount joins just the v1 cgroups): those are swept below.
  bool v2_killed = false;
  if (v2 != nullptr && st.has_cgroup_kill) {
    fs::path file = v2->dir / "cgroup.kill";
    int e = write_file(file, "1");
    if (e == 0 || (e == ENOENT && !path_exists(v2->dir))) {  // ENOENT: removed, nothing left
      v2_killed = true;
      const bool v1_parts =
          std::any_of(st.parts.begin(), st.parts.end(), [](const auto& p) { return !p.is_v2; });
      if (!v1_parts) return {};
    } else {
      st.warn(fmt::format("write(\"{}\", \"1\"): {}; falling back to SIGKILL loop", file.string(),
                          errno_text(e)));
    }
  }

  // 2. Stop forks first, so the SIGKILL loop below converges: freeze the cgroup (v2
  //    cgroup.freeze, else the v1 freezer), else set pids.max to 0.
  enum class stopper { none, v2_freeze, v1_freezer, pids_zero } how = stopper::none;
  if (v2_killed) {
    // Hybrid: v2 members are dying already; v1-only ones are few (an OCI runtime's
    // processes) and bounded by pids.max, so the sweep alone converges.
  } else if (v2 != nullptr && write_file(v2->dir / "cgroup.freeze", "1") == 0) {
    how = stopper::v2_freeze;
  } else if (const auto* f = st.with(freezer_ctrl);
             f != nullptr && write_file(f->dir / "freezer.state", "FROZEN") == 0) {
    how = stopper::v1_freezer;
  } else if (const auto* p = st.with(pids_ctrl);
             p != nullptr && write_file(p->dir / "pids.max", "0") == 0) {
    how = stopper::pids_zero;
  } else {
    st.warn("cannot freeze or stop forks in the run cgroup; killing without it");
  }

  // 3. SIGKILL every listed process; repeat until a pass finds no process not signalled
  //    before (a frozen or fork-blocked cgroup cannot grow, so this ends quickly; the pass
  //    limit bounds it regardless). Frozen v1 tasks die when thawed below.
  const pid_t self = getpid();
  std::unordered_set<pid_t> signalled;
  int readable = 0;
  int last_error = 0;
  auto sweep = [&] {
    for (int pass = 0; pass < kill_max_passes; ++pass) {
      bool found_new = false;
      for (const auto& p : st.parts) {
        if (v2_killed && p.is_v2) continue;
        std::string text;
        fs::path file = p.dir / "cgroup.procs";
        if (int e = read_file(file, text, procs_file_max); e != 0) {
          if (e != ENOENT) last_error = e;
          continue;
        }
        ++readable;
        for (pid_t pid : parse_pids(text)) {
          if (pid <= 1 || pid == self) continue;
          if (!signalled.insert(pid).second) continue;
          found_new = true;
          if (sys::get().kill(pid, SIGKILL) != 0 && errno != ESRCH) {
            st.warn(fmt::format("kill({}, SIGKILL): {}", pid, errno_text(errno)));
          }
        }
      }
      if (!found_new) return;
    }
    st.warn(fmt::format("kill loop stopped after {} passes", kill_max_passes));
  };
  sweep();
  // 4. Thaw (killed tasks of a frozen v1 cgroup only die once thawed), then sweep again
  //    for anything that was between two states while we looked.
  if (how == stopper::v2_freeze) {
    write_file(v2->dir / "cgroup.freeze", "0");
    sweep();
  } else if (how == stopper::v1_freezer) {
    write_file(st.with(freezer_ctrl)->dir / "freezer.state", "THAWED");
    sweep();
  }
  if (readable == 0 && last_error != 0) {
    st.warn(fmt::format("cannot read cgroup.procs of {}: {}", st.dirs.front().string(),
                        errno_text(last_error)));
    return make_error_code(errc_of(last_error) == errc::permission_denied ? errc::permission_denied
                                                                          : errc::io_error);
  }
  return {};
}

result<bool> run_cgroup::is_empty() const {
  if (!s_) return bool_error(errc::invalid_argument);
  for (const auto& p : s_->parts) {
    std::string text;
    if (p.is_v2) {
      fs::path file = p.dir / "cgroup.events";
      int e = read_file(file, text, small_file_max);
      if (e == ENOENT) continue;  // removed (or no cgroup.events: pre-4.13 ignores it)
      if (e != 0) {
        s_->warn(fmt::format("read(\"{}\"): {}", file.string(), errno_text(e)));
        return bool_error(errc::io_error);
      }
      if (auto populated = keyed_value(text, "populated")) {
        if (*populated != 0) return false;
        continue;
      }
    }
    fs::path file = p.dir / "cgroup.procs";
    int e = read_file(file, text, small_file_max);
    if (e == ENOENT) continue;
    if (e != 0) {
      s_->warn(fmt::format("read(\"{}\"): {}", file.string(), errno_text(e)));
      return bool_error(errc::io_error);
    }
    if (!parse_pids(text).empty()) return false;
  }
  return true;
}

void run_cgroup::sample_memory() const {
  if (!s_ || s_->has_memory_peak) return;
  const auto* m = s_->with(memory_ctrl);
  if (m == nullptr || !m->is_v2) return;  // v1 always has memory.max_usage_in_bytes
  std::string text;
  if (read_file(m->dir / "memory.current", text, small_file_max) != 0) return;
  auto v = parse_u64(text);
  if (!v) return;
  std::uint64_t prev = s_->sampled_peak.load(std::memory_order_relaxed);
  while (prev < *v &&
         !s_->sampled_peak.compare_exchange_weak(prev, *v, std::memory_order_relaxed)) {
  }
}

bool run_cgroup::reset_memory_peak() const {
  if (!s_) return false;
  const auto* m = s_->with(memory_ctrl);
  if (m == nullptr) return false;
  if (!m->is_v2) {
    const int e = write_file(m->dir / "memory.max_usage_in_bytes", "0");
    if (e != 0)
      s_->warn(fmt::format("write(\"{}/memory.max_usage_in_bytes\", \"0\"): {}", m->dir.string(),
                           errno_text(e)));
    return e == 0;
  }
  if (s_->has_memory_peak) return false;
  std::string text;
  if (read_file(m->dir / "memory.current", text, small_file_max) != 0) return false;
  auto v = parse_u64(text);
  if (!v) return false;
  s_->sampled_peak.store(*v, std::memory_order_relaxed);
  return true;
}

result<cgroup_stats> run_cgroup::stats() const {
  if (!s_) return make_error_code(errc::invalid_argument);
  cgroup_stats out;
  auto read_or_log = [&](const fs::path& file, std::string& text) {
    int e = read_file(file, text, small_file_max);
    if (e != 0) s_->warn(fmt::format("read(\"{}\"): {}", file.string(), errno_text(e)));
    return e;
  };
  std::string text;
  if (const auto* m = s_->with(memory_ctrl)) {
    if (m->is_v2) {
      if (read_or_log(m->dir / "memory.events", text) != 0) return make_error_code(errc::io_error);
      out.oom_kills = keyed_value(text, "oom_kill").value_or(0);
      int e =
          s_->has_memory_peak ? read_file(m->dir / "memory.peak", text, small_file_max) : ENOENT;
      std::optional<std::uint64_t> peak;
      if (e == 0) peak = parse_u64(text);
      if (!peak) {
        sample_memory();
        out.peak_memory_bytes = s_->sampled_peak.load(std::memory_order_relaxed);
        out.peak_is_sampled = true;
      } else {
        out.peak_memory_bytes = *peak;
      }
    } else {
      // v1: `memory.failcnt` counts limit hits (reclaim included), not kills; the kill
      // counter is the `oom_kill` line of memory.oom_control (4.13+).
      if (read_or_log(m->dir / "memory.oom_control", text) != 0) {
        return make_error_code(errc::io_error);
      }
      out.oom_kills = keyed_value(text, "oom_kill").value_or(0);
      if (read_or_log(m->dir / "memory.max_usage_in_bytes", text) != 0) {
        return make_error_code(errc::io_error);
      }
      out.peak_memory_bytes = parse_u64(text).value_or(0);
    }
  }
  // CPU: cgroup2's cpu.stat has usage_usec with or without the cpu controller (4.20+);
  // else v1 cpuacct.usage (ns).
  bool have_cpu = false;
  if (const auto* v2 = s_->v2()) {
    if (read_file(v2->dir / "cpu.stat", text, small_file_max) == 0) {
      if (auto u = keyed_value(text, "usage_usec")) {
        out.cpu_usage_usec = *u;
        have_cpu = true;
      }
    }
  }
  if (!have_cpu) {
    if (const auto* a = s_->with(cpuacct_ctrl)) {
      if (read_or_log(a->dir / "cpuacct.usage", text) != 0) return make_error_code(errc::io_error);
      out.cpu_usage_usec = parse_u64(text).value_or(0) / 1000;
    }
  }
  // The pids limit's refusals: evidence of why a sandbox kernel died (gVisor's sentry cannot
  // start a host thread at pids.max). Optional: a kernel without pids.events leaves it 0.
  if (const auto* p = s_->with(pids_ctrl)) {
    if (read_file(p->dir / "pids.events", text, small_file_max) == 0) {
      out.pids_limit_hits = keyed_value(text, "max").value_or(0);
    }
  }
  return out;
}

result<void> run_cgroup::remove() {
  if (!s_) return {};
  // Reverse order: the cgroup2 directory (which decides "empty") goes last.
  for (auto it = s_->parts.rbegin(); it != s_->parts.rend(); ++it) {
    if (it->removed) continue;
    int r = sys::retry_eintr([&] { return sys::get().rmdir(it->dir.c_str()); });
    if (r == 0 || errno == ENOENT) {
      it->removed = true;
      continue;
    }
    int e = errno;
    s_->warn(fmt::format("rmdir(\"{}\"): {}", it->dir.string(), errno_text(e)));
    errc code = errc_of(e);
    if (code != errc::busy && code != errc::permission_denied) code = errc::io_error;
    return make_error_code(code);
  }
  return {};
}

// --- cgroup_host -------------------------------------------------------------------------

result<cgroup_host> cgroup_host::open(const fs::path& root, const fs::path& mountinfo,
                                      std::string parent, std::string* why, log_sink log) {
  auto fail = [&](errc e, const std::string& reason) -> result<cgroup_host> {
    emit(log, log_level::warning, "cgroup: " + reason);
    if (why != nullptr) *why = reason;
    return make_error_code(e);
  };

  // 1. The parent: absolute, no "." / ".." / empty components, not the root itself.
  std::vector<std::string> components;
  {
    std::string_view rest = parent;
    if (rest.empty() || rest.front() != '/' || rest.find('\0') != std::string_view::npos ||
        rest.find('\n') != std::string_view::npos) {
      return fail(errc::invalid_argument, "cgroup parent must be an absolute path");
    }
    while (!rest.empty()) {
      std::size_t slash = rest.find('/');
      std::string_view c = rest.substr(0, slash);
      rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
      if (c.empty()) continue;
      if (c == "." || c == ".." || c.size() > 255) {
        return fail(errc::invalid_argument, "cgroup parent has a '.', '..' or overlong part");
      }
      components.emplace_back(c);
    }
    if (components.empty()) return fail(errc::invalid_argument, "cgroup parent cannot be '/'");
  }

  // 2. The cgroup mounts under `root`.
  std::string text;
  if (int e = read_file(mountinfo, text, mountinfo_max); e != 0) {
    return fail(errc::io_error, fmt::format("read(\"{}\"): {}", mountinfo.string(), errno_text(e)));
  }
  const std::string root_s = normalize(root);
  std::optional<fs::path> v2_mount;
  std::vector<std::pair<std::string, fs::path>> v1_mounts;  // controller → mount
  for (const auto& m : parse_mountinfo(text)) {
    if (!is_under(m.mountpoint, root_s)) continue;
    if (m.fstype == "cgroup2") {
      if (!v2_mount) v2_mount = m.mountpoint;
    } else if (m.fstype == "cgroup") {
      for (const auto& o : m.super_options) {
        bool known = false;
        for (const auto& [c, _] : v1_mounts) known = known || c == o;
        if (!known) v1_mounts.emplace_back(o, m.mountpoint);
      }
    }
  }
  auto v1_mount_of = [&](std::string_view c) -> std::optional<fs::path> {
    for (const auto& [name, mp] : v1_mounts) {
      if (name == c) return mp;
    }
    return std::nullopt;
  };
  std::set<std::string> v2_available;
  if (v2_mount) {
    fs::path file = *v2_mount / "cgroup.controllers";
    if (int e = read_file(file, text, small_file_max); e == 0) {
      v2_available = words(text);
    } else {
      emit(log, log_level::warning,
           fmt::format("cgroup: read(\"{}\"): {}", file.string(), errno_text(e)));
    }
  }

  // 3. Pick a hierarchy for each controller: cgroup2 when it offers it, else a v1 mount.
  cgroup_host host;
  host.log_ = log;
  auto add = [&](const fs::path& mount, bool is_v2, const char* controller) {
    fs::path dir = mount;
    for (const auto& c : components) dir /= c;
    for (auto& h : host.hierarchies_) {
      if (h.parent_dir == dir) {
        if (controller != nullptr && !has(h.controllers, controller)) {
          h.controllers.emplace_back(controller);
        }
        return;
      }
    }
    hierarchy h;
    h.parent_dir = dir;
    h.is_v2 = is_v2;
    if (controller != nullptr) h.controllers.emplace_back(controller);
    host.hierarchies_.push_back(std::move(h));
  };
  if (v2_mount) add(*v2_mount, true, nullptr);  // first: kill and "empty" come from it
  for (const char* c : {memory_ctrl, pids_ctrl, cpu_ctrl}) {
    if (v2_mount && v2_available.count(c) != 0) {
      add(*v2_mount, true, c);
    } else if (auto mp = v1_mount_of(c)) {
      add(*mp, false, c);
    } else if (c == cpu_ctrl) {
      emit(log, log_level::warning,
           fmt::format("cgroup: no cpu controller under {}: runs get no CPU limit", root_s));
    } else {
      return fail(errc::unsupported,
                  fmt::format("cgroup {} controller unavailable: neither a cgroup2 mount "
                              "offering it nor a v1 '{}' hierarchy under {}; mount one (cgroup "
                              "v2: enable +{} in the root's cgroup.subtree_control)",
                              c, c, root_s, c));
    }
  }
  if (!v2_mount) {
    // v1 only: CPU usage from cpuacct, and the freezer for a race-free kill.
    for (const char* c : {cpuacct_ctrl, freezer_ctrl}) {
      if (auto mp = v1_mount_of(c)) add(*mp, false, c);
    }
  }
  bool any_v1 = std::any_of(host.hierarchies_.begin(), host.hierarchies_.end(),
                            [](const hierarchy& h) { return !h.is_v2; });
  host.mode_ = !any_v1 ? cgroup_mode::v2 : v2_mount ? cgroup_mode::hybrid : cgroup_mode::v1;

  // 4. Create the parent in each hierarchy; on cgroup2 enable our controllers at every level
  //    where they are not enabled yet.
  auto create_dir = [&](const fs::path& dir) -> std::optional<std::pair<errc, std::string>> {
    int r = sys::retry_eintr([&] { return sys::get().mkdir(dir.c_str(), 0755); });
    if (r == 0 || errno == EEXIST) return std::nullopt;
    int e = errno;
    errc code = errc_of(e) == errc::permission_denied ? errc::permission_denied : errc::io_error;
    return std::pair{code, fmt::format("mkdir(\"{}\"): {}{}", dir.string(), errno_text(e),
                                       code == errc::permission_denied
                                           ? " (cgroup subtree not delegated to this user?)"
                                           : "")};
  };
  using problem_t = std::optional<std::pair<errc, std::string>>;
  auto problem = [](errc e, std::string what) { return problem_t{{e, std::move(what)}}; };
  auto setup = [&](hierarchy& h) -> problem_t {
    fs::path dir = h.parent_dir;
    fs::path level = dir;
    for (std::size_t i = 0; i < components.size(); ++i) level = level.parent_path();
    // `level` is now the mount point; walk down to the parent.
    for (std::size_t i = 0; i <= components.size(); ++i) {
      if (i > 0) {
        level /= components[i - 1];
        if (auto err = create_dir(level)) return err;
      }
      if (!h.is_v2 || h.controllers.empty()) continue;
      fs::path cfile = level / "cgroup.controllers";
      if (int e = read_file(cfile, text, small_file_max); e != 0) {
        return problem(errc::io_error,
                       fmt::format("read(\"{}\"): {}", cfile.string(), errno_text(e)));
      }
      std::set<std::string> available = words(text);
      for (const auto& c : h.controllers) {
        if (available.count(c) == 0) {
          if (c == cpu_ctrl) continue;  // optional: dropped below
          const fs::path above = level.parent_path() / "cgroup.subtree_control";
          return problem(errc::unsupported,
                         fmt::format("cgroup v2 {} controller not available in {}: it is not "
                                     "enabled in {} (not delegated); enable it there "
                                     "(echo +{} > {}) or delegate a subtree that has it "
                                     "(systemd Delegate=yes)",
                                     c, level.string(), above.string(), c, above.string()));
        }
      }
      if (has(h.controllers, cpu_ctrl) && available.count(cpu_ctrl) == 0) {
        emit(log, log_level::warning,
             fmt::format("cgroup: cpu controller not available in {}: no CPU limit",
                         level.string()));
        h.controllers.erase(std::find(h.controllers.begin(), h.controllers.end(), cpu_ctrl));
      }
      fs::path sfile = level / "cgroup.subtree_control";
      if (int e = read_file(sfile, text, small_file_max); e != 0) {
        return problem(errc::io_error,
                       fmt::format("read(\"{}\"): {}", sfile.string(), errno_text(e)));
      }
      std::set<std::string> enabled = words(text);
      std::vector<std::string> missing;
      for (const auto& c : h.controllers) {
        if (enabled.count(c) == 0) missing.push_back(c);
      }
      if (missing.empty()) continue;
      auto plus = [](const std::vector<std::string>& cs) {
        std::string v;
        for (const auto& c : cs) v += (v.empty() ? "+" : " +") + c;
        return v;
      };
      int e = write_file(sfile, plus(missing));
      if ((e == EINVAL || e == EOPNOTSUPP) && has(missing, cpu_ctrl) && missing.size() > 1) {
        // The optional cpu controller can fail to enable (EINVAL while realtime tasks sit in
        // non-root cgroups): retry without it rather than lose the required ones.
        std::vector<std::string> required = missing;
        required.erase(std::find(required.begin(), required.end(), cpu_ctrl));
        if (write_file(sfile, plus(required)) == 0) {
          emit(log, log_level::warning,
               fmt::format("cgroup: write(\"{}\", \"{}\"): {}: no CPU limit", sfile.string(),
                           plus(missing), errno_text(e)));
          h.controllers.erase(std::find(h.controllers.begin(), h.controllers.end(), cpu_ctrl));
          e = 0;
        }
      }
      if (e == 0) continue;
      std::string what =
          fmt::format("write(\"{}\", \"{}\"): {}", sfile.string(), plus(missing), errno_text(e));
      if (e == EACCES || e == EPERM || e == EROFS) {
        return problem(errc::permission_denied,
                       what + " (cgroup subtree not delegated?): as the owner of " +
                           sfile.string() + " run `echo '" + plus(missing) + "' > " +
                           sfile.string() + "`, or delegate a subtree with these controllers " +
                           "enabled (systemd Delegate=yes)");
      }
      if (e == EBUSY) {
        return problem(errc::unsupported,
                       what +
                           " (it has processes of its own: cgroup v2 allows controllers only "
                           "above leaves; move the host process into a leaf cgroup)");
      }
      if (e == ENOENT || e == EINVAL) {
        return problem(errc::unsupported, what);
      }
      return problem(errc::io_error, what);
    }
    // We must be able to create run cgroups in it.
    if (sys::get().faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
      int e = errno;
      return problem(
          errc_of(e) == errc::permission_denied ? errc::permission_denied : errc::io_error,
          fmt::format("access(\"{}\", W_OK|X_OK): {} (cgroup subtree not delegated?)", dir.string(),
                      errno_text(e)));
    }
    return std::nullopt;
  };
  for (std::size_t k = 0; k < host.hierarchies_.size(); ++k) {
    hierarchy& h = host.hierarchies_[k];
    auto err = setup(h);
    if (!err) continue;
    if (h.is_v2 && h.controllers.empty()) {
      // Hybrid: the cgroup2 mount only adds cgroup.kill and cgroup.events. Where it cannot be
      // used (read-only, not delegated) carry on as v1 rather than fail.
      emit(log, log_level::warning,
           "cgroup: " + err->second + "; using the v1 hierarchies only (freezer kill)");
      host.hierarchies_.erase(host.hierarchies_.begin() + static_cast<std::ptrdiff_t>(k));
      --k;
      for (const char* c : {cpuacct_ctrl, freezer_ctrl}) {
        if (auto mp = v1_mount_of(c)) add(*mp, false, c);  // set up later in this loop
      }
      host.mode_ = cgroup_mode::v1;
      continue;
    }
    return fail(err->first, err->second);
  }

  // 5. Optional kernel features, detected on the parent (a non-root cgroup has every file a
  //    child will have).
  for (const auto& h : host.hierarchies_) {
    if (!h.is_v2) continue;
    host.has_cgroup_kill_ = path_exists(h.parent_dir / "cgroup.kill");
    if (has(h.controllers, memory_ctrl)) {
      host.has_memory_peak_ = path_exists(h.parent_dir / "memory.peak");
    }
  }
  emit(log, log_level::info, "cgroup: " + host.describe());
  return host;
}

std::string cgroup_host::describe() const {
  std::vector<std::string> v1;
  std::vector<std::string> v2;
  for (const auto& h : hierarchies_) {
    for (const auto& c : h.controllers) (h.is_v2 ? v2 : v1).push_back(c);
  }
  std::string out;
  std::string v2_part = join(v2, ",");
  std::vector<std::string> extras;
  if (has_cgroup_kill_) extras.emplace_back("kill");
  bool has_v2 = std::any_of(hierarchies_.begin(), hierarchies_.end(),
                            [](const hierarchy& h) { return h.is_v2; });
  if (has_v2) extras.emplace_back("events");
  std::string parent =
      hierarchies_.empty() ? std::string() : hierarchies_.front().parent_dir.string();
  switch (mode_) {
    case cgroup_mode::v2:
      out = fmt::format("v2: {}", v2_part);
      break;
    case cgroup_mode::hybrid:
      out = fmt::format("hybrid: v1 {}", join(v1, ","));
      if (!v2_part.empty()) out += " + v2 " + v2_part;
      break;
    case cgroup_mode::v1:
      out = fmt::format("v1: {}", join(v1, ","));
      break;
  }
  if (mode_ == cgroup_mode::hybrid && !extras.empty()) {
    out += " + v2 " + join(extras, ",");
  } else if (mode_ == cgroup_mode::v2 && has_cgroup_kill_) {
    out += " + kill";
  }
  if (mode_ == cgroup_mode::v2 && !has_memory_peak_) out += " (peak sampled)";
  if (!has_cgroup_kill_) {
    bool freezer = std::any_of(hierarchies_.begin(), hierarchies_.end(),
                               [](const hierarchy& h) { return has(h.controllers, freezer_ctrl); });
    out += has_v2    ? " (kill: cgroup.freeze + SIGKILL loop)"
           : freezer ? " (kill: freezer + SIGKILL loop)"
                     : " (kill: pids.max=0 + SIGKILL loop)";
  }
  bool cpu = std::any_of(hierarchies_.begin(), hierarchies_.end(),
                         [](const hierarchy& h) { return has(h.controllers, cpu_ctrl); });
  if (!cpu) out += " (no CPU limit)";
  return out + " at " + parent;
}

run_cgroup cgroup_host::make_run(std::string_view name) const {
  run_cgroup rc;
  rc.s_ = std::make_unique<run_cgroup::state>();
  rc.s_->log = log_;
  rc.s_->has_cgroup_kill = has_cgroup_kill_;
  rc.s_->has_memory_peak = has_memory_peak_;
  for (const auto& h : hierarchies_) {
    run_cgroup::state::part p;
    p.dir = h.parent_dir / std::string(name);
    p.controllers = h.controllers;
    p.is_v2 = h.is_v2;
    rc.s_->dirs.push_back(p.dir);
    rc.s_->parts.push_back(std::move(p));
  }
  return rc;
}

result<run_cgroup> cgroup_host::create(std::string_view name, const cgroup_limits& limits) const {
  if (!valid_run_name(name) || limits.memory_bytes == 0 || limits.max_pids == 0) {
    return make_error_code(errc::invalid_argument);
  }
  run_cgroup rc = make_run(name);
  auto& st = *rc.s_;
  auto undo = [&](std::size_t created) {
    for (std::size_t i = created; i-- > 0;) {
      if (sys::retry_eintr([&] { return sys::get().rmdir(st.parts[i].dir.c_str()); }) != 0) {
        st.warn(fmt::format("rmdir(\"{}\"): {}", st.parts[i].dir.string(), errno_text(errno)));
      }
    }
  };

  // 1. One directory per hierarchy.
  for (std::size_t i = 0; i < st.parts.size(); ++i) {
    const fs::path& dir = st.parts[i].dir;
    if (sys::retry_eintr([&] { return sys::get().mkdir(dir.c_str(), 0755); }) != 0) {
      int e = errno;
      st.warn(fmt::format("mkdir(\"{}\"): {}", dir.string(), errno_text(e)));
      undo(i);
      errc code = errc_of(e);
      if (code != errc::already_exists && code != errc::permission_denied) code = errc::io_error;
      return make_error_code(code);
    }
  }

  // 2. Limits. Memory before swap (v1 refuses memsw below the memory limit).
  const std::string mem = std::to_string(limits.memory_bytes);
  const std::string pids = std::to_string(limits.max_pids);
  std::string quota = "max";
  if (limits.cpu_quota_millicores != 0) {
    quota = std::to_string(std::max<std::uint64_t>(
        cpu_min_quota_usec, std::uint64_t{limits.cpu_quota_millicores} * cpu_period_usec / 1000));
  }
  struct write_op {
    fs::path file;
    std::string value;
    bool optional;  // ENOENT is fine: the kernel lacks the feature (logged)
  };
  std::vector<write_op> ops;
  for (const auto& p : st.parts) {
    if (p.is_v2) {
      if (p.has(memory_ctrl)) {
        ops.push_back({p.dir / "memory.max", mem, false});
        ops.push_back({p.dir / "memory.swap.max", "0", true});   // absent: no swap accounting
        ops.push_back({p.dir / "memory.oom.group", "1", true});  // 4.19+
      }
      if (p.has(pids_ctrl)) ops.push_back({p.dir / "pids.max", pids, false});
      if (p.has(cpu_ctrl)) {
        ops.push_back({p.dir / "cpu.max", quota + " " + std::to_string(cpu_period_usec), false});
      }
    } else {
      if (p.has(memory_ctrl)) {
        ops.push_back({p.dir / "memory.limit_in_bytes", mem, false});
        if (path_exists(p.dir / "memory.memsw.limit_in_bytes")) {
          ops.push_back({p.dir / "memory.memsw.limit_in_bytes", mem, false});
        } else {
          ops.push_back({p.dir / "memory.swappiness", "0", true});  // no swap accounting
        }
        // v1 charges socket buffers to a memcg only once its TCP limit is set; without it
        // a run can fill the host-wide tcp_mem pool (v2 charges sockets to memory.max).
        // A quarter of the run's memory, at least 4 MiB, on top of memory.limit_in_bytes.
        ops.push_back({p.dir / "memory.kmem.tcp.limit_in_bytes",
                       std::to_string(std::max<std::uint64_t>(limits.memory_bytes / 4, 4ULL << 20)),
                       true});
      }
      if (p.has(pids_ctrl)) ops.push_back({p.dir / "pids.max", pids, false});
      if (p.has(cpu_ctrl)) {
        ops.push_back({p.dir / "cpu.cfs_period_us", std::to_string(cpu_period_usec), false});
        ops.push_back(
            {p.dir / "cpu.cfs_quota_us", limits.cpu_quota_millicores == 0 ? "-1" : quota, false});
      }
    }
  }
  for (const auto& op : ops) {
    int e = write_file(op.file, op.value);
    if (e == 0) continue;
    if (e == ENOENT && op.optional) {
      emit(st.log, log_level::info,
           fmt::format("cgroup: {} absent; not set", op.file.filename().string()));
      continue;
    }
    st.warn(fmt::format("write(\"{}\", \"{}\"): {}", op.file.string(), op.value, errno_text(e)));
    undo(st.parts.size());
    return make_error_code(errc_of(e) == errc::permission_denied ? errc::permission_denied
                                                                 : errc::io_error);
  }

  // 3. The OOM notification descriptor (optional: -1 and a log line if unavailable).
  if (const auto* m = st.with(memory_ctrl)) {
    auto& s = sys::get();
    if (m->is_v2) {
      unique_fd fd(s.inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
      fs::path file = m->dir / "memory.events";
      if (fd && s.inotify_add_watch(fd.get(), file.c_str(), IN_MODIFY) >= 0) {
        st.oom_fd = std::move(fd);
      } else {
        st.warn(fmt::format("inotify on \"{}\": {}", file.string(), errno_text(errno)));
      }
    } else {
      unique_fd efd(s.eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
      fs::path ctl = m->dir / "memory.oom_control";
      unique_fd cfd(sys::retry_eintr(
          [&] { return s.open(ctl.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0); }));
      int e = !efd ? errno : !cfd ? errno : 0;
      if (e == 0) {
        e = write_file(m->dir / "cgroup.event_control", fmt::format("{} {}", efd.get(), cfd.get()));
      }
      // The kernel keeps its own references; our descriptor of oom_control can go.
      if (e == 0) {
        st.oom_fd = std::move(efd);
      } else {
        st.warn(fmt::format("OOM eventfd via \"{}\": {}", ctl.string(), errno_text(e)));
      }
    }
  }
  return rc;
}

result<void> cgroup_host::verify_limits(std::string_view name, std::string* why) const {
  constexpr std::uint64_t memory = 64ULL << 20;  // a multiple of every page size
  constexpr std::uint32_t pids = 16;
  constexpr std::uint32_t millicores = 500;
  auto problem = [&](errc e, std::string reason) -> result<void> {
    if (why != nullptr) *why = std::move(reason);
    return make_error_code(e);
  };
  auto rc =
      create(name, {.memory_bytes = memory, .max_pids = pids, .cpu_quota_millicores = millicores});
  if (!rc) {
    return problem(errc_of_code(rc.error()),
                   fmt::format("a test cgroup with limits cannot be created under {}: {}",
                               describe(), rc.error().message()));
  }
  // The first word of a limit file ("67108864", "16", "50000 100000").
  auto first_word = [](const std::string& t) { return t.substr(0, t.find_first_of(" \n")); };
  std::optional<std::pair<errc, std::string>> bad;
  const std::string quota = std::to_string(std::uint64_t{millicores} * cpu_period_usec / 1000);
  for (const auto& p : rc->s_->parts) {
    std::vector<std::pair<const char*, std::string>> expect;
    if (p.has(memory_ctrl)) {
      expect.emplace_back(p.is_v2 ? "memory.max" : "memory.limit_in_bytes", std::to_string(memory));
    }
    if (p.has(pids_ctrl)) expect.emplace_back("pids.max", std::to_string(pids));
    if (p.has(cpu_ctrl)) expect.emplace_back(p.is_v2 ? "cpu.max" : "cpu.cfs_quota_us", quota);
    for (const auto& [file, want] : expect) {
      std::string text;
      fs::path path = p.dir / file;
      if (int e = read_file(path, text, small_file_max); e != 0) {
        bad = {errc::io_error, fmt::format("read(\"{}\"): {}", path.string(), errno_text(e))};
        break;
      }
      if (first_word(text) != want) {
        bad = {errc::unsupported,
               fmt::format("cgroup limit not effective: wrote {} to {} but it reads back {}; "
                           "the {} controller does not enforce limits in {} (enable it in the "
                           "parent's cgroup.subtree_control, or delegate a real cgroup subtree)",
                           want, path.string(),
                           first_word(text).empty() ? "nothing" : first_word(text),
                           std::string_view(file).substr(0, std::string_view(file).find('.')),
                           p.dir.parent_path().string())};
        break;
      }
    }
    if (bad) break;
  }
  if (auto removed = rc->remove(); !removed && !bad) {
    bad = {errc_of_code(removed.error()),
           fmt::format("the test cgroup {} cannot be removed: {}", std::string(name),
                       removed.error().message())};
  }
  if (bad) return problem(bad->first, bad->second);
  return {};
}

std::vector<std::string> cgroup_host::list() const {
  std::set<std::string> names;
  for (const auto& h : hierarchies_) {
    unique_fd fd(sys::retry_eintr([&] {
      return sys::get().open(h.parent_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK,
                             0);
    }));
    if (!fd) {
      emit(log_, log_level::warning,
           fmt::format("cgroup: open(\"{}\"): {}", h.parent_dir.string(), errno_text(errno)));
      continue;
    }
    int e = sys::read_dir(fd.get(), [&](std::string_view name, sys::dirent_type type) {
      if ((type == DT_DIR || type == DT_UNKNOWN) && valid_run_name(name)) {
        names.emplace(name);
      }
      return names.size() < list_max;
    });
    if (e != 0) {
      emit(log_, log_level::warning,
           fmt::format("cgroup: getdents64(\"{}\"): {}", h.parent_dir.string(), errno_text(e)));
    }
  }
  return {names.begin(), names.end()};
}

result<void> cgroup_host::destroy(std::string_view name) const {
  if (!valid_run_name(name)) return make_error_code(errc::invalid_argument);
  run_cgroup rc = make_run(name);
  auto& st = *rc.s_;
  // A crash can leave the cgroup in some hierarchies only: keep those that exist.
  std::vector<run_cgroup::state::part> present;
  st.dirs.clear();
  for (auto& p : st.parts) {
    if (path_exists(p.dir)) {
      st.dirs.push_back(p.dir);
      present.push_back(std::move(p));
    }
  }
  st.parts = std::move(present);
  if (st.parts.empty()) return {};

  constexpr std::timespec poll_interval{0, 10'000'000};  // 10 ms × 200 ≈ 2 s
  constexpr int polls = 200;
  if (auto r = rc.kill_all(); !r) return r;
  bool empty = false;
  for (int i = 0; i < polls; ++i) {
    auto e = rc.is_empty();
    if (!e) return e.error();
    if (*e) {
      empty = true;
      break;
    }
    if (i % 20 == 19) (void)rc.kill_all();  // anything that slipped through
    sys::get().sleep_for(poll_interval);
  }
  if (!empty) {
    st.warn(fmt::format("{} still populated after kill; not removed", st.dirs.front().string()));
    return make_error_code(errc::busy);
  }
  // rmdir can briefly say EBUSY while the last exits are being accounted.
  for (int i = 0; i < polls; ++i) {
    auto r = rc.remove();
    if (r || r.error() != make_error_code(errc::busy)) return r;
    sys::get().sleep_for(poll_interval);
  }
  return make_error_code(errc::busy);
}

// --- a delegated cgroup (systemd Delegate=yes) --------------------------------------------

result<delegated_cgroup> enter_delegated_cgroup(const fs::path& root, const fs::path& mountinfo,
                                                const fs::path& proc_cgroup, std::string* why,
                                                log_sink log) {
  auto fail = [&](errc e, const std::string& reason) -> result<delegated_cgroup> {
    emit(log, log_level::warning, "cgroup: " + reason);
    if (why != nullptr) *why = reason;
    return make_error_code(e);
  };
  // 1. Pure cgroup v2: one cgroup2 mount at `root`, no v1 hierarchy beside it. On v1 and
  //    hybrid hosts the controllers live in per-controller trees, and a service manager hands
  //    over no single subtree there.
  std::string text;
  if (int e = read_file(mountinfo, text, mountinfo_max); e != 0) {
    return fail(errc::io_error, fmt::format("read(\"{}\"): {}", mountinfo.string(), errno_text(e)));
  }
  const std::string root_s = normalize(root);
  bool v2_at_root = false;
  std::vector<std::string> v1;
  for (const auto& m : parse_mountinfo(text)) {
    if (!is_under(m.mountpoint, root_s)) continue;
    if (m.fstype == "cgroup2" && m.mountpoint == root_s) v2_at_root = true;
    if (m.fstype == "cgroup") v1.push_back(m.mountpoint);
  }
  if (!v2_at_root || !v1.empty()) {
    return fail(errc::unsupported,
                fmt::format("a delegated cgroup needs pure cgroup v2 (one cgroup2 mount at {}); "
                            "this host is {}: start the daemon with --cgroup-parent naming a "
                            "subtree delegated in every hierarchy instead "
                            "(docs/deployment.md, \"cgroup v1 and hybrid hosts\")",
                            root_s, v1.empty() ? "not cgroup v2" : "cgroup v1 or hybrid"));
  }
  // 2. Our own cgroup: the "0::<path>" line of /proc/self/cgroup (cgroups(7)).
  if (int e = read_file(proc_cgroup, text, small_file_max); e != 0) {
    return fail(errc::io_error,
                fmt::format("read(\"{}\"): {}", proc_cgroup.string(), errno_text(e)));
  }
  std::optional<std::string> own;
  for (std::string_view rest = text; !rest.empty();) {
    std::size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (line.substr(0, 3) == "0::") own = std::string(line.substr(3));
  }
  if (!own) {
    return fail(errc::unsupported, fmt::format("{} has no cgroup2 line (\"0::\"): not a cgroup "
                                               "v2 host",
                                               proc_cgroup.string()));
  }
  if (own->empty() || own->front() != '/' || own->find("/..") != std::string::npos ||
      own->find("/./") != std::string::npos) {
    return fail(errc::invalid_argument,
                fmt::format("{}: unusable cgroup2 path \"{}\"", proc_cgroup.string(), *own));
  }
  const std::string own_path = normalize(*own);
  // "/" is either the host's root cgroup (nothing delegated) or the root of a cgroup
  // namespace, e.g. a container's own cgroup under Kubernetes or Nomad, which is ours:
  // only non-root cgroups have cgroup.type (cgroup-v2.rst, "Core Interface Files").
  if (own_path == "/" && !path_exists(fs::path(root_s) / "cgroup.type")) {
    return fail(errc::unsupported,
                "this process is in the root cgroup, not in one delegated to it: start it from "
                "a service manager with Delegate=yes (deploy/systemd/agent-sandbox.service), "
                "or use --cgroup-parent");
  }
  const fs::path dir = own_path == "/" ? fs::path(root_s) : fs::path(root_s) / own_path.substr(1);
  const std::string base = own_path == "/" ? std::string() : own_path;
  // 3. Delegated means ours to write: the directory (for children), cgroup.procs (to move
  //    into one) and cgroup.subtree_control (to enable controllers for them).
  for (const fs::path& p : {dir, dir / "cgroup.procs", dir / "cgroup.subtree_control"}) {
    if (sys::get().faccessat(AT_FDCWD, p.c_str(), W_OK, AT_EACCESS) != 0) {
      int e = errno;
      return fail(errc_of(e) == errc::permission_denied ? errc::permission_denied : errc::io_error,
                  fmt::format("access(\"{}\", W_OK): {}: the cgroup {} is not delegated to this "
                              "process; set Delegate=yes in its systemd unit (or chown the "
                              "directory and these files to its user)",
                              p.string(), errno_text(e), own_path));
    }
  }
  // 4. The controllers runs need must be offered to it (enabled in its parent's
  //    subtree_control: what Delegate=yes does).
  if (int e = read_file(dir / "cgroup.controllers", text, small_file_max); e != 0) {
    return fail(errc::io_error, fmt::format("read(\"{}\"): {}",
                                            (dir / "cgroup.controllers").string(), errno_text(e)));
  }
  auto offered = words(text);
  for (const char* c : {memory_ctrl, pids_ctrl}) {
    if (offered.count(c) == 0) {
      return fail(errc::unsupported,
                  fmt::format("the {} controller is not offered to the delegated cgroup {} "
                              "(its cgroup.controllers: \"{}\"): set Delegate=yes, or at least "
                              "Delegate=memory pids cpu, in the unit",
                              c, own_path, std::string(trim(text))));
    }
  }
  // 5. Into the leaf: "0" is the writing process, and cgroup.procs moves every thread of it.
  delegated_cgroup d{.own = own_path, .leaf = base + "/daemon", .parent = base + "/runs"};
  const fs::path leaf = dir / "daemon";
  if (sys::retry_eintr([&] { return sys::get().mkdir(leaf.c_str(), 0755); }) != 0 &&
      errno != EEXIST) {
    int e = errno;
    return fail(errc_of(e), fmt::format("mkdir(\"{}\"): {}", leaf.string(), errno_text(e)));
  }
  if (int e = write_file(leaf / "cgroup.procs", "0"); e != 0) {
    return fail(errc_of(e), fmt::format("write(\"{}\", \"0\"): {}",
                                        (leaf / "cgroup.procs").string(), errno_text(e)));
  }
  emit(log, log_level::info, fmt::format("cgroup: moved into the delegated leaf {}", d.leaf));
  // 6. The runs' parent, set up by the same code as every run parent: it enables the
  //    controllers in <own>/cgroup.subtree_control (EBUSY there: another process is still
  //    in <own>, e.g. a wrapper script that did not exec).
  std::string open_why;
  if (auto host = cgroup_host::open(root, mountinfo, d.parent, &open_why, log); !host) {
    return fail(errc_of_code(host.error()),
                fmt::format("cannot set up the runs' cgroup {}: {}", d.parent, open_why));
  }
  return d;
}

}  // namespace sandbox::detail
