// JSON codec for the protocol (docs/protocol.md has the field list and the JSON Schema).
//
// Decoding is strict: unknown fields, wrong types, out-of-range numbers and malformed JSON
// all give `invalid_request` with a message that names the field (`files_in[2].name`), never
// an exception, a crash or a hang. Encoding always produces valid UTF-8 JSON.
#pragma once

#include <boost/system/result.hpp>
#include <cstddef>
#include <string>
#include <string_view>

#include "sandbox/protocol.hpp"
#include "sandbox/session.hpp"

namespace sandbox {

/// Bounds on what the decoder accepts at all (before policy applies).
struct decode_options {
  std::size_t max_document_bytes = 8ULL << 20;  ///< larger → invalid_request
  std::size_t max_depth = 16;                   ///< deeper nesting → invalid_request
};

/// Decodes a `run_request`. Absent optional fields take the protocol defaults; `"v"` absent
/// means 1. The source's size is *not* judged here (admission does, so an over-long source
/// gives `source_too_large`, not `invalid_request`).
boost::system::result<run_request, rejection> decode_run_request(std::string_view json,
                                                                 const decode_options& = {});

/// Encodes a request; `decode_run_request(encode(r)) == r` for every valid `r`.
std::string encode(const run_request& r);

/// Decodes a `run_result` (e.g. one stored for replay).
boost::system::result<run_result, rejection> decode_run_result(std::string_view json,
                                                               const decode_options& = {});

/// Encodes a result as one line of JSON (no trailing newline).
std::string encode(const run_result& r);

/// Decodes an approval request (docs/protocol.md, "Approval"), e.g. one a host checkpointed
/// from `run_result::approval`. Strict like every document; beyond types it checks the
/// request's syntax (ticket id, tenant, canonical domains, hex digests, file names, isolation
/// at least `container`), naming the field in an `invalid_request` rejection.
boost::system::result<approval_request, rejection> decode_approval_request(
    std::string_view json, const decode_options& = {});

/// Encodes an approval request as one line of JSON; `decode_approval_request(encode(a)) == a`
/// for every valid `a`.
std::string encode(const approval_request& a);

/// Decodes a `session_request` (docs/protocol.md, "Sessions"): `{"v":1, "tool": NAME,
/// "max_lifetime_ms": N, "idle_timeout_ms": N}`, only `tool` required. Strict like every
/// document (`invalid_request` naming the field: unknown fields, wrong types, integers out of
/// int64 range, a duration ≤ 0: `max_lifetime_ms: must be > 0`). The tool's existence is
/// checked by the runtime, at `runtime::async_open_session` (which also refuses durations
/// ≤ 0 of requests built in C++).
boost::system::result<session_request, rejection> decode_session_request(
    std::string_view json, const decode_options& = {});

/// Encodes a session request as one line of JSON; `decode_session_request(encode(r)) == r`
/// for every `r` whose durations are unset or > 0.
std::string encode(const session_request& r);

/// Decodes a `session_result` (`{"v":1, "end": "closed", "result": RUN_RESULT,
/// "bytes_to_server": N, "bytes_from_server": N}`); `invalid_request` naming the field
/// otherwise (`end` must be one of `to_string(session_end)`'s names).
boost::system::result<session_result, rejection> decode_session_result(std::string_view json,
                                                                       const decode_options& = {});

/// Encodes a session result as one line of JSON (no trailing newline);
/// `decode_session_result(encode(r)) == r`.
std::string encode(const session_result& r);

}  // namespace sandbox
