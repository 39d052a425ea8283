// Applying OCI image layers to a directory, safely against hostile layers (private to src/).
//
// Rules (image-spec v1.1 "layer.md", plus what a sandbox host needs):
//  1. Member names are normalized lexically: leading "/" and "./" dropped, empty and "."
//     components dropped; a ".." component anywhere → the layer is refused (`corrupt`).
//  2. The parent directory of every member is resolved *inside the root* with
//     openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV): symlinks from this
//     or earlier layers are followed as if the root were "/", so `lnk -> /etc` then
//     `lnk/passwd` lands in `<root>/etc/passwd`, never the host's. Missing parents are
//     created (0755). Kernels without openat2 fall back to a component walk with O_NOFOLLOW
//     that refuses any symlink in a parent path.
//  3. The last component is created with *at() calls on the parent's descriptor and never
//     followed: an existing entry is removed (a directory recursively, without following
//     links) and replaced; files are created O_EXCL|O_NOFOLLOW.
//  4. Hard links resolve their target the same way (inside the root); the target must exist
//     and not be a directory, else `corrupt`. A link can therefore never reach a host file.
//  5. Device nodes, FIFOs and sockets are skipped (logged). Setuid and setgid bits are
//     cleared; extended attributes (file capabilities included) are ignored. Owners are set
//     only when running as root (numeric ids from the archive).
//  6. Whiteouts: `.wh.<name>` deletes `<name>` from lower layers; `.wh..wh..opq` deletes
//     every entry of its directory that lower layers made. Whiteout files are not created.
//     Other `.wh..wh.` names (aufs metadata) are ignored.
//  7. Directory modes and times are applied after the last layer, deepest first, so a
//     read-only directory does not stop later members from being written into it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "store/store_io.hpp"
#include "store/tar_reader.hpp"

namespace sandbox::detail {

/// Normalizes a member name into components (rule 1). Errors: `corrupt` for "..", a
/// component over 255 bytes, or more than 256 components.
result<std::vector<std::string>> split_member_path(std::string_view raw);

/// Opens `rel` (components, may be empty = the root itself) under `root_fd` resolving every
/// symlink inside the root (rule 2). `flags` are open flags (O_CLOEXEC and O_NOFOLLOW are
/// added). Errors: system codes (ENOENT, ENOTDIR, ELOOP, EXDEV …).
result<unique_fd> open_in_root(int root_fd, const std::vector<std::string>& rel, int flags);

/// Tests only: pretend the kernel lacks openat2 (exercises the fallback walk).
void set_openat2_disabled_for_testing(bool disabled) noexcept;

/// Counters of one `layer_applier`, for host logs and tests.
struct layer_stats {
  std::uint64_t entries = 0;
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
  std::uint64_t skipped_special = 0;  ///< devices, FIFOs, sockets
  std::uint64_t whiteouts = 0;
  std::uint64_t cleared_setid = 0;  ///< files whose setuid/setgid bits were dropped
};

/// Bounds on what one image may unpack to (all its layers together): a small compressed layer
/// can expand a thousandfold (a tar or gzip bomb).
struct unpack_limits {
  std::uint64_t max_bytes = 16ULL << 30;  ///< file contents, bytes
  std::uint64_t max_entries = 2'000'000;  ///< tar members
};

/**
 * Applies layers, in order, into the directory open at `root_fd` (which it does not own).
 * Past `limits` it stops with `corrupt` ("... exceeds the unpack limit ...") before writing
 * more.
 * Call `apply` once per layer, then `finish` once. Errors: `corrupt` (hostile or malformed
 * layer, reason in `error_detail()`), `io_error` (a host syscall failed; reason too).
 * Not thread-safe.
 */
class layer_applier {
 public:
  layer_applier(int root_fd, bool set_owners, unpack_limits limits = {}) noexcept
      : root_fd_(root_fd), set_owners_(set_owners), limits_(limits) {}

  /// Applies one layer read from `tar`.
  result<void> apply(tar_reader& tar);
  /// Sets the deferred directory modes, owners and times (rule 7).
  result<void> finish();

  const std::string& error_detail() const noexcept { return detail_; }
  const layer_stats& stats() const noexcept { return stats_; }

 private:
  struct dir_meta {
    std::uint32_t mode = 0755;
    std::uint64_t uid = 0, gid = 0;
    std::int64_t mtime = -1;  // -1: leave as is
    bool owners = false;
  };

  result<unique_fd> parent_dir(const std::vector<std::string>& comps, bool create);
  result<void> apply_entry(tar_reader& tar, const tar_entry& e);
  result<void> remove_existing(int pfd, const std::string& name, bool keep_dir);
  result<void> whiteout(const std::vector<std::string>& comps);
  result<void> write_file(tar_reader& tar, const tar_entry& e, int pfd, const std::string& name);
  boost::system::error_code corrupt(std::string why);
  boost::system::error_code io(std::string what, const boost::system::error_code& ec);

  int root_fd_;
  bool set_owners_;
  unpack_limits limits_;
  std::set<std::string> seen_;            // paths made by the current layer
  std::map<std::string, dir_meta> dirs_;  // deferred directory metadata, by path
  layer_stats stats_;
  std::string detail_;
};

/// Joins components with '/'.
std::string join_path(const std::vector<std::string>& comps, std::size_t n);

}  // namespace sandbox::detail
