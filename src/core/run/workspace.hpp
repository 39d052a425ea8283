// Host-side per-run directories (private to src/; shared by every backend).
//
//   <runs dir>/<run id>/in/        the input files, copied from the blob store, mode 0444
//                                  (the directory 0555); bound read-only into the sandbox
//   <runs dir>/<run id>/<source>   the program text, mode 0444
//   <runs dir>/<run id>/root/      empty mount point where sandbox-init assembles the new
//                                  root inside the run's own mount namespace (nothing is
//                                  ever mounted here in the host's namespace)
// The sandbox never gets write access to any of these, and the host removes them after the run
// (or at the next start, after a crash).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/blob_store.hpp"
#include "sandbox/error.hpp"
#include "sandbox/protocol.hpp"

namespace sandbox::detail {

struct run_workspace {
  std::filesystem::path dir;
  std::filesystem::path inputs;
  std::filesystem::path source;
  std::filesystem::path staging;
};

/**
 * Creates the skeleton of run `run_id`'s workspace under `runs_dir` (created, mode 0700, if
 * needed): an empty `in/`, the staging mount point `root/`, and an empty source file. The
 * sandbox binds `in/` and the source file before it starts; `stage_workspace` fills them
 * later (in place, so the binds see the content). Errors: the OS error of the call that failed
 * (`system_category`: `ENOSPC` on a full state disk, `ENOTDIR`, …); nothing is left behind.
 */
result<run_workspace> create_workspace(const std::filesystem::path& runs_dir,
                                       const std::string& run_id, const std::string& source_name);

/**
 * Writes the program text into the workspace's source file (same inode), copies the input
 * files from the blob store into `in/` (a blob named twice is copied once and hard-linked),
 * then makes both read-only. Errors: `not_found` with `*missing_blob` set to the index in
 * `files_in` (a blob vanished after admission), `digest_mismatch` with `*missing_blob` set
 * likewise (a stored blob is corrupt), otherwise the OS error of the call that failed
 * (`system_category`, e.g. `ENOSPC`) or the blob store's own error.
 */
result<void> stage_workspace(const run_workspace& ws, std::string_view source,
                             const std::vector<input_file>& files_in, const blob_store& blobs,
                             std::string_view tenant, std::size_t* missing_blob);

/**
 * Adds input files to the `in/` of a live session's workspace (the sandbox's read-only bind
 * of it sees them at once), copied from the blob store like `stage_workspace`'s, then makes
 * the directory read-only again. All or nothing: on an error the files this call added are
 * removed. Errors, with `*failed` set to the index in `files`: `not_found` (not the tenant's
 * blob), `digest_mismatch`, `already_exists` (a file of that name is there); `io_error`.
 */
result<void> add_inputs(const run_workspace& ws, const std::vector<input_file>& files,
                        const blob_store& blobs, std::string_view tenant, std::size_t* failed);

/// Removes `path` and everything below it without following symlinks or crossing into other
/// filesystems. Best effort; never throws.
void remove_tree(const std::filesystem::path& path) noexcept;

}  // namespace sandbox::detail
