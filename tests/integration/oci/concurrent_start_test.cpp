// Concurrent starts (issue 21): many processes on one host, sharing one state directory,
// each creating a runtime with the container level (crun) and doing one run, at once. Every
// one must register the level and run: what a backend installs into shared state (the
// sandbox-init copy the containers bind) is published and verified so that concurrent
// starters never break each other (store/publish.hpp). Before that, about 1 start in 36 of
// three parallel `sandboxctl run` loops lost its level to a half-written or vanished helper.
//
// The children are this executable in its start-child mode (integration/main.cpp,
// SANDBOX_ITEST_START_CHILD). The microvm level is covered by the unit tests of the publish
// helpers (tests/unit/store/publish_test.cpp): its start boots a VM for its self-test, too
// slow to start several at once within this test's budget on a 2-core host.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integration/harness.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace {

constexpr int processes = 8;
constexpr int rounds = 5;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Starts this executable as a start child on `state`, its stderr into `err`.
pid_t spawn_child(const fs::path& state, const fs::path& err) {
  std::string env_arg = "SANDBOX_ITEST_START_CHILD=" + state.string();
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(env_arg.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  char self[] = "/proc/self/exe";
  char* argv[] = {self, nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

}  // namespace

TEST_CASE("concurrent starts: processes creating the container level at once all run",
          "[concurrent_start][container]") {
  if (::geteuid() != 0 || ::access("/usr/bin/crun", X_OK) != 0) {
    if (itest::must_work() && ::geteuid() == 0) FAIL("crun is missing under CI=true");
    WARN("skipped: the container level needs root and crun");
    return;
  }
  auto before = itest::snapshot();
  char tmpl[] = "/tmp/sandbox-starts-XXXXXX";
  const fs::path root = ::mkdtemp(tmpl);
  const fs::path state = root / "state";  // shared by every child
  itest::adopt_state_root(state);         // their runs count in our snapshots
  int failed = 0;
  std::string failures;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::pair<pid_t, fs::path>> children;
    for (int i = 0; i < processes; ++i) {
      auto err = root / ("child-" + std::to_string(round) + "-" + std::to_string(i) + ".err");
      pid_t pid = spawn_child(state, err);
      REQUIRE(pid > 0);
      children.emplace_back(pid, err);
    }
    for (const auto& [pid, err] : children) {
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ++failed;
        failures += "round " + std::to_string(round) + ": status " + std::to_string(status) + ": " +
                    read_text(err) + "\n";
      }
    }
  }
  INFO(failed << " of " << processes * rounds << " starts failed:\n" << failures);
  CHECK(failed == 0);
  // One copy of sandbox-init, nothing half-written.
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(state / "crun")) {
    entries.push_back(e.path().filename().string());
  }
  INFO("state/crun: " << [&] {
    std::string s;
    for (const auto& e : entries) s += e + " ";
    return s;
  }());
  CHECK(std::count_if(entries.begin(), entries.end(),
                      [](const std::string& n) { return n.rfind("sandbox-init", 0) == 0; }) == 1);
  CHECK(std::none_of(entries.begin(), entries.end(),
                     [](const std::string& n) { return n.find(".tmp") != std::string::npos; }));
  std::error_code ec;
  fs::remove_all(root, ec);
  itest::check_host_unchanged(before);
}
