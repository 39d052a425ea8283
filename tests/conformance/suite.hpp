// The hostile-code conformance suite: every registered backend must contain every attack, and
// the host is checked after each case (docs/security.md, "Attack → test → what it proves").
//
// A backend joins by registration alone (a `backend_profile` in backends.cpp); no case
// changes. Cases assert *properties* — the result code, flags, and what the code could not
// do — and consult the profile's expectation table only where a mechanism legitimately
// differs (a VM guest has its own kernel, so its /proc/self/status says other things).
//
// Writing a case:
//
//   TEST_CASE("exfiltration: TCP to a host canary listener", "[exfil][core]") {
//     CONFORMANCE_BACKEND(b);                   // one run of the body per registered backend
//     canary_tcp_listener canary;               // host-side, counts connections
//     auto r = b.run(py(fmt::format("...connect to 127.0.0.1:{}...", canary.port())));
//     CHECK(r.code == sandbox::code::ok);
//     CHECK(canary.connections() == 0);
//   }                                           // the host snapshot is compared here
//
// Tiers: `[core]` runs in CI (tools/run-tests.sh); `[heavy]` are the big variants, run with
// `build/dev/tests/sandbox_conformance "[heavy]"` (docs/security.md). Each backend's suite
// time is printed at the end so growth is visible.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sandbox/sandbox.hpp"

namespace conformance {

/// Where a mechanism legitimately differs between backends.
struct expectations {
  /// The sandboxed code runs on the host's kernel (process, container levels): the host's
  /// seccomp filter is visible as `Seccomp: 2` and `NoNewPrivs: 1` in /proc/self/status.
  bool host_kernel = true;
  /// Concurrent runs have distinct uids as seen from the host (root hosts of the process
  /// level; an unprivileged host maps every run to its own uid in a user namespace of its
  /// own, so the uid inside is the same number).
  bool distinct_uids = true;
  /// Non-native system call ABIs reach the host kernel's entry points (and so must be
  /// refused by the filter), rather than a guest kernel's.
  bool syscall_abi_on_host = true;
};

/// One backend under test.
struct backend_profile {
  std::string name;  ///< e.g. "process", "process (unprivileged)"
  sandbox::isolation level = sandbox::isolation::process;
  /// Creates the runtime this backend's cases use; nullptr (with `*why`) when this host cannot
  /// run the backend — a skip on laptops, a failure in CI.
  std::function<std::unique_ptr<sandbox::runtime>(std::string* why)> make;
  expectations expect;
  /// The host configuration that enables this backend (for cases that go through
  /// `sandboxctl --config`); empty for the process level, which is always on.
  std::string host_config;
  /// CI time budget of this backend's core tier; exceeding it is reported, never asserted.
  std::chrono::seconds ci_budget{600};
};

/// A backend ready for a case: its profile, its runtime, and shortcuts.
class backend {
 public:
  backend(const backend_profile& profile, sandbox::runtime& rt) : profile_(profile), rt_(rt) {}
  const backend_profile& profile() const { return profile_; }
  const expectations& expect() const { return profile_.expect; }
  sandbox::runtime& rt() { return rt_; }
  const std::string& name() const { return profile_.name; }

  /// Runs `req` under a ticket for `tenant` (code.execute, this backend's level); logs the
  /// result as Catch INFO so a failing check shows it.
  sandbox::run_result run(sandbox::run_request req, const std::string& tenant = "conformance");
  /// Runs several requests concurrently; results in order.
  std::vector<sandbox::run_result> run_all(std::vector<sandbox::run_request> reqs,
                                           const std::string& tenant = "conformance");
  /// A ticket for `tenant` at this backend's level.
  sandbox::ticket ticket(const std::string& tenant = "conformance") const;
  /// The content of a blob of `tenant`.
  std::string blob(const std::string& id, const std::string& tenant = "conformance");
  /// Stores bytes for `tenant`; returns the id.
  std::string put(const std::string& bytes, const std::string& tenant = "conformance");

 private:
  const backend_profile& profile_;
  sandbox::runtime& rt_;
};

/// Builds a Python request (timeout 5 s unless given).
sandbox::run_request py(std::string source,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
/// Builds a Node request.
sandbox::run_request js(std::string source,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

/// Reads tests/helpers/<name>.
std::string helper_source(const std::string& name);

/// True when a test that cannot run must fail instead of skipping.
bool must_work();

// --- the host-integrity harness -----------------------------------------------------------

/// What a run must leave as it found it. Taken before and after every case.
struct host_snapshot {
  std::set<std::string> run_cgroups;    ///< r-* cgroups under the configured parents
  std::set<int> sandbox_processes;      ///< pids in a run cgroup or with a sandbox uid
  std::vector<std::string> mounts;      ///< this process's mount table (the host's)
  std::set<std::string> work_dirs;      ///< <state>/runs/<instance>/<run>
  int fds = 0;                          ///< our open descriptors
  int threads = 0;                      ///< our threads
  std::map<std::string, std::string> canaries;  ///< host canary files: path → stat + content
  bool operator==(const host_snapshot&) const = default;
};
host_snapshot take_snapshot();
/// A snapshot once the host has settled: until two taken 20 ms apart agree (at most 2 s). A
/// run's v1 cgroup the kernel still reported busy at its result is removed just after it.
host_snapshot settled_snapshot();
/// A snapshot once the host is back to `before`, or after 2 s of waiting for it to be.
host_snapshot snapshot_back_to(const host_snapshot& before);
/// CHECKs `now` against `before` (everything equal); lists differences in the failure.
void check_unchanged(const host_snapshot& before, const host_snapshot& now);

/// Host canary files (a secret in /tmp, one under the state dir's parent, one in /root when
/// root): created once; their content, owner, mode and mtime are part of every snapshot.
const std::vector<std::filesystem::path>& canary_files();
/// The secret string written into canary files and the host's environment.
const std::string& canary_secret();

/// Where the backends' state directories live (one per backend, created on first use).
const std::filesystem::path& state_root();

/// SHA-256 of host executables a run could try to reach (through /proc/<pid>/exe or the
/// image): the supervising process itself, and the image's interpreters and libc as stored on
/// the host. Compare before and after a case that attacks them.
std::map<std::string, std::string> host_binary_hashes(sandbox::runtime& rt);

/// Resident set size of this (the supervising) process, in bytes.
std::uint64_t self_rss_bytes();

// --- running cases over every backend --------------------------------------------------------

/// Registered backends (backends.cpp), in registration order.
const std::vector<backend_profile>& profiles();
/// Index range for GENERATE.
std::vector<std::size_t> profile_indices();
/// The backend for profile `index`, creating its runtime on first use; nullptr with `*why`
/// when this host cannot run it. No Catch assertions (usable before the session starts).
backend* ensure(std::size_t index, std::string* why);
/// `ensure` for use in a case: when the host cannot run the backend, a warning (laptop) or a
/// failure (CI=true / SANDBOX_MUST_WORK=1), and nullptr.
backend* acquire(std::size_t index);

/// Per-case RAII: snapshots the host, times the case for its backend, and checks the host
/// after the case.
class case_guard {
 public:
  explicit case_guard(backend* b);
  ~case_guard();
  case_guard(const case_guard&) = delete;
  case_guard& operator=(const case_guard&) = delete;

 private:
  backend* b_;
  host_snapshot before_;
  std::chrono::steady_clock::time_point start_;
};

/// Seconds spent per backend so far (printed by main at the end).
std::map<std::string, double>& suite_seconds();

}  // namespace conformance

/// Runs the enclosing TEST_CASE once per registered backend, binds `var` to it, and checks
/// the host when the case ends. Returns from the case when the backend is unavailable on this
/// host (a warning on laptops; a failure with CI=true or SANDBOX_MUST_WORK=1).
#define CONFORMANCE_BACKEND(var)                                                             \
  conformance::backend* var##_ptr = conformance::acquire(                                    \
      GENERATE(Catch::Generators::from_range(conformance::profile_indices())));              \
  if (var##_ptr == nullptr) return;                                                          \
  conformance::backend& var = *var##_ptr;                                                    \
  conformance::case_guard var##_guard(var##_ptr)
