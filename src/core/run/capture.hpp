// Capped capture of a stdout/stderr stream (private to src/).
//
// Keeps the first `cap_bytes` bytes byte-exact (they become the blob), counts everything,
// and keeps the last `summary_bytes / 2` bytes in a small ring so the summary can show the
// tail of a stream that went far past the cap. Host memory stays bounded at about
// cap_bytes + summary_bytes whatever the program writes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace sandbox::detail {

/// Not thread-safe: one reader of one pipe owns it. Every member is O(size of its input)
/// or O(summary_bytes); nothing ever blocks or throws except std::bad_alloc.
class stream_capture_buffer {
 public:
  /// `cap_bytes`: bytes kept byte-exact (0 keeps none); `summary_bytes`: the most bytes
  /// `summary()` returns (0: always empty).
  stream_capture_buffer(std::uint64_t cap_bytes, std::uint32_t summary_bytes);

  /// Appends bytes read from the pipe (any length, any content).
  void append(std::span<const char> bytes);

  /// Bytes kept (the first min(total, cap) bytes of the stream).
  const std::string& stored() const noexcept { return head_; }
  std::uint64_t total_bytes() const noexcept { return total_; }
  bool truncated() const noexcept { return total_ > head_.size(); }

  /**
   * Summary for the model: the whole stream when it fits in `summary_bytes`, else its head
   * and tail joined by a marker "\n…[N bytes omitted]…\n". Always valid UTF-8 (invalid bytes
   * and control characters other than \n, \r, \t escaped as `\xNN`, never splitting a
   * character), and never longer than `summary_bytes` bytes.
   */
  std::string summary() const;

 private:
  std::uint64_t cap_;
  std::uint32_t summary_bytes_;
  std::string head_;
  /// The first summary_bytes/2 bytes, kept only when cap_bytes is smaller (so the summary
  /// still shows the start of the stream).
  std::string prefix_;
  std::string tail_;          ///< ring buffer of the last summary_bytes/2 bytes
  std::size_t tail_pos_ = 0;  ///< next write position in tail_ once it is full
  std::uint64_t total_ = 0;
};

}  // namespace sandbox::detail
