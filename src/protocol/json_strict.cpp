// Strict JSON parsing and typed field access for the protocol decoders (json_strict.hpp).
#include "protocol/json_strict.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "protocol/text_util.hpp"

namespace sandbox::detail {
namespace {

using nlohmann::json;

/// Joins a field path and a problem. Paths of deeply nested, long keys are cut (at a
/// character boundary) so a message stays short whatever the document holds.
std::string with_path(const std::string& path, std::string_view what) {
  constexpr std::size_t max_path = 160;
  if (path.empty()) return std::string(what);
  std::string p = path;
  if (p.size() > max_path) {
    std::size_t end = max_path;
    while (end > 0 && (static_cast<unsigned char>(p[end]) & 0xC0) == 0x80) --end;
    p.resize(end);
    p += "...";
  }
  return p + ": " + std::string(what);
}

/// A SAX handler that builds a DOM like nlohmann's own, but stops at the first duplicate key
/// or at nesting deeper than the limit, and keeps nlohmann's error text out of messages
/// (it quotes the raw input, which may be anything). Every error names the field path where
/// the parser stopped (`files_in[1].name: malformed JSON at byte 70: ...`), so a model can
/// tell which of its values was at fault.
class strict_builder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  strict_builder(json& root, std::size_t max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(number_integer_t v) { return add(v); }
  bool number_unsigned(number_unsigned_t v) { return add(v); }
  bool number_float(number_float_t v, const string_t& /*text*/) { return add(v); }
  bool string(string_t& v) { return add(std::move(v)); }
  bool binary(binary_t& v) { return add(std::move(v)); }  // not produced by JSON text

  bool start_object(std::size_t /*elements*/) { return open(json::value_t::object); }
  bool start_array(std::size_t /*elements*/) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    json& object = *stack_.back();
    if (object.contains(k)) {
      error_ = with_path(paths_.back(), "duplicate field " + quote_for_message(k));
      return false;
    }
    key_ = k;
    element_ = &object[k];
    expect_value_ = true;
    return true;
  }

  template <class Exception>
  bool parse_error(std::size_t position, const std::string& /*last_token*/, const Exception& ex) {
    // nlohmann's text looks like "[json.exception.parse_error.101] parse error at line 1,
    // column 2: syntax error while parsing value - invalid literal; last read: '<input>'".
    // Keep only the fixed explanation, never the quoted input.
    std::string reason;
    const std::string_view what = ex.what();
    const auto from = what.find("syntax error");
    if (from != std::string_view::npos) {
      auto text = what.substr(from);
      reason = std::string(text.substr(0, text.find("; last read")));
      // Only nlohmann's fixed ASCII wording is kept; anything else drops the explanation.
      for (char c : reason) {
        if (c < 0x20 || c > 0x7E) {
          reason.clear();
          break;
        }
      }
    } else if (what.find("number overflow") != std::string_view::npos) {
      reason = "number overflow";  // out_of_range.406, whose text quotes the number
    }
    std::string message = "malformed JSON at byte " + std::to_string(position);
    if (!reason.empty()) message += ": " + reason;
    error_ = with_path(where(), message);
    parse_error_position_ = position;
    return false;
  }

  const std::string& error() const { return error_; }

  /// True when parsing stopped with a parse error at or after byte `n` (the end of a
  /// prefix), rather than at a fault of its own before it.
  bool stopped_at_or_after(std::size_t n) const {
    return parse_error_position_ && *parse_error_position_ >= n;
  }

  /// The field path of the value being parsed now: the member after its key, the next
  /// array element, or the enclosing object (in a key, or between members). Empty at the
  /// top level.
  std::string where() const {
    if (stack_.empty()) return {};
    const json& parent = *stack_.back();
    if (parent.is_array()) return index_path(paths_.back(), parent.size());
    return expect_value_ ? member_path(paths_.back(), key_) : paths_.back();
  }

 private:
  template <class Value>
  json* place(Value&& v) {
    if (stack_.empty()) {
      root_ = json(std::forward<Value>(v));
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.get_ref<json::array_t&>().emplace_back(std::forward<Value>(v));
      return &parent.get_ref<json::array_t&>().back();
    }
    *element_ = json(std::forward<Value>(v));
    expect_value_ = false;
    return element_;
  }

  template <class Value>
  bool add(Value&& v) {
    place(std::forward<Value>(v));
    return true;
  }

  std::string child_path() const {
    if (stack_.empty()) return {};
    const json& parent = *stack_.back();
    if (parent.is_array()) return index_path(paths_.back(), parent.size());
    return member_path(paths_.back(), key_);
  }

  bool open(json::value_t type) {
    if (stack_.size() + 1 > max_depth_) {
      error_ = "nesting deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    std::string path = child_path();
    stack_.push_back(place(type));
    paths_.push_back(std::move(path));
    return true;
  }

  bool close() {
    stack_.pop_back();
    paths_.pop_back();
    expect_value_ = false;  // a closed container was the value of its key
    return true;
  }

  json& root_;
  std::size_t max_depth_;
  std::vector<json*> stack_;
  std::vector<std::string> paths_;  // field path of each open container
  std::string key_;                 // the current object key
  json* element_ = nullptr;         // where the value for `key_` goes
  bool expect_value_ = false;       // in an object: `key_` is read, its value is not yet
  std::optional<std::size_t> parse_error_position_;
  std::string error_;
};

/// A key as it appears in a path: plain when it is an identifier, else quoted.
std::string path_key(std::string_view key) {
  bool plain = !key.empty() && key.size() <= 64;
  for (char c : key) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) {
      plain = false;
      break;
    }
  }
  return plain ? std::string(key) : "[" + quote_for_message(key) + "]";
}

constexpr double two_pow_63 = 9223372036854775808.0;

/// For a JSON number written with a fraction or exponent (or one too big for 64 bits): true
/// when it is a whole number too large to be held, so the message can say "out of range".
bool is_huge_integral(double d) {
  return !std::isfinite(d) || (std::trunc(d) == d && std::fabs(d) >= two_pow_63);
}

}  // namespace

std::optional<std::string> parse_strict(std::string_view text, const decode_options& options,
                                        nlohmann::json& out) {
  if (text.size() > options.max_document_bytes) {
    return "document is larger than " + std::to_string(options.max_document_bytes) + " bytes";
  }
  // nlohmann would skip a byte order mark; another parser might not.
  if (text.substr(0, 3) == "\xEF\xBB\xBF") {
    return std::string("malformed JSON at byte 1: byte order mark not allowed");
  }
  // Invalid UTF-8 and raw NUL bytes are refused wherever they are (nlohmann's lexer takes a
  // NUL for the end of the input, so `{...}\0<anything>` would parse as `{...}`). The message
  // names the field holding the first such byte: the path where a parse of the text before
  // it stops — unless that text has a fault of its own, which comes first.
  const std::size_t bad = utf8_error_offset(text);
  const std::size_t nul = text.find('\0');
  if (bad != std::string_view::npos || nul != std::string_view::npos) {
    const std::size_t at = std::min(bad, nul);
    std::string path;
    json scratch;
    strict_builder probe(scratch, options.max_depth);
    const std::string_view before = text.substr(0, at);
    if (!json::sax_parse(before.data(), before.data() + before.size(), &probe,
                         json::input_format_t::json, /*strict=*/true,
                         /*ignore_comments=*/false)) {
      if (!probe.stopped_at_or_after(at)) return probe.error();
      path = probe.where();
    }
    if (at == bad) {
      return path.empty()
                 ? "document is not valid UTF-8 (byte " + std::to_string(bad + 1) + ")"
                 : with_path(path, "not valid UTF-8 (byte " + std::to_string(bad + 1) + ")");
    }
    return with_path(path, "malformed JSON at byte " + std::to_string(nul + 1) + ": NUL byte");
  }
  strict_builder builder(out, options.max_depth);
  const bool ok = json::sax_parse(text.data(), text.data() + text.size(), &builder,
                                  json::input_format_t::json, /*strict=*/true,
                                  /*ignore_comments=*/false);
  if (!ok) {
    out = nullptr;
    return builder.error().empty() ? std::string("malformed JSON") : builder.error();
  }
  return std::nullopt;
}

void fail(const std::string& path, std::string_view what) {
  throw decode_error(with_path(path, what));
}

std::string member_path(const std::string& parent, std::string_view key) {
  if (parent.empty()) return path_key(key);
  std::string k = path_key(key);
  return k.front() == '[' ? parent + k : parent + "." + k;
}

std::string index_path(const std::string& parent, std::size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

const json& as_object(const json& v, const std::string& path) {
  if (!v.is_object()) fail(path, path.empty() ? "expected a JSON object" : "expected an object");
  return v;
}

const json& as_array(const json& v, const std::string& path) {
  if (!v.is_array()) fail(path, "expected an array");
  return v;
}

void check_known_fields(const json& object, const std::string& path,
                        std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (std::string_view k : known) found = found || k == key;
    if (!found) fail(path, "unknown field " + quote_for_message(key));
  }
}

const json* find_member(const json& object, std::string_view key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const json& require_member(const json& object, const std::string& path, std::string_view key) {
  const json* v = find_member(object, key);
  if (v == nullptr) fail(member_path(path, key), "required field is missing");
  return *v;
}

std::string as_string(const json& v, const std::string& path) {
  if (!v.is_string()) fail(path, "expected a string");
  return v.get_ref<const json::string_t&>();
}

bool as_bool(const json& v, const std::string& path) {
  if (!v.is_boolean()) fail(path, "expected true or false");
  return v.get<bool>();
}

std::uint64_t as_unsigned(const json& v, const std::string& path, std::uint64_t max) {
  const std::string range = "out of range (at most " + std::to_string(max) + ")";
  switch (v.type()) {
    case json::value_t::number_unsigned: {
      const auto u = v.get<std::uint64_t>();
      if (u > max) fail(path, range);
      return u;
    }
    case json::value_t::number_integer: {
      const auto i = v.get<std::int64_t>();
      if (i < 0) fail(path, "expected a non-negative integer");
      if (static_cast<std::uint64_t>(i) > max) fail(path, range);
      return static_cast<std::uint64_t>(i);
    }
    case json::value_t::number_float: {
      const auto d = v.get<double>();
      if (d > 0 && is_huge_integral(d)) fail(path, range);
      fail(path, "expected a non-negative integer");
    }
    default:
      fail(path, "expected a non-negative integer");
  }
}

std::int64_t as_signed(const json& v, const std::string& path, std::int64_t min, std::int64_t max) {
  const std::string range =
      "out of range (" + std::to_string(min) + " to " + std::to_string(max) + ")";
  switch (v.type()) {
    case json::value_t::number_unsigned: {
      const auto u = v.get<std::uint64_t>();
      if (max < 0 || u > static_cast<std::uint64_t>(max)) fail(path, range);
      return static_cast<std::int64_t>(u);
    }
    case json::value_t::number_integer: {
      const auto i = v.get<std::int64_t>();
      if (i < min || i > max) fail(path, range);
      return i;
    }
    case json::value_t::number_float:
      if (is_huge_integral(v.get<double>())) fail(path, range);
      fail(path, "expected an integer");
    default:
      fail(path, "expected an integer");
  }
}

std::string unsupported_version_message(std::uint64_t v) {
  return "v: unsupported protocol version " + std::to_string(v) + " (this library speaks " +
         std::to_string(protocol_version) + ")";
}

void check_version(const json& object) {
  const json* v = find_member(object, "v");
  if (v == nullptr) return;
  if (v->type() == json::value_t::number_unsigned) {
    const auto n = v->get<std::uint64_t>();
    if (n == protocol_version) return;
    throw decode_error(unsupported_version_message(n));
  }
  if (v->type() == json::value_t::number_integer && v->get<std::int64_t>() == 0) {
    throw decode_error(unsupported_version_message(0));  // "-0"
  }
  throw decode_error("v: unsupported protocol version (expected the integer " +
                     std::to_string(protocol_version) + ")");
}

std::string dump_compact(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace sandbox::detail
