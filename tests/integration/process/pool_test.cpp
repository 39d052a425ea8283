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

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

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

// Pids of idle pool instances' sandbox-init (PID 1 of a run cgroup named r-*-w*).
// Only this runtime's: its instance id names its run cgroups (r-<instance>-w<hex>) and its
// state directory's runs/<instance>; other processes' pools on the host are left alone.
std::vector<int> idle_instance_inits(const std::string& state_dir) {
  std::vector<int> out;
  std::string ids;
  for (const auto& e : std::filesystem::directory_iterator(state_dir + "/runs")) {
    ids += (ids.empty() ? "" : "|") + e.path().filename().string();
  }
  if (ids.empty()) return out;
  const std::regex mine("/r-(" + ids + ")-w[0-9a-f]+");
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cg(e.path() / "cgroup");
    std::string line, all;
    while (std::getline(cg, line)) all += line + "\n";
    if (!std::regex_search(all, mine)) continue;
    std::ifstream st(e.path() / "status");
    while (std::getline(st, line)) {
      if (line.rfind("NSpid:", 0) == 0 && line.size() > 2 &&
          line.substr(line.size() - 2) == "\t1") {
        out.push_back(std::stoi(pid));
      }
    }
  }
  return out;
}

// The probe prints what a program can see of its sandbox. SINCE (prepended by probe_since) is
// the host's clock just before the run was asked for.
const char* probe = R"PY(
import os, sys, json, resource, stat, time
d = os.environ['SANDBOX_INPUT_DIR']
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
print(json.dumps({
  'env': {k: ('IN-DIR' if k == 'SANDBOX_INPUT_DIR' else v) for k, v in os.environ.items()},
  'input_name_ok': os.path.basename(d).startswith('in-') and len(os.path.basename(d)) == 19,
  'inputs': sorted(os.listdir(d)),
  'argv': sys.argv, 'main': __name__, 'file': __file__, 'cwd': os.getcwd(),
  'stdin': os.read(0, 16).decode(), 'stdin_chr': stat.S_ISCHR(os.fstat(0).st_mode),
  'fds': sorted(os.listdir('/proc/self/fd')),
  'uid_nonzero': os.getuid() != 0, 'gid_is_uid': os.getgid() == os.getuid(),
  'pid': os.getpid(), 'ppid': os.getppid(),
  'rlimits': {n: resource.getrlimit(getattr(resource, n)) for n in
              ('RLIMIT_CORE', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE', 'RLIMIT_NPROC', 'RLIMIT_STACK')},
  'caps': st['CapEff'], 'nnp': st['NoNewPrivs'], 'seccomp': st['Seccomp'],
  'tmp': sorted(os.listdir('/tmp')), 'home': sorted(os.listdir(os.environ['HOME'])),
  'shm': sorted(os.listdir('/dev/shm')), 'out': sorted(os.listdir(os.environ['SANDBOX_OUTPUT_DIR'])),
  'mounts': sorted(l.split()[4] for l in open('/proc/self/mountinfo') if '/sandbox/in-' not in l),
  'hostname': os.uname().nodename,
  # Whether what the sandbox made was made (or its times set) no earlier than the run was
  # asked for: a pooled instance waited seconds before its run, and that must not show (nor
  # when the pool's previous run was). Counted from the request, not from this line, so a
  # slow start (a loaded host, an emulated guest) cannot look like a wait; 1 s for the
  # coarse timestamps of tmpfs.
  'fresh': {('IN-DIR' if p == d else p): [t >= SINCE - 1 for t in (s.st_atime, s.st_mtime, s.st_ctime)]
            for p in ('/', '/tmp', '/dev', '/dev/shm', '/dev/stdout', '/home', os.environ['HOME'],
                      '/sandbox', os.environ['SANDBOX_OUTPUT_DIR'], d, __file__, '/bin',
                      '/.sandbox-etc', '/.sandbox-etc/hosts')
            if os.path.lexists(p) for s in [os.lstat(p)]},
}, sort_keys=True))
)PY";

std::string probe_since(std::chrono::system_clock::time_point t) {
  return fmt::format("SINCE = {:.3f}\n",
                     std::chrono::duration<double>(t.time_since_epoch()).count()) +
         probe;
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
  auto input = itest::put("a,b\n1,2\n");
  // A deadline from the host's calibration (the probe's imports take seconds under the test
  // bed's emulation), in a ticket that admits it.
  sandbox::run_request req{.runtime = "python3",
                           .source = probe_since(std::chrono::system_clock::now()),
                           .timeout = itest::default_deadline()};
  const auto ticket = itest::ticket("itest", std::max(itest::default_deadline(), 8000ms));
  req.files_in = {{.name = "data.csv", .blob = input}};
  auto cold = itest::run(req, ticket);  // the shared runtime has no pool
  pooled_runtime p({{.runtime = "python3", .size = 1}});
  REQUIRE(p.wait_ready(1));
  std::this_thread::sleep_for(3s);  // the instance waits, as pooled instances do
  auto id = p.rt->blobs()->put("itest", "a,b\n1,2\n");
  REQUIRE(id.has_value());
  req.files_in = {{.name = "data.csv", .blob = *id}};
  req.source = probe_since(std::chrono::system_clock::now());
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
  pooled_runtime p({{.runtime = "python3", .size = 2}});
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
}
