// gzip streams for the image store's layers, decompressed by the host's gzip in a process of
// its own (private to src/).
#pragma once

#include <memory>
#include <string>

#include "store/tar_reader.hpp"
#include "sys/tool_process.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/**
 * Decompresses a gzip stream with the host's `gzip -dc` (a separate, unprivileged-by-nature
 * process: a decompressor bug cannot corrupt our memory). `input_fd` is read from its
 * current offset by the child. Reads return the decompressed bytes; at end of stream the
 * tool's exit status is checked (a non-zero status or garbage input → `corrupt`).
 */
class gunzip_source final : public byte_source {
 public:
  /// Starts gzip on `input_fd` (not owned). Errors: `unsupported` (no gzip), system codes.
  static result<std::unique_ptr<gunzip_source>> start(int input_fd) noexcept;
  ~gunzip_source() override;
  result<std::size_t> read(void* buf, std::size_t n) override;
  /// gzip's stderr, for host logs.
  std::string diagnostics() const;

 private:
  gunzip_source() = default;
  child_process child_;
  unique_fd out_;     // read end of gzip's stdout
  unique_fd errors_;  // memfd holding gzip's stderr
  bool finished_ = false;
};

}  // namespace sandbox::detail
