// Output collection: turns what a run left in its output directory into blobs, without ever
// following a link, opening a FIFO or device, or reading more than the caps (private to src/).
//
// Called only after every process of the run is dead, on a directory descriptor the host
// holds (the run's output tmpfs). Only top-level regular files are returned; everything else
// is listed in `dropped` with a reason. Entries are visited in byte order of their names, so
// the outcome is deterministic.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "sandbox/blob_store.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/span.hpp"

namespace sandbox::detail {

struct collect_limits {
  std::uint32_t max_files = 16;            ///< files returned at most
  std::uint64_t max_bytes = 8ULL << 20;    ///< total bytes returned at most
  std::uint32_t max_scan_entries = 65536;  ///< directory entries looked at, at most
};

struct collected_outputs {
  std::vector<output_file> files;
  std::vector<dropped_file> dropped;
  /// Entries past `max_scan_entries` (not even listed). Counted up to 2^20 more entries,
  /// then a lower bound (logged).
  std::uint32_t unscanned = 0;
};

/**
 * Collects regular files from the directory open at `dirfd` into `store` for `tenant`.
 * For each entry, in name order:
 *  - a name that is not valid UTF-8 or contains a control character → `bad_name` (with an
 *    escaped display form);
 *  - anything but a regular file (symlink, directory, FIFO, socket, device) → not opened,
 *    `not_regular_file`;
 *  - a regular file: opened with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 *    RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) and O_NOFOLLOW | O_NONBLOCK (fallback on
 *    kernels without openat2: openat with O_NOFOLLOW), its type and size checked with fstat on
 *    the opened descriptor (a file swapped for a FIFO after the scan is dropped, not read);
 *    past `max_files` → `count_limit`; past `max_bytes` in total → `bytes_limit` (a later,
 *    smaller file may still fit); the tenant's store quota → `quota_exceeded`; any other
 *    store failure (a full disk, an I/O error) → `store_error`.
 * When there are more than `max_scan_entries` entries, the ones visited are those with the
 * smallest names (deterministic whatever the directory's own order).
 * Permissions the program set do not matter: the owner's read and search permission on the
 * directory, and read permission on a regular file that could not be opened for it, are given
 * back first (the program owns them; an unprivileged host reads them as that owner).
 * Host errors are logged to `log` and the entry dropped (listed as `not_regular_file` when it
 * could not be opened or read as one, `quota_exceeded` / `store_error` when the store refused
 * it; an entry
 * that vanished since the scan is not listed); this never throws (std::bad_alloc ends the
 * collection early, keeping what was stored) and never blocks on a sandbox-controlled
 * object. `dirfd` is not modified (a descriptor of its own is opened for the scan). Memory:
 * one file at a time (at most `max_bytes`) plus up to `max_scan_entries` names.
 */
collected_outputs collect_outputs(int dirfd, const collect_limits& limits, blob_store& store,
                                  std::string_view tenant, const log_sink& log);

}  // namespace sandbox::detail
