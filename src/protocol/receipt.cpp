// Execution receipts: Ed25519 signatures over a run's observed facts (sandbox/receipt.hpp).
#include "sandbox/receipt.hpp"

#include <limits>
#include <nlohmann/json.hpp>

#include "protocol/base64url.hpp"
#include "protocol/ed25519.hpp"
#include "protocol/json_strict.hpp"
#include "protocol/receipt_json.hpp"
#include "protocol/result_json.hpp"
#include "protocol/sha256.hpp"
#include "protocol/text_util.hpp"
#include "protocol/ticket_json.hpp"
#include "sandbox/json.hpp"
#include "sandbox/record.hpp"
#include "sandbox/signed_ticket.hpp"

namespace sandbox {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using namespace detail;

ordered_json stream_json(const receipt_stream& s) {
  ordered_json j;
  j["blob"] = s.blob;
  j["bytes"] = s.bytes;
  j["total_bytes"] = s.total_bytes;
  j["truncated"] = s.truncated;
  return j;
}

ordered_json claims_json(const receipt_claims& c) {
  ordered_json j;
  j["run_id"] = c.run_id;
  j["issued_at"] = format_rfc3339(c.issued_at);
  j["tenant"] = c.tenant;
  j["ticket_id"] = c.ticket_id;
  j["derived_from"] = c.derived_from;
  j["approval_sha256"] = c.approval_sha256 ? ordered_json(*c.approval_sha256) : ordered_json();
  j["request_sha256"] = c.request_sha256;
  j["code"] = std::string(to_string(c.code));
  j["exit_code"] = optional_int(c.exit_code);
  j["signal"] = optional_int(c.signal);
  j["backend"] = c.backend;
  j["isolation"] = std::string(to_string(c.isolation));
  j["runtime"] = {{"name", c.runtime.name}, {"digest", c.runtime.digest}};
  j["usage"] = encode_usage(c.usage);
  j["egress_attempts"] = encode_egress_attempts(c.egress_attempts);
  j["egress_attempts_dropped"] = c.egress_attempts_dropped;
  j["stdout"] = stream_json(c.std_out);
  j["stderr"] = stream_json(c.std_err);
  j["files_out"] = ordered_json::array();
  for (const auto& f : c.files_out) {
    ordered_json e;
    e["name"] = f.name;
    e["blob"] = f.blob;
    e["bytes"] = f.bytes;
    j["files_out"].push_back(std::move(e));
  }
  return j;
}

ordered_json signing_input(const receipt_claims& c, const std::string& kid) {
  ordered_json j;
  j["v"] = 1;
  j["receipt"] = claims_json(c);
  j["kid"] = kid;
  return j;
}

// --- strict decoding ----------------------------------------------------------------------

std::string req_string(const json& o, const std::string& path, std::string_view key) {
  return as_string(require_member(o, path, key), member_path(path, key));
}
std::uint64_t req_unsigned(const json& o, const std::string& path, std::string_view key,
                           std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
  return as_unsigned(require_member(o, path, key), member_path(path, key), max);
}
std::optional<int> req_optional_int(const json& o, const std::string& path, std::string_view key) {
  const json& v = require_member(o, path, key);
  const std::string p = member_path(path, key);
  if (v.is_null()) return std::nullopt;
  return static_cast<int>(
      as_signed(v, p, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}
std::chrono::milliseconds req_ms(const json& o, const std::string& path, std::string_view key) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(req_unsigned(
      o, path, key, static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))));
}
void check_blob(const std::string& id, const std::string& path, bool may_be_empty) {
  if (id.empty() && may_be_empty) return;
  if (!is_valid_blob_id(id)) fail(path, "invalid blob id " + quote_for_message(id));
}

receipt_stream stream_from(const json& o, const std::string& path, std::string_view key) {
  const std::string p = member_path(path, key);
  const json& s = as_object(require_member(o, path, key), p);
  check_known_fields(s, p, {"blob", "bytes", "total_bytes", "truncated"});
  receipt_stream r;
  r.blob = req_string(s, p, "blob");
  check_blob(r.blob, member_path(p, "blob"), true);
  r.bytes = req_unsigned(s, p, "bytes");
  r.total_bytes = req_unsigned(s, p, "total_bytes");
  r.truncated = as_bool(require_member(s, p, "truncated"), member_path(p, "truncated"));
  return r;
}

receipt_claims claims_from(const json& v, const std::string& path) {
  const json& o = as_object(v, path);
  check_known_fields(
      o, path,
      {"run_id", "issued_at", "tenant", "ticket_id", "derived_from", "approval_sha256",
       "request_sha256", "code", "exit_code", "signal", "backend", "isolation", "runtime", "usage",
       "egress_attempts", "egress_attempts_dropped", "stdout", "stderr", "files_out"});
  receipt_claims c;
  c.run_id = req_string(o, path, "run_id");
  {
    const std::string text = req_string(o, path, "issued_at");
    auto t = parse_rfc3339(text);
    if (!t) {
      fail(member_path(path, "issued_at"),
           "expected RFC 3339 UTC time 'YYYY-MM-DDTHH:MM:SSZ', got " + quote_for_message(text));
    }
    c.issued_at = *t;
  }
  c.tenant = req_string(o, path, "tenant");
  if (!is_valid_tenant(c.tenant)) {
    fail(member_path(path, "tenant"), "invalid tenant " + quote_for_message(c.tenant));
  }
  c.ticket_id = req_string(o, path, "ticket_id");
  if (!is_valid_ticket_id(c.ticket_id)) {
    fail(member_path(path, "ticket_id"), "invalid ticket id " + quote_for_message(c.ticket_id));
  }
  {
    const std::string p = member_path(path, "derived_from");
    const json& a = as_array(require_member(o, path, "derived_from"), p);
    if (a.size() > max_ticket_ancestors) fail(p, "too many ancestors");
    for (std::size_t i = 0; i < a.size(); ++i) {
      std::string id = as_string(a[i], index_path(p, i));
      if (!is_valid_ticket_id(id)) fail(index_path(p, i), "invalid ticket id");
      c.derived_from.push_back(std::move(id));
    }
  }
  {
    const json& a = require_member(o, path, "approval_sha256");
    if (!a.is_null()) {
      const std::string p = member_path(path, "approval_sha256");
      std::string hex = as_string(a, p);
      if (!is_hex_sha256(hex)) fail(p, "expected 64 lowercase hex digits or null");
      c.approval_sha256 = std::move(hex);
    }
  }
  c.request_sha256 = req_string(o, path, "request_sha256");
  if (!is_hex_sha256(c.request_sha256)) {
    fail(member_path(path, "request_sha256"), "expected 64 lowercase hex digits");
  }
  {
    const std::string text = req_string(o, path, "code");
    auto code = code_from_string(text);
    if (!code) fail(member_path(path, "code"), "unknown code " + quote_for_message(text));
    c.code = *code;
  }
  c.exit_code = req_optional_int(o, path, "exit_code");
  c.signal = req_optional_int(o, path, "signal");
  c.backend = req_string(o, path, "backend");
  {
    const std::string text = req_string(o, path, "isolation");
    auto iso = isolation_from_string(text);
    if (!iso) fail(member_path(path, "isolation"), "unknown level " + quote_for_message(text));
    c.isolation = *iso;
  }
  {
    const std::string p = member_path(path, "runtime");
    const json& rt = as_object(require_member(o, path, "runtime"), p);
    check_known_fields(rt, p, {"name", "digest"});
    c.runtime.name = req_string(rt, p, "name");
    c.runtime.digest = req_string(rt, p, "digest");
  }
  {
    const std::string p = member_path(path, "usage");
    const json& u = as_object(require_member(o, path, "usage"), p);
    check_known_fields(u, p, {"setup_ms", "wall_ms", "cpu_ms", "peak_memory_bytes"});
    c.usage.setup = req_ms(u, p, "setup_ms");
    c.usage.wall = req_ms(u, p, "wall_ms");
    c.usage.cpu = req_ms(u, p, "cpu_ms");
    c.usage.peak_memory_bytes = req_unsigned(u, p, "peak_memory_bytes");
  }
  {
    const std::string p = member_path(path, "egress_attempts");
    const json& a = as_array(require_member(o, path, "egress_attempts"), p);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string ep = index_path(p, i);
      const json& e = as_object(a[i], ep);
      check_known_fields(e, ep,
                         {"protocol", "host", "address", "port", "allowed", "reason", "bytes_up",
                          "bytes_down", "method", "path", "rule"});
      egress_attempt x;
      x.protocol = req_string(e, ep, "protocol");
      x.host = req_string(e, ep, "host");
      x.address = req_string(e, ep, "address");
      x.port = static_cast<std::uint16_t>(req_unsigned(e, ep, "port", 65535));
      x.allowed = as_bool(require_member(e, ep, "allowed"), member_path(ep, "allowed"));
      x.reason = req_string(e, ep, "reason");
      x.bytes_up = req_unsigned(e, ep, "bytes_up");
      x.bytes_down = req_unsigned(e, ep, "bytes_down");
      for (auto [key, out] : {std::pair{"method", &x.method}, std::pair{"path", &x.path},
                              std::pair{"rule", &x.rule}}) {
        if (const json* v = detail::find_member(e, key)) {
          *out = as_string(*v, member_path(ep, key));
          if (out->empty()) fail(member_path(ep, key), "must not be empty (leave it out)");
        }
      }
      c.egress_attempts.push_back(std::move(x));
    }
  }
  c.egress_attempts_dropped = static_cast<std::uint32_t>(
      req_unsigned(o, path, "egress_attempts_dropped", std::numeric_limits<std::uint32_t>::max()));
  c.std_out = stream_from(o, path, "stdout");
  c.std_err = stream_from(o, path, "stderr");
  {
    const std::string p = member_path(path, "files_out");
    const json& a = as_array(require_member(o, path, "files_out"), p);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string fp = index_path(p, i);
      const json& e = as_object(a[i], fp);
      check_known_fields(e, fp, {"name", "blob", "bytes"});
      output_file f;
      f.name = req_string(e, fp, "name");
      f.blob = req_string(e, fp, "blob");
      check_blob(f.blob, member_path(fp, "blob"), false);
      f.bytes = req_unsigned(e, fp, "bytes");
      c.files_out.push_back(std::move(f));
    }
  }
  return c;
}

/// A structurally decoded document (signature not checked).
struct parsed_receipt {
  receipt_claims claims;
  std::string kid;
  std::string sig;  // raw bytes
};

parsed_receipt parse_receipt(const json& doc, const std::string& path) {
  const json& o = as_object(doc, path);
  check_known_fields(o, path, {"v", "receipt", "kid", "sig"});
  const std::uint64_t v = req_unsigned(o, path, "v");
  if (v != 1) fail(member_path(path, "v"), "unsupported receipt version " + std::to_string(v));
  parsed_receipt r;
  r.claims = claims_from(require_member(o, path, "receipt"), member_path(path, "receipt"));
  r.kid = req_string(o, path, "kid");
  if (!is_valid_key_id(r.kid)) {
    fail(member_path(path, "kid"), "invalid key id " + quote_for_message(r.kid));
  }
  const std::string sig = req_string(o, path, "sig");
  auto raw = base64url_decode(sig);
  if (!raw || raw->size() != ed25519_signature_bytes) {
    fail(member_path(path, "sig"), "expected a base64url Ed25519 signature (86 characters)");
  }
  r.sig = std::move(*raw);
  return r;
}

std::string document_of(const parsed_receipt& r) {
  ordered_json j = signing_input(r.claims, r.kid);
  j["sig"] = base64url_encode(r.sig);
  return dump_compact(j);
}

}  // namespace

namespace detail {
std::string canonical_receipt_document(const json& v, const std::string& path) {
  return document_of(parse_receipt(v, path));
}
}  // namespace detail

receipt_claims make_receipt_claims(const run_request& request, const ticket& ticket,
                                   const run_result& result,
                                   std::chrono::system_clock::time_point now) {
  receipt_claims c;
  c.run_id = result.run_id;
  c.issued_at = std::chrono::floor<std::chrono::seconds>(now);
  c.tenant = ticket.tenant();
  c.ticket_id = ticket.id();
  c.derived_from = ticket.ancestors();
  if (ticket.approval()) c.approval_sha256 = sha256_hex(encode(*ticket.approval()));
  c.request_sha256 = request_digest(request);
  c.code = result.code;
  c.exit_code = result.exit_code;
  c.signal = result.signal;
  c.backend = result.backend;
  c.isolation = result.isolation;
  c.runtime = result.runtime;
  c.usage = result.usage;
  c.egress_attempts = result.egress_attempts;
  c.egress_attempts_dropped = result.egress_attempts_dropped;
  c.std_out = {result.std_out.blob, result.std_out.bytes, result.std_out.total_bytes,
               result.std_out.truncated};
  c.std_err = {result.std_err.blob, result.std_err.bytes, result.std_err.total_bytes,
               result.std_err.truncated};
  c.files_out = result.files_out;
  return c;
}

std::string encode(const receipt_claims& c) { return dump_compact(claims_json(c)); }

std::optional<std::string> receipt_mismatch(const receipt_claims& c, const run_result& r) {
  if (c.run_id != r.run_id) return "run_id";
  if (c.code != r.code) return "code";
  if (c.exit_code != r.exit_code) return "exit_code";
  if (c.signal != r.signal) return "signal";
  if (c.backend != r.backend) return "backend";
  if (c.isolation != r.isolation) return "isolation";
  if (c.runtime != r.runtime) return "runtime";
  if (c.usage != r.usage) return "usage";
  if (c.egress_attempts != r.egress_attempts) return "egress_attempts";
  if (c.egress_attempts_dropped != r.egress_attempts_dropped) return "egress_attempts_dropped";
  auto stream = [](const receipt_stream& s, const stream_capture& x) -> const char* {
    if (s.blob != x.blob) return "blob";
    if (s.bytes != x.bytes) return "bytes";
    if (s.total_bytes != x.total_bytes) return "total_bytes";
    if (s.truncated != x.truncated) return "truncated";
    return nullptr;
  };
  if (const char* f = stream(c.std_out, r.std_out)) return std::string("stdout.") + f;
  if (const char* f = stream(c.std_err, r.std_err)) return std::string("stderr.") + f;
  if (c.files_out.size() != r.files_out.size()) return "files_out";
  for (std::size_t i = 0; i < c.files_out.size(); ++i) {
    if (c.files_out[i] != r.files_out[i]) return "files_out[" + std::to_string(i) + "]";
  }
  return std::nullopt;
}

// --- signer -------------------------------------------------------------------------------

struct receipt_signer::impl : ed25519_signing_key {
  explicit impl(ed25519_signing_key k) : ed25519_signing_key(std::move(k)) {}
};

result<receipt_signer> receipt_signer::from_pem(std::string kid, std::string_view private_pem) {
  auto k = make_signing_key(std::move(kid), private_pem);
  if (!k) return k.error();
  return receipt_signer(std::make_shared<const impl>(std::move(*k)));
}

result<receipt_signer> receipt_signer::load(const std::filesystem::path& file, std::string kid) {
  auto k = load_signing_key(file, std::move(kid));
  if (!k) return k.error();
  return receipt_signer(std::make_shared<const impl>(std::move(*k)));
}

const std::string& receipt_signer::kid() const noexcept { return impl_->kid; }

std::string receipt_signer::public_key_pem() const {
  return public_pem_of(impl_->key.get()).value_or(std::string{});
}

result<std::string> receipt_signer::sign(const receipt_claims& claims) const {
  try {
    ordered_json j = signing_input(claims, impl_->kid);
    auto sig = ed25519_sign(impl_->key.get(), dump_compact(j));
    if (!sig) return make_error_code(errc::io_error);
    j["sig"] = base64url_encode(*sig);
    return dump_compact(j);
  } catch (const std::exception&) {
    return make_error_code(errc::io_error);
  }
}

// --- verifier -----------------------------------------------------------------------------

struct receipt_verifier::impl {
  ed25519_keyring keys;
};

receipt_verifier::receipt_verifier() : impl_(std::make_shared<impl>()) {}

result<void> receipt_verifier::add_key(std::string kid, std::string_view public_pem) {
  auto next = std::make_shared<impl>(*impl_);
  if (auto r = next->keys.add_key(std::move(kid), public_pem); !r) return r;
  impl_ = std::move(next);
  return {};
}

result<std::size_t> receipt_verifier::load_keys(const std::filesystem::path& file_or_dir) {
  auto next = std::make_shared<impl>(*impl_);
  auto n = next->keys.load_keys(file_or_dir);
  if (!n) return n.error();
  impl_ = std::move(next);
  return *n;
}

bool receipt_verifier::empty() const noexcept { return impl_->keys.empty(); }

boost::system::result<receipt_claims, rejection> receipt_verifier::verify(
    std::string_view document) const {
  auto refuse = [](std::string why) {
    return rejection{code::invalid_request, "receipt: " + std::move(why)};
  };
  if (document.size() > max_receipt_bytes) {
    return refuse("larger than " + std::to_string(max_receipt_bytes) + " bytes");
  }
  try {
    json doc;
    decode_options opt;
    opt.max_document_bytes = max_receipt_bytes;
    if (auto error = parse_strict(document, opt, doc)) return refuse(std::move(*error));
    parsed_receipt r = parse_receipt(doc, "");
    EVP_PKEY* key = impl_->keys.find(r.kid);
    if (key == nullptr) return refuse("unknown key id " + quote_for_message(r.kid));
    if (!ed25519_verify(key, dump_compact(signing_input(r.claims, r.kid)), r.sig)) {
      return refuse("bad signature (key " + quote_for_message(r.kid) + ")");
    }
    return std::move(r.claims);
  } catch (const decode_error& e) {
    return refuse(e.what());
  } catch (const std::exception&) {
    return refuse("malformed document");
  }
}

}  // namespace sandbox
