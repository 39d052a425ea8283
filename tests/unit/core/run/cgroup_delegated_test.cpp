// enter_delegated_cgroup against a fake cgroupfs (fake_cgroupfs.hpp): a service's cgroup as
// systemd's Delegate=yes hands it over is taken in order (the process into <own>/daemon
// first, then the controllers for <own>/runs), and every host where that cannot work is
// refused with a reason that says what to do.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "core/run/cgroup.hpp"
#include "sys/sys.hpp"
#include "unit/core/run/fake_cgroupfs.hpp"

using sandbox::errc;
using sandbox::make_error_code;
using sandbox::detail::enter_delegated_cgroup;
using sandbox::test::fake_cgroupfs;
using sandbox::test::write_text;
namespace sys = sandbox::detail::sys;
namespace fs = std::filesystem;

namespace {

struct service_fixture {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  fs::path proc_cgroup = fake.tmp.path / "proc-self-cgroup";
  fs::path service;  ///< <root>/system.slice/x.service

  /// A pure v2 host where systemd made system.slice/x.service and started us in it.
  explicit service_fixture(bool v2 = true) {
    if (v2) {
      fake.make_v2();
      service = fake.root / "system.slice" / "x.service";
      REQUIRE(fake.mkdir((fake.root / "system.slice").c_str(), 0755) == 0);
      REQUIRE(fake.mkdir(service.c_str(), 0755) == 0);
    } else {
      fake.make_hybrid();
    }
    write_text(proc_cgroup, "0::/system.slice/x.service\n");
  }
  sandbox::result<sandbox::detail::delegated_cgroup> enter(std::string* why) {
    return enter_delegated_cgroup(fake.root, fake.mountinfo, proc_cgroup, why);
  }
};

}  // namespace

TEST_CASE("delegated cgroup: the daemon moves into <own>/daemon, runs go under <own>/runs",
          "[cgroup][delegated]") {
  service_fixture f;
  std::string why;
  auto d = f.enter(&why);
  REQUIRE(d.has_value());
  CHECK(why.empty());
  CHECK(d->own == "/system.slice/x.service");
  CHECK(d->leaf == "/system.slice/x.service/daemon");
  CHECK(d->parent == "/system.slice/x.service/runs");
  CHECK(fs::is_directory(f.service / "runs"));
  // Order matters (no internal processes): the move, then the service's subtree_control.
  const auto& w = f.fake.writes;
  auto index_of = [&](const fs::path& p) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (w[i].first == p.string()) return static_cast<int>(i);
    }
    return -1;
  };
  const int moved = index_of(f.service / "daemon" / "cgroup.procs");
  const int enabled = index_of(f.service / "cgroup.subtree_control");
  REQUIRE(moved >= 0);
  REQUIRE(enabled >= 0);
  CHECK(moved < enabled);
  CHECK(f.fake.writes_to_path(f.service / "daemon" / "cgroup.procs") ==
        std::vector<std::string>{"0"});
  CHECK(f.fake.writes_to_path(f.service / "cgroup.subtree_control") ==
        std::vector<std::string>{"+memory +pids +cpu"});
}

TEST_CASE("delegated cgroup: an existing leaf (a restart in the same cgroup) is reused",
          "[cgroup][delegated]") {
  service_fixture f;
  REQUIRE(f.fake.mkdir((f.service / "daemon").c_str(), 0755) == 0);
  std::string why;
  REQUIRE(f.enter(&why).has_value());
}

TEST_CASE("delegated cgroup: a container's own cgroup (a cgroup namespace's root) is ours",
          "[cgroup][delegated]") {
  service_fixture f;
  write_text(f.proc_cgroup, "0::/\n");
  write_text(f.fake.root / "cgroup.type", "domain\n");  // only non-root cgroups have it
  std::string why;
  auto d = f.enter(&why);
  REQUIRE(d.has_value());
  CHECK(d->leaf == "/daemon");
  CHECK(d->parent == "/runs");
  CHECK(f.fake.writes_to_path(f.fake.root / "daemon" / "cgroup.procs") ==
        std::vector<std::string>{"0"});
}

TEST_CASE("delegated cgroup: hosts where it cannot work are refused with what to do",
          "[cgroup][delegated]") {
  std::string why;
  SECTION("cgroup v1 / hybrid") {
    service_fixture f(false);
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.error() == make_error_code(errc::unsupported));
    CHECK_THAT(why, Catch::Contains("cgroup v1 or hybrid") && Catch::Contains("--cgroup-parent"));
  }
  SECTION("no cgroup2 line in /proc/self/cgroup") {
    service_fixture f;
    write_text(f.proc_cgroup, "4:memory:/x\n");
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.error() == make_error_code(errc::unsupported));
    CHECK_THAT(why, Catch::Contains("0::"));
  }
  SECTION("a malformed path") {
    service_fixture f;
    write_text(f.proc_cgroup, "0::system.slice/../x\n");
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.error() == make_error_code(errc::invalid_argument));
  }
  SECTION("the root cgroup: nothing was delegated") {
    service_fixture f;
    write_text(f.proc_cgroup, "0::/\n");
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.error() == make_error_code(errc::unsupported));
    CHECK_THAT(why, Catch::Contains("root cgroup") && Catch::Contains("Delegate=yes"));
  }
  SECTION("not writable: not delegated to us") {
    service_fixture f;
    f.fake.access_errors[(f.service / "cgroup.subtree_control").string()] = {EACCES};
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.error() == make_error_code(errc::permission_denied));
    CHECK_THAT(why, Catch::Contains("not delegated") && Catch::Contains("Delegate=yes"));
    CHECK(f.fake.writes_to("cgroup.procs").empty());  // nothing moved
  }
  SECTION("memory not offered to the service") {
    service_fixture f;
    write_text(f.service / "cgroup.controllers", "cpu pids\n");
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.error() == make_error_code(errc::unsupported));
    CHECK_THAT(why, Catch::Contains("memory controller is not offered"));
  }
  SECTION("another process still in the service's cgroup (EBUSY)") {
    service_fixture f;
    f.fake.write_errors[(f.service / "cgroup.subtree_control").string()] = {EBUSY};
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK(d.error() == make_error_code(errc::unsupported));
    CHECK_THAT(why, Catch::Contains("runs' cgroup") && Catch::Contains("leaf"));
  }
  SECTION("the move itself fails") {
    service_fixture f;
    f.fake.mkdir_errors[(f.service / "daemon").string()] = {EROFS};
    auto d = f.enter(&why);
    REQUIRE_FALSE(d.has_value());
    CHECK_THAT(why, Catch::Contains("mkdir"));
  }
}
