// The requests that read or write the blob store (private to the service room): `blob_put`,
// `blob_get` and `replay`. Each is blocking file I/O, so the connection runs it on the
// daemon's pool and queues the answer line it returns; none touches the connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "sandbox/blob_store.hpp"
#include "sandbox/span.hpp"
#include "service/line_protocol.hpp"

namespace sandbox::service {

/// Stores the bytes for the tenant. Answers `{"blob":ID}`; `quota_exceeded` when the tenant's
/// quota is exhausted; `internal` when the store fails (logged) or there is none (`blobs`
/// null). Never throws.
std::string answer_blob_put(sandbox::blob_store* blobs, const std::string& id,
                            const blob_put_line& put, const sandbox::log_sink& log);

/// Reads the blob for the tenant. Answers `{"data_b64":B64}`; `blob_not_found` (also for
/// another tenant's blob: its existence is not revealed); `too_large` over
/// `max_blob_get_bytes`; `capacity` when the daemon's unwritten answers (`unwritten_total`)
/// would pass `max_total_output_bytes`; `internal` when the store fails (logged).
///
/// The answer's size is added to `unwritten_total` before the blob is read, and `reserved`
/// says how much: the caller subtracts it once the answer is queued (where it counts as
/// what it is). Never throws.
std::string answer_blob_get(const sandbox::blob_store* blobs, const std::string& id,
                            const blob_get_line& get, const service_limits& limits,
                            std::atomic<std::size_t>& unwritten_total, std::size_t& reserved,
                            const sandbox::log_sink& log);

/// Replays the record under the ticket (`sandbox::replay_run`): a `result` answer with the
/// stored result and nothing executed, or a rejected result (`blob_not_found` naming the
/// collected blob, `action_denied` for another tenant's record). Never throws.
std::string answer_replay(const sandbox::blob_store* blobs, const std::string& id,
                          const replay_line& replay);

}  // namespace sandbox::service
