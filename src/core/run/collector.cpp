// Output collection (see collector.hpp).
//
// Order of checks for each entry, and why:
//  1. the name (bad names are never opened: they cannot be returned anyway);
//  2. fstatat(AT_SYMLINK_NOFOLLOW): only regular files go further, so a symlink, FIFO,
//     socket, device or directory is never opened;
//  3. the count and byte caps, on the size from step 2, so an over-cap file (a sparse 1 TiB
//     file, say) is dropped without being opened or read;
//  4. openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)
//     with O_NOFOLLOW | O_NONBLOCK: an entry swapped for a symlink since step 2 fails with
//     ELOOP, one swapped for a FIFO opens without blocking; fallback openat(O_NOFOLLOW) where
//     openat2 is missing (the name is one component, so there is nothing else to resolve);
//  5. fstat on the descriptor: it must still be a regular file, and its size is checked
//     against the caps again;
//  6. read at most that size (never more than the remaining byte budget) and store it.
// The program owns its output directory and the files in it, so it can take away the owner's
// permissions. On unprivileged hosts the host reads them as that very owner (root is not
// bound by permissions): the collector gives the owner read and search permission back on
// the directory before scanning, and read permission on a regular file whose open failed with
// EACCES (fchmodat with AT_SYMLINK_NOFOLLOW, one name component: nothing is followed), so
// modes can neither hide an entry nor make the result depend on the host's privileges.
// Host-side failures (a read error, a store I/O error) are logged; the entry is listed as
// `not_regular_file` (could not be read as one), `quota_exceeded` (the tenant's quota) or
// `store_error` (the store failed otherwise, e.g. a full disk).
#include "core/run/collector.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <queue>
#include <string>
#include <system_error>
#include <vector>

#include "sys/sys.hpp"

namespace sandbox::detail {
namespace {

/// Entries counted past the scan limit, at most (so `unscanned` costs bounded time).
constexpr std::uint64_t max_extra_count = 1 << 20;

std::string errno_text(int e) { return std::system_category().message(e); }

/// A name is returned as written only if it is valid UTF-8 without control or invisible
/// formatting characters, i.e. exactly when its display form is itself.
bool is_good_name(std::string_view name) {
  return is_valid_utf8(name) && escape_name_for_display(name) == name;
}

struct collector {
  const collect_limits& limits;
  blob_store& store;
  std::string_view tenant;
  const log_sink& log;
  int dirfd;
  collected_outputs out = {};
  std::uint64_t used_bytes = 0;
  bool no_openat2 = false;

  void note(log_level level, const std::string& line) const {
    if (log) log(level, "collect: " + line);
  }
  void drop(std::string_view name, drop_reason reason) {
    out.dropped.push_back({.name_display = escape_name_for_display(name), .reason = reason});
  }

  /// Gives the owner read and search permission on the output directory back (see the top
  /// of this file); a failure is logged and the scan goes on.
  void restore_dir_access() {
    constexpr mode_t need = S_IRUSR | S_IXUSR;
    struct stat st {};
    if (sys::get().fstat(dirfd, &st) != 0 || (st.st_mode & need) == need) return;
    if (sys::get().fchmod(dirfd, (st.st_mode & 07777) | need) != 0) {
      note(log_level::warning,
           fmt::format("fchmod(dirfd, {:o}): {}", (st.st_mode & 07777) | need, errno_text(errno)));
    }
  }

  /// Gives the owner read permission on the regular file `name` back, never following a
  /// link. True when it did.
  bool restore_read_access(const std::string& name, const struct stat& st) {
    const mode_t mode = (st.st_mode & 07777) | S_IRUSR;
    if (sys::get().fchmodat(dirfd, name.c_str(), mode, AT_SYMLINK_NOFOLLOW) == 0) return true;
    note(log_level::warning, fmt::format("fchmodat(\"{}\", {:o}, AT_SYMLINK_NOFOLLOW): {}",
                                         escape_for_display(name), mode, errno_text(errno)));
    return false;
  }

  /// The names to visit: the `max_scan_entries` smallest in byte order (deterministic
  /// whatever order the directory lists them in), sorted; counts the rest as unscanned.
  std::vector<std::string> scan() {
    std::vector<std::string> names;
    auto& s = sys::get();
    restore_dir_access();
    unique_fd fd(sys::retry_eintr([&] {
      // A descriptor of our own: reading the caller's would move its directory offset.
      return s.openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK, 0);
    }));
    if (!fd) {
      note(log_level::error, fmt::format("openat(dirfd, \".\"): {}", errno_text(errno)));
      return names;
    }
    const std::size_t max = limits.max_scan_entries;
    std::priority_queue<std::string> kept;  // max-heap: top is the largest kept name
    std::uint64_t seen = 0;
    const std::uint64_t stop_at = max + max_extra_count;
    int e = sys::read_dir(fd.get(), [&](std::string_view name, sys::dirent_type) {
      ++seen;
      if (kept.size() < max) {
        kept.emplace(name);
      } else if (max > 0 && name < std::string_view(kept.top())) {
        kept.pop();
        kept.emplace(name);
      }
      return seen < stop_at;
    });
    if (e != 0) note(log_level::error, fmt::format("getdents64: {}", errno_text(e)));
    if (seen >= stop_at) {
      note(log_level::warning,
           fmt::format("stopped counting entries at {}; `unscanned` is a lower bound", seen));
    }
    out.unscanned = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(seen - kept.size(), std::numeric_limits<std::uint32_t>::max()));
    names.reserve(kept.size());
    while (!kept.empty()) {
      names.push_back(kept.top());
      kept.pop();
    }
    std::reverse(names.begin(), names.end());
    return names;
  }

  /// Opens `name` for reading without following anything and without blocking. Returns the
  /// descriptor or -1 with errno.
  int open_entry(const std::string& name) {
    auto& s = sys::get();
    constexpr int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
    if (!no_openat2) {
      sys::open_how how;
      how.flags = static_cast<std::uint64_t>(flags);
      how.resolve = sys::resolve_beneath | sys::resolve_no_symlinks | sys::resolve_no_magiclinks |
                    sys::resolve_no_xdev;
      int fd = sys::retry_eintr([&] { return s.openat2(dirfd, name.c_str(), how); });
      // ENOSYS: kernel < 5.6; EPERM/E2BIG: a seccomp profile or an old struct size. The
      // fallback is as safe here: the name is a single component.
      if (fd >= 0 || (errno != ENOSYS && errno != EPERM && errno != E2BIG)) return fd;
      note(log_level::info,
           fmt::format("openat2: {}; falling back to openat(O_NOFOLLOW)", errno_text(errno)));
      no_openat2 = true;
    }
    return sys::retry_eintr([&] { return s.openat(dirfd, name.c_str(), flags, 0); });
  }

  /// Reads exactly up to `size` bytes (less if the file is shorter now). Returns 0 or errno.
  static int read_all(int fd, std::uint64_t size, std::string& data) {
    data.resize(static_cast<std::size_t>(size));
    std::size_t off = 0;
    while (off < data.size()) {
      ssize_t n = sys::retry_eintr(
          [&] { return sys::get().read(fd, data.data() + off, data.size() - off); });
      if (n < 0) return errno;
      if (n == 0) break;
      off += static_cast<std::size_t>(n);
    }
    data.resize(off);
    return 0;
  }

  void visit(const std::string& name) {
    // 1. The name.
    if (!is_good_name(name)) {
      drop(name, drop_reason::bad_name);
      return;
    }
    // 2. Classify without following.
    struct stat st {};
    if (sys::get().fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      int e = errno;
      if (e == ENOENT) return;  // gone since the scan: nothing to return or list
      note(log_level::warning,
           fmt::format("fstatat(\"{}\"): {}", escape_for_display(name), errno_text(e)));
      drop(name, drop_reason::not_regular_file);
      return;
    }
    if (!S_ISREG(st.st_mode)) {
      drop(name, drop_reason::not_regular_file);
      return;
    }
    // 3. Caps, before opening anything.
    if (out.files.size() >= limits.max_files) {
      drop(name, drop_reason::count_limit);
      return;
    }
    const std::uint64_t remaining = limits.max_bytes - used_bytes;
    if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) > remaining) {
      drop(name, drop_reason::bytes_limit);
      return;
    }
    // 4. Open (once more after giving read permission back, if the program took it).
    unique_fd fd(open_entry(name));
    int open_errno = fd ? 0 : errno;
    if (open_errno == EACCES && restore_read_access(name, st)) {
      fd.reset(open_entry(name));
      open_errno = fd ? 0 : errno;
    }
    if (!fd) {
      int e = open_errno;
      if (e == ENOENT) return;
      if (e != ELOOP && e != ENXIO && e != EXDEV) {
        note(log_level::warning,
             fmt::format("openat2(\"{}\"): {}", escape_for_display(name), errno_text(e)));
      }
      drop(name, drop_reason::not_regular_file);
      return;
    }
    // 5. What we opened, not what we saw.
    struct stat ost {};
    if (sys::get().fstat(fd.get(), &ost) != 0) {
      note(log_level::warning,
           fmt::format("fstat(\"{}\"): {}", escape_for_display(name), errno_text(errno)));
      drop(name, drop_reason::not_regular_file);
      return;
    }
    if (!S_ISREG(ost.st_mode)) {
      drop(name, drop_reason::not_regular_file);
      return;
    }
    if (ost.st_size < 0 || static_cast<std::uint64_t>(ost.st_size) > remaining) {
      drop(name, drop_reason::bytes_limit);
      return;
    }
    // 6. Read and store.
    std::string data;
    if (int e = read_all(fd.get(), static_cast<std::uint64_t>(ost.st_size), data); e != 0) {
      note(log_level::warning,
           fmt::format("read(\"{}\"): {}", escape_for_display(name), errno_text(e)));
      drop(name, drop_reason::not_regular_file);
      return;
    }
    auto id = store.put(tenant, data);
    if (!id) {
      if (id.error() == make_error_code(errc::quota_exceeded)) {
        drop(name, drop_reason::quota_exceeded);
        return;
      }
      // Not the tenant's quota: the host's storage (a full disk, an I/O error).
      note(log_level::error,
           fmt::format("blob_store::put(\"{}\", {} bytes): {}", escape_for_display(name),
                       data.size(), id.error().message()));
      drop(name, drop_reason::store_error);
      return;
    }
    used_bytes += data.size();
    out.files.push_back({.name = name, .blob = std::move(*id), .bytes = data.size()});
  }
};

}  // namespace

collected_outputs collect_outputs(int dirfd, const collect_limits& limits, blob_store& store,
                                  std::string_view tenant, const log_sink& log) {
  collector c{.limits = limits, .store = store, .tenant = tenant, .log = log, .dirfd = dirfd};
  try {
    for (const auto& name : c.scan()) c.visit(name);
  } catch (const std::exception& e) {  // std::bad_alloc: keep what was collected so far
    if (log) log(log_level::error, std::string("collect: ") + e.what());
  }
  return std::move(c.out);
}

}  // namespace sandbox::detail
