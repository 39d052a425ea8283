// Workload profiles and registry entries (sandbox/policy.hpp, sandbox/registry.hpp): the pure
// checks and the one resolution of "policy + profile → per-run limits" every backend gets.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include "protocol/env_rules.hpp"
#include "protocol/python_runtime.hpp"
#include "protocol/text_util.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/backend_options.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/protocol.hpp"

namespace sandbox {

bool is_valid_registry_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alnum(c) || c == '.' || c == '_' || c == '-'; });
}

std::optional<effective_limits_result> effective_limits(const policy& base,
                                                        const std::string& profile) {
  effective_limits_result out{.limits = base, .clamped = {}};
  if (profile.empty()) return out;
  const auto it = base.profiles.find(profile);
  if (it == base.profiles.end()) return std::nullopt;
  const workload_profile& p = it->second;
  const auto& c = base.ceilings;
  // Each set field replaces the policy's value, then its ceiling bounds it.
  auto apply = [&](const auto& want, auto& field, auto ceiling, const char* name) {
    if (!want) return;
    field = *want;
    if (field > ceiling) {
      field = ceiling;
      out.clamped.emplace_back(name);
    }
  };
  policy& l = out.limits;
  apply(p.max_pids, l.max_pids, c.max_pids, "max_pids");
  // A CPU quota of 0 means "no limit" (cgroup `cpu.max` "max"), so it ranks above every
  // number: a profile's 0 is clamped to a non-zero ceiling, and only a ceiling of 0 (no
  // ceiling) lets a profile run unlimited.
  if (p.cpu_quota_millicores) {
    const auto unlimited_last = [](std::uint32_t v) {
      return v == 0 ? std::numeric_limits<std::uint64_t>::max() : std::uint64_t{v};
    };
    l.cpu_quota_millicores = *p.cpu_quota_millicores;
    if (unlimited_last(l.cpu_quota_millicores) > unlimited_last(c.cpu_quota_millicores)) {
      l.cpu_quota_millicores = c.cpu_quota_millicores;
      out.clamped.emplace_back("cpu_quota_millicores");
    }
  }
  apply(p.max_open_files, l.max_open_files, c.max_open_files, "max_open_files");
  apply(p.tmp_bytes, l.tmp_bytes, c.tmp_bytes, "tmp_bytes");
  apply(p.home_bytes, l.home_bytes, c.home_bytes, "home_bytes");
  apply(p.shm_bytes, l.shm_bytes, c.shm_bytes, "shm_bytes");
  apply(p.tmpfs_inodes, l.tmpfs_inodes, c.tmpfs_inodes, "tmpfs_inodes");
  return out;
}

namespace {

// A program exec'd as given inside the image's root: absolute, no way out of it, and no byte
// that the init protocol's NUL-separated config could split.
bool is_clean_absolute_path(std::string_view path) {
  if (path.empty() || path.front() != '/' || path.size() > 4096 ||
      path.find('\0') != std::string_view::npos) {
    return false;
  }
  std::size_t i = 1;
  while (i <= path.size()) {
    const std::size_t end = std::min(path.find('/', i), path.size());
    const std::string_view part = path.substr(i, end - i);
    if (part.empty() || part == "." || part == "..") return false;
    i = end + 1;
  }
  return true;
}

// The refusal of a bad name, whole (a literal: GCC 12 warns falsely, -Warray-bounds, on
// `std::string("name: ") + rule` inlined at -O2).
constexpr const char* bad_name_message =
    "name: must be 1 to 64 characters of [a-z0-9._-], starting with a letter or digit";

}  // namespace

bool detail::is_python_runtime(const runtime_spec& r) noexcept {
  if (r.argv.empty()) return false;
  const std::string_view binary = r.argv.front();
  const auto slash = binary.rfind('/');
  return binary.substr(slash == std::string_view::npos ? 0 : slash + 1).starts_with("python");
}

std::optional<std::string> check_runtime_spec(const runtime_spec& r) {
  using detail::quote_for_message;
  if (!is_valid_registry_name(r.name)) return std::string(bad_name_message);
  if (!r.image.empty() && !is_valid_registry_name(r.image)) {
    return "image: must name an image of the store (1 to 64 characters of [a-z0-9._-])";
  }
  if (r.argv.empty() || r.argv.size() > 256) return "argv: 1 to 256 arguments";
  if (!is_clean_absolute_path(r.argv[0])) {
    return "argv[0]: must be an absolute path without empty, '.' or '..' components (the "
           "interpreter inside the image, exec'd directly: never through a shell)";
  }
  std::size_t sources = 0;
  for (std::size_t i = 0; i < r.argv.size(); ++i) {
    const std::string& a = r.argv[i];
    if (a.find('\0') != std::string::npos) return "argv[" + std::to_string(i) + "]: contains NUL";
    if (a.size() > 4096) return "argv[" + std::to_string(i) + "]: over 4096 bytes";
    if (a == "{source}") ++sources;
  }
  if (sources != 1 || r.argv[0] == "{source}") {
    return "argv: exactly one argument after the first must be \"{source}\" (the source "
           "file's path)";
  }
  const std::string& sn = r.source_name;
  bool control = false;
  for (char c : sn) control = control || static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
  if (sn.empty() || sn.size() > 255 || sn.find('/') != std::string::npos || control || sn == "." ||
      sn == ".." || detail::utf8_error_offset(sn) != std::string_view::npos) {
    return "source_name: must be 1 to 255 bytes of UTF-8 without '/' or control characters, "
           "not \".\" or \"..\"";
  }
  if (sn == "out" || sn.starts_with("in-")) {
    return "source_name: " + quote_for_message(sn) +
           " collides with the run's output or input directory (\"out\", \"in-*\")";
  }
  return std::nullopt;
}

std::optional<std::string> check_tool_entry(const tool_entry& e, const policy& p) {
  using detail::quote_for_message;
  if (!is_valid_registry_name(e.name)) return std::string(bad_name_message);
  if (!is_valid_registry_name(e.image)) {
    return "image: must name an image of the store (1 to 64 characters of [a-z0-9._-])";
  }
  if (e.image_digest && !is_valid_blob_id(*e.image_digest)) {
    return "image_digest: expected 'sha256:' and 64 lowercase hex digits";
  }
  if (!is_clean_absolute_path(e.binary)) {
    return "binary: must be an absolute path without empty, '.' or '..' components";
  }
  if (e.args.size() > 256) return "args: more than 256 arguments";
  for (std::size_t i = 0; i < e.args.size(); ++i) {
    if (e.args[i].find('\0') != std::string::npos) {
      return "args[" + std::to_string(i) + "]: contains NUL";
    }
  }
  if (!e.profile.empty() && !p.profiles.contains(e.profile)) {
    return "profile: no workload profile named " + quote_for_message(e.profile) +
           " in policy.profiles";
  }
  // The entry's own network policy: egress patterns (sandbox/egress.hpp), canonicalized by
  // the runtime when it registers the entry.
  std::vector<std::string> canonical;
  for (std::size_t i = 0; i < e.egress.size(); ++i) {
    auto c = canonical_egress_pattern(e.egress[i]);
    if (!c) {
      return "egress[" + std::to_string(i) +
             "]: not a host name or *.suffix pattern: " + quote_for_message(e.egress[i]);
    }
    if (std::find(canonical.begin(), canonical.end(), *c) == canonical.end()) {
      canonical.push_back(*c);
    }
  }
  if (canonical.size() > max_egress_patterns) {
    return "egress: " + std::to_string(canonical.size()) + " patterns, more than " +
           std::to_string(max_egress_patterns);
  }
  if (e.env.size() > p.max_env_vars) {
    return "env: more than " + std::to_string(p.max_env_vars) + " variables";
  }
  for (const auto& [name, value] : e.env) {
    // The same rules as a request's variables (one function for both).
    if (auto why = detail::env_var_problem(name, value, p)) {
      return "env[" + quote_for_message(name) + "]" + *why;
    }
  }
  return std::nullopt;
}

bool is_valid_preload_module(std::string_view name) noexcept {
  if (name.empty() || name.size() > 128) return false;
  bool at_start = true;  // at the start of a component
  for (char c : name) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (c == '.') {
      if (at_start) return false;  // an empty component
      at_start = true;
    } else if (alpha || (digit && !at_start)) {
      at_start = false;
    } else {
      return false;
    }
  }
  return !at_start;
}

// Here, not in the runtime room: the configuration's checks (config_json.cpp) need the
// defaults too, and the protocol room is below the runtime room.
std::vector<runtime_spec> default_runtimes() {
  return {
      runtime_spec{.name = "python3",
                   .argv = {"/usr/bin/python3", "-I", "{source}"},
                   .source_name = "main.py",
                   .image = {}},
      runtime_spec{.name = "node",
                   .argv = {"/usr/bin/node", "{source}"},
                   .source_name = "main.js",
                   .image = {}},
  };
}

prestart_kind prestart_kind_of(const runtime_spec& spec) noexcept {
  if (spec.argv.empty() || spec.argv[0].empty() || spec.argv[0].front() != '/') {
    return prestart_kind::none;
  }
  const std::string_view base = std::string_view(spec.argv[0]).substr(spec.argv[0].rfind('/') + 1);
  if (spec.argv.size() == 3 && base.starts_with("python3") && spec.argv[1] == "-I" &&
      spec.argv[2] == "{source}") {
    return prestart_kind::python;
  }
  if (spec.argv.size() == 2 && (base == "node" || base == "nodejs") && spec.argv[1] == "{source}") {
    return prestart_kind::node;
  }
  return prestart_kind::none;
}

bool supports_prestart(const runtime_spec& spec) noexcept {
  return prestart_kind_of(spec) != prestart_kind::none;
}

namespace {

// One part of a Node package name or subpath: `[A-Za-z0-9._~-]+`; a name (or scope) must not
// start with '.', '_', '-' or '~'; a subpath part must not be "." or "..".
bool is_node_name_part(std::string_view part, bool leading) noexcept {
  if (part.empty()) return false;
  for (char c : part) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '~' || c == '-';
    if (!ok) return false;
  }
  if (leading) return part[0] != '.' && part[0] != '_' && part[0] != '-' && part[0] != '~';
  return part != "." && part != "..";
}

bool is_valid_node_preload_module(std::string_view name) noexcept {
  if (name.empty() || name.size() > 214) return false;
  if (name.starts_with("node:")) {  // a built-in: node:fs, node:fs/promises
    name.remove_prefix(5);
    if (name.empty() || name.front() == '/' || name.back() == '/') return false;
    for (char c : name) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '/')) {
        return false;
      }
    }
    return name.find("//") == std::string_view::npos;
  }
  auto next = [&name]() {
    const auto slash = name.find('/');
    std::string_view part = name.substr(0, slash);
    name = slash == std::string_view::npos ? std::string_view() : name.substr(slash + 1);
    return std::pair{part, slash != std::string_view::npos};
  };
  if (name.front() == '@') {  // @scope/name
    name.remove_prefix(1);
    auto [scope, more] = next();
    if (!more || !is_node_name_part(scope, true)) return false;
  }
  auto [pkg, more] = next();
  if (!is_node_name_part(pkg, true)) return false;
  while (more) {
    auto [part, again] = next();
    if (!is_node_name_part(part, false)) return false;
    more = again;
  }
  return true;
}

}  // namespace

bool is_valid_preload_module(prestart_kind kind, std::string_view name) noexcept {
  switch (kind) {
    case prestart_kind::python:
      return is_valid_preload_module(name);
    case prestart_kind::node:
      return is_valid_node_preload_module(name);
    case prestart_kind::none:
      break;
  }
  return false;
}

}  // namespace sandbox
