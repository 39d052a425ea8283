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
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
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
  /// PID 1 (sandbox-init) is invisible to the program: /proc is mounted with hidepid, so
  /// /proc lists only the run's own processes and /proc/1/* does not exist for it (process,
  /// container levels). false (gVisor 2022: its procfs has no hidepid): PID 1 is listed and,
  /// being root's and non-dumpable, only partly closed — its comm, environ (empty but
  /// `HOME=/root`), auxv, maps and status can be read and /proc/1/fd listed, while /proc/1/mem,
  /// exe, cwd and root stay refused and of /proc/1/fd/N only /dev/null opens
  /// (`init_entry_allowed` says exactly what may be read). Other runs' and host processes
  /// are never visible either way.
  bool init_hidden = true;
  /// Direct-IP egress (connect, sendto, sendmsg, sendmmsg to a non-loopback address) is seen
  /// by the host through seccomp user notification: every attempt is listed in
  /// `egress_attempts` and the run ends `network_disabled`; a forbidden system call (ptrace,
  /// bpf, ...) ends the run as `seccomp_violation`. false (gVisor: no user notification):
  /// such attempts fail inside the sandbox's own network stack (network=none:
  /// ENETUNREACH, EHOSTUNREACH, EINVAL) and are not recorded; only DNS queries to the run's
  /// resolver are (protocol "dns"), so the code is `network_disabled` only when one was
  /// made, else `ok`; forbidden calls get EPERM. Nothing gets through either way.
  bool egress_recorded = true;
  /// Memory of the sandbox's own kernel that is charged to the run's cgroup, and so to
  /// `usage.peak_memory_bytes`, beyond the request's `memory_limit_bytes` (gVisor: the sentry
  /// and gofer live in the run's cgroup, whose limit is the request's + 96 MiB; see
  /// oci_backend.cpp adjust_limits). 0: the peak never exceeds the request's limit.
  std::uint64_t sandbox_kernel_memory_bytes = 0;
  /// FIFOs and unix sockets the program makes in its output directory exist on the host's
  /// file system, so collection sees them and drops them with a reason. false (gVisor): the
  /// sandbox kernel keeps them to itself (its gofer creates no host file for them); they never
  /// reach the host, so they are neither returned nor listed as dropped.
  bool special_files_on_host = true;
  /// '..' from the root of the $HOME tmpfs leads to its parent directory. false (runsc
  /// 2022): it fails with EACCES for the sandboxed user (the directory the mount covers is
  /// checked), so a walk up from $HOME stops there; the working directory is then shown
  /// inside the root by resolving its absolute path instead.
  bool parent_of_home_reachable = true;
  /// The sandbox's own kernel needs host tasks for the program's processes, and dies when
  /// the run cgroup's pids limit refuses it one (gVisor's ptrace platform: a stub process
  /// per address space and, in it, a stub thread for each Sentry thread that ever ran it —
  /// 10 to 45 host tasks per program process measured). A program that keeps many
  /// processes busy, a fork bomb above all, can use up the host limit before the program's
  /// own (RLIMIT_NPROC inside) refuses it; the run then ends `pids_limit`, from the run
  /// cgroup's pids.events, never `internal`. false: a fork past the limit gets EAGAIN and
  /// the program goes on.
  bool sandbox_kernel_host_tasks = false;
  /// How many times slower than on the host kernel forks, execs and system calls are
  /// (gVisor's ptrace platform: every system call traps to the sentry, ~10-100x; a
  /// double fork takes ~20 ms on a loaded 2-core host, so the profile says 20). Cases with
  /// thousands of forks or system calls divide their workload by this, keeping it above what
  /// their property needs (and their assertions unchanged), so they fit the ticket's 8 s
  /// ceiling and the CI budget.
  int syscall_slowdown = 1;
  /// Scheduling calls are Linux's: a nice value can only go up (below where it is: EACCES,
  /// no CAP_SYS_NICE and RLIMIT_NICE 0), and SCHED_BATCH and SCHED_IDLE can be taken.
  /// false (gVisor 2022): they are stubs — setpriority records any number for getpriority
  /// without Linux's check, sched_setscheduler accepts only SCHED_OTHER (EINVAL) — and the
  /// Sentry's threads run at the host's priority whatever the program asks, so nothing is
  /// raised anywhere.
  bool linux_scheduling = true;
  /// A pty behaves as Linux's: once the child holding its slave exits, a read of the master
  /// fails with EIO (pexpect's EOF), and a process whose controlling terminal it is opens it
  /// as /dev/tty. false (gVisor 2022): that read waits, and /dev/tty fails with EIO; a reader
  /// that stops at the output it expects, or at the child's exit, still works.
  bool linux_pty = true;
  /// What the program wrote to stdout before a signal killed it comes back (the host
  /// captures the streams itself). false (interpreter cells): the cell's streams reach the
  /// host through the interpreter's driver, which a signal kills with the cell (a seccomp
  /// kill, SIGXCPU), so a cell killed so comes back without them; its code, signal and
  /// evidence are the host's as for a run.
  bool output_survives_kill = true;

  // Known gaps: library bugs or findings a backend has today (the conformance report names
  // each). A case consults one only to WARN about the gap and to keep asserting what still
  // holds; fixing the gap means turning its flag off here.

  /// Network runs work: each gets its egress proxy on its loopback (container levels; microvm
  /// through its virtio-serial tunnel).
  /// false: a network run at this level ends without running the code (process: admission
  /// answers `runtime_unavailable` when no stronger level is registered).
  bool egress_proxy = true;

  /// Every forked interpreter is charged to the run's memory much more than on the host
  /// kernel (gVisor: about 3.5 MiB each measured, beside the Sentry's own), so cases that
  /// fill the pids budget with interpreters ask for more memory than the default, to test
  /// the budget rather than the memory limit.
  bool forked_processes_cost_memory = false;
  /// GAP (library bug): the inode cap of /tmp, $HOME and /dev/shm (tmpfs nr_inodes) is not
  /// enforced inside gVisor (its tmpfs ignores nr_inodes): entries can be created until the
  /// memory limit; only the output directory (a host tmpfs) answers ENOSPC.
  bool gap_tmpfs_inode_limit = false;
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
  /// Python requests run as interpreter cells (sandbox/interpreter.hpp): `backend::run`,
  /// `submit` and `run_all` send a request that a cell can carry (`cell_eligible`) as the
  /// one cell of a fresh interpreter session and map the cell's result to a run's
  /// (`run_result_of_cell`); other requests run as runs. A hostile cell must be contained
  /// exactly as a hostile run is.
  bool as_cells = false;
  /// Only when SANDBOX_CONFORMANCE_PROFILES names it (not in the unfiltered "every
  /// profile"): a profile meant for some kinds only (its CTest entry picks them).
  bool opt_in = false;
};

/// Whether `req` can be sent as an interpreter cell: Python (`python3`), no network, stdin,
/// environment, registered tool, image pin, or memory limit other than the default (a cell
/// has none of these; `files_in` it has).
bool cell_eligible(const sandbox::run_request& req);
/// The run-shaped result of a request run as a cell: the cell's code, except that an
/// exception in the cell (`error`) reads as `ok` with exit status 1 and the traceback
/// summary on stderr; a cell the driver answered without one as exit status 0; an
/// interpreter that exited gives its status. Outputs, files and usage are the cell's; isolation,
/// the limits that applied, egress attempts, violation and OOM kills the session's (`end`).
sandbox::run_result run_result_of_cell(const sandbox::cell_result& cell,
                                       const sandbox::session_result& end,
                                       const std::string& run_id);

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
  /// Starts `req` under a ticket for `tenant` and returns its result's future; the deadline
  /// gets `startup_allowance()` on top, as in `run` and `run_all`.
  std::future<sandbox::run_result> submit(sandbox::run_request req,
                                          const std::string& tenant = "conformance");
  /// Runs several requests concurrently; results in order.
  std::vector<sandbox::run_result> run_all(std::vector<sandbox::run_request> reqs,
                                           const std::string& tenant = "conformance");
  /// A ticket for `tenant` at this backend's level; ceiling 30 s plus the largest start-up
  /// allowance (`startup_allowance("node")`).
  sandbox::ticket ticket(const std::string& tenant = "conformance") const;
  /// The content of a blob of `tenant`.
  std::string blob(const std::string& id, const std::string& tenant = "conformance");
  /// Stores bytes for `tenant`; returns the id.
  std::string put(const std::string& bytes, const std::string& tenant = "conformance");

 private:
  const backend_profile& profile_;
  sandbox::runtime& rt_;
};

/// The most `usage.peak_memory_bytes` a run with a memory limit may report: the request's
/// limit, the sandbox kernel's memory charged beside it (`sandbox_kernel_memory_bytes`), and
/// 256 KiB (MEMCG_CHARGE_BATCH, 64 pages): the memory controller lets a task that is dying or
/// being OOM-killed charge past the limit rather than fail ("force" in try_charge,
/// mm/memcontrol.c); a memory bomb at gvisor peaked one page over the limit so.
std::uint64_t peak_memory_ceiling(const sandbox::run_result& r, const expectations& expect);

/// Whether the program may learn `result` from /proc/1/<what> (`what`: exe, mem, environ, maps,
/// fd, root, cwd, status, auxv, comm, or "fd/N" for opening one of PID 1's descriptors;
/// `result`: "read", "readlink <target>", "listed <fds>", "OK <target>" for an opened fd, or
/// an errno name). Hidden PID 1 (`expect.init_hidden`): nothing. Otherwise exactly the
/// weaker set described at `init_hidden`.
bool init_entry_allowed(const expectations& expect, const std::string& what,
                        const std::string& result);

/// What starting a program costs at the level under test beyond what a case's deadline allows
/// for: five times Python's start-up measured when its runtime was made (microvm under TCG:
/// seconds; gvisor on a loaded host: a few seconds; process: a fraction of one).
/// `backend::run` and `run_all` add it to every request's deadline and `backend::ticket` to
/// its ceiling, so a case tests its property, never the host's speed. It follows the host's
/// load: scaled by `load_factor()` for a case that starts under a heavier load than the one
/// it was measured under (a loaded CI host's load changes as the tiers beside a tier start
/// and end: microvm cases ended `timeout` at the allowance measured before).
std::chrono::milliseconds startup_allowance();
/// The host's 1-minute load average (/proc/loadavg) per CPU; 0 when unreadable.
double host_load_per_cpu();
/// How much heavier the host's load is now than when the allowance in force was measured:
/// `host_load_per_cpu()` now over then, each counted as at least 1 (an idle host's figures
/// say nothing of speed), clamped to 1..4.
double load_factor();
/// The allowance for requests of `runtime`: Node's own where its level measured one (microvm
/// under TCG: five times Node's start-up, several times Python's), never less than
/// `startup_allowance()`; `startup_allowance()` for every other runtime. `backend::run`,
/// `submit` and `run_all` add this one; `backend::ticket`'s ceiling has the largest.
std::chrono::milliseconds startup_allowance(std::string_view runtime);
/// Raises `startup_allowance()` to `allowance` (each profile calibrates its level; where one
/// process runs several, the largest holds).
void set_startup_allowance(std::chrono::milliseconds allowance);
/// Raises Node's allowance (`startup_allowance("node")`) likewise.
void set_node_startup_allowance(std::chrono::milliseconds allowance);

/// A case's deadline when it names none (plus `startup_allowance()` through the backend).
inline constexpr std::chrono::milliseconds default_deadline{5000};

/// Builds a Python request (timeout `default_deadline` unless given; plus
/// `startup_allowance()` when run through `backend::submit`/`run`/`run_all`).
sandbox::run_request py(std::string source, std::chrono::milliseconds timeout = default_deadline);
/// Builds a Node request.
sandbox::run_request js(std::string source, std::chrono::milliseconds timeout = default_deadline);

/// Reads tests/helpers/<name>.
std::string helper_source(const std::string& name);

/// True when a test that cannot run must fail instead of skipping.
bool must_work();

// --- the host-integrity harness -----------------------------------------------------------

/// What a run must leave as it found it. Taken before and after every case.
struct host_snapshot {
  std::set<std::string> run_cgroups;            ///< r-* cgroups under the configured parents
  std::set<int> sandbox_processes;              ///< pids in a run cgroup or with a sandbox uid
  std::vector<std::string> mounts;              ///< this process's mount table (the host's)
  std::set<std::string> work_dirs;              ///< <state>/runs/<instance>/<run>
  int fds = 0;                                  ///< our open descriptors
  int threads = 0;                              ///< our threads
  std::map<std::string, std::string> canaries;  ///< host canary files: path → stat + content
  /// Our children that have exited and are not reaped (zombies) for more than 3 s: a
  /// launched runtime the library lost track of. (Younger ones are a teardown in progress.)
  std::set<int> unreaped_children;
  bool operator==(const host_snapshot&) const = default;
};
host_snapshot take_snapshot();
/// Waits (at most 10 s) until the warm pools of every profile's runtime in this process are
/// full and idle, so that a snapshot compares what runs left behind, not a refill in progress.
void settle_pools();
/// A snapshot once the host has settled: until two taken 20 ms apart agree (at most 2 s). A
/// run's v1 cgroup the kernel still reported busy at its result is removed just after it.
host_snapshot settled_snapshot();
/// A snapshot once the host is back to `before` (a process counted then may have ended), or
/// after 15 s of waiting for it to be.
host_snapshot snapshot_back_to(const host_snapshot& before);
/// CHECKs `now` against `before` (everything equal, but processes counted before may have
/// ended); lists differences in the failure.
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

/// The egress proxy cases' origin servers: tests/helpers/egress_origin.py on the host's
/// loopback, one plain HTTP and one HTTPS server (a certificate for the pinned names below,
/// made with the openssl CLI). Every runtime of the suite pins `egress_origin_names` to
/// 127.0.0.1 and allows these two ports, so a run approved for a name reaches them only
/// through its proxy. Started once, on first use (before any runtime exists).
struct egress_origin_info {
  bool ok = false;
  std::string why;  ///< why the servers could not start
  std::uint16_t http_port = 0;
  std::uint16_t https_port = 0;
  std::string ca_pem;     ///< the servers' certificate (self-signed; the client trusts it)
  std::string cert_file;  ///< the same, as a file (the proxy's `origin_ca_file`)
  /// GET /stats from the HTTP server: {"http":{"connections":N,"requests":N},"https":{...}}.
  std::string stats() const;
};
const egress_origin_info& egress_origin();
/// Every host log line (any level) and every span (as its JSON line) the suite's runtimes
/// have produced so far, one per line: what a case searches for bytes that must never leave
/// the host process (a secret's value).
std::string host_log_and_spans();
/// Names pinned to 127.0.0.1 in every suite runtime: "rates.approved.test" (the runs'
/// approved name), "other.test" (pinned, reachable, but never approved).
inline constexpr const char* egress_approved_name = "rates.approved.test";
inline constexpr const char* egress_other_name = "other.test";
/// A name pinned to the same origins whose certificate does not name it: a proxy that
/// verifies origins refuses it.
inline constexpr const char* egress_wrong_cert_name = "wrong-cert.test";
/// Names the suite runtimes' (untrusted) resolver answers with a loopback address
/// ("rebind.test") and with the metadata service's and an IPv4-mapped private address
/// ("metadata.test"): DNS rebinding, as a hostile DNS server would do it.
inline constexpr const char* egress_rebind_name = "rebind.test";
/// The host-held secret every suite runtime defines (sandbox/secrets.hpp): "rates-api", sent
/// as `Authorization: Bearer <value>` to `egress_approved_name` only, its value in a 0600 file
/// under `state_root()`. No run may ever see the value; cases look for it byte for byte.
inline constexpr const char* secret_name = "rates-api";
inline constexpr const char* secret_value = "sk-conformance-VALUE-5f0c2a9e71d4";
inline constexpr const char* egress_metadata_name = "metadata.test";
/// The registered tool with its own egress (cases/tool_egress_test.cpp): /usr/bin/python3
/// of the python3 image with a fixed script; `egress` = {egress_approved_name}, isolation
/// process (the entry's egress alone lifts its runs to container or stronger). Per stdin
/// line, model bytes: a URL, fetched through the environment's proxy (the origins' CA from
/// input file `ca.pem` when given), or `direct HOST:PORT`, a plain TCP connect. Per line it
/// prints one JSON object: {"in": line, "status": HTTP status (0: no response; 1: direct
/// connected), "body": up to 4 KiB or the error, "proxy": $HTTPS_PROXY}.
inline constexpr const char* egress_tool_name = "fetch";
/// The session server of cases/session_stdio_test.cpp: /usr/bin/python3 of the python3 image
/// with a fixed script, isolation process. First it reports, as one JSON line, what it could
/// reach of sandbox-init's descriptors ({"ctl": {path: "opened <link>" | errno name}, "fds":
/// [its descriptors above 2], "stdin_fifo": bool}); then it echoes its stdin byte for byte,
/// and at EOF prints "eof <bytes>" and lives on.
inline constexpr const char* session_probe_tool_name = "session-probe";
/// Per-run proxy budgets of the suite's runtimes.
inline constexpr std::uint32_t egress_max_connections = 8;
inline constexpr std::uint64_t egress_max_bytes_down = 2ULL << 20;

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
/// after the case. The case is watched (`start_case_watchdog`) from construction until the
/// host check ends.
class case_guard {
 public:
  explicit case_guard(backend* b);
  ~case_guard();
  case_guard(const case_guard&) = delete;
  case_guard& operator=(const case_guard&) = delete;

 private:
  static void watch_case(backend& b);
  backend* b_;
  host_snapshot before_;
  std::chrono::steady_clock::time_point start_;
};

/// Starts the hang watchdog: a case (with its host checks) still running after
/// SANDBOX_CONFORMANCE_CASE_LIMIT_S seconds (default 300; the slowest core case takes ~60 s)
/// gets the host's process tree, our threads' kernel stacks and, with gdb installed, every
/// thread's backtrace printed to stderr, and the suite exits 1 — a named failure instead of
/// CTest's silent timeout.
void start_case_watchdog();

/// Seconds spent per backend so far (printed by main at the end).
std::map<std::string, double>& suite_seconds();

}  // namespace conformance

/// Runs the enclosing TEST_CASE once per registered backend, binds `var` to it, and checks
/// the host when the case ends. Returns from the case when the backend is unavailable on this
/// host (a warning on laptops; a failure with CI=true or SANDBOX_MUST_WORK=1).
#define CONFORMANCE_BACKEND(var)                                                \
  conformance::backend* var##_ptr = conformance::acquire(                       \
      GENERATE(Catch::Generators::from_range(conformance::profile_indices()))); \
  if (var##_ptr == nullptr) return;                                             \
  conformance::backend& var = *var##_ptr;                                       \
  conformance::case_guard var##_guard(var##_ptr)
