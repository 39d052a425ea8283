// Run records, their strict JSON codec, and replay (sandbox/record.hpp).
#include "sandbox/record.hpp"

#include <nlohmann/json.hpp>

#include "protocol/json_strict.hpp"
#include "protocol/sha256.hpp"
#include "protocol/text_util.hpp"
#include "protocol/ticket_json.hpp"

namespace sandbox {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using namespace detail;

/// A blob of the result, with the field that names it ("result.files_out[1].blob").
struct named_blob {
  std::string field;
  std::string id;
  std::uint64_t bytes = 0;
};

std::vector<named_blob> result_blobs(const run_result& r) {
  std::vector<named_blob> out;
  if (!r.std_out.blob.empty())
    out.push_back({"result.stdout.blob", r.std_out.blob, r.std_out.bytes});
  if (!r.std_err.blob.empty())
    out.push_back({"result.stderr.blob", r.std_err.blob, r.std_err.bytes});
  for (std::size_t i = 0; i < r.files_out.size(); ++i) {
    out.push_back({"result.files_out[" + std::to_string(i) + "].blob", r.files_out[i].blob,
                   r.files_out[i].bytes});
  }
  return out;
}

run_record decode_record_body(const json& doc, const decode_options& options) {
  const json& o = as_object(doc, "");
  check_known_fields(o, "",
                     {"v", "record_id", "tenant", "request_sha256", "ticket_id", "derived_from",
                      "runtime", "created_at", "result"});
  run_record r;
  {
    const std::uint64_t version = as_unsigned(require_member(o, "", "v"), "v");
    if (version != run_record_version) {
      fail("v", "unsupported run record version " + std::to_string(version) + " (supported: 1)");
    }
  }
  r.record_id = as_string(require_member(o, "", "record_id"), "record_id");
  r.tenant = as_string(require_member(o, "", "tenant"), "tenant");
  if (!is_valid_tenant(r.tenant)) fail("tenant", "invalid tenant " + quote_for_message(r.tenant));
  r.request_sha256 = as_string(require_member(o, "", "request_sha256"), "request_sha256");
  if (!is_hex_sha256(r.request_sha256)) {
    fail("request_sha256",
         "expected 64 lowercase hex digits, got " + quote_for_message(r.request_sha256));
  }
  r.ticket_id = as_string(require_member(o, "", "ticket_id"), "ticket_id");
  if (!is_valid_ticket_id(r.ticket_id)) {
    fail("ticket_id", "invalid ticket id " + quote_for_message(r.ticket_id));
  }
  {
    const json& a = as_array(require_member(o, "", "derived_from"), "derived_from");
    if (a.size() > max_ticket_ancestors) {
      fail("derived_from", "more than " + std::to_string(max_ticket_ancestors) + " ancestors");
    }
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string p = index_path("derived_from", i);
      std::string id = as_string(a[i], p);
      if (!is_valid_ticket_id(id)) fail(p, "invalid ticket id " + quote_for_message(id));
      r.derived_from.push_back(std::move(id));
    }
  }
  {
    const json& rt = as_object(require_member(o, "", "runtime"), "runtime");
    check_known_fields(rt, "runtime", {"name", "digest"});
    r.runtime.name = as_string(require_member(rt, "runtime", "name"), "runtime.name");
    r.runtime.digest = as_string(require_member(rt, "runtime", "digest"), "runtime.digest");
  }
  {
    const std::string text = as_string(require_member(o, "", "created_at"), "created_at");
    auto t = parse_rfc3339(text);
    if (!t) {
      fail("created_at",
           "expected RFC 3339 UTC time 'YYYY-MM-DDTHH:MM:SSZ', got " + quote_for_message(text));
    }
    r.created_at = *t;
  }
  {
    const json& res = as_object(require_member(o, "", "result"), "result");
    auto decoded = decode_run_result(res.dump(), options);
    if (!decoded) throw decode_error("result." + decoded.error().message);
    r.result = std::move(*decoded);
  }
  // Consistency: a record whose parts disagree was edited.
  if (r.record_id.empty()) fail("record_id", "must not be empty");
  if (r.record_id != r.result.run_id) fail("record_id", "does not match result.run_id");
  if (r.runtime != r.result.runtime) fail("runtime", "does not match result.runtime");
  for (const auto& b : result_blobs(r.result)) {
    if (!is_valid_blob_id(b.id)) fail(b.field, "invalid blob id " + quote_for_message(b.id));
  }
  return r;
}

}  // namespace

std::string request_digest(const run_request& request) {
  return detail::sha256_hex(encode(request));
}

run_record make_run_record(const run_request& request, const ticket& ticket,
                           const run_result& result) {
  run_record r;
  r.record_id = result.run_id;
  r.tenant = ticket.tenant();
  r.request_sha256 = request_digest(request);
  r.ticket_id = ticket.id();
  r.derived_from = ticket.ancestors();
  r.runtime = result.runtime;
  r.created_at = std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
  r.result = result;
  return r;
}

std::string encode(const run_record& r) {
  ordered_json j;
  j["v"] = r.v;
  j["record_id"] = r.record_id;
  j["tenant"] = r.tenant;
  j["request_sha256"] = r.request_sha256;
  j["ticket_id"] = r.ticket_id;
  j["derived_from"] = r.derived_from;
  j["runtime"] = {{"name", r.runtime.name}, {"digest", r.runtime.digest}};
  j["created_at"] = format_rfc3339(r.created_at);
  // The result exactly as the protocol encodes it (every field, the same member order).
  j["result"] = ordered_json::parse(encode(r.result));
  return dump_compact(j);
}

boost::system::result<run_record, rejection> decode_run_record(std::string_view text,
                                                               const decode_options& options) {
  try {
    json doc;
    if (auto error = parse_strict(text, options, doc)) {
      return rejection{code::invalid_request, "run record: " + *error};
    }
    return decode_record_body(doc, options);
  } catch (const decode_error& e) {
    return rejection{code::invalid_request, std::string("run record: ") + e.what()};
  } catch (const std::bad_alloc&) {
    return rejection{code::invalid_request, "run record: document too large to decode"};
  } catch (const std::exception&) {
    return rejection{code::invalid_request, "run record: malformed document"};
  }
}

std::vector<std::string> record_blobs(const run_record& r) {
  std::vector<std::string> out;
  for (auto& b : result_blobs(r.result)) {
    if (std::find(out.begin(), out.end(), b.id) == out.end()) out.push_back(std::move(b.id));
  }
  return out;
}

boost::system::result<run_result, rejection> replay_run(const blob_store& blobs,
                                                        const run_record& record,
                                                        const ticket& ticket) {
  if (ticket.tenant() != record.tenant) {
    return rejection{code::action_denied,
                     "replay: tenant mismatch (the record belongs to "
                     "another tenant than the ticket)"};
  }
  if (record.record_id.empty() || record.record_id != record.result.run_id ||
      record.runtime != record.result.runtime) {
    return rejection{code::invalid_request,
                     "replay: record_id or runtime does not match the "
                     "record's result"};
  }
  for (const auto& b : result_blobs(record.result)) {
    if (!is_valid_blob_id(b.id)) {
      return rejection{code::invalid_request, "replay: " + b.field + ": invalid blob id"};
    }
    auto size = blobs.size(record.tenant, b.id);
    if (!size) {
      if (size.error() == make_error_code(errc::not_found)) {
        return rejection{code::blob_not_found, "replay: " + b.field + " " + b.id + " not found"};
      }
      return rejection{code::internal, "replay: the blob store failed"};
    }
    if (*size != b.bytes) {
      return rejection{code::invalid_request,
                       "replay: " + b.field + " " + b.id + " does not match the record's size"};
    }
  }
  return record.result;
}

result<void> pin_record(blob_store& blobs, const run_record& record) {
  for (const auto& id : record_blobs(record)) {
    if (auto r = blobs.pin(record.tenant, id, record.record_id); !r) return r.error();
  }
  return {};
}

result<void> unpin_record(blob_store& blobs, const run_record& record) {
  for (const auto& id : record_blobs(record)) {
    if (auto r = blobs.unpin(record.tenant, id, record.record_id); !r) return r.error();
  }
  return {};
}

}  // namespace sandbox
