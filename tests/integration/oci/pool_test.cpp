// Warm pools at the OCI levels (container: crun; gvisor: runsc), plain and pre-started: a
// pooled run is a cold one's to the code inside, but for what docs/security.md lists (the
// container's own mounts keep the times of the instance's preparation); a pre-started
// interpreter that dies idle is never handed out; a preload the image cannot import stops
// its class. The process level's own cases are tests/integration/process/pool_test.cpp.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "integration/common/pool_probe.hpp"
#include "integration/harness.hpp"

using sandbox::code;
using namespace std::chrono_literals;

namespace {

// A runtime of its own with `level` enabled (crun for the container level) and `classes` as
// that level's warm pool; `rt` is null (and `why` says why) when the level is unavailable.
struct oci_pool {
  std::string state_root;
  std::unique_ptr<sandbox::runtime> rt;
  std::string why;
  sandbox::isolation level;

  oci_pool(sandbox::isolation lvl, std::vector<sandbox::warm_pool_class> classes) : level(lvl) {
    auto opts = itest::private_runtime_options(&state_root);
    opts.blobs = sandbox::make_memory_blob_store();
    opts.log = sandbox::make_stderr_log_sink(sandbox::log_level::error);
    // A loaded host starts runsc sandboxes slowly; this tests equivalence, not speed.
    opts.policy.setup_budget = std::chrono::seconds(60);
    if (lvl == sandbox::isolation::gvisor) {
      opts.gvisor.enabled = true;
      opts.gvisor.warm_pool = std::move(classes);
    } else {
      opts.container.enabled = true;
      opts.container.runtime = "crun";
      opts.container.warm_pool = std::move(classes);
    }
    auto made = sandbox::runtime::create(opts);
    if (!made) {
      why = made.error().message();
      return;
    }
    for (const auto& b : made->backends()) {
      if (b.isolation == lvl && !b.registered) why = b.reason;
    }
    if (why.empty()) rt = std::make_unique<sandbox::runtime>(std::move(*made));
  }

  // False (the test is skipped, or FAILs as root under CI) when the level is unavailable.
  bool available() const {
    if (rt) return true;
    const std::string what = std::string(to_string(level)) + " level unavailable: " + why;
    if (itest::must_work() && ::geteuid() == 0) FAIL(what);
    WARN(what << ": skipped");
    return false;
  }

  sandbox::pool_stats stats(std::size_t i = 0) {
    auto s = rt->warm_pool_stats();
    REQUIRE(s.size() > i);
    return s[i];
  }

  // Waits (bounded: 60 s) until pool `i` has `ready` instances ready.
  bool wait_ready(std::uint32_t ready, std::size_t i = 0) {
    for (int n = 0; n < 3000; ++n) {
      if (stats(i).ready >= ready && stats(i).starting == 0) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  sandbox::ticket ticket(std::chrono::milliseconds max_timeout = 30000ms) const {
    return sandbox::ticket_issuer{}
        .issue({.id = "oci-pool-ticket",
                .tenant = "itest",
                .execute = true,
                .isolation = level,
                .max_timeout = max_timeout,
                .max_memory_bytes = 1ULL << 30})
        .value();
  }
};

// The whitespace-separated words of `s`, as a set (module lists printed by a run).
std::set<std::string> words_of(const std::string& s) {
  std::set<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.insert(w);
  return out;
}

// The pooled/cold equivalence at `level`: the probe's view in a cold run and in a pooled one
// (plain, or pre-started when `prestart`), identical but for the file times the level may
// not reset (the container's own mounts: docs/security.md); the source and input directory,
// which the host resets at hand-out, are fresh in both.
void check_equivalence(sandbox::isolation level, bool prestart) {
  oci_pool cold(level, {});
  if (!cold.available()) return;
  oci_pool p(level, {{.runtime = "python3", .size = 1, .prestart = prestart}});
  REQUIRE(p.available());
  REQUIRE(p.wait_ready(1));
  std::this_thread::sleep_for(2s);  // the instance waits, as pooled instances do
  auto run = [](oci_pool& in) {
    auto id = in.rt->blobs()->put("itest", "a,b\n1,2\n");
    REQUIRE(id.has_value());
    sandbox::run_request req{.runtime = "python3",
                             .source = pooltest::probe_since(std::chrono::system_clock::now()),
                             .timeout = std::chrono::seconds(20)};
    req.files_in = {{.name = "data.csv", .blob = *id}};
    auto r = in.rt->run(req, in.ticket());
    INFO(r.message << r.std_err.summary);
    REQUIRE(r.code == code::ok);
    return nlohmann::json::parse(*in.rt->blobs()->get("itest", r.std_out.blob));
  };
  auto jc = run(cold);
  auto jw = run(p);
  CHECK(p.stats().handed_out == 1);  // it did run pooled
  CHECK(jc["input_name_ok"] == true);
  for (auto* j : {&jc, &jw}) {
    for (const char* path : {"IN-DIR", "/sandbox/main.py"}) {
      INFO(path);
      CHECK((*j)["fresh"][path] == nlohmann::json::array({true, true, true}));
    }
  }
  for (const auto& [path, fresh] : jc["fresh"].items()) {
    INFO(path);
    CHECK(fresh == nlohmann::json::array({true, true, true}));  // a cold run's are all fresh
  }
  jc.erase("fresh");
  jw.erase("fresh");
  CHECK(jc.dump() == jw.dump());
}

// A pre-started class with a preload list at `level`: sys.modules is a cold run's plus what
// importing the list adds; an uncaught exception's traceback (no loader frame), a syntax
// error and sys.exit are a cold run's; it did run in the waiting interpreter (its command
// line, the one documented difference).
void check_prestarted_python(sandbox::isolation level) {
  oci_pool cold(level, {});
  if (!cold.available()) return;
  oci_pool p(level,
             {{.runtime = "python3", .size = 1, .prestart = true, .preload = {"csv", "json"}}});
  REQUIRE(p.available());
  auto req = [](std::string src) {
    return sandbox::run_request{
        .runtime = "python3", .source = std::move(src), .timeout = std::chrono::seconds(20)};
  };
  std::uint64_t handed = 0;
  auto both = [&](const std::string& src) {
    auto c = cold.rt->run(req(src), cold.ticket());
    REQUIRE(p.wait_ready(1));
    auto w = p.rt->run(req(src), p.ticket());
    CHECK(p.stats().handed_out == ++handed);  // it did run pre-started
    return std::pair{c, w};
  };
  auto closure = cold.rt->run(req("import sys\nb = set(sys.modules)\nimport csv, json\n"
                                  "print(' '.join(sorted(set(sys.modules) - b)))"),
                              cold.ticket());
  REQUIRE(closure.code == code::ok);
  {
    auto [c, w] = both("import sys\nprint(' '.join(sorted(sys.modules)))");
    REQUIRE(c.code == code::ok);
    REQUIRE(w.code == code::ok);
    auto expected = words_of(c.std_out.summary);
    for (const auto& m : words_of(closure.std_out.summary)) expected.insert(m);
    CHECK(words_of(w.std_out.summary) == expected);
    CHECK(words_of(closure.std_out.summary).count("csv") == 1);
  }
  {
    auto [c, w] = both("print(b'_sandbox_prestart' in open('/proc/self/cmdline', 'rb').read())");
    CHECK(c.std_out.summary == "False\n");
    CHECK(w.std_out.summary == "True\n");
  }
  {
    auto [c, w] = both("def f():\n    return 1 / 0\n\nf()\n");
    CHECK(w.exit_code == 1);
    CHECK(c.exit_code == w.exit_code);
    CHECK(c.std_err.summary == w.std_err.summary);
    CHECK(w.std_err.summary.find("Traceback (most recent call last):\n  File "
                                 "\"/sandbox/main.py\", line 4, in <module>") == 0);
  }
  {
    auto [c, w] = both("x = (\n");
    CHECK(c.exit_code == w.exit_code);
    CHECK(c.std_err.summary == w.std_err.summary);
    auto [c2, w2] = both("import sys\nprint('a')\nsys.exit(3)\n");
    CHECK(w2.exit_code == 3);
    CHECK(c2.std_out.summary == w2.std_out.summary);
  }
}

}  // namespace

TEST_CASE("pool (container, crun): pooled and pre-started runs are a cold one's",
          "[pool][container]") {
  const bool prestart = GENERATE(false, true);
  INFO("prestart " << prestart);
  check_equivalence(sandbox::isolation::container, prestart);
}

TEST_CASE("pool (container, crun): a pre-started run's modules and failures are a cold run's",
          "[pool][prestart][container]") {
  check_prestarted_python(sandbox::isolation::container);
}

TEST_CASE("pool (container, crun): a pre-started Node run is a cold one's",
          "[pool][prestart][container][node]") {
  oci_pool cold(sandbox::isolation::container, {});
  if (!cold.available()) return;
  oci_pool p(sandbox::isolation::container, {{.runtime = "node", .size = 1, .prestart = true}});
  REQUIRE(p.available());
  const std::string src =
      "console.log(JSON.stringify({main: require.main === module, file: __filename,\n"
      "  argv: process.argv, execArgv: process.execArgv, cwd: process.cwd(),\n"
      "  env: Object.entries(process.env).filter(([k]) => k !== 'SANDBOX_INPUT_DIR'),\n"
      "  cache: Object.keys(require.cache), tmp: require('fs').readdirSync('/tmp'),\n"
      "  stack: new Error('x').stack}));\n";
  sandbox::run_request req{.runtime = "node", .source = src, .timeout = std::chrono::seconds(20)};
  auto c = cold.rt->run(req, cold.ticket());
  REQUIRE(p.wait_ready(1));
  auto w = p.rt->run(req, p.ticket());
  REQUIRE(c.code == code::ok);
  REQUIRE(w.code == code::ok);
  CHECK(p.stats().handed_out == 1);
  CHECK(c.std_out.summary == w.std_out.summary);
  CHECK(w.std_out.summary.find("\"main\":true") != std::string::npos);
}

TEST_CASE(
    "pool (container, crun): a pre-started instance whose interpreter dies idle is never "
    "handed out",
    "[pool][prestart][container]") {
  oci_pool p(sandbox::isolation::container, {{.runtime = "python3", .size = 2, .prestart = true}});
  if (!p.available()) return;
  REQUIRE(p.wait_ready(2));
  const std::string state = p.state_root + "/state";
  auto pids = pooltest::idle_instance_pids(state, 2);
  REQUIRE(pids.size() == 2);
  SECTION("sandbox-init reports the death") {}
  SECTION("sandbox-init cannot report it: only the hand-out's own check can catch it") {
    // Stopped, sandbox-init can neither reap the interpreter nor exit: the host hears
    // nothing, and the instance still looks ready and idle. Only the run cgroup's
    // cgroup.procs (crun puts the container's processes there) tells.
    for (int pid : pooltest::idle_instance_pids(state, 1)) kill(pid, SIGSTOP);
  }
  for (int pid : pids) kill(pid, SIGKILL);
  for (int pid : pids) {
    for (int n = 0; n < 1000 && !pooltest::exited(pid); ++n) std::this_thread::sleep_for(5ms);
    REQUIRE(pooltest::exited(pid));
  }
  auto r = p.rt->run({.runtime = "python3", .source = "print('fresh')"}, p.ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "fresh\n");
  CHECK(p.stats().handed_out == 0);  // it ran cold
  for (int n = 0; n < 1500 && p.stats().failed < 2; ++n) std::this_thread::sleep_for(20ms);
  CHECK(p.stats().failed >= 2);
  CHECK(p.wait_ready(2));  // replaced
  auto again = p.rt->run({.runtime = "python3", .source = "print('again')"}, p.ticket());
  CHECK(again.code == code::ok);
  CHECK(again.std_out.summary == "again\n");
  // A live instance does pass the check (one that always failed would pass the above too).
  CHECK(p.stats().handed_out == 1);
}

TEST_CASE("pool (container, crun): a preload the image cannot import stops its class",
          "[pool][prestart][container]") {
  oci_pool q(sandbox::isolation::container,
             {{.runtime = "python3", .size = 1, .prestart = true, .preload = {"os.nope"}}});
  if (!q.available()) return;
  for (int n = 0; n < 3000 && q.stats().error.empty(); ++n) std::this_thread::sleep_for(20ms);
  INFO(q.stats().error);
  CHECK(q.stats().error.find("importing preload module 'os.nope' raised 'ModuleNotFoundError: "
                             "No module named 'os.nope'") != std::string::npos);
  CHECK(q.stats().ready == 0);
  auto r = q.rt->run({.runtime = "python3", .source = "print('cold')"}, q.ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "cold\n");
  CHECK(q.stats().handed_out == 0);
}

TEST_CASE("pool (gvisor): pooled and pre-started runs are a cold one's", "[pool][gvisor]") {
  const bool prestart = GENERATE(false, true);
  INFO("prestart " << prestart);
  check_equivalence(sandbox::isolation::gvisor, prestart);
}

TEST_CASE("pool (gvisor): a pre-started run's modules and failures are a cold run's",
          "[pool][prestart][gvisor]") {
  check_prestarted_python(sandbox::isolation::gvisor);
}
