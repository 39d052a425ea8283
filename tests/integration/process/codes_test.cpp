// Every code the process backend's runtime can answer, through the real runtime: admission
// codes before anything starts, and `internal` when the sandbox cannot start the program.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <vector>

#include "integration/harness.hpp"

using sandbox::code;
using namespace std::chrono_literals;

TEST_CASE("codes: admission answers through the real runtime start nothing", "[codes]") {
  auto before = itest::snapshot();
  sandbox::ticket_issuer issuer;
  auto base = sandbox::run_request{.runtime = "python3", .source = "print(1)"};

  auto big = base;
  big.source = "#" + std::string(32 * 1024, 'x');
  CHECK(itest::run(big, itest::ticket()).code == code::source_too_large);

  auto no_exec = issuer.issue({.id = "t", .tenant = "itest", .execute = false}).value();
  CHECK(itest::run(base, no_exec).code == code::action_denied);

  auto net = base;
  net.network = true;
  net.egress = {"api.example.com"};
  auto r = itest::run(net, itest::ticket());
  CHECK(r.code == code::action_denied);
  CHECK(r.message.find("code.network") != std::string::npos);

  // Network granted still never means the host's network at the process level.
  auto granted = issuer
                     .issue({.id = "t", .tenant = "itest", .egress = {"api.example.com"}},
                            sandbox::network_grant{})
                     .value();
  CHECK(itest::run(net, granted).code == code::runtime_unavailable);

  auto container =
      issuer.issue({.id = "t", .tenant = "itest", .isolation = sandbox::isolation::container})
          .value();
  auto rc = itest::run(base, container);
  CHECK(rc.code == code::runtime_unavailable);

  auto unknown = base;
  unknown.runtime = "cobol";
  CHECK(itest::run(unknown, itest::ticket()).code == code::invalid_request);

  auto pinned = base;
  pinned.runtime_digest = "sha256:" + std::string(64, '0');
  CHECK(itest::run(pinned, itest::ticket()).code == code::digest_mismatch);
  pinned.runtime_digest = *itest::rt()->catalog().runtimes.at("python3");
  CHECK(itest::run(pinned, itest::ticket()).code == code::ok);

  auto bad_name = base;
  bad_name.files_in = {{.name = "../etc/passwd", .blob = "sha256:" + std::string(64, 'a')}};
  auto rn = itest::run(bad_name, itest::ticket());
  CHECK(rn.code == code::invalid_request);
  CHECK(rn.message.find("files_in[0].name") != std::string::npos);

  auto zero = base;
  zero.timeout = 0ms;
  CHECK(itest::run(zero, itest::ticket()).code == code::invalid_request);
  itest::check_host_unchanged(before);
}

TEST_CASE("codes: a runtime whose interpreter is not in its image is unavailable, sanitized",
          "[codes]") {
  std::string state;
  auto opts = itest::private_runtime_options(&state);
  // The interpreter is looked up in the image when the runtime is created (its runs would
  // otherwise fail at exec, as `internal`): the runtime exists, its runs are refused.
  opts.runtimes = {{.name = "python3",
                    .argv = {"/usr/bin/no-such-interpreter", "{source}"},
                    .source_name = "main.py"}};
  auto rt = sandbox::runtime::create(opts);
  REQUIRE(rt.has_value());
  auto r = rt->run({.runtime = "python3", .source = "print(1)"}, itest::ticket());
  CHECK(r.code == code::runtime_unavailable);
  CHECK(r.message.find('/') == std::string::npos);
  std::filesystem::remove_all(state);
}

TEST_CASE("codes: a runtime definition that breaks the rules is refused at creation", "[codes]") {
  std::string state;
  auto opts = itest::private_runtime_options(&state);
  for (const auto& bad : std::vector<sandbox::runtime_spec>{
           {.name = "Data", .argv = {"/usr/bin/python3", "{source}"}},
           {.name = "data", .argv = {"python3", "{source}"}},
           {.name = "data", .argv = {"/usr/bin/python3"}},
           {.name = "data", .argv = {"/usr/bin/../bin/python3", "{source}"}},
           {.name = "data", .argv = {"/usr/bin/python3", "{source}"}, .source_name = "../x"},
           {.name = "python3", .argv = {"/usr/bin/python3", "{source}"}}}) {  // a duplicate
    opts.runtimes = sandbox::default_runtimes();
    opts.runtimes.push_back(bad);
    auto rt = sandbox::runtime::create(opts);
    REQUIRE_FALSE(rt.has_value());
    CHECK(rt.error() == sandbox::make_error_code(sandbox::errc::invalid_argument));
  }
  std::filesystem::remove_all(state);
}

TEST_CASE("codes: a stored input blob that no longer matches its digest names the field",
          "[codes]") {
  std::string state;
  auto opts = itest::private_runtime_options(&state);
  auto blobs = sandbox::open_fs_blob_store({.root = state + "/blobs"});
  REQUIRE(blobs.has_value());
  opts.blobs = *blobs;
  {
    auto rt = sandbox::runtime::create(opts);
    REQUIRE(rt.has_value());
    auto good = rt->blobs()->put("itest", "a,b\n");
    auto damaged = rt->blobs()->put("itest", "lane,rate\n");
    REQUIRE(good);
    REQUIRE(damaged);
    // The disk changes under the store (bit rot, an operator's mistake).
    const std::string file = state + "/blobs/tenants/itest/" + damaged->substr(7);
    REQUIRE(std::filesystem::remove(file));  // the file is read-only; its directory is not
    std::ofstream(file) << "tampered";
    sandbox::run_request req{.runtime = "python3", .source = "print(1)"};
    req.files_in = {{.name = "a.csv", .blob = *good}, {.name = "rates.csv", .blob = *damaged}};
    auto r = rt->run(req, itest::ticket());
    CHECK(r.code == code::internal);
    CHECK(r.message == "files_in[1].blob: the stored content does not match its digest");
    CHECK(r.message.find('/') == std::string::npos);
  }
  std::filesystem::remove_all(state);
}
