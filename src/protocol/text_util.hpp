// Private text helpers of the protocol layer: strict UTF-8 validation and the quoting used in
// rejection messages (decoding itself: wire/utf8.hpp). Implemented in protocol.cpp. Not installed.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "wire/utf8.hpp"

namespace sandbox::detail {

/// Offset of the first byte that is not part of well-formed UTF-8, or `npos` if there is none.
std::size_t utf8_error_offset(std::string_view s) noexcept;

/// "U+00E9" for 0xE9.
std::string code_point_name(char32_t cp);

/**
 * Quotes a caller-supplied value for a message: `'name'`, escaped with
 * `escape_for_display` (so the message stays valid UTF-8 without control characters) and cut
 * to at most `max_bytes` of escaped text, at a character boundary, with "..." appended when
 * cut. E.g. `quote_for_message("a\nb")` is `'a\x0ab'`.
 */
std::string quote_for_message(std::string_view value, std::size_t max_bytes = 64);

}  // namespace sandbox::detail
