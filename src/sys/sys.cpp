// The real system calls behind `sandbox::detail::sys::ops` (see sys.hpp).
#include "sys/sys.hpp"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#ifndef SYS_openat2
#define SYS_openat2 437  // same number on every architecture (asm-generic, 5.6)
#endif

namespace sandbox::detail::sys {

int ops::open(const char* path, int flags, mode_t mode) noexcept {
  return ::open(path, flags, mode);
}

int ops::openat(int dirfd, const char* path, int flags, mode_t mode) noexcept {
  return ::openat(dirfd, path, flags, mode);
}

int ops::openat2(int dirfd, const char* path, const open_how& how) noexcept {
  open_how copy = how;  // the kernel takes a non-const pointer
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path, &copy, sizeof copy));
}

ssize_t ops::read(int fd, void* buf, std::size_t count) noexcept { return ::read(fd, buf, count); }

ssize_t ops::write(int fd, const void* buf, std::size_t count) noexcept {
  return ::write(fd, buf, count);
}

int ops::close(int fd) noexcept { return ::close(fd); }

int ops::fstat(int fd, struct stat* st) noexcept { return ::fstat(fd, st); }

int ops::fchmod(int fd, mode_t mode) noexcept { return ::fchmod(fd, mode); }

int ops::fchmodat(int dirfd, const char* path, mode_t mode, int flags) noexcept {
  return ::fchmodat(dirfd, path, mode, flags);
}

int ops::fstatat(int dirfd, const char* path, struct stat* st, int flags) noexcept {
  return ::fstatat(dirfd, path, st, flags);
}

ssize_t ops::getdents64(int fd, void* buf, std::size_t count) noexcept {
  return ::syscall(SYS_getdents64, fd, buf, count);
}

int ops::mkdir(const char* path, mode_t mode) noexcept { return ::mkdir(path, mode); }

int ops::faccessat(int dirfd, const char* path, int mode, int flags) noexcept {
  return ::faccessat(dirfd, path, mode, flags);
}

int ops::rmdir(const char* path) noexcept { return ::rmdir(path); }

int ops::kill(pid_t pid, int sig) noexcept { return ::kill(pid, sig); }

int ops::eventfd(unsigned int initval, int flags) noexcept { return ::eventfd(initval, flags); }

int ops::inotify_init1(int flags) noexcept { return ::inotify_init1(flags); }

int ops::inotify_add_watch(int fd, const char* path, std::uint32_t mask) noexcept {
  return ::inotify_add_watch(fd, path, mask);
}

void ops::sleep_for(std::timespec duration) noexcept {
  std::timespec rem{};
  // Bounded: each EINTR resumes with the remaining time, which only decreases.
  while (::nanosleep(&duration, &rem) == -1 && errno == EINTR) duration = rem;
}

namespace {
thread_local ops* current_override = nullptr;
}  // namespace

ops& real() noexcept {
  static ops instance;
  return instance;
}

ops& get() noexcept { return current_override != nullptr ? *current_override : real(); }

scoped_override::scoped_override(ops& o) noexcept : previous_(current_override) {
  current_override = &o;
}

scoped_override::~scoped_override() { current_override = previous_; }

int read_dir(int fd, dirent_visitor visit, void* ctx) noexcept {
  // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[].
  constexpr std::size_t reclen_offset = 16;
  constexpr std::size_t type_offset = 18;
  constexpr std::size_t name_offset = 19;
  alignas(8) char buf[32 * 1024];  // on the stack: reentrant, no allocation
  for (;;) {
    ssize_t n = retry_eintr([&] { return get().getdents64(fd, buf, sizeof buf); });
    if (n < 0) return errno;
    if (n == 0) return 0;
    std::size_t off = 0;
    while (off + name_offset < static_cast<std::size_t>(n)) {
      std::uint16_t reclen = 0;
      std::memcpy(&reclen, buf + off + reclen_offset, sizeof reclen);
      if (reclen <= name_offset || off + reclen > static_cast<std::size_t>(n)) return EIO;
      const char* name = buf + off + name_offset;
      std::size_t len = strnlen(name, reclen - name_offset);
      auto type = static_cast<dirent_type>(buf[off + type_offset]);
      off += reclen;
      std::string_view sv(name, len);
      if (sv == "." || sv == "..") continue;
      if (!visit(ctx, name, len, type)) return 0;
    }
  }
}

}  // namespace sandbox::detail::sys

namespace sandbox::detail {

void unique_fd::reset(int fd) noexcept {
  if (fd_ >= 0 && fd_ != fd) sys::get().close(fd_);
  fd_ = fd;
}

}  // namespace sandbox::detail
