// Publishing into shared state (private to src/): the one way a backend installs a file or a
// directory that other threads, other runtimes and other processes on the host use at the
// same time (the OCI levels' sandbox-init copy; the microvm level's VMM root, initramfs and
// image disks).
//
// The rules, which every helper here keeps:
//  1. Written under a unique temporary name (`.tmp-<random>`, O_EXCL, flock'ed by its writer
//     so `remove_stale_temps` leaves it alone), never under a fixed or per-pid name that two
//     writers could share.
//  2. fsync'd before it is published, so a crash leaves either the old entry or the whole new
//     one, never a partial one under the real name.
//  3. Published atomically: renameat2(RENAME_NOREPLACE) (or linkat) when the name is free; an
//     entry already in place is replaced only after it failed verification, by one repairer at
//     a time (the exclusive flock of `.publish.lock` in the same directory), which looks at
//     the entry again under that lock and its own exclusive lock (so no cleanup removes it
//     meanwhile) and replaces it only if it is still there and still wrong. So a good copy,
//     once published, is never replaced or removed while someone holds it.
//  4. Verified before use: size and SHA-256 (files) or the caller's check (directories)
//     against what was meant to be installed; a wrong entry is replaced, never used.
//  5. A holder of a published file (`publish_options::hold`) keeps a shared flock on it for as
//     long as it may use the file by name; `remove_unheld_at` removes only entries it can lock
//     exclusively (no holder), re-checked against the name, so a cleanup never removes a copy a
//     live user may still exec or open.
//
// Errors are system error codes (errno), as in store_io.hpp: EINVAL (a name that is not a
// plain file name, or one of ours: `.tmp-*`, `.publish.lock`), ENOENT, EBADMSG (an entry or a
// written copy that is not what was meant), EISDIR (a directory where a file belongs), EAGAIN
// (the entry kept changing under us), and the errno of a failed syscall.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "sandbox/error.hpp"
#include "store/store_io.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/// What a published file must hold: the SHA-256 of its bytes (64 lowercase hex digits) and
/// their count.
struct file_digest {
  std::string sha256;
  std::uint64_t size = 0;
  bool operator==(const file_digest&) const = default;
};

/// The digest of `bytes` (`sha256` empty only if OpenSSL failed, which matches no file).
file_digest digest_of(std::string_view bytes) noexcept;

/// Fills a fresh, empty temporary file: `fd` is open read-write on it, `name` is its name in
/// the publishing directory (for a tool that writes by path, which must write that same file,
/// not replace it). Returns an errno-style error on failure.
using publish_fill = std::function<result<void>(int fd, const std::string& name)>;

/// How `publish_file_at` leaves the file.
struct publish_options {
  /// Permission bits of the published file; an entry whose bits differ is not used.
  mode_t mode = 0444;
  /// Return the descriptor holding a shared flock: while it is open, `remove_unheld_at` never
  /// removes the file and a verified file is never replaced, so the caller may keep using it
  /// *by name* (a bind-mount source, a path given to a tool) for as long as it keeps the fd.
  bool hold = false;
};

/**
 * Opens regular file `name` under `dirfd` read-only (never following a link, never blocking
 * on a FIFO) and checks it: owned by our effective uid, permission bits `mode`, size and
 * SHA-256 equal to `want`. Returns the descriptor, positioned at 0.
 *
 * Errors: ENOENT when absent; EBADMSG when something else is there (not a regular file, a
 * symlink, another owner or mode, other bytes); the errno of a failed open/fstat/read.
 */
result<unique_fd> open_verified_at(int dirfd, const std::string& name, const file_digest& want,
                                   mode_t mode) noexcept;

/**
 * Writes a new copy of `name` under `dirfd` and publishes it: a `.tmp-<random>` file filled
 * by `fill`, fsync'd, chmod `mode`, hashed (and, with `want`, compared: EBADMSG on a
 * difference, nothing published), then linked in place — with `replace`, renamed over
 * whatever is there; without, only if the name is free (EEXIST otherwise, the copy removed).
 * The directory is fsync'd. Returns the digest of what was published. The temporary file is
 * removed on every failure. The caller's locking decides whether replacing is safe
 * (`publish_file_at` does it right).
 */
result<file_digest> install_file_at(int dirfd, const std::string& name, mode_t mode,
                                    const publish_fill& fill, const file_digest* want,
                                    bool replace) noexcept;

/**
 * Makes sure `name` under `dirfd` is a verified copy of `want` and opens it. Safe to call
 * from any number of threads and processes at once for the same name: every call returns a
 * complete, verified file, and they end up sharing one.
 *
 *  1. An entry that verifies (`open_verified_at`) is used as it is.
 *  2. None there: a copy is written by `fill` (install_file_at) and published only if the
 *     name is still free; when another publisher won, its copy is verified instead.
 *  3. A wrong entry (truncated, corrupted, wrong mode or owner, a symlink): replaced by a
 *     fresh copy, under the directory's repair lock and the entry's own exclusive lock, and
 *     only if it is still there and still wrong; concurrent repairers then find the new copy
 *     and verify it. A holder of the wrong entry delays its repair by at most 2 s.
 *
 * With `opts.hold`, the shared lock is taken before verifying and the name is re-checked
 * against the locked file (a cleanup may have removed it in between: then it starts over).
 *
 * Example:
 *
 *   auto fd = publish_file_at(dir, "sandbox-init-" + d.sha256.substr(0, 16), d, fill,
 *                             {.mode = 0555, .hold = true});
 *
 * Errors: those of `install_file_at`; EISDIR when `name` is a directory; EBADMSG when `fill`
 * writes other bytes than `want`; EAGAIN when the entry kept changing after 16 tries.
 */
result<unique_fd> publish_file_at(int dirfd, const std::string& name, const file_digest& want,
                                  const publish_fill& fill, const publish_options& opts) noexcept;

/// `publish_file_at` of the bytes `data` (their digest is computed here).
result<unique_fd> publish_file_at(int dirfd, const std::string& name, std::string_view data,
                                  const publish_options& opts) noexcept;

/**
 * Removes the regular files under `dirfd` whose names `is_candidate` accepts, other than
 * `keep`, that nobody holds: each is locked exclusively without waiting (a holder's shared
 * lock makes it skipped) and unlinked only while the name still refers to the locked file.
 * Returns how many were removed; failures are logged, never returned.
 */
std::size_t remove_unheld_at(int dirfd, const std::function<bool(std::string_view)>& is_candidate,
                             const std::string& keep, const store_logger& log) noexcept;

/// Builds a fresh directory: `dirfd` is open on it (empty, mode 0700), `name` is its name in
/// the publishing directory. Returns an errno-style error on failure.
using publish_build = std::function<result<void>(int dirfd, const std::string& name)>;

/// Checks a directory (open at `dirfd`): true when it is complete and what was meant.
using publish_check = std::function<bool(int dirfd)>;

/**
 * Makes sure `name` under `dirfd` is a directory that passes `check`, and opens it. Safe to
 * call from any number of threads and processes at once, like `publish_file_at`:
 *
 *  1. A directory that passes `check` is used as it is.
 *  2. Otherwise a fresh `.tmp-<random>` directory is built by `build`, fsync'd, must pass
 *     `check` itself (EBADMSG otherwise), then renamed in place: with RENAME_NOREPLACE when
 *     the name was free (another publisher that won is checked and used instead, ours
 *     removed), or, under the directory's repair lock and only if what is there still fails
 *     `check`, exchanged with the wrong entry, which is then removed.
 *
 * `mode` is set on the new directory before it is published. Returns the directory, open
 * (O_DIRECTORY|O_NOFOLLOW). Errors: those of `build`; EBADMSG; EAGAIN after 16 tries; the
 * errno of a failed syscall.
 */
result<unique_fd> publish_dir_at(int dirfd, const std::string& name, mode_t mode,
                                 const publish_build& build, const publish_check& check) noexcept;

}  // namespace sandbox::detail
