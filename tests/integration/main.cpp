// Integration tests of the process backend. Exit code 77 (skipped) when this host cannot run
// the backend — unless CI=true or SANDBOX_MUST_WORK=1, where that is a failure.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "catch2_runner.hpp"
#include "integration/harness.hpp"

namespace {
// Child mode of the crash test: start a runtime on the given state dir, start a run that
// sleeps, write a marker, and wait to be killed.
int crash_child(const char* state) {
  auto opts = sandbox::default_runtime_options();
  opts.state_dir = std::filesystem::path(state) / "state";
  if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
  if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
  opts.blobs = sandbox::make_memory_blob_store();
  auto rt = sandbox::runtime::create(opts);
  if (!rt) return 3;
  sandbox::run_request req{.runtime = "python3",
                           .source = "import time\nprint('up', flush=True)\ntime.sleep(60)",
                           .timeout = std::chrono::milliseconds(8000)};
  rt->async_run(req, itest::ticket(), [](boost::system::error_code, sandbox::run_result) {});
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  std::ofstream(std::filesystem::path(state) / "running") << "1";
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Child mode of the concurrent-start test (oci/concurrent_start_test.cpp): create a runtime
// with one level only (SANDBOX_ITEST_START_LEVEL: container, the default, gvisor or microvm)
// on the shared state dir `state` and run `print('ok')` once. Exits 0 when the run ended `ok`
// and printed "ok"; else 1 (2: no runtime) with the reason on stderr.
int start_child(const char* state) {
  const char* level_env = std::getenv("SANDBOX_ITEST_START_LEVEL");
  const std::string level = level_env != nullptr ? level_env : "container";
  auto opts = sandbox::default_runtime_options();
  opts.state_dir = state;
  if (const char* d = std::getenv("SANDBOX_IMAGE_DIR")) opts.image_dir = d;
  if (const char* p = std::getenv("SANDBOX_CGROUP_PARENT")) opts.process.cgroup_parent = p;
  opts.blobs = sandbox::make_memory_blob_store();
  opts.process_backend = false;
  opts.container.enabled = level == "container";
  opts.gvisor.enabled = level == "gvisor";
  opts.microvm.enabled = level == "microvm";
  auto rt = sandbox::runtime::create(opts);
  if (!rt) {
    std::cerr << "runtime::create: " << rt.error().message() << "\n";
    return 2;
  }
  sandbox::ticket_issuer issuer;
  auto t = issuer.issue({.id = "start-child",
                         .tenant = "itest",
                         .execute = true,
                         .isolation = level == "microvm"  ? sandbox::isolation::microvm
                                      : level == "gvisor" ? sandbox::isolation::gvisor
                                                          : sandbox::isolation::container,
                         .max_timeout = std::chrono::milliseconds(60000)});
  if (!t) return 2;
  auto r = rt->run(
      {.runtime = "python3", .source = "print('ok')", .timeout = std::chrono::milliseconds(60000)},
      *t);
  if (r.code != sandbox::code::ok || r.std_out.summary != "ok\n") {
    std::cerr << "run: " << to_string(r.code) << ": " << r.message
              << "; stdout: " << r.std_out.summary << "; stderr: " << r.std_err.summary << "\n";
    return 1;
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (const char* state = std::getenv("SANDBOX_ITEST_CRASH_CHILD")) return crash_child(state);
  if (const char* state = std::getenv("SANDBOX_ITEST_START_CHILD")) return start_child(state);
  if (itest::rt() == nullptr) {
    std::cerr << "process backend unavailable: " << itest::why() << "\n";
    if (itest::must_work()) {
      std::cerr << "CI=true / SANDBOX_MUST_WORK=1: failing instead of skipping\n";
      return 1;
    }
    return 77;
  }
  return testrun::run_catch_session(argc, argv);
}
