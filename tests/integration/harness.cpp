#include "integration/harness.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

namespace itest {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// 40 times a calibrated start-up, within [2 s, 30 s] (default_deadline).
std::chrono::milliseconds deadline_of(std::chrono::milliseconds startup) {
  return std::chrono::milliseconds(std::clamp<long long>(40 * startup.count(), 2000, 30000));
}

struct state {
  std::unique_ptr<sandbox::runtime> runtime;
  std::string why;
  std::filesystem::path state_dir;
  std::string cgroup_parent;
  std::chrono::milliseconds startup{0};  ///< wall time of `print('ok')`, measured at creation
};

state& global() {
  static state s = [] {
    state st;
    auto opts = sandbox::default_runtime_options();
    char tmpl[] = "/tmp/sandbox-itest-XXXXXX";
    st.state_dir = mkdtemp(tmpl);
    chmod(st.state_dir.c_str(), 0755);
    opts.state_dir = st.state_dir / "state";
    if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
    opts.blobs = sandbox::make_memory_blob_store();
    // The tickets bound each test's deadline; the policy's own ceiling (8 s by default) would
    // silently cut a calibrated deadline or a generous one on a slow or loaded host.
    opts.policy.max_timeout = std::chrono::minutes(2);
    if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
    st.cgroup_parent = opts.process.cgroup_parent.empty() ? (geteuid() == 0 ? "/agent-sandbox" : "")
                                                          : opts.process.cgroup_parent;
    opts.log = sandbox::make_stderr_log_sink(sandbox::log_level::warning);
    auto rt = sandbox::runtime::create(opts);
    if (!rt) {
      st.why = "runtime::create failed: " + rt.error().message();
      return st;
    }
    bool have_process = false;
    for (const auto& b : rt->backends()) {
      if (b.isolation == sandbox::isolation::process && b.registered) have_process = true;
      if (b.isolation == sandbox::isolation::process && !b.registered) st.why = b.reason;
    }
    auto cat = rt->catalog();
    for (const char* name : {"python3", "node"}) {
      auto it = cat.runtimes.find(name);
      if (it == cat.runtimes.end() || !it->second) {
        st.why = std::string("runtime image '") + name + "' is not installed (run tools/setup.sh)";
        have_process = false;
      }
    }
    if (have_process) {
      st.runtime = std::make_unique<sandbox::runtime>(std::move(*rt));
      // Warm-up: the first run creates the executor's reactor descriptors (epoll, eventfd,
      // timerfd) for good; later snapshots must not count them as leaks.
      st.runtime->run({.runtime = "python3", .source = "pass"}, ticket());
      // Calibration: what one small run costs on this host as it is now (a loaded 2-core
      // machine, the cgroup v2 test bed's emulated CPU). Deadlines a test did not choose
      // itself scale with it (`default_deadline`).
      auto calib = st.runtime->run({.runtime = "python3", .source = "print('ok')"}, ticket());
      st.startup = calib.code == sandbox::code::ok
                       ? std::chrono::duration_cast<std::chrono::milliseconds>(calib.usage.wall)
                       : std::chrono::milliseconds(1000);
      std::cerr << "itest: calibration: print('ok') took " << st.startup.count()
                << " ms; runs without a timeout of their own get "
                << deadline_of(st.startup).count() << " ms\n";
    }
    return st;
  }();
  return s;
}

std::vector<std::string> list_dir(const std::filesystem::path& p) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(p, ec)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

bool must_work() { return env_or("CI", "") == "true" || env_or("SANDBOX_MUST_WORK", "") == "1"; }

sandbox::runtime* rt() { return global().runtime.get(); }
const std::string& why() { return global().why; }

sandbox::ticket ticket(const std::string& tenant, std::chrono::milliseconds max_timeout,
                       std::uint64_t max_memory) {
  sandbox::ticket_issuer issuer;
  return issuer
      .issue({.id = "itest-ticket",
              .tenant = tenant,
              .execute = true,
              .isolation = sandbox::isolation::process,
              .max_timeout = max_timeout,
              .max_memory_bytes = max_memory})
      .value();
}

std::chrono::milliseconds default_deadline() { return deadline_of(global().startup); }

std::chrono::milliseconds startup_allowance() { return 10 * global().startup; }

sandbox::run_result run(const std::string& source, sandbox::run_request base,
                        const std::string& runtime) {
  base.runtime = runtime;
  base.source = source;
  if (base.timeout == sandbox::run_request{}.timeout) {
    base.timeout = default_deadline();
  }
  return run(base, ticket("itest", std::max(base.timeout, std::chrono::milliseconds(8000))));
}

sandbox::run_result run(const sandbox::run_request& request, const sandbox::ticket& t) {
  REQUIRE(rt() != nullptr);
  auto r = rt()->run(request, t);
  UNSCOPED_INFO("result: code=" << to_string(r.code) << " message=" << r.message << "\nstdout: "
                                << r.std_out.summary << "\nstderr: " << r.std_err.summary);
  return r;
}

std::string blob(const std::string& id, const std::string& tenant) {
  auto b = rt()->blobs()->get(tenant, id);
  REQUIRE(b);
  return *b;
}

std::string put(const std::string& bytes, const std::string& tenant) {
  auto id = rt()->blobs()->put(tenant, bytes);
  REQUIRE(id);
  return *id;
}

std::string helper_source(const std::string& name) {
  std::ifstream in(std::string(SANDBOX_TEST_HELPERS_DIR) + "/" + name);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int count_fds() { return static_cast<int>(list_dir("/proc/self/fd").size()); }

/// This process's descriptor count once it has held still for 100 ms (at most 2 s): a
/// runtime's own thread may still be closing what a just-finished self-test or run used (a
/// v1 cgroup reported busy is retried 100 ms later), and a snapshot taken in that window
/// would count a descriptor that was never a run's.
int settled_fd_count() {
  int last = count_fds();
  int same = 0;
  for (int i = 0; i < 40 && same < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int n = count_fds();
    same = n == last ? same + 1 : 0;
    last = n;
  }
  return last;
}

namespace {
/// The state roots of this process's private runtimes (`private_runtime_options`).
std::vector<std::filesystem::path>& own_state_roots() {
  static std::vector<std::filesystem::path> roots;
  return roots;
}
std::mutex own_state_roots_mutex;

/// The backend instances of this process's runtimes: `<state>/[<sub>/]instances/<id>.lock`
/// under each of its state roots (a runtime holds one per backend while it lives) and its
/// `runs/<id>` directories; once seen, for good (a destroyed runtime's leftovers stay ours).
std::set<std::string> own_instances() {
  static std::mutex m;
  static std::set<std::string> seen;
  std::vector<std::filesystem::path> roots;
  {
    std::lock_guard<std::mutex> lock(own_state_roots_mutex);
    roots = own_state_roots();
  }
  roots.push_back(global().state_dir);
  std::lock_guard<std::mutex> lock(m);
  auto add = [&](const std::filesystem::path& dir) {
    for (const auto& f : list_dir(dir / "instances")) {
      if (f.size() > 5 && f.ends_with(".lock")) seen.insert(f.substr(0, f.size() - 5));
    }
    for (const auto& id : list_dir(dir / "runs")) seen.insert(id);
  };
  for (const auto& root : roots) {
    add(root);
    for (const auto& st : list_dir(root)) {
      add(root / st);
      for (const auto& sub : list_dir(root / st)) add(root / st / sub);
    }
  }
  return seen;
}
}  // namespace

host_snapshot snapshot() {
  host_snapshot s;
  const auto& st = global();
  // Run cgroups are `r-<instance>-<run>`: only those of this process's runtimes are ours.
  // Another test program beside this one (CTest runs two at a time: tests/CMakeLists.txt)
  // has runs of its own, as any other agent on the host would.
  const auto own = own_instances();
  auto is_own_run = [&](std::string_view name) {  // "r-<instance>-<run>[/...]"
    if (name.rfind("r-", 0) != 0) return false;
    const auto dash = name.find('-', 2);
    return dash != std::string_view::npos && own.count(std::string(name.substr(2, dash - 2))) != 0;
  };
  // (Every hierarchy would do; memory is present on v1 and v2 hosts.)
  for (const char* h : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"}) {
    auto dir = std::filesystem::path(h) / st.cgroup_parent.substr(st.cgroup_parent.empty() ? 0 : 1);
    if (st.cgroup_parent.empty()) continue;
    for (auto& n : list_dir(dir)) {
      if (is_own_run(n)) s.cgroups.push_back(std::string(h) + "/" + n);
    }
  }
  auto runs = st.state_dir / "state" / "runs";
  for (auto& inst : list_dir(runs)) {
    for (auto& r : list_dir(runs / inst)) s.workdirs.push_back(inst + "/" + r);
  }
  // Processes in one of our runs' cgroups, and every process of a sandbox uid (root hosts)
  // that is in no run's cgroup at all (escaped): none may outlive a run.
  for (auto& p : list_dir("/proc")) {
    if (p.find_first_not_of("0123456789") != std::string::npos) continue;
    bool in_run_cgroup = false, ours = false;
    std::ifstream cg("/proc/" + p + "/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
      const auto at = line.find("/r-");
      if (at == std::string::npos) continue;
      in_run_cgroup = true;
      if (is_own_run(std::string_view(line).substr(at + 1))) ours = true;
    }
    struct stat sb {};
    if (!in_run_cgroup && stat(("/proc/" + p).c_str(), &sb) == 0 && sb.st_uid >= 2'100'000'000u) {
      ours = true;
    }
    if (ours) s.sandbox_pids.push_back(std::stoi(p));
  }
  std::ifstream mi("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mi, line)) {
    std::istringstream f(line);
    std::string id, parent, devno, root, point;
    f >> id >> parent >> devno >> root >> point;
    // Another test program's runs (its own state root under /tmp): not ours to compare.
    if (point.rfind("/tmp/sandbox-", 0) == 0) {
      bool mine = point.rfind(st.state_dir.string() + "/", 0) == 0;
      std::lock_guard<std::mutex> lock(own_state_roots_mutex);
      for (const auto& r : own_state_roots()) mine = mine || point.rfind(r.string() + "/", 0) == 0;
      if (!mine) continue;
    }
    s.mounts.push_back(point);
  }
  std::sort(s.mounts.begin(), s.mounts.end());
  s.fds = settled_fd_count();
  return s;
}

void adopt_state_root(const std::filesystem::path& root) {
  std::lock_guard<std::mutex> lock(own_state_roots_mutex);
  own_state_roots().push_back(root);
}

sandbox::runtime_options private_runtime_options(std::string* state_root) {
  auto opts = sandbox::default_runtime_options();
  char tmpl[] = "/tmp/sandbox-itest-XXXXXX";
  const char* made = ::mkdtemp(tmpl);
  REQUIRE(made != nullptr);
  *state_root = made;
  adopt_state_root(*state_root);
  opts.state_dir = *state_root + "/state";
  if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
  if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
  opts.blobs = sandbox::make_memory_blob_store();
  opts.log = [](sandbox::log_level, std::string_view) {};
  return opts;
}

void check_host_unchanged(const host_snapshot& before) {
  // Everything of a run is gone when its result returns, except (rarely) a v1 cgroup the
  // kernel still reported busy: that one is removed within 100 ms after. Whatever is still
  // different after 2 s was left behind for good.
  auto same = [&](const host_snapshot& n) {
    return n.cgroups == before.cgroups && n.workdirs == before.workdirs &&
           n.sandbox_pids == before.sandbox_pids && n.mounts == before.mounts &&
           n.fds == before.fds;
  };
  auto now = snapshot();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!same(now) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    now = snapshot();
  }
  CHECK(now.cgroups == before.cgroups);
  CHECK(now.workdirs == before.workdirs);
  CHECK(now.sandbox_pids == before.sandbox_pids);
  CHECK(now.mounts == before.mounts);
  CHECK(now.fds == before.fds);
}

}  // namespace itest
