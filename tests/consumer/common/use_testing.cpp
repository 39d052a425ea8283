// Consumer check of `sandbox::testing`: a tool's unit test as a consumer would write it. The
// fake backend answers from rules, with streams and output files stored as real blobs, so the
// whole async path (admission, blob checks, completion on the caller's executor) runs.
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <iostream>
#include <sandbox/sandbox.hpp>
#include <sandbox/testing/fake_backend.hpp>
#include <string>

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::cerr << "consumer_testing: FAILED: " << what << "\n";
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace std::chrono_literals;
  namespace st = sandbox::testing;

  auto fake = std::make_shared<st::fake_backend>();
  auto rt = st::make_runtime(fake);
  expect(rt.has_value(), "make_runtime");
  if (!rt) return 1;
  auto blobs = rt->blobs();

  // The "program" upper-cases its input file to stdout and to an output file.
  fake->on_source_contains("upper").respond_with([blobs](const sandbox::admitted& a) {
    st::scripted_run run;
    auto text = blobs->get(a.tenant, a.request.files_in.at(0).blob);
    std::string upper = text ? *text : std::string("<missing>");
    for (char& c : upper) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
    run.std_out = upper;
    run.files_out = {{"upper.txt", upper}};
    return run;
  });
  fake->on_source_contains("urlopen").respond(st::result_with(
      sandbox::code::network_disabled,
      {.std_err = "URLError\n",
       .egress_attempts = {
           {.protocol = "dns", .host = "example.com", .reason = "network disabled"}}}));

  auto ticket = sandbox::ticket_issuer{}.issue({.id = "consumer-2", .tenant = "acme"});
  expect(ticket.has_value(), "issue");
  if (!ticket) return 1;
  auto input = blobs->put("acme", "hello sandbox\n");
  expect(input.has_value(), "put input");
  if (!input) return 1;

  sandbox::run_request req{.runtime = "python3",
                           .source = "print(open('in.txt').read().upper())",
                           .timeout = 1000ms,
                           .files_in = {{.name = "in.txt", .blob = *input}}};
  auto future = rt->async_run(req, *ticket, boost::asio::use_future);
  auto r = future.get();
  expect(r.code == sandbox::code::ok && r.exit_code == 0, "ok, exit 0");
  expect(r.std_out.summary == "HELLO SANDBOX\n", "stdout summary");
  expect(r.files_out.size() == 1 && r.files_out[0].name == "upper.txt", "one output file");
  if (r.files_out.size() == 1) {
    auto out = blobs->get("acme", r.files_out[0].blob);
    expect(out.has_value() && *out == "HELLO SANDBOX\n", "output file content by blob id");
  }

  auto net =
      rt->run({.runtime = "python3",
               .source = "import urllib.request; urllib.request.urlopen('https://example.com')"},
              *ticket);
  expect(net.code == sandbox::code::network_disabled, "network_disabled");
  expect(net.egress_attempts.size() == 1 && net.egress_attempts[0].host == "example.com",
         "egress attempt listed");

  auto missing = rt->run({.runtime = "python3",
                          .source = "upper",
                          .files_in = {{.name = "x", .blob = sandbox::blob_id_of("absent")}}},
                         *ticket);
  expect(missing.code == sandbox::code::blob_not_found, "absent input blob: blob_not_found");

  expect(fake->requests().size() == 2, "the fake saw exactly the two admitted runs");

  if (failures != 0) return 1;
  std::cout << "consumer_testing: ok\n";
  return 0;
}
