// Egress allowlist patterns (include/sandbox/egress.hpp).
#include "sandbox/egress.hpp"

#include <algorithm>

#include "protocol/egress_paths.hpp"
#include "protocol/text_util.hpp"

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

std::optional<std::string> egress_intersection(std::string_view a, std::string_view b) {
  const std::string sa(a), sb(b);
  if (egress_subset(std::span(&sa, 1), std::span(&sb, 1))) return sa;
  if (egress_subset(std::span(&sb, 1), std::span(&sa, 1))) return sb;
  return std::nullopt;
}

// --- L7 rules ---------------------------------------------------------------------------

bool is_valid_egress_rule_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

namespace {

// Why `path` cannot be a rule's path prefix, or nullopt.
std::optional<std::string> path_prefix_problem(std::string_view path) {
  if (path.empty() || path.front() != '/') return "must start with '/'";
  if (path.size() > max_egress_rule_path_bytes) {
    return "longer than " + std::to_string(max_egress_rule_path_bytes) + " bytes";
  }
  for (const char c : path) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x21 || b > 0x7E) return "only printable ASCII without spaces";
    if (c == '%') return "no '%': prefixes are compared as sent, never decoded";
    if (c == '?' || c == '#') return "no '?' or '#': a prefix is a path, without query";
    if (c == '\\') return "no '\\'";
  }
  // (What a request's path may not hold either: the proxy refuses such paths to a host with
  // rules, so no rule could match them.)
  if (detail::has_dot_segment(path)) {
    return "no '.' or '..' segments (nor one starting '..' or '.;')";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> check_egress_rule(egress_rule& rule) {
  using detail::quote_for_message;
  if (!is_valid_egress_rule_name(rule.name)) {
    return "name: must be 1 to 64 characters of [a-z0-9-]: " + quote_for_message(rule.name);
  }
  const auto host = canonical_egress_pattern(rule.host);
  if (!host) {
    return "host: not a host name or '*.' wildcard pattern: " + quote_for_message(rule.host);
  }
  rule.host = *host;
  if (rule.methods.empty()) return "methods: must not be empty";
  for (std::size_t i = 0; i < rule.methods.size(); ++i) {
    const std::string p = "methods[" + std::to_string(i) + "]";
    const auto& m = rule.methods[i];
    if (std::find(egress_rule_methods.begin(), egress_rule_methods.end(), m) ==
        egress_rule_methods.end()) {
      return p + ": not one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS (upper case): " +
             quote_for_message(m);
    }
    if (std::find(rule.methods.begin(), rule.methods.begin() + static_cast<std::ptrdiff_t>(i), m) !=
        rule.methods.begin() + static_cast<std::ptrdiff_t>(i)) {
      return p + ": duplicate " + quote_for_message(m);
    }
  }
  if (rule.paths.empty()) return "paths: must not be empty";
  if (rule.paths.size() > max_egress_rule_paths) {
    return "paths: " + std::to_string(rule.paths.size()) + " prefixes, more than the limit of " +
           std::to_string(max_egress_rule_paths);
  }
  for (std::size_t i = 0; i < rule.paths.size(); ++i) {
    const std::string p = "paths[" + std::to_string(i) + "]";
    const auto& path = rule.paths[i];
    if (auto why = path_prefix_problem(path))
      return p + ": " + *why + ": " + quote_for_message(path);
    if (std::find(rule.paths.begin(), rule.paths.begin() + static_cast<std::ptrdiff_t>(i), path) !=
        rule.paths.begin() + static_cast<std::ptrdiff_t>(i)) {
      return p + ": duplicate " + quote_for_message(path);
    }
  }
  if (rule.max_requests && *rule.max_requests == 0) {
    return "max_requests: must be greater than 0 (leave it out for no request budget)";
  }
  if (rule.max_bytes && *rule.max_bytes == 0) {
    return "max_bytes: must be greater than 0 (leave it out for no byte budget)";
  }
  return std::nullopt;
}

bool egress_path_matches(std::string_view prefix, std::string_view path) noexcept {
  if (prefix.empty() || !path.starts_with(prefix)) return false;
  if (prefix.back() == '/' || path.size() == prefix.size()) return true;
  return path[prefix.size()] == '/';
}

bool egress_rule_within(const egress_rule& inner, const egress_rule& outer) {
  if (!egress_subset(std::span(&inner.host, 1), std::span(&outer.host, 1))) return false;
  for (const auto& m : inner.methods) {
    if (std::find(outer.methods.begin(), outer.methods.end(), m) == outer.methods.end()) {
      return false;
    }
  }
  for (const auto& p : inner.paths) {
    // Every path `p` matches is one `q` matches exactly when `q` matches `p` itself.
    if (std::none_of(outer.paths.begin(), outer.paths.end(),
                     [&](const std::string& q) { return egress_path_matches(q, p); })) {
      return false;
    }
  }
  const auto kept = [](const std::optional<std::uint64_t>& in,
                       const std::optional<std::uint64_t>& out) {
    return !out || (in && *in <= *out);
  };
  return kept(inner.max_requests, outer.max_requests) && kept(inner.max_bytes, outer.max_bytes);
}

}  // namespace sandbox

namespace sandbox::detail {

bool has_dot_segment(std::string_view path) noexcept {
  std::size_t at = 1;
  while (at <= path.size()) {
    std::size_t end = path.find('/', at);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view seg = path.substr(at, end - at);
    if (seg == "." || seg.starts_with("..") || seg.starts_with(".;")) return true;
    at = end + 1;
  }
  return false;
}

}  // namespace sandbox::detail
