// Host-held secrets: credentials a network run may use without ever holding them.
//
// The host names each secret in its configuration (`runtime_options::secrets`, the `secrets`
// section of the configuration document): the root-only file its value is read from (never
// the value itself), the domains it may be sent to, and the HTTP header that carries it. A
// ticket grants secrets by name (`ticket_spec::secrets`), a request names the ones it wants
// (`run_request::secrets`). Inside the sandbox the program sees only a placeholder: the
// environment variable `secret_env_name(name)` holds a random token made for that run.
// docs/security.md, "Secrets", says what the egress proxy does with it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sandbox {

/// Most secrets one ticket grants, one request names, or one host defines.
inline constexpr std::size_t max_secrets = 16;
/// Longest secret value accepted from its file, in bytes.
inline constexpr std::size_t max_secret_value_bytes = 4096;
/// Shortest secret value accepted, in bytes: shorter values cannot be told apart from
/// ordinary bytes, so they could be neither found nor redacted reliably.
inline constexpr std::size_t min_secret_value_bytes = 8;

/**
 * One secret as the host configures it. Plain data; the value is never here.
 *
 *     secret_definition{.file = "/etc/agent-sandbox/secrets/rates-api",
 *                       .domains = {"api.freight-rates.example"},
 *                       .header = "Authorization: Bearer {value}"}
 */
struct secret_definition {
  /// Absolute path of the file holding the value (one line; a final newline is dropped). It
  /// must be a regular file (not a link), owned by root or by the host process's effective
  /// uid, and neither group- nor world-accessible (mode 0600 or 0400); read when the runtime
  /// is created.
  std::string file;
  /// Egress patterns (sandbox/egress.hpp, canonical form) of the names the value may be sent
  /// to: 1..`max_egress_patterns`.
  std::vector<std::string> domains;
  /// The header that carries it: `<Name>: <template>`, the template holding `{value}` exactly
  /// once (e.g. `Authorization: Bearer {value}`), printable ASCII, at most 256 bytes.
  std::string header;
  bool operator==(const secret_definition&) const = default;
};

/// True for a secret name: 1..64 characters of `[a-z0-9-]`, starting with a letter, not
/// ending with `-` (so that `secret_env_name` maps names one to one).
bool is_valid_secret_name(std::string_view name) noexcept;

/// The environment variable holding the placeholder of secret `name` in a run:
/// `SANDBOX_SECRET_` + the name in upper case, `-` as `_` (`rates-api` →
/// `SANDBOX_SECRET_RATES_API`). `name` must be valid (`is_valid_secret_name`).
std::string secret_env_name(std::string_view name);

/// The first problem with definition `d`, as "<field>: <reason>" in the configuration's
/// field names ("file", "domains[i]", "header"), or `std::nullopt`. Canonicalizes `d.domains`
/// (lower case, no trailing dot, duplicates dropped). Pure: the file is not opened here.
std::optional<std::string> check_secret_definition(secret_definition& d);

/// The header's name of a definition that passed `check_secret_definition`, e.g.
/// "Authorization".
std::string_view secret_header_name(const secret_definition& d) noexcept;

/// One secret as an approval request shows it (`approval_request::secrets`): which name is
/// attached and where it would go, never the value.
struct approval_secret {
  std::string name;                  ///< the secret's name (`is_valid_secret_name`)
  std::vector<std::string> domains;  ///< the host's domains for it (canonical patterns)
  std::string header;                ///< the header's name it would be sent in
  bool operator==(const approval_secret&) const = default;
};

}  // namespace sandbox
