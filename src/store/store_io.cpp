#include "store/store_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <memory>
#include <vector>

#include "protocol/sha256.hpp"
#include "sys/io.hpp"
#include "sys/random.hpp"

namespace sandbox::detail {

boost::system::error_code to_store_error(const boost::system::error_code& ec) noexcept {
  if (ec.category() == error_category()) return ec;
  if (ec.category() != boost::system::system_category() &&
      ec.category() != boost::system::generic_category()) {
    return store_error(errc::io_error);
  }
  switch (ec.value()) {
    case ENOENT:
      return store_error(errc::not_found);
    case EACCES:
    case EPERM:
    case EROFS:
      return store_error(errc::permission_denied);
    case EEXIST:
      return store_error(errc::already_exists);
    default:
      return store_error(errc::io_error);
  }
}

void store_logger::operator()(log_level level, std::string_view line) const noexcept {
  try {
    if (sink_) {
      sink_(level, line);
      return;
    }
    if (level < log_level::warning) return;
    std::string out = "agent-sandbox: ";
    out += level == log_level::error ? "error: " : "warning: ";
    out += line;
    out += '\n';
    (void)!::write(STDERR_FILENO, out.data(), out.size());
  } catch (...) {
    // Logging must never take the store down.
  }
}

namespace {

int retry_open_at(int dirfd, const char* name, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::openat(dirfd, name, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

result<unique_fd> open_dir_at(int dirfd, const std::string& name) noexcept {
  int fd = retry_open_at(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return sys_error(errno);
  return unique_fd(fd);
}

result<unique_fd> ensure_dir_at(int dirfd, const std::string& name, mode_t mode) noexcept {
  if (::mkdirat(dirfd, name.c_str(), mode) != 0 && errno != EEXIST) return sys_error(errno);
  return open_dir_at(dirfd, name);
}

result<unique_fd> open_store_root(const std::filesystem::path& root, bool create,
                                  mode_t mode) noexcept {
  try {
    if (root.empty() || !root.is_absolute()) return store_error(errc::invalid_argument);
    std::filesystem::path p = root.lexically_normal();
    if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
    if (create && p != p.root_path()) {
      std::error_code ec;
      std::filesystem::create_directories(p.parent_path(), ec);
      if (ec) return sys_error(ec.value());
      if (::mkdir(p.c_str(), mode) != 0 && errno != EEXIST) return sys_error(errno);
    }
    int fd = retry_open_at(AT_FDCWD, p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return sys_error(errno);
    return unique_fd(fd);
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

result<std::size_t> read_full(int fd, void* buf, std::size_t n) noexcept {
  char* p = static_cast<char*>(buf);
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pfd{fd, POLLIN, 0};
        (void)::poll(&pfd, 1, -1);
        continue;
      }
      return sys_error(errno);
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

result<unique_fd> open_regular_at(int dirfd, const std::string& name) noexcept {
  // O_NONBLOCK: opening a FIFO planted under this name must not block; it is refused below.
  int fd = retry_open_at(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return sys_error(errno);
  unique_fd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return sys_error(errno);
  if (!S_ISREG(st.st_mode)) return sys_error(EINVAL);
  // Regular files ignore O_NONBLOCK for reads, but clear it so later readers see plain I/O.
  int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return owned;
}

result<std::string> read_file_at(int dirfd, const std::string& name,
                                 std::uint64_t max_bytes) noexcept {
  auto fd = open_regular_at(dirfd, name);
  if (!fd) return fd.error();
  try {
    std::string out;
    char buf[65536];
    for (;;) {
      auto r = read_full(fd->get(), buf, sizeof buf);
      if (!r) return r.error();
      if (*r == 0) break;
      if (out.size() + *r > max_bytes) return sys_error(EFBIG);
      out.append(buf, *r);
      if (*r < sizeof buf) break;
    }
    return out;
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

result<void> replace_file_at(int dirfd, const std::string& name, std::string_view data,
                             mode_t mode) noexcept {
  try {
    auto tmp_name = temp_name(".tmp-");
    if (!tmp_name) return tmp_name.error();
    const std::string& tmp = *tmp_name;
    int fd = retry_open_at(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                           0600);
    if (fd < 0) return sys_error(errno);
    unique_fd owned(fd);
    (void)::flock(fd, LOCK_EX | LOCK_NB);  // marks the temp file as alive for stale cleanup
    auto fail = [&](int e) -> result<void> {
      (void)::unlinkat(dirfd, tmp.c_str(), 0);
      return sys_error(e);
    };
    if (!write_all(fd, data.data(), data.size())) return fail(errno);
    if (::fchmod(fd, mode) != 0) return fail(errno);
    if (::fsync(fd) != 0) return fail(errno);
    if (::renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0) return fail(errno);
    (void)::fsync(dirfd);
    return {};
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

result<std::pair<std::string, std::uint64_t>> hash_fd(int fd) noexcept {
  try {
    constexpr std::size_t buffer_size = 1 << 20;
    std::unique_ptr<char[]> buf(new char[buffer_size]);
    sha256 h;
    std::uint64_t total = 0;
    for (;;) {
      auto r = read_full(fd, buf.get(), buffer_size);
      if (!r) return r.error();
      if (*r == 0) break;
      h.update(buf.get(), *r);
      total += *r;
      if (*r < buffer_size) break;
    }
    std::string hex = h.hex_digest();
    if (hex.empty()) return sys_error(ENOMEM);
    return std::make_pair(std::move(hex), total);
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

result<std::string> temp_name(std::string_view prefix, std::size_t random_bytes) {
  auto hex = random_hex(random_bytes);
  if (!hex) return sys_error(errno);
  return std::string(prefix) + *hex;
}

// Lists the names in the directory open at `fd` (without "." and ".."); `fd` stays open.
result<std::vector<std::string>> list_dir_names(int fd) noexcept {
  try {
    int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return sys_error(errno);
    DIR* d = ::fdopendir(dup_fd);
    if (d == nullptr) {
      int e = errno;
      ::close(dup_fd);
      return sys_error(e);
    }
    std::unique_ptr<DIR, int (*)(DIR*)> guard(d, ::closedir);
    ::rewinddir(d);
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      dirent* e = ::readdir(d);
      if (e == nullptr) {
        if (errno != 0) return sys_error(errno);
        break;
      }
      std::string_view n = e->d_name;
      if (n == "." || n == "..") continue;
      names.emplace_back(n);
    }
    return names;
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

bool is_plain_name(std::string_view name) noexcept {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

result<std::pair<unique_fd, std::string>> create_temp_file_at(int dirfd,
                                                              std::string_view prefix) noexcept {
  try {
    for (int attempt = 0; attempt < 8; ++attempt) {
      auto random_name = temp_name(prefix);
      if (!random_name) return random_name.error();
      std::string name = std::move(*random_name);
      int fd = retry_open_at(dirfd, name.c_str(),
                             O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) {
        if (errno == EEXIST) continue;
        return sys_error(errno);
      }
      unique_fd owned(fd);
      // A cleaner that found the file in the moment before this lock holds the lock itself
      // (and removes the name), or already removed it: start over under a new name, so a
      // file this writer holds locked is always one that is still linked.
      struct stat st {};
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0 || ::fstat(fd, &st) != 0 || st.st_nlink == 0) {
        continue;
      }
      return std::make_pair(std::move(owned), std::move(name));
    }
    return sys_error(EEXIST);
  } catch (...) {
    return sys_error(ENOMEM);
  }
}

namespace {

bool is_mount_root(int dirfd, const char* name) noexcept {
  struct statx stx {};
  if (::statx(dirfd, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, STATX_BASIC_STATS, &stx) != 0) {
    return false;
  }
  return (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0 &&
         (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
}

result<void> remove_tree_impl(int dirfd, const std::string& name, dev_t dev, int depth) noexcept {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? result<void>{} : result<void>{sys_error(errno)};
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) return sys_error(errno);
    return {};
  }
  // Never empty another filesystem that happens to be mounted inside the tree (a bind mount
  // left behind by a crashed debootstrap would otherwise lose the host's files).
  if (st.st_dev != dev || is_mount_root(dirfd, name.c_str())) return sys_error(EXDEV);
  if (depth > 1024) return sys_error(ELOOP);
  int fd = retry_open_at(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) {
    // A read-only directory from an image: we own it, so make it searchable again.
    if (::fchmodat(dirfd, name.c_str(), 0700, 0) == 0) {
      fd = retry_open_at(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
  }
  if (fd < 0) return errno == ENOENT ? result<void>{} : result<void>{sys_error(errno)};
  unique_fd dir(fd);
  struct stat again {};
  if (::fstat(fd, &again) != 0) return sys_error(errno);
  if (again.st_ino != st.st_ino || again.st_dev != st.st_dev) return sys_error(EAGAIN);
  if ((again.st_mode & 0700) != 0700) (void)::fchmod(fd, (again.st_mode & 07777) | 0700);
  // Re-list until empty: entries removed while reading a directory can hide others.
  for (int round = 0; round < 16; ++round) {
    auto names = list_dir_names(fd);
    if (!names) return names.error();
    if (names->empty()) break;
    for (const auto& child : *names) {
      auto r = remove_tree_impl(fd, child, dev, depth + 1);
      if (!r) return r;
    }
  }
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return sys_error(errno);
  }
  return {};
}

}  // namespace

result<void> remove_tree_at(int dirfd, const std::string& name) noexcept {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return sys_error(EINVAL);
  }
  struct stat st {};
  if (::fstat(dirfd, &st) != 0) return sys_error(errno);
  return remove_tree_impl(dirfd, name, st.st_dev, 0);
}

void remove_stale_temps(int dirfd, std::string_view prefix, long min_age_s,
                        const store_logger& log) noexcept {
  auto names = list_dir_names(dirfd);
  if (!names) return;
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  for (const auto& n : *names) {
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    int fd = retry_open_at(dirfd, n.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;  // e.g. a symlink: not ours to judge here
    unique_fd owned(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) continue;
    if (now - st.st_mtime < min_age_s) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) continue;  // its writer is alive
    auto r = remove_tree_at(dirfd, n);
    if (!r) {
      try {
        log(log_level::warning,
            "store: removing stale temp entry " + n + ": " + r.error().message());
      } catch (...) {
      }
    }
  }
}

result<file_lock> file_lock::acquire(int dirfd, const std::string& name, bool exclusive,
                                     bool create) noexcept {
  int flags = O_NOFOLLOW | O_CLOEXEC | (create ? (O_RDWR | O_CREAT) : O_RDONLY);
  int fd = retry_open_at(dirfd, name.c_str(), flags, 0600);
  if (fd < 0) return sys_error(errno);
  file_lock lock;
  lock.fd_.reset(fd);
  while (::flock(fd, exclusive ? LOCK_EX : LOCK_SH) != 0) {
    if (errno != EINTR) return sys_error(errno);
  }
  return lock;
}

std::string rfc3339_now() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string(buf, n);
}

bool is_hex64(std::string_view s) noexcept {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace sandbox::detail
