// Private: base64url without padding (RFC 4648 §5) and standard base64 with padding
// (§4), both strict. Not installed.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sandbox::detail {

/// `in` in the URL-safe alphabet (`-`, `_`), without `=` padding.
std::string base64url_encode(std::string_view in);

/// Decodes strictly: only the URL-safe alphabet, no padding or whitespace, a length that is
/// not 1 mod 4, and the unused low bits of the last character zero — so every byte string
/// has exactly one accepted encoding. `std::nullopt` otherwise.
std::optional<std::string> base64url_decode(std::string_view in);

/// `in` in base64 with the standard alphabet and `=` padding (RFC 4648 §4): the daemon's
/// `data_b64` fields, MCP's image and resource bytes.
std::string base64_encode(std::string_view in);

/// Decodes strictly: a length that is a multiple of 4, padding only at the end, no
/// whitespace, and the unused bits of the last group zero (so every byte string has exactly
/// one accepted form). `std::nullopt` otherwise.
std::optional<std::string> base64_decode(std::string_view in);

}  // namespace sandbox::detail
