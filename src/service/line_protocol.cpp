// The daemon's line protocol (service/line_protocol.hpp).
#include "service/line_protocol.hpp"

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <limits>

#include "protocol/base64url.hpp"
#include "protocol/display_text.hpp"
#include "protocol/json_strict.hpp"
#include "protocol/result_json.hpp"
#include "protocol/text_util.hpp"
#include "sandbox/json.hpp"

namespace sandbox::service {
namespace {

using json = nlohmann::json;
namespace detail = sandbox::detail;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

/// The answer to a request whose id is already in flight: with id null (see
/// `read_request_line`).
answer in_flight_answer(const std::string& id) {
  return {error_line(std::nullopt, "invalid_request",
                     fmt::format("id: a request with id {} is still in flight", quote_id(id)))};
}

/// A `result` answer with the rejected result, its message prefixed with the part of the
/// line it is about ("request: ...").
answer rejected(const std::string& id, sandbox::rejection rej, std::string_view prefix = {}) {
  rej.message.insert(0, prefix);
  return {result_line(id, sandbox::rejected_result(rej))};
}

answer invalid(const std::string& id, std::string_view message) {
  return {error_line(id, "invalid_request", message)};
}

/// `op` (the value of line member `name`) is an object holding exactly `fields`, every one
/// of them: throws decode_error naming the first fault, as the codec's decoders do.
void require_exactly(const json& op, const std::string& name,
                     std::initializer_list<std::string_view> fields) {
  detail::as_object(op, name);
  detail::check_known_fields(op, name, fields);
  for (auto f : fields) detail::require_member(op, name, f);
}

/// The operations named by a member beside `id`, in the order a line is matched against
/// them (a line naming two is refused by the known-fields check of the first).
struct op_name {
  std::string_view name;
  request_kind kind;
};
constexpr std::array<op_name, 11> named_ops{{
    {"session_open", request_kind::session_open},
    {"session_write", request_kind::session_write},
    {"session_close_stdin", request_kind::session_close_stdin},
    {"session_close", request_kind::session_close},
    {"service_stats", request_kind::service_stats},
    {"blob_put", request_kind::blob_put},
    {"blob_get", request_kind::blob_get},
    {"replay", request_kind::replay},
    {"interp_open", request_kind::interp_open},
    {"interp_execute", request_kind::interp_execute},
    {"interp_close", request_kind::interp_close},
}};

/// A member in milliseconds, > 0.
std::chrono::milliseconds positive_ms(const json& v, const std::string& path) {
  const std::int64_t ms = detail::as_signed(v, path, std::numeric_limits<std::int64_t>::min(),
                                            std::numeric_limits<std::int64_t>::max());
  if (ms <= 0) detail::fail(path, "must be > 0");
  return std::chrono::milliseconds(ms);
}

/// The envelope's id: present, a string of 1..max_id_bytes bytes; else the refusal.
std::variant<std::string, answer> read_id(const json& doc, const service_limits& limits) {
  const json* idv = detail::find_member(doc, "id");
  if (idv == nullptr)
    return answer{error_line(std::nullopt, "invalid_request", "id: required field is missing")};
  if (!idv->is_string())
    return answer{error_line(std::nullopt, "invalid_request", "id: expected a string")};
  const auto& s = idv->get_ref<const std::string&>();
  if (s.empty() || s.size() > limits.max_id_bytes) {
    return answer{error_line(std::nullopt, "invalid_request",
                             fmt::format("id: expected 1 to {} bytes", limits.max_id_bytes))};
  }
  return s;
}

}  // namespace

// --- reading ---------------------------------------------------------------------------------

std::optional<std::string> leading_id(std::string_view line, std::size_t max_id_bytes) {
  std::size_t i = 0;
  auto skip_ws = [&] {
    while (i < line.size() &&
           (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) {
      ++i;
    }
  };
  auto expect = [&](std::string_view token) {
    skip_ws();
    if (line.substr(i, token.size()) != token) return false;
    i += token.size();
    return true;
  };
  if (!expect("{") || !expect("\"id\"") || !expect(":") || !expect("\"")) return std::nullopt;
  const std::size_t start = i;
  while (i < line.size() && line[i] != '"') {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c == '\\' || c < 0x20 || i - start >= max_id_bytes) return std::nullopt;
    ++i;
  }
  if (i >= line.size() || i == start) return std::nullopt;
  std::string_view id = line.substr(start, i - start);
  if (!sandbox::is_valid_utf8(id)) return std::nullopt;
  return std::string(id);
}

std::variant<blank_line, request_line, answer> read_request_line(
    std::string_view line, const service_limits& limits, const std::set<std::string>& in_flight) {
  // Blank lines (and a trailing CR) are tolerated: they carry no request.
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
    line.remove_suffix(1);
  }
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return blank_line{};

  // An id read from a line that was not parsed is echoed unless it is in flight: the error
  // would be taken for that request's answer.
  auto echo = [&](std::optional<std::string> id) {
    return id && in_flight.count(*id) == 0 ? id : std::nullopt;
  };
  // Strict parse of the envelope. One level more than a request may have, since the
  // request sits one level down.
  json doc;
  sandbox::decode_options dopt;
  dopt.max_document_bytes = limits.max_line_bytes;
  dopt.max_depth = dopt.max_depth + 1;
  if (auto err = detail::parse_strict(line, dopt, doc)) {
    // Two ids: neither is the line's own.
    const bool two_ids = *err == "duplicate field 'id'";
    // The parser counts the line's own level; the documents in it (ticket, request) have
    // the documented limit, which is what the message names (docs/protocol.md, "Lines").
    if (err->rfind("nesting deeper than ", 0) == 0) {
      *err = fmt::format(
          "nesting deeper than {} levels (a document in the line; {} counting "
          "the line itself)",
          dopt.max_depth - 1, dopt.max_depth);
    }
    return answer{error_line(two_ids ? std::nullopt : echo(leading_id(line, limits.max_id_bytes)),
                             "invalid_request", *err)};
  }
  if (!doc.is_object())
    return answer{error_line(std::nullopt, "invalid_request", "expected a JSON object")};
  auto id = read_id(doc, limits);
  if (auto* refused = std::get_if<answer>(&id)) return std::move(*refused);
  request_line r;
  r.id = std::get<std::string>(std::move(id));
  // Before any other fault of the line: an answer under an id in flight would be taken for
  // that request's own (docs/protocol.md, "Errors").
  if (in_flight.count(r.id) != 0) return in_flight_answer(r.id);

  // `{"id":…, "<op>":{…}}`, nothing else beside the id; or a run.
  const op_name* op = nullptr;
  for (const auto& o : named_ops) {
    if (detail::find_member(doc, o.name) != nullptr) {
      op = &o;
      break;
    }
  }
  try {
    if (op != nullptr) {
      detail::check_known_fields(doc, "", {"id", op->name});
    } else {
      detail::check_known_fields(doc, "", {"id", "ticket", "request", "record"});
      if (const json* rec = detail::find_member(doc, "record")) {
        r.record = detail::as_bool(*rec, "record");
      }
      detail::require_member(doc, "", "ticket");
      detail::require_member(doc, "", "request");
    }
  } catch (const detail::decode_error& e) {
    return invalid(r.id, e.what());
  }
  if (op != nullptr) {
    r.kind = op->kind;
    r.body = std::move(doc[std::string(op->name)]);
  } else {
    r.kind = request_kind::run;
    r.body = std::move(doc);
  }
  return r;
}

boost::system::result<sandbox::ticket, sandbox::rejection> read_ticket(
    const json& ticket_doc, const sandbox::ticket_verifier& trusted_keys) {
  // Without trusted keys, the ticket is trusted as `sandboxctl run` trusts ticket files: the
  // socket's permissions decide who may send one. With them, only a signed document whose
  // whole chain verifies is a ticket.
  boost::system::result<sandbox::ticket, sandbox::rejection> ticket =
      sandbox::rejection{sandbox::code::internal, "internal error"};
  if (!trusted_keys.empty()) {
    if (!ticket_doc.is_object() || detail::find_member(ticket_doc, "sig") == nullptr) {
      ticket = sandbox::rejection{sandbox::code::action_denied,
                                  "unsigned ticket: this daemon accepts only signed tickets"};
    } else {
      ticket = trusted_keys.verify(dump(ticket_doc), std::chrono::system_clock::now());
    }
  } else {
    ticket = sandbox::ticket_issuer{}.decode(dump(ticket_doc));
  }
  if (!ticket) {
    auto rej = ticket.error();
    rej.message = "ticket: " + rej.message;
    return rej;
  }
  return ticket;
}

std::variant<run_line, answer> read_run(const request_line& line,
                                        const sandbox::ticket_verifier& trusted_keys) {
  auto ticket = read_ticket(line.body.at("ticket"), trusted_keys);
  if (!ticket) return rejected(line.id, ticket.error());
  auto request = sandbox::decode_run_request(dump(line.body.at("request")));
  if (!request) return rejected(line.id, request.error(), "request: ");
  return run_line{.ticket = std::move(*ticket), .request = std::move(*request)};
}

std::variant<blob_put_line, answer> read_blob_put(const request_line& line,
                                                  const service_limits& limits) {
  const json& op = line.body;
  auto too_large = [&] {
    return answer{error_line(
        line.id, "too_large",
        fmt::format("blob_put.data_b64: more than {} bytes", limits.max_blob_put_bytes))};
  };
  blob_put_line r;
  try {
    detail::as_object(op, "blob_put");
    detail::check_known_fields(op, "blob_put", {"tenant", "data_b64"});
    r.tenant =
        detail::as_string(detail::require_member(op, "blob_put", "tenant"), "blob_put.tenant");
    const auto& d = detail::require_member(op, "blob_put", "data_b64");
    if (!d.is_string()) detail::fail("blob_put.data_b64", "expected a string");
    const auto& b64 = d.get_ref<const std::string&>();
    // Judged before decoding: an oversized line is never decoded.
    if (b64.size() / 4 * 3 > limits.max_blob_put_bytes + 2) return too_large();
    auto decoded = detail::base64_decode(b64);
    if (!decoded) detail::fail("blob_put.data_b64", "not valid base64 (RFC 4648, padded)");
    r.data = std::move(*decoded);
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  if (!sandbox::is_valid_tenant(r.tenant)) {
    return invalid(line.id, "blob_put.tenant: invalid tenant name");
  }
  if (r.data.size() > limits.max_blob_put_bytes) return too_large();
  return r;
}

std::variant<blob_get_line, answer> read_blob_get(const request_line& line) {
  const json& op = line.body;
  blob_get_line r;
  try {
    detail::as_object(op, "blob_get");
    detail::check_known_fields(op, "blob_get", {"tenant", "blob"});
    r.tenant =
        detail::as_string(detail::require_member(op, "blob_get", "tenant"), "blob_get.tenant");
    r.blob = detail::as_string(detail::require_member(op, "blob_get", "blob"), "blob_get.blob");
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  if (!sandbox::is_valid_tenant(r.tenant)) {
    return invalid(line.id, "blob_get.tenant: invalid tenant name");
  }
  if (!sandbox::is_valid_blob_id(r.blob)) {
    return invalid(line.id, "blob_get.blob: expected sha256: and 64 lowercase hex digits");
  }
  return r;
}

std::variant<replay_line, answer> read_replay(const request_line& line,
                                              const sandbox::ticket_verifier& trusted_keys) {
  try {
    require_exactly(line.body, "replay", {"ticket", "record"});
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  auto ticket = read_ticket(line.body.at("ticket"), trusted_keys);
  if (!ticket) return rejected(line.id, ticket.error());
  auto record = sandbox::decode_run_record(dump(line.body.at("record")));
  if (!record) return rejected(line.id, record.error(), "replay.record: ");
  return replay_line{.ticket = std::move(*ticket), .record = std::move(*record)};
}

std::variant<session_open_line, answer> read_session_open(
    const request_line& line, const sandbox::ticket_verifier& trusted_keys) {
  try {
    require_exactly(line.body, "session_open", {"ticket", "request"});
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  auto ticket = read_ticket(line.body.at("ticket"), trusted_keys);
  if (!ticket) {
    return answer{error_line(line.id, sandbox::to_string(ticket.error().code),
                             "session_open." + ticket.error().message)};
  }
  auto request = sandbox::decode_session_request(dump(line.body.at("request")));
  if (!request) return invalid(line.id, "session_open.request: " + request.error().message);
  return session_open_line{.ticket = std::move(*ticket), .request = std::move(*request)};
}

std::variant<session_write_line, answer> read_session_write(const request_line& line) {
  const json& op = line.body;
  session_write_line r;
  try {
    detail::as_object(op, "session_write");
    detail::check_known_fields(op, "session_write", {"session", "data_b64", "text"});
    const json* b64 = detail::find_member(op, "data_b64");
    const json* text = detail::find_member(op, "text");
    if ((b64 == nullptr) == (text == nullptr)) {
      detail::fail("session_write", "expected exactly one of data_b64 and text");
    }
    if (text != nullptr) {
      r.data = detail::as_string(*text, "session_write.text");
    } else {
      if (!b64->is_string()) detail::fail("session_write.data_b64", "expected a string");
      auto decoded = detail::base64_decode(b64->get_ref<const std::string&>());
      if (!decoded) detail::fail("session_write.data_b64", "not valid base64 (RFC 4648, padded)");
      r.data = std::move(*decoded);
    }
    r.session = detail::as_string(detail::require_member(op, "session_write", "session"),
                                  "session_write.session");
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  return r;
}

std::variant<std::string, answer> read_session_ref(const request_line& line) {
  const std::string name =
      line.kind == request_kind::session_close ? "session_close" : "session_close_stdin";
  try {
    detail::as_object(line.body, name);
    detail::check_known_fields(line.body, name, {"session"});
    return detail::as_string(detail::require_member(line.body, name, "session"), name + ".session");
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
}

std::variant<interp_open_line, answer> read_interp_open(
    const request_line& line, const sandbox::ticket_verifier& trusted_keys) {
  const json& op = line.body;
  sandbox::interpreter_request request;
  try {
    detail::as_object(op, "interp_open");
    detail::check_known_fields(op, "interp_open",
                               {"ticket", "runtime", "max_lifetime_ms", "idle_timeout_ms"});
    detail::require_member(op, "interp_open", "ticket");
    request.runtime = detail::as_string(detail::require_member(op, "interp_open", "runtime"),
                                        "interp_open.runtime");
    if (const json* v = detail::find_member(op, "max_lifetime_ms")) {
      request.max_lifetime = positive_ms(*v, "interp_open.max_lifetime_ms");
    }
    if (const json* v = detail::find_member(op, "idle_timeout_ms")) {
      request.idle_timeout = positive_ms(*v, "interp_open.idle_timeout_ms");
    }
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  auto ticket = read_ticket(op.at("ticket"), trusted_keys);
  if (!ticket) {
    return answer{error_line(line.id, sandbox::to_string(ticket.error().code),
                             "interp_open." + ticket.error().message)};
  }
  return interp_open_line{.ticket = std::move(*ticket), .request = std::move(request)};
}

std::variant<interp_execute_line, answer> read_interp_execute(const request_line& line) {
  const json& op = line.body;
  interp_execute_line r;
  try {
    detail::as_object(op, "interp_execute");
    detail::check_known_fields(op, "interp_execute", {"session", "code", "timeout_ms", "files_in"});
    r.session = detail::as_string(detail::require_member(op, "interp_execute", "session"),
                                  "interp_execute.session");
    r.cell.code = detail::as_string(detail::require_member(op, "interp_execute", "code"),
                                    "interp_execute.code");
    if (const json* v = detail::find_member(op, "timeout_ms")) {
      r.cell.timeout = positive_ms(*v, "interp_execute.timeout_ms");
    }
    if (const json* v = detail::find_member(op, "files_in")) {
      const json& a = detail::as_array(*v, "interp_execute.files_in");
      for (std::size_t i = 0; i < a.size(); ++i) {
        const std::string p = detail::index_path("interp_execute.files_in", i);
        const json& f = detail::as_object(a[i], p);
        detail::check_known_fields(f, p, {"name", "blob"});
        r.cell.files_in.push_back(
            {.name = detail::as_string(detail::require_member(f, p, "name"), p + ".name"),
             .blob = detail::as_string(detail::require_member(f, p, "blob"), p + ".blob")});
      }
    }
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  return r;
}

std::variant<std::string, answer> read_interp_close(const request_line& line) {
  try {
    detail::as_object(line.body, "interp_close");
    detail::check_known_fields(line.body, "interp_close", {"session"});
    return detail::as_string(detail::require_member(line.body, "interp_close", "session"),
                             "interp_close.session");
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
}

std::optional<answer> read_service_stats(const request_line& line) {
  try {
    detail::as_object(line.body, "service_stats");
    detail::check_known_fields(line.body, "service_stats", {});
  } catch (const detail::decode_error& e) {
    return invalid(line.id, e.what());
  }
  return std::nullopt;
}

// --- writing ---------------------------------------------------------------------------------

std::string json_string(std::string_view s) { return dump(json(std::string(s))); }

std::string answer_line(const std::optional<std::string>& id, std::string_view key,
                        std::string_view value_json) {
  std::string s;
  s.reserve(value_json.size() + key.size() + (id ? id->size() : 4) + 16);
  s += R"({"id":)";
  s += id ? json_string(*id) : std::string("null");
  s += ",\"";
  s += key;
  s += "\":";
  s += value_json;
  s += "}\n";
  return s;
}

std::string error_line(const std::optional<std::string>& id, std::string_view code,
                       std::string_view message) {
  nlohmann::ordered_json e;
  e["code"] = std::string(code);
  e["message"] = std::string(message);
  return answer_line(id, "error", e.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string result_line(const std::string& id, const sandbox::run_result& r) {
  return answer_line(id, "result", sandbox::encode(r));
}

std::string result_with_record_line(const std::string& id, const sandbox::run_result& r,
                                    const sandbox::run_request& request,
                                    const sandbox::ticket& ticket) {
  std::string line = result_line(id, r);
  line.resize(line.size() - 2);  // "}\n"
  line += ",\"record\":";
  line += sandbox::encode(sandbox::make_run_record(request, ticket, r));
  line += "}\n";
  return line;
}

std::string encode_cell_result(const sandbox::cell_result& r) {
  nlohmann::ordered_json j;
  j["code"] = std::string(sandbox::to_string(r.code));
  j["state"] = std::string(sandbox::to_string(r.state));
  j["session_ended"] = r.session_ended;
  j["message"] = r.message;
  j["error"] = r.error;
  j["value"] = r.value;
  j["value_truncated"] = r.value_truncated;
  j["stdout"] = detail::encode_stream(r.std_out);
  j["stderr"] = detail::encode_stream(r.std_err);
  j["files_out"] = detail::encode_files_out(r.files_out);
  j["outputs"] = nlohmann::ordered_json::array();
  for (const auto& o : r.outputs) {
    nlohmann::ordered_json e;
    e["mime_type"] = o.mime_type;
    e["blob"] = o.blob;
    e["bytes"] = o.bytes;
    j["outputs"].push_back(std::move(e));
  }
  j["outputs_truncated"] = r.outputs_truncated;
  j["frames_dropped"] = r.frames_dropped;
  j["exit_code"] = detail::optional_int(r.exit_code);
  j["signal"] = detail::optional_int(r.signal);
  j["wall_ms"] = static_cast<std::int64_t>(r.usage.wall.count());
  j["cpu_ms"] = static_cast<std::int64_t>(r.usage.cpu.count());
  j["peak_memory_bytes"] = r.usage.peak_memory_bytes;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string line_too_long_line(const std::optional<std::string>& id, std::size_t max_line_bytes) {
  return error_line(id, "invalid_request",
                    fmt::format("line is longer than {} bytes", max_line_bytes));
}

std::string session_stdout_event(std::string_view session, std::string_view bytes) {
  return R"({"session":)" + json_string(session) + R"(,"stdout":")" + detail::base64_encode(bytes) +
         "\"}\n";
}

std::string session_eof_event(std::string_view session) {
  return R"({"session":)" + json_string(session) + R"(,"eof":true})" + "\n";
}

std::string quote_id(std::string_view id) {
  return detail::escape_format_chars(detail::quote_for_message(id, 64));
}

}  // namespace sandbox::service
