#include "integration/microvm/microvm_harness.hpp"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

namespace mvtest {
namespace {

struct state {
  std::unique_ptr<sandbox::runtime> runtime;
  std::string why;
  std::filesystem::path state_dir;
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
    // A VM boots within the setup budget even on a loaded 2-core TCG host.
    opts.policy.setup_budget = std::chrono::seconds(60);
    opts.policy.max_timeout = std::chrono::seconds(30);
    opts.log = sandbox::make_stderr_log_sink(sandbox::log_level::warning);
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
              .max_timeout = std::chrono::seconds(30),
              .max_memory_bytes = 1ULL << 30})
      .value();
}

sandbox::run_result run(const std::string& source, sandbox::run_request base) {
  REQUIRE(rt() != nullptr);
  base.runtime = "python3";
  base.source = source;
  auto r = rt()->run(base, ticket());
  UNSCOPED_INFO("result: code=" << to_string(r.code) << " message=" << r.message << "\nstdout: "
                                << r.std_out.summary << "\nstderr: " << r.std_err.summary);
  return r;
}

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

std::vector<int> vmm_pids() {
  std::vector<int> pids;
  const auto mine = instances();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::ifstream comm(e.path() / "comm");
    std::string c;
    if (!comm || !std::getline(comm, c) || c.rfind("qemu-system", 0) != 0) continue;
    std::ifstream cg(e.path() / "cgroup");
    std::string all((std::istreambuf_iterator<char>(cg)), {});
    for (const auto& inst : mine) {
      if (all.find("/r-" + inst + "-") != std::string::npos) {
        pids.push_back(std::atoi(e.path().filename().c_str()));
        break;
      }
    }
  }
  return pids;
}

}  // namespace mvtest
