// Warm pools: instances prepared ahead, one-shot, refilled asynchronously, health-checked at
// hand-out, bound to the tenant at hand-out — and a pooled run indistinguishable from a cold
// one to the code inside.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
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

/// The flock(2) locks this process holds on `path`'s inode, from /proc/locks (proc(5): one
/// lock per line, "<n>: FLOCK ADVISORY READ|WRITE <pid> <major>:<minor>:<inode> ...", the
/// device numbers in hex; lines with "->" are blocked waiters).
int own_flocks_on(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  char dev[64];
  std::snprintf(dev, sizeof dev, "%02x:%02x:%llu", ::major(st.st_dev), ::minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  int n = 0;
  for (std::string line; std::getline(locks, line);) {
    std::istringstream in(line);
    std::string id, kind, mode, access, pid, where;
    in >> id >> kind;
    if (kind == "->" || kind != "FLOCK") continue;
    in >> mode >> access >> pid >> where;
    if (where == dev && pid == std::to_string(::getpid())) ++n;
  }
  return n;
}

struct pooled_runtime {
  std::string state;
  std::unique_ptr<sandbox::runtime> rt;
  explicit pooled_runtime(std::vector<sandbox::warm_pool_class> classes,
                          std::function<void(sandbox::runtime_options&)> tweak = {}) {
    char tmpl[] = "/tmp/sandbox-pool-XXXXXX";
    state = mkdtemp(tmpl);
    auto opts = sandbox::default_runtime_options();
    opts.state_dir = state + "/state";
    if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
    if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
    opts.blobs = sandbox::make_memory_blob_store();
    opts.process.warm_pool = std::move(classes);
    opts.log = sandbox::make_stderr_log_sink(sandbox::log_level::error);
    if (tweak) tweak(opts);
    auto made = sandbox::runtime::create(opts);
    REQUIRE(made.has_value());
    rt = std::make_unique<sandbox::runtime>(std::move(*made));
  }
  ~pooled_runtime() {
    rt.reset();
    std::filesystem::remove_all(state);
  }
  sandbox::pool_stats stats(std::size_t i = 0) {
    auto s = rt->warm_pool_stats();
    REQUIRE(s.size() > i);
    return s[i];
  }
  // Waits (bounded) until pool `i` has `ready` instances ready.
  bool wait_ready(std::uint32_t ready, std::size_t i = 0) {
    for (int n = 0; n < 500; ++n) {
      if (stats(i).ready >= ready && stats(i).starting == 0) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
};

// Pids of idle pool instances' sandbox-init (PID 1 of their namespace).
std::vector<int> idle_instance_inits(const std::string& state_dir) {
  return pooltest::idle_instance_pids(state_dir, 1);
}

// The whitespace-separated words of `s`, as a set (module lists printed by a run).
std::set<std::string> words_of(const std::string& s) {
  std::set<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.insert(w);
  return out;
}
}  // namespace

TEST_CASE("pool: fills, hands out one-shot instances, refills", "[pool]") {
  auto before = itest::snapshot();
  {
    pooled_runtime p({{.runtime = "python3", .size = 2}});
    REQUIRE(p.wait_ready(2));
    for (int i = 0; i < 3; ++i) {
      auto r = p.rt->run({.runtime = "python3", .source = "print(40 + 2)"}, itest::ticket());
      CHECK(r.code == code::ok);
      CHECK(r.std_out.summary == "42\n");
    }
    CHECK(p.stats().handed_out == 3);
    REQUIRE(p.wait_ready(2));  // refilled
    // A request of another limits class runs cold.
    auto cold =
        p.rt->run({.runtime = "python3", .source = "print(7)", .memory_limit_bytes = 128ULL << 20},
                  itest::ticket());
    CHECK(cold.code == code::ok);
    CHECK(p.stats().handed_out == 3);
    CHECK(p.stats().failed == 0);
  }
  itest::check_host_unchanged(before);  // destroying the runtime destroyed its idle instances
}

TEST_CASE("pool: a pooled run is indistinguishable from a cold one", "[pool]") {
  // Plain pooled instances, and pre-started ones (the interpreter waits in the instance):
  // docs/security.md lists what a pre-started run may see differently, none of it here.
  const bool prestart = GENERATE(false, true);
  INFO("prestart " << prestart);
  auto input = itest::put("a,b\n1,2\n");
  // A deadline from the host's calibration (the probe's imports take seconds under the test
  // bed's emulation), in a ticket that admits it.
  sandbox::run_request req{.runtime = "python3",
                           .source = pooltest::probe_since(std::chrono::system_clock::now()),
                           .timeout = itest::default_deadline()};
  const auto ticket = itest::ticket("itest", std::max(itest::default_deadline(), 8000ms));
  req.files_in = {{.name = "data.csv", .blob = input}};
  auto cold = itest::run(req, ticket);  // the shared runtime has no pool
  pooled_runtime p({{.runtime = "python3", .size = 1, .prestart = prestart}});
  REQUIRE(p.wait_ready(1));
  std::this_thread::sleep_for(3s);  // the instance waits, as pooled instances do
  auto id = p.rt->blobs()->put("itest", "a,b\n1,2\n");
  REQUIRE(id.has_value());
  req.files_in = {{.name = "data.csv", .blob = *id}};
  req.source = pooltest::probe_since(std::chrono::system_clock::now());
  auto warm = p.rt->run(req, ticket);
  REQUIRE(cold.code == code::ok);
  REQUIRE(warm.code == code::ok);
  CHECK(p.stats().handed_out == 1);
  auto jc = nlohmann::json::parse(itest::blob(cold.std_out.blob));
  auto jw = nlohmann::json::parse(*p.rt->blobs()->get("itest", warm.std_out.blob));
  CHECK(jc["input_name_ok"] == true);
  for (const auto& [path, fresh] : jc["fresh"].items()) {
    INFO(path);
    CHECK(fresh == nlohmann::json::array({true, true, true}));
  }
  CHECK(jc.dump() == jw.dump());
}

TEST_CASE("pool: instances that fail to prepare at once are counted, never block runs or shutdown",
          "[pool]") {
  // A limit of 0 bytes passes a policy whose minimum is 0 but is refused by the cgroup write,
  // so every instance fails synchronously inside the refill (which holds the pool's lock).
  auto before = itest::snapshot();
  {
    pooled_runtime p({{.runtime = "python3", .size = 2, .memory_limit_bytes = 0}},
                     [](sandbox::runtime_options& o) { o.policy.min_memory_bytes = 0; });
    for (int n = 0; n < 250 && p.stats().failed < 3; ++n) std::this_thread::sleep_for(20ms);
    CHECK(p.stats().failed >= 3);  // then it backs off instead of spinning
    CHECK(p.stats().ready == 0);
    auto r = p.rt->run({.runtime = "python3", .source = "print('cold')"}, itest::ticket());
    CHECK(r.code == code::ok);
    CHECK(r.std_out.summary == "cold\n");
  }  // destroying the runtime must not hang
  itest::check_host_unchanged(before);
}

TEST_CASE("pool: idle instances keep their image from being removed", "[pool]") {
  // The image store's remove() needs an exclusive flock on the unpacked root; every sandbox
  // using it (here: idle pool instances) holds a shared one until it is destroyed.
  std::filesystem::path root;
  {
    pooled_runtime p({{.runtime = "python3", .size = 1}});
    REQUIRE(p.wait_ready(1));
    auto images = p.rt->images();
    REQUIRE(images);
    auto digest = images->current_digest("python3");
    REQUIRE(digest);
    auto r = images->rootfs(*digest);
    REQUIRE(r);
    root = *r;
    int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    CHECK(::flock(fd, LOCK_EX | LOCK_NB) != 0);
    CHECK(errno == EWOULDBLOCK);
    ::close(fd);
    CHECK(own_flocks_on(root) >= 1);  // the idle instance's shared lock, held by this process
  }
  // The runtime is gone, its instances with it: this process holds no lock on the image now.
  // (Not "no one does": other hosts on this machine, such as tests running beside this one,
  // may use the same image store.)
  CHECK(own_flocks_on(root) == 0);
}

TEST_CASE("pool: a class whose limits are outside the policy is skipped", "[pool]") {
  pooled_runtime p({{.runtime = "python3", .size = 1, .memory_limit_bytes = 1}});
  CHECK(p.rt->warm_pool_stats().empty());
  auto r = p.rt->run({.runtime = "python3", .source = "print(1)"}, itest::ticket());
  CHECK(r.code == code::ok);
}

TEST_CASE("pool: an instance that dies idle is never handed out", "[pool]") {
  pooled_runtime p({{.runtime = "python3", .size = 2}});
  REQUIRE(p.wait_ready(2));
  auto inits = idle_instance_inits(p.state + "/state");
  REQUIRE(inits.size() >= 2);
  for (int pid : inits) kill(pid, SIGKILL);
  // The pool notices (failed), refills, and runs keep working.
  for (int n = 0; n < 200 && p.stats().failed < 2; ++n) std::this_thread::sleep_for(20ms);
  CHECK(p.stats().failed >= 2);
  auto r = p.rt->run({.runtime = "python3", .source = "print('fresh')"}, itest::ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "fresh\n");
  CHECK(p.wait_ready(2));
}

TEST_CASE("pool: nothing of one tenant's run is visible to the next tenant's", "[pool]") {
  const bool prestart = GENERATE(false, true);
  INFO("prestart " << prestart);
  pooled_runtime p({{.runtime = "python3", .size = 2, .prestart = prestart}});
  REQUIRE(p.wait_ready(2));
  auto a = p.rt->run(
      {.runtime = "python3",
       .source =
           "import os\nfor d in ['/tmp', os.environ['HOME'], '/dev/shm', "
           "os.environ['SANDBOX_OUTPUT_DIR']]:\n    open(d + '/tenant-a-secret', 'w').write('A')\n"
           "import time\ntime.sleep(0.2)"},
      itest::ticket("tenant-a"));
  REQUIRE(a.code == code::ok);
  auto b =
      p.rt->run({.runtime = "python3",
                 .source = "import os, glob\nfound = []\nfor d in ['/tmp', os.environ['HOME'], "
                           "'/dev/shm', os.environ['SANDBOX_OUTPUT_DIR'], '/sandbox']:\n"
                           "    found += glob.glob(d + '/**/tenant-a-secret', recursive=True)\n"
                           "print(found)"},
                itest::ticket("tenant-b"));
  REQUIRE(b.code == code::ok);
  CHECK(b.std_out.summary == "[]\n");
  CHECK(p.stats().handed_out == 2);
}

namespace {

// Pids (host) of the pre-started interpreters waiting in this runtime's idle instances: PID 2
// of a run cgroup named r-<instance>-w*.
std::vector<int> idle_interpreters(const std::string& state_dir) {
  return pooltest::idle_instance_pids(state_dir, 2);
}

}  // namespace

TEST_CASE("pool: a pre-started run's modules, __main__ and failures are a cold run's",
          "[pool][prestart]") {
  const auto ticket = itest::ticket("itest", std::max(itest::default_deadline(), 8000ms));
  auto run_req = [&](std::string src) {
    return sandbox::run_request{
        .runtime = "python3", .source = std::move(src), .timeout = itest::default_deadline()};
  };
  // What importing the preload list adds to a fresh interpreter (the documented rule).
  auto closure = itest::run(run_req("import sys\nb = set(sys.modules)\nimport csv, json\n"
                                    "print(' '.join(sorted(set(sys.modules) - b)))"),
                            ticket);
  REQUIRE(closure.code == code::ok);
  pooled_runtime p(
      {{.runtime = "python3", .size = 1, .prestart = true, .preload = {"csv", "json"}}});
  std::uint64_t handed = 0;
  auto both = [&](const std::string& src) {
    auto cold = itest::run(run_req(src), ticket);
    REQUIRE(p.wait_ready(1));
    auto warm = p.rt->run(run_req(src), ticket);
    CHECK(p.stats().handed_out == ++handed);  // it did run pre-started
    return std::pair{cold, warm};
  };
  SECTION("sys.modules is a cold run's plus the preload list's imports") {
    auto [cold, warm] = both("import sys\nprint(' '.join(sorted(sys.modules)))");
    REQUIRE(cold.code == code::ok);
    REQUIRE(warm.code == code::ok);
    auto expected = words_of(cold.std_out.summary);
    for (const auto& m : words_of(closure.std_out.summary)) expected.insert(m);
    CHECK(words_of(warm.std_out.summary) == expected);
    CHECK(words_of(closure.std_out.summary).count("csv") == 1);
  }
  SECTION("__main__, argv, environment") {
    auto [cold, warm] = both(
        "import sys, os\nm = sys.modules['__main__']\n"
        "print(list(vars(m)), m.__spec__, type(m.__loader__).__name__, m.__loader__.name,\n"
        "      m.__loader__.path, m.__file__, m.__cached__, m.__package__, sys.argv,\n"
        "      sys.orig_argv, sorted(k for k in globals() if not k.startswith('__')),\n"
        "      sys._getframe().f_code.co_filename, sys.flags.isolated, os.getcwd(),\n"
        "      [k for k in os.environ if k != 'SANDBOX_INPUT_DIR'], os.getenv('HOME'))");
    REQUIRE(cold.code == code::ok);
    REQUIRE(warm.code == code::ok);
    CHECK(cold.std_out.summary == warm.std_out.summary);
  }
  SECTION("the documented difference: the process's own command line") {
    auto [cold, warm] =
        both("print(b'_sandbox_prestart' in open('/proc/self/cmdline', 'rb').read())");
    CHECK(cold.std_out.summary == "False\n");
    CHECK(warm.std_out.summary == "True\n");  // it did run in the waiting interpreter
  }
  SECTION("an uncaught exception: the same traceback and exit status") {
    auto [cold, warm] = both("def f():\n    return 1 / 0\n\nf()\n");
    CHECK(cold.code == warm.code);
    CHECK(cold.exit_code == warm.exit_code);
    CHECK(warm.exit_code == 1);
    CHECK(cold.std_err.summary == warm.std_err.summary);
    CHECK(warm.std_err.summary.find("Traceback (most recent call last):\n  File "
                                    "\"/sandbox/main.py\", line 4, in <module>") == 0);
  }
  SECTION("a syntax error, and sys.exit") {
    auto [cold, warm] = both("x = (\n");
    CHECK(cold.exit_code == warm.exit_code);
    CHECK(cold.std_err.summary == warm.std_err.summary);
    auto [cold2, warm2] = both("import sys\nprint('a')\nsys.exit(3)\n");
    CHECK(warm2.exit_code == 3);
    CHECK(cold2.exit_code == warm2.exit_code);
    CHECK(cold2.std_out.summary == warm2.std_out.summary);
  }
}

TEST_CASE("pool: a pre-started instance whose interpreter dies idle is never handed out",
          "[pool][prestart]") {
  pooled_runtime p({{.runtime = "python3", .size = 2, .prestart = true}});
  REQUIRE(p.wait_ready(2));
  auto pids = idle_interpreters(p.state + "/state");
  REQUIRE(pids.size() == 2);
  SECTION("sandbox-init reports the death") {}
  SECTION("sandbox-init cannot report it: only the hand-out's own check can catch it") {
    // Stopped, sandbox-init can neither reap the interpreter nor exit: the host hears
    // nothing, and the instance still looks ready and idle.
    for (int pid : idle_instance_inits(p.state + "/state")) kill(pid, SIGSTOP);
  }
  for (int pid : pids) kill(pid, SIGKILL);
  // Dead (not merely signalled), but sandbox-init may not have reported it yet: the hand-out
  // health check must catch it, whatever the pool has heard so far.
  for (int pid : pids) {
    for (int n = 0; n < 1000 && !pooltest::exited(pid); ++n) std::this_thread::sleep_for(5ms);
    REQUIRE(pooltest::exited(pid));
  }
  auto r = p.rt->run({.runtime = "python3", .source = "print('fresh')"}, itest::ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "fresh\n");
  for (int n = 0; n < 500 && p.stats().failed < 2; ++n) std::this_thread::sleep_for(20ms);
  CHECK(p.stats().failed >= 2);
  CHECK(p.wait_ready(2));  // replaced
  auto again = p.rt->run({.runtime = "python3", .source = "print('again')"}, itest::ticket());
  CHECK(again.code == code::ok);
  CHECK(again.std_out.summary == "again\n");
}

TEST_CASE("pool: pre-started classes are checked", "[pool][prestart]") {
  // A runtime that cannot be pre-started (node with an option before the source), invalid
  // module names for the class's runtime, a duplicate, 65 modules, preload without
  // prestart: skipped.
  std::vector<std::string> many;
  for (int i = 0; i < 65; ++i) many.push_back("m" + std::to_string(i));
  pooled_runtime p(
      {{.runtime = "node-flags", .size = 1, .prestart = true},
       {.runtime = "python3", .size = 1, .prestart = true, .preload = {"os..path"}},
       {.runtime = "python3", .size = 1, .prestart = true, .preload = {"json", "json"}},
       {.runtime = "python3", .size = 1, .prestart = true, .preload = {"node:fs"}},
       {.runtime = "node", .size = 1, .prestart = true, .preload = {"../x"}},
       {.runtime = "python3", .size = 1, .prestart = true, .preload = many},
       {.runtime = "python3", .size = 1, .preload = {"json"}}},
      [](sandbox::runtime_options& o) {
        o.runtimes.push_back({.name = "node-flags",
                              .argv = {"/usr/bin/node", "--no-warnings", "{source}"},
                              .source_name = "main.js",
                              .image = "node"});
      });
  CHECK(p.rt->warm_pool_stats().empty());
}

TEST_CASE("pool: a preload list the image cannot import stops its class, with the reason",
          "[pool][prestart]") {
  // A module the image lacks (its import raises ModuleNotFoundError), after one it has:
  // the first preparation fails with the interpreter's own report, the class stops
  // preparing for good and says why, and its runs go cold.
  std::vector<std::string> logged;
  std::mutex mu;
  pooled_runtime q(
      {{.runtime = "python3", .size = 2, .prestart = true, .preload = {"json", "os.nope"}}},
      [&](sandbox::runtime_options& o) {
        o.log = [&](sandbox::log_level l, std::string_view line) {
          std::lock_guard lock(mu);
          if (l == sandbox::log_level::error) logged.emplace_back(line);
        };
      });
  for (int n = 0; n < 500 && q.stats().error.empty(); ++n) std::this_thread::sleep_for(20ms);
  const auto s = q.stats();
  INFO(s.error);
  CHECK(s.error.find("importing preload module 'os.nope' raised 'ModuleNotFoundError: No module "
                     "named 'os.nope'; 'os' is not a package'") != std::string::npos);
  CHECK(s.failed >= 1);
  CHECK(s.ready == 0);
  // Stopped: neither the failures' backoff nor a run of its class prepares another one.
  for (int n = 0; n < 500 && q.stats().starting > 0; ++n) std::this_thread::sleep_for(20ms);
  const auto failed = q.stats().failed;
  auto r = q.rt->run({.runtime = "python3", .source = "print('cold')"}, itest::ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "cold\n");
  CHECK(q.stats().handed_out == 0);  // never a broken instance
  CHECK(q.stats().starting == 0);
  CHECK(q.stats().failed == failed);
  std::lock_guard lock(mu);
  const auto said = std::count_if(logged.begin(), logged.end(), [](const std::string& l) {
    return l.starts_with("warm pool class (runtime 'python3', memory_limit_bytes ") &&
           l.find("preload [json, os.nope]) stopped: ") != std::string::npos &&
           l.find("'ModuleNotFoundError: No module named 'os.nope'") != std::string::npos;
  });
  CHECK(said == 1);  // said once, naming the class, the module and the exception
}

TEST_CASE("pool: a pre-started Node run is a cold one's", "[pool][prestart][node]") {
  const auto ticket = itest::ticket("itest", std::max(itest::default_deadline(), 8000ms));
  auto run_req = [&](std::string src) {
    return sandbox::run_request{
        .runtime = "node", .source = std::move(src), .timeout = itest::default_deadline()};
  };
  auto probe_cold = itest::run(run_req("console.log(1)"), ticket);
  if (probe_cold.code != code::ok && !itest::must_work()) {
    WARN("node runtime unavailable here: " << probe_cold.std_err.summary);
    return;
  }
  REQUIRE(probe_cold.code == code::ok);
  // A built-in and a package the image has (Debian's nodejs brings acorn in /usr/share/nodejs;
  // a cold run tells whether this image does).
  const bool has_acorn =
      itest::run(run_req("require('acorn'); console.log('y')"), ticket).std_out.summary == "y\n";
  std::vector<std::string> preload = {"node:util"};
  if (has_acorn) preload.push_back("acorn");
  pooled_runtime p({{.runtime = "node", .size = 1, .prestart = true, .preload = preload}});
  std::uint64_t handed = 0;
  auto both = [&](const std::string& src) {
    auto cold = itest::run(run_req(src), ticket);
    REQUIRE(p.wait_ready(1));
    auto warm = p.rt->run(run_req(src), ticket);
    CHECK(p.stats().handed_out == ++handed);  // it did run pre-started
    return std::pair{cold, warm};
  };
  SECTION("the main module, argv, environment, working directory, stack") {
    auto [cold, warm] = both(
        "const fs = require('fs');\n"
        "console.log(JSON.stringify({main: require.main === module, mm: process.mainModule === "
        "module, file: __filename, dir: __dirname, id: module.id, paths: module.paths,\n"
        "  parent: module.parent, loaded: module.loaded, children: module.children.length,\n"
        "  argv: process.argv, argv0: process.argv0, execArgv: process.execArgv,\n"
        "  exec: process.execPath, title: process.title, cwd: process.cwd(),\n"
        "  env: Object.entries(process.env).filter(([k]) => k !== 'SANDBOX_INPUT_DIR'),\n"
        "  uid: process.getuid() === process.getgid() && process.getuid() > 0,\n"
        "  tmp: fs.readdirSync('/tmp'),\n"
        "  stack: new Error('x').stack, limit: Error.stackTraceLimit,\n"
        "  prep: typeof Error.prepareStackTrace, exitCode: process.exitCode}));\n");
    REQUIRE(cold.code == code::ok);
    REQUIRE(warm.code == code::ok);
    CHECK(cold.std_out.summary == warm.std_out.summary);
    CHECK(warm.std_out.summary.find("\"main\":true") != std::string::npos);
  }
  SECTION("require.cache is a cold run's plus the preload list's modules") {
    const std::string src = "console.log(Object.keys(require.cache).sort().join(' '))";
    auto [cold, warm] = both(src);
    REQUIRE(cold.code == code::ok);
    REQUIRE(warm.code == code::ok);
    // What requiring the list adds to a cold run's cache (built-ins add nothing).
    auto closure = itest::run(
        run_req("const b = new Set(Object.keys(require.cache));\n" +
                std::string(has_acorn ? "require('acorn');\n" : "") +
                "console.log(Object.keys(require.cache).filter(k => !b.has(k)).sort().join(' '))"),
        ticket);
    REQUIRE(closure.code == code::ok);
    auto expected = words_of(cold.std_out.summary);
    for (const auto& m : words_of(closure.std_out.summary)) expected.insert(m);
    CHECK(words_of(warm.std_out.summary) == expected);
    CHECK(words_of(warm.std_out.summary).count("/sandbox/main.js") == 1);
  }
  SECTION("the documented difference: the process's own command line") {
    auto [cold, warm] = both(
        "console.log(require('fs').readFileSync('/proc/self/cmdline', 'latin1')"
        ".includes('.sandbox-prestart.js'))");
    CHECK(cold.std_out.summary == "false\n");
    CHECK(warm.std_out.summary == "true\n");  // it did run in the waiting interpreter
  }
  SECTION("an uncaught exception: the same stack, message and exit status") {
    auto [cold, warm] = both("function f() {\n  throw new Error('boom');\n}\nf();\n");
    CHECK(cold.exit_code == warm.exit_code);
    CHECK(warm.exit_code == 1);
    CHECK(cold.std_err.summary == warm.std_err.summary);
    CHECK(warm.std_err.summary.find("/sandbox/main.js:2") == 0);
  }
  SECTION("a syntax error, and process.exit") {
    auto [cold, warm] = both("let x = (;\n");
    CHECK(cold.exit_code == warm.exit_code);
    CHECK(cold.std_err.summary == warm.std_err.summary);
    auto [cold2, warm2] = both("console.log('a');\nprocess.exit(3);\n");
    CHECK(warm2.exit_code == 3);
    CHECK(cold2.exit_code == warm2.exit_code);
    CHECK(cold2.std_out.summary == warm2.std_out.summary);
  }
}

TEST_CASE("pool: a Node preload the image cannot require stops its class",
          "[pool][prestart][node]") {
  auto probe = itest::run("console.log(1)", {}, "node");
  if (probe.code != code::ok && !itest::must_work()) return;
  pooled_runtime q(
      {{.runtime = "node", .size = 1, .prestart = true, .preload = {"no-such-package-here"}}});
  for (int n = 0; n < 500 && q.stats().error.empty(); ++n) std::this_thread::sleep_for(20ms);
  INFO(q.stats().error);
  CHECK(q.stats().error.find("importing preload module 'no-such-package-here' raised 'Error: "
                             "Cannot find module 'no-such-package-here''") != std::string::npos);
  CHECK(q.stats().ready == 0);
  auto r = q.rt->run({.runtime = "node", .source = "console.log('cold')"}, itest::ticket());
  CHECK(r.code == code::ok);
  CHECK(r.std_out.summary == "cold\n");
  CHECK(q.stats().handed_out == 0);
}

namespace {
// A pre-started pool of `runtime` (size 1) whose policy lets requests set `TZ`, Node's
// start-up variables and `MY_VAR`; `run` sends `src` with one variable and answers stdout.
struct start_up_env_pool {
  explicit start_up_env_pool(const char* runtime)
      : runtime(runtime),
        p({{.runtime = runtime, .size = 1, .prestart = true}}, [](sandbox::runtime_options& o) {
          o.policy.allowed_env = {"TZ", "NODE_OPTIONS", "UV_THREADPOOL_SIZE", "MY_VAR"};
        }) {}
  std::string run(const char* src, std::string k, std::string v) {
    REQUIRE(p.wait_ready(1));
    sandbox::run_request req{.runtime = runtime, .source = src};
    req.env = {{std::move(k), std::move(v)}};
    auto r = p.rt->run(req, itest::ticket());
    CHECK(r.code == code::ok);
    return r.std_out.summary;
  }
  std::uint64_t handed() { return p.stats(0).handed_out; }
  const char* runtime;
  pooled_runtime p;
};
}  // namespace

TEST_CASE("pool: Python runs setting what the interpreter reads at start-up go cold",
          "[pool][prestart]") {
  start_up_env_pool p("python3");
  // A variable nothing reads at start-up: served pre-started, and the program sees it.
  CHECK(p.run("import os; print(os.environ['MY_VAR'])", "MY_VAR", "a b") == "a b\n");
  CHECK(p.handed() == 1);
  // The time zone: cold (the request's value is what the program sees).
  CHECK(p.run("import os; print(os.environ['TZ'])", "TZ", "UTC") == "UTC\n");
  CHECK(p.handed() == 1);
}

// [node]: Node's cold start-up does not fit the runs' deadlines under the cgroup v2 test
// bed's emulation (tools/run-tests.sh leaves [node] out there).
TEST_CASE("pool: Node runs setting what the interpreter reads at start-up go cold",
          "[pool][prestart][node]") {
  const auto probe = itest::run("console.log(1)", {}, "node");
  if (probe.code != code::ok && !itest::must_work()) {
    WARN("node runtime unavailable here: " << probe.std_err.summary);
    return;
  }
  REQUIRE(probe.code == code::ok);
  start_up_env_pool p("node");
  CHECK(p.run("console.log(process.env.MY_VAR)", "MY_VAR", "x") == "x\n");
  CHECK(p.handed() == 1);
  // Node's options and its thread pool size are read at start-up: cold.
  CHECK(p.run("console.log(process.env.NODE_OPTIONS)", "NODE_OPTIONS", "--no-warnings") ==
        "--no-warnings\n");
  CHECK(p.run("console.log(process.env.UV_THREADPOOL_SIZE)", "UV_THREADPOOL_SIZE", "2") == "2\n");
  CHECK(p.handed() == 1);
}
