// Base64url without padding and standard base64 (protocol/base64url.hpp).
#include "protocol/base64url.hpp"

#include <cstdint>

namespace sandbox::detail {
namespace {

constexpr std::string_view alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int value_of(char c) noexcept {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

}  // namespace

std::string base64url_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (char ch : in) {
    acc = (acc << 8) | static_cast<unsigned char>(ch);
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += alphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0) out += alphabet[(acc << (6 - bits)) & 63];
  return out;
}

std::optional<std::string> base64url_decode(std::string_view in) {
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = value_of(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  // Leftover bits (2 or 4) must be zero: one canonical encoding per byte string.
  if (bits > 0 && (acc & ((1U << bits) - 1)) != 0) return std::nullopt;
  return out;
}

// --- standard base64 ------------------------------------------------------------------------
//
// The standard alphabet differs from base64url only in two characters and the padding, so
// both go through the one strict codec above.

std::string base64_encode(std::string_view in) {
  std::string out = base64url_encode(in);
  for (char& c : out) {
    if (c == '-') {
      c = '+';
    } else if (c == '_') {
      c = '/';
    }
  }
  out.append((4 - out.size() % 4) % 4, '=');
  return out;
}

std::optional<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::size_t pad = 0;
  while (pad < 2 && pad < in.size() && in[in.size() - 1 - pad] == '=') ++pad;
  std::string url(in.substr(0, in.size() - pad));
  for (char& c : url) {
    if (c == '-' || c == '_') return std::nullopt;  // base64url's, not this alphabet's
    if (c == '+') {
      c = '-';
    } else if (c == '/') {
      c = '_';
    }
  }
  // Any '=' left is padding out of place: base64url_decode refuses it, as it refuses
  // unused bits that are not zero.
  return base64url_decode(url);
}

}  // namespace sandbox::detail
