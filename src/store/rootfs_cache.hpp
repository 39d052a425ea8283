// The image store's rootfs cache (private to src/): each image unpacked once, keyed by its
// manifest digest.
//
//   <root>/rootfs/<hex>/              unpacked image
//   <root>/rootfs/.tmp-<hex>-<rand>/  an unpack in progress (flock'ed by its writer)
//
// An unpack applies every layer of a verified manifest (store/layer_apply.hpp) into a temp
// directory, checks each layer's diff_id, then renames it into place under the store's shared
// lock, so a concurrent remove() either ran before or waits. Sandboxes using an unpacked root
// hold a shared flock on it; remove() takes it exclusively.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "sandbox/error.hpp"
#include "store/image_layout.hpp"
#include "store/layer_apply.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/**
 * The rootfs cache of one image store. Works on the store's `image_layout` (which must outlive
 * it) for verified blobs, the store lock, index.json and error logging.
 *
 * Thread-safety: `unpack_once` may be called concurrently (one unpack per image in this
 * process; other processes race through the final rename); `set_limits` only before use.
 */
class rootfs_cache {
 public:
  /// `rootfs`: the open `rootfs/` directory, or empty (a read-only store without a cache:
  /// then nothing is ever cached).
  rootfs_cache(const image_layout& layout, unique_fd rootfs);

  /// Limits of one unpack, all layers of an image together.
  void set_limits(unpack_limits l) noexcept { limits_ = l; }

  /// true: rootfs/<hex> is an unpacked image. A non-directory there is damage (`corrupt`).
  result<bool> cached(const std::string& hex) const;

  /// Unpacks manifest `digest` (verified, config loaded: `m`) into rootfs/<hex> unless it is
  /// there already; one unpack per image at a time in this process.
  result<void> unpack_once(const std::string& digest, const manifest_info& m);

  /// An exclusive flock on rootfs/<hex>, held by the returned descriptor (empty when there is
  /// no cache or no such entry): `busy` while a sandbox uses the image, `io_error` otherwise.
  result<unique_fd> lock_unused(const std::string& hex) const;

  /// Deletes rootfs/<hex>: renamed aside first so it vanishes at once, then removed (failures
  /// are logged).
  void remove(const std::string& hex);

 private:
  /// Applies the layers of `m` into rootfs/.tmp-<hex>-<rand>, then renames that to
  /// rootfs/<hex>. Any failure removes the temp directory.
  result<void> unpack(const std::string& digest, const manifest_info& m);

  const image_layout& layout_;
  const store_logger& log_;  // layout_'s
  unique_fd rootfs_;         // may be empty in a read-only store without a cache
  unpack_limits limits_;
  std::mutex unpack_mu_;
  std::map<std::string, std::shared_ptr<std::mutex>> unpacking_;
};

}  // namespace sandbox::detail
