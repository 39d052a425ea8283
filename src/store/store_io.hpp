// Small, link-safe filesystem helpers shared by the blob store and the image store (private to
// src/). Everything works relative to directory descriptors and never follows a symlink in
// the last path component; helpers retry on EINTR and never throw.
//
// Errors: helpers return `result<T>` whose error is a *system* error code (errno), so callers
// can log the syscall's reason; `to_store_error` maps it to a `sandbox::errc` at the API edge.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sandbox/error.hpp"
#include "sandbox/span.hpp"
#include "sys/io.hpp"
#include "sys/sys_error.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/// A sandbox-category error code.
inline boost::system::error_code store_error(errc e) noexcept { return make_error_code(e); }

/// Maps an error from these helpers to the store's codes: ENOENT → `not_found`,
/// EACCES/EPERM/EROFS → `permission_denied`, EEXIST → `already_exists`, other errno →
/// `io_error`; sandbox-category codes pass through.
boost::system::error_code to_store_error(const boost::system::error_code& ec) noexcept;

/// Host log lines of a store: forwards to `sink`, or (when empty) writes warnings and errors
/// to stderr as "agent-sandbox: <level>: <line>". Thread-safe; never throws.
class store_logger {
 public:
  store_logger() = default;
  explicit store_logger(log_sink sink) : sink_(std::move(sink)) {}
  void operator()(log_level level, std::string_view line) const noexcept;

 private:
  log_sink sink_;
};

/// Opens directory `name` under `dirfd` (O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC): a symlink there
/// fails with ELOOP/ENOTDIR instead of being followed.
result<unique_fd> open_dir_at(int dirfd, const std::string& name) noexcept;

/// Creates directory `name` under `dirfd` with `mode` if absent, then opens it as
/// `open_dir_at` does (an existing symlink is never followed).
result<unique_fd> ensure_dir_at(int dirfd, const std::string& name, mode_t mode) noexcept;

/**
 * Opens the store root `root` (absolute), creating it with `mode` (and missing parents with
 * 0755) when `create`. The root's last component is opened with O_NOFOLLOW; the parents are
 * the operator's choice and resolved normally. Relative path → `invalid_argument`.
 */
result<unique_fd> open_store_root(const std::filesystem::path& root, bool create,
                                  mode_t mode) noexcept;

/// Reads up to `n` bytes (fewer only at EOF); retries EINTR; waits with poll() on EAGAIN.
result<std::size_t> read_full(int fd, void* buf, std::size_t n) noexcept;

/**
 * Reads regular file `name` under `dirfd` (O_NOFOLLOW|O_NONBLOCK, checked with fstat: a
 * FIFO or device is refused with EINVAL, never opened for blocking reads). More than
 * `max_bytes` → EFBIG.
 */
result<std::string> read_file_at(int dirfd, const std::string& name,
                                 std::uint64_t max_bytes) noexcept;

/// Opens regular file `name` under `dirfd` read-only without following links; a non-regular
/// file fails with EINVAL.
result<unique_fd> open_regular_at(int dirfd, const std::string& name) noexcept;

/// Writes `data` to a new file `name` under `dirfd` atomically: a `.tmp-` file created with
/// O_EXCL|O_NOFOLLOW, fsync'ed, chmod `mode`, then renamed over `name`.
result<void> replace_file_at(int dirfd, const std::string& name, std::string_view data,
                             mode_t mode) noexcept;

/// Hashes everything readable from `fd` (from its current offset) to lowercase hex and
/// returns it with the byte count.
result<std::pair<std::string, std::uint64_t>> hash_fd(int fd) noexcept;

/// A fresh temporary name: `prefix` followed by 2 × `random_bytes` random hex digits
/// (sys/random.hpp). Errors: the errno of a failed getrandom(2), as a system code.
result<std::string> temp_name(std::string_view prefix, std::size_t random_bytes = 12);

/**
 * Deletes `name` under `dirfd` and, if it is a directory, everything below it. Never
 * follows a symlink (symlinks are unlinked, not followed) and never descends into another
 * filesystem (a mount point inside the tree fails with EXDEV, so a stray bind mount is not
 * emptied). A missing `name` is success. Directories deeper than 1024 levels fail with
 * ELOOP. Directories without write/search permission are made writable first (we own them).
 */
result<void> remove_tree_at(int dirfd, const std::string& name) noexcept;

/**
 * Removes stale temporary entries in `dirfd`: names starting with `prefix` whose owner died.
 * A writer holds `flock(LOCK_EX)` on its temp file or directory for as long as it works on
 * it; an entry whose lock can be taken and that is older than `min_age_s` seconds (covering
 * the gap between creating and locking) is removed. Errors are logged, not returned.
 */
void remove_stale_temps(int dirfd, std::string_view prefix, long min_age_s,
                        const store_logger& log) noexcept;

/// An flock() on a lock file, released on destruction. Move-only.
class file_lock {
 public:
  file_lock() = default;
  /// Locks file `name` under `dirfd`, creating it (mode 0600, O_NOFOLLOW) when `create`.
  /// Blocks until the lock is granted.
  static result<file_lock> acquire(int dirfd, const std::string& name, bool exclusive,
                                   bool create) noexcept;
  bool held() const noexcept { return static_cast<bool>(fd_); }

 private:
  unique_fd fd_;
};

/// Names in the directory open at `fd`, without "." and ".." (unordered); `fd` stays open.
result<std::vector<std::string>> list_dir_names(int fd) noexcept;

/// True for a single path component usable as a file name: 1..255 bytes, no '/', no NUL,
/// not "." or "..".
bool is_plain_name(std::string_view name) noexcept;

/// Creates a new temporary file `<prefix><random>` in `dirfd` (O_EXCL|O_NOFOLLOW|O_CLOEXEC,
/// mode 0600) and takes `flock(LOCK_EX)` on it so `remove_stale_temps` leaves it alone; when
/// a cleaner took the lock (or removed the name) first, it tries a new name, so the file
/// returned is locked and linked, and a cleaner with `min_age_s` 0 cannot take it.
/// Returns the descriptor (read-write) and the name.
result<std::pair<unique_fd, std::string>> create_temp_file_at(int dirfd,
                                                              std::string_view prefix) noexcept;

/// The current UTC time as RFC 3339 with seconds, e.g. "2025-05-20T12:00:00Z".
std::string rfc3339_now();

/// True when `s` is exactly 64 lowercase hex digits.
bool is_hex64(std::string_view s) noexcept;

}  // namespace sandbox::detail
