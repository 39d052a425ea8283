// A network run's own certificate authority (private to src/): what the egress proxy needs to
// terminate TLS for a run that uses a host-held secret (sandbox/secrets.hpp).
//
// Each such run gets a fresh CA: a new P-256 key made in this process, a self-signed
// certificate valid for one day, whose X.509 name constraints permit only the run's approved
// domains (so even a leaked CA could vouch for no other name). The key never leaves this
// object — only the certificate (PEM) is given to the run, for its trust store — and is freed
// with it when the run ends (OpenSSL clears private key material it frees). Leaf certificates
// for the names the run reaches are issued on demand, each with its own key, and kept for
// the run's life.
#pragma once

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace sandbox::detail {

struct evp_pkey_free {
  void operator()(EVP_PKEY* k) const noexcept { EVP_PKEY_free(k); }
};
struct x509_free {
  void operator()(X509* c) const noexcept { X509_free(c); }
};
using evp_pkey_ptr = std::unique_ptr<EVP_PKEY, evp_pkey_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;

/// A leaf certificate and its key, as issued by a `run_ca`.
struct run_leaf {
  x509_ptr cert;
  evp_pkey_ptr key;
};

/// One run's certificate authority. Not thread-safe: use it from the run's strand.
class run_ca {
 public:
  /**
   * Makes a fresh CA for run `run_id` whose name constraints permit exactly the names under
   * `domains` (canonical egress patterns: `api.example.com` permits that name, `*.example.com`
   * the names below example.com). Returns nullptr, with `why` set, when OpenSSL fails (no
   * entropy, no memory) or `domains` is empty.
   */
  static std::unique_ptr<run_ca> create(std::string_view run_id,
                                        std::span<const std::string> domains, std::string& why);

  /// The CA certificate, PEM: what the run's trust store gets.
  const std::string& cert_pem() const noexcept { return pem_; }
  /// The CA certificate itself (for tests and chain building).
  X509* cert() const noexcept { return cert_.get(); }

  /**
   * The leaf for host name `host` (a valid DNS name; case is ignored): subjectAltName DNS
   * `host`, extendedKeyUsage serverAuth, signed by this CA, valid like it. Issued once per
   * name and kept; nullptr when OpenSSL fails or `host` is not a valid name. The pointer
   * lives as long as this CA.
   */
  const run_leaf* leaf_for(std::string_view host);

  run_ca(const run_ca&) = delete;
  run_ca& operator=(const run_ca&) = delete;
  ~run_ca() = default;

 private:
  run_ca() = default;
  evp_pkey_ptr key_;
  x509_ptr cert_;
  std::string pem_;
  std::map<std::string, run_leaf, std::less<>> leaves_;
};

}  // namespace sandbox::detail
