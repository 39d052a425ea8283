// A small streaming tar reader for OCI layers (private to src/).
//
// Why our own reader instead of GNU tar: applying an image layer must never write outside the
// root, also across layers. GNU tar (1.34) resolves every member path with ordinary path
// lookup, so a symlink made real by one layer (`lib -> /usr/lib`, or `a -> ../../..`) is
// followed by the tar process that applies the next layer, and it has no "resolve inside this
// root" mode; we would also have to trust its handling of whiteouts, device nodes and
// setuid bits. Reading the format is the easy part (ustar, GNU long names, PAX), so we parse
// it here and do every filesystem operation ourselves with openat2(RESOLVE_IN_ROOT) relative
// to the root's descriptor (see layer_apply.hpp). Decompression stays in a separate,
// well-kept program (gzip), run without a shell.
//
// The reader only parses: it returns entries with their raw names; it never touches the
// filesystem. Malformed input yields `errc::corrupt` with a reason in `error_detail()`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "protocol/sha256.hpp"
#include "sandbox/error.hpp"

namespace sandbox::detail {

/// A sequential byte stream. `read` returns 0 only at end of stream.
class byte_source {
 public:
  virtual ~byte_source() = default;
  virtual result<std::size_t> read(void* buf, std::size_t n) = 0;
};

/// Reads a file descriptor it does not own (retrying EINTR, filling `n` unless at EOF).
class fd_source final : public byte_source {
 public:
  explicit fd_source(int fd) noexcept : fd_(fd) {}
  result<std::size_t> read(void* buf, std::size_t n) override;

 private:
  int fd_;
};

/// Passes bytes through from `inner` while hashing them (SHA-256) and counting them.
class hashing_source final : public byte_source {
 public:
  explicit hashing_source(byte_source& inner) noexcept : inner_(inner) {}
  result<std::size_t> read(void* buf, std::size_t n) override;
  /// Reads `inner` to its end (the bytes after a tar's end marker count too) and returns
  /// the hex digest of everything, with the byte count.
  result<std::string> finish();
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  byte_source& inner_;
  sha256 hash_;
  std::uint64_t bytes_ = 0;
};

/// One archive member, after GNU long-name and PAX records were applied.
struct tar_entry {
  /// '0' regular file, '1' hard link, '2' symlink, '3' char device, '4' block device,
  /// '5' directory, '6' FIFO; any other type byte is returned as is.
  char type = '0';
  std::string path;        ///< member name as stored (not yet normalized)
  std::string link;        ///< symlink target or hard-link target name
  std::uint64_t size = 0;  ///< data bytes of a regular file
  std::uint32_t mode = 0;  ///< permission bits incl. setuid/setgid/sticky (07777)
  std::uint64_t uid = 0;
  std::uint64_t gid = 0;
  std::int64_t mtime = 0;  ///< seconds since the epoch
};

/// What `tar_reader::next` found. (An enum, not `bool`: `result<bool>` cannot be built
/// implicitly from an error code.)
enum class tar_step : unsigned char { end, entry };

/// Limits that keep a hostile archive from exhausting memory.
struct tar_limits {
  std::size_t max_name_bytes = 4096;    ///< longest member or link name (PATH_MAX)
  std::size_t max_pax_bytes = 1 << 20;  ///< largest PAX extended header
};

/**
 * Streams the members of a tar archive (POSIX ustar, GNU, PAX) from `src`.
 *
 *   tar_reader tar(src);
 *   tar_entry e;
 *   for (;;) {
 *     auto step = tar.next(e);
 *     if (!step) return step.error();
 *     if (*step == tar_step::end) break;
 *     ... tar.read_data(buf, n) ...
 *   }
 *
 * `next` skips whatever data of the previous member was not read. Errors: `corrupt` (bad
 * checksum, truncated archive, bad number, over a limit, GNU sparse files) with a reason in
 * `error_detail()`, or the source's own error.
 */
class tar_reader {
 public:
  explicit tar_reader(byte_source& src, tar_limits limits = {}) noexcept
      : src_(src), limits_(limits) {}

  /// Advances to the next member; `tar_step::end` at the end of the archive.
  result<tar_step> next(tar_entry& e);
  /// Reads up to `n` bytes of the current member's data; 0 once it is all read.
  result<std::size_t> read_data(void* buf, std::size_t n);
  /// Why the last call failed with `corrupt`.
  const std::string& error_detail() const noexcept { return detail_; }

 private:
  result<tar_step> read_block(char* block);  // end: clean EOF before the block
  result<void> skip(std::uint64_t n);
  result<std::string> read_payload(std::uint64_t size, std::size_t limit);
  boost::system::error_code corrupt(std::string why);

  byte_source& src_;
  tar_limits limits_;
  std::uint64_t remaining_ = 0;  // data bytes of the current member not yet read
  std::uint64_t padding_ = 0;    // zero bytes after them up to the block boundary
  bool done_ = false;
  std::string detail_;
};

}  // namespace sandbox::detail
