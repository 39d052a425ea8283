// Environment variable names a request may set (admission) and a host policy may allow
// (configuration): one rule for both, so a policy cannot list a name admission would refuse.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>

namespace sandbox::detail {

inline constexpr std::size_t max_env_name_bytes = 128;

/// POSIX portable name: [A-Za-z_][A-Za-z0-9_]* (IEEE Std 1003.1, 8.1), at most 128 bytes.
inline bool is_env_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > max_env_name_bytes) return false;
  auto alpha = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (!alpha(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); });
}

/// Names the sandbox sets itself or that steer the dynamic loader or proxies: refused even
/// when the policy lists them (policy.hpp, `allowed_env`).
inline bool is_reserved_env(std::string_view name) noexcept {
  static constexpr std::array<std::string_view, 11> exact{
      "PATH",       "HOME",        "LANG",      "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
      "NO_PROXY",   "http_proxy",  "https_proxy", "all_proxy", "no_proxy"};
  if (std::find(exact.begin(), exact.end(), name) != exact.end()) return true;
  return name.starts_with("SANDBOX_") || name.starts_with("LD_");
}

}  // namespace sandbox::detail
