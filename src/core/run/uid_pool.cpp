#include "core/run/uid_pool.hpp"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

namespace sandbox::detail {

result<std::unique_ptr<uid_pool>> uid_pool::open(const std::filesystem::path& lock_file,
                                                 std::uint32_t base, std::uint32_t count) {
  if (count == 0 || std::uint64_t{base} + count > 0xFFFFFFFEULL || base == 0) {
    return make_error_code(errc::invalid_argument);
  }
  int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return boost::system::error_code(errno, boost::system::system_category());
  return std::unique_ptr<uid_pool>(new uid_pool(fd, base, count));
}

uid_pool::uid_pool(int fd, std::uint32_t base, std::uint32_t count)
    : fd_(fd), base_(base), count_(count), used_(count, false) {}

uid_pool::~uid_pool() { ::close(fd_); }

result<std::uint32_t> uid_pool::acquire() {
  std::lock_guard lock(mu_);
  for (std::uint32_t i = 0; i < count_; ++i) {
    std::uint32_t slot = (next_ + i) % count_;
    if (used_[slot]) continue;
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(base_) + slot;  // the uid itself: ranges may overlap
    fl.l_len = 1;
    if (fcntl(fd_, F_OFD_SETLK, &fl) == 0) {
      used_[slot] = true;
      next_ = (slot + 1) % count_;
      return base_ + slot;
    }
    if (errno != EAGAIN && errno != EACCES) return make_error_code(errc::io_error);
  }
  return make_error_code(errc::busy);
}

void uid_pool::release(std::uint32_t uid) noexcept {
  if (uid < base_ || uid - base_ >= count_) return;
  std::uint32_t slot = uid - base_;
  std::lock_guard lock(mu_);
  if (!used_[slot]) return;
  struct flock fl {};
  fl.l_type = F_UNLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(uid);
  fl.l_len = 1;
  fcntl(fd_, F_OFD_SETLK, &fl);
  used_[slot] = false;
}

}  // namespace sandbox::detail
