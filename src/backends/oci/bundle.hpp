// OCI bundles for the `container` (crun, runc) and `gvisor` (runsc) levels (private to src/).
//
// One bundle per run, inside the run's workspace (core/run/workspace.hpp):
//   <ws>/bundle/config.json      written by `write_bundle` (OCI runtime-spec v1.0.2)
//   <ws>/bundle/rootfs/          the root skeleton: an empty mount point (dir or file) for each
//                                top-level entry of the image, its top-level symlinks copied as
//                                symlinks, and the directories our own mounts need (/proc,
//                                /dev, /tmp, /home/sandbox, /sandbox/...). The runtime mounts
//                                the image's entries read-only onto it, so it never writes into
//                                the shared image (runc/crun create missing mount points in
//                                the root they are given).
//   <ws>/bundle/files/           resolv.conf, hosts, hostname, passwd, group: bound read-only
//                                over the image's files (only where the image has them as
//                                regular files under a real /etc; passwd and group are the
//                                image's with the run's own entry, wire/accounts.hpp), and a
//                                random per-run boot id
// What a generated config.json may mount from the host is closed: the image root (read-only),
// the run's inputs (read-only), its source (read-only), its output directory, the bundle's
// own files (read-only) and the sandbox-init executable (read-only). `check_config` proves it
// for any config.json; the unit tests run it over generated and hostile documents.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sandbox/error.hpp"

namespace sandbox::detail::oci {

/// The Node preload (src/helpers/node/proxy_preload.js) that makes node's http, https and
/// fetch honour HTTP(S)_PROXY; every bundle carries it read-only at `node_proxy_preload_path`
/// (network runs load it through NODE_OPTIONS).
std::string_view node_proxy_preload() noexcept;
inline constexpr const char* node_proxy_preload_path = "/.sandbox-etc/node-proxy.cjs";

/// Which OCI runtime the bundle is for (a few fields differ: see make_config).
enum class runtime_kind { crun, runc, runsc };

/// Everything one run's bundle is made of. Paths are host paths, absolute and normalized.
struct bundle_params {
  std::string container_id;  ///< [a-z0-9-], 1..64 chars
  runtime_kind kind = runtime_kind::crun;
  std::filesystem::path image_root;        ///< the image store's unpacked root (read-only)
  std::filesystem::path workspace;         ///< the run's workspace; the bundle goes in <ws>/bundle
  std::filesystem::path inputs;            ///< the run's input dir (inside the workspace)
  std::filesystem::path source;            ///< the run's source file (inside the workspace)
  std::string source_name;                 ///< its name under /sandbox, e.g. "main.py"
  std::string input_name;                  ///< "in-<16 hex>": the inputs' dir under /sandbox
  std::filesystem::path output_dir;        ///< the output dir (a host tmpfs, inside the workspace)
  std::filesystem::path init_executable;   ///< sandbox-init on the host; bound at /.sandbox-init
  std::string cgroups_path;                ///< linux.cgroupsPath, e.g. "/agent-sandbox/r-abc-def"
  std::uint32_t uid = 65534, gid = 65534;  ///< the program's ids, not 0 (init drops to them)
  std::uint64_t memory_bytes = 0;          ///< memory limit (no swap)
  std::uint32_t max_pids = 0;              ///< pids limit
  std::uint32_t cpu_millicores = 0;        ///< CPU quota (1000 = one core); 0 = none
  std::uint64_t tmp_bytes = 0, home_bytes = 0, shm_bytes = 0;  ///< tmpfs sizes (each > 0)
  std::uint64_t tmpfs_inodes = 4096;       ///< nr_inodes of /tmp, $HOME, /dev/shm
  std::uint64_t nofile = 256;              ///< RLIMIT_NOFILE
  std::uint64_t fsize_bytes = 1ULL << 30;  ///< RLIMIT_FSIZE
  /// runsc network runs only: the runtime itself is started inside the run's own network
  /// namespace (sys/netns.hpp: loopback and the egress proxy's listener, nothing else) with
  /// `--network=host`, so the config has no network namespace entry (gVisor's sockets are
  /// then host sockets of that namespace). Refused for crun and runc.
  bool runtime_network_namespace = false;
};

/// The generated bundle.
struct bundle {
  std::filesystem::path dir;          ///< <ws>/bundle (pass to `<runtime> run --bundle`)
  std::filesystem::path config_path;  ///< <ws>/bundle/config.json
  nlohmann::json config;              ///< what was written
};

/**
 * The config.json document for `p` (pure: touches no file except reading the image root's
 * top level with lstat and its /etc/passwd and /etc/group, never following a link).
 * Errors, with `*why` (when given) saying which: `invalid_argument` when a parameter is
 * malformed (an id or name outside its alphabet; a path that is relative, not lexically
 * normal or not UTF-8; inputs, source or output dir not strictly inside the workspace, or
 * inside <ws>/bundle; workspace or image root "/", or one inside the other; source_name
 * "out" or equal to input_name; uid or gid 0 — there is no user namespace, so 0 is host
 * root; a zero size; a cgroups_path that is not absolute and clean); `io_error` when the
 * image root (or its /etc/passwd or /etc/group, where they are regular files) cannot be
 * read.
 *
 * Image entries: directories and regular files are mounted, symlinks are copied into the
 * skeleton by `write_bundle`; FIFOs, sockets, devices, names that are not UTF-8 and the
 * reserved names (proc, sys, dev, tmp, run, home, sandbox, .sandbox-init, .sandbox-etc)
 * are not taken from the image.
 *
 * Shape (runtime-spec v1.0.2, config.md and config-linux.md):
 *  - root: <ws>/bundle/rootfs, read-only; hostname "sandbox"; process.terminal false
 *  - process: args ["/.sandbox-init"], empty env, cwd "/", uid/gid 0, noNewPrivileges,
 *    rlimits NOFILE/FSIZE/CORE(0); capabilities: only what sandbox-init needs before it
 *    starts the program (SETUID, SETGID, SETPCAP, NET_BIND_SERVICE) in bounding, effective
 *    and permitted; none inheritable or ambient. sandbox-init's child drops them all.
 *  - namespaces: pid, network, ipc, uts, mount, cgroup (no user namespace: the program runs
 *    under its own host uid from the uid pool, as in the process backend). runsc must run
 *    with --network=none (loopback only): its default network mode takes the interfaces
 *    of a namespace given by path and refuses a new one
 *  - mounts: the image's top-level entries (bind, ro, nosuid, nodev), proc (nosuid, noexec,
 *    nodev), the bundle's boot_id at /proc/sys/kernel/random/boot_id, /dev tmpfs (nosuid,
 *    noexec, mode=755, size 64 KiB), for crun and runc a devpts of the run's own at /dev/pts
 *    (nosuid, noexec, newinstance, ptmxmode=0666, mode=0620, max=16; runsc mounts its own
 *    in the sandbox's kernel), /dev/shm, /tmp and /home/sandbox tmpfs with size and
 *    nr_inodes ($HOME owned by uid/gid, mode 0700), the inputs at /sandbox/<input_name>
 *    (ro, nosuid, nodev, noexec), the output dir at /sandbox/out (rw, nosuid, nodev,
 *    noexec), the source at /sandbox/<source_name> (ro, nosuid, nodev, noexec), the
 *    bundle's resolv.conf/hosts/hostname/passwd/group over /etc's, sandbox-init at
 *    /.sandbox-init (ro, nosuid, nodev); in that order. Nothing else: no /sys, no
 *    /dev/mqueue, no socket. Binds use "bind", never "rbind" (nothing mounted below a
 *    source on the host comes along). For runc the boot id is masked instead (maskedPaths:
 *    it reads as empty): runc refuses every bind below /proc but a few lxcfs files.
 *  - linux: cgroupsPath; resources.memory.limit, pids.limit, cpu quota/period (100 ms);
 *    devices: deny all (the runtime's default device set is added by the runtime);
 *    maskedPaths (/proc/kcore, keys, key-users, timer_list, sched_debug, sysrq-trigger,
 *    locks, kallsyms, config.gz, modules, cmdline, latency_stats, timer_stats, /proc/acpi,
 *    /proc/scsi); readonlyPaths (/proc/sys, bus, fs, irq, asound); seccomp (`seccomp_section`).
 */
result<nlohmann::json> make_config(const bundle_params& p, std::string* why = nullptr);

/**
 * The seccomp section, generated from the one table (wire/seccomp_policy.hpp): default allow,
 * and one rule per rule of the table that `seccomp_action_for` gives an action for this
 * runtime (`oci_stacked` for crun and runc, `oci_gvisor` for runsc), with the same argument
 * conditions — for crun/runc the errno rows (violation and egress rows are left to
 * sandbox-init's own filter, which the host hears through user notification; a stacked
 * filter's ERRNO would take precedence over it and hide the call from the host); for runsc
 * also the violation rows as EPERM, and not the ENOSYS rows (runsc answers every
 * SCMP_ACT_ERRNO with EPERM, and an EPERM from clone3 would make glibc's pthread_create fail
 * instead of falling back; runsc applies the section only when run with --oci-seccomp).
 * Architectures: x86-64, and for crun/runc also x86 and x32, so that those ABIs' calls pass
 * this filter and reach sandbox-init's, which reports them as violations. Each rule of the
 * table is one OCI rule (OCI ANDs a rule's `args`); for SCMP_CMP_MASKED_EQ, `value` is the
 * mask and `valueTwo` the datum. Unlike sandbox-init's filter, numbers above libseccomp's
 * table get no ENOSYS rule (OCI rules name calls).
 */
nlohmann::json seccomp_section(runtime_kind kind);

/**
 * Checks a config.json document against the closed set of host paths a bundle may use.
 * Mounts: every destination absolute, without "..", not "/"; a mount whose type is "bind"
 * or whose options contain "bind" must have a source equal to, or below, one of `allowed`
 * (compared component-wise after lexical normalization: "/a/b-evil" is not below "/a/b"),
 * and carry "nosuid" and "nodev"; a source that is relative or has ".." is refused, and on
 * the host (lstat, from the allowed path down to the source) no component may be a
 * symlink, and the source must exist and be a directory or regular file (not a socket,
 * FIFO or device); options "rbind", "suid", "dev", "shared", "rshared" are refused; every
 * other mount must be a tmpfs, the proc at /proc, or a devpts at /dev/pts with
 * "newinstance", "nosuid" and "noexec". Elsewhere: root.readonly true and
 * root.path a clean absolute ".../bundle/rootfs" (a directory, if it exists; which
 * workspace is the caller's to check); process present, terminal not true,
 * noNewPrivileges true, no capability outside the four above and none inheritable or
 * ambient; no "hooks"; no linux.sysctl, no linux.devices, no device allowed in
 * linux.resources.devices, no shared rootfsPropagation; linux.namespaces has pid, network,
 * ipc, uts and mount (network may be absent only with `runtime_network_namespace`: the
 * runtime runs in the run's own namespace), none with a `path` (joining an existing
 * namespace). `allowed` entries
 * that are relative or "/" allow nothing. Because sources are checked on the host, run it
 * on a written bundle (as `write_bundle` does). Returns an empty string when it holds, else
 * the first violation ("mounts[3].source /run/docker.sock is outside the allowed paths").
 */
std::string check_config(const nlohmann::json& config,
                         const std::vector<std::filesystem::path>& allowed,
                         bool runtime_network_namespace = false);

/**
 * Creates <ws>/bundle (mode 0711): the root skeleton, the bundle's files, and config.json
 * (mode 0600, from `make_config`), after `check_config` has passed the document with the
 * allowed set {image root, inputs, source, output dir, <ws>/bundle/files, init executable}.
 * Errors (with `*why`): `invalid_argument` (as make_config, or when check_config refuses
 * the document: e.g. the source or init executable is a symlink, a FIFO or missing),
 * `io_error` (a file system call failed, or <ws>/bundle already exists, which is left
 * alone); nothing is left behind on error. The caller mounts nothing; the inputs, source,
 * output dir and init executable must exist.
 */
result<bundle> write_bundle(const bundle_params& p, std::string* why = nullptr);

/// Removes a bundle directory made by `write_bundle` (`remove_tree`, after making the
/// skeleton's 0111 /sandbox readable again: without privileges a directory one cannot read
/// cannot be emptied). Best effort; never throws. The runtime must be done with it.
void remove_bundle(const std::filesystem::path& dir) noexcept;

}  // namespace sandbox::detail::oci
