// The one owned-descriptor type of the library (private to src/). It closes through the
// injectable syscall layer (sys.hpp), so unit tests see every close of the code they drive.
#pragma once

#include <utility>

namespace sandbox::detail {

/// An owned file descriptor, closed on destruction (close(2) is never retried: on Linux the
/// descriptor is gone even when it reports EINTR). Move-only. -1 means "none".
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(o.release()) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  /// The descriptor, or -1.
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership; returns the descriptor (or -1).
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the held descriptor (if any, through `sys::get().close`) and holds `fd` instead.
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

}  // namespace sandbox::detail
