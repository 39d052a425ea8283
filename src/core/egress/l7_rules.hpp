// L7 egress rules at request time (private to src/): which requests of a network run its
// proxy lets through to a host that has rules (sandbox/egress.hpp, `egress_rule`), and the
// run's per-rule budgets.
//
// Pure: no I/O, bounded work, so it is unit-tested and fuzzed (tests/fuzz/egress_fuzz.cpp).
// The proxy (egress_proxy.hpp) holds one `l7_rules` per run and judges plain-HTTP requests
// with it; inside terminated TLS `terminated_http` does, for every request of a kept-alive
// tunnel.
//
// Paths are judged as the program sent them, never decoded: a target whose path could mean
// something else to the origin than its bytes say — a `.` or `..` segment (also with `;`
// parameters: `..;`), a percent-encoded `.`, `/`, `\`, `%`, NUL or control byte, an
// overlong-UTF-8 lead byte (`%c0`, `%c1`), a malformed `%`, a backslash, a control byte, a
// fragment — is refused `unsafe_path` for a host that has rules, whatever the rules say.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/egress.hpp"

namespace sandbox::detail {

/// Reasons (`egress_attempt.reason`) of the L7 rules' refusals.
inline constexpr std::string_view rule_refused_reason = "rule_refused";
inline constexpr std::string_view budget_exhausted_reason = "budget_exhausted";
inline constexpr std::string_view unsafe_path_reason = "unsafe_path";

/// Longest `method` or `path` kept in an `egress_attempt`, in bytes (after escaping).
inline constexpr std::size_t max_recorded_target_bytes = 256;

/// Why the path of origin-form request target `target` (what comes before `?`; bytes after
/// it are judged only for control bytes, backslashes and `#`) cannot be judged by prefix, or
/// nullopt when it can. See the file comment for what is refused.
std::optional<std::string> unsafe_target(std::string_view target);

/// The path of an origin-form target: the bytes before the first `?`.
std::string_view target_path(std::string_view target) noexcept;

/// `text` fit for a record: bytes outside 0x21..0x7E and `\` as `\xNN`, cut to at most
/// `max_recorded_target_bytes` (never inside an escape).
std::string display_target(std::string_view text);

/// What `l7_rules::admit` decided.
struct l7_verdict {
  bool ruled = false;    ///< a rule names the host: the request was judged
  bool allowed = true;   ///< false: refused (`reason`)
  std::size_t rule = 0;  ///< allowed: the admitting rule; budget_exhausted: the spent one
  unsigned status = 0;   ///< refused: 403
  std::string reason;    ///< refused: rule_refused, budget_exhausted or unsafe_path
  /// For the record and the refusal's body: the admitting or spent rule's name, or (no rule
  /// matched, unsafe path) the names of the host's rules, comma-separated.
  std::string rule_names;
  std::string advice;  ///< refused: what would be allowed, for the refusal's body
};

/**
 * One run's L7 rules and what their budgets have used. Not thread-safe (the proxy's strand).
 *
 * A request to a host no rule names is not judged (`ruled` false). Otherwise, in order: an
 * unsafe target is refused `unsafe_path`; a request whose method and path no rule of the host
 * allows is refused `rule_refused`; the first allowing rule whose budgets still hold it
 * admits it (counting one request, and reserving `body_bytes` of its byte budget when the
 * body's length is known up front); when every allowing rule is spent, `budget_exhausted`
 * naming the first.
 */
class l7_rules {
 public:
  explicit l7_rules(std::vector<egress_rule> rules);

  bool empty() const noexcept { return rules_.empty(); }
  /// True when a rule names `host` (a canonical host name).
  bool applies(std::string_view host) const;
  /// Judges one request to `host` (canonical): `method` and origin-form `target` as sent;
  /// `body_bytes`, the request body's length when known before it is relayed.
  l7_verdict admit(std::string_view host, std::string_view method, std::string_view target,
                   std::optional<std::uint64_t> body_bytes);
  /// Takes up to `n` bytes of rule `i`'s byte budget (all of them without one); returns how
  /// many it may relay.
  std::uint64_t take_bytes(std::size_t i, std::uint64_t n) noexcept;
  const egress_rule& rule(std::size_t i) const { return rules_.at(i); }
  /// The advice of a response cut by rule `i`'s byte budget.
  std::string spent_advice(std::size_t i) const;

 private:
  std::vector<egress_rule> rules_;
  std::vector<std::uint64_t> requests_;  // admitted, per rule
  std::vector<std::uint64_t> bytes_;     // relayed or reserved, per rule
};

}  // namespace sandbox::detail
