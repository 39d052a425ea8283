// Environment variable names a request may set (admission) and a host policy may allow
// (configuration): one rule for both, so a policy cannot list a name admission would refuse.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "sandbox/policy.hpp"

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
  static constexpr std::array<std::string_view, 3> exact{"PATH", "HOME", "LANG"};
  if (std::find(exact.begin(), exact.end(), name) != exact.end()) return true;
  // Proxy settings in any spelling: Python's urllib takes every name whose lower-case form
  // ends in "_proxy" (Http_Proxy, FTP_PROXY, ...), curl and others some of them.
  constexpr std::string_view proxy = "_proxy";
  if (name.size() >= proxy.size()) {
    bool is_proxy = true;
    for (std::size_t i = 0; i < proxy.size(); ++i) {
      char c = name[name.size() - proxy.size() + i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      is_proxy = is_proxy && c == proxy[i];
    }
    if (is_proxy) return true;
  }
  return name.starts_with("SANDBOX_") || name.starts_with("LD_");
}

/// Why the variable `name`=`value` may not be set under `p` (a request's `env`, a registry
/// entry's), as ": <reason>" to follow the field's path, or nullopt: name length and syntax,
/// reserved, not in `p.allowed_env`, NUL in the value, value too long — in that order.
inline std::optional<std::string> env_var_problem(std::string_view name, std::string_view value,
                                                  const policy& p) {
  if (name.size() > max_env_name_bytes) {
    return ": name longer than " + std::to_string(max_env_name_bytes) + " bytes";
  }
  if (!is_env_name(name)) return ": not a valid name (expected [A-Za-z_][A-Za-z0-9_]*)";
  if (is_reserved_env(name)) return ": reserved name, set by the sandbox";
  if (p.allowed_env.count(std::string(name)) == 0) return ": not allowed by the policy";
  if (value.find('\0') != std::string_view::npos) return ": value contains NUL";
  if (value.size() > p.max_env_value_bytes) {
    return ": value longer than " + std::to_string(p.max_env_value_bytes) + " bytes";
  }
  return std::nullopt;
}

}  // namespace sandbox::detail
