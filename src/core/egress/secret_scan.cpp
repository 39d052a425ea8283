// Finding secret placeholders (secret_scan.hpp).
#include "core/egress/secret_scan.hpp"

#include <algorithm>

namespace sandbox::detail {
namespace {

char lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool contains_ci(std::string_view text, std::string_view lower_mark) noexcept {
  if (lower_mark.empty() || text.size() < lower_mark.size()) return false;
  const auto it = std::search(text.begin(), text.end(), lower_mark.begin(), lower_mark.end(),
                              [](char a, char b) { return lower(a) == b; });
  return it != text.end();
}

}  // namespace

std::vector<std::string> placeholder_marks(std::span<const std::string> placeholders) {
  std::vector<std::string> out;
  for (const auto& p : placeholders) {
    std::string m =
        p.size() > placeholder_mark_bytes ? p.substr(p.size() - placeholder_mark_bytes) : p;
    std::transform(m.begin(), m.end(), m.begin(), lower);
    if (!m.empty()) out.push_back(std::move(m));
  }
  return out;
}

bool holds_placeholder(std::string_view text, std::span<const std::string> marks) noexcept {
  return std::any_of(marks.begin(), marks.end(),
                     [&](const std::string& m) { return contains_ci(text, m); });
}

bool dns_name_holds_placeholder(std::string_view name, std::span<const std::string> marks) {
  std::string joined;
  joined.reserve(name.size());
  for (char c : name) {
    if (c != '.') joined += c;
  }
  return holds_placeholder(joined, marks);
}

placeholder_scanner::placeholder_scanner(std::vector<std::string> marks)
    : marks_(std::move(marks)) {
  for (const auto& m : marks_) keep_ = std::max(keep_, m.size() - 1);
}

bool placeholder_scanner::feed(std::string_view piece) {
  if (found_ || marks_.empty()) return found_;
  // Scan the kept tail and the piece together, so a mark split between pieces is seen.
  std::string window = tail_;
  window.append(piece);
  if (holds_placeholder(window, marks_)) {
    found_ = true;
    tail_.clear();
    return true;
  }
  tail_ = window.size() > keep_ ? window.substr(window.size() - keep_) : window;
  return false;
}

}  // namespace sandbox::detail
