// JSON codec for run_request and run_result (sandbox/json.hpp; docs/protocol.md).
//
// The decoder checks syntax and types only. Semantic rules (file names, blob id syntax,
// timeout ≤ 0, limits, env names, source size) belong to admission, so C++ callers get them
// too; where a JSON-only check overlaps (the version), the message is shared.
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "protocol/json_strict.hpp"
#include "protocol/receipt_json.hpp"
#include "protocol/result_json.hpp"
#include "protocol/text_util.hpp"
#include "protocol/ticket_json.hpp"
#include "sandbox/json.hpp"

namespace sandbox {
namespace {

using detail::as_array;
using detail::as_bool;
using detail::as_object;
using detail::as_signed;
using detail::as_string;
using detail::as_unsigned;
using detail::check_known_fields;
using detail::fail;
using detail::find_member;
using detail::index_path;
using detail::member_path;
using detail::require_member;
using nlohmann::json;
using nlohmann::ordered_json;

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t int64_min = std::numeric_limits<std::int64_t>::min();
constexpr std::uint64_t uint32_max = std::numeric_limits<std::uint32_t>::max();

/// Calls `f(value, path)` for the member `key` when present.
template <class F>
void optional_member(const json& object, const std::string& path, std::string_view key, F f) {
  if (const json* v = find_member(object, key)) f(*v, member_path(path, key));
}

/// Runs a decoder body, turning every failure into an `invalid_request` rejection.
template <class T, class F>
boost::system::result<T, rejection> decode_with(std::string_view text,
                                                const decode_options& options, F body) {
  try {
    json doc;
    if (auto error = detail::parse_strict(text, options, doc)) {
      return rejection{code::invalid_request, std::move(*error)};
    }
    return body(doc);
  } catch (const detail::decode_error& e) {
    return rejection{code::invalid_request, e.what()};
  } catch (const std::bad_alloc&) {
    return rejection{code::invalid_request, "document too large to decode"};
  } catch (const std::exception&) {
    return rejection{code::invalid_request, "malformed document"};
  }
}

// --- run_request ------------------------------------------------------------------------

input_file decode_input_file(const json& v, const std::string& path) {
  const json& o = as_object(v, path);
  check_known_fields(o, path, {"name", "blob"});
  input_file f;
  f.name = as_string(require_member(o, path, "name"), member_path(path, "name"));
  f.blob = as_string(require_member(o, path, "blob"), member_path(path, "blob"));
  return f;
}

run_request decode_request_body(const json& doc) {
  const json& o = as_object(doc, "");
  detail::check_version(o);
  check_known_fields(o, "",
                     {"v", "runtime", "source", "timeout_ms", "network", "files_in", "files_out",
                      "memory_limit_bytes", "env", "runtime_digest", "egress", "secrets", "tool",
                      "stdin", "stdin_blob"});
  run_request r;
  // A tool run names `tool` instead of `runtime` and `source` (admission refuses both).
  optional_member(o, "", "tool",
                  [&](const json& v, const std::string& p) { r.tool = as_string(v, p); });
  if (r.tool.empty() || o.contains("runtime")) {
    r.runtime = as_string(require_member(o, "", "runtime"), "runtime");
  }
  if (r.tool.empty() || o.contains("source")) {
    r.source = as_string(require_member(o, "", "source"), "source");
  }
  optional_member(o, "", "stdin",
                  [&](const json& v, const std::string& p) { r.std_in = as_string(v, p); });
  optional_member(o, "", "stdin_blob",
                  [&](const json& v, const std::string& p) { r.stdin_blob = as_string(v, p); });
  optional_member(o, "", "timeout_ms", [&](const json& v, const std::string& p) {
    r.timeout = std::chrono::milliseconds(as_signed(v, p, int64_min, int64_max));
  });
  optional_member(o, "", "network",
                  [&](const json& v, const std::string& p) { r.network = as_bool(v, p); });
  optional_member(o, "", "files_in", [&](const json& v, const std::string& p) {
    const json& a = as_array(v, p);
    r.files_in.reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      r.files_in.push_back(decode_input_file(a[i], index_path(p, i)));
    }
  });
  optional_member(o, "", "files_out", [&](const json& v, const std::string& p) {
    const json& fo = as_object(v, p);
    check_known_fields(fo, p, {"max_files", "max_bytes"});
    optional_member(fo, p, "max_files", [&](const json& x, const std::string& q) {
      r.files_out.max_files = static_cast<std::uint32_t>(as_unsigned(x, q, uint32_max));
    });
    optional_member(fo, p, "max_bytes", [&](const json& x, const std::string& q) {
      r.files_out.max_bytes = as_unsigned(x, q);
    });
  });
  optional_member(o, "", "memory_limit_bytes", [&](const json& v, const std::string& p) {
    r.memory_limit_bytes = as_unsigned(v, p);
  });
  optional_member(o, "", "env", [&](const json& v, const std::string& p) {
    const json& env = as_object(v, p);
    for (const auto& [name, value] : env.items()) {
      r.env.emplace(name, as_string(value, p + "[" + detail::quote_for_message(name) + "]"));
    }
  });
  optional_member(o, "", "runtime_digest",
                  [&](const json& v, const std::string& p) { r.runtime_digest = as_string(v, p); });
  optional_member(o, "", "egress", [&](const json& v, const std::string& p) {
    const json& a = as_array(v, p);
    r.egress.reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      r.egress.push_back(as_string(a[i], index_path(p, i)));
  });
  optional_member(o, "", "secrets", [&](const json& v, const std::string& p) {
    const json& a = as_array(v, p);
    // Bounded here so that a huge list costs nothing; admission checks names and count.
    if (a.size() > 4 * max_secrets) {
      detail::fail(p, std::to_string(a.size()) + " names, more than the limit of " +
                          std::to_string(max_secrets));
    }
    for (std::size_t i = 0; i < a.size(); ++i)
      r.secrets.push_back(as_string(a[i], index_path(p, i)));
  });
  return r;
}

// --- run_result -------------------------------------------------------------------------

stream_capture decode_stream(const json& v, const std::string& path) {
  const json& o = as_object(v, path);
  check_known_fields(o, path, {"summary", "blob", "bytes", "total_bytes", "truncated"});
  stream_capture s;
  optional_member(o, path, "summary",
                  [&](const json& x, const std::string& p) { s.summary = as_string(x, p); });
  optional_member(o, path, "blob",
                  [&](const json& x, const std::string& p) { s.blob = as_string(x, p); });
  optional_member(o, path, "bytes",
                  [&](const json& x, const std::string& p) { s.bytes = as_unsigned(x, p); });
  optional_member(o, path, "total_bytes",
                  [&](const json& x, const std::string& p) { s.total_bytes = as_unsigned(x, p); });
  optional_member(o, path, "truncated",
                  [&](const json& x, const std::string& p) { s.truncated = as_bool(x, p); });
  return s;
}

std::chrono::milliseconds as_duration(const json& v, const std::string& path) {
  return std::chrono::milliseconds(
      static_cast<std::int64_t>(as_unsigned(v, path, static_cast<std::uint64_t>(int64_max))));
}

std::optional<int> as_optional_int(const json& v, const std::string& path) {
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) fail(path, "expected an integer or null");
  return static_cast<int>(
      as_signed(v, path, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

std::optional<drop_reason> drop_reason_from_string(std::string_view s) {
  for (auto r : {drop_reason::count_limit, drop_reason::bytes_limit, drop_reason::not_regular_file,
                 drop_reason::bad_name, drop_reason::quota_exceeded, drop_reason::store_error}) {
    if (to_string(r) == s) return r;
  }
  return std::nullopt;
}

/// Decodes an array member of records with `decode_one(element, path)`.
template <class T, class F>
void decode_records(const json& o, std::string_view key, std::vector<T>& out, F decode_one) {
  optional_member(o, "", key, [&](const json& v, const std::string& p) {
    const json& a = as_array(v, p);
    out.reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) out.push_back(decode_one(a[i], index_path(p, i)));
  });
}

run_result decode_result_body(const json& doc) {
  const json& o = as_object(doc, "");
  detail::check_version(o);
  check_known_fields(o, "",
                     {"v",
                      "code",
                      "message",
                      "exit_code",
                      "signal",
                      "stdout",
                      "stderr",
                      "files_out",
                      "files_dropped",
                      "usage",
                      "oom_kills",
                      "timeout_clamped",
                      "memory_clamped",
                      "timeout_ms",
                      "memory_limit_bytes",
                      "isolation",
                      "runtime",
                      "egress_attempts",
                      "egress_attempts_dropped",
                      "violation",
                      "run_id",
                      "queue",
                      "queue_wait_ms",
                      "backend",
                      "approval",
                      "receipt"});
  run_result r;
  {
    const std::string name = as_string(require_member(o, "", "code"), "code");
    const auto c = code_from_string(name);
    if (!c) fail("code", "unknown code " + detail::quote_for_message(name));
    r.code = *c;
  }
  optional_member(o, "", "message",
                  [&](const json& v, const std::string& p) { r.message = as_string(v, p); });
  optional_member(o, "", "exit_code", [&](const json& v, const std::string& p) {
    r.exit_code = as_optional_int(v, p);
  });
  optional_member(o, "", "signal",
                  [&](const json& v, const std::string& p) { r.signal = as_optional_int(v, p); });
  optional_member(o, "", "stdout",
                  [&](const json& v, const std::string& p) { r.std_out = decode_stream(v, p); });
  optional_member(o, "", "stderr",
                  [&](const json& v, const std::string& p) { r.std_err = decode_stream(v, p); });
  decode_records(o, "files_out", r.files_out, [](const json& v, const std::string& p) {
    const json& f = as_object(v, p);
    check_known_fields(f, p, {"name", "blob", "bytes"});
    output_file out;
    out.name = as_string(require_member(f, p, "name"), member_path(p, "name"));
    out.blob = as_string(require_member(f, p, "blob"), member_path(p, "blob"));
    out.bytes = as_unsigned(require_member(f, p, "bytes"), member_path(p, "bytes"));
    return out;
  });
  decode_records(o, "files_dropped", r.files_dropped, [](const json& v, const std::string& p) {
    const json& f = as_object(v, p);
    check_known_fields(f, p, {"name_display", "reason"});
    dropped_file d;
    d.name_display =
        as_string(require_member(f, p, "name_display"), member_path(p, "name_display"));
    const std::string rp = member_path(p, "reason");
    const std::string reason = as_string(require_member(f, p, "reason"), rp);
    const auto dr = drop_reason_from_string(reason);
    if (!dr) fail(rp, "unknown drop reason " + detail::quote_for_message(reason));
    d.reason = *dr;
    return d;
  });
  optional_member(o, "", "usage", [&](const json& v, const std::string& p) {
    const json& u = as_object(v, p);
    check_known_fields(u, p, {"setup_ms", "wall_ms", "cpu_ms", "peak_memory_bytes"});
    optional_member(u, p, "setup_ms", [&](const json& x, const std::string& q) {
      r.usage.setup = as_duration(x, q);
    });
    optional_member(u, p, "wall_ms",
                    [&](const json& x, const std::string& q) { r.usage.wall = as_duration(x, q); });
    optional_member(u, p, "cpu_ms",
                    [&](const json& x, const std::string& q) { r.usage.cpu = as_duration(x, q); });
    optional_member(u, p, "peak_memory_bytes", [&](const json& x, const std::string& q) {
      r.usage.peak_memory_bytes = as_unsigned(x, q);
    });
  });
  optional_member(o, "", "oom_kills", [&](const json& v, const std::string& p) {
    r.oom_kills = static_cast<std::uint32_t>(as_unsigned(v, p, uint32_max));
  });
  optional_member(o, "", "timeout_clamped",
                  [&](const json& v, const std::string& p) { r.timeout_clamped = as_bool(v, p); });
  optional_member(o, "", "memory_clamped",
                  [&](const json& v, const std::string& p) { r.memory_clamped = as_bool(v, p); });
  optional_member(o, "", "timeout_ms",
                  [&](const json& v, const std::string& p) { r.timeout = as_duration(v, p); });
  optional_member(o, "", "memory_limit_bytes", [&](const json& v, const std::string& p) {
    r.memory_limit_bytes = as_unsigned(v, p);
  });
  optional_member(o, "", "isolation", [&](const json& v, const std::string& p) {
    const std::string name = as_string(v, p);
    const auto level = isolation_from_string(name);
    if (!level) fail(p, "unknown isolation level " + detail::quote_for_message(name));
    r.isolation = *level;
  });
  optional_member(o, "", "runtime", [&](const json& v, const std::string& p) {
    const json& rt = as_object(v, p);
    check_known_fields(rt, p, {"name", "digest"});
    optional_member(rt, p, "name",
                    [&](const json& x, const std::string& q) { r.runtime.name = as_string(x, q); });
    optional_member(rt, p, "digest", [&](const json& x, const std::string& q) {
      r.runtime.digest = as_string(x, q);
    });
  });
  decode_records(o, "egress_attempts", r.egress_attempts, [](const json& v, const std::string& p) {
    const json& e = as_object(v, p);
    check_known_fields(e, p,
                       {"protocol", "host", "address", "port", "allowed", "reason", "bytes_up",
                        "bytes_down", "method", "path", "rule"});
    egress_attempt a;
    optional_member(e, p, "protocol",
                    [&](const json& x, const std::string& q) { a.protocol = as_string(x, q); });
    optional_member(e, p, "host",
                    [&](const json& x, const std::string& q) { a.host = as_string(x, q); });
    optional_member(e, p, "address",
                    [&](const json& x, const std::string& q) { a.address = as_string(x, q); });
    optional_member(e, p, "port", [&](const json& x, const std::string& q) {
      a.port = static_cast<std::uint16_t>(as_unsigned(x, q, 65535));
    });
    optional_member(e, p, "allowed",
                    [&](const json& x, const std::string& q) { a.allowed = as_bool(x, q); });
    optional_member(e, p, "reason",
                    [&](const json& x, const std::string& q) { a.reason = as_string(x, q); });
    optional_member(e, p, "bytes_up",
                    [&](const json& x, const std::string& q) { a.bytes_up = as_unsigned(x, q); });
    optional_member(e, p, "bytes_down",
                    [&](const json& x, const std::string& q) { a.bytes_down = as_unsigned(x, q); });
    optional_member(e, p, "method",
                    [&](const json& x, const std::string& q) { a.method = as_string(x, q); });
    optional_member(e, p, "path",
                    [&](const json& x, const std::string& q) { a.path = as_string(x, q); });
    optional_member(e, p, "rule",
                    [&](const json& x, const std::string& q) { a.rule = as_string(x, q); });
    return a;
  });
  optional_member(o, "", "egress_attempts_dropped", [&](const json& v, const std::string& p) {
    r.egress_attempts_dropped = static_cast<std::uint32_t>(as_unsigned(v, p, uint32_max));
  });
  optional_member(o, "", "violation", [&](const json& v, const std::string& p) {
    if (v.is_null()) {
      r.violation.reset();
    } else if (v.is_string()) {
      r.violation = v.get<std::string>();
    } else {
      fail(p, "expected a string or null");
    }
  });
  optional_member(o, "", "run_id",
                  [&](const json& v, const std::string& p) { r.run_id = as_string(v, p); });
  optional_member(o, "", "queue", [&](const json& v, const std::string& p) {
    if (v.is_null()) {
      r.queue.reset();
      return;
    }
    const json& q = as_object(v, p);
    check_known_fields(q, p, {"position", "length", "retry_after_ms"});
    queue_info qi;
    optional_member(q, p, "position", [&](const json& x, const std::string& k) {
      qi.position = static_cast<std::uint32_t>(as_unsigned(x, k, uint32_max));
    });
    optional_member(q, p, "length", [&](const json& x, const std::string& k) {
      qi.length = static_cast<std::uint32_t>(as_unsigned(x, k, uint32_max));
    });
    optional_member(q, p, "retry_after_ms", [&](const json& x, const std::string& k) {
      qi.retry_after = std::chrono::milliseconds(
          static_cast<std::int64_t>(as_unsigned(x, k, static_cast<std::uint64_t>(int64_max))));
    });
    r.queue = qi;
  });
  optional_member(o, "", "queue_wait_ms", [&](const json& v, const std::string& p) {
    r.queue_wait = std::chrono::milliseconds(
        static_cast<std::int64_t>(as_unsigned(v, p, static_cast<std::uint64_t>(int64_max))));
  });
  optional_member(o, "", "backend", [&](const json& v, const std::string& p) {
    r.backend = as_string(v, p);
    if (r.backend.size() > 128) fail(p, "longer than 128 bytes");
  });
  optional_member(o, "", "approval", [&](const json& v, const std::string& p) {
    if (v.is_null()) {
      r.approval.reset();
    } else {
      r.approval = detail::approval_from_json(v, p);
    }
  });
  // The signed execution receipt (sandbox/receipt.hpp), kept in its canonical form so that
  // encode(decode(x)) is stable; its signature is checked by `receipt_verifier`, not here.
  optional_member(o, "", "receipt", [&](const json& v, const std::string& p) {
    if (!v.is_null()) r.receipt = detail::canonical_receipt_document(v, p);
  });
  return r;
}

}  // namespace

boost::system::result<run_request, rejection> decode_run_request(std::string_view json_text,
                                                                 const decode_options& options) {
  return decode_with<run_request>(json_text, options,
                                  [](const json& doc) { return decode_request_body(doc); });
}

std::string encode(const run_request& r) {
  ordered_json j;
  j["v"] = r.v;
  if (!r.tool.empty()) j["tool"] = r.tool;
  if (r.tool.empty() || !r.runtime.empty()) j["runtime"] = r.runtime;
  if (r.tool.empty() || !r.source.empty()) j["source"] = r.source;
  if (r.std_in) j["stdin"] = *r.std_in;
  if (r.stdin_blob) j["stdin_blob"] = *r.stdin_blob;
  j["timeout_ms"] = static_cast<std::int64_t>(r.timeout.count());
  j["network"] = r.network;
  if (!r.egress.empty()) j["egress"] = r.egress;
  if (!r.secrets.empty()) j["secrets"] = r.secrets;
  j["files_in"] = ordered_json::array();
  for (const auto& f : r.files_in) {
    ordered_json e;
    e["name"] = f.name;
    e["blob"] = f.blob;
    j["files_in"].push_back(std::move(e));
  }
  j["files_out"] = {{"max_files", r.files_out.max_files}, {"max_bytes", r.files_out.max_bytes}};
  j["memory_limit_bytes"] = r.memory_limit_bytes;
  j["env"] = ordered_json::object();
  for (const auto& [name, value] : r.env) j["env"][name] = value;
  if (r.runtime_digest) j["runtime_digest"] = *r.runtime_digest;
  return detail::dump_compact(j);
}

boost::system::result<run_result, rejection> decode_run_result(std::string_view json_text,
                                                               const decode_options& options) {
  return decode_with<run_result>(json_text, options,
                                 [](const json& doc) { return decode_result_body(doc); });
}

std::string encode(const run_result& r) {
  ordered_json j;
  j["v"] = r.v;
  j["code"] = std::string(to_string(r.code));
  j["message"] = r.message;
  j["exit_code"] = detail::optional_int(r.exit_code);
  j["signal"] = detail::optional_int(r.signal);
  j["stdout"] = detail::encode_stream(r.std_out);
  j["stderr"] = detail::encode_stream(r.std_err);
  j["files_out"] = detail::encode_files_out(r.files_out);
  j["files_dropped"] = ordered_json::array();
  for (const auto& d : r.files_dropped) {
    ordered_json e;
    e["name_display"] = d.name_display;
    e["reason"] = std::string(to_string(d.reason));
    j["files_dropped"].push_back(std::move(e));
  }
  j["usage"] = detail::encode_usage(r.usage);
  j["oom_kills"] = r.oom_kills;
  j["timeout_clamped"] = r.timeout_clamped;
  j["memory_clamped"] = r.memory_clamped;
  j["timeout_ms"] = static_cast<std::int64_t>(r.timeout.count());
  j["memory_limit_bytes"] = r.memory_limit_bytes;
  j["isolation"] = std::string(to_string(r.isolation));
  j["runtime"] = {{"name", r.runtime.name}, {"digest", r.runtime.digest}};
  j["egress_attempts"] = detail::encode_egress_attempts(r.egress_attempts);
  j["egress_attempts_dropped"] = r.egress_attempts_dropped;
  j["violation"] = r.violation ? ordered_json(*r.violation) : ordered_json(nullptr);
  j["run_id"] = r.run_id;
  if (r.queue) {
    ordered_json q;
    q["position"] = r.queue->position;
    q["length"] = r.queue->length;
    q["retry_after_ms"] = r.queue->retry_after.count();
    j["queue"] = q;
  } else {
    j["queue"] = nullptr;
  }
  j["queue_wait_ms"] = r.queue_wait.count();
  j["backend"] = r.backend;
  j["approval"] = r.approval ? detail::approval_to_json(*r.approval) : ordered_json(nullptr);
  // Only when signed: results of hosts without receipts keep their form. A receipt that is
  // not JSON (set by hand, not by a signer) is written as null rather than thrown on.
  if (r.receipt) {
    auto doc = ordered_json::parse(*r.receipt, nullptr, /*allow_exceptions=*/false);
    j["receipt"] = doc.is_discarded() ? ordered_json(nullptr) : std::move(doc);
  }
  return detail::dump_compact(j);
}

boost::system::result<approval_request, rejection> decode_approval_request(
    std::string_view json_text, const decode_options& options) {
  return decode_with<approval_request>(json_text, options, [](const json& doc) {
    detail::check_version(as_object(doc, ""));
    // "v" is accepted at the top level of a standalone document, like every document's.
    json body = doc;
    body.erase("v");
    return detail::approval_from_json(body, "");
  });
}

std::string encode(const approval_request& a) {
  ordered_json j;
  j["v"] = protocol_version;
  const ordered_json body = detail::approval_to_json(a);
  for (const auto& [key, value] : body.items()) j[key] = value;
  return detail::dump_compact(j);
}

namespace detail {

nlohmann::ordered_json encode_stream(const stream_capture& s) {
  ordered_json j;
  j["summary"] = s.summary;
  j["blob"] = s.blob;
  j["bytes"] = s.bytes;
  j["total_bytes"] = s.total_bytes;
  j["truncated"] = s.truncated;
  return j;
}

nlohmann::ordered_json encode_files_out(const std::vector<output_file>& files) {
  auto out = ordered_json::array();
  for (const auto& f : files) {
    ordered_json e;
    e["name"] = f.name;
    e["blob"] = f.blob;
    e["bytes"] = f.bytes;
    out.push_back(std::move(e));
  }
  return out;
}

nlohmann::ordered_json optional_int(const std::optional<int>& v) {
  return v ? ordered_json(*v) : ordered_json(nullptr);
}

nlohmann::ordered_json encode_usage(const run_usage& u) {
  nlohmann::ordered_json usage;
  usage["setup_ms"] = static_cast<std::int64_t>(u.setup.count());
  usage["wall_ms"] = static_cast<std::int64_t>(u.wall.count());
  usage["cpu_ms"] = static_cast<std::int64_t>(u.cpu.count());
  usage["peak_memory_bytes"] = u.peak_memory_bytes;
  return usage;
}

nlohmann::ordered_json encode_egress_attempts(const std::vector<egress_attempt>& attempts) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& a : attempts) {
    nlohmann::ordered_json e;
    e["protocol"] = a.protocol;
    e["host"] = a.host;
    e["address"] = a.address;
    e["port"] = a.port;
    e["allowed"] = a.allowed;
    e["reason"] = a.reason;
    e["bytes_up"] = a.bytes_up;
    e["bytes_down"] = a.bytes_down;
    // Only for requests judged by L7 rules: other attempts encode as before.
    if (!a.method.empty()) e["method"] = a.method;
    if (!a.path.empty()) e["path"] = a.path;
    if (!a.rule.empty()) e["rule"] = a.rule;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace detail

// --- sessions ---------------------------------------------------------------------------

boost::system::result<session_request, rejection> decode_session_request(
    std::string_view json_text, const decode_options& options) {
  return decode_with<session_request>(json_text, options, [](const json& doc) {
    const json& o = as_object(doc, "");
    detail::check_version(o);
    check_known_fields(o, "", {"v", "tool", "max_lifetime_ms", "idle_timeout_ms"});
    session_request r;
    r.tool = as_string(require_member(o, "", "tool"), "tool");
    // Signed, so that a negative value gets "must be > 0" under its wire name (as the
    // schema's minimum 1 says) instead of a type error; the runtime checks the same for
    // requests built in C++.
    const auto positive_ms = [](const json& v, const std::string& p) {
      const std::int64_t ms = as_signed(v, p, int64_min, int64_max);
      if (ms <= 0) detail::fail(p, "must be > 0");
      return std::chrono::milliseconds(ms);
    };
    optional_member(o, "", "max_lifetime_ms", [&](const json& v, const std::string& p) {
      r.max_lifetime = positive_ms(v, p);
    });
    optional_member(o, "", "idle_timeout_ms", [&](const json& v, const std::string& p) {
      r.idle_timeout = positive_ms(v, p);
    });
    return r;
  });
}

std::string encode(const session_request& r) {
  ordered_json j;
  j["v"] = protocol_version;
  j["tool"] = r.tool;
  if (r.max_lifetime) j["max_lifetime_ms"] = static_cast<std::int64_t>(r.max_lifetime->count());
  if (r.idle_timeout) j["idle_timeout_ms"] = static_cast<std::int64_t>(r.idle_timeout->count());
  return detail::dump_compact(j);
}

boost::system::result<session_result, rejection> decode_session_result(
    std::string_view json_text, const decode_options& options) {
  return decode_with<session_result>(json_text, options, [](const json& doc) {
    const json& o = as_object(doc, "");
    detail::check_version(o);
    check_known_fields(o, "", {"v", "end", "result", "bytes_to_server", "bytes_from_server"});
    session_result r;
    const std::string end = as_string(require_member(o, "", "end"), "end");
    bool known = false;
    for (auto e : {session_end::closed, session_end::server_exited, session_end::idle_timeout,
                   session_end::max_lifetime, session_end::oom, session_end::seccomp_violation,
                   session_end::killed, session_end::failed, session_end::ticket_expired}) {
      if (to_string(e) == end) {
        r.end = e;
        known = true;
      }
    }
    if (!known) fail("end", "unknown session end " + detail::quote_for_message(end));
    try {
      r.result = decode_result_body(require_member(o, "", "result"));
    } catch (const detail::decode_error& e) {
      // The run_result's own paths are relative to it.
      fail("result", e.what());
    }
    r.bytes_to_server = as_unsigned(require_member(o, "", "bytes_to_server"), "bytes_to_server");
    r.bytes_from_server =
        as_unsigned(require_member(o, "", "bytes_from_server"), "bytes_from_server");
    return r;
  });
}

std::string encode(const session_result& r) {
  ordered_json j;
  j["v"] = protocol_version;
  j["end"] = std::string(to_string(r.end));
  j["result"] = ordered_json::parse(encode(r.result));
  j["bytes_to_server"] = r.bytes_to_server;
  j["bytes_from_server"] = r.bytes_from_server;
  return detail::dump_compact(j);
}

}  // namespace sandbox
