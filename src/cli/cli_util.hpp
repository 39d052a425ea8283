// Helpers shared by sandboxctl's commands (sandboxctl.cpp, serve.cpp): strict parsing of
// numeric options and the display form of names printed on the operator's terminal.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "core/text_util.hpp"
#include "sandbox/protocol.hpp"

namespace sandboxctl {

/// A bad option value or argument: the command answers exit status 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The longest duration any option accepts, in ms: a week, as the host configuration file
/// (anything longer is a typo, and would overflow the scheduler's clock arithmetic).
constexpr std::int64_t max_duration_ms = 7LL * 24 * 3600 * 1000;

/// True for code points that change how the text around them is shown without being shown
/// themselves: Unicode general category Cf (bidi embeddings, overrides and isolates, zero
/// width characters, tags, ...) and the line and paragraph separators (Zl, Zp). Printed raw,
/// they let a name pose as another ("\u202egnp.exe" shows as "exe.png").
constexpr bool is_format_char(char32_t cp) noexcept {
  return cp == 0xAD || (cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD ||
         cp == 0x70F || cp == 0x890 || cp == 0x891 || cp == 0x8E2 || cp == 0x180E ||
         (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0xFEFF ||
         (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0x110BD || cp == 0x110CD ||
         (cp >= 0x13430 && cp <= 0x13438) || (cp >= 0x1BCA0 && cp <= 0x1BCA3) ||
         (cp >= 0x1D173 && cp <= 0x1D17A) || cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F);
}

inline void append_code_point_escape(std::string& out, char32_t cp) {
  out += cp <= 0xFFFF ? fmt::format("\\u{:04x}", static_cast<std::uint32_t>(cp))
                      : fmt::format("\\U{:08x}", static_cast<std::uint32_t>(cp));
}

/// `display` (already valid UTF-8 without control characters, e.g. a result's
/// `dropped_file::name_display`) with every format character (`is_format_char`) written as
/// `\uXXXX` (`\UXXXXXXXX` above U+FFFF).
inline std::string escape_format_chars(std::string_view display) {
  std::string out;
  out.reserve(display.size());
  for (std::size_t i = 0; i < display.size();) {
    char32_t cp = 0;
    std::size_t len = sandbox::detail::decode_utf8(display, i, cp);
    if (len == 0) {  // not expected of a display form; escape rather than trust it
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(display[i]));
      ++i;
      continue;
    }
    if (is_format_char(cp)) {
      append_code_point_escape(out, cp);
    } else {
      out.append(display.substr(i, len));
    }
    i += len;
  }
  return out;
}

/**
 * The form in which the CLI prints a name it did not choose (an output file's name, a path,
 * an option value): the name itself when it is valid UTF-8 without control or format
 * characters; else invalid bytes and control characters as `\xNN`, format characters as
 * `\uXXXX` and backslashes as `\x5c` (so the form reads back as exactly one name), e.g.
 * "\u202egnp.exe" (U+202E first) → `\u202egnp.exe`, "a\nb" → `a\x0ab`.
 */
inline std::string display_name(std::string_view name) {
  bool plain = true;
  for (std::size_t i = 0; i < name.size() && plain;) {
    char32_t cp = 0;
    std::size_t len = sandbox::detail::decode_utf8(name, i, cp);
    if (len == 0 || sandbox::detail::is_control(cp) || is_format_char(cp)) plain = false;
    i += len == 0 ? 1 : len;
  }
  if (plain) return std::string(name);
  std::string out;
  out.reserve(name.size() + 16);
  for (std::size_t i = 0; i < name.size();) {
    char32_t cp = 0;
    std::size_t len = sandbox::detail::decode_utf8(name, i, cp);
    if (len == 0 || sandbox::detail::is_control(cp) || cp == '\\') {
      for (std::size_t k = 0; k < std::max<std::size_t>(len, 1); ++k) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(name[i + k]));
      }
    } else if (is_format_char(cp)) {
      append_code_point_escape(out, cp);
    } else {
      out.append(name.substr(i, len));
    }
    i += std::max<std::size_t>(len, 1);
  }
  return out;
}

/// `'name'` in its display form, cut to about 200 bytes: for messages.
inline std::string quote_name(std::string_view name) {
  std::string d = display_name(name);
  if (d.size() > 200) {
    std::size_t end = 200;
    while (end > 0 && (static_cast<unsigned char>(d[end]) & 0xC0) == 0x80) --end;
    d = d.substr(0, end) + "...";
  }
  return "'" + d + "'";
}

/**
 * Parses the value of the numeric option `--option`: decimal digits only (no sign, no
 * space), between `min` and `max`. Throws `usage_error` naming the option otherwise, so that
 * "-1" never wraps to 2^64-1 and a huge value never overflows later arithmetic.
 */
template <class T>
T parse_number(std::string_view option, std::string_view text, T min, T max) {
  auto range = [&] {
    return usage_error(fmt::format("--{}: expected an integer from {} to {}, got {}", option,
                                   min, max, quote_name(text)));
  };
  if (text.empty() || text.front() < '0' || text.front() > '9') throw range();
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (end != text.data() + text.size() || (ec != std::errc{} && ec != std::errc::result_out_of_range)) {
    throw range();
  }
  if (ec == std::errc::result_out_of_range || v > static_cast<std::uint64_t>(max) ||
      v < static_cast<std::uint64_t>(min)) {
    throw range();
  }
  return static_cast<T>(v);
}

}  // namespace sandboxctl
