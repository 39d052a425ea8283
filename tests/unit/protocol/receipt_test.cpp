// Execution receipts (sandbox/receipt.hpp): a real (fake-backend) run's receipt verifies;
// any altered byte, another key, or an unknown key id fails.
#include "sandbox/receipt.hpp"

#include <catch2/catch.hpp>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "protocol/sha256.hpp"
#include "sandbox/json.hpp"
#include "sandbox/record.hpp"
#include "sandbox/signed_ticket.hpp"
#include "unit/runtime/runtime_test_support.hpp"

namespace {

using sandbox::code;
using sandbox::test::make_ticket;
using sandbox::test::py;
using sandbox::testing::fake_backend;
using sandbox::testing::fake_digest;

struct keys {
  sandbox::ed25519_key_pem pem = sandbox::generate_ed25519_key().value();
  sandbox::receipt_signer signer;
  explicit keys(const std::string& kid)
      : signer(sandbox::receipt_signer::from_pem(kid, pem.private_pem).value()) {}
  sandbox::receipt_verifier verifier() const {
    sandbox::receipt_verifier v;
    REQUIRE(v.add_key(signer.kid(), pem.public_pem).has_value());
    return v;
  }
};

sandbox::runtime signing_runtime(const keys& k) {
  sandbox::runtime_options o;
  o.blobs = sandbox::make_memory_blob_store();
  o.fixed_digests = {{"python3", fake_digest("python3")}};
  o.process_backend = false;
  o.log = [](sandbox::log_level, std::string_view) {};
  o.receipt_signer = std::make_shared<const sandbox::receipt_signer>(k.signer);
  auto rt = sandbox::runtime::create(o);
  REQUIRE(rt.has_value());
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::microvm);
  sandbox::testing::scripted_run run;
  run.std_out = "hello\n";
  run.files_out = {{"a.txt", "A"}, {"b.txt", "B"}};
  sandbox::egress_attempt e;
  e.protocol = "dns";
  e.host = "example.com";
  e.reason = "network disabled";
  sandbox::egress_attempt ruled;  // a request an L7 egress rule judged
  ruled.protocol = "https";
  ruled.host = "api.example.com";
  ruled.reason = "rule_refused";
  ruled.method = "POST";
  ruled.path = "/v1/rates/eu";
  ruled.rule = "rates-read";
  run.egress_attempts = {e, ruled};
  run.usage.cpu = std::chrono::milliseconds(7);
  fake->otherwise().respond(run);
  rt->add_backend(fake);
  return std::move(*rt);
}

}  // namespace

TEST_CASE("a run's receipt verifies and describes its result", "[receipt]") {
  keys k("r1");
  auto rt = signing_runtime(k);
  const auto request = py("print('hello')");
  const auto ticket = make_ticket("acme");
  auto r = rt.run(request, ticket);
  REQUIRE(r.code == code::ok);
  REQUIRE(r.receipt.has_value());
  auto claims = k.verifier().verify(*r.receipt);
  REQUIRE(claims.has_value());
  CHECK_FALSE(sandbox::receipt_mismatch(*claims, r).has_value());
  CHECK(claims->run_id == r.run_id);
  CHECK(claims->tenant == "acme");
  CHECK(claims->ticket_id == ticket.id());
  CHECK(claims->derived_from.empty());
  CHECK_FALSE(claims->approval_sha256.has_value());
  CHECK(claims->request_sha256 == sandbox::request_digest(request));
  CHECK(claims->backend == r.backend);
  CHECK(claims->runtime.digest == fake_digest("python3"));
  CHECK(claims->files_out.size() == 2);
  REQUIRE(claims->egress_attempts.size() == 2);
  CHECK(claims->egress_attempts[1].method == "POST");
  CHECK(claims->egress_attempts[1].path == "/v1/rates/eu");
  CHECK(claims->egress_attempts[1].rule == "rates-read");
  CHECK(claims->usage.cpu == std::chrono::milliseconds(7));

  // The receipt travels in the result's JSON and in a run record, and still verifies.
  auto decoded = sandbox::decode_run_result(sandbox::encode(r));
  REQUIRE(decoded.has_value());
  CHECK(*decoded == r);
  auto rec =
      sandbox::decode_run_record(sandbox::encode(sandbox::make_run_record(request, ticket, r)));
  REQUIRE(rec.has_value());
  REQUIRE(rec->result.receipt.has_value());
  CHECK(k.verifier().verify(*rec->result.receipt).has_value());

  // A receipt that is not JSON (set by hand) is encoded as null, never thrown on.
  auto garbage = r;
  garbage.receipt = "not json {";
  auto as_json = nlohmann::json::parse(sandbox::encode(garbage));
  CHECK(as_json["receipt"].is_null());
  CHECK_FALSE(sandbox::decode_run_result(sandbox::encode(garbage))->receipt.has_value());

  // A result edited after signing no longer matches its (valid) receipt.
  auto edited = r;
  edited.files_out[1].blob = edited.files_out[0].blob;
  CHECK(sandbox::receipt_mismatch(*claims, edited) == std::optional<std::string>("files_out[1]"));
  edited = r;
  edited.code = code::timeout;
  CHECK(sandbox::receipt_mismatch(*claims, edited) == std::optional<std::string>("code"));
}

TEST_CASE("changing any one byte of a receipt fails verification", "[receipt]") {
  keys k("r1");
  auto rt = signing_runtime(k);
  auto r = rt.run(py("print('hello')"), make_ticket("acme"));
  REQUIRE(r.receipt.has_value());
  const std::string doc = *r.receipt;
  const auto v = k.verifier();
  REQUIRE(v.verify(doc).has_value());
  std::size_t refused = 0;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    for (char flip : {'\x01', '\x02', '\x10'}) {
      std::string bad = doc;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      auto result = v.verify(bad);
      INFO("byte " << i << " of " << doc);
      REQUIRE(result.has_error());
      CHECK(result.error().code == code::invalid_request);
      CHECK(result.error().message.rfind("receipt: ", 0) == 0);
      ++refused;
    }
  }
  CHECK(refused == doc.size() * 3);

  // Changing a value (and keeping the JSON valid) is a bad signature, named as such.
  auto j = nlohmann::ordered_json::parse(doc);
  j["receipt"]["usage"]["cpu_ms"] = 8;
  auto changed = v.verify(j.dump());
  REQUIRE(changed.has_error());
  CHECK(changed.error().message == "receipt: bad signature (key 'r1')");
  // Whitespace and member order are not part of what is signed: the canonical re-encoding is.
  auto spaced = nlohmann::json::parse(doc).dump(2);
  CHECK(v.verify(spaced).has_value());
}

TEST_CASE("a receipt from another key, or an unknown key id, fails", "[receipt]") {
  keys k("r1");
  keys other("r1");  // same id, different key
  auto rt = signing_runtime(k);
  auto r = rt.run(py("print('hello')"), make_ticket("acme"));
  REQUIRE(r.receipt.has_value());
  auto wrong = other.verifier().verify(*r.receipt);
  REQUIRE(wrong.has_error());
  CHECK(wrong.error().message == "receipt: bad signature (key 'r1')");

  keys third("r2");
  auto unknown = third.verifier().verify(*r.receipt);
  REQUIRE(unknown.has_error());
  CHECK(unknown.error().message == "receipt: unknown key id 'r1'");

  sandbox::receipt_verifier empty;
  CHECK(empty.empty());
  CHECK(empty.verify(*r.receipt).has_error());
}

TEST_CASE("receipt documents are decoded strictly", "[receipt][json]") {
  keys k("r1");
  auto rt = signing_runtime(k);
  auto r = rt.run(py("print('hello')"), make_ticket("acme"));
  REQUIRE(r.receipt.has_value());
  const auto v = k.verifier();
  auto with = [&](auto edit) {
    auto j = nlohmann::ordered_json::parse(*r.receipt);
    edit(j);
    return v.verify(j.dump());
  };
  auto check = [](const auto& result, const std::string& prefix) {
    REQUIRE(result.has_error());
    CHECK(result.error().code == code::invalid_request);
    CHECK(result.error().message.rfind(prefix, 0) == 0);
  };
  check(with([](auto& j) { j["extra"] = 1; }), "receipt: unknown field 'extra'");
  check(with([](auto& j) { j["receipt"]["extra"] = 1; }),
        "receipt: receipt: unknown field 'extra'");
  check(with([](auto& j) { j["v"] = 2; }), "receipt: v: unsupported receipt version 2");
  check(with([](auto& j) { j.erase("sig"); }), "receipt: sig: required field is missing");
  check(with([](auto& j) { j["sig"] = "AAAA"; }), "receipt: sig: expected a base64url");
  check(with([](auto& j) { j["kid"] = "bad kid"; }), "receipt: kid: invalid key id");
  check(with([](auto& j) { j["receipt"]["code"] = "fine"; }),
        "receipt: receipt.code: unknown code");
  check(with([](auto& j) { j["receipt"]["files_out"][0]["blob"] = "sha256:x"; }),
        "receipt: receipt.files_out[0].blob: invalid blob id");
  check(with([](auto& j) { j["receipt"]["egress_attempts"][0]["port"] = 70000; }),
        "receipt: receipt.egress_attempts[0].port: out of range");
  check(with([](auto& j) { j["receipt"]["egress_attempts"][0]["rule"] = ""; }),
        "receipt: receipt.egress_attempts[0].rule: must not be empty");
  check(with([](auto& j) { j["receipt"]["egress_attempts"][0]["path"] = 1; }),
        "receipt: receipt.egress_attempts[0].path: expected a string");
  check(with([](auto& j) { j["receipt"].erase("tenant"); }),
        "receipt: receipt.tenant: required field is missing");
  check(v.verify(std::string(sandbox::max_receipt_bytes + 1, ' ')), "receipt: larger than");
  for (std::string_view text : {"", "{", "[]", "null"}) check(v.verify(text), "receipt: ");
}

TEST_CASE("receipt signers and verifiers refuse bad keys", "[receipt]") {
  CHECK(sandbox::receipt_signer::from_pem("k", "").error() ==
        sandbox::make_error_code(sandbox::errc::invalid_argument));
  CHECK(sandbox::receipt_signer::from_pem("bad kid", sandbox::generate_ed25519_key()->private_pem)
            .error() == sandbox::make_error_code(sandbox::errc::invalid_argument));
  sandbox::receipt_verifier v;
  CHECK(v.add_key("k", "not a key").error() ==
        sandbox::make_error_code(sandbox::errc::invalid_argument));
  auto pem = sandbox::generate_ed25519_key().value();
  REQUIRE(v.add_key("k", pem.public_pem).has_value());
  CHECK(v.add_key("k", pem.public_pem).error() ==
        sandbox::make_error_code(sandbox::errc::already_exists));
  CHECK(v.load_keys("/nonexistent/keys").error() ==
        sandbox::make_error_code(sandbox::errc::not_found));
}

TEST_CASE("the receipt of an approved run names the derived ticket, its chain and the approval",
          "[receipt][approval]") {
  keys k("r1");
  const auto parent = make_ticket("acme");
  // The approver answers on the runtime's thread: no Catch assertions there.
  std::mutex mu;
  std::optional<sandbox::approval_request> asked;
  std::optional<sandbox::ticket> minted;
  sandbox::runtime_options o;
  o.blobs = sandbox::make_memory_blob_store();
  o.fixed_digests = {{"python3", fake_digest("python3")}};
  o.process_backend = false;
  o.log = [](sandbox::log_level, std::string_view) {};
  o.receipt_signer = std::make_shared<const sandbox::receipt_signer>(k.signer);
  o.approver = sandbox::make_callback_approver(
      [&](sandbox::approval_request q, sandbox::approval_callback answer) {
        auto derived = sandbox::ticket_issuer{}.derive(parent, q);
        {
          std::lock_guard lk(mu);
          asked = q;
          if (derived) minted = *derived;
        }
        answer(derived ? sandbox::approval_decision::approve(*derived)
                       : sandbox::approval_decision::deny("no derived ticket"));
      });
  auto rt = sandbox::runtime::create(o);
  REQUIRE(rt.has_value());
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::container);
  fake->otherwise().respond_stdout("fetched\n");
  rt->add_backend(fake);

  auto request = py("print('fetched')");
  request.network = true;
  request.egress = {"api.example.com"};
  auto r = rt->run(request, parent);
  REQUIRE(r.code == code::ok);
  REQUIRE(r.receipt.has_value());
  std::lock_guard lk(mu);
  REQUIRE(asked.has_value());
  REQUIRE(minted.has_value());
  auto claims = k.verifier().verify(*r.receipt);
  REQUIRE(claims.has_value());
  CHECK(claims->ticket_id == minted->id());
  CHECK(claims->ticket_id != parent.id());
  CHECK(claims->derived_from == std::vector<std::string>{parent.id()});
  REQUIRE(claims->approval_sha256.has_value());
  CHECK(*claims->approval_sha256 == sandbox::detail::sha256_hex(sandbox::encode(*asked)));
  CHECK(claims->isolation == sandbox::isolation::container);
  CHECK_FALSE(sandbox::receipt_mismatch(*claims, r).has_value());
}
