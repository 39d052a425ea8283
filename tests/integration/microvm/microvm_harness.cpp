#include "integration/microvm/microvm_harness.hpp"

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <utility>

namespace mvtest {
namespace {

std::atomic<std::uint64_t> g_origin_bytes{0};

// The origin (microvm_harness.hpp): one thread per connection, one request each.
std::uint16_t start_origin() {
  int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(l, 128) != 0 ||
      ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(l);
    return 0;
  }
  std::thread([l] {
    for (;;) {
      int c = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::thread([c] {
        std::string head;
        char buf[65536];
        std::size_t end = std::string::npos;
        while (end == std::string::npos && head.size() < 65536) {
          ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          head.append(buf, static_cast<std::size_t>(n));
          end = head.find("\r\n\r\n");
        }
        if (end == std::string::npos) {
          ::close(c);
          return;
        }
        std::uint64_t want = 0;
        for (const char* k : {"Content-Length: ", "content-length: "}) {
          if (auto at = head.find(k); at != std::string::npos && at < end)
            want = std::strtoull(head.c_str() + at + std::strlen(k), nullptr, 10);
        }
        std::uint64_t got = head.size() - end - 4;
        while (got < want) {
          ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          got += static_cast<std::uint64_t>(n);
        }
        g_origin_bytes += got;
        std::string line = head.substr(0, head.find("\r\n"));
        std::string body =
            "origin got " + std::to_string(got) + " bytes for " + line.substr(0, line.rfind(' '));
        std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
        for (std::size_t off = 0; off < resp.size();) {
          ssize_t n = ::write(c, resp.data() + off, resp.size() - off);
          if (n <= 0) break;
          off += static_cast<std::size_t>(n);
        }
        ::close(c);
      }).detach();
    }
  }).detach();
  return ntohs(a.sin_port);
}

std::uint16_t& origin_port_ref() {
  static std::uint16_t port = start_origin();
  return port;
}

struct state {
  std::unique_ptr<sandbox::runtime> runtime;
  std::string why;
  std::filesystem::path state_dir;
  state() = default;
  state(state&& o) noexcept
      : runtime(std::move(o.runtime)),
        why(std::move(o.why)),
        state_dir(std::exchange(o.state_dir, {})) {}
  ~state() {
    runtime.reset();  // its VMs, cgroups and work dirs first
    std::error_code ec;
    if (!state_dir.empty()) std::filesystem::remove_all(state_dir, ec);
  }
};

state& global() {
  static state s = [] {
    state st;
    auto opts = sandbox::default_runtime_options();
    char tmpl[] = "/tmp/sandbox-mvtest-XXXXXX";
    st.state_dir = mkdtemp(tmpl);
    chmod(st.state_dir.c_str(), 0755);
    opts.state_dir = st.state_dir / "state";
    if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
    if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
    opts.blobs = sandbox::make_memory_blob_store();
    opts.process_backend = false;  // only the level under test
    opts.microvm.enabled = true;
    if (const char* k = std::getenv("SANDBOX_MICROVM_KERNEL_DIR")) opts.microvm.kernel_dir = k;
    // A VM boots within the setup budget even on a loaded 2-core TCG host (it only bounds a
    // hung boot; the calibration prints the measured one beside it).
    opts.policy.setup_budget = setup_budget;
    opts.policy.max_timeout = ceiling;  // the deadlines are the tests' (calibrated), not capped
    opts.log = sandbox::make_stderr_log_sink(sandbox::log_level::warning);
    // Network runs (network_test.cpp): two names pinned to the origin on the host's
    // loopback, its port allowed for plain HTTP.
    if (const std::uint16_t port = origin_port_ref(); port != 0) {
      opts.egress.pinned_hosts[approved_name] = {"127.0.0.1"};
      opts.egress.pinned_hosts[other_name] = {"127.0.0.1"};
      opts.egress.http_ports = {80, port};
    }
    auto rt = sandbox::runtime::create(opts);
    if (!rt) {
      st.why = "runtime::create failed: " + rt.error().message();
      return st;
    }
    bool have = false;
    for (const auto& b : rt->backends()) {
      if (b.isolation != sandbox::isolation::microvm) continue;
      have = b.registered;
      if (!b.registered) st.why = b.reason;
    }
    if (have && st.why.empty()) {
      auto cat = rt->catalog();
      auto it = cat.runtimes.find("python3");
      if (it == cat.runtimes.end() || !it->second) {
        st.why = "runtime image 'python3' is not installed (run tools/setup.sh)";
        have = false;
      }
    }
    if (!have && st.why.empty()) st.why = "microvm backend not registered";
    if (have) st.runtime = std::make_unique<sandbox::runtime>(std::move(*rt));
    return st;
  }();
  return s;
}

}  // namespace

bool must_work() {
  const char* ci = std::getenv("CI");
  const char* mw = std::getenv("SANDBOX_MUST_WORK");
  return (ci != nullptr && std::string(ci) == "true") || (mw != nullptr && std::string(mw) == "1");
}

sandbox::runtime* rt() { return global().runtime.get(); }
const std::string& why() { return global().why; }
std::string state_dir() { return (global().state_dir / "state" / "microvm").string(); }

sandbox::ticket ticket() {
  sandbox::ticket_issuer issuer;
  return issuer
      .issue({.id = "mvtest-ticket",
              .tenant = "mvtest",
              .execute = true,
              .isolation = sandbox::isolation::microvm,
              .max_timeout = ceiling,
              .max_memory_bytes = 1ULL << 30})
      .value();
}

sandbox::run_result run(const std::string& source, sandbox::run_request base) {
  REQUIRE(rt() != nullptr);
  base.runtime = "python3";
  base.source = source;
  if (base.timeout == sandbox::run_request{}.timeout) base.timeout = must_finish();
  auto r = rt()->run(base, ticket());
  UNSCOPED_INFO("result: code=" << to_string(r.code) << " message=" << r.message << "\nstdout: "
                                << r.std_out.summary << "\nstderr: " << r.std_err.summary);
  return r;
}

namespace {

// The deadlines a calibration gives (microvm_harness.hpp).
std::chrono::milliseconds allowance_of(const calibration& c) {
  return std::max<std::chrono::milliseconds>(std::chrono::seconds(5), 5 * c.python_start);
}
std::chrono::milliseconds must_finish_of(const calibration& c) {
  return std::min(
      ceiling, std::max<std::chrono::milliseconds>(std::chrono::seconds(60), 30 * c.python_start));
}
std::chrono::seconds boot_wait_of(const calibration& c) {
  return std::max(std::chrono::seconds(180),
                  std::chrono::duration_cast<std::chrono::seconds>(20 * c.vm_setup));
}

calibration measure() {
  calibration c;
  std::string failed;
  for (int i = 0; i < 2 && failed.empty(); ++i) {
    sandbox::run_request req;
    req.runtime = "python3";
    req.source = "print('ok')\n";
    req.timeout = ceiling;
    const auto r = rt()->run(req, ticket());
    if (r.code != sandbox::code::ok || r.std_out.summary != "ok\n") {
      failed = "code=" + std::string(to_string(r.code)) + " message=" + r.message;
      continue;
    }
    c.python_start = std::max(c.python_start, r.usage.wall);
    c.vm_setup = std::max(c.vm_setup, r.usage.setup);
  }
  c.measured = failed.empty();
  if (!c.measured) {
    std::fprintf(stderr,
                 "calibration: a run of print('ok') in a microvm guest failed (%s); using the "
                 "fallback figures\n",
                 failed.c_str());
    c.python_start = std::chrono::seconds(10);
    c.vm_setup = std::chrono::seconds(60);
  }
  std::fprintf(stderr,
               "calibration (%s): python start-up in a microvm guest %lld ms, VM boot and set-up "
               "%lld ms (the slower of 2 runs); deadlines: start-up allowance %lld ms, "
               "must-finish %lld ms, boot wait %lld s\n",
               c.measured ? "measured" : "fallback", static_cast<long long>(c.python_start.count()),
               static_cast<long long>(c.vm_setup.count()),
               static_cast<long long>(allowance_of(c).count()),
               static_cast<long long>(must_finish_of(c).count()),
               static_cast<long long>(boot_wait_of(c).count()));
  if (c.measured && 3 * c.vm_setup > setup_budget) {
    std::fprintf(stderr,
                 "calibration: WARNING: a VM boot took %lld ms, over a third of the setup "
                 "budget (%lld ms): runs may end internal on this host as loaded as it is\n",
                 static_cast<long long>(c.vm_setup.count()),
                 static_cast<long long>(setup_budget.count()));
  }
  return c;
}

}  // namespace

const calibration& calibrate() {
  static const calibration c = measure();
  return c;
}

std::chrono::milliseconds startup_allowance() { return allowance_of(calibrate()); }

std::chrono::milliseconds deadline(std::chrono::milliseconds work) {
  return std::min(ceiling, startup_allowance() + work);
}

std::chrono::milliseconds must_finish() { return must_finish_of(calibrate()); }

std::chrono::seconds boot_wait() { return boot_wait_of(calibrate()); }

std::string put(const std::string& bytes) {
  auto id = rt()->blobs()->put("mvtest", bytes);
  REQUIRE(id);
  return *id;
}

std::string blob(const std::string& id) {
  auto b = rt()->blobs()->get("mvtest", id);
  REQUIRE(b);
  return *b;
}

// Instances of the microvm backend of this test's state dir (their lock files).
std::vector<std::string> instances() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(state_dir() + "/instances", ec)) {
    auto n = e.path().filename().string();
    if (n.size() > 5 && n.substr(n.size() - 5) == ".lock") out.push_back(n.substr(0, n.size() - 5));
  }
  return out;
}

std::vector<std::string> run_cgroups() {
  std::vector<std::string> out;
  const char* p = std::getenv("SANDBOX_CGROUP_PARENT");
  std::string parent = p != nullptr ? p : "/agent-sandbox";
  const auto mine = instances();
  for (const char* root : {"/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory", "/sys/fs/cgroup"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(std::string(root) + parent, ec)) {
      auto n = e.path().filename().string();
      for (const auto& inst : mine) {
        // r-<instance>-<run>; the self-test's limits check is r-<instance>-limits-test.
        if (e.is_directory() && n.rfind("r-" + inst + "-", 0) == 0)
          out.push_back(e.path().string());
      }
    }
  }
  return out;
}

int vmm_processes() { return static_cast<int>(vmm_pids().size()); }

std::vector<int> vmm_pids() { return vmm_pids(global().state_dir / "state"); }

std::vector<int> vmm_pids(const std::filesystem::path& state, std::string_view run_prefix) {
  std::vector<std::string> mine;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(state / "microvm" / "instances", ec)) {
    auto n = e.path().filename().string();
    if (n.size() > 5 && n.substr(n.size() - 5) == ".lock")
      mine.push_back(n.substr(0, n.size() - 5));
  }
  std::vector<int> pids;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::ifstream comm(e.path() / "comm");
    std::string c;
    if (!comm || !std::getline(comm, c) || c.rfind("qemu-system", 0) != 0) continue;
    std::ifstream cg(e.path() / "cgroup");
    std::string all((std::istreambuf_iterator<char>(cg)), {});
    for (const auto& inst : mine) {
      if (all.find("/r-" + inst + "-" + std::string(run_prefix)) != std::string::npos) {
        pids.push_back(std::atoi(e.path().filename().c_str()));
        break;
      }
    }
  }
  return pids;
}

private_runtime::private_runtime(const std::function<void(sandbox::runtime_options&)>& adjust) {
  auto opts = sandbox::default_runtime_options();
  char tmpl[] = "/tmp/sandbox-mvtest-own-XXXXXX";
  dir = mkdtemp(tmpl);
  chmod(dir.c_str(), 0755);
  opts.state_dir = dir / "state";
  if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
  if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
  opts.blobs = sandbox::make_memory_blob_store();
  opts.process_backend = false;
  opts.microvm.enabled = true;
  if (const char* k = std::getenv("SANDBOX_MICROVM_KERNEL_DIR")) opts.microvm.kernel_dir = k;
  opts.policy.setup_budget = setup_budget;
  opts.policy.max_timeout = ceiling;
  opts.log = sandbox::make_stderr_log_sink(sandbox::log_level::warning);
  adjust(opts);
  auto made = sandbox::runtime::create(opts);
  if (!made) {
    why = "runtime::create failed: " + made.error().message();
    return;
  }
  for (const auto& b : made->backends()) {
    if (b.isolation == sandbox::isolation::microvm && !b.registered) why = b.reason;
  }
  if (why.empty()) rt = std::make_unique<sandbox::runtime>(std::move(*made));
}

private_runtime::~private_runtime() {
  rt.reset();  // its VMs, cgroups and work dirs first
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

bool private_runtime::available() const {
  if (rt) return true;
  if (must_work()) FAIL("microvm backend required (CI): " << why);
  WARN("skipped: " << why);
  return false;
}

std::uint16_t origin_port() { return origin_port_ref(); }
std::uint64_t origin_bytes() { return g_origin_bytes.load(); }

sandbox::ticket network_ticket() {
  sandbox::ticket_issuer issuer;
  return issuer
      .issue({.id = "mvtest-net",
              .tenant = "mvtest",
              .execute = true,
              .isolation = sandbox::isolation::microvm,
              .max_timeout = ceiling,
              .max_memory_bytes = 1ULL << 30,
              .egress = {approved_name}},
             sandbox::network_grant{})
      .value();
}

sandbox::run_result run_network(const std::string& source, sandbox::run_request base) {
  REQUIRE(rt() != nullptr);
  base.runtime = "python3";
  base.source = source;
  if (base.timeout == sandbox::run_request{}.timeout) base.timeout = must_finish();
  base.network = true;
  base.egress = {approved_name};
  auto r = rt()->run(base, network_ticket());
  UNSCOPED_INFO("result: code=" << to_string(r.code) << " message=" << r.message << "\nstdout: "
                                << r.std_out.summary << "\nstderr: " << r.std_err.summary);
  for (const auto& a : r.egress_attempts) {
    UNSCOPED_INFO("egress: " << a.protocol << " " << a.host << " " << a.address << ":" << a.port
                             << " allowed=" << a.allowed << " reason=" << a.reason
                             << " up=" << a.bytes_up << " down=" << a.bytes_down);
  }
  return r;
}

}  // namespace mvtest
