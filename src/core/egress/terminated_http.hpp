// HTTP/1.1 inside a TLS tunnel the egress proxy terminates (private to src/).
//
// A network run that uses a host-held secret (sandbox/secrets.hpp) has its HTTPS tunnels
// terminated by the proxy (egress_proxy.hpp), which then sees the requests. What it does with
// them is here, pure (bytes in, bytes out, no I/O), so it is unit-tested and fuzzed:
//
// - `terminated_http::from_client` reads the client's requests strictly (request line, header
//   fields, Content-Length or chunked bodies, one request after another on a kept-alive
//   connection), puts a secret's value into its configured header for requests to that
//   secret's domains, and refuses a placeholder anywhere else ("secret_misuse").
// - `terminated_http::from_origin` reads the origin's responses and replaces each secret's
//   value with its placeholder (`echo_redactor`) in the head and the body before the program
//   sees it. Bodies reach the client re-framed as chunked (a redaction changes lengths).
// - For a host with L7 rules (l7_rules.hpp; a run with rules has its tunnels terminated too),
//   each request is judged by them before any of it goes upstream, and the bodies relayed
//   under a rule are counted against its byte budget, a response cut where it would cross it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/egress/l7_rules.hpp"
#include "core/egress/secret_scan.hpp"

namespace sandbox::detail {

/// One secret as the terminating proxy uses it (from `run_secret`).
struct secret_injection {
  std::string placeholder;                   ///< "sbx-secret-" and 32 hex digits
  std::shared_ptr<const std::string> value;  ///< the real value (never empty)
  std::vector<std::string> domains;          ///< canonical egress patterns it may go to
  std::string header_name;                   ///< e.g. "Authorization"
  std::string header_template;               ///< e.g. "Bearer {value}" (`{value}` once)
};

/**
 * Replaces every occurrence of `needle` in a stream given piece by piece with `replacement`,
 * also where an occurrence spans pieces. Holds back at most `needle.size() - 1` bytes (a
 * possible start of an occurrence) until more input or `finish`. `needle` must not be empty.
 */
class stream_replacer {
 public:
  stream_replacer(std::string needle, std::string replacement);
  /// Appends to `out` what is certain of the stream so far, `in` included.
  void feed(std::string_view in, std::string& out);
  /// End of the stream: appends the bytes held back.
  void finish(std::string& out);

 private:
  std::string needle_;
  std::string replacement_;
  std::string held_;
};

/// Replaces each secret's value with its placeholder in a stream (`stream_replacer`s chained).
class echo_redactor {
 public:
  explicit echo_redactor(const std::vector<secret_injection>& secrets);
  void feed(std::string_view in, std::string& out);
  void finish(std::string& out);

 private:
  std::vector<stream_replacer> stages_;
};

/// Why `terminated_http` refused: the HTTP status to answer with and the egress reason; for
/// an L7 rule's refusal also the rule (names) and the advice for the refusal's body.
struct http_refusal {
  unsigned status = 400;
  std::string reason;
  std::string rule;
  std::string advice;
};

/// One request judged by L7 rules in a terminated tunnel, for its own egress attempt: method
/// and path as sent (`display_target`), the rule that admitted or refused it, and the verdict.
struct judged_request {
  std::string method;
  std::string path;
  std::string rule;
  bool allowed = true;
  std::string reason;  ///< refused: the refusal's reason
};

/// Bytes of a request or response head inside a terminated tunnel, at most.
inline constexpr std::size_t max_terminated_head_bytes = 16384;
/// A request (head and body) up to this size is judged whole before any of it goes
/// upstream; a larger one is judged as it is relayed.
inline constexpr std::size_t max_judged_request_bytes = 65536;

/**
 * The HTTP/1.1 exchange of one terminated tunnel to `host` (canonical name). Not thread-safe.
 *
 * Requests (`from_client`): HTTP/1.1 only, origin-form targets (or `*` for OPTIONS), `Host`
 * naming `host`; no CONNECT, no `Upgrade`; bodies by Content-Length or by
 * `Transfer-Encoding: chunked` alone (chunk sizes 1*HEXDIG up to 2^40, no extensions, no
 * trailer fields). A request head refused by `parse_http_request_head` (obs-fold, bare LF,
 * CL with TE, CL or Host twice, ...) is malformed. Marks of the run's placeholders are looked
 * for in the request line, every header and the body (decoded); the one place a placeholder
 * may be is a secret's configured header, sent to one of that secret's domains, whose value
 * is exactly the template with the placeholder for `{value}`: it is replaced by the value.
 * A request of at most `max_judged_request_bytes` leaves only once complete and judged.
 *
 * With `rules` (which must outlive this), a request to a host they name is judged by them
 * once its head is read (l7_rules.hpp: `unsafe_path`, `rule_refused`, `budget_exhausted`, a
 * 403 like the others) and listed in `take_judged()`; the body bytes relayed under its rule
 * (a request body of unknown length, the response body) count against the rule's byte
 * budget: a request body crossing it is refused `budget_exhausted`, a response crossing it
 * is cut at the limit (`from_origin` hands over what fits, then refuses).
 *
 * Once refused, the exchange stays refused: the caller answers (or closes) and stops.
 */
class terminated_http {
 public:
  terminated_http(std::string host, std::vector<secret_injection> secrets,
                  l7_rules* rules = nullptr);

  /// The client sent `in`: appends what goes to the origin to `out`. nullopt, or a refusal.
  std::optional<http_refusal> from_client(std::string_view in, std::string& out);
  /// The origin sent `in`: appends what goes to the client to `out`. nullopt, or a refusal
  /// (the response cannot be read: the caller closes the tunnel).
  std::optional<http_refusal> from_origin(std::string_view in, std::string& out);
  /// The origin closed: appends the end of a response read until close. False when a
  /// response was cut short (the caller closes the tunnel).
  bool origin_closed(std::string& out);
  /// True while a request was sent whose response is not complete yet.
  bool awaiting_response() const noexcept;
  /// After a refusal from `from_client`: true when the client can be answered now (no
  /// earlier response is owed or half sent), so the refusal is the answer it reads next.
  bool can_answer_refusal() const noexcept;
  /// True when the origin ends a response by closing (the caller then closes the client).
  bool closes_after_response() const noexcept { return close_after_; }
  /// The requests judged by L7 rules since the last call, in order.
  std::vector<judged_request> take_judged() { return std::exchange(judged_, {}); }

 private:
  enum class req_state { head, body, chunk_size, chunk_data, chunk_crlf, trailer, refused };
  enum class resp_state {
    head,
    body_length,
    body_close,
    chunk_size,
    chunk_data,
    chunk_crlf,
    trailer,
    done,
    failed
  };

  std::optional<http_refusal> request_head(std::string& out);
  std::optional<http_refusal> refuse(unsigned status, std::string_view reason,
                                     std::string rule = {}, std::string advice = {});
  std::optional<http_refusal> scan_body(std::string_view data);
  /// Judges and passes on what is buffered of the current body piece (at most `rq_left_`
  /// bytes); the refusal when it holds a placeholder.
  std::optional<http_refusal> relay_body_bytes(std::string& out);
  /// Request bytes for the origin: held while the request may still be judged whole.
  void up(std::string_view data, std::string& out);
  /// Sends on what was held.
  void release(std::string& out);
  bool response_head(std::string& out);
  void emit_chunk(std::string_view data, std::string& out);
  /// Redacts and emits `data`, a piece of the current response's body, as far as its rule's
  /// byte budget allows; false when the budget cut it (the response then fails).
  bool emit_body(std::string_view data, std::string& out);
  void end_response(std::string& out);

  static constexpr std::size_t no_rule = static_cast<std::size_t>(-1);
  struct pending_response {
    bool head = false;           ///< the request was HEAD: no body comes
    std::size_t rule = no_rule;  ///< the L7 rule it was admitted under
  };

  std::string host_;
  std::vector<secret_injection> secrets_;
  std::vector<std::string> marks_;
  l7_rules* rules_ = nullptr;
  std::vector<judged_request> judged_;
  std::size_t rq_rule_ = no_rule;  ///< the current request's rule
  bool rq_count_body_ = false;     ///< its body counts as relayed (length not known up front)
  std::size_t rs_rule_ = no_rule;  ///< the current response's rule

  req_state rq_ = req_state::head;
  std::string rq_buf_;
  std::uint64_t rq_left_ = 0;
  std::optional<placeholder_scanner> rq_scan_;
  bool refused_in_body_ = false;  ///< the refusal came in a request's body
  std::string held_up_;           ///< the current request, held (`up`)
  bool holding_ = false;

  resp_state rs_ = resp_state::head;
  std::string rs_buf_;
  std::uint64_t rs_left_ = 0;
  std::optional<echo_redactor> rs_redact_;
  std::deque<pending_response> pending_;  ///< per request sent and not yet answered
  bool close_after_ = false;
};

}  // namespace sandbox::detail
