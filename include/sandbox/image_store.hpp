// Runtime images, pinned by manifest digest.
//
// A runtime image is an OCI image layout (image-spec v1.1: `oci-layout`, `index.json`,
// `blobs/sha256/…`; index → manifest → config + layers) identified by the sha256 digest of
// its manifest. The store keeps one layout holding every image, names the *current* image of
// each runtime, keeps earlier images until they are removed (rollback), verifies every blob's
// digest before use, and unpacks each image once into a read-only cache keyed by digest.
// Builds are not reproducible, so no digest is ever hard-coded: the store records it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/error.hpp"
#include "sandbox/span.hpp"

namespace sandbox {

/// One image in the store.
struct image_info {
  std::string name;              ///< runtime name it serves, e.g. "python3"
  std::string digest;            ///< manifest digest, `sha256:…`
  bool current = false;          ///< the image runs for `name` now
  std::uint64_t size_bytes = 0;  ///< sum of the layer sizes
  std::string created;           ///< RFC 3339 time the image was built or imported
  bool operator==(const image_info&) const = default;
};

/// The image store at one directory. Thread-safe; several processes may share the
/// directory (writers take a lock file; the unpack cache is filled by atomic rename).
class image_store {
 public:
  virtual ~image_store() = default;

  /// Every image, current and earlier ones.
  virtual result<std::vector<image_info>> list() const = 0;

  /// Manifest digest of the current image for runtime `name`; `not_found` when none.
  virtual result<std::string> current_digest(std::string_view name) const = 0;

  /**
   * The unpacked root filesystem of image `digest`, unpacking it first if needed: every blob
   * is hashed and compared with its digest, layers are applied in order (OCI whiteouts
   * honoured, no entry may escape the root), and the result is renamed into the cache.
   * The caller mounts it read-only. Errors: `invalid_argument` (malformed digest),
   * `not_found`, `digest_mismatch`, `corrupt`, `io_error`, `permission_denied` (a read-only
   * store that lacks the unpacked image).
   */
  virtual result<std::filesystem::path> rootfs(std::string_view digest) = 0;

  /// Hashes every blob of image `digest` against its name. Errors: `not_found`,
  /// `digest_mismatch`, `corrupt`.
  virtual result<void> verify(std::string_view digest) const = 0;

  /**
   * Copies the images of the OCI layout at `layout_dir` (all manifests in its index.json, or
   * only those whose `org.opencontainers.image.ref.name` annotation is `ref` when given)
   * into the store as runtime `name`, verifying every blob, and makes the last one current.
   * Returns its manifest digest. Errors: `corrupt`, `digest_mismatch`, `io_error`,
   * `invalid_argument` (bad runtime name), `not_found` (no such directory, or no manifest
   * matches `ref`), `permission_denied` (read-only store).
   */
  virtual result<std::string> import_layout(const std::filesystem::path& layout_dir,
                                            std::string_view name, std::string_view ref = {}) = 0;

  /// Makes `digest` (already in the store) the current image of runtime `name` (rollback).
  /// Errors: `not_found` (no image `digest` for `name`), `invalid_argument`,
  /// `permission_denied` (read-only store), `io_error`.
  virtual result<void> set_current(std::string_view name, std::string_view digest) = 0;

  /// Removes image `digest` and its unpacked cache (blobs shared with other images stay).
  /// A current image, or one a sandbox is using (a run or a warm-pool instance, in any
  /// process: they hold a shared `flock` on its unpacked root), cannot be removed (`busy`).
  /// Errors also: `not_found`,
  /// `invalid_argument`, `permission_denied` (read-only store), `io_error`.
  virtual result<void> remove(std::string_view digest) = 0;
};

/// Options of the filesystem image store.
struct image_store_options {
  std::filesystem::path root;  ///< holds `layout/` and `rootfs/`; created if absent
  /// Open without writing: `rootfs()` then only serves images already unpacked (an
  /// unprivileged host sharing a store root prepared by root).
  bool read_only = false;
  log_sink log;  ///< host log lines (syscalls, tools); empty: warnings and errors to stderr
  /// What one image may unpack to, all layers together (a small compressed layer can expand
  /// a thousandfold): file bytes and tar entries. Past either, unpacking (and so the import)
  /// fails with `corrupt` before writing more.
  std::uint64_t max_unpacked_bytes = 16ULL << 30;
  std::uint64_t max_unpacked_entries = 2'000'000;
};

/// Opens (creating if needed and not read-only) the store at `options.root`.
/// Errors: `invalid_argument` (relative root), `corrupt` (bad index.json), `io_error`,
/// `permission_denied`, `not_found` (read-only and the root does not exist).
result<std::shared_ptr<image_store>> open_image_store(const image_store_options& options);

/// Where a running `build_debian_image` is, for a progress display.
struct image_build_progress {
  /// The step: "debootstrap: retrieving", "debootstrap: validating", "debootstrap:
  /// extracting", "debootstrap: unpacking", "debootstrap: configuring", "apt-get: downloading",
  /// "apt-get: unpacking", "apt-get: setting up", "npm install", "packing", "storing".
  std::string_view phase;
  std::size_t done = 0;   ///< packages this step has handled so far (0: not counted)
  std::size_t total = 0;  ///< packages the step will handle, when known; else 0
  std::string_view item;  ///< the package in hand, or ""
};

/// What to build with `build_debian_image`.
struct debian_image_spec {
  std::string name;                   ///< runtime name, e.g. "python3"
  std::vector<std::string> packages;  ///< Debian packages on top of minbase, e.g. {"python3"}
  /// npm packages pinned to exact versions (`name@1.2.3`, `@scope/name@1.2.3`), installed
  /// by the host's `npm` with scripts disabled into a staging prefix, checked against the
  /// lock's integrity hashes, and copied to `/opt/npm` (`/opt/npm/node_modules/…`) of the
  /// image. Empty: none.
  std::vector<std::string> npm_packages;
  std::string suite = "bookworm";
  std::string mirror;              ///< empty: the first Debian mirror in the host's apt sources
  std::filesystem::path work_dir;  ///< scratch space; empty: a temp dir beside the store
  log_sink log;  ///< debootstrap/tar output and failures; empty: warnings and errors to stderr
  /// Called (on the building thread) as the build moves on: each package debootstrap and
  /// apt-get report, each step. Read from the tools' own output, so only for display. Empty:
  /// none. An exception from it stops the progress reports, not the build.
  std::function<void(const image_build_progress&)> progress;
};

/**
 * Builds a runtime image from Debian packages with `debootstrap --variant=minbase` and then
 * `apt-get install --no-install-recommends` of `spec.packages` inside the tree (needs root,
 * the `debootstrap` package and chroot), scrubs host files debootstrap copies in
 * (`/etc/resolv.conf`, `/etc/hostname`), drops apt caches, packs the tree as one layer, adds
 * it to `store` and makes it current. Returns the manifest digest. Errors: `unsupported`
 * (no debootstrap or chroot), `permission_denied` (not root), `io_error` (the build failed; the log
 * is in host logs), `invalid_argument` (a name, package, suite or mirror that is not well-formed,
 * or an npm package not pinned to an exact version), `digest_mismatch` (an npm package without a
 * registry integrity hash in the lock).
 */
result<std::string> build_debian_image(image_store& store, const debian_image_spec& spec);

}  // namespace sandbox
