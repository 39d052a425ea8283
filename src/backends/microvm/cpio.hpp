// A writer of cpio "newc" archives: the initramfs format the Linux kernel unpacks at boot
// (Documentation/driver-api/early-userspace/buffer-format.rst). Uncompressed; our own few
// lines rather than a dependency (private to src/).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sandbox::detail {

/**
 * Builds an archive in memory, entries in the order added. Names are relative ("init",
 * "modules/virtio.ko"); a directory must be added before what it holds. Every entry is owned
 * by root with mtime 0, so the same inputs give the same bytes (the initramfs cache's key).
 */
class cpio_writer {
 public:
  /// A directory; `mode` holds the permission bits only (e.g. 0755).
  void add_directory(std::string_view name, std::uint32_t mode);
  /// A regular file with `content`; `mode` holds the permission bits only.
  void add_file(std::string_view name, std::uint32_t mode, std::string_view content);
  /// Appends the trailer and returns the archive; the writer is empty afterwards.
  std::string finish();

 private:
  void entry(std::string_view name, std::uint32_t mode, std::string_view content);
  std::string out_;
  std::uint32_t next_ino_ = 1;
};

}  // namespace sandbox::detail
