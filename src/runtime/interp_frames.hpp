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
    std::string payload;
    if (!decode(l.substr(nonce_.size() + 3), payload)) {
      ++dropped_;
      return;
    }
    f(l[nonce_.size() + 1], payload);
  }

  static int value(char c) noexcept {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  }

  /// Standard base64 with padding; false for anything else.
  static bool decode(std::string_view in, std::string& out) {
    if (in.size() % 4 != 0) return false;
    out.reserve(in.size() / 4 * 3);
    for (std::size_t i = 0; i < in.size(); i += 4) {
      int v[4];
      int pad = 0;
      for (int k = 0; k < 4; ++k) {
        const char c = in[i + k];
        if (c == '=' && i + 4 == in.size() && k >= 2) {
          v[k] = 0;
          ++pad;
          continue;
        }
        if (pad) return false;
        v[k] = value(c);
        if (v[k] < 0) return false;
      }
      const std::uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
      out.push_back(static_cast<char>(n >> 16));
      if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
      if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
    }
    return true;
  }

  std::size_t max_line_;
  std::string nonce_;
  std::string line_;
  bool overlong_ = false;
  std::uint64_t dropped_ = 0;
};

}  // namespace sandbox::detail
