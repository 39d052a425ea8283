// Signed ticket documents: Ed25519 through OpenSSL 3's EVP interface (sandbox/signed_ticket.hpp).
#include "sandbox/signed_ticket.hpp"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "protocol/base64url.hpp"
#include "protocol/ed25519.hpp"
#include "protocol/json_strict.hpp"
#include "protocol/text_util.hpp"
#include "protocol/ticket_json.hpp"

namespace sandbox {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;
using time_point = std::chrono::system_clock::time_point;

using detail::ed25519_sign;
using detail::ed25519_signature_bytes;
using detail::ed25519_verify;
using detail::kid_from_file_name;
using detail::pkey_ptr;
using detail::public_pem_of;
using detail::read_private_pem;

/// The signed document's JSON without `sig` (the signing input) — members in the
/// documented order — given its canonical parts.
ordered_json signing_input(const ordered_json& ticket_json, const ordered_json* parent,
                           const std::string& kid) {
  ordered_json j;
  j["v"] = protocol_version;
  j["ticket"] = ticket_json;
  if (parent != nullptr) j["parent"] = *parent;
  j["kid"] = kid;
  return j;
}

/// One verified link: its ticket and its canonical document (for the child's signing input).
struct verified_link {
  ticket t;
  ordered_json canonical;
};

/// A reason the document is refused; caught in `verify` and made an `action_denied`.
struct refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A structurally decoded document (nothing verified yet).
struct parsed_document {
  ticket t;
  std::string kid;
  std::string sig;                                        // raw signature bytes
  std::optional<std::pair<ticket, ordered_json>> parent;  // with its canonical document
};

std::string field(const std::string& path, std::string_view key) {
  return detail::member_path(path, key);
}

}  // namespace

// --- keys -------------------------------------------------------------------------------

result<ed25519_key_pem> generate_ed25519_key() {
  pkey_ptr k(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (!k) return make_error_code(errc::io_error);
  auto priv_text = detail::private_pem_of(k.get());
  auto pub_text = public_pem_of(k.get());
  if (!priv_text || !pub_text) return make_error_code(errc::io_error);
  return ed25519_key_pem{std::move(*priv_text), std::move(*pub_text)};
}

result<void> write_ed25519_key_files(const fs::path& dir, std::string_view kid) {
  if (!is_valid_key_id(kid)) return make_error_code(errc::invalid_argument);
  auto keys = generate_ed25519_key();
  if (!keys) return keys.error();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return detail::key_file_error(errno);
  const std::string priv_name = std::string(kid) + ".pem";
  const std::string pub_name = std::string(kid) + ".pub.pem";
  auto write_new = [&](const std::string& name, const std::string& text,
                       mode_t mode) -> boost::system::error_code {
    const int fd =
        ::openat(dfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return detail::key_file_error(errno);
    std::size_t off = 0;
    while (off < text.size()) {
      const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    const bool ok = off == text.size() && ::fchmod(fd, mode) == 0 && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok) {
      ::unlinkat(dfd, name.c_str(), 0);
      return make_error_code(errc::io_error);
    }
    return {};
  };
  boost::system::error_code ec = write_new(priv_name, keys->private_pem, 0600);
  if (!ec) {
    ec = write_new(pub_name, keys->public_pem, 0644);
    if (ec) ::unlinkat(dfd, priv_name.c_str(), 0);  // never leave half a pair
  }
  ::close(dfd);
  if (ec) return ec;
  return {};
}

// --- signer -----------------------------------------------------------------------------

struct ticket_signer::impl : detail::ed25519_signing_key {
  explicit impl(detail::ed25519_signing_key k) : detail::ed25519_signing_key(std::move(k)) {}
};

result<ticket_signer> ticket_signer::from_pem(std::string kid, std::string_view private_pem) {
  auto k = detail::make_signing_key(std::move(kid), private_pem);
  if (!k) return k.error();
  return ticket_signer(std::make_shared<const impl>(std::move(*k)));
}

result<ticket_signer> ticket_signer::load(const fs::path& private_key_file, std::string kid) {
  auto k = detail::load_signing_key(private_key_file, std::move(kid));
  if (!k) return k.error();
  return ticket_signer(std::make_shared<const impl>(std::move(*k)));
}

const std::string& ticket_signer::kid() const noexcept { return impl_->kid; }

std::string ticket_signer::public_key_pem() const {
  return public_pem_of(impl_->key.get()).value_or(std::string{});
}

namespace {

/// Signs `t` (with its parent's canonical document when derived) into a document.
result<std::string> sign_document(EVP_PKEY* key, const std::string& kid, const ticket& t,
                                  const ordered_json* parent) {
  try {
    ordered_json j = signing_input(detail::ticket_to_json(t), parent, kid);
    const auto sig = ed25519_sign(key, detail::dump_compact(j));
    if (!sig) return make_error_code(errc::io_error);
    j["sig"] = detail::base64url_encode(*sig);
    return detail::dump_compact(j);
  } catch (const std::exception&) {
    return make_error_code(errc::io_error);
  }
}

parsed_document parse_document(const json& doc, const std::string& path, std::size_t depth);

}  // namespace

result<std::string> ticket_signer::sign(const ticket& t) const {
  if (t.is_derived()) return make_error_code(errc::invalid_argument);
  return sign_document(impl_->key.get(), impl_->kid, t, nullptr);
}

result<std::string> ticket_signer::sign(const ticket& t, std::string_view parent_document) const {
  if (!t.is_derived() || parent_document.size() > max_signed_ticket_bytes) {
    return make_error_code(errc::invalid_argument);
  }
  try {
    json doc;
    decode_options opt;
    opt.max_document_bytes = max_signed_ticket_bytes;
    if (detail::parse_strict(parent_document, opt, doc))
      return make_error_code(errc::invalid_argument);
    parsed_document parent = parse_document(doc, "", t.ancestors().size() - 1);
    // The rules that do not depend on the time: judged as if now were the latest moment
    // the child's expiry allows (a child without expiry fails anyway). Whether it is too
    // long-lived or expired is for the verifier, at its time.
    const auto when =
        t.expires_at() ? *t.expires_at() - max_derived_ttl : std::chrono::system_clock::now();
    if (check_derivation(parent.t, t, when)) return make_error_code(errc::invalid_argument);
    ordered_json canonical =
        signing_input(detail::ticket_to_json(parent.t),
                      parent.parent ? &parent.parent->second : nullptr, parent.kid);
    canonical["sig"] = detail::base64url_encode(parent.sig);
    return sign_document(impl_->key.get(), impl_->kid, t, &canonical);
  } catch (const std::exception&) {
    return make_error_code(errc::invalid_argument);
  }
}

// --- verifier ---------------------------------------------------------------------------

struct ticket_verifier::impl {
  detail::ed25519_keyring keys;
};

ticket_verifier::ticket_verifier() : impl_(std::make_shared<impl>()) {}

result<void> ticket_verifier::add_key(std::string kid, std::string_view public_pem) {
  // Copy on write: copies of this verifier keep the keys they had.
  auto next = std::make_shared<impl>(*impl_);
  if (auto r = next->keys.add_key(std::move(kid), public_pem); !r) return r;
  impl_ = std::move(next);
  return {};
}

result<void> ticket_verifier::load_key(const fs::path& public_key_file, std::string kid) {
  auto next = std::make_shared<impl>(*impl_);
  if (auto r = next->keys.load_key(public_key_file, std::move(kid)); !r) return r;
  impl_ = std::move(next);
  return {};
}

result<std::size_t> ticket_verifier::load_keys(const fs::path& file_or_dir) {
  auto next = std::make_shared<impl>(*impl_);
  auto n = next->keys.load_keys(file_or_dir);
  if (!n) return n.error();
  impl_ = std::move(next);
  return *n;
}

bool ticket_verifier::empty() const noexcept { return impl_->keys.empty(); }

std::vector<std::string> ticket_verifier::key_ids() const { return impl_->keys.key_ids(); }

namespace {

// GCC 12 warns falsely (-Warray-bounds, -Wstringop-overread) on the move of the decoded
// signature into the result, inlined at -O2: it takes the string's 16-byte inline buffer
// for the whole 64-byte signature.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overread"
/// Decodes the document at `path` without checking signatures (`depth`: ancestors below it).
parsed_document parse_document(const json& doc, const std::string& path, std::size_t depth) {
  const json& o = detail::as_object(doc, path);
  detail::check_known_fields(o, path, {"v", "ticket", "parent", "kid", "sig"});
  {
    const json& v = detail::require_member(o, path, "v");
    if (v.type() != json::value_t::number_unsigned || v.get<std::uint64_t>() != protocol_version) {
      detail::fail(field(path, "v"), "unsupported version (expected the integer 1)");
    }
  }
  const std::string ticket_path = field(path, "ticket");
  ticket t = detail::ticket_from_json(detail::require_member(o, path, "ticket"), ticket_path);
  std::string kid = detail::as_string(detail::require_member(o, path, "kid"), field(path, "kid"));
  if (!is_valid_key_id(kid)) {
    detail::fail(field(path, "kid"), "not a key id: " + detail::quote_for_message(kid));
  }
  const std::string sig_text =
      detail::as_string(detail::require_member(o, path, "sig"), field(path, "sig"));
  auto sig = detail::base64url_decode(sig_text);
  if (!sig || sig->size() != ed25519_signature_bytes) {
    detail::fail(field(path, "sig"), "not a base64url Ed25519 signature (86 characters)");
  }
  parsed_document out{std::move(t), std::move(kid), std::move(*sig), std::nullopt};
  const json* parent = detail::find_member(o, "parent");
  if (out.t.is_derived() && parent == nullptr) {
    detail::fail(path, "a derived ticket needs its parent's signed document ('parent')");
  }
  if (!out.t.is_derived() && parent != nullptr) {
    detail::fail(field(path, "parent"), "only a derived ticket carries its parent's document");
  }
  if (parent != nullptr) {
    if (depth == 0 || depth > max_ticket_ancestors) {
      detail::fail(field(path, "parent"), "the chain is deeper than its ticket's derived_from");
    }
    parsed_document p = parse_document(*parent, field(path, "parent"), depth - 1);
    ordered_json canonical =
        signing_input(detail::ticket_to_json(p.t), p.parent ? &p.parent->second : nullptr, p.kid);
    canonical["sig"] = detail::base64url_encode(p.sig);
    out.parent.emplace(std::move(p.t), std::move(canonical));
  }
  return out;
}
#pragma GCC diagnostic pop

}  // namespace

boost::system::result<ticket, rejection> ticket_verifier::verify(std::string_view document,
                                                                 time_point now) const {
  auto deny = [](std::string why) {
    return rejection{code::action_denied, "signed ticket: " + std::move(why)};
  };
  if (document.size() > max_signed_ticket_bytes) {
    return deny("larger than " + std::to_string(max_signed_ticket_bytes) + " bytes");
  }
  try {
    json doc;
    decode_options opt;
    opt.max_document_bytes = max_signed_ticket_bytes;
    if (auto error = detail::parse_strict(document, opt, doc)) return deny(std::move(*error));
    const auto& keys = impl_->keys;

    // Verify from the root down, so that a refusal names the first bad link. Each link's
    // signing input embeds its parent's canonical document (signature included).
    std::function<verified_link(const json&, const std::string&, std::size_t)> check =
        [&](const json& d, const std::string& path, std::size_t depth) -> verified_link {
      const json& o = detail::as_object(d, path);
      std::optional<verified_link> parent;
      if (const json* p = detail::find_member(o, "parent");
          p != nullptr && p->is_object() && depth > 0 && depth <= max_ticket_ancestors) {
        parent = check(*p, field(path, "parent"), depth - 1);
      }
      // Structure (and, for the parent, the same structure again: cheap and bounded).
      parsed_document self = parse_document(d, path, depth);
      EVP_PKEY* const key = keys.find(self.kid);
      if (key == nullptr) {
        throw refused((path.empty() ? "" : path + ": ") + "unknown key id " +
                      detail::quote_for_message(self.kid));
      }
      const ordered_json input = signing_input(detail::ticket_to_json(self.t),
                                               parent ? &parent->canonical : nullptr, self.kid);
      if (!ed25519_verify(key, detail::dump_compact(input), self.sig)) {
        throw refused((path.empty() ? "" : path + ": ") + "bad signature (key " +
                      detail::quote_for_message(self.kid) + ")");
      }
      if (parent) {
        if (auto why = check_derivation(parent->t, self.t, now)) {
          throw refused((path.empty() ? "" : path + ": ") + "not a valid derivation: " + *why);
        }
      }
      if (self.t.is_expired(now)) {
        throw refused(path.empty() ? "expired" : path + ": expired");
      }
      ordered_json canonical = input;
      canonical["sig"] = detail::base64url_encode(self.sig);
      return verified_link{std::move(self.t), std::move(canonical)};
    };
    // The depth a document may have is its ticket's number of ancestors; `parse_document`
    // enforces it link by link.
    std::size_t depth = 0;
    if (doc.is_object()) {
      if (const json* t = detail::find_member(doc, "ticket"); t != nullptr && t->is_object()) {
        if (const json* from = detail::find_member(*t, "derived_from");
            from != nullptr && from->is_array()) {
          depth = std::min<std::size_t>(from->size(), max_ticket_ancestors + 1);
        }
      }
    }
    return check(doc, "", depth).t;
  } catch (const refused& e) {
    return deny(e.what());
  } catch (const detail::decode_error& e) {
    return deny(e.what());
  } catch (const std::bad_alloc&) {
    return deny("document too large to decode");
  } catch (const std::exception&) {
    return deny("malformed document");
  }
}

bool is_signed_ticket_document(std::string_view text) {
  try {
    json doc;
    if (detail::parse_strict(text, decode_options{}, doc)) return false;
    return doc.is_object() && detail::find_member(doc, "sig") != nullptr;
  } catch (...) {
    return false;
  }
}

}  // namespace sandbox
