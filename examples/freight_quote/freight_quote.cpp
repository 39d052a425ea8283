// freight_quote: the walkthrough of agent-sandbox, end to end, with real sandboxes.
//
// An agent was asked for a shipping quote and wrote two Python snippets. The host:
//
//   1. creates a runtime (default options: the process backend, the image and blob stores;
//      with --isolation container or gvisor also that level's OCI backend: crun or runc,
//      runsc; with --isolation microvm the microVM backend: a QEMU microvm per run),
//   2. mints a ticket for tenant "acme" that grants `code.execute` and *not* `code.network`,
//   3. puts a rate table (CSV) and the shipment (JSON) into the blob store,
//   4. runs snippet 1, which reads both through $SANDBOX_INPUT_DIR, prices the shipment,
//      prints a summary and writes quote.json into $SANDBOX_OUTPUT_DIR; the host fetches
//      quote.json back from the blob store by its blob id,
//   5. runs snippet 2, which tries to fetch live rates over HTTPS: the run has no network,
//      so it ends `network_disabled` and the DNS lookup it tried is listed,
//   6. (--isolation container, gvisor or microvm) asks again, this time *for* the network
//      and with the rates API's key: the request names two domains (the rates API, and
//      the customer portal the quote is posted to) and the host-held secret "rates-api".
//      The ticket grants the secret but not `code.network`, so the runtime asks the host's
//      approver. The example's approver prints what a human would confirm (domains, the secret's
//      name, where it may go and in which header — never its value —, timeout, digests of the
//      source and inputs, isolation, image), approves with a derived ticket, and the run fetches
//      live rates over HTTPS from a local test server that answers 401 without the key. The program
//      holds only a placeholder; the run's egress proxy terminates its TLS and puts the real key
//      into the Authorization header to the rates API only. The snippet also sends the placeholder
//      to the portal: refused `secret_misuse`, listed in the result's egress attempts, and the
//      portal never sees the request. Both names are pinned to the server on 127.0.0.1, whose
//      certificate a test CA made here signs (the host trusts it for origins:
//      `egress.origin_ca_file`); the key's value is random, in a 0600 file of the example's
//      temporary directory. (At microvm the guest has no network device: the program's proxy
//      connections reach the same host-side proxy through the VM's virtio-serial tunnel.)
//   7. prints the span the runtime recorded for each run.
//
// Exit status: 0 when snippet 1 ended `ok` with the expected quote, snippet 2 ended
// `network_disabled` with its DNS attempt listed and (container, gvisor, microvm) snippet 3
// was approved once with the secret shown, got the live rates with the key the rates server
// saw exactly once, had its attempt on the portal refused `secret_misuse`, and the key's
// value is in nothing the walkthrough printed or got back (streams, result, spans); the
// process level runs no network run, so run 3 is not asked there. 1 otherwise, or when this
// host cannot run the process backend (the backends' statuses are printed); 2 for bad
// options. With --skip-unavailable, an unavailable backend or image exits 77 instead
// (CTest's "skipped"), unless CI=true or SANDBOX_MUST_WORK=1.
//
//   sudo tools/run-example.sh                 # set-up, build, then this program
//   build/dev/bin/freight_quote --help
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/program_options.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <streambuf>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

#include "sandbox/sandbox.hpp"

namespace asio = boost::asio;
namespace po = boost::program_options;
using namespace std::chrono_literals;

namespace {

constexpr int exit_ok = 0;
constexpr int exit_fail = 1;
constexpr int exit_usage = 2;
constexpr int exit_skip = 77;

constexpr const char* tenant = "acme";

// --- the data the agent works on -------------------------------------------------------

// Contract rates per lane, mode and weight bracket (chargeable kg in [min_kg, max_kg); an
// empty max_kg means no upper bound). Chargeable weight is the larger of the actual weight
// and volume × volumetric_kg_per_m3 (rounded up). Fuel surcharge applies to freight + base.
constexpr const char* rate_table_csv =
    "origin,destination,mode,min_kg,max_kg,rate_usd_per_kg,base_fee_usd,volumetric_kg_per_m3,"
    "fuel_surcharge_pct,transit_days\n"
    "NLRTM,USCHI,ocean,0,1000,0.92,180.00,1000,12,24\n"
    "NLRTM,USCHI,ocean,1000,,0.71,180.00,1000,12,24\n"
    "NLRTM,USCHI,air,0,500,4.10,95.00,167,18,4\n"
    "NLRTM,USCHI,air,500,,3.45,95.00,167,18,4\n"
    "DEHAM,USNYC,ocean,0,1000,0.85,160.00,1000,12,18\n"
    "DEHAM,USNYC,ocean,1000,,0.66,160.00,1000,12,18\n"
    "DEHAM,USNYC,air,0,,3.90,90.00,167,18,3\n";

constexpr const char* shipment_json =
    R"({"reference":"PO-7781","origin":"NLRTM","destination":"USCHI",)"
    R"("weight_kg":1240,"volume_m3":"4.2","deliver_within_days":30})";

// What the snippet must find for this table and shipment:
//   ocean: chargeable max(1240, ceil(4.2 × 1000)) = 4200 kg, bracket ≥ 1000 kg at 0.71
//          → freight 2982.00 + base 180.00 = 3162.00, fuel 12 % = 379.44, total 3541.44
//   air:   chargeable max(1240, ceil(4.2 × 167 = 701.4)) = 1240 kg, bracket ≥ 500 kg at 3.45
//          → freight 4278.00 + base 95.00 = 4373.00, fuel 18 % = 787.14, total 5160.14
// Both arrive within 30 days; ocean is cheaper.
constexpr const char* expected_mode = "ocean";
constexpr const char* expected_total = "3541.44";

// Snippet 1, as the model wrote it: price the shipment from the rate table.
constexpr const char* quote_snippet = R"py(import csv, json, os, sys
from decimal import Decimal, ROUND_CEILING, ROUND_HALF_UP

inp, out = os.environ["SANDBOX_INPUT_DIR"], os.environ["SANDBOX_OUTPUT_DIR"]
with open(os.path.join(inp, "shipment.json")) as f:
    shipment = json.load(f)
with open(os.path.join(inp, "rates.csv"), newline="") as f:
    rows = list(csv.DictReader(f))

CENT = Decimal("0.01")
weight = Decimal(shipment["weight_kg"])
volume = Decimal(shipment["volume_m3"])
lane = (shipment["origin"], shipment["destination"])

def price(mode):
    brackets = [r for r in rows if (r["origin"], r["destination"], r["mode"]) == lane + (mode,)]
    if not brackets:
        return None
    volumetric = (volume * Decimal(brackets[0]["volumetric_kg_per_m3"])).to_integral_value(ROUND_CEILING)
    chargeable = max(weight, volumetric)
    for r in brackets:
        if Decimal(r["min_kg"]) <= chargeable and (not r["max_kg"] or chargeable < Decimal(r["max_kg"])):
            break
    else:
        return None
    freight = (chargeable * Decimal(r["rate_usd_per_kg"])).quantize(CENT, ROUND_HALF_UP)
    base = Decimal(r["base_fee_usd"]).quantize(CENT)
    fuel = ((freight + base) * Decimal(r["fuel_surcharge_pct"]) / 100).quantize(CENT, ROUND_HALF_UP)
    return {"mode": mode, "chargeable_kg": str(chargeable), "rate_usd_per_kg": r["rate_usd_per_kg"],
            "freight_usd": str(freight), "base_fee_usd": str(base), "fuel_surcharge_usd": str(fuel),
            "total_usd": str(freight + base + fuel), "transit_days": int(r["transit_days"])}

options = [q for q in map(price, sorted({r["mode"] for r in rows})) if q]
in_time = [q for q in options if q["transit_days"] <= shipment["deliver_within_days"]]
if not in_time:
    sys.exit(f"no service on {lane[0]}-{lane[1]} arrives within {shipment['deliver_within_days']} days")
best = min(in_time, key=lambda q: Decimal(q["total_usd"]))
quote = {"reference": shipment["reference"], "lane": f"{lane[0]}-{lane[1]}", "currency": "USD",
         "selected": best, "alternatives": [q for q in options if q is not best]}
with open(os.path.join(out, "quote.json"), "w") as f:
    json.dump(quote, f, indent=2)
print(f"{quote['reference']} {quote['lane']}: {best['mode']}, {best['chargeable_kg']} kg chargeable, "
      f"USD {best['total_usd']}, {best['transit_days']} days")
for q in quote["alternatives"]:
    print(f"  alternative: {q['mode']}, USD {q['total_usd']}, {q['transit_days']} days")
)py";

// Snippet 2: the model tries to get live spot rates instead. The ticket has no code.network.
constexpr const char* live_rates_snippet = R"py(import json, urllib.request
with urllib.request.urlopen("https://api.freight-rates.example/v1/live", timeout=5) as r:
    print(json.load(r))
)py";

// Snippet 3: the same wish, asked properly: the request names the domains and the rates
// API's key, and the host's approver decides. The program holds only the key's placeholder
// (SANDBOX_SECRET_RATES_API); like careless generated code, it also hands the key to the
// portal it posts the quote to. {rates_url} and {portal_url} are the local test server's
// addresses under the pinned names.
constexpr const char* approved_live_rates_snippet =
    R"py(import json, os, urllib.error, urllib.request
key = os.environ["SANDBOX_SECRET_RATES_API"]
print(f"the key as the program sees it: {key}")
req = urllib.request.Request("{rates_url}", headers={"Authorization": "Bearer " + key})
with urllib.request.urlopen(req, timeout=10) as r:
    live = json.load(r)
print(f"live rate NLRTM-USCHI ocean: USD {live['ocean_usd_per_kg']}/kg (as of {live['as_of']})")
post = urllib.request.Request("{portal_url}", data=json.dumps(live).encode(),
                              headers={"Authorization": "Bearer " + key,
                                       "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(post, timeout=10) as r:
        print(f"portal: HTTP {r.status}")
except urllib.error.HTTPError as e:
    refusal = json.load(e)
    print(f"portal: HTTP {e.code} {refusal['reason']}: {refusal['advice']}")
)py";

// The live-rates server's one document.
constexpr const char* live_rates_json =
    R"({"lane":"NLRTM-USCHI","ocean_usd_per_kg":0.69,"air_usd_per_kg":3.38,"as_of":"2026-11-30T06:00:00Z"})";
constexpr const char* live_rates_host = "api.freight-rates.example";
// The customer portal the quote is posted to: approved for run 3, but not a name the rates
// API's key may go to.
constexpr const char* portal_host = "portal.acme-shipping.example";
// The host-held secret: the rates API's key, sent only to the rates API, in this header.
constexpr const char* secret_name = "rates-api";
constexpr const char* secret_header = "Authorization: Bearer {value}";

// --- the example's temporary directory: the key's file and the test CA ------------------

// A directory of our own (0700) for the secret's file and the test CA's certificate,
// removed when the walkthrough ends.
class temp_dir {
 public:
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "freight_quote-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + tmpl);
    }
    path_ = tmpl;
  }
  ~temp_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A fresh random key, as a rates API would issue one ("rk_live_" and 24 hex digits).
std::string random_key() {
  std::random_device rd;
  std::string key = "rk_live_";
  for (int i = 0; i < 24; ++i) key += "0123456789abcdef"[rd() % 16];
  return key;
}

// Writes `content` to `path`, created anew with mode 0600 (as the host's secrets must be:
// no group or other permission).
void write_private_file(const std::filesystem::path& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + path.string());
  const auto n = ::write(fd, content.data(), content.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(content.size())) {
    throw std::system_error(err, std::generic_category(), "write " + path.string());
  }
}

// --- the test rates server's certificate: a test CA and a leaf it signs ----------------

struct evp_pkey_free_t {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct x509_free_t {
  void operator()(X509* c) const { X509_free(c); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, evp_pkey_free_t>;
using cert_ptr = std::unique_ptr<X509, x509_free_t>;

// A one-day certificate for `cn` with `key`'s public key and `extensions` (OpenSSL's
// configuration syntax), signed by `issuer` (null: itself) with `issuer_key`.
cert_ptr make_cert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                   const std::vector<std::pair<int, std::string>>& extensions) {
  cert_ptr cert(X509_new());
  if (!cert) throw std::runtime_error("X509_new failed");
  static long serial = 1;
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(cert.get()), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer == nullptr ? cert.get() : issuer;
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  for (const auto& [nid, value] : extensions) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (ext == nullptr) throw std::runtime_error("bad certificate extension " + value);
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) {
    throw std::runtime_error("X509_sign failed");
  }
  return cert;
}

std::string pem_of(X509* cert) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(n));
}

// The test server's TLS context: a leaf for both pinned names, signed by a fresh test CA
// whose certificate is written to `ca_file` (the host trusts it for origins).
asio::ssl::context make_server_tls(const std::filesystem::path& ca_file) {
  pkey_ptr ca_key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  pkey_ptr leaf_key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!ca_key || !leaf_key) throw std::runtime_error("cannot make the test keys");
  auto ca = make_cert("freight_quote test CA", ca_key.get(), nullptr, ca_key.get(),
                      {{NID_basic_constraints, "critical,CA:TRUE"},
                       {NID_key_usage, "critical,keyCertSign"},
                       {NID_subject_key_identifier, "hash"}});
  auto leaf = make_cert(
      live_rates_host, leaf_key.get(), ca.get(), ca_key.get(),
      {{NID_basic_constraints, "critical,CA:FALSE"},
       {NID_ext_key_usage, "serverAuth"},
       {NID_subject_alt_name, std::string("DNS:") + live_rates_host + ",DNS:" + portal_host},
       {NID_authority_key_identifier, "keyid:always"}});
  std::ofstream(ca_file) << pem_of(ca.get());
  asio::ssl::context tls(asio::ssl::context::tls_server);
  if (SSL_CTX_use_certificate(tls.native_handle(), leaf.get()) != 1 ||
      SSL_CTX_use_PrivateKey(tls.native_handle(), leaf_key.get()) != 1) {
    throw std::runtime_error("cannot load the test server's certificate");
  }
  return tls;
}

// --- the local test server standing in for the rates API (and the portal) ---------------

// What the server was asked: one entry per request it read.
struct served_request {
  std::string host;           // the Host header, without the port
  std::string target;         // the request target
  std::string authorization;  // the Authorization header as it arrived ("" when absent)
  unsigned status = 0;        // what it answered
};

// A log line for `r` that says whether the key arrived, never the key itself (the
// walkthrough's output must not hold it).
std::string describe(const served_request& r, const std::string& key) {
  const std::string auth = r.authorization.empty()              ? "absent"
                           : r.authorization == "Bearer " + key ? "Bearer <the rates-api key>"
                                                                : "'" + r.authorization + "'";
  return r.host + " " + r.target + ", Authorization " + auth + " -> " + std::to_string(r.status);
}

// A tiny HTTPS/1.1 server on 127.0.0.1: one request per connection. GET /v1/live on the
// rates API's name with `Authorization: Bearer <key>` gets the live rates; anything else a
// 401 (no or wrong key) or a 404. It logs each request it reads (`log`).
class rates_server {
 public:
  rates_server(asio::io_context& io, asio::ssl::context& tls, std::string key)
      : tls_(tls), acceptor_(io, {asio::ip::make_address("127.0.0.1"), 0}), key_(std::move(key)) {}
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }
  const std::vector<served_request>& log() const { return log_; }

  asio::awaitable<void> serve() {
    for (;;) {
      auto [ec, sock] = co_await acceptor_.async_accept(asio::as_tuple(asio::use_awaitable));
      if (ec) co_return;  // closed
      auto stream = std::make_shared<tls_stream>(std::move(sock), tls_);
      connections_.push_back(stream);
      asio::co_spawn(acceptor_.get_executor(), answer(stream), asio::detached);
    }
  }

  // Stops accepting and ends the connections still open (lets io.run() return).
  void close() {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    for (const auto& weak : connections_) {
      if (auto s = weak.lock()) s->lowest_layer().close(ignored);
    }
  }

 private:
  using tls_stream = asio::ssl::stream<asio::ip::tcp::socket>;

  asio::awaitable<void> answer(std::shared_ptr<tls_stream> stream) {
    auto token = asio::as_tuple(asio::use_awaitable);
    if (auto [ec] = co_await stream->async_handshake(asio::ssl::stream_base::server, token); ec) {
      co_return;
    }
    std::string head;
    char buf[1024];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 16384) {
      auto [ec, n] = co_await stream->async_read_some(asio::buffer(buf), token);
      if (ec) co_return;  // closed before a whole request: nothing was asked
      head.append(buf, n);
    }
    served_request req;
    const auto line_end = head.find("\r\n");
    const std::string line = head.substr(0, line_end);
    const auto sp1 = line.find(' '), sp2 = line.rfind(' ');
    if (sp1 != std::string::npos && sp2 > sp1) req.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    for (auto at = line_end + 2; at < head.size();) {
      const auto end = head.find("\r\n", at);
      if (end == std::string::npos || end == at) break;
      const std::string field = head.substr(at, end - at);
      at = end + 2;
      const auto colon = field.find(':');
      if (colon == std::string::npos) continue;
      std::string name = field.substr(0, colon), value = field.substr(colon + 1);
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      if (name == "host") req.host = value.substr(0, value.rfind(':'));
      if (name == "authorization") req.authorization = value;
    }
    std::string body;
    if (req.host != live_rates_host || req.target != "/v1/live") {
      req.status = 404;
      body = R"({"error":"not found"})";
    } else if (req.authorization != "Bearer " + key_) {
      req.status = 401;
      body = R"({"error":"missing or wrong API key"})";
    } else {
      req.status = 200;
      body = live_rates_json;
    }
    log_.push_back(req);
    const std::string resp =
        "HTTP/1.1 " + std::to_string(req.status) +
        (req.status == 200   ? " OK"
         : req.status == 401 ? " Unauthorized"
                             : " Not Found") +
        "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\nConnection: close\r\n\r\n" + body;
    co_await asio::async_write(*stream, asio::buffer(resp), token);
    boost::system::error_code ignored;
    stream->lowest_layer().close(ignored);
  }

  asio::ssl::context& tls_;
  asio::ip::tcp::acceptor acceptor_;
  std::string key_;
  std::vector<served_request> log_;
  std::vector<std::weak_ptr<tls_stream>> connections_;
};

// Everything the walkthrough prints also lands in `text`, so that the end can check that
// the key's value is in none of it.
class tee_buf final : public std::streambuf {
 public:
  explicit tee_buf(std::streambuf* out) : out_(out) {}
  const std::string& text() const { return text_; }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    text_.push_back(static_cast<char>(c));
    return out_->sputc(static_cast<char>(c));
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    text_.append(s, static_cast<std::size_t>(n));
    return out_->sputn(s, n);
  }
  int sync() override { return out_->pubsync(); }

 private:
  std::streambuf* out_;
  std::string text_;
};

// --- a span sink that keeps the spans ---------------------------------------------------

class collecting_span_sink final : public sandbox::span_sink {
 public:
  void record(const sandbox::span& s) noexcept override {
    try {
      std::lock_guard lk(mu_);
      spans_.push_back(s);
    } catch (...) {  // record() must not throw; a lost span only shows as missing below
    }
  }
  std::vector<sandbox::span> spans() const {
    std::lock_guard lk(mu_);
    return spans_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<sandbox::span> spans_;
};

// --- printing ---------------------------------------------------------------------------

std::string indent(const std::string& text, const std::string& prefix = "    ") {
  std::string out;
  bool at_line_start = true;
  for (char c : text) {
    if (at_line_start) out += prefix;
    out += c;
    at_line_start = c == '\n';
  }
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

void print_usage(const sandbox::run_result& r) {
  std::cout << "  usage:     setup " << r.usage.setup.count() << " ms, wall "
            << r.usage.wall.count() << " ms, cpu " << r.usage.cpu.count() << " ms, peak memory "
            << r.usage.peak_memory_bytes << " bytes (limit " << r.memory_limit_bytes << ", timeout "
            << r.timeout.count() << " ms)\n";
}

void print_head(const char* title, const sandbox::run_result& r) {
  std::cout << "\n== " << title << "\n";
  std::cout << "  code:      " << sandbox::to_string(r.code)
            << (r.message.empty() ? "" : " (" + r.message + ")") << "\n";
  if (r.exit_code) std::cout << "  exit code: " << *r.exit_code << "\n";
  if (r.signal) std::cout << "  signal:    " << *r.signal << "\n";
  std::cout << "  runtime:   " << r.runtime.name << " " << r.runtime.digest << " ("
            << sandbox::to_string(r.isolation) << " isolation, run " << r.run_id << ")\n";
}

std::string attribute_text(const std::variant<std::string, std::int64_t, bool>& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  return std::get<bool>(v) ? "true" : "false";
}

// --- the checks that decide the exit status --------------------------------------------

struct checker {
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    if (!ok) {
      std::cout << "  CHECK FAILED: " << what << "\n";
      ++failures;
    }
  }
};

bool must_work() {
  const char* ci = std::getenv("CI");
  const char* mw = std::getenv("SANDBOX_MUST_WORK");
  return (ci != nullptr && std::string(ci) == "true") || (mw != nullptr && std::string(mw) == "1");
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

struct outcome {
  sandbox::run_result quote;
  sandbox::run_result live;
  std::optional<sandbox::run_result> approved;  ///< run 3 (container, gvisor, microvm)
  std::optional<std::string> quote_blob_error;
  std::string quote_file;
};

// The agent's tool calls, one after the other, on the runtime's executor. `approved_request`
// is empty at the process level (network runs need container or stronger).
asio::awaitable<void> walkthrough(sandbox::runtime& rt, const sandbox::ticket& ticket,
                                  const sandbox::run_request& quote_request,
                                  const sandbox::run_request& live_request,
                                  std::optional<sandbox::run_request> approved_request,
                                  rates_server& server, outcome& out) {
  auto token = asio::as_tuple(asio::use_awaitable);
  auto [ec1, quote] = co_await rt.async_run(quote_request, ticket, token);
  if (ec1) quote.message += " (operation: " + ec1.message() + ")";
  out.quote = std::move(quote);
  auto [ec2, live] = co_await rt.async_run(live_request, ticket, token);
  if (ec2) live.message += " (operation: " + ec2.message() + ")";
  out.live = std::move(live);
  if (approved_request) {
    auto [ec3, approved] = co_await rt.async_run(*approved_request, ticket, token);
    if (ec3) approved.message += " (operation: " + ec3.message() + ")";
    out.approved = std::move(approved);
  }
  server.close();  // lets io.run() return
}

int run_example(sandbox::runtime_options options, sandbox::isolation level, bool skip_unavailable) {
  // 1. The runtime, on our own io_context: handlers and the coroutine run on this thread.
  asio::io_context io;
  // What we print is also kept, to look for the key in it at the end.
  tee_buf printed(std::cout.rdbuf());
  struct restore {
    std::streambuf* old;
    ~restore() { std::cout.rdbuf(old); }
  } restore_cout{std::cout.rdbuf(&printed)};
  // The rates API's key: a random value in a file only we can read. The host's `secrets`
  // configuration names the file (never the value), where the key may go and in which
  // header; the runtime reads it once, when it is created.
  temp_dir tmp;
  const std::string key = random_key();
  write_private_file(tmp.path() / secret_name, key + "\n");
  options.secrets[secret_name] = {.file = (tmp.path() / secret_name).string(),
                                  .domains = {live_rates_host},
                                  .header = secret_header};
  // The stand-in rates API (HTTPS, its certificate from a test CA the host trusts for
  // origins), and the host's egress settings that make its names reachable (pinned names:
  // resolved names never reach loopback addresses).
  auto server_tls = make_server_tls(tmp.path() / "test-ca.pem");
  rates_server server(io, server_tls, key);
  const std::uint16_t rates_port = server.port();
  options.egress.pinned_hosts[live_rates_host] = {"127.0.0.1"};
  options.egress.pinned_hosts[portal_host] = {"127.0.0.1"};
  options.egress.connect_ports = {443, rates_port};
  options.egress.origin_ca_file = (tmp.path() / "test-ca.pem").string();
  // The approver: what a human would see on the confirmation page, then a derived ticket.
  // (A real host would show the page and wait; this one approves what it printed.)
  int approvals_asked = 0;
  std::vector<std::string> secrets_shown;        // the secrets' names the approval page showed
  std::optional<sandbox::ticket> parent_ticket;  // set below, before any run
  sandbox::ticket_issuer issuer;                 // kept by the code that authorizes tool calls
  options.approver = sandbox::make_callback_approver(
      [&](sandbox::approval_request req, sandbox::approval_callback answer) {
        ++approvals_asked;
        std::cout << "\n== approval asked: may this run reach the network?\n"
                  << "  ticket:    " << req.ticket_id << " (tenant " << req.tenant << ")\n"
                  << "  domains:  ";
        for (const auto& d : req.domains) std::cout << " " << d;
        std::cout << "\n  timeout:   " << req.timeout.count() << " ms, memory "
                  << req.memory_limit_bytes << " bytes\n"
                  << "  source:    sha256 " << req.source_sha256 << " (" << req.source_bytes
                  << " bytes)\n";
        for (const auto& f : req.files_in) {
          std::cout << "  input:     " << f.name << " sha256 " << f.sha256 << " (" << f.bytes
                    << " bytes)\n";
        }
        for (const auto& [name, value] : req.env) {
          std::cout << "  env:       " << name << "=" << value << "\n";
        }
        for (const auto& sec : req.secrets) {  // where a key would go, never its value
          std::cout << "  secret:    " << sec.name << ", sent only to";
          for (const auto& d : sec.domains) std::cout << " " << d;
          std::cout << " in its " << sec.header << " header (the program holds a placeholder)\n";
          secrets_shown.push_back(sec.name);
        }
        std::cout << "  isolation: " << sandbox::to_string(req.isolation) << "\n"
                  << "  image:     " << req.runtime.name << " " << req.runtime.digest << "\n";
        auto derived = issuer.derive(*parent_ticket, req);
        if (!derived) {
          std::cout << "  cannot derive a ticket: " << derived.error().message() << "\n";
          return answer(sandbox::approval_decision::deny("no derived ticket"));
        }
        std::cout << "  approved:  derived ticket " << derived->id() << "\n";
        answer(sandbox::approval_decision::approve(*derived));
      });
  auto rt = sandbox::runtime::create(io.get_executor(), options);
  if (!rt) {
    std::cout << "cannot create the runtime: " << rt.error().message() << "\n";
    return exit_fail;
  }
  bool process_ok = false;  // the level asked for
  for (const auto& b : rt->backends()) {
    if (b.isolation == level && b.registered) process_ok = true;
  }
  auto catalog = rt->catalog();
  auto python = catalog.runtimes.find("python3");
  bool image_ok = python != catalog.runtimes.end() && python->second.has_value();
  if (!process_ok || !image_ok) {
    std::cout << "this host cannot run the walkthrough:\n";
    for (const auto& b : rt->backends()) {
      std::cout << "  backend " << sandbox::to_string(b.isolation) << " (" << b.name
                << "): " << (b.registered ? "registered" : "refused: " + b.reason) << "\n";
    }
    if (!image_ok) {
      std::cout << "  runtime image python3: not installed (sudo tools/setup.sh, or "
                   "sandboxctl image build python3)\n";
    }
    if (skip_unavailable && !must_work()) {
      std::cout << "skipped (exit 77)\n";
      return exit_skip;
    }
    return exit_fail;
  }
  std::cout << "runtime: " << sandbox::to_string(level) << " backend registered; python3 image "
            << *python->second << "\n";

  // Each snippet's timeout. A microvm guest without KVM runs under QEMU's TCG (emulated CPU),
  // where Python's start and its ssl import alone take seconds: its runs get more time.
  const std::chrono::milliseconds snippet_timeout =
      level == sandbox::isolation::microvm ? 30000ms : 5000ms;

  // 2. The ticket: code.execute for tenant acme, at the chosen isolation, no network grant;
  //    it grants the rates API's key by name (a run may ask for it, and with the network
  //    only by approval).
  sandbox::ticket_spec spec{.id = "freight-quote-1",
                            .tenant = tenant,
                            .isolation = level,
                            .max_timeout = snippet_timeout + 3000ms,
                            .max_memory_bytes = 512ULL << 20};
  spec.secrets = {secret_name};
  auto ticket = issuer.issue(spec);
  if (!ticket) {
    std::cout << "cannot issue the ticket: " << ticket.error().message() << "\n";
    return exit_fail;
  }
  std::cout << "ticket:  " << sandbox::encode(*ticket) << "\n";
  parent_ticket = *ticket;

  // 3. Inputs go in as blobs of the ticket's tenant; the request names only blob ids.
  auto rates = rt->blobs()->put(tenant, rate_table_csv);
  auto shipment = rt->blobs()->put(tenant, shipment_json);
  if (!rates || !shipment) {
    std::cout << "cannot store the inputs: "
              << (!rates ? rates.error() : shipment.error()).message() << "\n";
    return exit_fail;
  }
  std::cout << "inputs:  rates.csv " << *rates << "\n         shipment.json " << *shipment << "\n";

  sandbox::run_request quote_request{
      .runtime = "python3",
      .source = quote_snippet,
      .timeout = snippet_timeout,
      .files_in = {{.name = "rates.csv", .blob = *rates},
                   {.name = "shipment.json", .blob = *shipment}},
      .files_out = {.max_files = 4, .max_bytes = 64 * 1024},
  };
  sandbox::run_request live_request{
      .runtime = "python3", .source = live_rates_snippet, .timeout = snippet_timeout};

  // Run 3 asks for the rates API and the portal, and for the rates API's key, with the rate
  // table as input (its digest is on the confirmation page).
  std::optional<sandbox::run_request> approved_request;
  const std::string port_text = ":" + std::to_string(rates_port);
  const std::string rates_url = "https://" + std::string(live_rates_host) + port_text + "/v1/live";
  const std::string portal_url = "https://" + std::string(portal_host) + port_text + "/quotes";
  // Run 3 is asked at the levels that run network runs (container and stronger).
  const bool network_level = sandbox::is_at_least(level, sandbox::isolation::container);
  if (network_level) {
    std::string src = approved_live_rates_snippet;
    src.replace(src.find("{rates_url}"), 11, rates_url);
    src.replace(src.find("{portal_url}"), 12, portal_url);
    approved_request = sandbox::run_request{.runtime = "python3",
                                            .source = src,
                                            .timeout = snippet_timeout + 3000ms,
                                            .network = true,
                                            .egress = {live_rates_host, portal_host},
                                            .files_in = {{.name = "rates.csv", .blob = *rates}}};
    approved_request->secrets = {secret_name};
  }

  // 4, 5 and 6. The runs, asynchronously, on our io_context (with the rates server).
  outcome out;
  asio::co_spawn(io, server.serve(), asio::detached);
  asio::co_spawn(
      io, walkthrough(*rt, *ticket, quote_request, live_request, approved_request, server, out),
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run();

  checker check;

  // Run 1: the quote.
  const auto& q = out.quote;
  print_head("run 1: price the shipment from the rate table", q);
  std::cout << "  stdout:\n" << indent(q.std_out.summary);
  if (!q.std_err.summary.empty()) std::cout << "  stderr:\n" << indent(q.std_err.summary);
  nlohmann::json quote_doc;
  for (const auto& f : q.files_out) {
    std::cout << "  output:    " << f.name << " " << f.blob << " (" << f.bytes << " bytes)\n";
    if (f.name != "quote.json") continue;
    auto bytes = rt->blobs()->get(tenant, f.blob);  // fetched by blob id, never by path
    if (!bytes) {
      std::cout << "  cannot fetch quote.json: " << bytes.error().message() << "\n";
      continue;
    }
    std::cout << "  quote.json (from the blob store):\n" << indent(*bytes);
    quote_doc = nlohmann::json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
  }
  print_usage(q);
  check.expect(q.code == sandbox::code::ok, "run 1 ended ok");
  check.expect(q.exit_code == 0, "run 1 exited 0");
  // The result names what ran it: "process", or the OCI runtime and its version.
  check.expect(level == sandbox::isolation::process
                   ? q.backend == "process"
                   : q.backend.rfind(level == sandbox::isolation::gvisor    ? "runsc "
                                     : level == sandbox::isolation::microvm ? "qemu "
                                                                            : "",
                                     0) == 0 &&
                         q.backend.find(' ') != std::string::npos,
               "run 1 names its backend (" + q.backend + ")");
  check.expect(q.egress_attempts.empty(), "run 1 attempted no egress");
  check.expect(quote_doc.is_object(), "run 1 wrote quote.json holding a JSON object");
  if (quote_doc.is_object()) {
    const auto selected = quote_doc.value("selected", nlohmann::json::object());
    check.expect(selected.value("mode", "") == expected_mode,
                 std::string("quote.json selects ") + expected_mode);
    check.expect(selected.value("total_usd", "") == expected_total,
                 std::string("quote.json totals USD ") + expected_total);
  }
  check.expect(q.std_out.summary.find(std::string("USD ") + expected_total) != std::string::npos,
               "run 1 printed the total");

  // Run 2: live rates, without network.
  const auto& l = out.live;
  print_head("run 2: fetch live rates (the ticket grants no network)", l);
  // The model sees the summary; the last line is what matters to it here.
  std::string err = l.std_err.summary;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  auto last = err.rfind('\n');
  std::cout << "  stderr (last line of " << l.std_err.total_bytes << " bytes):\n"
            << indent(last == std::string::npos ? err : err.substr(last + 1));
  bool dns_listed = false;
  for (const auto& e : l.egress_attempts) {
    std::cout << "  egress:    " << e.protocol << " " << (e.host.empty() ? e.address : e.host)
              << " port " << e.port << ", " << (e.allowed ? "allowed" : "refused") << " ("
              << e.reason << ")\n";
    if (e.protocol == "dns" && e.host == "api.freight-rates.example" && !e.allowed) {
      dns_listed = true;
    }
  }
  print_usage(l);
  check.expect(l.code == sandbox::code::network_disabled, "run 2 ended network_disabled");
  check.expect(dns_listed, "run 2 lists the refused DNS lookup of api.freight-rates.example");

  // Run 3: live rates again, asked for properly and approved.
  if (out.approved) {
    const auto& a = *out.approved;
    print_head("run 3: fetch live rates with the API's key, by a human's approval", a);
    std::cout << "  stdout:\n" << indent(a.std_out.summary);
    if (!a.std_err.summary.empty()) std::cout << "  stderr:\n" << indent(a.std_err.summary);
    bool fetched_through_proxy = false, misuse_recorded = false;
    for (const auto& e : a.egress_attempts) {
      std::cout << "  egress:    " << e.protocol << " " << e.host << " port " << e.port << " via "
                << e.address << ", " << (e.allowed ? "allowed" : "refused") << " (" << e.reason
                << "), " << e.bytes_up << " bytes up, " << e.bytes_down << " bytes down\n";
      if (e.host == live_rates_host && e.allowed && e.bytes_down > 0) fetched_through_proxy = true;
      if (e.host == portal_host && !e.allowed && e.reason == "secret_misuse") {
        misuse_recorded = true;
      }
    }
    // The server's own log is the proof of what arrived: the key, once, at the rates API.
    std::cout << "  rates server's log (what arrived):\n";
    for (const auto& r : server.log()) std::cout << "    " << describe(r, key) << "\n";
    print_usage(a);
    check.expect(approvals_asked == 1, "run 3 asked the approver once");
    check.expect(secrets_shown == std::vector<std::string>{secret_name},
                 "the approval page showed the secret rates-api");
    check.expect(a.code == sandbox::code::ok, "run 3 ended ok");
    check.expect(
        a.std_out.summary.find("the key as the program sees it: sbx-secret-") != std::string::npos,
        "run 3's program held only a placeholder");
    check.expect(a.std_out.summary.find("USD 0.69/kg") != std::string::npos,
                 "run 3 printed the live ocean rate");
    check.expect(a.std_out.summary.find("portal: HTTP 403 secret_misuse") != std::string::npos,
                 "run 3's program was refused sending the key to the portal");
    check.expect(fetched_through_proxy, "run 3 lists its proxied request with bytes");
    check.expect(misuse_recorded, "run 3 lists the portal attempt refused secret_misuse");
    const auto& log = server.log();
    check.expect(log.size() == 1 && log[0].host == live_rates_host &&
                     log[0].authorization == "Bearer " + key && log[0].status == 200,
                 "the rates server saw the key exactly once, in the Authorization header, and "
                 "nothing reached the portal");
  } else {
    std::cout << "\n== run 3 (network by approval) needs --isolation container, gvisor or "
                 "microvm\n";
    check.expect(approvals_asked == 0, "no approval asked");
    check.expect(server.log().empty(), "the rates server was asked nothing");
  }

  // 7. The spans the runtime recorded, one per run, in order.
  auto spans = std::static_pointer_cast<collecting_span_sink>(options.spans)->spans();
  const std::vector<std::string> required{
      "sandbox.tenant",         "sandbox.isolation",
      "sandbox.timeout",        "error_code",
      "sandbox.runtime_digest", "sandbox.usage.wall_ms",
      "sandbox.usage.cpu_ms",   "sandbox.usage.peak_memory_bytes"};
  const std::vector<const sandbox::run_result*> runs =
      out.approved ? std::vector<const sandbox::run_result*>{&q, &l, &*out.approved}
                   : std::vector<const sandbox::run_result*>{&q, &l};
  check.expect(spans.size() == runs.size(), std::to_string(runs.size()) + " spans recorded");
  for (std::size_t i = 0; i < spans.size() && i < runs.size(); ++i) {
    const auto& s = spans[i];
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(s.end - s.start).count();
    std::cout << "\n== span " << i + 1 << ": " << s.name << " (" << ms << " ms)\n";
    for (const auto& [key, value] : s.attributes) {
      std::cout << "  " << key << " = " << attribute_text(value) << "\n";
    }
    for (const auto& key : required) {
      check.expect(s.attributes.count(key) == 1, "span " + std::to_string(i + 1) + " has " + key);
    }
    const auto& r = *runs[i];
    auto attr = [&](const char* key) {
      auto it = s.attributes.find(key);
      return it == s.attributes.end() ? std::string() : attribute_text(it->second);
    };
    check.expect(attr("error_code") == sandbox::to_string(r.code),
                 "span " + std::to_string(i + 1) + " error_code matches its result");
    check.expect(attr("sandbox.isolation") == sandbox::to_string(r.isolation) &&
                     (i < 2 ? r.isolation == level
                            : sandbox::is_at_least(r.isolation, sandbox::isolation::container)),
                 "span isolation is " + std::string(sandbox::to_string(r.isolation)));
    check.expect(attr("sandbox.tenant") == tenant, "span tenant is acme");
    check.expect(attr("sandbox.runtime_digest") == r.runtime.digest, "span digest matches");
  }

  // The key's value, byte for byte, in nothing any run gave back (streams, whole results),
  // in no span, and in nothing this walkthrough printed (the approval page included).
  bool key_absent = std::cout.flush() && printed.text().find(key) == std::string::npos;
  for (const auto* r : runs) {
    key_absent = key_absent && sandbox::encode(*r).find(key) == std::string::npos;
    for (const auto* stream : {&r->std_out, &r->std_err}) {
      if (stream->blob.empty()) continue;
      auto bytes = rt->blobs()->get(tenant, stream->blob);
      key_absent = key_absent && bytes && bytes->find(key) == std::string::npos;
    }
  }
  for (const auto& s : spans) {
    for (const auto& [k, v] : s.attributes) {
      key_absent = key_absent && attribute_text(v).find(key) == std::string::npos;
    }
  }
  check.expect(key_absent, "the rates-api key is in no stream, result, span or printed line");

  std::cout << "\n"
            << (check.failures == 0
                    ? "freight_quote: ok"
                    : "freight_quote: " + std::to_string(check.failures) + " check(s) failed")
            << "\n";
  return check.failures == 0 ? exit_ok : exit_fail;
}

}  // namespace

int main(int argc, char** argv) {
  std::string state_dir, image_dir, blob_dir, cgroup_parent, isolation = "process", oci_runtime;
  bool skip_unavailable = false;
  po::options_description desc(
      "usage: freight_quote [options]\n\n"
      "Runs the freight-quote walkthrough in a sandbox (see the comment at the top\n"
      "of examples/freight_quote/freight_quote.cpp). Store locations default to the\n"
      "library's (root: /run/agent-sandbox, /var/lib/agent-sandbox/{images,blobs}).\n\noptions");
  desc.add_options()("help,h", "print this help")(
      "state-dir", po::value(&state_dir), "per-host state directory (run work dirs, locks)")(
      "image-dir", po::value(&image_dir),
      "image store (default: $SANDBOX_IMAGE_DIR, else the library's default)")(
      "blob-dir", po::value(&blob_dir), "blob store directory")(
      "cgroup-parent", po::value(&cgroup_parent),
      "parent cgroup of runs; unprivileged hosts: a delegated subtree (default: "
      "$SANDBOX_CGROUP_PARENT)")(
      "isolation", po::value(&isolation),
      "the ticket's level: process (default), container (crun, or --oci-runtime runc), "
      "gvisor (runsc) or microvm (QEMU); its backend is enabled for the walkthrough")(
      "oci-runtime", po::value(&oci_runtime), "container level: crun (default) or runc")(
      "skip-unavailable", po::bool_switch(&skip_unavailable),
      "exit 77 instead of 1 when the process backend or the python3 image is unavailable "
      "(ignored when CI=true or SANDBOX_MUST_WORK=1)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "freight_quote: " << e.what() << "\n(see freight_quote --help)\n";
    return exit_usage;
  }
  if (vm.count("help") != 0) {
    std::cout << desc << "\n";
    return exit_ok;
  }
  if (image_dir.empty()) image_dir = env_or_empty("SANDBOX_IMAGE_DIR");
  if (cgroup_parent.empty()) cgroup_parent = env_or_empty("SANDBOX_CGROUP_PARENT");

  auto options = sandbox::default_runtime_options();
  try {
    if (!state_dir.empty()) options.state_dir = std::filesystem::absolute(state_dir);
    if (!image_dir.empty()) options.image_dir = std::filesystem::absolute(image_dir);
    if (!blob_dir.empty()) options.blob_dir = std::filesystem::absolute(blob_dir);
  } catch (const std::filesystem::filesystem_error& e) {
    std::cerr << "freight_quote: " << e.what() << "\n";
    return exit_usage;
  }
  if (!cgroup_parent.empty()) options.process.cgroup_parent = cgroup_parent;
  sandbox::isolation level = sandbox::isolation::process;
  if (isolation == "container") {
    level = sandbox::isolation::container;
    options.container.enabled = true;
    if (!oci_runtime.empty()) options.container.runtime = oci_runtime;
  } else if (isolation == "gvisor") {
    level = sandbox::isolation::gvisor;
    options.gvisor.enabled = true;
  } else if (isolation == "microvm") {
    level = sandbox::isolation::microvm;
    options.microvm.enabled = true;
    // The host's ceiling on timeouts (8 s by default) would clamp the snippets' 30 s.
    options.policy.max_timeout = 33000ms;
  } else if (isolation != "process") {
    std::cerr << "freight_quote: --isolation must be process, container, gvisor or microvm\n";
    return exit_usage;
  }
  if (!oci_runtime.empty() && (level != sandbox::isolation::container ||
                               (oci_runtime != "crun" && oci_runtime != "runc"))) {
    std::cerr << "freight_quote: --oci-runtime is crun or runc, with --isolation container\n";
    return exit_usage;
  }
  options.spans = std::make_shared<collecting_span_sink>();
  try {
    return run_example(options, level, skip_unavailable);
  } catch (const std::exception& e) {
    std::cout << "freight_quote: failed: " << e.what() << "\n";
    return exit_fail;
  }
}
