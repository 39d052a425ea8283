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
/// Runs `source` (python3) with the other fields from `base`. A `base.timeout` left at the
/// protocol's default (2 s, which assumes a host CPU, not an emulated one) becomes
/// `must_finish()`.
sandbox::run_result run(const std::string& source, sandbox::run_request base = {});

// --- Deadlines from a calibration -----------------------------------------------------------
// Every program here is real Python in a guest that is emulated (TCG) on hosts without KVM:
// how long it takes depends on the host and its load, not on the sandbox. So the deadlines
// come from a calibration measured once, at the start of the test program, on this host as
// it is now (`calibrate`, printed in the log), never from another machine's speed.

/// What the calibration measured: the slower of two runs of `print('ok')`, each in a fresh VM
/// at level microvm through the shared runtime (deadline `ceiling`).
struct calibration {
  /// The program's wall time (`usage.wall`): the interpreter's start-up, one print, its exit.
  std::chrono::milliseconds python_start{0};
  /// The VM's boot and sandbox-init's set-up before the program (`usage.setup`).
  std::chrono::milliseconds vm_setup{0};
  /// False when a calibration run did not end `ok`: then fallback figures (10 s, 60 s)
  /// apply, and the log says why.
  bool measured = false;
};
/// Measures once (later calls return the same figures) and prints the figures and the
/// deadlines they give to stderr. Needs `rt()`. Not thread-safe on its first call (main
/// calls it before any test).
const calibration& calibrate();
/// The start-up allowance: how long a program may take to get going before it does what its
/// test watches: max(5 s, 5 × python_start).
std::chrono::milliseconds startup_allowance();
/// The deadline of a run that the deadline itself ends (a busy loop, a sleeper, a flood
/// until killed): the start-up allowance plus `work`, the program's own time the test's
/// property needs once it runs (at most `ceiling`).
std::chrono::milliseconds deadline(std::chrono::milliseconds work);
/// The deadline of a run that ends by itself (an exit, an OOM kill): it only bounds a
/// failure, it never tests the speed: max(60 s, 30 × python_start), at most `ceiling`.
std::chrono::milliseconds must_finish();
/// The most the harness's runtimes and tickets allow a run (policy and ticket
/// `max_timeout`): 10 min.
inline constexpr std::chrono::milliseconds ceiling{600000};
/// The harness's runtimes' setup budget (policy `setup_budget`; the level's own minimum, 90 s
/// under TCG, applies where larger): the runtimes exist before the calibration, so this is
/// fixed, but generous: it bounds a hung boot, never the speed (the calibration warns when a
/// measured boot took over a third of it).
inline constexpr std::chrono::milliseconds setup_budget{180000};
/// A bound for waiting on VM boots outside a run (a warm pool filling or refilling):
/// max(180 s, 20 × vm_setup).
std::chrono::seconds boot_wait();
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
