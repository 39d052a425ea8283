// A network run's certificate authority (run_ca.hpp), with OpenSSL 3's EVP and X509 calls.
#include "core/egress/run_ca.hpp"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <array>
#include <optional>

#include "sandbox/egress.hpp"

namespace sandbox::detail {
namespace {

constexpr long validity_seconds = 24L * 3600;
constexpr long backdate_seconds = 3600;  // tolerate a client clock slightly behind

evp_pkey_ptr new_p256_key() {
  return evp_pkey_ptr(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
}

/// A random positive 127-bit serial (RFC 5280 §4.1.2.2: at most 20 octets, positive).
bool set_random_serial(X509* cert) {
  std::array<unsigned char, 16> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) return false;
  bytes[0] &= 0x7f;
  bytes[0] |= 0x01;  // never zero
  BIGNUM* bn = BN_bin2bn(bytes.data(), static_cast<int>(bytes.size()), nullptr);
  if (bn == nullptr) return false;
  ASN1_INTEGER* serial = BN_to_ASN1_INTEGER(bn, nullptr);
  BN_free(bn);
  if (serial == nullptr) return false;
  const bool ok = X509_set_serialNumber(cert, serial) == 1;
  ASN1_INTEGER_free(serial);
  return ok;
}

bool add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

/// A certificate with `subject_cn`, `key`'s public key, the validity window and a random
/// serial; not yet signed.
x509_ptr new_cert(const std::string& subject_cn, EVP_PKEY* key) {
  x509_ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1 || !set_random_serial(cert.get()) ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -backdate_seconds) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), validity_seconds) == nullptr ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return nullptr;
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("agent-sandbox"), -1, -1,
                                 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>(subject_cn.c_str()), -1, -1,
                                 0) != 1) {
    return nullptr;
  }
  return cert;
}

std::string openssl_error(std::string_view what) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  std::array<char, 256> buf{};
  if (e != 0) ERR_error_string_n(e, buf.data(), buf.size());
  return std::string(what) + (e != 0 ? std::string(": ") + buf.data() : std::string());
}

}  // namespace

std::unique_ptr<run_ca> run_ca::create(std::string_view run_id,
                                       std::span<const std::string> domains, std::string& why) {
  if (domains.empty()) {
    why = "no domains to constrain the run's CA to";
    return nullptr;
  }
  std::unique_ptr<run_ca> ca(new run_ca());
  // 1. A fresh key, made here and never written anywhere.
  ca->key_ = new_p256_key();
  if (!ca->key_) {
    why = openssl_error("the run CA's key");
    return nullptr;
  }
  // 2. A self-signed CA certificate that may sign only leaves (pathlen 0), only for the
  //    run's approved names (name constraints, critical: RFC 5280 §4.2.1.10).
  std::string cn = "agent-sandbox run ";
  cn.append(run_id.substr(0, 40));
  ca->cert_ = new_cert(cn, ca->key_.get());
  if (!ca->cert_ ||
      X509_set_issuer_name(ca->cert_.get(), X509_get_subject_name(ca->cert_.get())) != 1) {
    why = openssl_error("the run CA's certificate");
    return nullptr;
  }
  std::string permitted = "critical";
  for (const auto& d : domains) {
    // "*.example.com" → the subtree example.com (which also permits the name itself).
    const std::string_view base =
        std::string_view(d).starts_with("*.") ? std::string_view(d).substr(2) : std::string_view(d);
    permitted += ",permitted;DNS:" + std::string(base);
  }
  if (!add_ext(ca->cert_.get(), ca->cert_.get(), NID_basic_constraints,
               "critical,CA:TRUE,pathlen:0") ||
      !add_ext(ca->cert_.get(), ca->cert_.get(), NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !add_ext(ca->cert_.get(), ca->cert_.get(), NID_subject_key_identifier, "hash") ||
      !add_ext(ca->cert_.get(), ca->cert_.get(), NID_name_constraints, permitted) ||
      X509_sign(ca->cert_.get(), ca->key_.get(), EVP_sha256()) == 0) {
    why = openssl_error("the run CA's certificate");
    return nullptr;
  }
  // 3. Its PEM: all the run ever gets.
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr || PEM_write_bio_X509(bio, ca->cert_.get()) != 1) {
    BIO_free(bio);
    why = openssl_error("the run CA's PEM");
    return nullptr;
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  ca->pem_.assign(data, static_cast<std::size_t>(n));
  BIO_free(bio);
  return ca;
}

const run_leaf* run_ca::leaf_for(std::string_view host) {
  auto name = canonical_egress_pattern(host);
  if (!name || name->starts_with("*.")) return nullptr;
  if (auto it = leaves_.find(*name); it != leaves_.end()) return &it->second;
  run_leaf leaf;
  leaf.key = new_p256_key();
  if (!leaf.key) return nullptr;
  leaf.cert = new_cert(*name, leaf.key.get());
  if (!leaf.cert ||
      X509_set_issuer_name(leaf.cert.get(), X509_get_subject_name(cert_.get())) != 1 ||
      !add_ext(leaf.cert.get(), cert_.get(), NID_basic_constraints, "critical,CA:FALSE") ||
      !add_ext(leaf.cert.get(), cert_.get(), NID_key_usage, "critical,digitalSignature") ||
      !add_ext(leaf.cert.get(), cert_.get(), NID_ext_key_usage, "serverAuth") ||
      !add_ext(leaf.cert.get(), cert_.get(), NID_subject_alt_name, "DNS:" + *name) ||
      !add_ext(leaf.cert.get(), cert_.get(), NID_authority_key_identifier, "keyid:always") ||
      X509_sign(leaf.cert.get(), key_.get(), EVP_sha256()) == 0) {
    ERR_clear_error();
    return nullptr;
  }
  return &leaves_.emplace(std::move(*name), std::move(leaf)).first->second;
}

}  // namespace sandbox::detail
