// Private: the strict JSON reader shared by the protocol codec (json_codec.cpp) and ticket
// decoding (ticket.cpp). Not installed.
//
// `parse_strict` refuses what a lenient parser would quietly accept and another parser might
// read differently (parser differentials are a security bug): duplicate keys, invalid UTF-8,
// a byte order mark, comments, trailing content, nesting deeper than the limit, documents
// over the size limit. The `field_reader` helpers then type-check fields and name the field
// path in every message (`files_in[2].blob: expected a string`).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sandbox/json.hpp"

namespace sandbox::detail {

/// Parses `text` into `out`. Returns an error message, or nullopt. The message starts with
/// the path of the field where the fault is (`files_in[1].name: not valid UTF-8 (byte 76)`,
/// `files_in[0]: duplicate field 'name'`); faults outside every field have none
/// ("malformed JSON at byte 1: byte order mark not allowed").
std::optional<std::string> parse_strict(std::string_view text, const decode_options& options,
                                        nlohmann::json& out);

/// Thrown by the field helpers below; caught by the decoders and turned into a rejection.
/// Never escapes a public function.
struct decode_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws `decode_error("<path>: <what>")` (just `what` for the empty, top-level path).
[[noreturn]] void fail(const std::string& path, std::string_view what);

/// "parent.key" (or "key" at the top level).
std::string member_path(const std::string& parent, std::string_view key);
/// "parent[i]".
std::string index_path(const std::string& parent, std::size_t i);

/// `v` as an object, else fails with "expected an object".
const nlohmann::json& as_object(const nlohmann::json& v, const std::string& path);
/// `v` as an array, else fails with "expected an array".
const nlohmann::json& as_array(const nlohmann::json& v, const std::string& path);
/// Fails with "unknown field 'x'" for the first key (in byte order) not in `known`.
void check_known_fields(const nlohmann::json& object, const std::string& path,
                        std::initializer_list<std::string_view> known);
/// The member `key`, or nullptr when absent.
const nlohmann::json* find_member(const nlohmann::json& object, std::string_view key);
/// The member `key`; fails with "<path.key>: required field is missing" when absent.
const nlohmann::json& require_member(const nlohmann::json& object, const std::string& path,
                                     std::string_view key);

std::string as_string(const nlohmann::json& v, const std::string& path);
bool as_bool(const nlohmann::json& v, const std::string& path);
/// A JSON integer in [0, max]; fails with "expected a non-negative integer" or
/// "out of range (at most <max>)".
std::uint64_t as_unsigned(const nlohmann::json& v, const std::string& path,
                          std::uint64_t max = std::numeric_limits<std::uint64_t>::max());
/// A JSON integer in [min, max]; fails with "expected an integer" or "out of range".
std::int64_t as_signed(const nlohmann::json& v, const std::string& path, std::int64_t min,
                       std::int64_t max);

/// Checks the optional `"v"` member: absent or the integer 1. Fails with
/// "v: unsupported protocol version ..." otherwise.
void check_version(const nlohmann::json& object);

/// The message for a version other than 1, shared with admission so both paths agree.
std::string unsupported_version_message(std::uint64_t v);

/// Serializes for the wire: one line, UTF-8 (invalid bytes replaced), never throws for
/// invalid UTF-8.
std::string dump_compact(const nlohmann::ordered_json& j);

}  // namespace sandbox::detail
