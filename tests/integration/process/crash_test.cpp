// Crash safety: kill the host process mid-run; its sandboxed processes die with it (the
// pipe-EOF watchdog in sandbox-init), and the next runtime on the same state directory
// reclaims the run's cgroup and work directory.
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "integration/harness.hpp"

extern char** environ;

using namespace std::chrono_literals;

namespace {

std::vector<std::string> run_cgroups() {
  std::vector<std::string> out;
  for (const auto& c : itest::snapshot().cgroups) out.push_back(c);
  return out;
}

}  // namespace

TEST_CASE("crash: a killed host's runs die, and the next start reclaims what is left", "[crash]") {
  auto before = itest::snapshot();
  char tmpl[] = "/tmp/sandbox-crash-XXXXXX";
  std::filesystem::path state = mkdtemp(tmpl);
  chmod(state.c_str(), 0755);
  itest::adopt_state_root(state);  // the child host's runs count in our snapshots
  std::string env_arg = "SANDBOX_ITEST_CRASH_CHILD=" + state.string();
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(env_arg.data());
  envp.push_back(nullptr);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t child = -1;
  REQUIRE(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) == 0);

  // Wait until the child's run is going (its marker file appears), then kill the host.
  auto marker = state / "running";
  for (int i = 0; i < 600 && !std::filesystem::exists(marker); ++i)
    std::this_thread::sleep_for(50ms);
  REQUIRE(std::filesystem::exists(marker));
  auto during = run_cgroups();
  CHECK(during.size() > before.cgroups.size());
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);

  // The sandboxed processes die with their host (no process of a sandbox uid remains).
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = itest::snapshot().sandbox_pids == before.sandbox_pids;
    if (!gone) std::this_thread::sleep_for(50ms);
  }
  CHECK(gone);

  // A new runtime on the same state directory reclaims the cgroup and the work dir.
  auto opts = sandbox::default_runtime_options();
  opts.state_dir = state / "state";
  if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
  if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
  opts.blobs = sandbox::make_memory_blob_store();
  {
    auto rt = sandbox::runtime::create(opts);
    REQUIRE(rt.has_value());
  }
  CHECK(run_cgroups() == before.cgroups);
  std::error_code ec;
  std::size_t leftover = 0;
  for (auto& inst : std::filesystem::directory_iterator(state / "state" / "runs", ec)) {
    for ([[maybe_unused]] auto& r : std::filesystem::directory_iterator(inst.path(), ec))
      ++leftover;
  }
  CHECK(leftover == 0);
  std::filesystem::remove_all(state, ec);
}
