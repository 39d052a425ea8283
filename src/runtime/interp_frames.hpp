// The host's reader of an interpreter driver's frames (src/helpers/interp/driver.py): lines
// "\n<nonce> <kind> <base64>\n" on the session's stdout. Pure and bounded: it holds at most
// one line of `max_line` bytes whatever arrives, drops longer lines up to their next newline,
// and hands on only well-formed frames of the nonce it expects — so a forged or broken frame
// costs no host memory and cannot desynchronise the frames of a later cell (each begins on a
// fresh line with a nonce the cell never saw).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "protocol/base64url.hpp"

namespace sandbox::detail {

class interp_frame_reader {
 public:
  /// Called with the frame's kind (one character) and its decoded payload.
  using on_frame = std::function<void(char kind, std::string_view payload)>;

  explicit interp_frame_reader(std::size_t max_line = 4096) : max_line_(max_line) {}

  /// Frames of `nonce` are passed on from now on; those of any other nonce are dropped
  /// (empty: every frame is dropped).
  void expect(std::string nonce) { nonce_ = std::move(nonce); }

  /// Feeds bytes read from the channel (any length, any content).
  void feed(std::string_view bytes, const on_frame& f) {
    for (char c : bytes) {
      if (c == '\n') {
        if (!overlong_ && !line_.empty()) take(f);
        line_.clear();
        overlong_ = false;
        continue;
      }
      if (overlong_) continue;
      if (line_.size() >= max_line_) {
        overlong_ = true;
        ++dropped_;
        line_.clear();
        continue;
      }
      line_.push_back(c);
    }
  }

  /// Lines dropped so far: malformed, another nonce's, or over `max_line`.
  std::uint64_t dropped() const noexcept { return dropped_; }

 private:
  void take(const on_frame& f) {
    // "<nonce> <kind> <base64>"
    const std::string_view l = line_;
    if (nonce_.empty() || l.size() < nonce_.size() + 3 || l.substr(0, nonce_.size()) != nonce_ ||
        l[nonce_.size()] != ' ' || l[nonce_.size() + 2] != ' ') {
      ++dropped_;
      return;
    }
    // Standard base64, strictly (the protocol room's one codec).
    auto payload = base64_decode(l.substr(nonce_.size() + 3));
    if (!payload) {
      ++dropped_;
      return;
    }
    f(l[nonce_.size() + 1], *payload);
  }

  std::size_t max_line_;
  std::string nonce_;
  std::string line_;
  bool overlong_ = false;
  std::uint64_t dropped_ = 0;
};

}  // namespace sandbox::detail
