// UTF-8 decoding and the character classes that decide whether a name can be shown as it is
// (private to src/). Header-only and free of exceptions: the statically linked microvm guest
// agent judges output names with the same code as the host's collector.
#pragma once

#include <cstddef>
#include <string_view>

namespace sandbox::detail {

/// Decodes the code point starting at `s[i]` (i < s.size()) into `cp`. Returns its length
/// (1..4), or 0 when the bytes there are not well-formed UTF-8 (Unicode 14, table 3-7: no
/// overlongs, no surrogates, nothing above U+10FFFF, no truncated sequences). Inline: the
/// statically linked microvm guest agent (helpers/guest) judges output names with it too.
inline std::size_t decode_utf8(std::string_view s, std::size_t i, char32_t& cp) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  std::size_t len = 0;
  unsigned char lo = 0x80;  // bounds of the second byte (table 3-7)
  unsigned char hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // continuation byte, C0/C1 (overlong), F5..FF
  }
  if (s.size() - i < len) return 0;
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if (b1 < lo || b1 > hi) return 0;
  char32_t value = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  value = (value << 6) | (b1 & 0x3F);
  for (std::size_t k = 2; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;  // not a continuation byte
    value = (value << 6) | (b & 0x3F);
  }
  cp = value;
  return len;
}

/// True for Unicode general category Cc: U+0000–U+001F, U+007F–U+009F.
constexpr bool is_control(char32_t cp) noexcept { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); }

/// True for the invisible formatting characters that change how a name reads (bidi controls
/// such as U+202E, zero-width characters, the byte-order mark, tags): the Unicode Cf
/// characters that can spoof a file name (Unicode TR #9; "Trojan Source", CVE-2021-42574).
constexpr bool is_invisible_format(char32_t cp) noexcept {
  return cp == 0x00AD || cp == 0x061C || cp == 0x180E || (cp >= 0x200B && cp <= 0x200F) ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF ||
         (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F);
}

/// True when `name` is well-formed UTF-8 without control or invisible formatting characters:
/// exactly the names `escape_name_for_display` leaves as they are, the ones the output
/// collector returns (others are dropped as `bad_name`). No allocation.
inline bool is_display_safe_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < name.size();) {
    char32_t cp = 0;
    const std::size_t len = decode_utf8(name, i, cp);
    if (len == 0 || is_control(cp) || is_invisible_format(cp)) return false;
    i += len;
  }
  return true;
}

}  // namespace sandbox::detail
