// Shared fixture of the microvm level's integration tests: one runtime with the microvm
// backend enabled (TCG on hosts without a usable /dev/kvm), tickets at level microvm.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/sandbox.hpp"

namespace mvtest {

/// True when a test that cannot run must fail instead of skipping (CI=true or
/// SANDBOX_MUST_WORK=1).
bool must_work();
/// The shared runtime; nullptr when the microvm backend did not register — `why()` says why.
sandbox::runtime* rt();
const std::string& why();
/// The microvm backend's state directory (<state>/microvm).
std::string state_dir();
/// A ticket for tenant "mvtest" with code.execute at level microvm.
sandbox::ticket ticket();
/// Runs `source` (python3) with the other fields from `base`.
sandbox::run_result run(const std::string& source, sandbox::run_request base = {});
/// Stores bytes for tenant "mvtest" and returns the blob id; reads one back.
std::string put(const std::string& bytes);
std::string blob(const std::string& id);
/// The run cgroups of this test's microvm backend still present (r-<instance>-*, in every
/// hierarchy), and its live VMMs (qemu-system-* processes in such a cgroup). Other
/// engineers' runs on a shared host are not counted.
std::vector<std::string> run_cgroups();
int vmm_processes();
/// The pids of those live VMMs.
std::vector<int> vmm_pids();
/// The pids of the live VMMs of the runtime whose state dir is `state` (its `<state>/microvm`
/// instances), whose run id starts with `run_prefix` (pool instances: "w").
std::vector<int> vmm_pids(const std::filesystem::path& state, std::string_view run_prefix = {});

/// A runtime of a test's own (its own state dir under /tmp, only the microvm level), for
/// options the shared one must not have (warm pools, registered tools). `rt` is null when the
/// backend did not register (`why` says why); the state dir is removed on destruction.
struct private_runtime {
  std::unique_ptr<sandbox::runtime> rt;
  std::string why;
  std::filesystem::path dir;
  /// `adjust` edits the options before the runtime is created.
  explicit private_runtime(const std::function<void(sandbox::runtime_options&)>& adjust);
  ~private_runtime();
  private_runtime(const private_runtime&) = delete;
  private_runtime& operator=(const private_runtime&) = delete;
  /// True when `rt` exists; otherwise FAILs under CI / SANDBOX_MUST_WORK, else WARNs.
  bool available() const;
  std::filesystem::path state() const { return dir / "state"; }
};

/// The network runs' origin: a plain-HTTP server on the host's 127.0.0.1 (an ephemeral port,
/// started before the runtime), reachable from a run only through its egress proxy: the
/// runtime pins `approved_name` and `other_name` to 127.0.0.1 and allows this port for
/// plain HTTP. Every request is answered 200 with the body "origin got <n> bytes for
/// <method> <target>" (n = its Content-Length body, read whole). 0 when it did not start.
std::uint16_t origin_port();
inline constexpr const char* approved_name = "mvnet.approved.test";
inline constexpr const char* other_name = "mvnet.other.test";
/// Body bytes the origin has read so far, all requests together.
std::uint64_t origin_bytes();
/// A ticket for tenant "mvtest" with code.execute and code.network for `approved_name` at
/// level microvm.
sandbox::ticket network_ticket();
/// Runs `source` (python3) as a network run approved for `approved_name`.
sandbox::run_result run_network(const std::string& source, sandbox::run_request base = {});

}  // namespace mvtest
