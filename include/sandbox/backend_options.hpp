// The options of each built-in isolation level's backend (process, OCI: container and
// gvisor, microvm), of their warm pools and of network runs' egress proxy. They are fields of
// `runtime_options` (sandbox/runtime.hpp); they live here so that the code of the levels
// (src/core, src/backends) reads them without including the runtime facade.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/protocol.hpp"
#include "sandbox/registry.hpp"

namespace sandbox {

/**
 * A warm pool of one limits class: `size` process-level instances of `runtime` prepared ahead
 * (uid, cgroup with these limits, namespaces, filesystem, sandbox-init waiting), each handed
 * to exactly one run and then destroyed, refilled asynchronously. A request is served from
 * the pool when its runtime, memory limit and `files_out` limits equal the class's (the
 * defaults match a request that leaves them unset); otherwise it runs cold. A pooled run is
 * indistinguishable from a cold one to the code inside.
 */
struct warm_pool_class {
  std::string runtime = "python3";
  /// Expected concurrent executions of this class (not requests per second).
  std::uint32_t size = 2;
  std::uint64_t memory_limit_bytes = 256ULL << 20;
  output_limits files_out;
  /// Pre-started instances (opt-in; every level: at microvm a pooled VM boots to the waiting
  /// interpreter;
  /// the runtimes `prestart_kind_of` names: a
  /// Python `[<path>, "-I", "{source}"]` or a Node `[<path>, "{source}"]`): the interpreter
  /// is started in the fully prepared instance (same uid, cgroup, namespaces, filesystem and
  /// seccomp filter as the run), imports `preload`, and waits; at hand-out it runs the source
  /// as the main module, once. What the program can observe differs from a cold run only as
  /// docs/security.md lists. A class asking for it with a runtime that cannot is refused by
  /// the configuration document and skipped (logged) by `runtime::create`.
  bool prestart = false;
  /// Modules a pre-started interpreter imports ahead, in order, from the image only (each
  /// valid for its runtime, `is_valid_preload_module`; at most 64, no duplicates). Needs
  /// `prestart`. One whose import raises stops the class (`pool_stats::error`).
  std::vector<std::string> preload;
  bool operator==(const warm_pool_class&) const = default;
};

/// The interpreter a pre-started pool class starts, by its runtime's argv (`prestart_kind_of`).
enum class prestart_kind {
  none,    ///< cannot be pre-started
  python,  ///< `[<absolute path to python3*>, "-I", "{source}"]`
  node,    ///< `[<absolute path to node or nodejs>, "{source}"]`
};

/// What a warm pool class of runtime `spec` can be pre-started as
/// (`warm_pool_class::prestart`); `none` for any other argv.
prestart_kind prestart_kind_of(const runtime_spec& spec) noexcept;

/// True when `spec` can be pre-started (`prestart_kind_of(spec) != prestart_kind::none`).
bool supports_prestart(const runtime_spec& spec) noexcept;

/// True when `name` can be a `warm_pool_class::preload` entry of a Python class: 1..128 ASCII
/// characters, dot-separated Python identifiers (`[A-Za-z_][A-Za-z0-9_]*` each), e.g. "json",
/// "xml.etree.ElementTree".
bool is_valid_preload_module(std::string_view name) noexcept;

/// True when `name` can be a `preload` entry of a class of `kind`: for Python as above; for
/// Node 1..214 ASCII characters naming a package as `require` takes it, never a path — an
/// optional `@scope/`, a name of `[A-Za-z0-9._~-]` not starting with `.`, `_`, `-` or `~`, then
/// optional `/`-separated subpath parts of the same characters other than "." and ".." (e.g.
/// "lodash", "@scope/pkg/sub", "child_process") — or a built-in as "node:<name>" (e.g.
/// "node:fs/promises"). False for `none`.
bool is_valid_preload_module(prestart_kind kind, std::string_view name) noexcept;

/// Options of the process backend (namespaces + cgroup + seccomp; src/backends/process).
struct process_backend_options {
  /// Parent cgroup of all runs, as a path inside each cgroup hierarchy (e.g.
  /// "/agent-sandbox"). Empty: "/agent-sandbox" when root; required otherwise (a subtree
  /// delegated to this user, e.g. by systemd's `Delegate=yes`). The host process must not
  /// live in it.
  std::string cgroup_parent;
  /// Root of the cgroup filesystems. Tests point this at a fake tree.
  std::filesystem::path cgroup_root = "/sys/fs/cgroup";
  /// When running as root: each concurrent run gets its own uid/gid from
  /// [uid_base, uid_base + uid_count); reserved across processes with locks.
  std::uint32_t uid_base = 2'100'000'000;
  std::uint32_t uid_count = 4096;
  /// The host's uid reservations (root only): an OFD lock on byte `uid` of this file per uid
  /// in use. One file for the whole host, whatever the state directory, so that two runtimes
  /// (two daemons, a daemon and a one-shot `sandboxctl run`) never give one uid to two runs at
  /// once: per-uid kernel limits (inotify instances, message queues, pending signals) would
  /// be shared between them. Created mode 0600; its directory must exist. A runtime that
  /// cannot open it registers no backend (`backends()` says why).
  std::filesystem::path uid_lock_file = "/run/agent-sandbox-uids.lock";
  /// Use this sandbox-init executable instead of the copy built into the library (debugging).
  std::filesystem::path init_path;
  /// Warm pools (none by default).
  std::vector<warm_pool_class> warm_pool;
};

/// One OCI backend: sandbox-init runs as the container's process (PID 1) under crun or runc
/// (level `container`) or runsc (level `gvisor`, gVisor's user-space kernel), with a
/// config.json generated per run (docs/architecture.md, "OCI backends"). Needs root. Uses the
/// process backend's cgroup parent, cgroup root and uid range (`process_backend_options`).
struct oci_backend_options {
  /// Register the backend (after its self-test, at runtime creation). Off by default: a host
  /// chooses its levels, and each one costs a self-test at start-up.
  bool enabled = false;
  /// The OCI runtime: "crun" or "runc" for `container`, "runsc" for `gvisor`.
  std::string runtime;
  /// Absolute path of the runtime's binary; empty: /usr/bin/<runtime>.
  std::filesystem::path path;
  /// runsc only: its `--platform` ("ptrace" works on any host; "kvm" needs /dev/kvm).
  std::string platform = "ptrace";
  /// Warm pools of started containers whose sandbox-init waits for its program (none by
  /// default). One-shot, like the process backend's; a `prestart` class's containers hold
  /// the interpreter already started inside, waiting for its run.
  std::vector<warm_pool_class> warm_pool;
};

/// The `microvm` level: one QEMU `-M microvm` VM per run (KVM when /dev/kvm is usable, else
/// TCG emulation), booted from the kernel store with an initramfs holding the guest agent
/// and sandbox-init, the runtime image as a read-only erofs disk, no network device
/// (docs/architecture.md, "microvm level"). Needs root. Uses the process backend's cgroup
/// parent, cgroup root and uid range. Network runs reach their egress proxy through a
/// virtio-serial tunnel (still no network device in the guest).
struct microvm_backend_options {
  /// Register the backend (after its self-test, which boots one VM). Off by default.
  bool enabled = false;
  /// The kernel store: `vmlinuz`, `modules/order` and the modules it names, and optionally
  /// `vmlinux`, the same kernel uncompressed with a PVH entry point, booted instead of
  /// `vmlinuz` when present (tools/fetch-guest-kernel.sh fills it).
  std::filesystem::path kernel_dir = "/var/lib/agent-sandbox/microvm/kernel/current";
  /// "auto" (KVM when /dev/kvm can make a VM, else TCG), "kvm" (refuse to register without
  /// it) or "tcg".
  std::string accel = "auto";
  /// Guest RAM = the run's memory limit + this (the guest kernel, the agent, the initramfs)
  /// + room for a full guest workspace (the policy's largest source or stdin and inputs:
  /// the workspace is a guest tmpfs outside the program's cgroup), MiB. Default 96.
  std::uint64_t guest_overhead_mib = 96;
  /// The run cgroup's memory = guest RAM + this, for the VMM itself (QEMU and, under TCG,
  /// its 64 MiB translation cache), MiB. Default 192.
  std::uint64_t vmm_overhead_mib = 192;
  /// `qemu-system-x86_64`; empty: /usr/bin/qemu-system-x86_64.
  std::filesystem::path qemu_path;
  /// `mkfs.erofs` (erofs-utils), which builds the image disks; empty: /usr/bin/mkfs.erofs.
  std::filesystem::path mkfs_erofs_path;
  /// Warm pools of VMs booted to "sandbox-init ready" ahead of demand (none by default): a
  /// matching run skips the VMM start and the guest boot. One-shot like the other levels'
  /// pools: a VM serves one run and is destroyed with it (never reused, so no VM ever carries
  /// a previous run's disk or memory); a VM that misses its ready deadline (the setup
  /// budget) or dies while idle is destroyed and replaced. Each idle VM holds the guest RAM it
  /// has touched (its kernel, agent and prepared sandbox) on the host. `prestart` classes
  /// are not served here yet (logged and skipped; the configuration document refuses them).
  std::vector<warm_pool_class> warm_pool;
};

/// The host side of network runs: each run granted the network gets its own egress proxy,
/// served by the host on a socket listening on the run's own loopback (127.0.0.1:3128, given
/// to the program as HTTP_PROXY / HTTPS_PROXY). It forwards HTTP `CONNECT` (HTTPS; the TLS
/// ClientHello's SNI must equal the CONNECT host) and plain HTTP to the run's approved names
/// only (`run_request.egress`), resolving them on the host and refusing loopback, private,
/// link-local and metadata addresses (docs/security.md, "Egress proxy").
struct egress_proxy_options {
  /// Names the proxy resolves to these numeric addresses (IPv4 or IPv6 text) instead of
  /// asking the host's resolver, like an /etc/hosts of the proxy's own. A pinned answer is
  /// trusted, so it may be a loopback or private address, which a resolved name never may
  /// (the DNS-rebinding defence): for internal services the operator means to expose, and for
  /// tests. Only names a run is also approved for are ever reached.
  std::map<std::string, std::vector<std::string>> pinned_hosts;
  /// Resolves the names that are not pinned, instead of the host's resolver (getaddrinfo):
  /// e.g. a DNS-over-HTTPS client or a resolver of the operator's choosing. Called on the
  /// runtime's executor, must not block, and must call `done` exactly once (from any thread)
  /// with numeric IPv4/IPv6 addresses; none: the name does not resolve. Its answers are not
  /// trusted: loopback, private, link-local, metadata and other non-public addresses in them
  /// are refused like the host resolver's. Empty: the host's resolver.
  std::function<void(const std::string& host,
                     std::function<void(std::vector<std::string> addresses)> done)>
      resolver;
  /// Ports `CONNECT` may reach (default: 443).
  std::vector<std::uint16_t> connect_ports{443};
  /// Ports plain HTTP may reach (default: 80).
  std::vector<std::uint16_t> http_ports{80};
  /// Client connections a run may open through its proxy, in all (beyond: 403).
  std::uint32_t max_connections = 32;
  /// Bytes a run may send (up) and receive (down) through its proxy, in all; past either,
  /// its tunnels are closed.
  std::uint64_t max_bytes_up = 16ULL << 20;
  std::uint64_t max_bytes_down = 64ULL << 20;
  /// A PEM file of CA certificates the proxy also trusts for origins, beside the host's
  /// default trust store (OpenSSL's default paths), when it terminates TLS for a run that
  /// uses a secret: for internal origins with a private CA, and for tests. Absolute path;
  /// empty: the default store alone. It must hold a PEM certificate when the runtime is
  /// created (else creation fails); read again at each terminated connection.
  std::string origin_ca_file;
};

}  // namespace sandbox
