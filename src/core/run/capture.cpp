// Capped capture of a stdout/stderr stream (see capture.hpp).
//
// The summary is built from "tokens": one character or one escaped byte each, never split.
// A token is copied as is when it is well-formed UTF-8 and not a control character (Unicode
// Cc: U+0000–U+001F, U+007F–U+009F) other than \n, \r, \t; otherwise each of its bytes
// becomes `\xNN` (4 bytes). The escaped form is ASCII or well-formed UTF-8, so any
// concatenation of whole tokens is valid UTF-8.
#include "core/run/capture.hpp"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "protocol/text_util.hpp"

namespace sandbox::detail {
namespace {

constexpr std::size_t escaped_byte_len = 4;  // "\xNN"

/// True when s[i..] (fewer than 4 bytes, at the end of the data we hold) is the start of a
/// well-formed sequence that was cut, not an invalid one: padding it with continuation bytes
/// would make it decode. Two pads cover every lead byte's second-byte range (table 3-7).
bool is_cut_sequence(std::string_view s, std::size_t i) {
  const std::size_t rest = s.size() - i;
  if (rest == 0 || rest >= 4) return false;
  for (unsigned char pad : {0x80, 0xA0}) {
    char buf[4];
    std::memcpy(buf, s.data() + i, rest);
    std::memset(buf + rest, static_cast<char>(pad), 4 - rest);
    char32_t cp = 0;
    if (decode_utf8(std::string_view(buf, 4), 0, cp) > rest) return true;
  }
  return false;
}

struct token {
  std::size_t src_len = 0;  ///< bytes of the stream it covers (0: a cut sequence, stop)
  std::size_t out_len = 0;  ///< bytes it takes in the summary
  bool escaped = false;
};

/// The token at s[i]. `more_follows`: the stream goes on past `s` (so a sequence cut by the
/// end of `s` is incomplete rather than invalid; then src_len is 0).
token next_token(std::string_view s, std::size_t i, bool more_follows) {
  char32_t cp = 0;
  const std::size_t len = decode_utf8(s, i, cp);
  if (len == 0) {
    if (more_follows && is_cut_sequence(s, i)) return {};
    return {1, escaped_byte_len, true};
  }
  if (is_control(cp) && cp != '\n' && cp != '\r' && cp != '\t') {
    return {len, len * escaped_byte_len, true};
  }
  return {len, len, false};
}

void append_escaped(std::string& out, unsigned char b) {
  constexpr char hex[] = "0123456789abcdef";
  out += "\\x";
  out += hex[b >> 4];
  out += hex[b & 0xF];
}

/// Renders s[from, to) (a whole number of tokens) into `out`.
void render(std::string& out, std::string_view s, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to;) {
    token t = next_token(s, i, false);
    if (t.escaped) {
      for (std::size_t k = 0; k < t.src_len; ++k) {
        append_escaped(out, static_cast<unsigned char>(s[i + k]));
      }
    } else {
      out.append(s.substr(i, t.src_len));
    }
    i += t.src_len;
  }
}

/// The longest run of whole tokens from s[0] whose rendering fits in `budget` bytes and ends
/// at or before `limit`. Returns {source bytes, rendered bytes}.
std::pair<std::size_t, std::size_t> fit_prefix(std::string_view s, bool more_follows,
                                               std::size_t budget, std::size_t limit) {
  std::size_t i = 0;
  std::size_t out = 0;
  while (i < s.size()) {
    token t = next_token(s, i, more_follows);
    if (t.src_len == 0 || i + t.src_len > limit || out + t.out_len > budget) break;
    i += t.src_len;
    out += t.out_len;
  }
  return {i, out};
}

/// The longest run of whole tokens ending at s.end(), tokenized forward from `start`, whose
/// rendering fits in `budget` bytes. Returns {first source byte, rendered bytes}.
std::pair<std::size_t, std::size_t> fit_suffix(std::string_view s, std::size_t start,
                                               std::size_t budget) {
  std::vector<std::pair<std::size_t, std::size_t>> tokens;  // (offset, out_len)
  for (std::size_t i = start; i < s.size();) {
    token t = next_token(s, i, false);
    tokens.emplace_back(i, t.out_len);
    i += t.src_len;
  }
  std::size_t first = s.size();
  std::size_t out = 0;
  for (auto it = tokens.rbegin(); it != tokens.rend(); ++it) {
    if (out + it->second > budget) break;
    out += it->second;
    first = it->first;
  }
  return {first, out};
}

std::string marker(std::uint64_t omitted) {
  return "\n\xE2\x80\xA6[" + std::to_string(omitted) + " bytes omitted]\xE2\x80\xA6\n";
}

}  // namespace

stream_capture_buffer::stream_capture_buffer(std::uint64_t cap_bytes, std::uint32_t summary_bytes)
    : cap_(cap_bytes), summary_bytes_(summary_bytes) {}

void stream_capture_buffer::append(std::span<const char> bytes) {
  std::string_view in(bytes.data(), bytes.size());
  total_ += in.size();
  const std::size_t half = summary_bytes_ / 2;

  // 1. The byte-exact head. Grow geometrically but never past the cap, so memory stays at
  //    about cap_ even though std::string would otherwise double past it.
  if (head_.size() < cap_ && !in.empty()) {
    const std::size_t take =
        static_cast<std::size_t>(std::min<std::uint64_t>(in.size(), cap_ - head_.size()));
    if (head_.size() + take > head_.capacity()) {
      const auto want = static_cast<std::size_t>(std::max<std::uint64_t>(
          head_.size() + take, std::min<std::uint64_t>(2 * head_.capacity() + 4096, cap_)));
      // A fresh string: libstdc++'s reserve() on a grown string rounds up to twice the old
      // capacity, which could overshoot the cap by half.
      std::string grown;
      grown.reserve(want);
      grown.append(head_);
      head_.swap(grown);
    }
    head_.append(in.substr(0, take));
  }

  // 2. The summary's own prefix, when the head is too small to serve as one.
  if (cap_ < half && prefix_.size() < half) {
    prefix_.append(in.substr(0, half - prefix_.size()));
  }

  // 3. The tail ring: only the last `half` bytes of this chunk can matter.
  if (half == 0) return;
  if (in.size() > half) in = in.substr(in.size() - half);
  if (tail_.size() < half) {
    const std::size_t k = std::min(in.size(), half - tail_.size());
    if (tail_.capacity() < half) tail_.reserve(half);
    tail_.append(in.substr(0, k));
    in.remove_prefix(k);
  }
  while (!in.empty()) {
    const std::size_t k = std::min(in.size(), half - tail_pos_);
    std::memcpy(tail_.data() + tail_pos_, in.data(), k);
    tail_pos_ = (tail_pos_ + k) % half;
    in.remove_prefix(k);
  }
}

std::string stream_capture_buffer::summary() const {
  const std::size_t limit = summary_bytes_;
  if (limit == 0 || total_ == 0) return {};

  // What we hold: a prefix [0, H) and a suffix [T0, total).
  const std::string& prefix = head_.size() >= prefix_.size() ? head_ : prefix_;
  std::string tail;
  tail.reserve(tail_.size());
  tail.append(tail_, tail_pos_, std::string::npos);
  tail.append(tail_, 0, tail_pos_);
  const std::uint64_t H = prefix.size();
  const std::uint64_t T0 = total_ - tail.size();

  // 1. The whole stream, when we hold all of it and it fits once escaped (escaping only
  //    grows, so a stream longer than the limit never fits).
  if (total_ <= limit && H >= T0) {
    std::string whole = prefix;
    whole.append(tail, static_cast<std::size_t>(H - T0), std::string::npos);
    std::string out;
    render(out, whole, 0, whole.size());
    if (out.size() <= limit) return out;
  }

  // 2. Head + marker + tail. The marker's room is reserved for the largest count it can
  //    show, so the final size never exceeds the limit.
  const std::size_t marker_room = marker(total_).size();
  const bool more_after_prefix = H < total_;
  if (limit < marker_room + 2 * escaped_byte_len) {
    // Too small for a marker: as much of the head as fits.
    auto [h, h_out] = fit_prefix(prefix, more_after_prefix, limit, prefix.size());
    std::string out;
    render(out, prefix, 0, h);
    return out;
  }
  const std::size_t avail = limit - marker_room;

  // Head gets half first; the tail gets the rest; then the head takes what the tail left.
  auto [h, h_out] = fit_prefix(prefix, more_after_prefix, avail / 2, prefix.size());
  // The tail is tokenized forward from max(T0, h): from h it starts on a token boundary;
  // from T0 (mid-stream) it skips continuation bytes of a character begun before the ring.
  auto tail_start = [&](std::uint64_t head_end) -> std::size_t {
    if (head_end >= T0) return static_cast<std::size_t>(head_end - T0);
    std::size_t s = 0;
    while (s < 3 && s < tail.size() && (static_cast<unsigned char>(tail[s]) & 0xC0) == 0x80) ++s;
    return s;
  };
  auto [t_rel, t_out] = fit_suffix(tail, tail_start(h), avail - h_out);
  const std::uint64_t t = T0 + t_rel;
  std::tie(h, h_out) =
      fit_prefix(prefix, more_after_prefix, avail - t_out,
                 static_cast<std::size_t>(std::min<std::uint64_t>(t, prefix.size())));

  std::string out;
  out.reserve(limit);
  render(out, prefix, 0, h);
  if (t > h) out += marker(t - h);
  render(out, tail, t_rel, tail.size());
  return out;
}

}  // namespace sandbox::detail
