// Per-run uids for hosts running as root (private to src/).
//
// Each concurrent run gets its own unprivileged uid/gid from [base, base + count), so per-uid
// kernel counters and signal permissions are never shared between runs (or tenants). A uid is
// reserved with an open-file-description lock on byte `uid` of one lock file for the whole
// host (`process_backend_options::uid_lock_file`), so several host processes — with any state
// directories and overlapping ranges — never collide, and a crashed host's reservations
// vanish with it. Within one process a bitmap guards the same bytes (OFD locks do not conflict with
// themselves).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

#include "sandbox/error.hpp"

namespace sandbox::detail {

class uid_pool {
 public:
  /// Opens (creating, mode 0600) the lock file. Errors: `invalid_argument` (count 0 or the
  /// range overflows), or the OS error of opening it (`system_category`: ENOENT when its
  /// directory is missing, EACCES, …).
  static result<std::unique_ptr<uid_pool>> open(const std::filesystem::path& lock_file,
                                                std::uint32_t base, std::uint32_t count);
  ~uid_pool();
  uid_pool(const uid_pool&) = delete;
  uid_pool& operator=(const uid_pool&) = delete;

  /// Reserves a free uid. Errors: `busy` (every uid of the range is in use).
  result<std::uint32_t> acquire();
  /// Returns `uid` to the pool. Idempotent.
  void release(std::uint32_t uid) noexcept;

 private:
  uid_pool(int fd, std::uint32_t base, std::uint32_t count);
  int fd_;
  std::uint32_t base_, count_, next_ = 0;
  std::mutex mu_;
  std::vector<bool> used_;
};

}  // namespace sandbox::detail
