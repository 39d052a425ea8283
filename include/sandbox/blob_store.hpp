// Content-addressed blob store. Files move in and out of the sandbox only as blob ids
// (`sha256:` + 64 lowercase hex of the content); a request can never name a host path.
//
// Blobs belong to a tenant. A tenant can neither read another tenant's blob nor learn that
// it exists: a missing blob and another tenant's blob both answer `errc::not_found`.
//
// Retention: the store never deletes on its own. A blob stays until `remove()` (or
// `sandboxctl blob rm`) deletes it, or `collect_garbage` (`sandboxctl blob gc`) finds it
// unpinned and older than the grace period. Pins (`pin`, held by named holders such as a run
// record, sandbox/record.hpp) keep a blob through collection. Each tenant has a byte quota
// (`errc::quota_exceeded`). See docs/operations.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/error.hpp"
#include "sandbox/span.hpp"

namespace sandbox {

/// True for a pin holder name: 1..128 characters of `[A-Za-z0-9._:-]`, starting with a letter
/// or digit (a run record's id is one).
bool is_valid_pin_holder(std::string_view holder) noexcept;

/// What `blob_store::collect_garbage` may remove.
struct gc_options {
  /// Grace period: a blob stored (or stored again) less than this long ago is kept even when
  /// nothing pins it, so a run's fresh outputs survive until its record pins them. Default
  /// one hour; zero collects every unpinned blob.
  std::chrono::seconds older_than{3600};
  /// Optional size policy: per tenant, stop removing once its usage is at most this many
  /// bytes (oldest eligible blobs go first). Unset: remove every eligible blob.
  std::optional<std::uint64_t> target_tenant_bytes;
  /// Tenants to collect; empty: every tenant of the store.
  std::vector<std::string> tenants;
  /// Report what would be removed without removing anything.
  bool dry_run = false;
};

/// One blob `collect_garbage` removed (or would remove, for a dry run).
struct gc_entry {
  std::string tenant;
  std::string blob;
  std::uint64_t bytes = 0;
  bool operator==(const gc_entry&) const = default;
};

/// What one collection did.
struct gc_report {
  std::vector<gc_entry> removed;    ///< removed (dry run: would be removed), oldest first
  std::uint64_t bytes_removed = 0;  ///< sum of `removed[i].bytes`
  std::uint64_t kept_pinned = 0;    ///< blobs kept because a holder pins them
  std::uint64_t kept_recent = 0;    ///< unpinned blobs kept by the grace period
  std::uint64_t kept_by_size = 0;   ///< eligible blobs kept by `target_tenant_bytes`
};

/// A tenant's blob store. Implementations are thread-safe; the filesystem store is also safe
/// for several processes sharing one directory.
class blob_store {
 public:
  virtual ~blob_store() = default;

  /// Stores `bytes` for `tenant` and returns its id. Storing the same content twice is a
  /// no-op returning the same id. Errors: `invalid_argument` (bad tenant name),
  /// `quota_exceeded`, `io_error`.
  virtual result<std::string> put(std::string_view tenant, std::string_view bytes) = 0;

  /// Stores everything readable from `fd` (read to EOF) for `tenant`. More than `max_bytes`
  /// → `too_large` and nothing is stored. Same other errors as `put`.
  virtual result<std::string> put_fd(std::string_view tenant, int fd, std::uint64_t max_bytes) = 0;

  /// The blob's content. Errors: `invalid_argument` (bad id or tenant syntax), `not_found`
  /// (absent for this tenant), `digest_mismatch` (the stored bytes no longer hash to the id),
  /// `io_error`.
  virtual result<std::string> get(std::string_view tenant, std::string_view id) const = 0;

  /// Writes the blob's content to a new file `name` in directory `dirfd` (created with
  /// `O_EXCL`, mode 0444, never following links), verifying the digest while copying;
  /// returns the byte count. Errors as `get`, plus `already_exists`.
  virtual result<std::uint64_t> copy_to(std::string_view tenant, std::string_view id, int dirfd,
                                        const std::string& name) const = 0;

  /// Size of the blob in bytes. Errors as `get` (without `digest_mismatch`).
  virtual result<std::uint64_t> size(std::string_view tenant, std::string_view id) const = 0;

  /// Deletes the blob for `tenant`. Errors: `invalid_argument`, `not_found`, `io_error`.
  virtual result<void> remove(std::string_view tenant, std::string_view id) = 0;

  /// Ids of the tenant's blobs (unordered).
  virtual result<std::vector<std::string>> list(std::string_view tenant) const = 0;

  /// Bytes the tenant's blobs occupy (the figure the quota applies to).
  virtual result<std::uint64_t> usage(std::string_view tenant) const = 0;

  /// Pins the tenant's blob `id` for `holder` (e.g. a run record's id): `collect_garbage`
  /// keeps a blob while any holder pins it (`remove` still deletes it). Idempotent. Atomic
  /// against a concurrent collection: once this returns, the blob is kept. Errors:
  /// `invalid_argument` (tenant, id or holder syntax), `not_found` (no such blob for the
  /// tenant), `io_error`; `unsupported` from stores without pins (the default).
  virtual result<void> pin(std::string_view tenant, std::string_view id, std::string_view holder);

  /// Removes `holder`'s pin of the blob (absent pin: a no-op). Errors: `invalid_argument`,
  /// `io_error`, `unsupported` (the default).
  virtual result<void> unpin(std::string_view tenant, std::string_view id, std::string_view holder);

  /// The holders pinning the tenant's blob `id`, sorted (empty when none). Errors:
  /// `invalid_argument`, `io_error`, `unsupported` (the default).
  virtual result<std::vector<std::string>> pins(std::string_view tenant, std::string_view id) const;

  /**
   * Removes every blob that no holder pins and that was last stored longer ago than
   * `options.older_than` (and, with `target_tenant_bytes`, only while the tenant is over
   * it). Safe against concurrent writers: a tenant's collection holds the tenant's store
   * lock, which `put`, `put_fd` and `pin` also take, and `put` of content already stored
   * refreshes its time under that lock, so an id `put` returned is never collected within
   * the grace period. Errors: `invalid_argument` (a tenant name), `io_error`,
   * `unsupported` (the default, for stores without collection).
   */
  virtual result<gc_report> collect_garbage(const gc_options& options);

  /// Tenants that have a blob directory or map entry in this store, sorted. Errors:
  /// `io_error`, `unsupported` (the default).
  virtual result<std::vector<std::string>> tenants() const;
};

/// Options of the filesystem store.
struct fs_blob_store_options {
  std::filesystem::path root;                         ///< created (mode 0700) if absent
  std::uint64_t quota_bytes_per_tenant = 1ULL << 30;  ///< default 1 GiB
  log_sink log;  ///< host log lines (syscall failures); empty: warnings and errors to stderr
};

/// Opens (creating if needed) a filesystem store at `options.root`. Layout:
/// `<root>/tenants/<tenant>/<64 hex>`; writes go to a temp file in the same directory and are
/// renamed into place, so readers never see partial blobs; no path component is followed if
/// it is a symlink. Errors: `invalid_argument` (relative root), `io_error`,
/// `permission_denied`.
result<std::shared_ptr<blob_store>> open_fs_blob_store(const fs_blob_store_options& options);

/// An in-memory store (tests, the fake backend, short-lived hosts). Thread-safe.
std::shared_ptr<blob_store> make_memory_blob_store(std::uint64_t quota_bytes_per_tenant = 1ULL
                                                                                          << 30);

/// `sha256:` + hex digest of `bytes` (OpenSSL libcrypto).
std::string blob_id_of(std::string_view bytes);

}  // namespace sandbox
