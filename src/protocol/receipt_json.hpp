// Private: the receipt document's canonical form, for the protocol codec (json_codec.cpp
// embeds a run's receipt in `run_result`). Not installed.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace sandbox::detail {

/// Decodes the receipt document at `path` strictly (no signature check) and returns its
/// canonical one-line encoding. Faults throw `decode_error` naming the field.
std::string canonical_receipt_document(const nlohmann::json& v, const std::string& path);

}  // namespace sandbox::detail
