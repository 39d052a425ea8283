// A thin, injectable layer over the system calls whose failures the core's mechanisms must
// handle (private to src/). Library code calls `sys::get().<call>(...)`; unit tests install
// their own `sys::ops` for the current thread with `sys::scoped_override` to inject EINTR,
// EPERM, ENOSYS, EBUSY, or to emulate what plain files cannot (rmdir of a populated cgroup,
// a file swapped between two calls). Modelled on fmt's `test/posix-mock.h`, but virtual
// instead of link-time, so production code and tests link the same objects.
//
// Every call has the libc contract: the result on success; -1 with `errno` set on failure.
// None retries on EINTR: callers decide (most retry through `sys::retry_eintr`).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string_view>
#include <type_traits>

#include "sys/unique_fd.hpp"

namespace sandbox::detail::sys {

/// `struct open_how` of openat2(2), declared here so the layer builds against old headers.
struct open_how {
  std::uint64_t flags = 0;
  std::uint64_t mode = 0;
  std::uint64_t resolve = 0;
};

// openat2(2) resolve flags (linux/openat2.h, Linux 5.6).
inline constexpr std::uint64_t resolve_no_xdev = 0x01;
inline constexpr std::uint64_t resolve_no_magiclinks = 0x02;
inline constexpr std::uint64_t resolve_no_symlinks = 0x04;
inline constexpr std::uint64_t resolve_beneath = 0x08;

/// The system calls, one virtual function each; the base class makes the real call.
/// Implementations must be safe to call from any thread.
class ops {
 public:
  ops() = default;
  ops(const ops&) = delete;
  ops& operator=(const ops&) = delete;
  virtual ~ops() = default;

  /// open(2).
  virtual int open(const char* path, int flags, mode_t mode) noexcept;
  /// openat(2).
  virtual int openat(int dirfd, const char* path, int flags, mode_t mode) noexcept;
  /// openat2(2) through syscall(SYS_openat2): -1/ENOSYS on kernels before 5.6.
  virtual int openat2(int dirfd, const char* path, const open_how& how) noexcept;
  /// read(2).
  virtual ssize_t read(int fd, void* buf, std::size_t count) noexcept;
  /// write(2).
  virtual ssize_t write(int fd, const void* buf, std::size_t count) noexcept;
  /// close(2).
  virtual int close(int fd) noexcept;
  /// fstat(2).
  virtual int fstat(int fd, struct stat* st) noexcept;
  /// fstatat(2) (`flags` e.g. AT_SYMLINK_NOFOLLOW).
  virtual int fstatat(int dirfd, const char* path, struct stat* st, int flags) noexcept;
  /// fchmod(2).
  virtual int fchmod(int fd, mode_t mode) noexcept;
  /// fchmodat(2) (`flags` 0 or AT_SYMLINK_NOFOLLOW: glibc then refuses a symlink with
  /// EOPNOTSUPP instead of following it).
  virtual int fchmodat(int dirfd, const char* path, mode_t mode, int flags) noexcept;
  /// getdents64(2): fills `buf` with `struct linux_dirent64` records; 0 at the end.
  virtual ssize_t getdents64(int fd, void* buf, std::size_t count) noexcept;
  /// mkdir(2).
  virtual int mkdir(const char* path, mode_t mode) noexcept;
  /// faccessat(2) (`flags` e.g. AT_EACCESS).
  virtual int faccessat(int dirfd, const char* path, int mode, int flags) noexcept;
  /// rmdir(2).
  virtual int rmdir(const char* path) noexcept;
  /// kill(2).
  virtual int kill(pid_t pid, int sig) noexcept;
  /// eventfd(2) (`flags` e.g. EFD_CLOEXEC | EFD_NONBLOCK).
  virtual int eventfd(unsigned int initval, int flags) noexcept;
  /// inotify_init1(2).
  virtual int inotify_init1(int flags) noexcept;
  /// inotify_add_watch(2).
  virtual int inotify_add_watch(int fd, const char* path, std::uint32_t mask) noexcept;
  /// Sleeps `duration` (nanosleep(2), restarted on EINTR). Tests make this return at once.
  virtual void sleep_for(std::timespec duration) noexcept;
};

/// The real system calls (a process-wide instance of the base class).
ops& real() noexcept;

/// The calls in effect on this thread: the innermost `scoped_override`, else `real()`.
ops& get() noexcept;

/// Installs `o` for the current thread until destroyed (nestable; strictly LIFO). Tests
/// only: library code never installs one, so other threads always see the real calls.
class scoped_override {
 public:
  explicit scoped_override(ops& o) noexcept;
  ~scoped_override();
  scoped_override(const scoped_override&) = delete;
  scoped_override& operator=(const scoped_override&) = delete;

 private:
  ops* previous_;
};

/// Calls `f()` again while it returns -1 with errno EINTR, at most 1000 times (a signal
/// storm cannot hang the caller); returns its last result, errno as it left it.
template <class F>
auto retry_eintr(F&& f) noexcept -> decltype(f()) {
  decltype(f()) r = f();
  for (int i = 0; i < 1000 && r == -1 && errno == EINTR; ++i) r = f();
  return r;
}

/// Type of a directory entry as getdents64 reports it (DT_REG, DT_DIR, ... or DT_UNKNOWN).
using dirent_type = unsigned char;

/// Callback of `read_dir`: one entry (never "." or ".."); return false to stop early.
using dirent_visitor = bool (*)(void* ctx, const char* name, std::size_t name_len,
                                dirent_type type);

/**
 * Reads the entries of the directory open at `fd` (from its current offset) through
 * `get().getdents64`, calling `visit(ctx, ...)` for each until the end or until it returns
 * false. Memory: one 32 KiB buffer. Returns 0, or the errno of the failing getdents64 call
 * (EINTR is retried).
 */
int read_dir(int fd, dirent_visitor visit, void* ctx) noexcept;

/// `read_dir` with any callable `bool(std::string_view name, dirent_type type)`; the
/// callable must not throw.
template <class F>
int read_dir(int fd, F&& f) noexcept {
  return read_dir(
      fd,
      [](void* ctx, const char* name, std::size_t len, dirent_type type) {
        return (*static_cast<std::remove_reference_t<F>*>(ctx))(std::string_view(name, len), type);
      },
      &f);
}

}  // namespace sandbox::detail::sys
