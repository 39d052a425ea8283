// Shared fixture of the process backend's integration tests: one runtime with real images,
// helpers to run snippets, and host-integrity checks run after every case.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "sandbox/sandbox.hpp"

namespace itest {

/// True when a test that cannot run must fail instead of skipping (CI=true or
/// SANDBOX_MUST_WORK=1).
bool must_work();

/// The shared runtime (created on first use); nullptr when the host cannot run the process
/// backend — `why()` says why.
sandbox::runtime* rt();
const std::string& why();

/// A ticket for tenant `tenant` with code.execute at process level.
sandbox::ticket ticket(const std::string& tenant = "itest",
                       std::chrono::milliseconds max_timeout = std::chrono::milliseconds(8000),
                       std::uint64_t max_memory = 1ULL << 30);

/// The timeout of a run whose test left `run_request::timeout` at its default (2 s): 40 times
/// the wall time of `print('ok')` measured when the runtime was created, within [2 s, 30 s], so
/// a slow host (the cgroup v2 test bed's emulated CPU, a loaded laptop) gets a deadline in
/// proportion. Tests of the timeout itself set their own and are not scaled.
std::chrono::milliseconds default_deadline();

/// What starting a program costs on this host now: 10 times the calibrated `print('ok')` wall
/// time (a few hundred ms on a fast host, seconds under emulation). A test whose program must
/// get somewhere before a short deadline of its own (print, then be killed at the timeout)
/// adds this to that deadline, so the property is tested and never the host's speed.
std::chrono::milliseconds startup_allowance();

/// Runs `source` with `runtime` (default python3); other fields from `base`. A request with the
/// default timeout gets `default_deadline()`; the ticket's ceiling admits the request's
/// timeout (at least 8 s). The shared runtime's policy admits up to 2 minutes.
sandbox::run_result run(const std::string& source, sandbox::run_request base = {},
                        const std::string& runtime = "python3");
sandbox::run_result run(const sandbox::run_request& request, const sandbox::ticket& t);

/// Options for a runtime of a test's own: a fresh state dir under /tmp (its path in
/// `*state_root`, for the test to remove), the image dir and cgroup parent from
/// $SANDBOX_IMAGE_DIR / $SANDBOX_CGROUP_PARENT, a memory blob store, and a silent log.
sandbox::runtime_options private_runtime_options(std::string* state_root);

/// The content of a blob of tenant "itest" (or `tenant`).
std::string blob(const std::string& id, const std::string& tenant = "itest");

/// Reads tests/helpers/<name>.
std::string helper_source(const std::string& name);

/// Stores bytes for tenant "itest" and returns the blob id.
std::string put(const std::string& bytes, const std::string& tenant = "itest");

/// Host state that must be unchanged by a run: run cgroups, work dirs, processes of sandbox
/// uids, our own open descriptors and threads.
struct host_snapshot {
  std::vector<std::string> cgroups;
  std::vector<std::string> workdirs;
  std::vector<int> sandbox_pids;
  std::vector<std::string> mounts;  ///< /proc/self/mountinfo mount points of this process
  int fds = 0;
};
host_snapshot snapshot();
/// Counts the runs of runtimes under `root` (a state dir, or a folder of them) as this
/// process's own in `snapshot` (a child host process this test started). Private runtimes'
/// roots (`private_runtime_options`) and the shared runtime's are counted already.
void adopt_state_root(const std::filesystem::path& root);
/// Fails the current test (Catch) when the host still differs from `before` (cgroups, work
/// dirs, sandbox processes, mounts, our descriptors) after a bounded 2 s wait.
void check_host_unchanged(const host_snapshot& before);

/// Counts: lines of /proc/self/fd.
int count_fds();

}  // namespace itest
