// Private: base64url without padding (RFC 4648 §5), strict. Not installed.
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

}  // namespace sandbox::detail
