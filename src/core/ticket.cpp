// Ticket minting and the ticket's JSON form (sandbox/ticket.hpp).
#include "sandbox/ticket.hpp"

#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/json_strict.hpp"
#include "core/text_util.hpp"

namespace sandbox {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

bool is_valid_ticket_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (c < 0x20 || c > 0x7E) return false;  // printable ASCII only
  }
  return true;
}

/// The first problem with `spec`, as "<field>: <reason>" in the JSON form's field names.
std::optional<std::string> check_spec(const ticket_spec& spec) {
  if (!is_valid_ticket_id(spec.id)) return "id: must be 1 to 128 printable ASCII characters";
  if (!is_valid_tenant(spec.tenant)) {
    return "tenant: must be 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or "
           "digit";
  }
  if (spec.max_timeout.count() <= 0) return "max_timeout_ms: must be greater than 0";
  if (spec.max_memory_bytes == 0) return "max_memory_bytes: must be greater than 0";
  if (spec.runtime_digest && !is_valid_blob_id(*spec.runtime_digest)) {
    return "runtime_digest: expected 'sha256:' and 64 lowercase hex digits";
  }
  return std::nullopt;
}

std::optional<action> action_from_string(std::string_view s) {
  for (auto a : {action::code_execute, action::code_network}) {
    if (to_string(a) == s) return a;
  }
  return std::nullopt;
}

}  // namespace

result<ticket> ticket_issuer::issue(const ticket_spec& spec) const {
  if (check_spec(spec)) return make_error_code(errc::invalid_argument);
  return ticket(spec, false);
}

result<ticket> ticket_issuer::issue(const ticket_spec& spec, network_grant) const {
  if (check_spec(spec)) return make_error_code(errc::invalid_argument);
  return ticket(spec, true);
}

boost::system::result<ticket, rejection> ticket_issuer::decode(std::string_view json_text) const {
  try {
    json doc;
    if (auto error = detail::parse_strict(json_text, decode_options{}, doc)) {
      return rejection{code::invalid_request, std::move(*error)};
    }
    const json& o = detail::as_object(doc, "");
    detail::check_version(o);
    detail::check_known_fields(o, "",
                               {"v", "id", "tenant", "actions", "isolation", "max_timeout_ms",
                                "max_memory_bytes", "runtime_digest"});
    ticket_spec spec;
    spec.id = detail::as_string(detail::require_member(o, "", "id"), "id");
    spec.tenant = detail::as_string(detail::require_member(o, "", "tenant"), "tenant");
    const json& actions = detail::as_array(detail::require_member(o, "", "actions"), "actions");
    bool execute = false;
    bool network = false;
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const std::string path = detail::index_path("actions", i);
      const std::string name = detail::as_string(actions[i], path);
      const auto a = action_from_string(name);
      if (!a) detail::fail(path, "unknown action " + detail::quote_for_message(name));
      bool& granted = *a == action::code_execute ? execute : network;
      if (granted) detail::fail(path, "duplicate action " + detail::quote_for_message(name));
      granted = true;
    }
    spec.execute = execute;
    {
      const std::string name =
          detail::as_string(detail::require_member(o, "", "isolation"), "isolation");
      const auto level = isolation_from_string(name);
      if (!level) {
        detail::fail("isolation", "unknown isolation level " + detail::quote_for_message(name));
      }
      spec.isolation = *level;
    }
    spec.max_timeout = std::chrono::milliseconds(detail::as_signed(
        detail::require_member(o, "", "max_timeout_ms"), "max_timeout_ms",
        std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
    spec.max_memory_bytes =
        detail::as_unsigned(detail::require_member(o, "", "max_memory_bytes"), "max_memory_bytes");
    // Optional; null is not absence (a wrong type, like everywhere else).
    if (const json* digest = detail::find_member(o, "runtime_digest")) {
      spec.runtime_digest = detail::as_string(*digest, "runtime_digest");
    }
    if (auto problem = check_spec(spec)) return rejection{code::invalid_request, *problem};
    return ticket(std::move(spec), network);
  } catch (const detail::decode_error& e) {
    return rejection{code::invalid_request, e.what()};
  } catch (const std::exception&) {
    return rejection{code::invalid_request, "malformed ticket"};
  }
}

std::string encode(const ticket& t) {
  ordered_json j;
  j["v"] = protocol_version;
  j["id"] = t.id();
  j["tenant"] = t.tenant();
  j["actions"] = ordered_json::array();
  for (auto a : {action::code_execute, action::code_network}) {
    if (t.allows(a)) j["actions"].push_back(std::string(to_string(a)));
  }
  j["isolation"] = std::string(to_string(t.isolation()));
  j["max_timeout_ms"] = static_cast<std::int64_t>(t.max_timeout().count());
  j["max_memory_bytes"] = t.max_memory_bytes();
  if (t.runtime_digest()) j["runtime_digest"] = *t.runtime_digest();
  return detail::dump_compact(j);
}

}  // namespace sandbox
