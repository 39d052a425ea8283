// Private: the JSON form of tickets and approval requests as nlohmann values, shared by
// ticket.cpp (decode/encode), json_codec.cpp (run_result.approval) and signed_ticket.cpp
// (documents that embed a ticket). Not installed.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox::detail {

/// Builds tickets for decoders and the verifier (the constructor is private to `ticket`).
struct ticket_access {
  static ticket make(ticket_spec spec, bool network, std::vector<std::string> ancestors,
                     std::optional<approval_request> approval);
};

/// True for a ticket id: 1..128 printable ASCII characters.
bool is_valid_ticket_id(std::string_view id) noexcept;

/// True for 64 lowercase hex digits.
bool is_hex_sha256(std::string_view s) noexcept;

/// The first problem with `a`, as "<field>: <reason>" (JSON field names), or nullopt.
std::optional<std::string> approval_problem(const approval_request& a);

/// The approval request's JSON object (the documented member order).
nlohmann::ordered_json approval_to_json(const approval_request& a);

/// Decodes an approval request object at `path` ("approval", "ticket.approval", or "" at the
/// top level). Type faults and `approval_problem`s throw `decode_error` naming the field.
approval_request approval_from_json(const nlohmann::json& v, const std::string& path);

/// The ticket's JSON object (what `encode(const ticket&)` writes).
nlohmann::ordered_json ticket_to_json(const ticket& t);

/// Decodes a ticket object at `path` ("" at the top level, "ticket" inside a signed
/// document). Every fault throws `decode_error` naming the field.
ticket ticket_from_json(const nlohmann::json& v, const std::string& path);

/// Why `request` is not the run `approval` approved (runtime, source, inputs), as
/// "<field>: <reason>", or nullopt. Hashes the source (at most the policy's source cap).
std::optional<std::string> approval_mismatch(const run_request& request,
                                             const approval_request& approval);

}  // namespace sandbox::detail
