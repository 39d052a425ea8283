// The start-up self-test's verdict cache (private to src/). A self-test proves that a level
// works on this host (a real sandbox: uid, capabilities, no_new_privs, seccomp, evidence); it
// need not be repeated by every process that starts the level. A pass is recorded in the
// level's state directory under a key naming everything it depended on — the host's boot,
// its kernel, this library's build, the cgroup layout, the run machine's options, the level's
// configuration and the files it runs (its binaries, the guest kernel) by content — and a
// later start that computes the same key reuses it. Any difference, a record that cannot be
// trusted (not a regular file of ours, writable by others, unreadable, malformed; in a
// directory that is not ours and 0700, or whose parent others may write) or a failed test
// means the test runs again; failures are never recorded. `sandboxctl doctor` always
// tests (docs/operations.md, "Start-up self-test").
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/// What a level's verdict depends on beyond what the run machine keys on itself: filled by
/// the level's factory (`make_oci_backend`, `make_microvm_backend`).
struct self_test_dependencies {
  /// Files the self-test ran or read, compared by content (SHA-256): the OCI runtime's
  /// binary, QEMU, mkfs.erofs, the guest kernel and initramfs. Absolute paths.
  std::vector<std::filesystem::path> files;
  /// The level's configuration as text ("runtime=runsc platform=ptrace", "accel=tcg ...").
  std::string config;
};

/// The key a verdict is recorded under. `parts` are compared as text, `files` by content.
struct self_test_key {
  /// Named parts, e.g. "boot_id", "host_kernel", "build", "level", "cgroups", "options".
  std::map<std::string, std::string> parts;
  /// Files compared by content (`self_test_dependencies::files`).
  std::vector<std::filesystem::path> files;
};

/**
 * The key parts every level shares, for this process now: "boot_id"
 * (/proc/sys/kernel/random/boot_id: a new boot is a new host), "host_kernel" (uname's
 * release and version) and "build" (this library's build: the GNU build id of the binary it
 * is linked into, from its program headers, else that file's SHA-256). A part that cannot be
 * read is "unknown:<why>", which no record holds, so the test runs. Throws only
 * `std::bad_alloc`.
 */
std::map<std::string, std::string> host_key_parts();

/// What `self_test_cache::lookup` found: `reusable`, or why not (one line for the host log,
/// e.g. "no record", "the host rebooted (boot_id)", "/usr/bin/crun changed", "record not
/// trusted: writable by group or others").
struct self_test_lookup {
  bool reusable = false;
  std::string why_not;
  std::string recorded_at;  ///< when the reused pass was recorded (UTC, ISO 8601)
};

/// The records of one level, in `dir` (`<state dir>/selftest`, created 0700 on first record;
/// trusted only while it is the owner's, 0700, and in a directory of the owner's or root's
/// that no one else may write).
/// One record per level, `<level>.json`; each process reads it at start and writes it after
/// a pass (a new file renamed over it: a reader sees the old or the new one whole).
class self_test_cache {
 public:
  /// `dir` and the level's name ("process", "crun", "runsc", "microvm"). `owner`: the uid
  /// the directory and the record must belong to (the effective uid).
  self_test_cache(std::filesystem::path dir, std::string level, uid_t owner);

  /// Whether a trusted record of a pass under exactly `key` exists (`why_not` says why not:
  /// "no record", "record not trusted: ...", "record unreadable", "record malformed", or
  /// the key part or file that differs). Files whose size, inode
  /// and times are as recorded are not read again; others are hashed and compared by
  /// content. Never throws but `std::bad_alloc`.
  self_test_lookup lookup(const self_test_key& key) const;

  /// Records a pass under `key` (hashing its files). False, with `*why`, when the directory
  /// cannot be made or trusted or the record cannot be written; the next start then tests
  /// again. Never throws but `std::bad_alloc`.
  bool record_pass(const self_test_key& key, std::string* why) const;

  /// The record's path.
  std::filesystem::path path() const { return dir_ / (level_ + ".json"); }

 private:
  /// Opens `dir_` (made 0700 first when `create`) into `*out`, or says why it cannot be
  /// trusted: its parent must belong to the owner or root and be writable by no one else,
  /// and `dir_` itself must be a directory (not a link) of the owner's, mode 0700.
  std::optional<std::string> open_trusted_dir(bool create, unique_fd* out) const;
  std::filesystem::path dir_;
  std::string level_;
  uid_t owner_;
};

}  // namespace sandbox::detail
