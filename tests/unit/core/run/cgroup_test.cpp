// cgroup_host / run_cgroup against a fake cgroupfs (see fake_cgroupfs.hpp): what is written
// where, how counters are parsed, and the fallback and error paths.
#include "core/run/cgroup.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <set>
#include <string>

#include "sys/sys.hpp"
#include "unit/core/run/fake_cgroupfs.hpp"

using sandbox::errc;
using sandbox::make_error_code;
using sandbox::detail::cgroup_host;
using sandbox::detail::cgroup_limits;
using sandbox::detail::cgroup_mode;
using sandbox::detail::run_cgroup;
using sandbox::test::fake_cgroupfs;
using sandbox::test::read_text;
using sandbox::test::remove_pid;
using sandbox::test::write_text;
namespace sys = sandbox::detail::sys;
namespace fs = std::filesystem;

namespace {

struct v2_fixture {
  fake_cgroupfs fake;
  sys::scoped_override guard{fake};
  std::vector<std::string> log_lines;

  sandbox::log_sink sink() {
    return [this](sandbox::log_level, std::string_view l) { log_lines.emplace_back(l); };
  }
  sandbox::result<cgroup_host> open(const std::string& parent = "/agent-sandbox",
                                    std::string* why = nullptr) {
    return cgroup_host::open(fake.root, fake.mountinfo, parent, why, sink());
  }
};

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

}  // namespace

TEST_CASE("cgroup v2: open enables controllers from the mount down to the parent", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  std::string why;
  auto host = f.open("/agent-sandbox", &why);
  REQUIRE(host.has_value());
  CHECK(why.empty());
  CHECK(host->mode() == cgroup_mode::v2);
  CHECK(fs::is_directory(f.fake.root / "agent-sandbox"));
  CHECK(f.fake.writes_to_path(f.fake.root / "cgroup.subtree_control") ==
        std::vector<std::string>{"+memory +pids +cpu"});
  CHECK(f.fake.writes_to_path(f.fake.root / "agent-sandbox" / "cgroup.subtree_control") ==
        std::vector<std::string>{"+memory +pids +cpu"});
  CHECK(host->describe().rfind("v2: memory,pids,cpu + kill", 0) == 0);
}

TEST_CASE("cgroup v2: nothing is written where the controllers are already enabled", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  write_text(f.fake.root / "cgroup.subtree_control", "cpu memory pids\n");
  fs::create_directories(f.fake.root / "delegated");
  write_text(f.fake.root / "delegated" / "cgroup.controllers", "cpu memory pids\n");
  write_text(f.fake.root / "delegated" / "cgroup.subtree_control", "memory pids cpu\n");
  auto host = f.open("/delegated/runs");
  REQUIRE(host.has_value());
  CHECK(f.fake.writes_to_path(f.fake.root / "cgroup.subtree_control").empty());
  CHECK(f.fake.writes_to_path(f.fake.root / "delegated" / "cgroup.subtree_control").empty());
  CHECK(f.fake.writes_to_path(f.fake.root / "delegated" / "runs" / "cgroup.subtree_control") ==
        std::vector<std::string>{"+memory +pids +cpu"});
}

TEST_CASE("cgroup v2: a partly enabled level gets only what it lacks", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  write_text(f.fake.root / "cgroup.subtree_control", "memory\n");
  REQUIRE(f.open().has_value());
  CHECK(f.fake.writes_to_path(f.fake.root / "cgroup.subtree_control") ==
        std::vector<std::string>{"+pids +cpu"});
}

TEST_CASE("cgroup v2: create writes the limits", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  f.fake.writes.clear();
  auto rc = host->create(
      "run-1",
      cgroup_limits{.memory_bytes = 64ULL << 20, .max_pids = 32, .cpu_quota_millicores = 250});
  REQUIRE(rc.has_value());
  const fs::path dir = f.fake.root / "agent-sandbox" / "run-1";
  CHECK(rc->dirs() == std::vector<fs::path>{dir});
  CHECK(rc->unified_dir() == std::optional<fs::path>(dir));
  CHECK(f.fake.writes == std::vector<std::pair<std::string, std::string>>{
                             {(dir / "memory.max").string(), "67108864"},
                             {(dir / "memory.swap.max").string(), "0"},
                             {(dir / "memory.oom.group").string(), "1"},
                             {(dir / "pids.max").string(), "32"},
                             {(dir / "cpu.max").string(), "25000 100000"},
                         });
  CHECK(rc->oom_event_fd() >= 0);
}

TEST_CASE("cgroup v2: cpu quota edge values", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  auto quota_for = [&](std::uint32_t millicores, const std::string& name) {
    auto rc = host->create(name, cgroup_limits{.cpu_quota_millicores = millicores});
    REQUIRE(rc.has_value());
    return read_text(f.fake.root / "agent-sandbox" / name / "cpu.max");
  };
  CHECK(quota_for(0, "a") == "max 100000");
  CHECK(quota_for(1, "b") == "1000 100000");  // the kernel's 1 ms minimum
  CHECK(quota_for(1000, "c") == "100000 100000");
  CHECK(quota_for(4000, "d") == "400000 100000");
}

TEST_CASE("cgroup v2: optional files absent on older kernels are skipped", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto t = sandbox::test::v2_template();
  sandbox::test::drop(t, "memory.swap.max");
  sandbox::test::drop(t, "memory.oom.group");
  f.fake.set_template("", t);
  auto host = f.open();
  REQUIRE(host.has_value());
  auto rc = host->create("old", cgroup_limits{});
  REQUIRE(rc.has_value());
  CHECK(read_text(f.fake.root / "agent-sandbox" / "old" / "memory.max") == "268435456");
  CHECK_FALSE(fs::exists(f.fake.root / "agent-sandbox" / "old" / "memory.swap.max"));
}

TEST_CASE("cgroup: create rejects bad names and zero limits, and existing cgroups", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  for (const std::string& bad :
       std::vector<std::string>{"", ".hidden", "..", "a/b", "a b", "x\n", std::string(129, 'a')}) {
    CAPTURE(bad);
    CHECK(host->create(bad, {}).error() == make_error_code(errc::invalid_argument));
  }
  CHECK(host->create("z", cgroup_limits{.memory_bytes = 0}).error() ==
        make_error_code(errc::invalid_argument));
  CHECK(host->create("z", cgroup_limits{.max_pids = 0}).error() ==
        make_error_code(errc::invalid_argument));
  REQUIRE(host->create("dup", {}).has_value());
  CHECK(host->create("dup", {}).error() == make_error_code(errc::already_exists));
}

TEST_CASE("cgroup: a failed limit write leaves nothing behind", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  const fs::path dir = f.fake.root / "agent-sandbox" / "r";
  f.fake.write_errors[(dir / "pids.max").string()] = {EINVAL};
  auto rc = host->create("r", {});
  CHECK(rc.error() == make_error_code(errc::io_error));
  CHECK_FALSE(fs::exists(dir));
  f.fake.open_write_errors[(dir / "memory.max").string()] = {EACCES};
  CHECK(host->create("r", {}).error() == make_error_code(errc::permission_denied));
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("cgroup: EINTR on writes is retried", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  const fs::path dir = f.fake.root / "agent-sandbox" / "r";
  f.fake.write_errors[(dir / "memory.max").string()] = {EINTR, EINTR};
  f.fake.open_write_errors[(dir / "pids.max").string()] = {EINTR};
  auto rc = host->create("r", cgroup_limits{.memory_bytes = 1234});
  REQUIRE(rc.has_value());
  CHECK(read_text(dir / "memory.max") == "1234");
  CHECK(read_text(dir / "pids.max") == "64");
}

TEST_CASE("cgroup v2: attach writes cgroup.procs; is_empty reads cgroup.events", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path dir = f.fake.root / "agent-sandbox" / "r";
  REQUIRE(rc->attach(4242).has_value());
  CHECK(f.fake.writes_to_path(dir / "cgroup.procs") == std::vector<std::string>{"4242"});
  CHECK(rc->attach(0).error() == make_error_code(errc::invalid_argument));
  f.fake.open_write_errors[(dir / "cgroup.procs").string()] = {ESRCH};
  CHECK(rc->attach(77).error() == make_error_code(errc::not_found));

  write_text(dir / "cgroup.events", "populated 1\nfrozen 0\n");
  CHECK(rc->is_empty().value() == false);
  write_text(dir / "cgroup.events", "populated 0\nfrozen 0\n");
  CHECK(rc->is_empty().value() == true);
}

TEST_CASE("cgroup v2: kill_all writes cgroup.kill and signals nothing itself", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  write_text(f.fake.root / "agent-sandbox" / "r" / "cgroup.procs", "100\n101\n");
  REQUIRE(rc->kill_all().has_value());
  CHECK(f.fake.writes_to("cgroup.kill") == std::vector<std::string>{"1"});
  CHECK(f.fake.kills.empty());
}

TEST_CASE("cgroup v2 without cgroup.kill: freeze, SIGKILL until no new pid, thaw", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2(/*with_peak=*/true, /*with_kill=*/false);
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(host->describe().find("freeze + SIGKILL") != std::string::npos);
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path procs = f.fake.root / "agent-sandbox" / "r" / "cgroup.procs";
  // The host itself and pid 1 must never be signalled even if they show up in the list.
  write_text(procs, "100\n101\n1\n" + std::to_string(::getpid()) + "\n");
  bool forked = false;
  f.fake.on_kill = [&](pid_t pid, int) {
    remove_pid(procs, pid);
    if (pid == 100 && !forked) {  // a fork that was in flight when we froze
      forked = true;
      write_text(procs, read_text(procs) + "102\n");
    }
  };
  f.fake.writes.clear();
  REQUIRE(rc->kill_all().has_value());
  std::vector<pid_t> pids;
  for (auto [pid, sig] : f.fake.kills) {
    CHECK(sig == SIGKILL);
    pids.push_back(pid);
  }
  std::sort(pids.begin(), pids.end());
  CHECK(pids == std::vector<pid_t>{100, 101, 102});
  CHECK(f.fake.writes_to("cgroup.freeze") == std::vector<std::string>{"1", "0"});
  CHECK(f.fake.first_write_index("cgroup.freeze") == 0);  // frozen before any signal
}

TEST_CASE("cgroup v2: stats parse memory.events, memory.peak and cpu.stat", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path dir = f.fake.root / "agent-sandbox" / "r";
  write_text(dir / "memory.events", "low 0\nhigh 0\nmax 17\noom 2\noom_kill 3\noom_group_kill 1\n");
  write_text(dir / "memory.peak", "123456789\n");
  write_text(dir / "cpu.stat", "usage_usec 4242\nuser_usec 4000\nsystem_usec 242\n");
  // No pids.events (an old kernel): no refusals counted, and the rest still read.
  auto s = rc->stats();
  REQUIRE(s.has_value());
  CHECK(s->oom_kills == 3);
  CHECK(s->peak_memory_bytes == 123456789);
  CHECK_FALSE(s->peak_is_sampled);
  CHECK(s->cpu_usage_usec == 4242);
  CHECK(s->pids_limit_hits == 0);
  // The pids limit's refusals: the "max" line of pids.events.
  write_text(dir / "pids.events", "max 12\n");
  CHECK(rc->stats()->pids_limit_hits == 12);
}

TEST_CASE("cgroup v2 without memory.peak: the peak is sampled from memory.current", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2(/*with_peak=*/false);
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(host->describe().find("peak sampled") != std::string::npos);
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path cur = f.fake.root / "agent-sandbox" / "r" / "memory.current";
  write_text(cur, "1000\n");
  rc->sample_memory();
  write_text(cur, "5000\n");
  rc->sample_memory();
  write_text(cur, "2000\n");
  rc->sample_memory();
  auto s = rc->stats();
  REQUIRE(s.has_value());
  CHECK(s->peak_is_sampled);
  CHECK(s->peak_memory_bytes == 5000);
  // stats() itself samples too: a rise seen only at the end counts.
  write_text(cur, "9000\n");
  CHECK(rc->stats()->peak_memory_bytes == 9000);
}

TEST_CASE("cgroup v2: the OOM descriptor fires when memory.events changes", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  int fd = rc->oom_event_fd();
  REQUIRE(fd >= 0);
  CHECK_FALSE(readable(fd));
  write_text(f.fake.root / "agent-sandbox" / "r" / "memory.events", "oom_kill 1\n");
  CHECK(readable(fd));
  rc->drain_oom_event_fd();
  CHECK_FALSE(readable(fd));
  CHECK(rc->stats()->oom_kills == 1);
}

TEST_CASE("cgroup: remove refuses a populated cgroup, retries EINTR, is idempotent", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path dir = f.fake.root / "agent-sandbox" / "r";
  write_text(dir / "cgroup.procs", "55\n");
  CHECK(rc->remove().error() == make_error_code(errc::busy));
  CHECK(fs::exists(dir));
  write_text(dir / "cgroup.procs", "");
  f.fake.rmdir_errors[dir.string()] = {EINTR};
  REQUIRE(rc->remove().has_value());
  CHECK_FALSE(fs::exists(dir));
  CHECK(rc->remove().has_value());
  // A removed cgroup counts as empty.
  CHECK(rc->is_empty().value());
}

TEST_CASE("cgroup: list and destroy reclaim stale run cgroups", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  REQUIRE(host->create("stale-b", {}).has_value());
  REQUIRE(host->create("stale-a", {}).has_value());
  CHECK(host->list() == std::vector<std::string>{"stale-a", "stale-b"});

  const fs::path dir = f.fake.root / "agent-sandbox" / "stale-a";
  write_text(dir / "cgroup.procs", "300\n");
  write_text(dir / "cgroup.events", "populated 1\n");
  f.fake.on_write = [&](const std::string& path, const std::string&) {
    if (fs::path(path).filename() == "cgroup.kill") {
      write_text(fs::path(path).parent_path() / "cgroup.events", "populated 0\n");
      write_text(fs::path(path).parent_path() / "cgroup.procs", "");
    }
  };
  f.fake.rmdir_errors[dir.string()] = {EBUSY, EBUSY};  // last exits still being accounted
  REQUIRE(host->destroy("stale-a").has_value());
  CHECK_FALSE(fs::exists(dir));
  CHECK(f.fake.sleeps == 2);
  CHECK(host->list() == std::vector<std::string>{"stale-b"});
  CHECK(host->destroy("never-existed").has_value());
  CHECK(host->destroy("../x").error() == make_error_code(errc::invalid_argument));
}

TEST_CASE("cgroup: destroy gives up (busy) on a cgroup that never empties", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  auto host = f.open();
  REQUIRE(host.has_value());
  REQUIRE(host->create("stuck", {}).has_value());
  const fs::path dir = f.fake.root / "agent-sandbox" / "stuck";
  write_text(dir / "cgroup.events", "populated 1\n");
  CHECK(host->destroy("stuck").error() == make_error_code(errc::busy));
  CHECK(f.fake.sleeps >= 100);  // it polled (sleeps are instant here), bounded
  CHECK(f.fake.writes_to("cgroup.kill").size() >= 2);  // and re-killed while polling
  CHECK(fs::exists(dir));
}

TEST_CASE("cgroup v2 errors: a missing controller is unsupported and named", "[cgroup]") {
  v2_fixture f;
  f.fake.add_mount("", "cgroup2", "rw",
                   {{"cgroup.controllers", "cpu io memory\n"}, {"cgroup.subtree_control", ""}},
                   sandbox::test::v2_template());
  std::string why;
  auto host = f.open("/agent-sandbox", &why);
  CHECK(host.error() == make_error_code(errc::unsupported));
  CHECK(why.find("pids") != std::string::npos);
}

TEST_CASE("cgroup v2 errors: a controller not delegated to the parent is named", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  write_text(f.fake.root / "cgroup.subtree_control", "cpu memory pids\n");
  fs::create_directories(f.fake.root / "user");
  write_text(f.fake.root / "user" / "cgroup.controllers", "cpu memory\n");
  write_text(f.fake.root / "user" / "cgroup.subtree_control", "");
  std::string why;
  auto host = f.open("/user/sandbox", &why);
  CHECK(host.error() == make_error_code(errc::unsupported));
  CHECK(why.find("pids") != std::string::npos);
  CHECK(why.find("user") != std::string::npos);
}

TEST_CASE("cgroup v2 errors: cpu is optional", "[cgroup]") {
  v2_fixture f;
  auto t = sandbox::test::v2_template();
  sandbox::test::drop(t, "cpu.max");
  f.fake.add_mount("", "cgroup2", "rw",
                   {{"cgroup.controllers", "memory pids\n"}, {"cgroup.subtree_control", ""}}, t);
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(host->describe().find("no CPU limit") != std::string::npos);
  CHECK(f.fake.writes_to_path(f.fake.root / "cgroup.subtree_control") ==
        std::vector<std::string>{"+memory +pids"});
  REQUIRE(host->create("r", {}).has_value());
  CHECK(f.fake.writes_to("cpu.max").empty());
}

TEST_CASE("cgroup v2 errors: parent not writable is permission_denied", "[cgroup]") {
  SECTION("mkdir refused") {
    v2_fixture f;
    f.fake.make_v2();
    f.fake.mkdir_errors[(f.fake.root / "agent-sandbox").string()] = {EACCES};
    std::string why;
    CHECK(f.open("/agent-sandbox", &why).error() == make_error_code(errc::permission_denied));
    CHECK(why.find("agent-sandbox") != std::string::npos);
  }
  SECTION("subtree_control refused") {
    v2_fixture f;
    f.fake.make_v2();
    f.fake.open_write_errors[(f.fake.root / "cgroup.subtree_control").string()] = {EPERM};
    CHECK(f.open().error() == make_error_code(errc::permission_denied));
  }
  SECTION("existing parent not writable") {
    v2_fixture f;
    f.fake.make_v2();
    write_text(f.fake.root / "cgroup.subtree_control", "cpu memory pids\n");
    fs::create_directories(f.fake.root / "agent-sandbox");
    write_text(f.fake.root / "agent-sandbox" / "cgroup.controllers", "cpu memory pids\n");
    write_text(f.fake.root / "agent-sandbox" / "cgroup.subtree_control", "cpu memory pids\n");
    f.fake.access_errors[(f.fake.root / "agent-sandbox").string()] = {EACCES};
    std::string why;
    CHECK(f.open("/agent-sandbox", &why).error() == make_error_code(errc::permission_denied));
    CHECK(why.find("W_OK") != std::string::npos);
  }
}

TEST_CASE("cgroup v2 errors: internal processes forbid enabling controllers", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  fs::create_directories(f.fake.root / "host.service");
  write_text(f.fake.root / "host.service" / "cgroup.controllers", "cpu memory pids\n");
  write_text(f.fake.root / "host.service" / "cgroup.subtree_control", "");
  f.fake.write_errors[(f.fake.root / "host.service" / "cgroup.subtree_control").string()] = {EBUSY};
  std::string why;
  CHECK(f.open("/host.service/sandbox", &why).error() == make_error_code(errc::unsupported));
  CHECK(why.find("leaf") != std::string::npos);
}

TEST_CASE("cgroup: bad parents and unreadable mountinfo", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  for (std::string bad : {"", "relative", "/", "//", "/a/../b", "/a/./b"}) {
    CAPTURE(bad);
    CHECK(f.open(bad).error() == make_error_code(errc::invalid_argument));
  }
  auto host = cgroup_host::open(f.fake.root, f.fake.tmp.path / "absent", "/x");
  CHECK(host.error() == make_error_code(errc::io_error));
}

TEST_CASE("cgroup: mounts outside root are ignored; no cgroup mount is unsupported", "[cgroup]") {
  v2_fixture f;
  write_text(f.fake.mountinfo,
             "22 1 0:21 / /sys rw - sysfs sysfs rw\n"
             "garbage line\n"
             "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
             "31 23 0:27 / /elsewhere rw - cgroup cgroup rw,memory\n");
  std::string why;
  CHECK(f.open("/agent-sandbox", &why).error() == make_error_code(errc::unsupported));
  CHECK(why.find("memory") != std::string::npos);
}

TEST_CASE("cgroup: mountinfo escapes in mount points are decoded", "[cgroup]") {
  v2_fixture f;
  f.fake.add_mount("with space", "cgroup2", "rw",
                   {{"cgroup.controllers", "memory pids cpu\n"}, {"cgroup.subtree_control", ""}},
                   sandbox::test::v2_template());
  fs::path odd = f.fake.root / "with space";
  std::string escaped = odd.string();
  escaped.replace(escaped.find(' '), 1, "\\040");
  write_text(f.fake.mountinfo, "30 23 0:26 / " + escaped + " rw shared:4 - cgroup2 cgroup2 rw\n");
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(fs::is_directory(odd / "agent-sandbox"));
}

TEST_CASE("cgroup hybrid: v1 limits, unified kill and events", "[cgroup]") {
  v2_fixture f;
  f.fake.make_hybrid();
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(host->mode() == cgroup_mode::hybrid);
  CHECK(host->describe().rfind("hybrid: v1 memory,pids,cpu + v2 kill,events", 0) == 0);
  CHECK(f.fake.writes_to("cgroup.subtree_control").empty());
  f.fake.writes.clear();
  auto rc = host->create(
      "r", cgroup_limits{.memory_bytes = 1 << 26, .max_pids = 16, .cpu_quota_millicores = 500});
  REQUIRE(rc.has_value());
  const fs::path& root = f.fake.root;
  CHECK(rc->dirs() ==
        std::vector<fs::path>{root / "unified/agent-sandbox/r", root / "memory/agent-sandbox/r",
                              root / "pids/agent-sandbox/r", root / "cpu/agent-sandbox/r"});
  CHECK(rc->unified_dir() == std::optional<fs::path>(root / "unified/agent-sandbox/r"));
  // memory.limit_in_bytes before memsw (the kernel refuses memsw < limit).
  CHECK(f.fake.writes[0] ==
        std::pair<std::string, std::string>(
            (root / "memory/agent-sandbox/r/memory.limit_in_bytes").string(), "67108864"));
  CHECK(f.fake.writes[1] ==
        std::pair<std::string, std::string>(
            (root / "memory/agent-sandbox/r/memory.memsw.limit_in_bytes").string(), "67108864"));
  CHECK(f.fake.writes_to("pids.max") == std::vector<std::string>{"16"});
  CHECK(f.fake.writes_to("cpu.cfs_period_us") == std::vector<std::string>{"100000"});
  CHECK(f.fake.writes_to("cpu.cfs_quota_us") == std::vector<std::string>{"50000"});
  // The OOM eventfd is registered as "<eventfd> <fd of memory.oom_control>".
  auto reg = f.fake.writes_to("cgroup.event_control");
  REQUIRE(reg.size() == 1);
  CHECK(reg[0].find(std::to_string(rc->oom_event_fd()) + " ") == 0);

  // attach: the unified directory first.
  f.fake.writes.clear();
  REQUIRE(rc->attach(99).has_value());
  REQUIRE(f.fake.writes.size() == 4);
  CHECK(f.fake.writes[0].first == (root / "unified/agent-sandbox/r/cgroup.procs").string());

  // is_empty: populated from the unified events, and every v1 cgroup.procs.
  write_text(root / "unified/agent-sandbox/r/cgroup.events", "populated 0\n");
  write_text(root / "pids/agent-sandbox/r/cgroup.procs", "99\n");
  CHECK(rc->is_empty().value() == false);
  for (const auto& d : rc->dirs()) write_text(d / "cgroup.procs", "");
  CHECK(rc->is_empty().value() == true);

  // kill: cgroup.kill in unified; nothing listed in v1 only, so nothing signalled.
  REQUIRE(rc->kill_all().has_value());
  CHECK(f.fake.writes_to_path(root / "unified/agent-sandbox/r/cgroup.kill") ==
        std::vector<std::string>{"1"});
  CHECK(f.fake.kills.empty());
  // A process in the v1 hierarchies only (an OCI runtime that joined just those, e.g. runsc
  // or crun that cannot see the unified mount) is out of cgroup.kill's reach: it gets
  // SIGKILL from the sweep of every v1 cgroup.procs, and nothing is frozen for it.
  write_text(root / "memory/agent-sandbox/r/cgroup.procs", "4242\n");
  write_text(root / "pids/agent-sandbox/r/cgroup.procs", "4242\n4243\n");
  write_text(root / "unified/agent-sandbox/r/cgroup.procs", "7\n");  // dying already: not swept
  f.fake.writes.clear();
  REQUIRE(rc->kill_all().has_value());
  CHECK(f.fake.writes_to_path(root / "unified/agent-sandbox/r/cgroup.kill") ==
        std::vector<std::string>{"1"});
  CHECK(f.fake.writes_to("cgroup.freeze").empty());
  std::set<pid_t> killed;
  for (const auto& k : f.fake.kills) killed.insert(k.first);
  CHECK(killed == std::set<pid_t>{4242, 4243});
  for (const auto& d : rc->dirs()) write_text(d / "cgroup.procs", "");

  // stats: v1 oom_control's oom_kill (not failcnt), max_usage, unified cpu.stat.
  write_text(root / "memory/agent-sandbox/r/memory.oom_control",
             "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
  write_text(root / "memory/agent-sandbox/r/memory.failcnt", "999\n");
  write_text(root / "memory/agent-sandbox/r/memory.max_usage_in_bytes", "67100000\n");
  write_text(root / "unified/agent-sandbox/r/cpu.stat", "usage_usec 777\n");
  write_text(root / "pids/agent-sandbox/r/pids.events", "max 5\n");  // v1 has it too
  auto s = rc->stats();
  REQUIRE(s.has_value());
  CHECK(s->pids_limit_hits == 5);
  CHECK(s->oom_kills == 2);
  CHECK(s->peak_memory_bytes == 67100000);
  CHECK_FALSE(s->peak_is_sampled);
  CHECK(s->cpu_usage_usec == 777);
  REQUIRE(rc->remove().has_value());
  for (const auto& d : rc->dirs()) CHECK_FALSE(fs::exists(d));
}

TEST_CASE("cgroup hybrid without memsw: swappiness 0 instead", "[cgroup]") {
  v2_fixture f;
  f.fake.make_hybrid();
  auto t = sandbox::test::v1_memory_template();
  sandbox::test::drop(t, "memory.memsw.limit_in_bytes");
  f.fake.set_template("memory", t);
  auto host = f.open();
  REQUIRE(host.has_value());
  REQUIRE(host->create("r", {}).has_value());
  CHECK(f.fake.writes_to("memory.memsw.limit_in_bytes").empty());
  CHECK(f.fake.writes_to("memory.swappiness") == std::vector<std::string>{"0"});
}

TEST_CASE("cgroup hybrid: destroy of a half-created cgroup", "[cgroup]") {
  v2_fixture f;
  f.fake.make_hybrid();
  auto host = f.open();
  REQUIRE(host.has_value());
  // A crash between two mkdirs: only the unified and memory directories exist.
  const fs::path& root = f.fake.root;
  REQUIRE(f.fake.mkdir((root / "unified/agent-sandbox/half").c_str(), 0755) == 0);
  REQUIRE(f.fake.mkdir((root / "memory/agent-sandbox/half").c_str(), 0755) == 0);
  CHECK(host->list() == std::vector<std::string>{"half"});
  REQUIRE(host->destroy("half").has_value());
  CHECK_FALSE(fs::exists(root / "unified/agent-sandbox/half"));
  CHECK_FALSE(fs::exists(root / "memory/agent-sandbox/half"));
  CHECK(host->list().empty());
}

TEST_CASE("cgroup v1: freezer, SIGKILL loop, thaw", "[cgroup]") {
  v2_fixture f;
  f.fake.add_mount("memory", "cgroup", "rw,memory", {}, sandbox::test::v1_memory_template());
  f.fake.add_mount("pids", "cgroup", "rw,pids", {}, sandbox::test::v1_pids_template());
  std::vector<std::pair<std::string, std::string>> cpu_cpuacct = sandbox::test::v1_cpu_template();
  cpu_cpuacct.emplace_back("cpuacct.usage", "0\n");
  f.fake.add_mount("cpu,cpuacct", "cgroup", "rw,cpu,cpuacct", {}, cpu_cpuacct);
  f.fake.add_mount("freezer", "cgroup", "rw,freezer", {}, sandbox::test::v1_freezer_template());
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(host->mode() == cgroup_mode::v1);
  CHECK(host->describe().rfind("v1: memory,pids,cpu,cpuacct,freezer", 0) == 0);
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path& root = f.fake.root;
  // cpu and cpuacct co-mounted: one directory for both.
  CHECK(rc->dirs().size() == 4);
  CHECK_FALSE(rc->unified_dir());

  for (const char* h : {"memory", "pids", "cpu,cpuacct", "freezer"}) {
    write_text(root / h / "agent-sandbox/r/cgroup.procs", "200\n201\n");
  }
  f.fake.on_kill = [&](pid_t pid, int) {
    // Frozen v1 tasks only die once thawed: nothing leaves cgroup.procs here.
    (void)pid;
  };
  f.fake.writes.clear();
  REQUIRE(rc->kill_all().has_value());
  CHECK(f.fake.writes_to("freezer.state") == std::vector<std::string>{"FROZEN", "THAWED"});
  CHECK(f.fake.first_write_index("freezer.state") == 0);
  CHECK(f.fake.kills.size() == 2);  // each pid once, although it stays listed
  CHECK(rc->is_empty().value() == false);
  for (const char* h : {"memory", "pids", "cpu,cpuacct", "freezer"}) {
    write_text(root / h / "agent-sandbox/r/cgroup.procs", "");
  }
  CHECK(rc->is_empty().value() == true);

  write_text(root / "cpu,cpuacct/agent-sandbox/r/cpuacct.usage", "5000000\n");  // ns
  CHECK(rc->stats()->cpu_usage_usec == 5000);
}

TEST_CASE("cgroup v1 without freezer: pids.max=0 then SIGKILL loop", "[cgroup]") {
  v2_fixture f;
  f.fake.add_mount("memory", "cgroup", "rw,memory", {}, sandbox::test::v1_memory_template());
  f.fake.add_mount("pids", "cgroup", "rw,pids", {}, sandbox::test::v1_pids_template());
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(host->describe().find("no CPU limit") != std::string::npos);
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path procs = f.fake.root / "pids/agent-sandbox/r/cgroup.procs";
  write_text(procs, "300\n");
  int next = 301;
  f.fake.on_kill = [&](pid_t pid, int) {
    remove_pid(procs, pid);
    if (next < 305) write_text(procs, read_text(procs) + std::to_string(next++) + "\n");
  };
  f.fake.writes.clear();
  REQUIRE(rc->kill_all().has_value());
  CHECK(f.fake.writes.front() ==
        std::pair<std::string, std::string>(
            (f.fake.root / "pids/agent-sandbox/r/pids.max").string(), "0"));
  CHECK(f.fake.kills.size() == 5);  // 300 and the four it "forked" while dying
  CHECK(read_text(procs).empty());
}

TEST_CASE("cgroup v1: the kill loop is bounded even if pids keep appearing", "[cgroup]") {
  v2_fixture f;
  f.fake.add_mount("memory", "cgroup", "rw,memory", {}, sandbox::test::v1_memory_template());
  f.fake.add_mount("pids", "cgroup", "rw,pids", {}, sandbox::test::v1_pids_template());
  auto host = f.open();
  REQUIRE(host.has_value());
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  const fs::path procs = f.fake.root / "pids/agent-sandbox/r/cgroup.procs";
  pid_t next = 1000;
  write_text(procs, "999\n");
  f.fake.on_kill = [&](pid_t, int) { write_text(procs, std::to_string(next++) + "\n"); };
  REQUIRE(rc->kill_all().has_value());
  CHECK(f.fake.kills.size() <= 2000);
  CHECK(f.fake.kills.size() >= 1000);
}

TEST_CASE("cgroup hybrid: an unusable cgroup2 mount degrades to v1, not to failure", "[cgroup]") {
  v2_fixture f;
  f.fake.make_hybrid();
  f.fake.mkdir_errors[(f.fake.root / "unified" / "agent-sandbox").string()] = {EROFS};
  auto host = f.open();
  REQUIRE(host.has_value());
  CHECK(host->mode() == cgroup_mode::v1);
  CHECK(host->describe().rfind("v1: memory,pids,cpu,cpuacct,freezer", 0) == 0);
  auto rc = host->create("r", {});
  REQUIRE(rc.has_value());
  CHECK_FALSE(rc->unified_dir());
  CHECK(rc->dirs().size() == 5);
  CHECK(std::any_of(f.log_lines.begin(), f.log_lines.end(), [](const std::string& l) {
    return l.find("v1 hierarchies only") != std::string::npos;
  }));
}

TEST_CASE("cgroup v2: a cgroup2 mount that cannot be set up is an error", "[cgroup]") {
  v2_fixture f;
  f.fake.make_v2();
  f.fake.mkdir_errors[(f.fake.root / "agent-sandbox").string()] = {EROFS};
  CHECK(f.open().error() == make_error_code(errc::permission_denied));
}
