// Service-mode tests: `sandboxctl serve` run as a subprocess and driven over its socket and
// its stdin/stdout. They run real Python, so the executable first checks that sandboxctl can
// run python3 on this host and exits 77 (skipped) when it cannot — unless CI=true or
// SANDBOX_MUST_WORK=1, where that is a failure.
#include <csignal>
#include <iostream>

#include "catch2_runner.hpp"
#include "cli/cli_harness.hpp"

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // a daemon that exits early must not kill us while we write
  std::string why = clitest::backend_unavailable_reason();
  if (!why.empty()) {
    std::cerr << "sandboxctl cannot run code on this host: " << why << "\n";
    if (clitest::must_work()) {
      std::cerr << "CI=true / SANDBOX_MUST_WORK=1: failing instead of skipping\n";
      return 1;
    }
    return 77;
  }
  return testrun::run_catch_session(argc, argv);
}
