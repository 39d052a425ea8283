// Pieces of run_result's JSON form shared by the codec (sandbox/json.hpp), execution
// receipts (sandbox/receipt.hpp) and the daemon's cell results (service/line_protocol.cpp),
// so all write usage, egress attempts, streams and output files the same way. Private to src/.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "sandbox/protocol.hpp"

namespace sandbox::detail {

/// `{"summary", "blob", "bytes", "total_bytes", "truncated"}` (docs/protocol.md, `stdout`).
nlohmann::ordered_json encode_stream(const stream_capture& s);

/// An array of `{"name", "blob", "bytes"}`, in order (docs/protocol.md, `files_out`).
nlohmann::ordered_json encode_files_out(const std::vector<output_file>& files);

/// The integer, or null when absent (`exit_code`, `signal`).
nlohmann::ordered_json optional_int(const std::optional<int>& v);

/// `{"setup_ms", "wall_ms", "cpu_ms", "peak_memory_bytes"}` (docs/protocol.md, `usage`).
nlohmann::ordered_json encode_usage(const run_usage& u);

/// An array of `{"protocol", "host", "address", "port", "allowed", "reason", "bytes_up",
/// "bytes_down"}`, in order (docs/protocol.md, `egress_attempts`).
nlohmann::ordered_json encode_egress_attempts(const std::vector<egress_attempt>& attempts);

}  // namespace sandbox::detail
