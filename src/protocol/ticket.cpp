// Ticket minting, derivation, the derivation rules, and the JSON forms of tickets and
// approval requests (sandbox/ticket.hpp; protocol/ticket_json.hpp).
#include "sandbox/ticket.hpp"

#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "protocol/json_strict.hpp"
#include "protocol/sha256.hpp"
#include "protocol/text_util.hpp"
#include "protocol/ticket_json.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/secrets.hpp"

namespace sandbox {
namespace detail {

ticket ticket_access::make(ticket_spec spec, bool network, std::vector<std::string> ancestors,
                           std::optional<approval_request> approval) {
  ticket t(std::move(spec), network);
  t.ancestors_ = std::move(ancestors);
  t.approval_ = std::move(approval);
  return t;
}

bool is_valid_ticket_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (c < 0x20 || c > 0x7E) return false;  // printable ASCII only
  }
  return true;
}

bool is_hex_sha256(std::string_view s) noexcept {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace detail

namespace {

using detail::quote_for_message;
using nlohmann::json;
using nlohmann::ordered_json;
namespace chrono = std::chrono;
using time_point = chrono::system_clock::time_point;

// 1970-01-01T00:00:00Z .. 2199-12-31T23:59:59Z: what the JSON form writes, and well inside
// what a system_clock::time_point holds (nanoseconds: up to 2262).
constexpr int max_expiry_year = 2199;
constexpr chrono::sys_seconds min_expiry{chrono::sys_days{chrono::year{1970} / 1 / 1}};
constexpr chrono::sys_seconds max_expiry{chrono::sys_days{chrono::year{max_expiry_year} / 12 / 31} +
                                         chrono::hours(23) + chrono::minutes(59) +
                                         chrono::seconds(59)};

/// Canonicalizes `patterns` in place (lower case, no trailing dot, duplicates dropped, order
/// kept). Returns the first problem as "egress[i]: …" / "egress: …", or nullopt.
std::optional<std::string> canonicalize_egress(std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    auto c = canonical_egress_pattern(patterns[i]);
    if (!c) {
      return "egress[" + std::to_string(i) +
             "]: not a host name or '*.' wildcard pattern: " + quote_for_message(patterns[i]);
    }
    if (std::find(out.begin(), out.end(), *c) == out.end()) out.push_back(std::move(*c));
  }
  if (out.size() > max_egress_patterns) {
    return "egress: " + std::to_string(out.size()) + " patterns, more than the limit of " +
           std::to_string(max_egress_patterns);
  }
  patterns = std::move(out);
  return std::nullopt;
}

/// Checks a ticket's `tools` (names or "*", at most 64) and drops duplicates (order kept).
/// Returns the first problem as "tools[i]: …" / "tools: …", or nullopt.
std::optional<std::string> canonicalize_tools(std::vector<std::string>& tools) {
  constexpr std::size_t max_tools = 64;
  std::vector<std::string> out;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    if (tools[i] != "*" && !is_valid_registry_name(tools[i])) {
      return "tools[" + std::to_string(i) +
             "]: not a tool name or '*': " + quote_for_message(tools[i]);
    }
    if (std::find(out.begin(), out.end(), tools[i]) == out.end()) out.push_back(tools[i]);
  }
  if (out.size() > max_tools) {
    return "tools: " + std::to_string(out.size()) + " names, more than the limit of " +
           std::to_string(max_tools);
  }
  tools = std::move(out);
  return std::nullopt;
}

/// Checks a ticket's or request's `secrets` (names, at most `max_secrets`) and drops
/// duplicates (order kept). Returns the first problem as "secrets[i]: …" / "secrets: …".
std::optional<std::string> canonicalize_secrets(std::vector<std::string>& secrets) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < secrets.size(); ++i) {
    if (!is_valid_secret_name(secrets[i])) {
      return "secrets[" + std::to_string(i) +
             "]: not a secret name ([a-z0-9-], starting with a letter): " +
             quote_for_message(secrets[i]);
    }
    if (std::find(out.begin(), out.end(), secrets[i]) == out.end()) out.push_back(secrets[i]);
  }
  if (out.size() > max_secrets) {
    return "secrets: " + std::to_string(out.size()) + " names, more than the limit of " +
           std::to_string(max_secrets);
  }
  secrets = std::move(out);
  return std::nullopt;
}

/// Checks a ticket's `egress_rules` (after its `egress` was canonicalized): only with the
/// network, at most `max_egress_rules`, each valid (`check_egress_rule`, hosts made
/// canonical), names unique, each host sharing a name with `egress`. Returns the first
/// problem as "egress_rules[i].<field>: …" / "egress_rules: …", or nullopt.
std::optional<std::string> check_egress_rules(std::vector<egress_rule>& rules,
                                              const std::vector<std::string>& egress,
                                              bool network) {
  if (rules.empty()) return std::nullopt;
  if (!network) return "egress_rules: only a ticket granting code.network may have L7 rules";
  if (rules.size() > max_egress_rules) {
    return "egress_rules: " + std::to_string(rules.size()) + " rules, more than the limit of " +
           std::to_string(max_egress_rules);
  }
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const std::string path = "egress_rules[" + std::to_string(i) + "]";
    if (auto problem = check_egress_rule(rules[i])) return path + "." + *problem;
    for (std::size_t j = 0; j < i; ++j) {
      if (rules[j].name == rules[i].name) {
        return path + ".name: duplicate " + quote_for_message(rules[i].name);
      }
    }
    if (std::none_of(egress.begin(), egress.end(), [&](const std::string& e) {
          return egress_intersection(rules[i].host, e).has_value();
        })) {
      return path + ".host: " + quote_for_message(rules[i].host) +
             " names no host the ticket's egress allows";
    }
  }
  return std::nullopt;
}

/// Why a ticket with `rules` and `egress` does not narrow the L7 rules `parent` (see
/// `check_derivation`, rule 5), as "egress_rules…: …", or nullopt.
std::optional<std::string> rules_narrowing_problem(const std::vector<egress_rule>& rules,
                                                   const std::vector<std::string>& egress,
                                                   const std::vector<egress_rule>& parent) {
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const auto& r = rules[i];
    const bool ruled = std::any_of(parent.begin(), parent.end(), [&](const egress_rule& p) {
      return egress_intersection(r.host, p.host).has_value();
    });
    if (!ruled) continue;  // a host the parent left unruled: the rule only restricts
    if (std::none_of(parent.begin(), parent.end(),
                     [&](const egress_rule& p) { return egress_rule_within(r, p); })) {
      return "egress_rules[" + std::to_string(i) + "]: " + quote_for_message(r.name) +
             " is not within a rule of the parent (host, methods, paths and budgets)";
    }
  }
  std::vector<std::string> hosts;
  for (const auto& r : rules) hosts.push_back(r.host);
  for (const auto& p : parent) {
    for (const auto& e : egress) {
      const auto shared = egress_intersection(p.host, e);
      if (shared && !egress_subset(std::span(&*shared, 1), hosts)) {
        return "egress_rules: " + quote_for_message(*shared) + " loses the parent's rule " +
               quote_for_message(p.name);
      }
    }
  }
  return std::nullopt;
}

/// The first problem with `spec` for a ticket that does (`network`) or does not grant
/// `code.network`, as "<field>: <reason>" in the JSON form's field names. Normalizes `spec`
/// (canonical egress, expiry rounded down to the second).
std::optional<std::string> check_spec(ticket_spec& spec, bool network) {
  if (!detail::is_valid_ticket_id(spec.id)) {
    return "id: must be 1 to 128 printable ASCII characters";
  }
  if (!is_valid_tenant(spec.tenant)) {
    return "tenant: must be 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or "
           "digit";
  }
  if (spec.max_timeout.count() <= 0) return "max_timeout_ms: must be greater than 0";
  if (spec.max_memory_bytes == 0) return "max_memory_bytes: must be greater than 0";
  if (spec.runtime_digest && !is_valid_blob_id(*spec.runtime_digest)) {
    return "runtime_digest: expected 'sha256:' and 64 lowercase hex digits";
  }
  if (network) {
    if (spec.egress.empty()) return "egress: required (non-empty) with code.network";
    if (auto problem = canonicalize_egress(spec.egress)) return problem;
  } else if (!spec.egress.empty()) {
    return "egress: only a ticket granting code.network may list domains";
  }
  if (auto problem = canonicalize_tools(spec.tools)) return problem;
  if (auto problem = canonicalize_secrets(spec.secrets)) return problem;
  if (auto problem = check_egress_rules(spec.egress_rules, spec.egress, network)) return problem;
  if (!spec.profile.empty() && !is_valid_registry_name(spec.profile)) {
    return "profile: must be 1 to 64 characters of [a-z0-9._-], starting with a letter or digit";
  }
  if (spec.expires_at) {
    const auto s = chrono::floor<chrono::seconds>(*spec.expires_at);
    if (s < min_expiry || s > max_expiry) {
      return "expires_at: must be between 1970-01-01T00:00:00Z and 2199-12-31T23:59:59Z";
    }
    spec.expires_at = time_point(s);
  }
  return std::nullopt;
}

std::optional<action> action_from_string(std::string_view s) {
  for (auto a : {action::code_execute, action::code_network, action::tool_run}) {
    if (to_string(a) == s) return a;
  }
  return std::nullopt;
}

/// Prefixes a "<field>: <reason>" problem with the path of the object it is in.
std::string at_path(const std::string& path, const std::string& problem) {
  return path.empty() ? problem : path + "." + problem;
}

/// The `"v"` member of a nested document at `path`: absent or the integer 1.
void check_nested_version(const json& o, const std::string& path) {
  if (path.empty()) {
    detail::check_version(o);
    return;
  }
  const json* v = detail::find_member(o, "v");
  if (v == nullptr) return;
  if (v->type() == json::value_t::number_unsigned && v->get<std::uint64_t>() == protocol_version) {
    return;
  }
  detail::fail(detail::member_path(path, "v"),
               "unsupported protocol version (expected the integer 1)");
}

/// `t + d`, or the largest time point when that does not fit (a caller's `now` may be anything).
time_point saturating_add(time_point t, chrono::seconds d) {
  return t > time_point::max() - d ? time_point::max() : t + d;
}

/// 16 random lowercase hex digits (OpenSSL's CSPRNG; ids must be unique, not secret).
std::string random_hex16() {
  std::array<unsigned char, 8> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    // No entropy source: a time-based id is still unique enough for a ticket id.
    auto x = static_cast<std::uint64_t>(chrono::steady_clock::now().time_since_epoch().count());
    for (auto& b : bytes) {
      b = static_cast<unsigned char>(x & 0xff);
      x >>= 8;
    }
  }
  std::string out;
  constexpr std::string_view hex = "0123456789abcdef";
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace

// --- RFC 3339 ---------------------------------------------------------------------------

std::string format_rfc3339(time_point t) {
  const auto secs = chrono::floor<chrono::seconds>(t);
  const auto days = chrono::floor<chrono::days>(secs);
  const chrono::year_month_day ymd{days};
  const chrono::hh_mm_ss hms{secs - days};
  std::array<char, 40> buf{};
  std::snprintf(buf.data(), buf.size(), "%04d-%02u-%02uT%02d:%02d:%02dZ",
                static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()), static_cast<int>(hms.hours().count()),
                static_cast<int>(hms.minutes().count()), static_cast<int>(hms.seconds().count()));
  return buf.data();
}

std::optional<time_point> parse_rfc3339(std::string_view s) {
  // YYYY-MM-DDTHH:MM:SSZ
  if (s.size() != 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' ||
      s[16] != ':' || s[19] != 'Z') {
    return std::nullopt;
  }
  auto number = [&](std::size_t at, std::size_t len) -> std::optional<int> {
    int v = 0;
    for (std::size_t i = at; i < at + len; ++i) {
      if (s[i] < '0' || s[i] > '9') return std::nullopt;
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  const auto year = number(0, 4), month = number(5, 2), day = number(8, 2);
  const auto hour = number(11, 2), minute = number(14, 2), second = number(17, 2);
  if (!year || !month || !day || !hour || !minute || !second) return std::nullopt;
  if (*year < 1970 || *year > max_expiry_year || *hour > 23 || *minute > 59 || *second > 59) {
    return std::nullopt;
  }
  const chrono::year_month_day ymd{chrono::year{*year},
                                   chrono::month{static_cast<unsigned>(*month)},
                                   chrono::day{static_cast<unsigned>(*day)}};
  if (!ymd.ok()) return std::nullopt;
  return time_point(chrono::sys_days{ymd} + chrono::hours(*hour) + chrono::minutes(*minute) +
                    chrono::seconds(*second));
}

// --- approval requests ------------------------------------------------------------------

namespace detail {

std::optional<std::string> approval_problem(const approval_request& a) {
  if (!is_valid_ticket_id(a.ticket_id)) {
    return "ticket_id: must be 1 to 128 printable ASCII characters";
  }
  if (!is_valid_tenant(a.tenant)) {
    return "tenant: must be 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or "
           "digit";
  }
  if (a.domains.empty()) return "domains: must not be empty";
  if (a.domains.size() > max_egress_patterns) {
    return "domains: more than " + std::to_string(max_egress_patterns) + " patterns";
  }
  for (std::size_t i = 0; i < a.domains.size(); ++i) {
    const std::string path = "domains[" + std::to_string(i) + "]";
    const auto c = canonical_egress_pattern(a.domains[i]);
    if (!c || *c != a.domains[i]) {
      return path + ": not a canonical egress pattern: " + quote_for_message(a.domains[i]);
    }
    if (std::find(a.domains.begin(), a.domains.begin() + static_cast<std::ptrdiff_t>(i),
                  a.domains[i]) != a.domains.begin() + static_cast<std::ptrdiff_t>(i)) {
      return path + ": duplicate " + quote_for_message(a.domains[i]);
    }
  }
  if (a.timeout.count() <= 0) return "timeout_ms: must be greater than 0";
  if (a.memory_limit_bytes == 0) return "memory_limit_bytes: must be greater than 0";
  if (a.secrets.size() > max_secrets) {
    return "secrets: more than " + std::to_string(max_secrets) + " secrets";
  }
  for (std::size_t i = 0; i < a.secrets.size(); ++i) {
    const std::string path = "secrets[" + std::to_string(i) + "]";
    const auto& sec = a.secrets[i];
    if (!is_valid_secret_name(sec.name)) {
      return path + ".name: not a secret name: " + quote_for_message(sec.name);
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (a.secrets[j].name == sec.name) return path + ".name: duplicate";
    }
    if (sec.domains.empty() || sec.domains.size() > max_egress_patterns) {
      return path + ".domains: 1 to " + std::to_string(max_egress_patterns) + " patterns";
    }
    for (std::size_t j = 0; j < sec.domains.size(); ++j) {
      const auto c = canonical_egress_pattern(sec.domains[j]);
      if (!c || *c != sec.domains[j]) {
        return path + ".domains[" + std::to_string(j) +
               "]: not a canonical egress pattern: " + quote_for_message(sec.domains[j]);
      }
    }
    if (sec.header.empty() || sec.header.size() > 256 ||
        std::any_of(sec.header.begin(), sec.header.end(),
                    [](char c) { return c <= 0x20 || c > 0x7e || c == ':'; })) {
      return path + ".header: must be an HTTP field name";
    }
  }
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < a.files_in.size(); ++i) {
    const std::string path = "files_in[" + std::to_string(i) + "]";
    const auto& f = a.files_in[i];
    if (auto why = check_file_name(f.name); !why.empty()) return path + ".name: " + why;
    if (!names.insert(f.name).second) return path + ".name: duplicate";
    if (!is_hex_sha256(f.sha256)) return path + ".sha256: expected 64 lowercase hex digits";
  }
  if (!is_hex_sha256(a.source_sha256)) return "source_sha256: expected 64 lowercase hex digits";
  if (!is_at_least(a.isolation, isolation::container)) {
    return "isolation: must be at least 'container' (network never runs weaker)";
  }
  if (a.runtime.name.empty() || a.runtime.name.size() > 128) {
    return "runtime.name: must be 1 to 128 bytes";
  }
  if (!is_valid_blob_id(a.runtime.digest)) {
    return "runtime.digest: expected 'sha256:' and 64 lowercase hex digits";
  }
  return std::nullopt;
}

ordered_json approval_to_json(const approval_request& a) {
  ordered_json j;
  j["ticket_id"] = a.ticket_id;
  j["tenant"] = a.tenant;
  j["domains"] = a.domains;
  j["timeout_ms"] = static_cast<std::int64_t>(a.timeout.count());
  j["memory_limit_bytes"] = a.memory_limit_bytes;
  j["files_in"] = ordered_json::array();
  for (const auto& f : a.files_in) {
    ordered_json e;
    e["name"] = f.name;
    e["sha256"] = f.sha256;
    e["bytes"] = f.bytes;
    j["files_in"].push_back(std::move(e));
  }
  j["source_sha256"] = a.source_sha256;
  j["source_bytes"] = a.source_bytes;
  if (!a.env.empty()) {
    j["env"] = ordered_json::object();
    for (const auto& [k, v] : a.env) j["env"][k] = v;
  }
  if (!a.secrets.empty()) {
    j["secrets"] = ordered_json::array();
    for (const auto& sec : a.secrets) {
      ordered_json e;
      e["name"] = sec.name;
      e["domains"] = sec.domains;
      e["header"] = sec.header;
      j["secrets"].push_back(std::move(e));
    }
  }
  j["isolation"] = std::string(to_string(a.isolation));
  j["runtime"] = {{"name", a.runtime.name}, {"digest", a.runtime.digest}};
  return j;
}

approval_request approval_from_json(const json& v, const std::string& path) {
  using detail::as_string;
  using detail::member_path;
  using detail::require_member;
  const json& o = as_object(v, path);
  check_known_fields(
      o, path,
      {"ticket_id", "tenant", "domains", "timeout_ms", "memory_limit_bytes", "files_in",
       "source_sha256", "source_bytes", "env", "secrets", "isolation", "runtime"});
  auto field = [&](std::string_view key) { return member_path(path, key); };
  approval_request a;
  a.ticket_id = as_string(require_member(o, path, "ticket_id"), field("ticket_id"));
  a.tenant = as_string(require_member(o, path, "tenant"), field("tenant"));
  {
    const std::string p = field("domains");
    const json& d = as_array(require_member(o, path, "domains"), p);
    if (d.size() > max_egress_patterns) {
      fail(p, "more than " + std::to_string(max_egress_patterns) + " patterns");
    }
    for (std::size_t i = 0; i < d.size(); ++i)
      a.domains.push_back(as_string(d[i], index_path(p, i)));
  }
  a.timeout = chrono::milliseconds(as_signed(
      require_member(o, path, "timeout_ms"), field("timeout_ms"),
      std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
  a.memory_limit_bytes =
      as_unsigned(require_member(o, path, "memory_limit_bytes"), field("memory_limit_bytes"));
  {
    const std::string p = field("files_in");
    const json& files = as_array(require_member(o, path, "files_in"), p);
    if (files.size() > 1024) fail(p, "more than 1024 entries");
    for (std::size_t i = 0; i < files.size(); ++i) {
      const std::string fp = index_path(p, i);
      const json& f = as_object(files[i], fp);
      check_known_fields(f, fp, {"name", "sha256", "bytes"});
      approval_file af;
      af.name = as_string(require_member(f, fp, "name"), member_path(fp, "name"));
      af.sha256 = as_string(require_member(f, fp, "sha256"), member_path(fp, "sha256"));
      af.bytes = as_unsigned(require_member(f, fp, "bytes"), member_path(fp, "bytes"));
      a.files_in.push_back(std::move(af));
    }
  }
  a.source_sha256 = as_string(require_member(o, path, "source_sha256"), field("source_sha256"));
  a.source_bytes = as_unsigned(require_member(o, path, "source_bytes"), field("source_bytes"));
  if (const json* e = detail::find_member(o, "env")) {
    const std::string p = field("env");
    const json& env = as_object(*e, p);
    if (env.size() > 256) fail(p, "more than 256 variables");
    for (const auto& [name, value] : env.items()) {
      a.env.emplace(name, as_string(value, p + "[" + quote_for_message(name) + "]"));
    }
  }
  if (const json* secrets = detail::find_member(o, "secrets")) {
    const std::string p = field("secrets");
    const json& list = as_array(*secrets, p);
    if (list.size() > max_secrets) fail(p, "more than " + std::to_string(max_secrets) + " secrets");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string sp = index_path(p, i);
      const json& e = as_object(list[i], sp);
      check_known_fields(e, sp, {"name", "domains", "header"});
      approval_secret sec;
      sec.name = as_string(require_member(e, sp, "name"), member_path(sp, "name"));
      const std::string dp = member_path(sp, "domains");
      const json& d = as_array(require_member(e, sp, "domains"), dp);
      if (d.size() > max_egress_patterns) {
        fail(dp, "more than " + std::to_string(max_egress_patterns) + " patterns");
      }
      for (std::size_t j = 0; j < d.size(); ++j)
        sec.domains.push_back(as_string(d[j], index_path(dp, j)));
      sec.header = as_string(require_member(e, sp, "header"), member_path(sp, "header"));
      a.secrets.push_back(std::move(sec));
    }
  }
  {
    const std::string p = field("isolation");
    const std::string name = as_string(require_member(o, path, "isolation"), p);
    const auto level = isolation_from_string(name);
    if (!level) fail(p, "unknown isolation level " + quote_for_message(name));
    a.isolation = *level;
  }
  {
    const std::string p = field("runtime");
    const json& rt = as_object(require_member(o, path, "runtime"), p);
    check_known_fields(rt, p, {"name", "digest"});
    a.runtime.name = as_string(require_member(rt, p, "name"), member_path(p, "name"));
    a.runtime.digest = as_string(require_member(rt, p, "digest"), member_path(p, "digest"));
  }
  if (auto problem = approval_problem(a)) throw decode_error(at_path(path, *problem));
  return a;
}

std::optional<std::string> approval_mismatch(const run_request& request,
                                             const approval_request& approval) {
  if (request.runtime != approval.runtime.name) {
    return "runtime: the ticket's approval is for runtime " +
           quote_for_message(approval.runtime.name);
  }
  if (request.source.size() != approval.source_bytes ||
      sha256_hex(request.source) != approval.source_sha256) {
    return "source: not the source the ticket's approval is for";
  }
  if (request.files_in.size() != approval.files_in.size()) {
    return "files_in: not the inputs the ticket's approval is for";
  }
  if (request.env != approval.env) {
    return "env: not the environment the ticket's approval is for";
  }
  for (const auto& name : request.secrets) {
    if (std::none_of(approval.secrets.begin(), approval.secrets.end(),
                     [&](const approval_secret& s) { return s.name == name; })) {
      return "secrets: " + quote_for_message(name) + " is not among the approved secrets";
    }
  }
  for (std::size_t i = 0; i < request.files_in.size(); ++i) {
    const auto& f = request.files_in[i];
    const auto& a = approval.files_in[i];
    if (f.name != a.name || f.blob.size() != 7 + 64 || f.blob.compare(7, 64, a.sha256) != 0) {
      return "files_in[" + std::to_string(i) + "]: not the input the ticket's approval is for";
    }
  }
  return std::nullopt;
}

// --- tickets as JSON --------------------------------------------------------------------

ordered_json ticket_to_json(const ticket& t) {
  ordered_json j;
  j["v"] = protocol_version;
  j["id"] = t.id();
  j["tenant"] = t.tenant();
  j["actions"] = ordered_json::array();
  for (auto a : {action::code_execute, action::code_network, action::tool_run}) {
    if (t.allows(a)) j["actions"].push_back(std::string(to_string(a)));
  }
  j["isolation"] = std::string(to_string(t.isolation()));
  j["max_timeout_ms"] = static_cast<std::int64_t>(t.max_timeout().count());
  j["max_memory_bytes"] = t.max_memory_bytes();
  if (t.runtime_digest()) j["runtime_digest"] = *t.runtime_digest();
  if (!t.egress().empty()) j["egress"] = t.egress();
  if (t.expires_at()) j["expires_at"] = format_rfc3339(*t.expires_at());
  if (!t.ancestors().empty()) j["derived_from"] = t.ancestors();
  if (t.approval()) j["approval"] = approval_to_json(*t.approval());
  if (!t.tools().empty()) j["tools"] = t.tools();
  if (!t.profile().empty()) j["profile"] = t.profile();
  if (!t.secrets().empty()) j["secrets"] = t.secrets();
  if (!t.egress_rules().empty()) {
    j["egress_rules"] = ordered_json::array();
    for (const auto& r : t.egress_rules()) {
      ordered_json e;
      e["name"] = r.name;
      e["host"] = r.host;
      e["methods"] = r.methods;
      e["paths"] = r.paths;
      if (r.max_requests) e["max_requests"] = *r.max_requests;
      if (r.max_bytes) e["max_bytes"] = *r.max_bytes;
      j["egress_rules"].push_back(std::move(e));
    }
  }
  return j;
}

ticket ticket_from_json(const json& doc, const std::string& path) {
  const json& o = as_object(doc, path);
  check_nested_version(o, path);
  check_known_fields(o, path,
                     {"v", "id", "tenant", "actions", "isolation", "max_timeout_ms",
                      "max_memory_bytes", "runtime_digest", "egress", "expires_at", "derived_from",
                      "approval", "tools", "profile", "secrets", "egress_rules"});
  auto field = [&](std::string_view key) { return member_path(path, key); };
  ticket_spec spec;
  spec.id = as_string(require_member(o, path, "id"), field("id"));
  spec.tenant = as_string(require_member(o, path, "tenant"), field("tenant"));
  const std::string actions_path = field("actions");
  const json& actions = as_array(require_member(o, path, "actions"), actions_path);
  bool execute = false;
  bool network = false;
  bool tool_run = false;
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const std::string p = index_path(actions_path, i);
    const std::string name = as_string(actions[i], p);
    const auto a = action_from_string(name);
    if (!a) fail(p, "unknown action " + quote_for_message(name));
    bool& granted = *a == action::code_execute   ? execute
                    : *a == action::code_network ? network
                                                 : tool_run;
    if (granted) fail(p, "duplicate action " + quote_for_message(name));
    granted = true;
  }
  spec.execute = execute;
  {
    const std::string p = field("isolation");
    const std::string name = as_string(require_member(o, path, "isolation"), p);
    const auto level = isolation_from_string(name);
    if (!level) fail(p, "unknown isolation level " + quote_for_message(name));
    spec.isolation = *level;
  }
  spec.max_timeout = chrono::milliseconds(as_signed(
      require_member(o, path, "max_timeout_ms"), field("max_timeout_ms"),
      std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
  spec.max_memory_bytes =
      as_unsigned(require_member(o, path, "max_memory_bytes"), field("max_memory_bytes"));
  // Optional members; null is not absence (a wrong type, like everywhere else).
  if (const json* digest = find_member(o, "runtime_digest")) {
    spec.runtime_digest = as_string(*digest, field("runtime_digest"));
  }
  if (const json* egress = find_member(o, "egress")) {
    const std::string p = field("egress");
    const json& a = as_array(*egress, p);
    // Bounded before canonicalizing: duplicates may shrink the list, never grow it.
    if (a.size() > 4 * max_egress_patterns) {
      fail(p, std::to_string(a.size()) + " patterns, more than the limit of " +
                  std::to_string(max_egress_patterns));
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      spec.egress.push_back(as_string(a[i], index_path(p, i)));
  }
  if (const json* expires = find_member(o, "expires_at")) {
    const std::string p = field("expires_at");
    const std::string text = as_string(*expires, p);
    const auto t = parse_rfc3339(text);
    if (!t) {
      fail(p, "expected RFC 3339 UTC time 'YYYY-MM-DDTHH:MM:SSZ', got " + quote_for_message(text));
    }
    spec.expires_at = *t;
  }
  std::vector<std::string> ancestors;
  if (const json* from = find_member(o, "derived_from")) {
    const std::string p = field("derived_from");
    const json& a = as_array(*from, p);
    if (a.empty()) fail(p, "must not be empty (leave it out for a ticket that is not derived)");
    if (a.size() > max_ticket_ancestors) {
      fail(p, "more than " + std::to_string(max_ticket_ancestors) + " ancestors");
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string ip = index_path(p, i);
      std::string id = as_string(a[i], ip);
      if (!is_valid_ticket_id(id)) fail(ip, "must be 1 to 128 printable ASCII characters");
      ancestors.push_back(std::move(id));
    }
  }
  std::optional<approval_request> approval;
  if (const json* ap = find_member(o, "approval")) {
    approval = approval_from_json(*ap, field("approval"));
  }
  if (const json* tools = find_member(o, "tools")) {
    const std::string p = field("tools");
    const json& a = as_array(*tools, p);
    // Bounded before canonicalizing (check_spec: at most 64 distinct names).
    if (a.size() > 256) fail(p, std::to_string(a.size()) + " names, more than the limit of 64");
    for (std::size_t i = 0; i < a.size(); ++i)
      spec.tools.push_back(as_string(a[i], index_path(p, i)));
    if (spec.tools.empty()) {
      fail(p, "must not be empty (leave it out for a ticket without tool.run)");
    }
    if (!tool_run) fail(p, "only a ticket granting tool.run may list tools");
  } else if (tool_run) {
    fail(field("actions"), "tool.run needs a non-empty 'tools' list");
  }
  if (const json* profile = find_member(o, "profile")) {
    spec.profile = as_string(*profile, field("profile"));
    if (spec.profile.empty()) fail(field("profile"), "must not be empty (leave it out)");
  }
  if (const json* secrets = find_member(o, "secrets")) {
    const std::string p = field("secrets");
    const json& a = as_array(*secrets, p);
    // Bounded before canonicalizing (check_spec: at most max_secrets distinct names).
    if (a.size() > 4 * max_secrets) {
      fail(p, std::to_string(a.size()) + " names, more than the limit of " +
                  std::to_string(max_secrets));
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      spec.secrets.push_back(as_string(a[i], index_path(p, i)));
    if (spec.secrets.empty()) fail(p, "must not be empty (leave it out)");
  }
  if (const json* rules = find_member(o, "egress_rules")) {
    const std::string p = field("egress_rules");
    const json& a = as_array(*rules, p);
    if (a.empty()) fail(p, "must not be empty (leave it out)");
    if (a.size() > max_egress_rules) {
      fail(p, std::to_string(a.size()) + " rules, more than the limit of " +
                  std::to_string(max_egress_rules));
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string rp = index_path(p, i);
      const json& e = as_object(a[i], rp);
      check_known_fields(e, rp, {"name", "host", "methods", "paths", "max_requests", "max_bytes"});
      egress_rule r;
      r.name = as_string(require_member(e, rp, "name"), member_path(rp, "name"));
      r.host = as_string(require_member(e, rp, "host"), member_path(rp, "host"));
      const auto strings = [&](std::string_view key, std::size_t limit,
                               std::vector<std::string>& out) {
        const std::string lp = member_path(rp, key);
        const json& list = as_array(require_member(e, rp, key), lp);
        if (list.size() > limit) {
          fail(lp, std::to_string(list.size()) + " entries, more than the limit of " +
                       std::to_string(limit));
        }
        for (std::size_t j = 0; j < list.size(); ++j)
          out.push_back(as_string(list[j], index_path(lp, j)));
      };
      strings("methods", egress_rule_methods.size(), r.methods);
      strings("paths", max_egress_rule_paths, r.paths);
      if (const json* n = find_member(e, "max_requests")) {
        r.max_requests = as_unsigned(*n, member_path(rp, "max_requests"));
      }
      if (const json* n = find_member(e, "max_bytes")) {
        r.max_bytes = as_unsigned(*n, member_path(rp, "max_bytes"));
      }
      spec.egress_rules.push_back(std::move(r));
    }
  }
  if (auto problem = check_spec(spec, network)) throw decode_error(at_path(path, *problem));
  if (approval) {
    // An approval belongs to a derived ticket and names its parent and tenant.
    if (ancestors.empty()) fail(field("approval"), "only a derived ticket carries an approval");
    if (approval->ticket_id != ancestors.back()) {
      fail(member_path(field("approval"), "ticket_id"), "is not the parent (derived_from's last)");
    }
    if (approval->tenant != spec.tenant) {
      fail(member_path(field("approval"), "tenant"), "is not the ticket's tenant");
    }
  }
  return ticket_access::make(std::move(spec), network, std::move(ancestors), std::move(approval));
}

}  // namespace detail

// --- issuing ----------------------------------------------------------------------------

result<ticket> ticket_issuer::issue(const ticket_spec& spec) const {
  ticket_spec s = spec;
  if (check_spec(s, false)) return make_error_code(errc::invalid_argument);
  return detail::ticket_access::make(std::move(s), false, {}, std::nullopt);
}

result<ticket> ticket_issuer::issue(const ticket_spec& spec, network_grant) const {
  ticket_spec s = spec;
  if (check_spec(s, true)) return make_error_code(errc::invalid_argument);
  return detail::ticket_access::make(std::move(s), true, {}, std::nullopt);
}

result<ticket> ticket_issuer::derive(const ticket& parent, const approval_request& approval,
                                     derive_options options) const {
  const auto bad = make_error_code(errc::invalid_argument);
  const time_point now = options.now == time_point{} ? chrono::system_clock::now() : options.now;
  if (detail::approval_problem(approval)) return bad;
  if (approval.ticket_id != parent.id() || approval.tenant != parent.tenant()) return bad;
  if (!parent.allows(action::code_execute) || parent.is_expired(now)) return bad;
  if (parent.ancestors().size() >= max_ticket_ancestors) return bad;
  if (options.ttl < chrono::seconds(1) || options.ttl > max_derived_ttl) return bad;
  std::vector<std::string> domains = options.domains.value_or(approval.domains);
  if (domains.empty() || canonicalize_egress(domains) ||
      !egress_subset(domains, approval.domains)) {
    return bad;
  }
  ticket_spec spec;
  spec.id = options.id.empty() ? "d-" + random_hex16() : options.id;
  spec.tenant = parent.tenant();
  spec.execute = true;
  spec.isolation = is_at_least(parent.isolation(), isolation::container) ? parent.isolation()
                                                                         : isolation::container;
  spec.max_timeout = std::min(parent.max_timeout(), approval.timeout);
  spec.max_memory_bytes = std::min(parent.max_memory_bytes(), approval.memory_limit_bytes);
  spec.runtime_digest = approval.runtime.digest;
  if (parent.runtime_digest() && *parent.runtime_digest() != approval.runtime.digest) return bad;
  // The approved run runs under the parent's limits: same workload profile; no tools (the
  // approval is for one code run).
  spec.profile = parent.profile();
  spec.egress = std::move(domains);
  // Secrets: the approved ones (default all the approval shows), each granted by the parent.
  for (const auto& sec : approval.secrets) {
    if (!parent.allows_secret(sec.name)) return bad;
  }
  if (options.secrets) {
    for (const auto& name : *options.secrets) {
      if (std::none_of(approval.secrets.begin(), approval.secrets.end(),
                       [&](const approval_secret& s) { return s.name == name; })) {
        return bad;
      }
    }
    spec.secrets = *options.secrets;
  } else {
    for (const auto& sec : approval.secrets) spec.secrets.push_back(sec.name);
  }
  // L7 rules: the given ones, or the parent's that apply to the approved domains; never
  // broader than the parent's.
  if (options.egress_rules) {
    spec.egress_rules = *options.egress_rules;
  } else {
    for (const auto& r : parent.egress_rules()) {
      if (std::any_of(spec.egress.begin(), spec.egress.end(), [&](const std::string& e) {
            return egress_intersection(r.host, e).has_value();
          })) {
        spec.egress_rules.push_back(r);
      }
    }
  }
  time_point expiry = chrono::floor<chrono::seconds>(saturating_add(now, options.ttl));
  if (parent.expires_at() && *parent.expires_at() < expiry) expiry = *parent.expires_at();
  spec.expires_at = expiry;
  if (check_spec(spec, true)) return bad;
  if (rules_narrowing_problem(spec.egress_rules, spec.egress, parent.egress_rules())) return bad;
  std::vector<std::string> ancestors = parent.ancestors();
  ancestors.push_back(parent.id());
  return detail::ticket_access::make(std::move(spec), true, std::move(ancestors), approval);
}

boost::system::result<ticket, rejection> ticket_issuer::decode(std::string_view json_text) const {
  try {
    json doc;
    if (auto error = detail::parse_strict(json_text, decode_options{}, doc)) {
      return rejection{code::invalid_request, std::move(*error)};
    }
    return detail::ticket_from_json(doc, "");
  } catch (const detail::decode_error& e) {
    return rejection{code::invalid_request, e.what()};
  } catch (const std::exception&) {
    return rejection{code::invalid_request, "malformed ticket"};
  }
}

std::string encode(const ticket& t) { return detail::dump_compact(detail::ticket_to_json(t)); }

// --- derivation rules -------------------------------------------------------------------

std::optional<std::string> check_derivation(const ticket& parent, const ticket& child,
                                            time_point now) {
  // 1. The chain.
  std::vector<std::string> expected = parent.ancestors();
  expected.push_back(parent.id());
  if (child.ancestors() != expected) {
    return "derived_from: the ticket is not derived from " + quote_for_message(parent.id());
  }
  if (child.ancestors().size() > max_ticket_ancestors) {
    return "derived_from: more than " + std::to_string(max_ticket_ancestors) + " ancestors";
  }
  // 2. Never broader than the parent.
  if (child.tenant() != parent.tenant()) return "tenant: differs from the parent's";
  if (child.allows(action::code_execute) && !parent.allows(action::code_execute)) {
    return "actions: grants code.execute, which the parent does not";
  }
  if (!is_at_least(child.isolation(), parent.isolation())) {
    return "isolation: weaker than the parent's";
  }
  if (child.max_timeout() > parent.max_timeout()) {
    return "max_timeout_ms: above the parent's";
  }
  if (child.max_memory_bytes() > parent.max_memory_bytes()) {
    return "max_memory_bytes: above the parent's";
  }
  if (parent.runtime_digest() && child.runtime_digest() != parent.runtime_digest()) {
    return "runtime_digest: does not keep the parent's pin";
  }
  // Profiles are named limit sets whose sizes only the host's policy knows: a derived
  // ticket keeps its parent's, so it can never switch to a larger one.
  if (child.profile() != parent.profile()) return "profile: differs from the parent's";
  for (const auto& t : child.tools()) {
    // ("*" is allowed by a parent only when the parent lists "*" itself.)
    if (!parent.allows_tool(t)) {
      return "tools: " + quote_for_message(t) + " is not granted by the parent";
    }
  }
  for (const auto& name : child.secrets()) {
    if (!parent.allows_secret(name)) {
      return "secrets: " + quote_for_message(name) + " is not granted by the parent";
    }
    if (const auto& a = child.approval();
        a && std::none_of(a->secrets.begin(), a->secrets.end(),
                          [&](const approval_secret& s) { return s.name == name; })) {
      return "secrets: " + quote_for_message(name) + " was not approved";
    }
  }
  // 3. Short-lived, and never outliving the parent.
  if (!child.expires_at()) return "expires_at: a derived ticket must expire";
  if (parent.expires_at() && *child.expires_at() > *parent.expires_at()) {
    return "expires_at: later than the parent's";
  }
  if (*child.expires_at() > saturating_add(now, max_derived_ttl)) {
    return "expires_at: more than " + std::to_string(max_derived_ttl.count()) + " s from now";
  }
  // 4. The network grant: inherited (narrowed) or approved.
  if (child.allows(action::code_network) && parent.allows(action::code_network) &&
      !egress_subset(child.egress(), parent.egress())) {
    for (const auto& p : child.egress()) {
      if (!egress_subset(std::span(&p, 1), parent.egress())) {
        return "egress: " + quote_for_message(p) + " is not allowed by the parent";
      }
    }
  }
  if (child.allows(action::code_network) && !parent.allows(action::code_network) &&
      !child.approval()) {
    return "actions: grants code.network without an approval";
  }
  if (const auto& a = child.approval()) {
    if (a->ticket_id != parent.id()) return "approval.ticket_id: is not the parent";
    if (a->tenant != child.tenant()) return "approval.tenant: is not the ticket's tenant";
    if (!child.allows(action::code_network) || child.egress().empty()) {
      return "egress: an approved ticket must grant code.network for its domains";
    }
    for (const auto& p : child.egress()) {
      if (!egress_subset(std::span(&p, 1), a->domains)) {
        return "egress: " + quote_for_message(p) + " was not approved";
      }
    }
    if (!is_at_least(child.isolation(), isolation::container)) {
      return "isolation: below 'container' for a network ticket";
    }
    if (!child.runtime_digest()) return "runtime_digest: an approved ticket must pin the image";
    if (*child.runtime_digest() != a->runtime.digest) {
      return "runtime_digest: not the image the approval is for";
    }
  }
  // 5. L7 rules: only narrowed.
  if (auto why =
          rules_narrowing_problem(child.egress_rules(), child.egress(), parent.egress_rules())) {
    return why;
  }
  return std::nullopt;
}

}  // namespace sandbox
