// Content-addressed blob store. Files move in and out of the sandbox only as blob ids
// (`sha256:` + 64 lowercase hex of the content); a request can never name a host path.
//
// Blobs belong to a tenant. A tenant can neither read another tenant's blob nor learn that
// it exists: a missing blob and another tenant's blob both answer `errc::not_found`.
//
// Retention: the store never deletes on its own. A blob stays until `remove()` (or
// `sandboxctl blob rm`) deletes it; each tenant has a byte quota (`errc::quota_exceeded`).
// See docs/operations.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/error.hpp"
#include "sandbox/span.hpp"

namespace sandbox {

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
  virtual result<std::string> put_fd(std::string_view tenant, int fd,
                                     std::uint64_t max_bytes) = 0;

  /// The blob's content. Errors: `invalid_argument` (bad id or tenant syntax), `not_found`
  /// (absent for this tenant), `digest_mismatch` (the stored bytes no longer hash to the id),
  /// `io_error`.
  virtual result<std::string> get(std::string_view tenant, std::string_view id) const = 0;

  /// Writes the blob's content to a new file `name` in directory `dirfd` (created with
  /// `O_EXCL`, mode 0444, never following links), verifying the digest while copying;
  /// returns the byte count. Errors as `get`, plus `already_exists`.
  virtual result<std::uint64_t> copy_to(std::string_view tenant, std::string_view id,
                                        int dirfd, const std::string& name) const = 0;

  /// Size of the blob in bytes. Errors as `get` (without `digest_mismatch`).
  virtual result<std::uint64_t> size(std::string_view tenant, std::string_view id) const = 0;

  /// Deletes the blob for `tenant`. Errors: `invalid_argument`, `not_found`, `io_error`.
  virtual result<void> remove(std::string_view tenant, std::string_view id) = 0;

  /// Ids of the tenant's blobs (unordered).
  virtual result<std::vector<std::string>> list(std::string_view tenant) const = 0;

  /// Bytes the tenant's blobs occupy (the figure the quota applies to).
  virtual result<std::uint64_t> usage(std::string_view tenant) const = 0;
};

/// Options of the filesystem store.
struct fs_blob_store_options {
  std::filesystem::path root;                        ///< created (mode 0700) if absent
  std::uint64_t quota_bytes_per_tenant = 1ULL << 30; ///< default 1 GiB
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
