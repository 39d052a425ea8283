// Consumer check of `sandbox::sandbox` alone: everything here goes through the installed (or
// fetched) public headers and library. No root, no kernel feature and no image is needed:
// the request is decoded, admitted against a ticket (pure), blobs are stored in memory, and a
// runtime without any backend answers `runtime_unavailable` without starting anything.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sandbox/sandbox.hpp>
#include <string>
#include <variant>

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::cerr << "consumer_core: FAILED: " << what << "\n";
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace std::chrono_literals;

  // 1. Blobs: content-addressed and per tenant.
  auto blobs = sandbox::make_memory_blob_store();
  auto id = blobs->put("acme", "lane,rate\nNLRTM-USCHI,0.71\n");
  expect(id.has_value(), "memory blob store put");
  if (!id) return 1;
  expect(*id == sandbox::blob_id_of("lane,rate\nNLRTM-USCHI,0.71\n"), "blob id is the sha256");
  expect(sandbox::is_valid_blob_id(*id), "blob id syntax");
  auto back = blobs->get("acme", *id);
  expect(back.has_value() && *back == "lane,rate\nNLRTM-USCHI,0.71\n", "blob round trip");
  auto foreign = blobs->get("globex", *id);
  expect(
      !foreign.has_value() && foreign.error() == sandbox::make_error_code(sandbox::errc::not_found),
      "another tenant cannot see the blob");

  // 2. A request as the model's tool call would carry it, decoded strictly.
  std::string json = R"j({"v":1,"runtime":"python3","source":"print(open('rates.csv').read())",)j"
                     R"j("timeout_ms":20000,"files_in":[{"name":"rates.csv","blob":")j" +
                     *id + R"j("}]})j";
  auto request = sandbox::decode_run_request(json);
  expect(request.has_value(), "decode_run_request");
  if (!request) return 1;
  expect(request->timeout == 20000ms && request->files_in.size() == 1 && !request->network,
         "decoded fields");
  expect(sandbox::decode_run_request(R"({"runtime":"python3","source":"","shell":"sh"})")
                 .error()
                 .message == "unknown field 'shell'",
         "unknown fields are refused, naming the field");

  // 3. Admission against a ticket, on a catalog that has a process backend and an image.
  sandbox::ticket_issuer issuer;
  auto ticket = issuer.issue({.id = "consumer-1", .tenant = "acme", .max_timeout = 8000ms});
  expect(ticket.has_value(), "ticket_issuer::issue");
  if (!ticket) return 1;
  expect(ticket->allows(sandbox::action::code_execute) &&
             !ticket->allows(sandbox::action::code_network),
         "ticket grants code.execute only");
  sandbox::host_catalog catalog{.levels = {sandbox::isolation::process},
                                .runtimes = {{"python3", sandbox::blob_id_of("image")}}};
  auto decision = sandbox::admit(*request, *ticket, sandbox::policy{}, catalog);
  const auto* admitted = std::get_if<sandbox::admitted>(&decision);
  expect(admitted != nullptr, "request admitted");
  if (admitted != nullptr) {
    expect(admitted->request.timeout == 8000ms && admitted->timeout_clamped,
           "timeout clamped to the ticket's ceiling");
    expect(admitted->isolation == sandbox::isolation::process && admitted->tenant == "acme",
           "isolation and tenant from the ticket");
  }
  auto network = *request;
  network.network = true;
  network.egress = {"api.example.com"};
  auto denied = sandbox::admit(network, *ticket, sandbox::policy{}, catalog);
  const auto* rejection = std::get_if<sandbox::rejection>(&denied);
  expect(rejection != nullptr && rejection->code == sandbox::code::action_denied,
         "network without code.network is action_denied");

  // 4. A real runtime with no backend: nothing starts, the answer is a stable code.
  sandbox::runtime_options options;
  options.blobs = blobs;
  options.fixed_digests = {{"python3", sandbox::blob_id_of("image")}};
  options.process_backend = false;
  auto rt = sandbox::runtime::create(options);
  expect(rt.has_value(), "runtime::create without backends");
  if (!rt) return 1;
  auto result = rt->run(*request, *ticket);
  expect(result.code == sandbox::code::runtime_unavailable, "no backend: runtime_unavailable");
  expect(!result.message.empty(), "the result explains itself");

  // 5. Results round-trip through their wire form (for replay).
  auto decoded = sandbox::decode_run_result(sandbox::encode(result));
  expect(decoded.has_value() && *decoded == result, "run_result encode/decode round trip");

  if (failures != 0) return 1;
  std::cout << "consumer_core: ok (" << sandbox::to_string(result.code) << ": " << result.message
            << ")\n";
  return 0;
}
