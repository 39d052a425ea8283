// A network run's certificate authority (core/egress/run_ca.hpp): fresh per run, a CA that
// may sign only leaves and only for the run's approved names, and leaves that an ordinary
// client trusting just the CA certificate verifies for their name and no other.
#include "core/egress/run_ca.hpp"

#include <openssl/pem.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using namespace sandbox::detail;

namespace {

/// Verifies `leaf` against a store holding only `ca` (PEM, as the run gets it) for `host`;
/// returns the X509_V_ERR code (X509_V_OK: verified).
int verify(const std::string& ca_pem, X509* leaf, const std::string& host) {
  BIO* bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  REQUIRE(bio != nullptr);
  X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  REQUIRE(ca != nullptr);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx);
  X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
  X509_VERIFY_PARAM_set_purpose(param, X509_PURPOSE_SSL_SERVER);
  const int ok = X509_verify_cert(ctx);
  const int err = ok == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(ca);
  return err;
}

}  // namespace

TEST_CASE("run CA: leaves verify for their name against the CA certificate alone",
          "[egress][secrets]") {
  std::string why;
  const std::vector<std::string> domains = {"api.rates.example", "*.cdn.example"};
  auto ca = run_ca::create("r-0123", domains, why);
  REQUIRE(ca != nullptr);
  CHECK(why.empty());
  CHECK(ca->cert_pem().rfind("-----BEGIN CERTIFICATE-----", 0) == 0);
  CHECK(ca->cert_pem().find("PRIVATE KEY") == std::string::npos);
  CHECK(X509_check_ca(ca->cert()) == 1);

  const auto* leaf = ca->leaf_for("API.Rates.Example.");
  REQUIRE(leaf != nullptr);
  CHECK(verify(ca->cert_pem(), leaf->cert.get(), "api.rates.example") == X509_V_OK);
  CHECK(verify(ca->cert_pem(), leaf->cert.get(), "other.example") == X509_V_ERR_HOSTNAME_MISMATCH);
  CHECK(ca->leaf_for("api.rates.example") == leaf);  // issued once, kept
  const auto* under = ca->leaf_for("img.cdn.example");
  REQUIRE(under != nullptr);
  CHECK(verify(ca->cert_pem(), under->cert.get(), "img.cdn.example") == X509_V_OK);
  CHECK(X509_check_ca(leaf->cert.get()) == 0);  // a leaf cannot sign
  CHECK(ca->leaf_for("10.0.0.1") == nullptr);
  CHECK(ca->leaf_for("*.cdn.example") == nullptr);
  CHECK(ca->leaf_for("") == nullptr);
}

TEST_CASE("run CA: its name constraints refuse a leaf for any other name", "[egress][secrets]") {
  std::string why;
  auto ca = run_ca::create("r-1", std::vector<std::string>{"api.rates.example"}, why);
  REQUIRE(ca != nullptr);
  // The CA signs what it is asked; a client still refuses a name outside the constraints.
  const auto* evil = ca->leaf_for("bank.example");
  REQUIRE(evil != nullptr);
  CHECK(verify(ca->cert_pem(), evil->cert.get(), "bank.example") == X509_V_ERR_PERMITTED_VIOLATION);
}

TEST_CASE("run CA: every run gets its own key and certificate", "[egress][secrets]") {
  std::string why;
  const std::vector<std::string> domains = {"api.rates.example"};
  auto a = run_ca::create("r-a", domains, why);
  auto b = run_ca::create("r-a", domains, why);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a->cert_pem() != b->cert_pem());
  CHECK(X509_cmp(a->cert(), b->cert()) != 0);
  // A leaf of one run's CA is not trusted by a client holding another run's CA.
  const auto* leaf = a->leaf_for("api.rates.example");
  REQUIRE(leaf != nullptr);
  CHECK(verify(b->cert_pem(), leaf->cert.get(), "api.rates.example") != X509_V_OK);
  CHECK(run_ca::create("r", std::vector<std::string>{}, why) == nullptr);
  CHECK(!why.empty());
}
