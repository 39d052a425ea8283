// L7 egress rules at request time (l7_rules.hpp).
#include "core/egress/l7_rules.hpp"

#include <algorithm>

#include "protocol/egress_paths.hpp"

namespace sandbox::detail {

namespace {

constexpr std::size_t max_advice_bytes = 600;

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

// "rule 'rates-read' allows GET, HEAD /v1/rates/, /v1/lanes/"
std::string allows_text(const egress_rule& r) {
  return "rule '" + r.name + "' allows " + join(r.methods, ", ") + " " + join(r.paths, ", ");
}

// Cut to `max_advice_bytes` (advice is ASCII: rule names, methods and paths are).
std::string bounded(std::string s) {
  if (s.size() > max_advice_bytes) {
    s.resize(max_advice_bytes - 3);
    s += "...";
  }
  return s;
}

}  // namespace

std::string_view target_path(std::string_view target) noexcept {
  return target.substr(0, target.find('?'));
}

std::optional<std::string> unsafe_target(std::string_view target) {
  for (const char c : target) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x21 || b > 0x7E) return "a control byte, space or non-ASCII byte";
    if (c == '\\') return "a backslash";
    if (c == '#') return "a fragment ('#')";
  }
  const std::string_view path = target_path(target);
  if (path == "*") return std::nullopt;  // OPTIONS *: no rule path matches it
  if (path.empty() || path.front() != '/') return "not an origin-form path";
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') continue;
    const int hi = i + 1 < path.size() ? hex_value(path[i + 1]) : -1;
    const int lo = i + 2 < path.size() ? hex_value(path[i + 2]) : -1;
    if (hi < 0 || lo < 0) return "a malformed percent-encoding";
    const int v = hi * 16 + lo;
    if (v == '.' || v == '/' || v == '\\' || v == '%') {
      return "a percent-encoded '.', '/', '\\' or '%'";
    }
    if (v < 0x20 || v == 0x7F) return "a percent-encoded control byte";
    if (v == 0xC0 || v == 0xC1) return "a percent-encoded overlong UTF-8 lead byte";
  }
  if (has_dot_segment(path)) return "a '.' or '..' segment";
  return std::nullopt;
}

std::string display_target(std::string_view text) {
  constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x21 && b <= 0x7E && b != '\\') {
      if (out.size() + 1 > max_recorded_target_bytes) break;
      out += c;
    } else {
      if (out.size() + 4 > max_recorded_target_bytes) break;
      out += "\\x";
      out += digits[b >> 4];
      out += digits[b & 0xF];
    }
  }
  return out;
}

l7_rules::l7_rules(std::vector<egress_rule> rules)
    : rules_(std::move(rules)), requests_(rules_.size(), 0), bytes_(rules_.size(), 0) {}

bool l7_rules::applies(std::string_view host) const {
  return std::any_of(rules_.begin(), rules_.end(),
                     [&](const egress_rule& r) { return egress_pattern_matches(r.host, host); });
}

std::string l7_rules::spent_advice(std::size_t i) const {
  const egress_rule& r = rules_.at(i);
  std::string budget;
  if (r.max_requests) budget += std::to_string(*r.max_requests) + " requests";
  if (r.max_bytes) {
    if (!budget.empty()) budget += " and ";
    budget += std::to_string(*r.max_bytes) + " bytes";
  }
  return bounded("rule '" + r.name + "' allows " + budget +
                 " per run, and this run has spent them: do not retry");
}

l7_verdict l7_rules::admit(std::string_view host, std::string_view method, std::string_view target,
                           std::optional<std::uint64_t> body_bytes) {
  l7_verdict v;
  std::vector<std::size_t> mine;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    if (!egress_pattern_matches(rules_[i].host, host)) continue;
    mine.push_back(i);
    names.push_back(rules_[i].name);
  }
  if (mine.empty()) return v;
  v.ruled = true;
  const auto refuse = [&](std::string_view reason, std::string rule_names, std::string advice) {
    v.allowed = false;
    v.status = 403;
    v.reason = reason;
    v.rule_names = std::move(rule_names);
    v.advice = bounded(std::move(advice));
    return v;
  };
  std::vector<std::string> allowed;
  for (const std::size_t i : mine) allowed.push_back(allows_text(rules_[i]));
  if (auto why = unsafe_target(target)) {
    return refuse(unsafe_path_reason, join(names, ","),
                  "the path holds " + *why +
                      ": rules judge paths as sent, so send the plain path (no '.' or '..' "
                      "segments, no encoded '.', '/', '\\' or '%', no backslash); " +
                      join(allowed, "; "));
  }
  const std::string_view path = target_path(target);
  std::vector<std::size_t> matching;
  for (const std::size_t i : mine) {
    const egress_rule& r = rules_[i];
    if (std::find(r.methods.begin(), r.methods.end(), method) == r.methods.end()) continue;
    if (std::none_of(r.paths.begin(), r.paths.end(),
                     [&](const std::string& p) { return egress_path_matches(p, path); })) {
      continue;
    }
    matching.push_back(i);
  }
  if (matching.empty()) {
    return refuse(rule_refused_reason, join(names, ","),
                  "no rule for this host allows " + display_target(method) + " " +
                      display_target(path) + ": " + join(allowed, "; "));
  }
  for (const std::size_t i : matching) {
    const egress_rule& r = rules_[i];
    const bool requests_left = !r.max_requests || requests_[i] < *r.max_requests;
    const std::uint64_t left = r.max_bytes ? *r.max_bytes - std::min(bytes_[i], *r.max_bytes) : 1;
    const bool bytes_left = !r.max_bytes || (left > 0 && (!body_bytes || *body_bytes <= left));
    if (!requests_left || !bytes_left) continue;
    ++requests_[i];
    if (body_bytes && r.max_bytes) bytes_[i] += *body_bytes;
    v.rule = i;
    v.rule_names = r.name;
    return v;
  }
  v.rule = matching.front();
  return refuse(budget_exhausted_reason, rules_[matching.front()].name,
                spent_advice(matching.front()));
}

std::uint64_t l7_rules::take_bytes(std::size_t i, std::uint64_t n) noexcept {
  if (i >= rules_.size()) return n;
  const auto& max = rules_[i].max_bytes;
  if (!max) return n;
  const std::uint64_t left = *max - std::min(bytes_[i], *max);
  const std::uint64_t granted = std::min(n, left);
  bytes_[i] += granted;
  return granted;
}

}  // namespace sandbox::detail
