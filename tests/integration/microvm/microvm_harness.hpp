// Shared fixture of the microvm level's integration tests: one runtime with the microvm
// backend enabled (TCG on hosts without a usable /dev/kvm), tickets at level microvm.
#pragma once

#include <chrono>
#include <string>
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

}  // namespace mvtest
