// The display form of names shown to an operator (protocol/display_text.hpp).
#include "protocol/display_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "wire/utf8.hpp"

namespace sandbox::detail {
namespace {

void append_code_point_escape(std::string& out, char32_t cp) {
  out += cp <= 0xFFFF ? fmt::format("\\u{:04x}", static_cast<std::uint32_t>(cp))
                      : fmt::format("\\U{:08x}", static_cast<std::uint32_t>(cp));
}

}  // namespace

std::string escape_format_chars(std::string_view display) {
  std::string out;
  out.reserve(display.size());
  for (std::size_t i = 0; i < display.size();) {
    char32_t cp = 0;
    const std::size_t len = decode_utf8(display, i, cp);
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

std::string display_name(std::string_view name) {
  bool plain = true;
  for (std::size_t i = 0; i < name.size() && plain;) {
    char32_t cp = 0;
    const std::size_t len = decode_utf8(name, i, cp);
    if (len == 0 || is_control(cp) || is_format_char(cp)) plain = false;
    i += len == 0 ? 1 : len;
  }
  if (plain) return std::string(name);
  std::string out;
  out.reserve(name.size() + 16);
  for (std::size_t i = 0; i < name.size();) {
    char32_t cp = 0;
    const std::size_t len = decode_utf8(name, i, cp);
    if (len == 0 || is_control(cp) || cp == '\\') {
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

std::string quote_name(std::string_view name) {
  std::string d = display_name(name);
  if (d.size() > 200) {
    std::size_t end = 200;
    while (end > 0 && (static_cast<unsigned char>(d[end]) & 0xC0) == 0x80) --end;
    d = d.substr(0, end) + "...";
  }
  return "'" + d + "'";
}

}  // namespace sandbox::detail
