#include "conformance/suite.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/use_future.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iostream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace conformance {
namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

std::vector<std::string> list_dir(const fs::path& p) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p, ec)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string sha256_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "missing";
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    EVP_DigestUpdate(ctx, buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  unsigned char md[32];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) {
    static const char* d = "0123456789abcdef";
    hex.push_back(d[md[i] >> 4]);
    hex.push_back(d[md[i] & 15]);
  }
  return hex;
}

// Idle warm-pool instances (cgroups r-<instance>-w<hex>, work dirs w<hex>) come and go as
// pools refill: they are the pool's, not a run's, and are excluded from run snapshots.
bool is_pool_instance(std::string_view cgroup_name) {
  auto dash = cgroup_name.find('-', 2);
  return dash != std::string_view::npos && dash + 1 < cgroup_name.size() &&
         cgroup_name[dash + 1] == 'w';
}

std::string cgroup_parent() {
  return env_or("SANDBOX_CGROUP_PARENT", geteuid() == 0 ? "/agent-sandbox" : "");
}

struct state {
  std::vector<std::unique_ptr<sandbox::runtime>> runtimes;
  std::vector<std::unique_ptr<backend>> backends;
  std::vector<std::string> why;
  std::vector<bool> tried;
  std::mutex mu;
};

state& global() {
  static state s;
  return s;
}

}  // namespace

const fs::path& state_root() {
  static const fs::path root = [] {
    char tmpl[] = "/tmp/sandbox-conformance-XXXXXX";
    fs::path p = ::mkdtemp(tmpl);
    ::chmod(p.c_str(), 0755);
    return p;
  }();
  return root;
}

std::map<std::string, std::string> host_binary_hashes(sandbox::runtime& rt) {
  std::map<std::string, std::string> out;
  out["/proc/self/exe (the supervising host)"] = sha256_file("/proc/self/exe");
  if (auto images = rt.images()) {
    for (const char* name : {"python3", "node"}) {
      auto digest = images->current_digest(name);
      if (!digest) continue;
      auto root = images->rootfs(*digest);
      if (!root) continue;
      for (const char* exe :
           {"usr/bin/python3.11", "usr/bin/node", "usr/lib/x86_64-linux-gnu/libc.so.6"}) {
        fs::path p = *root / exe;
        std::error_code ec;
        if (fs::exists(p, ec)) out[p.string()] = sha256_file(p);
      }
    }
  }
  return out;
}

bool must_work() { return env_or("CI", "") == "true" || env_or("SANDBOX_MUST_WORK", "") == "1"; }

const std::string& canary_secret() {
  static const std::string secret = "conformance-canary-" + std::to_string(::getpid()) + "-5e3c";
  return secret;
}

const std::vector<fs::path>& canary_files() {
  static const std::vector<fs::path> files = [] {
    // Named per process: several suites may run on one host at once.
    const std::string name = "conformance-canary-" + std::to_string(::getpid()) + ".txt";
    std::vector<fs::path> out = {fs::path("/tmp") / name};
    if (geteuid() == 0) out.emplace_back(fs::path("/root") / name);
    for (const auto& p : out) {
      std::ofstream(p) << canary_secret() << "\n";
      ::chmod(p.c_str(), 0600);
    }
    return out;
  }();
  return files;
}

std::uint64_t self_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

std::uint64_t peak_memory_ceiling(const sandbox::run_result& r, const expectations& expect) {
  constexpr std::uint64_t memcg_charge_batch_bytes = 64 * 4096;
  return r.memory_limit_bytes + expect.sandbox_kernel_memory_bytes + memcg_charge_batch_bytes;
}

bool init_entry_allowed(const expectations& expect, const std::string& what,
                        const std::string& result) {
  const bool refused = result != "read" && result.rfind("readlink", 0) != 0 &&
                       result.rfind("listed", 0) != 0 && result.rfind("OK", 0) != 0;
  if (refused) return true;
  if (expect.init_hidden) return false;
  // gVisor's procfs: readable for everyone, PID 1 being root's and not dumpable changes
  // nothing for these ...
  if (result == "read") {
    return what == "environ" || what == "auxv" || what == "maps" || what == "status" ||
           what == "comm";
  }
  if (result.rfind("listed", 0) == 0) return what == "fd";
  // ... while its memory, executable, root and working directory stay closed, and of its
  // descriptors only the /dev/null it holds as 0, 1 and 2 opens.
  if (what.rfind("fd/", 0) == 0) return result == "OK /dev/null";
  return false;
}

namespace {
std::atomic<long long> startup_allowance_ms{0};
std::atomic<long long> node_startup_allowance_ms{0};
// The host's load per CPU (×1000) when the allowance in force was measured.
std::atomic<long long> calibration_load_milli{0};
}  // namespace

double host_load_per_cpu() {
  std::ifstream in("/proc/loadavg");
  double one_minute = 0;
  if (!(in >> one_minute) || one_minute < 0) return 0;
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  return one_minute / cpus;
}

double load_factor() {
  const double then = std::max(1.0, calibration_load_milli.load() / 1000.0);
  const double now = std::max(1.0, host_load_per_cpu());
  return std::clamp(now / then, 1.0, 4.0);
}

std::chrono::milliseconds startup_allowance() {
  return std::chrono::milliseconds(
      static_cast<long long>(static_cast<double>(startup_allowance_ms.load()) * load_factor()));
}

std::chrono::milliseconds startup_allowance(std::string_view runtime) {
  const auto common = startup_allowance();
  if (runtime != "node") return common;
  return std::max(common,
                  std::chrono::milliseconds(static_cast<long long>(
                      static_cast<double>(node_startup_allowance_ms.load()) * load_factor())));
}

namespace {
// Only ever raised: where one process runs several profiles, every case gets the largest
// allowance any of their levels measured (generous, never short). The load of the host when
// the one in force was measured is kept with it (load_factor).
void raise_to(std::atomic<long long>& v, long long ms) {
  long long cur = v.load();
  while (ms > cur) {
    if (v.compare_exchange_weak(cur, ms)) {
      calibration_load_milli = static_cast<long long>(host_load_per_cpu() * 1000);
      return;
    }
  }
}
}  // namespace

void set_startup_allowance(std::chrono::milliseconds allowance) {
  raise_to(startup_allowance_ms, allowance.count());
}

void set_node_startup_allowance(std::chrono::milliseconds allowance) {
  raise_to(node_startup_allowance_ms, allowance.count());
}

sandbox::run_request py(std::string source, std::chrono::milliseconds timeout) {
  return {.runtime = "python3", .source = std::move(source), .timeout = timeout};
}

sandbox::run_request js(std::string source, std::chrono::milliseconds timeout) {
  return {.runtime = "node", .source = std::move(source), .timeout = timeout};
}

std::string helper_source(const std::string& name) {
  std::ifstream in(std::string(SANDBOX_TEST_HELPERS_DIR) + "/" + name);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

sandbox::ticket backend::ticket(const std::string& tenant) const {
  return sandbox::ticket_issuer{}
      .issue({.id = "conformance",
              .tenant = tenant,
              .isolation = profile_.level,
              // 8 s plus start-up allowances, and room for crosstalk's checks beside 63
              // other runs (crosstalk_test.cpp, `concurrency_allowance`).
              .max_timeout = std::chrono::seconds(30) + startup_allowance("node"),
              .max_memory_bytes = 1ULL << 30})
      .value();
}

namespace {
void log_result(const sandbox::run_result& r) {
  UNSCOPED_INFO("result: code=" << to_string(r.code) << " exit=" << r.exit_code.value_or(-1)
                                << " signal=" << r.signal.value_or(0) << " message=" << r.message
                                << "\nstart-up allowance: " << startup_allowance().count()
                                << " ms (load factor " << load_factor() << ", host load per CPU "
                                << host_load_per_cpu() << ")"
                                << "\nstdout: " << r.std_out.summary
                                << "\nstderr: " << r.std_err.summary);
}
}  // namespace

bool cell_eligible(const sandbox::run_request& req) {
  return req.runtime == "python3" && !req.network && req.egress.empty() && req.secrets.empty() &&
         req.env.empty() && !req.runtime_digest && req.tool.empty() && !req.std_in &&
         req.memory_limit_bytes == sandbox::run_request{}.memory_limit_bytes;
}

sandbox::run_result run_result_of_cell(const sandbox::cell_result& cell,
                                       const sandbox::session_result& end,
                                       const std::string& run_id) {
  sandbox::run_result r;
  r.code = cell.code;
  r.message = cell.message;
  r.exit_code = cell.exit_code;
  r.signal = cell.signal;
  r.std_out = cell.std_out;
  r.std_err = cell.std_err;
  const bool answered = cell.state == sandbox::interpreter_state::kept &&
                        (cell.code == sandbox::code::ok || cell.code == sandbox::code::error ||
                         cell.code == sandbox::code::network_disabled);
  if (answered) {
    // The driver answered: the cell ran to its end, raising (`error` text) or not.
    if (cell.code == sandbox::code::error) r.code = sandbox::code::ok;
    r.exit_code = cell.error.empty() ? 0 : 1;
    r.std_err.summary += cell.error;
  }
  r.files_out = cell.files_out;
  r.usage = cell.usage;
  r.oom_kills = end.result.oom_kills;
  r.memory_limit_bytes = end.result.memory_limit_bytes;
  r.isolation = end.result.isolation;
  r.runtime = end.result.runtime;
  r.egress_attempts = end.result.egress_attempts;
  r.egress_attempts_dropped = end.result.egress_attempts_dropped;
  r.violation = end.result.violation;
  r.run_id = run_id;
  r.backend = end.result.backend;
  return r;
}

namespace {
/// `req` as the one cell of a fresh interpreter session of `rt` under `t`, then the session
/// closed (every cell's sandbox is gone when this returns, as a run's is).
sandbox::run_result run_as_cell(sandbox::runtime& rt, const sandbox::run_request& req,
                                const sandbox::ticket& t) {
  auto st = rt.async_open_interpreter({.runtime = "python3"}, t, boost::asio::use_future).get();
  if (!st.interpreter) {
    sandbox::run_result r;
    r.code = st.code;
    r.message = "interpreter open: " + st.message;
    return r;
  }
  sandbox::cell_result cell;
  std::promise<sandbox::cell_result> done;
  st.interpreter->async_execute(
      {.code = req.source, .timeout = req.timeout, .files_in = req.files_in},
      [&done](boost::system::error_code, sandbox::cell_result c) { done.set_value(std::move(c)); });
  cell = done.get_future().get();
  const auto end = st.interpreter->async_close(boost::asio::use_future).get();
  return run_result_of_cell(cell, end, st.interpreter->id());
}
}  // namespace

sandbox::run_result backend::run(sandbox::run_request req, const std::string& tenant) {
  req.timeout += startup_allowance(req.runtime);
  auto r = profile_.as_cells && cell_eligible(req) ? run_as_cell(rt_, req, ticket(tenant))
                                                   : rt_.run(std::move(req), ticket(tenant));
  log_result(r);
  return r;
}

std::future<sandbox::run_result> backend::submit(sandbox::run_request req,
                                                 const std::string& tenant) {
  req.timeout += startup_allowance(req.runtime);
  if (profile_.as_cells && cell_eligible(req)) {
    return std::async(std::launch::async, [this, req = std::move(req), t = ticket(tenant)] {
      return run_as_cell(rt_, req, t);
    });
  }
  auto p = std::make_shared<std::promise<sandbox::run_result>>();
  auto f = p->get_future();
  rt_.async_run(
      std::move(req), ticket(tenant),
      [p](boost::system::error_code, sandbox::run_result r) { p->set_value(std::move(r)); });
  return f;
}

std::vector<sandbox::run_result> backend::run_all(std::vector<sandbox::run_request> reqs,
                                                  const std::string& tenant) {
  std::vector<std::future<sandbox::run_result>> fs;
  for (auto& req : reqs) fs.push_back(submit(std::move(req), tenant));
  std::vector<sandbox::run_result> out;
  for (auto& f : fs) out.push_back(f.get());
  return out;
}

std::string backend::blob(const std::string& id, const std::string& tenant) {
  auto b = rt_.blobs()->get(tenant, id);
  REQUIRE(b.has_value());
  return *b;
}

std::string backend::put(const std::string& bytes, const std::string& tenant) {
  auto id = rt_.blobs()->put(tenant, bytes);
  REQUIRE(id.has_value());
  return *id;
}

// --- egress origins ---------------------------------------------------------------------------

namespace {

// GET `path` from 127.0.0.1:`port` (plain HTTP); the body, or "" on failure.
std::string http_get_loopback(std::uint16_t port, const std::string& path) {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return {};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string out;
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req =
        "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(s, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(s, buf, sizeof buf, 0)) > 0;)
        out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(s);
  auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? std::string() : out.substr(body + 4);
}

egress_origin_info start_egress_origin() {
  egress_origin_info info;
  const fs::path dir = state_root() / "egress-origin";
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const std::string gen = fmt::format(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
      "-subj /CN={0} -addext subjectAltName=DNS:{0},DNS:{1} -keyout {2} -out {3} "
      ">/dev/null 2>&1",
      egress_approved_name, egress_other_name, key, cert);
  if (std::system(gen.c_str()) != 0) {
    info.why = "openssl req could not make the origins' certificate (is openssl installed?)";
    return info;
  }
  std::ifstream in(cert);
  info.ca_pem.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  info.cert_file = cert;
  // The server lives as long as this process: its stdin is a pipe we never close, and it
  // is in our process group... so it dies with us (stdin EOF) at the latest.
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) < 0 || ::pipe2(from_child, O_CLOEXEC) < 0) {
    info.why = "pipe failed";
    return info;
  }
  const std::string script = std::string(SANDBOX_TEST_HELPERS_DIR) + "/egress_origin.py";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 1);
    const char* argv[] = {"/usr/bin/python3", script.c_str(), cert.c_str(), key.c_str(), nullptr};
    ::execv(argv[0], const_cast<char**>(argv));
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (pid < 0) {
    info.why = "fork failed";
    return info;
  }
  // (to_child[1] stays open for good: the server exits when we do.)
  std::string line;
  char c;
  pollfd p{from_child[0], POLLIN, 0};
  while (line.size() < 256 && ::poll(&p, 1, 10000) > 0 && ::read(from_child[0], &c, 1) == 1 &&
         c != '\n') {
    line.push_back(c);
  }
  ::close(from_child[0]);
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("http") || !j.contains("https")) {
    info.why = "egress_origin.py did not start: '" + line + "'";
    return info;
  }
  info.http_port = j["http"].get<std::uint16_t>();
  info.https_port = j["https"].get<std::uint16_t>();
  info.ok = true;
  return info;
}

}  // namespace

std::string egress_origin_info::stats() const { return http_get_loopback(http_port, "/stats"); }

const egress_origin_info& egress_origin() {
  static const egress_origin_info info = start_egress_origin();
  return info;
}

// --- snapshots ---------------------------------------------------------------------------------

namespace {
std::set<int> old_zombie_children();
}  // namespace

host_snapshot take_snapshot() {
  host_snapshot s;
  s.unreaped_children = old_zombie_children();
  const std::string parent = cgroup_parent();
  // Run cgroups are `r-<instance>-<run>`. Only instances of this process's runtimes (their
  // locks under our state dirs) are ours: another suite or agent on this host runs its own.
  std::set<std::string> own_instances;
  for (const auto& st : list_dir(state_root())) {
    for (const auto& f : list_dir(state_root() / st / "instances")) {
      if (f.size() > 5 && f.ends_with(".lock")) own_instances.insert(f.substr(0, f.size() - 5));
    }
  }
  auto is_own_run = [&](std::string_view name) {  // name: "r-<instance>-<run>[/...]"
    const auto dash = name.find('-', 2);
    return dash != std::string_view::npos && !is_pool_instance(name) &&
           own_instances.count(std::string(name.substr(2, dash - 2))) != 0;
  };
  if (!parent.empty()) {
    for (const auto& h : list_dir("/sys/fs/cgroup")) {
      fs::path dir = fs::path("/sys/fs/cgroup") / h / parent.substr(1);
      for (const auto& n : list_dir(dir)) {
        if (n.rfind("r-", 0) == 0 && is_own_run(n)) s.run_cgroups.insert(h + ":" + n);
      }
    }
    for (const auto& n : list_dir(fs::path("/sys/fs/cgroup") / parent.substr(1))) {
      if (n.rfind("r-", 0) == 0 && is_own_run(n)) s.run_cgroups.insert("v2:" + n);
    }
  }
  for (const auto& p : list_dir("/proc")) {
    if (p.empty() || p.find_first_not_of("0123456789") != std::string::npos) continue;
    // A process in one of our runs' cgroups; or one with a sandbox uid outside every run
    // cgroup (escaped). Processes of idle pool instances and of other hosts' runs (under any
    // parent) are not.
    bool in_run_cgroup = false;
    bool ours = false;
    std::ifstream cg("/proc/" + p + "/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
      if (line.find("/r-") != std::string::npos) in_run_cgroup = true;
      auto at = parent.empty() ? std::string::npos : line.find(parent + "/r-");
      if (at == std::string::npos) continue;
      if (is_own_run(std::string_view(line).substr(at + parent.size() + 1))) ours = true;
    }
    struct stat sb {};
    if (!in_run_cgroup && stat(("/proc/" + p).c_str(), &sb) == 0 && sb.st_uid >= 2'100'000'000u) {
      ours = true;
    }
    if (ours) s.sandbox_processes.insert(std::stoi(p));
  }
  std::ifstream mi("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mi, line)) {
    std::istringstream f(line);
    std::string id, par, devno, root, point;
    f >> id >> par >> devno >> root >> point;
    // Another suite's runs on this host (its own state root): not ours to compare.
    if (point.rfind("/tmp/sandbox-conformance-", 0) == 0 &&
        point.rfind(state_root().string() + "/", 0) != 0) {
      continue;
    }
    // An idle warm-pool instance's output tmpfs (OCI backends: <runs>/<inst>/w<hex>/out).
    if (point.size() > 4 && point.compare(point.size() - 4, 4, "/out") == 0) {
      auto slash = point.rfind('/', point.size() - 5);
      if (slash != std::string::npos && point[slash + 1] == 'w' &&
          point.find("/runs/") != std::string::npos) {
        continue;
      }
    }
    s.mounts.push_back(root + " " + point);
  }
  std::sort(s.mounts.begin(), s.mounts.end());
  // The process backend keeps its work dirs in <state>/runs, each OCI backend in
  // <state>/<runtime>/runs.
  std::vector<fs::path> run_dirs;
  for (const auto& st : list_dir(state_root())) {
    run_dirs.push_back(state_root() / st / "runs");
    for (const auto& sub : list_dir(state_root() / st))
      run_dirs.push_back(state_root() / st / sub / "runs");
  }
  for (const auto& runs : run_dirs) {
    for (const auto& inst : list_dir(runs)) {
      for (const auto& r : list_dir(runs / inst)) {
        if (r.rfind('w', 0) != 0) s.work_dirs.insert(inst + "/" + r);
      }
    }
  }
  // Pidfds are the library's handles on its own child processes (an OCI runtime's `delete`,
  // reaped after the result, bounded by a kill at 10 s): not a run's leftovers. A process
  // left behind shows in `sandbox_processes`; every other descriptor is counted.
  s.fds = 0;
  for (const auto& fd : list_dir("/proc/self/fd")) {
    std::error_code ec;
    auto target = fs::read_symlink(fs::path("/proc/self/fd") / fd, ec);
    if (!ec && target.string() == "anon_inode:[pidfd]") continue;
    ++s.fds;
  }
  s.threads = static_cast<int>(list_dir("/proc/self/task").size());
  for (const auto& c : canary_files()) {
    struct stat sb {};
    std::string desc = "missing";
    if (::lstat(c.c_str(), &sb) == 0) {
      std::ifstream in(c);
      std::stringstream ss;
      ss << in.rdbuf();
      desc = std::to_string(sb.st_uid) + ":" + std::to_string(sb.st_gid) + " " +
             std::to_string(sb.st_mode) + " " + std::to_string(sb.st_mtim.tv_sec) + "." +
             std::to_string(sb.st_mtim.tv_nsec) + " " + ss.str();
    }
    s.canaries[c.string()] = desc;
  }
  return s;
}

namespace {
// How long child `pid` has been seen as a zombie (first sighting: now).
std::chrono::steady_clock::duration zombie_age(int pid) {
  static std::mutex mu;
  static std::map<int, std::chrono::steady_clock::time_point> first_seen;
  std::lock_guard lock(mu);
  auto now = std::chrono::steady_clock::now();
  auto [it, fresh] = first_seen.try_emplace(pid, now);
  return fresh ? std::chrono::steady_clock::duration::zero() : now - it->second;
}

// This process's children: pid and state letter (/proc/<pid>/stat).
std::vector<std::pair<int, char>> own_children() {
  std::vector<std::pair<int, char>> out;
  const std::string self = std::to_string(::getpid());
  for (const auto& p : list_dir("/proc")) {
    if (p.empty() || p.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream st("/proc/" + p + "/stat");
    std::string stat;
    std::getline(st, stat);
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream f(stat.substr(close + 1));
    std::string state, ppid;
    f >> state >> ppid;
    if (ppid == self && !state.empty()) out.emplace_back(std::stoi(p), state[0]);
  }
  return out;
}

// Our zombie children older than 3 s (see host_snapshot::unreaped_children).
std::set<int> old_zombie_children() {
  std::set<int> out;
  for (auto [pid, state] : own_children()) {
    if (state == 'Z' && zombie_age(pid) >= std::chrono::seconds(3)) out.insert(pid);
  }
  return out;
}

// True while a child of this process is an OCI runtime still tearing down a finished run:
// its `delete`, the `run` of a run (not of an idle warm-pool instance) still exiting, or one
// ended and not reaped yet. The OCI backends delete a run's container after its result
// (runsc's takes seconds on a loaded host) and hold descriptors for it until it is reaped,
// so a snapshot taken meanwhile counts descriptors that go away. (Called between cases only,
// when every run has its result.)
bool runtime_teardown_running() {
  for (auto [pid, state] : own_children()) {
    // Ended, its descriptors not yet closed by its reaper — unless it has been a zombie for
    // more than 3 s: then nobody will reap it (a leak the snapshot reports), and waiting for
    // it would only slow every later case down.
    if (state == 'Z') {
      if (zombie_age(pid) < std::chrono::seconds(3)) return true;
      continue;
    }
    // `<runtime> ... delete ...`, or `<runtime> ... run ... as-<tag>-<instance>` of a run (a
    // warm-pool instance, `w<hex>`, stays).
    std::ifstream cl("/proc/" + std::to_string(pid) + "/cmdline");
    std::string arg, last;
    bool run = false;
    while (std::getline(cl, arg, '\0')) {
      if (arg == "delete") return true;
      run = run || arg == "run";
      last = arg;
    }
    if (run && last.rfind("as-", 0) == 0) {
      auto dash = last.find('-', 3);
      if (dash != std::string::npos && dash + 1 < last.size() && last[dash + 1] != 'w') {
        return true;
      }
    }
  }
  return false;
}
}  // namespace

host_snapshot settled_snapshot() {
  for (int i = 0; i < 500 && runtime_teardown_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  host_snapshot prev = take_snapshot();
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    host_snapshot now = take_snapshot();
    if (now == prev) return now;
    prev = std::move(now);
  }
  return prev;
}

namespace {
// The processes counted in `now` that were not in `before`: a leak. A process counted before
// may have ended since (one of another test's runs on this host, counted while it was outside
// every run cgroup, is transient), which is none.
std::set<int> new_processes(const host_snapshot& before, const host_snapshot& now) {
  std::set<int> added;
  std::set_difference(now.sandbox_processes.begin(), now.sandbox_processes.end(),
                      before.sandbox_processes.begin(), before.sandbox_processes.end(),
                      std::inserter(added, added.end()));
  return added;
}

// `now` is `before` again: the same but for processes that ended (new_processes).
bool is_back(const host_snapshot& before, const host_snapshot& now) {
  if (!new_processes(before, now).empty()) return false;
  host_snapshot same = now;
  same.sandbox_processes = before.sandbox_processes;
  return same == before;
}
}  // namespace

host_snapshot snapshot_back_to(const host_snapshot& before) {
  host_snapshot now = take_snapshot();
  // Up to 15 s: an OCI runtime's `delete` runs after the result (runsc's takes seconds on a
  // loaded host after a memory bomb), and its descriptors are the supervisor's until it ends;
  // the library kills a delete that takes 10 s. Returns as soon as the host is back.
  for (int i = 0; i < 750 && !is_back(before, now); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    now = take_snapshot();
  }
  return now;
}

void check_unchanged(const host_snapshot& before, const host_snapshot& now) {
  CHECK(now.run_cgroups == before.run_cgroups);
  CHECK(new_processes(before, now) == std::set<int>{});  // the expansion lists their pids
  CHECK(now.mounts == before.mounts);
  CHECK(now.work_dirs == before.work_dirs);
  CHECK(now.fds == before.fds);
  CHECK(now.threads == before.threads);
  CHECK(now.canaries == before.canaries);
  CHECK(now.unreaped_children == before.unreaped_children);
}

// --- backends ------------------------------------------------------------------------------------

std::vector<std::size_t> profile_indices() {
  // SANDBOX_CONFORMANCE_PROFILES="crun,runsc": only profiles whose name contains one of the
  // comma-separated words (for development and for splitting CI); a word starting with '!'
  // leaves out the profiles whose name contains the rest ("container,!pre-started"); unset:
  // every profile that is not opt-in.
  const std::string only = env_or("SANDBOX_CONFORMANCE_PROFILES", "");
  std::vector<std::string> words, unless;
  for (std::size_t at = 0; at <= only.size() && !only.empty();) {
    auto comma = only.find(',', at);
    if (comma == std::string::npos) comma = only.size();
    if (comma > at) {
      std::string w = only.substr(at, comma - at);
      if (w.size() > 1 && w[0] == '!') {
        unless.push_back(w.substr(1));
      } else {
        words.push_back(std::move(w));
      }
    }
    at = comma + 1;
  }
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < profiles().size(); ++i) {
    const std::string& name = profiles()[i].name;
    bool take = words.empty() && !profiles()[i].opt_in;
    for (const auto& w : words) take = take || name.find(w) != std::string::npos;
    for (const auto& w : unless) take = take && name.find(w) == std::string::npos;
    if (take) out.push_back(i);
  }
  if (out.empty()) out.push_back(profiles().size());  // matches nothing: one case that fails
  return out;
}

backend* ensure(std::size_t index, std::string* why) {
  auto& g = global();
  std::lock_guard lock(g.mu);
  const auto& ps = profiles();
  if (index >= ps.size()) return nullptr;
  if (g.tried.size() < ps.size()) {
    g.tried.resize(ps.size(), false);
    g.why.resize(ps.size());
    g.runtimes.resize(ps.size());
    g.backends.resize(ps.size());
  }
  if (!g.tried[index]) {
    g.tried[index] = true;
    auto rt = ps[index].make(&g.why[index]);
    if (rt) {
      // Warm-up: the first run creates the executor's descriptors for good, so snapshots do
      // not count them as leaks.
      rt->run({.runtime = "python3", .source = "pass"},
              sandbox::ticket_issuer{}
                  .issue({.id = "w", .tenant = "conformance", .isolation = ps[index].level})
                  .value());
      g.runtimes[index] = std::move(rt);
      g.backends[index] = std::make_unique<backend>(ps[index], *g.runtimes[index]);
    }
  }
  if (why != nullptr) *why = g.why[index];
  return g.backends[index].get();
}

backend* acquire(std::size_t index) {
  std::string why;
  backend* b = ensure(index, &why);
  if (b != nullptr) return b;
  const std::string name = index < profiles().size() ? profiles()[index].name : "?";
  if (must_work()) FAIL("backend '" << name << "' unavailable: " << why);
  WARN("backend '" << name << "' unavailable, skipped: " << why);
  return nullptr;
}

void settle_pools() {
  // Every profile's runtime lives for the whole process, and a case runs once per profile: the
  // pools of the profile that ran last are still refilling when the next profile's case takes
  // its snapshot, and their descriptors and threads are this process's too. So wait for all
  // of them, not only the backend under test. A pool class that failed (`error`) refills
  // nothing and is not waited for.
  std::vector<sandbox::runtime*> live;
  {
    std::lock_guard lock(global().mu);
    for (const auto& rt : global().runtimes)
      if (rt) live.push_back(rt.get());
  }
  for (int i = 0; i < 500; ++i) {
    bool full = true;
    for (auto* rt : live) {
      for (const auto& p : rt->warm_pool_stats())
        full = full && (!p.error.empty() || (p.ready == p.size && p.starting == 0));
    }
    if (full) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {

// What the watchdog watches: the case now running, and since when.
struct watched_case {
  std::mutex mu;
  std::string what;
  std::chrono::steady_clock::time_point since;
  bool active = false;
};
watched_case& watched() {
  static watched_case w;
  return w;
}

// Prints what a hung case leaves for diagnosis: the host's process tree, each of our
// threads' kernel wait channel, and (when gdb is installed) every thread's stack.
void dump_hang(const std::string& what, long seconds) {
  std::fprintf(stderr,
               "\nconformance: WATCHDOG: case '%s' still running after %ld s; "
               "diagnostics follow, then the suite aborts\n",
               what.c_str(), seconds);
  std::fflush(stderr);
  const pid_t self = getpid();
  std::string cmd =
      "ps -eo pid,ppid,user,stat,etimes,wchan:32,args --forest | "
      "awk '$1 != 2 && $2 != 2' | cut -c1-240 1>&2; ";
  cmd += fmt::format(
      "for t in /proc/{0}/task/*; do echo \"thread ${{t##*/}} $(cat $t/comm) "
      "wchan=$(cat $t/wchan)\"; cat $t/stack 2>/dev/null; done 1>&2; ",
      self);
  cmd += fmt::format(
      "command -v gdb >/dev/null && timeout 120 gdb -p {} -batch -nx -ex 'set pagination off' "
      "-ex 'thread apply all bt' 1>&2",
      self);
  if (std::system(cmd.c_str()) != 0)
    std::fprintf(stderr, "conformance: (diagnostics incomplete)\n");
}

}  // namespace

void start_case_watchdog() {
  long limit = 300;
  if (const char* v = std::getenv("SANDBOX_CONFORMANCE_CASE_LIMIT_S"); v != nullptr && *v != '\0') {
    limit = std::max(1L, std::strtol(v, nullptr, 10));
  }
  // A child (gdb) may trace us even under Yama's ptrace_scope=1.
  (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  std::thread([limit] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::string what;
      long running = 0;
      {
        std::lock_guard lock(watched().mu);
        if (!watched().active) continue;
        running = static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(
                                        std::chrono::steady_clock::now() - watched().since)
                                        .count());
        what = watched().what;
      }
      if (running < limit) continue;
      dump_hang(what, running);
      std::_Exit(1);
    }
  }).detach();
}

case_guard::case_guard(backend* b)
    : b_(b),
      before_((watch_case(*b), settle_pools(), settled_snapshot())),
      start_(std::chrono::steady_clock::now()) {}

void case_guard::watch_case(backend& b) {
  std::lock_guard lock(watched().mu);
  watched().what = Catch::getResultCapture().getCurrentTestName() + " [" + b.name() + "]";
  watched().since = std::chrono::steady_clock::now();
  watched().active = true;
}

case_guard::~case_guard() {
  settle_pools();
  // Every process of a run is confirmed dead and its cgroup and work directory removed before
  // its result returns — except a v1 cgroup the kernel still reported busy, removed just
  // after. Anything still different after 2 s is left behind for good.
  check_unchanged(before_, snapshot_back_to(before_));
  suite_seconds()[b_->name()] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard lock(watched().mu);
  watched().active = false;
}

std::map<std::string, double>& suite_seconds() {
  static std::map<std::string, double> m;
  return m;
}

}  // namespace conformance
