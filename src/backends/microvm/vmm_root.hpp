// The VMM's file system (private to src/), like Firecracker's jailer: QEMU starts in a root
// of its own that holds only what it loads — its executable, exactly the shared libraries
// the dynamic loader resolves for it, the TCG accelerator module, the microvm firmware —
// plus empty mount points for /dev/null, /dev/kvm and a procfs of its own pid namespace.
// No other host path is visible to the VMM. The root is prepared once per VMM build under
// the state directory and bind-mounted read-only by every run (spawn.hpp `root_switch`).
#pragma once

#include <filesystem>
#include <string>
#include <variant>
#include <vector>

namespace sandbox::detail {

/// A prepared VMM root.
struct vmm_root {
  /// Host path of the root directory (read-only for everyone but root; never changed once
  /// made: a new VMM build gets a new directory).
  std::filesystem::path dir;
  /// The VMM's executable inside the root (its host path, e.g. "/usr/bin/qemu-system-x86_64").
  std::string exec_path;
  /// Every path inside the root (files, links, directories), sorted; for logs and tests.
  std::vector<std::string> entries;
};

/**
 * Prepares (or reuses) the root of the VMM `binary` at `<state>/vmm-root/<key>/root`, where
 * the key hashes the path, size, mtime and inode of every file it copies (a package upgrade
 * gives a new directory; the old one is left for VMMs still running from it). Safe to call
 * from many threads and processes at once: `<key>/` is built under a unique temporary name,
 * its `manifest` (beside `root/`: every entry, with each file's size and mode) written last,
 * then published atomically (store/publish.hpp `publish_dir_at`); an existing one is used
 * only if its root's tree matches its manifest, else rebuilt and exchanged.
 * Hard-linked (same file system, root-owned, no set-id bit) or else copied, with every
 * symbolic link on their host paths recreated: the executable; its ELF
 * interpreter and each library `<interpreter> --list` resolves for it and for the TCG
 * accelerator module (`<prefix>/lib/<dir>/qemu/accel-tcg-x86_64.so` when present); the
 * firmware `<prefix>/share/qemu/bios-microvm.bin`. Made empty: /dev/null, /dev/kvm (bind
 * targets) and /proc. Modes: directories 0755, files their host mode without set-id bits.
 * Returns the root or a one-line reason (a library the loader did not find, a file that
 * cannot be copied, an executable that is not a 64-bit ELF with an interpreter).
 */
std::variant<vmm_root, std::string> prepare_vmm_root(const std::filesystem::path& state,
                                                     const std::filesystem::path& binary);

/// The libraries of `--list` output (`<interpreter> --list <elf>`): each resolved path, in
/// order; the vDSO is skipped. Sets `*missing` to the first library "not found" (then the
/// list is incomplete). Exposed for unit tests.
std::vector<std::string> parse_loader_list(const std::string& text, std::string* missing);

}  // namespace sandbox::detail
