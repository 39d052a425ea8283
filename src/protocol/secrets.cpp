// Secret names, their placeholders' variable names, and the check of a secret's definition
// (sandbox/secrets.hpp). Pure: no file is read here (core/egress/secret_file.cpp reads them).
#include "sandbox/secrets.hpp"

#include <algorithm>

#include "protocol/text_util.hpp"
#include "sandbox/egress.hpp"

namespace sandbox {
namespace {

constexpr std::size_t max_header_bytes = 256;
constexpr std::string_view value_mark = "{value}";

/// RFC 9110 §5.6.2 `tchar`: what a header field name is made of.
bool is_tchar(char c) noexcept {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

}  // namespace

bool is_valid_secret_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64) return false;
  if (name.front() < 'a' || name.front() > 'z' || name.back() == '-') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

std::string secret_env_name(std::string_view name) {
  std::string out = "SANDBOX_SECRET_";
  for (char c : name) {
    out += c == '-' ? '_' : (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  }
  return out;
}

std::optional<std::string> check_secret_definition(secret_definition& d) {
  using detail::quote_for_message;
  if (d.file.empty() || d.file.front() != '/' || d.file.find('\0') != std::string::npos ||
      d.file.size() > 4096) {
    return "file: must be an absolute path (the value is never inline)";
  }
  if (d.domains.empty()) return "domains: must name at least one domain";
  std::vector<std::string> canonical;
  for (std::size_t i = 0; i < d.domains.size(); ++i) {
    auto c = canonical_egress_pattern(d.domains[i]);
    if (!c) {
      return "domains[" + std::to_string(i) +
             "]: not a host name or '*.' wildcard pattern: " + quote_for_message(d.domains[i]);
    }
    if (std::find(canonical.begin(), canonical.end(), *c) == canonical.end()) {
      canonical.push_back(std::move(*c));
    }
  }
  if (canonical.size() > max_egress_patterns) {
    return "domains: more than " + std::to_string(max_egress_patterns) + " patterns";
  }
  d.domains = std::move(canonical);
  const std::string& h = d.header;
  if (h.size() > max_header_bytes) {
    return "header: longer than " + std::to_string(max_header_bytes) + " bytes";
  }
  for (char c : h) {
    if (c < 0x20 || c > 0x7e) return "header: only printable ASCII (no line breaks)";
  }
  const auto colon = h.find(':');
  if (colon == std::string::npos || colon == 0) {
    return "header: expected '<Name>: <template with {value}>', e.g. 'Authorization: Bearer "
           "{value}'";
  }
  if (!std::all_of(h.begin(), h.begin() + static_cast<std::ptrdiff_t>(colon), is_tchar)) {
    return "header: the name before ':' must be an HTTP field name (RFC 9110 token)";
  }
  const auto first = h.find(value_mark, colon);
  if (first == std::string::npos || h.find(value_mark, first + 1) != std::string::npos) {
    return "header: the template must hold '{value}' exactly once";
  }
  return std::nullopt;
}

std::string_view secret_header_name(const secret_definition& d) noexcept {
  const auto colon = d.header.find(':');
  return std::string_view(d.header).substr(0, colon == std::string::npos ? 0 : colon);
}

}  // namespace sandbox
