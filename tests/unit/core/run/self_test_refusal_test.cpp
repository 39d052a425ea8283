// The start-up self-test refuses a host that cannot give a guarantee, with a reason that
// says what to fix — never registers a weaker backend. Driven against a fake cgroupfs
// (fake_cgroupfs.hpp): this host is cgroup v1-hybrid, production hosts are pure v2.
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <variant>

#include "backends/process/process_backend.hpp"
#include "core/run/cgroup.hpp"
#include "sys/sys.hpp"
#include "unit/core/run/fake_cgroupfs.hpp"

using sandbox::errc;
using sandbox::make_error_code;
using sandbox::detail::cgroup_host;
using sandbox::test::fake_cgroupfs;
using sandbox::test::write_text;
namespace sys = sandbox::detail::sys;
namespace fs = std::filesystem;

namespace {

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// A fake whose `file` ignores what is written to it (it keeps reading `stuck`), like a
/// controller that accepts writes but does not enforce them.
void ignore_writes_to(fake_cgroupfs& fake, std::string file, std::string stuck) {
  fake.on_write = [file = std::move(file), stuck = std::move(stuck)](const std::string& path,
                                                                     const std::string&) {
    if (fs::path(path).filename() == file) write_text(path, stuck);
  };
}

/// make_process_backend against the fake tree (its mountinfo and root); the reason, or ""
/// when it (unexpectedly) registered.
std::string process_backend_refusal(fake_cgroupfs& fake,
                                    const std::string& parent = "/agent-sandbox") {
  boost::asio::io_context io;
  sandbox::test::temp_dir state;
  sandbox::detail::process_backend_context ctx{.executor = io.get_executor(),
                                               .options = {},
                                               .state_dir = state.path,
                                               .log = {},
                                               .policy = {},
                                               .resolve_runtime = {},
                                               .egress = {},
                                               .mountinfo = fake.mountinfo};
  ctx.options.cgroup_root = fake.root;
  ctx.options.cgroup_parent = parent;
  auto made = sandbox::detail::make_process_backend(ctx);
  if (auto* why = std::get_if<std::string>(&made)) return *why;
  std::get<std::shared_ptr<sandbox::backend>>(made)->shutdown();
  return "";
}

}  // namespace

TEST_CASE("self-test: limits written read back on a working v2 tree; nothing is left",
          "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.make_v2();
  std::string why;
  auto host = cgroup_host::open(fake.root, fake.mountinfo, "/agent-sandbox", &why);
  REQUIRE(host.has_value());
  auto v = host->verify_limits("selftest-limits-1", &why);
  INFO(why);
  CHECK(v.has_value());
  CHECK(fake.writes_to("pids.max") == std::vector<std::string>{"16"});
  CHECK(fake.writes_to("memory.max") == std::vector<std::string>{"67108864"});
  CHECK_FALSE(fs::exists(fake.root / "agent-sandbox" / "selftest-limits-1"));
}

TEST_CASE("self-test: a pids limit that does not take effect is refused, naming the file",
          "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.make_v2();
  ignore_writes_to(fake, "pids.max", "max\n");
  auto host = cgroup_host::open(fake.root, fake.mountinfo, "/agent-sandbox");
  REQUIRE(host.has_value());
  std::string why;
  auto v = host->verify_limits("selftest-limits-2", &why);
  CHECK(v.error() == make_error_code(errc::unsupported));
  CHECK(has(why, "cgroup limit not effective"));
  CHECK(has(why, "pids.max"));
  CHECK(has(why, "reads back max"));
  CHECK(has(why, "pids controller"));
  // The test cgroup is removed even so.
  CHECK_FALSE(fs::exists(fake.root / "agent-sandbox" / "selftest-limits-2"));
}

TEST_CASE("self-test: a memory limit that does not take effect is refused (v1 hybrid)",
          "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.make_hybrid();
  ignore_writes_to(fake, "memory.limit_in_bytes", "9223372036854771712\n");
  auto host = cgroup_host::open(fake.root, fake.mountinfo, "/agent-sandbox");
  REQUIRE(host.has_value());
  std::string why;
  auto v = host->verify_limits("selftest-limits-3", &why);
  CHECK(v.error() == make_error_code(errc::unsupported));
  CHECK(has(why, "memory.limit_in_bytes"));
  CHECK(has(why, "memory controller"));
}

TEST_CASE("self-test: a test cgroup that cannot be created is refused with the reason",
          "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.make_v2();
  auto host = cgroup_host::open(fake.root, fake.mountinfo, "/agent-sandbox");
  REQUIRE(host.has_value());
  fake.mkdir_errors[(fake.root / "agent-sandbox" / "selftest-limits-4").string()] = {EACCES};
  std::string why;
  auto v = host->verify_limits("selftest-limits-4", &why);
  CHECK(v.error() == make_error_code(errc::permission_denied));
  CHECK(has(why, "a test cgroup with limits cannot be created"));
}

TEST_CASE(
    "self-test: a pids controller not passed down refuses the process backend, saying "
    "where to enable it",
    "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.make_v2();
  // The delegated subtree /user does not offer pids to the parent below it.
  write_text(fake.root / "cgroup.subtree_control", "cpu memory pids\n");
  fs::create_directories(fake.root / "user");
  write_text(fake.root / "user" / "cgroup.controllers", "cpu memory\n");
  write_text(fake.root / "user" / "cgroup.subtree_control", "");
  std::string why = process_backend_refusal(fake, "/user/sandbox");
  INFO(why);
  CHECK(has(why, "pids controller not available in " + (fake.root / "user").string()));
  CHECK(has(why, "not enabled in " + (fake.root / "cgroup.subtree_control").string()));
  CHECK(has(why, "echo +pids > " + (fake.root / "cgroup.subtree_control").string()));
}

TEST_CASE(
    "self-test: a pids controller that cannot be enabled refuses the process backend, "
    "saying how to enable it",
    "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.make_v2();
  write_text(fake.root / "cgroup.subtree_control", "cpu memory\n");
  fake.open_write_errors[(fake.root / "cgroup.subtree_control").string()] = {EACCES};
  std::string why = process_backend_refusal(fake);
  INFO(why);
  CHECK(has(why, "cgroup subtree not delegated?"));
  CHECK(has(why, "echo '+pids' > " + (fake.root / "cgroup.subtree_control").string()));
}

TEST_CASE("self-test: no pids controller anywhere refuses the process backend", "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.add_mount("", "cgroup2", "rw",
                 {{"cgroup.controllers", "cpu io memory\n"}, {"cgroup.subtree_control", ""}},
                 sandbox::test::v2_template());
  std::string why = process_backend_refusal(fake);
  INFO(why);
  CHECK(has(why, "cgroup pids controller unavailable"));
  CHECK(has(why, "+pids"));
}

TEST_CASE("self-test: a pids limit that is not enforced refuses the process backend",
          "[selftest]") {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fake.make_v2();
  ignore_writes_to(fake, "pids.max", "max\n");
  std::string why = process_backend_refusal(fake);
  INFO(why);
  CHECK(has(why, "cgroup limit not effective"));
  CHECK(has(why, "pids.max"));
}
