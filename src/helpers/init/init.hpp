// sandbox-init internals. sandbox-init is exec'd fresh by the host as PID 1 of a new pid
// namespace (plus mount, net, ipc, uts and — for unprivileged hosts — user namespaces), or
// by an OCI runtime as the container's process (`launch=oci`: the runtime made the
// namespaces and the filesystem from our config.json). It is
// single-threaded and statically linked, builds the run's filesystem, starts the user program
// as its only child, reaps every orphan, and reports to the host over the control channel
// (wire/init_protocol.hpp). It never trusts anything the sandboxed program can influence.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "wire/init_protocol.hpp"

namespace sandbox::init {

using detail::init_protocol::step;

/// Parsed configuration (see process backend: the host writes it).
struct config {
  std::string mode = "run";  ///< "run" or "selftest"
  std::string rootfs;        ///< image root (host path, bound read-only piecewise)
  std::string staging;       ///< empty host dir where the new root is assembled
  std::string inputs;        ///< host dir with the input files
  std::string input_name;    ///< random dir name under /sandbox for the inputs
  std::string source;        ///< host path of the source file
  std::string source_name;   ///< its name under /sandbox
  uid_t uid = 65534;         ///< uid of the user program (inside the user ns, if any)
  gid_t gid = 65534;
  bool userns = false;  ///< running in a user namespace (unprivileged host)
  bool oci = false;     ///< started by an OCI runtime: the filesystem is built already
  bool notify = true;   ///< seccomp user notification (false under gVisor: unsupported)
  std::uint64_t tmp_bytes = 0, home_bytes = 0, shm_bytes = 0, out_bytes = 0;
  std::uint64_t tmpfs_inodes = 4096, out_inodes = 256;
  std::uint64_t nofile = 256, fsize_bytes = 1ULL << 30;
  std::uint64_t nproc = 0;  ///< RLIMIT_NPROC when > 0 (gVisor: see child.cpp)
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::uint16_t egress_proxy_port = 0;  ///< > 0: listen there for the host's egress proxy
  std::string run_ca_pem;  ///< a run with secrets: its CA certificate (written to run_ca_path)
  std::string node_proxy_preload;  ///< microvm network runs: written to node_proxy_path
  /// Path inside the sandbox of the program's standard input (a registered tool's staged
  /// bytes, read-only); empty: /dev/null.
  std::string stdin_path;
  /// A session's stdin (from `go`, a = 1): becomes the program's fd 0, before `stdin_path`;
  /// -1: none.
  int stdin_fd = -1;
  /// A pre-started instance (warm_pool_class::prestart): the interpreter's absolute path;
  /// empty: the program starts at `go`.
  std::string prestart;
  std::vector<std::string> prestart_env;  ///< its environment until `go` ("NAME=value")
  std::vector<std::string> preload;       ///< modules it imports before it waits
  std::string prestart_kind;              ///< "python" or "node": which loader (prestart.cpp)
};

/// A failed step: which, the errno, and optionally a text for the host's log (static
/// storage; sent after the step's name, `init_protocol::step`).
struct failure {
  step where;
  int err;
  const char* detail = nullptr;
};

/// Assembles the new root in `cfg.staging`, pivots into it, and returns (through `out_fd`,
/// `dns_fd`) a descriptor of the output directory and the DNS sink socket. Returns false and
/// fills `*f` on failure. Steps are numbered in mounts.cpp.
bool setup_sandbox(const config& cfg, int* out_fd, int* dns_fd, failure* f);

/// The OCI launchers' variant of `setup_sandbox`: the runtime built the filesystem; this
/// brings up loopback if needed, binds the DNS sink and opens the output directory.
bool setup_oci_sandbox(const config& cfg, int* out_fd, int* dns_fd, failure* f);

/// At "go": sets the times of what sandbox-init made on its own file systems (root, /dev,
/// /tmp, $HOME, the output dir) to now, so a warm-pool instance's idle time is not visible
/// to its run. "/" and "/dev" are made writable for that moment and read-only again; false
/// with `*f` filled only if making them read-only again fails.
bool refresh_times(failure* f);

/// Starts the user program as a child sharing init's descriptor table (so the seccomp
/// listener it creates lands in init's table too) and waits until it has exec'd. Returns the
/// child's pid and the listener fd (in init's table), or false with `*f` filled.
bool start_child(const config& cfg, pid_t* pid, int* listener_fd, failure* f);

/// Pre-starts the interpreter (`cfg.prestart`) as `start_child` starts a program, running
/// prestart.cpp's loader, and waits until it has imported `cfg.preload`. Returns its pid,
/// the seccomp listener (as `start_child`) and `*sock`, sandbox-init's end of the socket the
/// loader waits on; or false with `*f` filled (`step::prestart`: the interpreter died —
/// `detail` says how — or a module's import raised — errno 0, `detail` is the loader's
/// "<module>\n<exception summary>").
bool start_prestarted(const config& cfg, pid_t* pid, int* listener_fd, int* sock, failure* f);

/// Waits until the control channel is readable (`go`, or the host gone: true) or the
/// pre-started interpreter on `sock` died (false).
bool wait_go_or_death(int sock);

/// True when the run's `cfg.argv` (from `go`) is one the pre-started loader can run: for
/// Node exactly `<interpreter> /sandbox/<source_name>` (it has its main module's path since
/// it started), for Python at least `<interpreter> -I <source>`.
bool prestart_can_run(const config& cfg);

/// Sends the run's argv and environment (`cfg.argv`, `cfg.env`) to the pre-started loader
/// and closes `sock`. False if the interpreter is gone.
bool hand_over(int sock, const config& cfg);

/// The in-sandbox self-test probe (`sandbox-init --probe <uid>`): checks as the sandboxed
/// user that the guarantees hold. Exit 0 when all hold.
int run_probe(int argc, char** argv);

}  // namespace sandbox::init
