// Private: what the blob stores share for garbage collection (src/store/blob_retention.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sandbox/blob_store.hpp"

namespace sandbox::detail {

/// One blob of a tenant as a collection sees it.
struct gc_candidate {
  std::string hex;  ///< 64 hex digits
  std::uint64_t bytes = 0;
  std::chrono::system_clock::time_point stored_at;  ///< last put (fs: the file's mtime)
  bool pinned = false;
};

/// Indices into `blobs` of what to remove under `options` at `now` (oldest first), counting
/// what is kept, and why, into `report`. Pure: the stores call it under their tenant lock.
std::vector<std::size_t> select_garbage(std::vector<gc_candidate>& blobs, const gc_options& options,
                                        std::chrono::system_clock::time_point now,
                                        gc_report& report);

}  // namespace sandbox::detail
