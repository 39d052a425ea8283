// Run records and replay: a run's output is never a must-replay value. An agent framework
// that checkpoints and restarts stores the run's `run_record` (plain JSON) and, after the
// restart, reads the stored result back with `replay_run` / `runtime::replay` instead of
// executing the code again:
//
//   auto r = rt.run(request, ticket);
//   auto rec = sandbox::make_run_record(request, ticket, r);
//   sandbox::pin_record(*rt.blobs(), rec);            // keep its blobs through GC
//   checkpoint(sandbox::encode(rec));                 // one line of JSON
//   ... process restarts, a new runtime ...
//   auto rec2 = sandbox::decode_run_record(text);     // strict, names the bad field
//   auto again = rt2.replay(*rec2, ticket);           // the same run_result, nothing runs
//
// Wire form and the request digest: docs/protocol.md, "Run records".
#pragma once

#include <boost/system/result.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/blob_store.hpp"
#include "sandbox/error.hpp"
#include "sandbox/json.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"

namespace sandbox {

/// Version of the run record document (`"v"`); only 1 is accepted.
inline constexpr std::uint32_t run_record_version = 1;

/**
 * Everything needed to answer a run again without running it. A plain aggregate; its JSON
 * form (`encode` / `decode_run_record`) is the checkpoint.
 */
struct run_record {
  std::uint32_t v = run_record_version;
  /// The record's id: the run's `run_id` (also the holder name its blob pins use).
  std::string record_id;
  /// The tenant whose blob store holds the result's blobs (the ticket's tenant).
  std::string tenant;
  /// 64 lowercase hex digits: SHA-256 of `encode(request)` (`request_digest`), the request
  /// exactly as submitted (before admission's clamping and canonicalization).
  std::string request_sha256;
  /// The id of the ticket the run was submitted under.
  std::string ticket_id;
  /// That ticket's derivation chain: its ancestors' ids, root first, parent last; empty for
  /// a ticket that is not derived.
  std::vector<std::string> derived_from;
  /// The runtime that ran the code, name and image digest (equal to `result.runtime`).
  runtime_info runtime;
  /// When the record was made, UTC, whole seconds.
  std::chrono::system_clock::time_point created_at{};
  /// The full result, with the blob ids of stdout, stderr and output files.
  run_result result;
  bool operator==(const run_record&) const = default;
};

/// 64 lowercase hex digits: SHA-256 of `encode(request)`, the codec's canonical one-line
/// form (members in the documented order, every field written, defaults included). Since
/// it is derived from the full encoding, a field added to `run_request` (and its codec) is
/// covered without changing this function.
std::string request_digest(const run_request& request);

/**
 * The record of a finished run: `request_sha256 = request_digest(request)`, `ticket_id`,
 * `derived_from` and `tenant` from `ticket`, `runtime` and `record_id` from `result`,
 * `created_at` = now (whole seconds). Records only what it is given: for a run approved
 * under a derived ticket the receipt (sandbox/receipt.hpp) names the derived ticket.
 */
run_record make_run_record(const run_request& request, const ticket& ticket,
                           const run_result& result);

/// Encodes a record as one line of JSON; `decode_run_record(encode(r)) == r` for every
/// record `make_run_record` builds.
std::string encode(const run_record& r);

/**
 * Decodes a record strictly: unknown or missing fields, wrong types, an unsupported `"v"`,
 * malformed JSON, and faults of the nested request-free `result` (decoded with
 * `decode_run_result`, its messages prefixed `result.`) give an `invalid_request` rejection
 * naming the field. Beyond types it checks: `record_id` equals `result.run_id` and is
 * non-empty, `tenant` syntax, `request_sha256` is 64 lowercase hex digits, ticket ids'
 * syntax, `runtime` equals `result.runtime`, and every non-empty blob id of the result is
 * well-formed (`result.stdout.blob`, `result.files_out[2].blob`, ...).
 */
boost::system::result<run_record, rejection> decode_run_record(std::string_view json,
                                                               const decode_options& = {});

/// The non-empty blob ids a record's result refers to (stdout, stderr, output files), each
/// once, in that order.
std::vector<std::string> record_blobs(const run_record& r);

/**
 * The stored result of `record`, without executing anything. `ticket` must belong to the
 * record's tenant (the blobs are that tenant's), else `action_denied` ("replay: tenant
 * mismatch"); it is not required to grant `code.execute` (nothing runs) and may have expired.
 * Every blob the result names must still be in `blobs` with the recorded size: a missing one
 * gives `blob_not_found` naming the field and the id ("replay: result.stdout.blob sha256:…
 * not found"); one of another size gives `invalid_request` ("replay: … does not match the
 * record"); a store failure `internal`. Thread-safe as the store is.
 */
boost::system::result<run_result, rejection> replay_run(const blob_store& blobs,
                                                        const run_record& record,
                                                        const ticket& ticket);

/// Pins every blob of `record` in `blobs` under holder `record.record_id`
/// (`blob_store::pin`), so garbage collection keeps them. Stops at the first error: `not_found`
/// (a blob is already gone), `invalid_argument`, `unsupported`, `io_error`; pins already taken
/// stay (pinning again is idempotent).
result<void> pin_record(blob_store& blobs, const run_record& record);

/// Removes `record`'s pins (`blob_store::unpin`), so its blobs become collectable once no
/// other record holds them. Pins that are already gone are ignored. Errors: `invalid_argument`,
/// `unsupported`, `io_error`.
result<void> unpin_record(blob_store& blobs, const run_record& record);

}  // namespace sandbox
