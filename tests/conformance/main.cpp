// The conformance suite's entry point: puts canary secrets in the host environment and on
// disk before any runtime exists, runs the cases, and prints each backend's suite time
// against its CI budget. Exit 77 (skipped) when no backend can run here — unless CI=true or
// SANDBOX_MUST_WORK=1.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "catch2_runner.hpp"
#include "conformance/suite.hpp"

int main(int argc, char** argv) {
  // Secrets a leak would show: in the environment of the host process, and in files.
  for (const char* name :
       {"AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "DATABASE_URL", "CONFORMANCE_SECRET"}) {
    setenv(name, conformance::canary_secret().c_str(), 1);
  }
  (void)conformance::canary_files();
  bool any = false;
  // Only the selected profiles (SANDBOX_CONFORMANCE_PROFILES) are started.
  for (std::size_t i : conformance::profile_indices()) {
    std::string why;
    if (conformance::ensure(i, &why) != nullptr) {
      any = true;
    } else {
      std::fprintf(stderr, "conformance: backend '%s' unavailable: %s\n",
                   i < conformance::profiles().size()
                       ? conformance::profiles()[i].name.c_str()
                       : "(no profile matches SANDBOX_CONFORMANCE_PROFILES)",
                   why.c_str());
    }
  }
  if (!any) {
    if (conformance::must_work()) {
      std::fprintf(stderr, "CI=true / SANDBOX_MUST_WORK=1: failing instead of skipping\n");
      return 1;
    }
    return 77;
  }
  conformance::start_case_watchdog();
  int rc = testrun::run_catch_session(argc, argv);
  for (const auto& [name, secs] : conformance::suite_seconds()) {
    double budget = 0;
    for (const auto& p : conformance::profiles()) {
      if (p.name == name) budget = static_cast<double>(p.ci_budget.count());
    }
    std::fprintf(stderr, "conformance: backend '%s': %.1f s (CI budget %.0f s)%s\n", name.c_str(),
                 secs, budget, secs > budget ? "  OVER BUDGET" : "");
  }
  // How many runs the pooled profiles served from their pools (the rest ran cold).
  for (std::size_t i : conformance::profile_indices()) {
    std::string why;
    auto* b = i < conformance::profiles().size() ? conformance::ensure(i, &why) : nullptr;
    if (b == nullptr) continue;
    for (const auto& p : b->rt().warm_pool_stats()) {
      std::fprintf(stderr, "conformance: backend '%s': pool %s handed out %llu, failed %llu\n",
                   conformance::profiles()[i].name.c_str(), p.runtime.c_str(),
                   static_cast<unsigned long long>(p.handed_out),
                   static_cast<unsigned long long>(p.failed));
    }
  }
  for (const auto& f : conformance::canary_files()) std::filesystem::remove(f);
  std::error_code ec;
  std::filesystem::remove_all(conformance::state_root(), ec);
  return rc;
}
