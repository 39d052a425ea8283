// Admission (sandbox/admission.hpp): the pure decision whether a request may start.
//
// Checks run in the documented order, and within a step in field order, so a request gets
// the same code and message wherever it comes from (JSON or C++). Every message starts with
// the field path in the JSON form's names (`files_in[2].name: contains '/'`), and quotes
// caller bytes only escaped and shortened (detail::quote_for_message).
#include "sandbox/admission.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include "protocol/env_rules.hpp"
#include "protocol/json_strict.hpp"
#include "protocol/text_util.hpp"
#include "protocol/ticket_json.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/policy.hpp"

namespace sandbox {
namespace {

using detail::quote_for_message;

rejection invalid(std::string message) {
  return rejection{code::invalid_request, std::move(message)};
}

std::optional<rejection> check_files_in(const run_request& r, const policy& p) {
  if (r.files_in.size() > p.max_input_files) {
    return invalid("files_in: " + std::to_string(r.files_in.size()) +
                   " entries, more than the limit of " + std::to_string(p.max_input_files));
  }
  std::map<std::string_view, std::size_t> seen;
  for (std::size_t i = 0; i < r.files_in.size(); ++i) {
    const input_file& f = r.files_in[i];
    const std::string path = "files_in[" + std::to_string(i) + "]";
    if (auto why = check_file_name(f.name); !why.empty()) {
      return invalid(path + ".name: " + why);
    }
    if (auto [it, inserted] = seen.emplace(f.name, i); !inserted) {
      return invalid(path + ".name: duplicate of files_in[" + std::to_string(it->second) +
                     "].name");
    }
    if (!is_valid_blob_id(f.blob)) {
      return invalid(path +
                     ".blob: not a blob id (expected 'sha256:' and 64 lowercase hex digits)");
    }
  }
  return std::nullopt;
}

std::optional<rejection> check_env(const run_request& r, const policy& p) {
  if (r.env.size() > p.max_env_vars) {
    return invalid("env: " + std::to_string(r.env.size()) + " entries, more than the limit of " +
                   std::to_string(p.max_env_vars));
  }
  for (const auto& [name, value] : r.env) {
    if (auto why = detail::env_var_problem(name, value, p)) {
      return invalid("env[" + quote_for_message(name) + "]" + *why);
    }
  }
  return std::nullopt;
}

/// `network` and `egress` agree; every entry is a pattern; canonicalized into `out` (order
/// kept, duplicates dropped), at most `max_egress_patterns`.
std::optional<rejection> check_egress(const run_request& r, std::vector<std::string>& out) {
  if (!r.network) {
    if (!r.egress.empty()) return invalid("egress: only a request with network may list domains");
    return std::nullopt;
  }
  if (r.egress.empty()) return invalid("egress: a request with network must list its domains");
  for (std::size_t i = 0; i < r.egress.size(); ++i) {
    auto c = canonical_egress_pattern(r.egress[i]);
    if (!c) {
      return invalid(
          "egress[" + std::to_string(i) +
          "]: not a host name or '*.' wildcard pattern: " + quote_for_message(r.egress[i]));
    }
    if (std::find(out.begin(), out.end(), *c) == out.end()) out.push_back(std::move(*c));
  }
  if (out.size() > max_egress_patterns) {
    return invalid("egress: " + std::to_string(out.size()) +
                   " distinct patterns, more than the limit of " +
                   std::to_string(max_egress_patterns));
  }
  return std::nullopt;
}

/// Step 1 for the fields that tell a tool run from a code run: `tool` excludes `runtime`,
/// `source`, `network` and `egress`; `stdin`/`stdin_blob` only with `tool`, one of them,
/// within the policy's cap.
std::optional<rejection> check_tool_fields(const run_request& r, const policy& p) {
  if (r.tool.empty()) {
    if (r.std_in) return invalid("stdin: only a tool run reads standard input");
    if (r.stdin_blob) return invalid("stdin_blob: only a tool run reads standard input");
    return std::nullopt;
  }
  if (!is_valid_registry_name(r.tool)) {
    return invalid("tool: not a tool name (1 to 64 characters of [a-z0-9._-]): " +
                   quote_for_message(r.tool));
  }
  if (!r.runtime.empty()) return invalid("runtime: a request names either runtime or tool");
  if (!r.source.empty()) return invalid("source: a tool run takes no source (use stdin)");
  if (r.network) return invalid("network: a tool run's network is its registry entry's");
  // The program's environment is the host's registry entry's, never the model's.
  if (!r.env.empty()) return invalid("env: a tool run's environment is its registry entry's");
  if (r.std_in && r.stdin_blob) return invalid("stdin_blob: a request gives stdin or stdin_blob");
  if (r.std_in && r.std_in->size() > p.max_stdin_bytes) {
    return invalid("stdin: " + std::to_string(r.std_in->size()) + " bytes, over the limit of " +
                   std::to_string(p.max_stdin_bytes));
  }
  if (r.stdin_blob && !is_valid_blob_id(*r.stdin_blob)) {
    return invalid("stdin_blob: not a blob id (expected 'sha256:' and 64 lowercase hex digits)");
  }
  return std::nullopt;
}

/// Step 1 for `secrets`: only in a code run with `network`; names valid, no duplicates, at
/// most `max_secrets`.
std::optional<rejection> check_secrets(const run_request& r) {
  if (r.secrets.empty()) return std::nullopt;
  if (!r.tool.empty()) return invalid("secrets: a tool run takes no secrets");
  if (!r.network) return invalid("secrets: only a request with network may use secrets");
  if (r.secrets.size() > max_secrets) {
    return invalid("secrets: " + std::to_string(r.secrets.size()) +
                   " names, more than the limit of " + std::to_string(max_secrets));
  }
  for (std::size_t i = 0; i < r.secrets.size(); ++i) {
    const std::string path = "secrets[" + std::to_string(i) + "]";
    if (!is_valid_secret_name(r.secrets[i])) {
      return invalid(path + ": not a secret name ([a-z0-9-], starting with a letter): " +
                     quote_for_message(r.secrets[i]));
    }
    if (std::find(r.secrets.begin(), r.secrets.begin() + static_cast<std::ptrdiff_t>(i),
                  r.secrets[i]) != r.secrets.begin() + static_cast<std::ptrdiff_t>(i)) {
      return invalid(path + ": duplicate " + quote_for_message(r.secrets[i]));
    }
  }
  return std::nullopt;
}

/// Step 1: request syntax and ranges. `egress` receives the canonical egress list.
std::optional<rejection> check_request(const run_request& r, const policy& p,
                                       std::vector<std::string>& egress) {
  if (r.v != protocol_version) return invalid(detail::unsupported_version_message(r.v));
  if (auto rej = check_tool_fields(r, p)) return rej;
  if (r.runtime.empty() && r.tool.empty()) return invalid("runtime: must not be empty");
  if (r.timeout.count() <= 0) return invalid("timeout_ms: must be greater than 0");
  if (auto rej = check_egress(r, egress)) return rej;
  if (auto rej = check_secrets(r)) return rej;
  if (r.memory_limit_bytes < p.min_memory_bytes) {
    return invalid("memory_limit_bytes: below the minimum of " +
                   std::to_string(p.min_memory_bytes));
  }
  if (auto rej = check_files_in(r, p)) return rej;
  // files_out: every value is acceptable (0 = return nothing); above the policy it is clamped.
  if (auto rej = check_env(r, p)) return rej;
  if (r.runtime_digest && !is_valid_blob_id(*r.runtime_digest)) {
    return invalid("runtime_digest: expected 'sha256:' and 64 lowercase hex digits");
  }
  return std::nullopt;
}

/// `admit`, or (with `pending_approval`) the same checks for a network request whose
/// ticket lacks `code.network`, as if the approval had granted exactly its domains.
std::variant<admitted, rejection> admit_impl(const run_request& request, const ticket& ticket,
                                             const policy& policy, const host_catalog& catalog,
                                             std::chrono::system_clock::time_point now,
                                             bool pending_approval) {
  // 1. Syntax and ranges of the request itself.
  std::vector<std::string> egress;
  if (auto rej = check_request(request, policy, egress)) return *rej;

  // 2. Source size: rejected, never truncated.
  if (request.source.size() > policy.max_source_bytes) {
    return rejection{code::source_too_large, "source: " + std::to_string(request.source.size()) +
                                                 " bytes, over the limit of " +
                                                 std::to_string(policy.max_source_bytes)};
  }

  // 3. The ticket's grants: unexpired, code.execute, code.network for the request's domains
  //    (or, pending approval, none yet), and for a ticket derived from an approval, exactly
  //    the approved run.
  if (ticket.is_expired(now)) return rejection{code::action_denied, "ticket expired"};
  const bool is_tool = !request.tool.empty();
  if (is_tool) {
    if (!ticket.allows_tool(request.tool)) {
      return rejection{code::action_denied, "tool: ticket does not grant tool.run for " +
                                                quote_for_message(request.tool)};
    }
  } else if (!ticket.allows(action::code_execute)) {
    return rejection{code::action_denied, "ticket does not grant code.execute"};
  }
  if (request.network && !pending_approval) {
    if (!ticket.allows(action::code_network)) {
      return rejection{code::action_denied, "network: ticket does not grant code.network"};
    }
    for (const auto& p : egress) {
      if (!egress_subset(std::span(&p, 1), ticket.egress())) {
        return rejection{code::action_denied,
                         "egress: " + quote_for_message(p) + " is not allowed by the ticket"};
      }
    }
  }
  // Secrets: each granted by the ticket (pending approval too: an approval only narrows the
  // parent's), then defined on this host.
  for (const auto& name : request.secrets) {
    if (!ticket.allows_secret(name)) {
      return rejection{code::action_denied,
                       "secrets: the ticket does not grant the secret " + quote_for_message(name)};
    }
    if (!catalog.secrets.contains(name)) {
      return rejection{code::action_denied,
                       "secrets: no secret " + quote_for_message(name) + " on this host"};
    }
  }
  if (const auto& approval = ticket.approval()) {
    if (auto why = detail::approval_mismatch(request, *approval)) {
      return rejection{code::action_denied, *why};
    }
  }
  // A ticket whose ceilings leave less than the policy's minimum grants nothing usable.
  if (std::min(ticket.max_memory_bytes(), policy.max_memory_bytes) < policy.min_memory_bytes) {
    return rejection{code::action_denied, "ticket: max_memory_bytes is below the minimum of " +
                                              std::to_string(policy.min_memory_bytes)};
  }

  // 4. The runtime (or tool) must be configured here, and so must the run's profile.
  const host_catalog::tool* tool = nullptr;
  std::optional<std::string> installed;  // digest of the image that would run
  std::string name = request.runtime;    // what runtime_info names
  if (is_tool) {
    const auto t = catalog.tools.find(request.tool);
    if (t == catalog.tools.end()) {
      return invalid("tool: no registered tool named " + quote_for_message(request.tool));
    }
    tool = &t->second;
    installed = tool->digest;
    name = request.tool;
    if (tool->entry.input == tool_input::files_only && (request.std_in || request.stdin_blob)) {
      return invalid(std::string(request.std_in ? "stdin" : "stdin_blob") + ": tool " +
                     quote_for_message(name) + " reads only input files");
    }
  } else {
    const auto rt = catalog.runtimes.find(request.runtime);
    if (rt == catalog.runtimes.end()) {
      return invalid("runtime: unknown runtime " + quote_for_message(request.runtime));
    }
    installed = rt->second;
  }
  std::string profile = ticket.profile();
  if (tool != nullptr && !tool->entry.profile.empty()) profile = tool->entry.profile;
  const workload_profile* prof = nullptr;
  if (!profile.empty()) {
    const auto it = policy.profiles.find(profile);
    if (it == policy.profiles.end()) {
      return invalid(std::string(profile == ticket.profile() ? "ticket.profile" : "tool") +
                     ": workload profile " + quote_for_message(profile) +
                     " is not configured on this host");
    }
    prof = &it->second;
  }

  // 5. A backend at the ticket's level or stronger (network: container or stronger, the
  //    process level never gets the host's network; a tool: its entry's level or stronger),
  //    and the runtime's image.
  const isolation need = required_level(request, ticket, catalog);
  std::optional<isolation> level;
  for (isolation have : catalog.levels) {
    if (is_at_least(have, need) && (!level || !is_at_least(have, *level))) level = have;
  }
  if (!level) {
    return rejection{code::runtime_unavailable, no_backend_message(need)};
  }
  if (!installed) {
    return rejection{code::runtime_unavailable, std::string(is_tool ? "tool" : "runtime") +
                                                    ": the image of " + quote_for_message(name) +
                                                    " is not installed"};
  }
  if (tool != nullptr && !tool->unusable.empty()) {
    return rejection{code::runtime_unavailable,
                     "tool: " + quote_for_message(name) + ": " + tool->unusable};
  }
  if (tool != nullptr && tool->entry.image_digest && *tool->entry.image_digest != *installed) {
    return rejection{code::digest_mismatch, "tool: the installed image of " +
                                                quote_for_message(name) +
                                                " is not the one its registry entry pins"};
  }

  // 6. The pins. The ticket's comes first: it binds every run under the ticket, so when the
  //    host's image moved on, no request can make it run. Then the request's, against the
  //    ticket's (a caller cannot pin another image than the one its ticket was issued for),
  //    and, with no ticket pin, against the installed image. A runtime serves only its
  //    current image, so a pin selects nothing: it only refuses to run on anything else.
  //    Messages name the field and the runtime, never a digest or a host path.
  if (const auto& pin = ticket.runtime_digest(); pin && *pin != *installed) {
    return rejection{
        code::digest_mismatch,
        "ticket.runtime_digest: does not match the installed image of " + quote_for_message(name)};
  }
  if (request.runtime_digest && ticket.runtime_digest() &&
      *request.runtime_digest != *ticket.runtime_digest()) {
    return rejection{code::digest_mismatch, "runtime_digest: does not match ticket.runtime_digest"};
  }
  if (request.runtime_digest && *request.runtime_digest != *installed) {
    return rejection{
        code::digest_mismatch,
        "runtime_digest: does not match the installed image of " + quote_for_message(name)};
  }

  // Normalize: clamp to the lower of the ticket's and the policy's ceilings.
  admitted a{.request = request,
             .tenant = ticket.tenant(),
             .ticket_id = ticket.id(),
             .isolation = *level,
             .runtime = runtime_info{name, *installed},
             .profile = profile};
  a.request.v = protocol_version;
  a.request.egress = std::move(egress);
  if (tool != nullptr) {
    // The entry's variables are the host's: they win over a request's of the same name.
    for (const auto& [k, v] : tool->entry.env) a.request.env[k] = v;
    // Its egress (canonical: the runtime registered it so) is what the run's proxy allows.
    // A tool whose entry has its own egress is a network run (the host's decision, not the
    // ticket's: no code.network needed; `required_level` gave it the container floor).
    if (!tool->entry.egress.empty()) {
      a.request.network = true;
      a.request.egress = tool->entry.egress;
    }
  }
  // The ticket's L7 rules that apply to what the run reaches (the proxy enforces them).
  if (a.request.network) {
    for (const auto& rule : ticket.egress_rules()) {
      if (std::any_of(a.request.egress.begin(), a.request.egress.end(), [&](const std::string& e) {
            return egress_intersection(rule.host, e).has_value();
          })) {
        a.egress_rules.push_back(rule);
      }
    }
  }
  if (prof != nullptr) {
    // A profile's timeout and memory limit are the host's for runs under it: the default of a
    // request that left the protocol's (2000 ms, 256 MiB), and the most any request gets (a
    // request may ask less, never more: the model cannot lift a tool's limits).
    const run_request defaults;
    if (prof->timeout) {
      if (request.timeout == defaults.timeout) {
        a.request.timeout = *prof->timeout;
      } else if (a.request.timeout > *prof->timeout) {
        a.request.timeout = *prof->timeout;
        a.timeout_clamped = true;
      }
    }
    if (prof->memory_limit_bytes) {
      if (request.memory_limit_bytes == defaults.memory_limit_bytes) {
        a.request.memory_limit_bytes = *prof->memory_limit_bytes;
      } else if (a.request.memory_limit_bytes > *prof->memory_limit_bytes) {
        a.request.memory_limit_bytes = *prof->memory_limit_bytes;
        a.memory_clamped = true;
      }
    }
  }
  const auto max_timeout = std::min(ticket.max_timeout(), policy.max_timeout);
  if (a.request.timeout > max_timeout) {
    a.request.timeout = max_timeout;
    a.timeout_clamped = true;
  }
  const auto max_memory = std::min(ticket.max_memory_bytes(), policy.max_memory_bytes);
  if (a.request.memory_limit_bytes > max_memory) {
    a.request.memory_limit_bytes = max_memory;
    a.memory_clamped = true;
  }
  if (a.request.files_out.max_files > policy.max_output_files) {
    a.request.files_out.max_files = policy.max_output_files;
    a.files_out_clamped = true;
  }
  if (a.request.files_out.max_bytes > policy.max_output_bytes) {
    a.request.files_out.max_bytes = policy.max_output_bytes;
    a.files_out_clamped = true;
  }
  return a;
}

}  // namespace

std::string no_backend_message(isolation need) {
  return "isolation: no backend at level '" + std::string(to_string(need)) +
         "' or stronger on this host (a level serves runs once the host enables it in its "
         "configuration, \"backends\", and its self-test passes: sandboxctl doctor says "
         "which)";
}

isolation required_level(const run_request& request, const ticket& ticket,
                         const host_catalog& catalog) {
  isolation need = ticket.isolation();
  const host_catalog::tool* tool = nullptr;
  if (!request.tool.empty()) {
    const auto t = catalog.tools.find(request.tool);
    if (t != catalog.tools.end()) tool = &t->second;
  }
  if (tool != nullptr && !is_at_least(need, tool->entry.isolation)) need = tool->entry.isolation;
  // A tool whose entry has its own egress is a network run too (the host's decision, not
  // the ticket's: no code.network needed), so it gets the same floor.
  const bool tool_network = tool != nullptr && !tool->entry.egress.empty();
  if ((request.network || tool_network) && !is_at_least(need, isolation::container)) {
    need = isolation::container;
  }
  return need;
}

std::variant<admitted, rejection> admit(const run_request& request, const ticket& ticket,
                                        const policy& policy, const host_catalog& catalog,
                                        std::chrono::system_clock::time_point now) {
  return admit_impl(request, ticket, policy, catalog, now, false);
}

std::variant<admitted, rejection> admit(const run_request& request, const ticket& ticket,
                                        const policy& policy, const host_catalog& catalog) {
  return admit_impl(request, ticket, policy, catalog, std::chrono::system_clock::now(), false);
}

std::variant<admitted, rejection> admit_pending_approval(
    const run_request& request, const ticket& ticket, const policy& policy,
    const host_catalog& catalog, std::chrono::system_clock::time_point now) {
  if (!request.network || ticket.allows(action::code_network)) {
    return admit_impl(request, ticket, policy, catalog, now, false);
  }
  return admit_impl(request, ticket, policy, catalog, now, true);
}

run_result rejected_result(const rejection& r, std::string run_id) {
  run_result result;
  result.code = r.code;
  result.message = r.message;
  result.run_id = std::move(run_id);
  return result;
}

void note_admitted(run_result& r, const admitted& a) {
  r.isolation = a.isolation;
  r.runtime = a.runtime;
  r.timeout = a.request.timeout;
  r.memory_limit_bytes = a.request.memory_limit_bytes;
  r.timeout_clamped = a.timeout_clamped;
  r.memory_clamped = a.memory_clamped;
}

}  // namespace sandbox
