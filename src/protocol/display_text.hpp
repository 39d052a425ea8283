// Private: the display form of names shown to an operator (sandboxctl's terminal, the
// daemon's messages). Not installed.
//
// A name the program did not choose (an output file's name, a path, an option value, a
// request id) is shown so that it can neither pose as another name nor rewrite the
// terminal: invalid bytes and control characters become `\xNN`, and the Unicode format
// characters (bidi overrides, zero width characters, tags, ...) become `\uXXXX`. This set of
// format characters is the whole of category Cf, wider than `is_invisible_format`
// (wire/utf8.hpp), which decides which output names the collector returns.
#pragma once

#include <string>
#include <string_view>

namespace sandbox::detail {

/// True for code points that change how the text around them is shown without being shown
/// themselves: Unicode general category Cf (bidi embeddings, overrides and isolates, zero
/// width characters, tags, ...) and the line and paragraph separators (Zl, Zp). Printed raw,
/// they let a name pose as another ("\u202egnp.exe" shows as "exe.png").
constexpr bool is_format_char(char32_t cp) noexcept {
  return cp == 0xAD || (cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F ||
         cp == 0x890 || cp == 0x891 || cp == 0x8E2 || cp == 0x180E ||
         (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206F) || cp == 0xFEFF ||
         (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0x110BD || cp == 0x110CD ||
         (cp >= 0x13430 && cp <= 0x13438) || (cp >= 0x1BCA0 && cp <= 0x1BCA3) ||
         (cp >= 0x1D173 && cp <= 0x1D17A) || cp == 0xE0001 || (cp >= 0xE0020 && cp <= 0xE007F);
}

/// `display` (already valid UTF-8 without control characters, e.g. a result's
/// `dropped_file::name_display` or a `quote_for_message` quote) with every format character
/// (`is_format_char`) written as `\uXXXX` (`\UXXXXXXXX` above U+FFFF). An invalid byte, not
/// expected here, is escaped as `\xNN` rather than trusted.
std::string escape_format_chars(std::string_view display);

/**
 * The form in which a name someone else chose is printed: the name itself when it is valid
 * UTF-8 without control or format characters; else invalid bytes and control characters as
 * `\xNN`, format characters as `\uXXXX` and backslashes as `\x5c` (so the form reads back as
 * exactly one name), e.g. "\u202egnp.exe" (U+202E first) → `\u202egnp.exe`, "a\nb" →
 * `a\x0ab`.
 */
std::string display_name(std::string_view name);

/// `'name'` in its display form (`display_name`), cut to about 200 bytes at a character
/// boundary with "..." appended when cut: for messages.
std::string quote_name(std::string_view name);

}  // namespace sandbox::detail
