// sandboxctl tests. `sandbox_cli_tests --needs-backend [catch args]` first checks that
// sandboxctl can run python3 on this host, and exits 77 (skipped) when it cannot — unless
// CI=true or SANDBOX_MUST_WORK=1, where that is a failure.
#include <csignal>
#include <cstring>
#include <iostream>
#include <vector>

#include "catch2_runner.hpp"
#include "cli_harness.hpp"

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a CLI that exits early must not kill us while we feed it
  std::vector<char*> args(argv, argv + argc);
  if (args.size() > 1 && std::strcmp(args[1], "--needs-backend") == 0) {
    args.erase(args.begin() + 1);
    std::string why = clitest::backend_unavailable_reason();
    if (!why.empty()) {
      std::cerr << "sandboxctl cannot run code on this host: " << why << "\n";
      if (clitest::must_work()) {
        std::cerr << "CI=true / SANDBOX_MUST_WORK=1: failing instead of skipping\n";
        return 1;
      }
      return 77;
    }
  }
  return testrun::run_catch_session(static_cast<int>(args.size()), args.data());
}
