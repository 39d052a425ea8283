// Fuzz target for the protocol decoders (libFuzzer interface; tests/fuzz/replay_main.cpp
// replays a corpus through it under g++).
//
// For every input: decode it as a run_request, a run_result, a ticket, an approval request,
// a signed ticket document, a run record and an execution receipt. Whatever decodes
// must re-encode to JSON that decodes to the same value (else abort()); every rejection must
// be invalid_request with a message that is valid UTF-8 without control characters and of
// bounded size. Decoded requests also go through admission, whose admitted values must
// respect the ceilings and the ticket's and request's image pins.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "sandbox/admission.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/json.hpp"
#include "sandbox/receipt.hpp"
#include "sandbox/record.hpp"
#include "sandbox/signed_ticket.hpp"
#include "sandbox/ticket.hpp"

namespace {

[[noreturn]] void fail(const char* what, std::string_view detail = {}) {
  std::fprintf(stderr, "protocol_fuzz: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

void check_message(const std::string& message) {
  if (message.empty() || message.size() > 512) fail("rejection message size", message);
  if (!sandbox::is_valid_utf8(message)) fail("rejection message is not UTF-8", message);
  for (char c : message) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b == 0x7F) fail("control character in rejection message", message);
  }
}

template <class T>
void check_rejection(const boost::system::result<T, sandbox::rejection>& r) {
  if (r) return;
  if (r.error().code != sandbox::code::invalid_request) fail("decode code", r.error().message);
  check_message(r.error().message);
}

const std::string python_digest = "sha256:" + std::string(64, 'a');  // the catalog's
const std::string other_digest = "sha256:" + std::string(64, 'b');

const sandbox::ticket& ticket(bool network, sandbox::isolation level, const std::string& pin = {}) {
  static const auto make = [](bool net, sandbox::isolation l, const std::string& digest) {
    sandbox::ticket_spec spec{.id = "fuzz", .tenant = "fuzz", .isolation = l};
    if (!digest.empty()) spec.runtime_digest = digest;
    if (net) spec.egress = {"*.example.com", "api.example.org"};
    spec.secrets = {"rates-api", "undefined-here"};
    sandbox::ticket_issuer issuer;
    return net ? *issuer.issue(spec, sandbox::network_grant{}) : *issuer.issue(spec);
  };
  static const sandbox::ticket plain = make(false, sandbox::isolation::process, {});
  static const sandbox::ticket net = make(true, sandbox::isolation::process, {});
  static const sandbox::ticket strong = make(false, sandbox::isolation::gvisor, {});
  static const sandbox::ticket pinned = make(true, sandbox::isolation::process, python_digest);
  static const sandbox::ticket rolled = make(true, sandbox::isolation::process, other_digest);
  if (pin == python_digest) return pinned;
  if (pin == other_digest) return rolled;
  if (level == sandbox::isolation::gvisor) return strong;
  return network ? net : plain;
}

void check_admission(const sandbox::run_request& request) {
  static const sandbox::policy policy = [] {
    sandbox::policy p;
    p.allowed_env = {"A", "B", "PATH", "LD_PRELOAD", "MY_VAR"};
    return p;
  }();
  static const sandbox::host_catalog catalog{
      .levels = {sandbox::isolation::process, sandbox::isolation::container},
      .runtimes = {{"python3", python_digest}, {"node", std::nullopt}},
      .tools = {{"md",
                 {.entry = {.name = "md",
                            .image = "tools",
                            .binary = "/usr/bin/cmark",
                            .isolation = sandbox::isolation::container},
                  .digest = python_digest}}},
      .secrets = {{"rates-api",
                   {.file = "/nonexistent/rates-api",
                    .domains = {"api.example.org"},
                    .header = "Authorization: Bearer {value}"}}}};
  // A ticket granting every registered tool (and code).
  static const sandbox::ticket tools =
      *sandbox::ticket_issuer{}.issue({.id = "fuzz-tools", .tenant = "fuzz", .tools = {"*"}});
  for (const auto* t :
       {&tools, &ticket(false, sandbox::isolation::process),
        &ticket(true, sandbox::isolation::process), &ticket(false, sandbox::isolation::gvisor),
        &ticket(true, sandbox::isolation::process, python_digest),
        &ticket(true, sandbox::isolation::process, other_digest)}) {
    const auto outcome = sandbox::admit(request, *t, policy, catalog);
    if (const auto* rej = std::get_if<sandbox::rejection>(&outcome)) {
      check_message(rej->message);
      continue;
    }
    const auto& a = std::get<sandbox::admitted>(outcome);
    const auto& r = a.request;
    if (r.v != 1) fail("admitted version");
    if (r.timeout.count() <= 0 || r.timeout > t->max_timeout() || r.timeout > policy.max_timeout)
      fail("admitted timeout");
    if (r.memory_limit_bytes < policy.min_memory_bytes ||
        r.memory_limit_bytes > t->max_memory_bytes() ||
        r.memory_limit_bytes > policy.max_memory_bytes)
      fail("admitted memory");
    if (r.source.size() > policy.max_source_bytes) fail("admitted source size");
    if (r.files_in.size() > policy.max_input_files) fail("admitted files_in count");
    for (const auto& f : r.files_in) {
      if (!sandbox::check_file_name(f.name).empty()) fail("admitted file name", f.name);
      if (!sandbox::is_valid_blob_id(f.blob)) fail("admitted blob id", f.blob);
    }
    if (r.files_out.max_files > policy.max_output_files ||
        r.files_out.max_bytes > policy.max_output_bytes)
      fail("admitted files_out");
    for (const auto& [name, value] : r.env) {
      if (policy.allowed_env.count(name) == 0 || name == "PATH" || name.starts_with("LD_"))
        fail("admitted env", name);
    }
    if (!sandbox::is_at_least(a.isolation, t->isolation())) fail("admitted weaker isolation");
    if (r.runtime_digest && *r.runtime_digest != a.runtime.digest) fail("admitted request pin");
    if (t->runtime_digest() && *t->runtime_digest() != a.runtime.digest)
      fail("admitted ticket pin");
    if (r.network && (!t->allows(sandbox::action::code_network) ||
                      !sandbox::is_at_least(a.isolation, sandbox::isolation::container)))
      fail("admitted network");
    if (r.network != !r.egress.empty() || r.egress.size() > sandbox::max_egress_patterns ||
        !sandbox::egress_subset(r.egress, t->egress()))
      fail("admitted egress");
    for (const auto& p : r.egress) {
      if (sandbox::canonical_egress_pattern(p) != p) fail("admitted egress pattern", p);
    }
    if ((r.std_in || r.stdin_blob) && r.tool.empty()) fail("admitted stdin without a tool");
    if (!r.secrets.empty() &&
        (!r.network || !r.tool.empty() || r.secrets.size() > sandbox::max_secrets))
      fail("admitted secrets");
    for (const auto& name : r.secrets) {
      if (!t->allows_secret(name) || !catalog.secrets.contains(name)) fail("admitted secret", name);
    }
    if (!r.tool.empty()) {
      if (!t->allows_tool(r.tool) || a.runtime.name != r.tool) fail("admitted tool", r.tool);
      if (!r.runtime.empty() || !r.source.empty() || r.network) fail("admitted tool fields");
      if (r.std_in && r.std_in->size() > policy.max_stdin_bytes) fail("admitted stdin size");
      if (r.std_in && r.stdin_blob) fail("admitted stdin twice");
      if (!sandbox::is_at_least(a.isolation, sandbox::isolation::container))
        fail("admitted tool below its entry's level");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  if (auto request = sandbox::decode_run_request(input)) {
    const std::string text = sandbox::encode(*request);
    auto again = sandbox::decode_run_request(text);
    if (!again || *again != *request) fail("run_request round trip", text);
    if (sandbox::encode(*again) != text) fail("run_request encoding is not stable", text);
    check_admission(*request);
  } else {
    check_rejection(request);
  }

  if (auto result = sandbox::decode_run_result(input)) {
    const std::string text = sandbox::encode(*result);
    auto again = sandbox::decode_run_result(text);
    if (!again || *again != *result) fail("run_result round trip", text);
  } else {
    check_rejection(result);
  }

  const sandbox::ticket_issuer issuer;
  if (auto t = issuer.decode(input)) {
    const std::string text = sandbox::encode(*t);
    auto again = issuer.decode(text);
    if (!again || *again != *t) fail("ticket round trip", text);
  } else {
    check_rejection(t);
  }

  if (auto q = sandbox::decode_approval_request(input)) {
    const std::string text = sandbox::encode(*q);
    auto again = sandbox::decode_approval_request(text);
    if (!again || *again != *q) fail("approval_request round trip", text);
  } else {
    check_rejection(q);
  }

  // A signed ticket document: whatever the input, the verifier answers action_denied with a
  // clean message (no key verifies a document made up by the fuzzer), never anything else.
  static const sandbox::ticket_verifier verifier = [] {
    sandbox::ticket_verifier v;
    auto keys = sandbox::generate_ed25519_key();
    if (!keys || !v.add_key("k1", keys->public_pem)) fail("verifier setup");
    return v;
  }();
  if (auto t = verifier.verify(input, std::chrono::system_clock::now())) {
    fail("a made-up signed ticket verified");
  } else {
    if (t.error().code != sandbox::code::action_denied) fail("verify code", t.error().message);
    check_message(t.error().message);
  }

  if (auto rec = sandbox::decode_run_record(input)) {
    const std::string text = sandbox::encode(*rec);
    auto again = sandbox::decode_run_record(text);
    if (!again || *again != *rec) fail("run_record round trip", text);
    if (sandbox::encode(*again) != text) fail("run_record encoding is not stable", text);
  } else {
    check_rejection(rec);
  }

  // A receipt: no key the fuzzer knows verifies, so every input is refused cleanly.
  static const sandbox::receipt_verifier receipts = [] {
    sandbox::receipt_verifier v;
    auto keys = sandbox::generate_ed25519_key();
    if (!keys || !v.add_key("r1", keys->public_pem)) fail("receipt verifier setup");
    return v;
  }();
  if (auto c = receipts.verify(input)) {
    fail("a made-up receipt verified");
  } else {
    check_rejection(c);
  }
  return 0;
}
