// Egress allowlist patterns (include/sandbox/egress.hpp).
#include "sandbox/egress.hpp"

#include <algorithm>

namespace sandbox {
namespace {

constexpr char lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// The canonical form of host name `s` (lowered, one trailing dot dropped), or nullopt.
std::optional<std::string> canonical_host(std::string_view s) {
  if (!s.empty() && s.back() == '.') s.remove_suffix(1);
  if (s.empty() || s.size() > max_egress_name_bytes) return std::nullopt;
  std::string out;
  out.reserve(s.size());
  std::size_t labels = 0;
  std::size_t start = 0;
  bool last_all_digits = false;
  while (start <= s.size()) {
    std::size_t end = s.find('.', start);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view label = s.substr(start, end - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return std::nullopt;
    }
    bool digits = true;
    for (char c : label) {
      const char l = lower(c);
      const bool ok = (l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '-';
      if (!ok) return std::nullopt;
      digits = digits && l >= '0' && l <= '9';
      out.push_back(l);
    }
    ++labels;
    last_all_digits = digits;
    if (end == s.size()) break;
    out.push_back('.');
    start = end + 1;
  }
  if (labels < 2 || last_all_digits) return std::nullopt;
  return out;
}

}  // namespace

std::optional<std::string> canonical_egress_pattern(std::string_view pattern) {
  if (pattern.starts_with("*.")) {
    auto host = canonical_host(pattern.substr(2));
    if (!host) return std::nullopt;
    return "*." + *host;
  }
  return canonical_host(pattern);
}

bool egress_pattern_matches(std::string_view pattern, std::string_view host) {
  auto h = canonical_host(host);
  if (!h) return false;
  if (pattern.starts_with("*.")) {
    const std::string_view suffix = pattern.substr(1);  // ".example.com"
    return h->size() > suffix.size() && std::string_view(*h).ends_with(suffix);
  }
  return *h == pattern;
}

bool egress_allowed(std::span<const std::string> patterns, std::string_view host) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& p) { return egress_pattern_matches(p, host); });
}

bool egress_subset(std::span<const std::string> inner, std::span<const std::string> outer) {
  return std::all_of(inner.begin(), inner.end(), [&](const std::string& p) {
    if (std::find(outer.begin(), outer.end(), p) != outer.end()) return true;
    // An exact name, or the suffix of a narrower wildcard, must be strictly under a wildcard
    // of `outer` ("*.a.example.com" ⊂ "*.example.com"; "*.example.com" ⊄ "example.com").
    const std::string_view name = p.starts_with("*.") ? std::string_view(p).substr(2) : p;
    return std::any_of(outer.begin(), outer.end(), [&](const std::string& o) {
      return o.starts_with("*.") && egress_pattern_matches(o, name);
    });
  });
}

}  // namespace sandbox
