#include "backends/microvm/cpio.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <utility>

namespace sandbox::detail {

void cpio_writer::entry(std::string_view name, std::uint32_t mode, std::string_view content) {
  // "070701", then 13 fields of 8 hex digits: ino, mode, uid, gid, nlink, mtime, filesize,
  // devmajor, devminor, rdevmajor, rdevminor, namesize (with its NUL), check (0).
  const bool dir = S_ISDIR(mode);
  out_ += fmt::format(
      "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
      next_ino_++, mode, 0, 0, dir ? 2 : 1, 0, content.size(), 0, 0, 0, 0, name.size() + 1, 0);
  out_.append(name);
  out_.push_back('\0');
  out_.append((4 - out_.size() % 4) % 4, '\0');  // header + name padded to 4 bytes
  out_.append(content);
  out_.append((4 - out_.size() % 4) % 4, '\0');  // data padded to 4 bytes
}

void cpio_writer::add_directory(std::string_view name, std::uint32_t mode) {
  entry(name, S_IFDIR | (mode & 07777), {});
}

void cpio_writer::add_file(std::string_view name, std::uint32_t mode, std::string_view content) {
  entry(name, S_IFREG | (mode & 07777), content);
}

std::string cpio_writer::finish() {
  entry("TRAILER!!!", 0, {});
  next_ino_ = 1;
  return std::exchange(out_, {});
}

}  // namespace sandbox::detail
