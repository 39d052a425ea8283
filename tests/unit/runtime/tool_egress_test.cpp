// A registry entry's own egress through the runtime with the fake backend: the host decided
// it when it registered the entry, so a run of it never goes to the approver (installed or
// not), reaches the backend as a network run with exactly the entry's canonical names at the
// entry's level or container (whichever is stronger), and its ticket's missing code.network
// changes nothing. Real backends: tests/conformance/cases/tool_egress_test.cpp.
#include <catch2/catch.hpp>
#include <mutex>

#include "sandbox/sandbox.hpp"
#include "sandbox/testing/fake_backend.hpp"

using namespace std::chrono_literals;
using sandbox::code;
using sandbox::isolation;
using sandbox::testing::fake_backend;

namespace {

sandbox::tool_entry fetcher(isolation level = isolation::process) {
  return {.name = "fetch",
          .image = "python3",
          .binary = "/usr/bin/python3",
          .args = {"-c", "import sys; print(sys.stdin.read())"},
          .isolation = level,
          .egress = {"API.Example.com.", "*.cdn.example.org"}};
}

/// Counts the approver's questions (and answers each with a denial, so that a question asked
/// by mistake would fail the run, not hang it).
struct counting_approver {
  std::mutex mu;
  int asked = 0;
  std::shared_ptr<sandbox::approver> make() {
    return sandbox::make_callback_approver(
        [this](sandbox::approval_request, sandbox::approval_callback answer) {
          {
            std::lock_guard lk(mu);
            ++asked;
          }
          answer(sandbox::approval_decision::deny("asked by mistake"));
        });
  }
  int count() {
    std::lock_guard lk(mu);
    return asked;
  }
};

sandbox::runtime make(std::vector<std::shared_ptr<fake_backend>> fakes,
                      std::shared_ptr<sandbox::approver> approver,
                      std::vector<sandbox::tool_entry> tools = {fetcher()}) {
  auto opts = sandbox::runtime_options{};
  opts.process_backend = false;
  opts.blobs = sandbox::make_memory_blob_store();
  opts.fixed_digests = {{"python3", sandbox::testing::fake_digest("python3")}};
  opts.tools = std::move(tools);
  opts.approver = std::move(approver);
  opts.log = [](sandbox::log_level, std::string_view) {};
  auto rt = sandbox::runtime::create(opts);
  REQUIRE(rt.has_value());
  for (auto& f : fakes) rt->add_backend(f);
  return std::move(*rt);
}

sandbox::ticket tool_ticket(isolation level = isolation::process) {
  return sandbox::ticket_issuer{}
      .issue({.id = "t-tool-egress",
              .tenant = "acme",
              .execute = false,
              .isolation = level,
              .tools = {"fetch"}})
      .value();
}

}  // namespace

TEST_CASE("tool egress: the entry's network needs no code.network and asks no approver",
          "[registry][tools][egress][fake]") {
  auto process = std::make_shared<fake_backend>(isolation::process);
  auto container = std::make_shared<fake_backend>(isolation::container);
  auto gvisor = std::make_shared<fake_backend>(isolation::gvisor);
  counting_approver approver;
  auto rt = make({process, container, gvisor}, approver.make());

  auto r = rt.run({.tool = "fetch", .std_in = "https://api.example.com/x\n"}, tool_ticket());
  INFO("message: " << r.message);
  REQUIRE(r.code == code::ok);
  CHECK(approver.count() == 0);
  CHECK(process->requests().empty());
  const auto seen = container->requests();  // a copy: requests() returns by value
  REQUIRE(seen.size() == 1);
  const auto& adm = seen.front();
  CHECK(adm.request.network);
  // The entry's names, canonical (lowercase, no trailing dot), and nothing else.
  CHECK(adm.request.egress == std::vector<std::string>{"api.example.com", "*.cdn.example.org"});
  CHECK(adm.request.tool == "fetch");

  // A ticket demanding gVisor gets gVisor; the network floor does not lower it.
  r = rt.run({.tool = "fetch", .std_in = "x\n"}, tool_ticket(isolation::gvisor));
  REQUIRE(r.code == code::ok);
  CHECK(gvisor->requests().size() == 1);
  CHECK(approver.count() == 0);

  // The model cannot widen or add a network: refused before any backend or approver.
  sandbox::run_request wider{.tool = "fetch", .std_in = "x\n"};
  wider.network = true;
  wider.egress = {"evil.example"};
  r = rt.run(wider, tool_ticket());
  CHECK(r.code == code::invalid_request);
  CHECK(r.message.rfind("network:", 0) == 0);
  sandbox::run_request names_only{.tool = "fetch", .std_in = "x\n"};
  names_only.egress = {"evil.example"};
  r = rt.run(names_only, tool_ticket());
  CHECK(r.code == code::invalid_request);
  CHECK(r.message.rfind("egress:", 0) == 0);
  CHECK(approver.count() == 0);
  CHECK(container->requests().size() == 1);
  CHECK(gvisor->requests().size() == 1);
}

TEST_CASE("tool egress: with only the process level, the entry's runs are runtime_unavailable",
          "[registry][tools][egress][fake]") {
  auto process = std::make_shared<fake_backend>(isolation::process);
  counting_approver approver;
  auto entry_without = fetcher();
  entry_without.name = "offline";
  entry_without.egress.clear();
  auto rt = make({process}, approver.make(), {fetcher(), entry_without});
  auto r = rt.run({.tool = "fetch", .std_in = "x\n"}, tool_ticket());
  CHECK(r.code == code::runtime_unavailable);
  CHECK(r.message.find("isolation: no backend at level 'container'") != std::string::npos);
  CHECK(process->requests().empty());
  CHECK(approver.count() == 0);
  // The same entry without egress runs at the process level, without the network.
  auto offline =
      sandbox::ticket_issuer{}
          .issue({.id = "t-offline", .tenant = "acme", .execute = false, .tools = {"offline"}})
          .value();
  r = rt.run({.tool = "offline", .std_in = "x\n"}, offline);
  REQUIRE(r.code == code::ok);
  REQUIRE(process->requests().size() == 1);
  CHECK_FALSE(process->requests().front().request.network);
  CHECK(process->requests().front().request.egress.empty());
}
