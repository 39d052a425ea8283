// Pieces of run_result's JSON form shared by the codec (sandbox/json.hpp) and execution
// receipts (sandbox/receipt.hpp), so both write usage and egress attempts the same way.
// Private to src/.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "sandbox/protocol.hpp"

namespace sandbox::detail {

/// `{"setup_ms", "wall_ms", "cpu_ms", "peak_memory_bytes"}` (docs/protocol.md, `usage`).
nlohmann::ordered_json encode_usage(const run_usage& u);

/// An array of `{"protocol", "host", "address", "port", "allowed", "reason", "bytes_up",
/// "bytes_down"}`, in order (docs/protocol.md, `egress_attempts`).
nlohmann::ordered_json encode_egress_attempts(const std::vector<egress_attempt>& attempts);

}  // namespace sandbox::detail
