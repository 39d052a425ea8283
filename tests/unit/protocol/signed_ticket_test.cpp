// Signed ticket documents: keys and key files, signing, verification with rotated keys,
// derivation chains, and hostile documents (tampered, truncated, garbled, forged chains).
#include "sandbox/signed_ticket.hpp"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "protocol/base64url.hpp"
#include "unit/test_files.hpp"

using namespace std::chrono_literals;
using namespace std::string_literals;
using sandbox::code;
using sandbox::errc;
using sandbox::ticket_issuer;
using sandbox::ticket_signer;
using sandbox::ticket_verifier;
using sys_clock = std::chrono::system_clock;

namespace {

const sys_clock::time_point noon =
    sys_clock::time_point(std::chrono::sys_days{std::chrono::year{2026} / 11 / 30} + 12h);
const std::string digest = "sha256:" + std::string(64, 'a');

struct keys {
  sandbox::ed25519_key_pem pem = sandbox::generate_ed25519_key().value();
  ticket_signer signer;
  explicit keys(const std::string& kid)
      : signer(ticket_signer::from_pem(kid, pem.private_pem).value()) {}
};

sandbox::ticket root_ticket(std::optional<sys_clock::time_point> expires = noon + 24h) {
  sandbox::ticket_spec s{.id = "t-1", .tenant = "acme"};
  s.expires_at = expires;
  return ticket_issuer{}.issue(s).value();
}

sandbox::approval_request approval_for(const sandbox::ticket& parent) {
  sandbox::approval_request a;
  a.ticket_id = parent.id();
  a.tenant = parent.tenant();
  a.domains = {"api.example.com"};
  a.timeout = 2000ms;
  a.memory_limit_bytes = 256ULL << 20;
  a.source_sha256 = std::string(64, 'e');
  a.source_bytes = 9;
  a.runtime = {"python3", digest};
  return a;
}

/// A verifier trusting `ks`.
ticket_verifier trusting(std::initializer_list<const keys*> ks) {
  ticket_verifier v;
  for (const keys* k : ks) REQUIRE(v.add_key(k->signer.kid(), k->pem.public_pem).has_value());
  return v;
}

std::string refusal(const ticket_verifier& v, std::string_view doc,
                    sys_clock::time_point now = noon) {
  auto r = v.verify(doc, now);
  if (r) return "<verified>";
  CHECK(r.error().code == code::action_denied);
  return r.error().message;
}

/// Signs an arbitrary ticket JSON (with an optional parent document) exactly as the format
/// says, bypassing the signer's own checks: how a forger holding a trusted key would.
std::string sign_raw(const keys& k, const nlohmann::ordered_json& ticket_json,
                     const std::optional<std::string>& parent_doc = std::nullopt) {
  nlohmann::ordered_json j;
  j["v"] = 1;
  j["ticket"] = ticket_json;
  if (parent_doc) j["parent"] = nlohmann::ordered_json::parse(*parent_doc);
  j["kid"] = k.signer.kid();
  const std::string input = j.dump();
  BIO* bio = BIO_new_mem_buf(k.pem.private_pem.data(), static_cast<int>(k.pem.private_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  std::string sig(64, '\0');
  std::size_t len = sig.size();
  REQUIRE(EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key) == 1);
  REQUIRE(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                         reinterpret_cast<const unsigned char*>(input.data()), input.size()) == 1);
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(key);
  j["sig"] = sandbox::detail::base64url_encode(sig);
  return j.dump();
}

}  // namespace

TEST_CASE("base64url: canonical, unpadded, strict", "[ticket][signed]") {
  using sandbox::detail::base64url_decode;
  using sandbox::detail::base64url_encode;
  CHECK(base64url_encode("") == "");
  CHECK(base64url_encode("f") == "Zg");
  CHECK(base64url_encode("fo") == "Zm8");
  CHECK(base64url_encode("foo") == "Zm9v");
  CHECK(base64url_encode("\xfb\xff") == "-_8");
  std::mt19937 rng(7);
  for (int n = 0; n < 70; ++n) {
    std::string bytes;
    for (int i = 0; i < n; ++i) bytes += static_cast<char>(rng());
    CHECK(base64url_decode(base64url_encode(bytes)) == bytes);
  }
  for (const std::string bad : {"Z", "Zg==", "Zh", "Zm9", "Zm+v", "Zm/v", "Zm9v ", "Z\ng"}) {
    INFO(bad);
    if (bad == "Zm9") {
      CHECK_FALSE(base64url_decode("Zm9"));  // 'fo' is Zm8: the unused bits are not zero
      continue;
    }
    CHECK_FALSE(base64url_decode(bad));
  }
}

TEST_CASE("sign and verify a ticket", "[ticket][signed]") {
  keys k1("k1");
  const auto t = root_ticket();
  const std::string doc = k1.signer.sign(t).value();
  // The documented form: v, ticket (its canonical encoding), kid, sig (86 base64url chars).
  const std::string head = R"({"v":1,"ticket":)" + sandbox::encode(t) + R"(,"kid":"k1","sig":")";
  REQUIRE(doc.rfind(head, 0) == 0);
  CHECK(doc.size() == head.size() + 86 + 2);
  CHECK(sandbox::is_signed_ticket_document(doc));
  CHECK_FALSE(sandbox::is_signed_ticket_document(sandbox::encode(t)));
  CHECK_FALSE(sandbox::is_signed_ticket_document("{"));

  const auto v = trusting({&k1});
  auto back = v.verify(doc, noon);
  REQUIRE(back.has_value());
  CHECK(*back == t);
  // Ed25519 is deterministic: the same ticket signs to the same document.
  CHECK(k1.signer.sign(t).value() == doc);

  // Whitespace and member order do not matter: the signed bytes are re-encoded.
  auto j = nlohmann::json::parse(doc);  // sorted keys
  CHECK(v.verify(j.dump(2), noon).has_value());
  // Non-canonical but equivalent values are read, and the canonical ticket is what counts.
  auto jo = nlohmann::ordered_json::parse(doc);
  jo["ticket"]["v"] = 1;
  CHECK(v.verify(jo.dump(), noon).has_value());

  // A signer cannot sign a derived ticket without its parent.
  const auto d = ticket_issuer{}.derive(t, approval_for(t), {.now = noon}).value();
  CHECK(k1.signer.sign(d).error() == sandbox::make_error_code(errc::invalid_argument));
  CHECK(k1.signer.sign(t, doc).error() == sandbox::make_error_code(errc::invalid_argument));
}

TEST_CASE("rotation: a verifier holds several keys by id", "[ticket][signed]") {
  keys k1("k1"), k2("k2");
  const auto t = root_ticket();
  const auto d1 = k1.signer.sign(t).value();
  const auto d2 = k2.signer.sign(t).value();
  const auto both = trusting({&k1, &k2});
  CHECK(both.verify(d1, noon).has_value());
  CHECK(both.verify(d2, noon).has_value());
  CHECK(both.key_ids() == std::vector<std::string>{"k1", "k2"});
  const auto old_only = trusting({&k1});
  CHECK(refusal(old_only, d2) == "signed ticket: unknown key id 'k2'");
  CHECK(refusal(ticket_verifier{}, d1) == "signed ticket: unknown key id 'k1'");
  CHECK(ticket_verifier{}.empty());
  // A key id names one key: the same id twice is refused; another key under k1 fails.
  auto v = trusting({&k1});
  CHECK(v.add_key("k1", k2.pem.public_pem).error() ==
        sandbox::make_error_code(errc::already_exists));
  ticket_verifier impostor;
  REQUIRE(impostor.add_key("k1", k2.pem.public_pem).has_value());
  CHECK(refusal(impostor, d1) == "signed ticket: bad signature (key 'k1')");
  // Copies keep the keys they had.
  auto copy = v;
  REQUIRE(v.add_key("k2", k2.pem.public_pem).has_value());
  CHECK(refusal(copy, d2) == "signed ticket: unknown key id 'k2'");
  CHECK(v.verify(d2, noon).has_value());
}

TEST_CASE("tampered documents are refused", "[ticket][signed]") {
  keys k1("k1"), k2("k2");
  const auto v = trusting({&k1, &k2});
  const std::string doc = k1.signer.sign(root_ticket()).value();
  auto edit = [&](const std::function<void(nlohmann::ordered_json&)>& f) {
    auto j = nlohmann::ordered_json::parse(doc);
    f(j);
    return j.dump();
  };
  const std::string bad_sig = "signed ticket: bad signature (key 'k1')";
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["tenant"] = "other"; })) == bad_sig);
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["max_timeout_ms"] = 8001; })) == bad_sig);
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["isolation"] = "container"; })) == bad_sig);
  CHECK(refusal(v, edit([](auto& j) { j["ticket"].erase("expires_at"); })) == bad_sig);
  CHECK(refusal(v, edit([](auto& j) {
                  j["ticket"]["actions"].push_back("code.network");
                  j["ticket"]["egress"] = {"evil.example"};
                })) == bad_sig);
  CHECK(refusal(v, edit([](auto& j) { j["kid"] = "k2"; })) ==
        "signed ticket: bad signature (key 'k2')");
  CHECK(refusal(v, edit([](auto& j) {
                  std::string s = j["sig"];
                  s[10] = s[10] == 'A' ? 'B' : 'A';
                  j["sig"] = s;
                })) == bad_sig);
  CHECK(refusal(v, edit([](auto& j) {
                  std::string s = j["sig"];
                  j["sig"] = s.substr(0, 85);
                })) == "signed ticket: sig: not a base64url Ed25519 signature (86 characters)");
  CHECK(refusal(v, edit([](auto& j) { j["sig"] = std::string(86, '+'); })) ==
        "signed ticket: sig: not a base64url Ed25519 signature (86 characters)");
  CHECK(refusal(v, edit([](auto& j) { j["extra"] = true; })) ==
        "signed ticket: unknown field 'extra'");
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["extra"] = true; })) ==
        "signed ticket: ticket: unknown field 'extra'");
  CHECK(refusal(v, edit([](auto& j) { j["v"] = 2; })) ==
        "signed ticket: v: unsupported version (expected the integer 1)");
  CHECK(refusal(v, edit([](auto& j) { j.erase("v"); })) ==
        "signed ticket: v: required field is missing");
  CHECK(refusal(v, edit([](auto& j) { j.erase("sig"); })) ==
        "signed ticket: sig: required field is missing");
  CHECK(refusal(v, edit([](auto& j) { j["kid"] = "../k1"; })) ==
        "signed ticket: kid: not a key id: '../k1'");
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["tenant"] = "../x"; }))
            .rfind("signed ticket: ticket.tenant: must be", 0) == 0);
  CHECK(refusal(v, edit([&](auto& j) { j["parent"] = nlohmann::ordered_json::parse(doc); })) ==
        "signed ticket: parent: only a derived ticket carries its parent's document");
  // Duplicate keys (a parser differential) are refused before anything else.
  CHECK(refusal(v, doc.substr(0, doc.size() - 1) + R"(,"kid":"k2"})") ==
        "signed ticket: duplicate field 'kid'");
}

TEST_CASE("the signature covers a ticket's L7 egress rules", "[ticket][signed][egress_rules]") {
  keys k1("k1");
  const auto v = trusting({&k1});
  sandbox::ticket_spec s{.id = "t-1", .tenant = "acme"};
  s.isolation = sandbox::isolation::container;
  s.egress = {"api.example.com"};
  s.egress_rules = {sandbox::egress_rule{.name = "rates-read",
                                         .host = "api.example.com",
                                         .methods = {"GET"},
                                         .paths = {"/v1/rates/"},
                                         .max_requests = 10}};
  s.expires_at = noon + 24h;
  const auto t = ticket_issuer{}.issue(s, sandbox::network_grant{}).value();
  const std::string doc = k1.signer.sign(t).value();
  auto back = v.verify(doc, noon);
  REQUIRE(back.has_value());
  CHECK(back->egress_rules() == t.egress_rules());
  auto edit = [&](const std::function<void(nlohmann::ordered_json&)>& f) {
    auto j = nlohmann::ordered_json::parse(doc);
    f(j);
    return j.dump();
  };
  const std::string bad_sig = "signed ticket: bad signature (key 'k1')";
  // Widening a rule, dropping its budget, dropping the rules: each breaks the signature.
  CHECK(refusal(v, edit([](auto& j) {
                  j["ticket"]["egress_rules"][0]["methods"].push_back("POST");
                })) == bad_sig);
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["egress_rules"][0]["paths"][0] = "/"; })) ==
        bad_sig);
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["egress_rules"][0].erase("max_requests"); })) ==
        bad_sig);
  CHECK(refusal(v, edit([](auto& j) { j["ticket"].erase("egress_rules"); })) == bad_sig);
  // A malformed rule is refused naming the field, before the signature is looked at.
  CHECK(refusal(v, edit([](auto& j) { j["ticket"]["egress_rules"][0]["paths"][0] = "/a/../b"; }))
            .rfind("signed ticket: ticket.egress_rules[0].paths[0]: no '.' or '..' segments", 0) ==
        0);
}

TEST_CASE("expiry is checked at verification", "[ticket][signed]") {
  keys k1("k1");
  const auto v = trusting({&k1});
  const auto doc = k1.signer.sign(root_ticket(noon)).value();
  CHECK(v.verify(doc, noon - 1s).has_value());
  CHECK(refusal(v, doc, noon) == "signed ticket: expired");
  const auto forever = k1.signer.sign(root_ticket(std::nullopt)).value();
  CHECK(v.verify(forever, sys_clock::now() + 24h * 3650).has_value());
}

TEST_CASE("derived tickets carry and verify their whole chain", "[ticket][signed][approval]") {
  keys root_key("issuer-1"), approval_key("approvals-1");
  const auto v = trusting({&root_key, &approval_key});
  const auto parent = root_ticket();
  const auto parent_doc = root_key.signer.sign(parent).value();
  const auto d = ticket_issuer{}.derive(parent, approval_for(parent), {.now = noon}).value();
  const auto doc = approval_key.signer.sign(d, parent_doc).value();
  auto back = v.verify(doc, noon + 1min);
  REQUIRE(back.has_value());
  CHECK(*back == d);
  CHECK(back->parent_id() == "t-1");
  CHECK(back->approval() == approval_for(parent));

  // Two levels: a child of the derived ticket (narrower, from its own approval).
  const auto d2 = ticket_issuer{}.derive(d, approval_for(d), {.now = noon, .ttl = 60s}).value();
  const auto doc2 = root_key.signer.sign(d2, doc).value();
  auto back2 = v.verify(doc2, noon + 30s);
  REQUIRE(back2.has_value());
  CHECK(back2->ancestors() == std::vector<std::string>{"t-1", d.id()});

  // Every link must be signed by a trusted key, verified, unexpired and rightly derived.
  CHECK(refusal(trusting({&approval_key}), doc) ==
        "signed ticket: parent: unknown key id 'issuer-1'");
  CHECK(refusal(trusting({&root_key}), doc) == "signed ticket: unknown key id 'approvals-1'");
  CHECK(refusal(v, doc, noon + 10min) == "signed ticket: expired");
  CHECK(refusal(v, doc2, noon + 61s) == "signed ticket: expired");
  auto j = nlohmann::ordered_json::parse(doc);
  j["parent"]["ticket"]["max_timeout_ms"] = 1;  // tamper with the parent: its signature fails
  CHECK(refusal(v, j.dump()) == "signed ticket: parent: bad signature (key 'issuer-1')");
  j = nlohmann::ordered_json::parse(doc);
  j.erase("parent");
  CHECK(refusal(v, j.dump()) ==
        "signed ticket: a derived ticket needs its parent's signed document ('parent')");
  // Another (validly signed) parent in place of the real one: the child's signature
  // covers its parent's document, so the swap breaks it.
  sandbox::ticket_spec s{.id = "t-1", .tenant = "acme", .max_timeout = 9000ms};
  s.expires_at = noon + 24h;
  const auto other_parent_doc = root_key.signer.sign(ticket_issuer{}.issue(s).value()).value();
  j = nlohmann::ordered_json::parse(doc);
  j["parent"] = nlohmann::ordered_json::parse(other_parent_doc);
  CHECK(refusal(v, j.dump()) == "signed ticket: bad signature (key 'approvals-1')");
  // The signer refuses a parent document that is not this ticket's parent.
  const auto stranger = ticket_issuer{}.issue({.id = "t-2", .tenant = "acme"}).value();
  CHECK(approval_key.signer.sign(d, root_key.signer.sign(stranger).value()).error() ==
        sandbox::make_error_code(errc::invalid_argument));
  CHECK(approval_key.signer.sign(d, "{not json").error() ==
        sandbox::make_error_code(errc::invalid_argument));
}

TEST_CASE("wrongly derived chains are refused even when every link is signed",
          "[ticket][signed][approval]") {
  keys k("k1");
  const auto v = trusting({&k});
  const auto parent = root_ticket();
  const auto parent_doc = k.signer.sign(parent).value();
  const auto d = ticket_issuer{}.derive(parent, approval_for(parent), {.now = noon}).value();
  const auto good = nlohmann::ordered_json::parse(sandbox::encode(d));
  CHECK(v.verify(sign_raw(k, good, parent_doc), noon).has_value());
  struct bad {
    std::string what;
    std::function<void(nlohmann::ordered_json&)> edit;
    std::string message;
  };
  const std::vector<bad> cases{
      {"domains not approved", [](auto& j) { j["egress"] = {"evil.example"}; },
       "egress: 'evil.example' was not approved"},
      {"network without an approval", [](auto& j) { j.erase("approval"); },
       "actions: grants code.network without an approval"},
      {"isolation below container", [](auto& j) { j["isolation"] = "process"; },
       "isolation: below 'container' for a network ticket"},
      {"ceiling above the parent's", [](auto& j) { j["max_memory_bytes"] = 1ULL << 40; },
       "max_memory_bytes: above the parent's"},
      {"no expiry", [](auto& j) { j.erase("expires_at"); },
       "expires_at: a derived ticket must expire"},
      {"long-lived", [](auto& j) { j["expires_at"] = "2026-11-30T14:00:00Z"; },
       "expires_at: more than 3600 s from now"},
      {"unpinned image", [](auto& j) { j.erase("runtime_digest"); },
       "runtime_digest: an approved ticket must pin the image"},
      {"another tenant",
       [](auto& j) {
         j["tenant"] = "other";
         j["approval"]["tenant"] = "other";
       },
       "tenant: differs from the parent's"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    auto j = good;
    c.edit(j);
    CHECK(refusal(v, sign_raw(k, j, parent_doc)) ==
          "signed ticket: not a valid derivation: " + c.message);
  }
  // A chain link naming another parent.
  auto j = good;
  j["derived_from"] = {"t-9"};
  j["approval"]["ticket_id"] = "t-9";
  CHECK(refusal(v, sign_raw(k, j, parent_doc)) ==
        "signed ticket: not a valid derivation: derived_from: the ticket is not derived from "
        "'t-1'");
  // A chain longer than its ticket says.
  j = good;
  CHECK(refusal(v, sign_raw(k, j, sign_raw(k, good, parent_doc))).rfind("signed ticket: ", 0) == 0);
}

TEST_CASE("hostile documents never crash the verifier", "[ticket][signed][fuzz]") {
  keys k1("k1");
  const auto v = trusting({&k1});
  const auto parent = root_ticket();
  const auto parent_doc = k1.signer.sign(parent).value();
  const auto d = ticket_issuer{}.derive(parent, approval_for(parent), {.now = noon}).value();
  const std::string doc = k1.signer.sign(d, parent_doc).value();
  REQUIRE(v.verify(doc, noon).has_value());

  // Every truncation.
  for (std::size_t n = 0; n < doc.size(); ++n) {
    auto r = v.verify(doc.substr(0, n), noon);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == code::action_denied);
    CHECK(r.error().message.rfind("signed ticket: ", 0) == 0);
  }
  // Random byte changes: refused, or (a change that means the same) the same ticket.
  std::mt19937 rng(42);
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string garbled = doc;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      garbled[rng() % garbled.size()] = static_cast<char>(rng() % 256);
    }
    auto r = v.verify(garbled, noon);
    if (r) {
      ++accepted;
      CHECK(*r == d);
    } else {
      CHECK(r.error().code == code::action_denied);
    }
  }
  CHECK(accepted < 30);
  // Assorted garbage.
  for (
      const std::string junk :
      {""s, "null"s, "[]"s, "{}"s, "\"x\""s, "{\"v\":1}"s, std::string(10000, '{'),
       std::string(100, '[') + std::string(100, ']'), "\xef\xbb\xbf{}"s,
       R"({"v":1,"ticket":1,"kid":"k1","sig":""})"s, R"({"v":1,"ticket":{},"kid":"k1","sig":""})"s,
       R"({"v":1,"ticket":{"derived_from":["a","b","c","d","e","f"]},"parent":{"parent":{}},"kid":"k1","sig":""})"s}) {
    auto r = v.verify(junk, noon);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == code::action_denied);
  }
  // Nested parents deeper than allowed.
  std::string deep = doc;
  for (int i = 0; i < 20; ++i) {
    auto j = nlohmann::ordered_json::parse(doc);
    j["parent"] = nlohmann::ordered_json::parse(deep);
    deep = j.dump();
    if (deep.size() > 200000) break;
  }
  CHECK_FALSE(v.verify(deep, noon).has_value());
  // Over the size limit.
  CHECK(refusal(v, std::string(sandbox::max_signed_ticket_bytes + 1, ' ')) ==
        "signed ticket: larger than 262144 bytes");
}

TEST_CASE("key files: keygen, load, directories, bad keys", "[ticket][signed][keys]") {
  sandbox::test::temp_dir dir;
  REQUIRE(sandbox::write_ed25519_key_files(dir.path, "k1").has_value());
  REQUIRE(sandbox::write_ed25519_key_files(dir.path, "k2").has_value());
  struct stat st {};
  REQUIRE(::stat((dir.path / "k1.pem").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(::stat((dir.path / "k1.pub.pem").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  CHECK(sandbox::write_ed25519_key_files(dir.path, "k1").error() ==
        sandbox::make_error_code(errc::already_exists));
  CHECK(sandbox::write_ed25519_key_files(dir.path, "../k3").error() ==
        sandbox::make_error_code(errc::invalid_argument));
  CHECK(sandbox::write_ed25519_key_files(dir.path / "absent", "k3").error() ==
        sandbox::make_error_code(errc::not_found));

  auto signer = ticket_signer::load(dir.path / "k2.pem");
  REQUIRE(signer.has_value());
  CHECK(signer->kid() == "k2");
  CHECK(ticket_signer::load(dir.path / "k2.pem", "custom")->kid() == "custom");
  CHECK(signer->public_key_pem() == sandbox::test::read_text(dir.path / "k2.pub.pem"));
  CHECK(ticket_signer::load(dir.path / "k2.pub.pem").error() ==
        sandbox::make_error_code(errc::invalid_argument));  // a public key signs nothing
  CHECK(ticket_signer::load(dir.path / "none.pem").error() ==
        sandbox::make_error_code(errc::not_found));
  CHECK(ticket_signer::load(dir.path).error() == sandbox::make_error_code(errc::invalid_argument));

  // A directory: every <kid>.pub.pem, nothing else.
  sandbox::test::write_text(dir.path / "README", "not a key");
  ticket_verifier v;
  auto n = v.load_keys(dir.path);
  REQUIRE(n.has_value());
  CHECK(*n == 2);
  CHECK(v.key_ids() == std::vector<std::string>{"k1", "k2"});
  CHECK(v.verify(signer->sign(root_ticket()).value(), noon).has_value());
  ticket_verifier one;
  CHECK(one.load_keys(dir.path / "k1.pub.pem").value() == 1);
  CHECK(one.key_ids() == std::vector<std::string>{"k1"});
  CHECK(one.load_key(dir.path / "k1.pub.pem").error() ==
        sandbox::make_error_code(errc::already_exists));
  CHECK(one.load_key(dir.path / "k1.pub.pem", "k1-again").has_value());

  // Bad key files: nothing is added from a directory holding one.
  sandbox::test::temp_dir bad;
  sandbox::test::write_text(bad.path / "a.pub.pem",
                            sandbox::test::read_text(dir.path / "k1.pub.pem"));
  sandbox::test::write_text(bad.path / "b.pub.pem", "-----BEGIN PUBLIC KEY-----\ngarbage\n");
  ticket_verifier partial;
  CHECK(partial.load_keys(bad.path).error() == sandbox::make_error_code(errc::invalid_argument));
  CHECK(partial.empty());
  sandbox::test::temp_dir empty;
  CHECK(partial.load_keys(empty.path).error() == sandbox::make_error_code(errc::not_found));
  CHECK(partial.load_keys(empty.path / "nope").error() ==
        sandbox::make_error_code(errc::not_found));
  // A private key is not a public key; an RSA or EC key is not Ed25519.
  CHECK(partial.load_key(dir.path / "k1.pem").error() ==
        sandbox::make_error_code(errc::invalid_argument));
  EVP_PKEY* ec = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  REQUIRE(ec != nullptr);
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PUBKEY(bio, ec);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  const std::string ec_pem(data, static_cast<std::size_t>(len));
  BIO_free(bio);
  EVP_PKEY_free(ec);
  CHECK(partial.add_key("ec", ec_pem).error() == sandbox::make_error_code(errc::invalid_argument));
  CHECK(ticket_signer::from_pem("k", "").error() ==
        sandbox::make_error_code(errc::invalid_argument));
  CHECK(ticket_signer::from_pem("bad kid", sandbox::generate_ed25519_key()->private_pem).error() ==
        sandbox::make_error_code(errc::invalid_argument));
}
