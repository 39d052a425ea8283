// The image store's rootfs cache (rootfs_cache.hpp): unpacking verified images once.
#include "store/rootfs_cache.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "store/gunzip.hpp"
#include "store/tar_reader.hpp"

namespace sandbox::detail {

namespace {
constexpr long stale_temp_age_s = 60;
}  // namespace

rootfs_cache::rootfs_cache(const image_layout& layout, unique_fd rootfs)
    : layout_(layout), log_(layout.log()), rootfs_(std::move(rootfs)) {}

result<void> rootfs_cache::unpack_once(const std::string& digest, const manifest_info& m) {
  const std::string hex = digest.substr(7);
  // One unpack per image in this process; other processes race through rename in unpack().
  std::shared_ptr<std::mutex> mu;
  {
    std::lock_guard lock(unpack_mu_);
    auto& slot = unpacking_[hex];
    if (!slot) slot = std::make_shared<std::mutex>();
    mu = slot;
  }
  std::lock_guard one(*mu);
  if (auto cached = this->cached(hex); !cached) {
    return cached.error();
  } else if (*cached) {
    return {};
  }
  return unpack(digest, m);
}

result<unique_fd> rootfs_cache::lock_unused(const std::string& hex) const {
  unique_fd in_use;
  if (rootfs_) {
    if (auto held = open_dir_at(rootfs_.get(), hex)) {
      if (::flock(held->get(), LOCK_EX | LOCK_NB) != 0) {
        return store_error(errno == EWOULDBLOCK ? errc::busy : errc::io_error);
      }
      in_use = std::move(*held);
    }
  }
  return in_use;
}

// true: rootfs/<hex> is an unpacked image. A non-directory there is damage (`corrupt`).
result<bool> rootfs_cache::cached(const std::string& hex) const {
  if (!rootfs_) return false;
  struct stat st {};
  if (::fstatat(rootfs_.get(), hex.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    return result<bool>(boost::system::in_place_error,
                        layout_.fail("stat rootfs cache", sys_error(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return result<bool>(boost::system::in_place_error,
                        layout_.corrupt("rootfs/" + hex + " is not a directory"));
  }
  return true;
}

// Applies the layers of a verified manifest into rootfs/.tmp-<hex>-<rand>, then renames
// that to rootfs/<hex>. Any failure removes the temp directory.
result<void> rootfs_cache::unpack(const std::string& digest, const manifest_info& m) {
  const std::string hex = digest.substr(7);
  remove_stale_temps(rootfs_.get(), store_tmp_prefix, stale_temp_age_s, log_);
  auto tmp_name = temp_name(std::string(store_tmp_prefix) + hex + "-", 6);
  if (!tmp_name) return layout_.fail("a random name for rootfs/" + hex, tmp_name.error());
  const std::string tmp = std::move(*tmp_name);
  if (::mkdirat(rootfs_.get(), tmp.c_str(), 0700) != 0) {
    return layout_.fail("mkdir rootfs/" + tmp, sys_error(errno));
  }
  struct tree_guard {
    int dir;
    std::string name;
    const store_logger& log;
    bool armed = true;
    ~tree_guard() {
      if (!armed) return;
      if (auto r = remove_tree_at(dir, name); !r) {
        log(log_level::warning,
            "image store: cannot remove rootfs/" + name + ": " + r.error().message());
      }
    }
  } guard{rootfs_.get(), tmp, log_};
  auto tfd = open_dir_at(rootfs_.get(), tmp);
  if (!tfd) return layout_.fail("open rootfs/" + tmp, tfd.error());
  (void)::flock(tfd->get(), LOCK_EX | LOCK_NB);  // alive: stale-temp cleanup keeps out

  layer_applier applier(tfd->get(), ::geteuid() == 0, limits_);
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const layer_desc& l = m.layers[i];
    auto fd = layout_.open_verified_blob(l.digest, l.size);
    if (!fd) return fd.error();
    std::unique_ptr<byte_source> raw;
    std::unique_ptr<gunzip_source> gz;
    fd_source plain(fd->get());
    byte_source* src = &plain;
    if (l.gzip) {
      auto started = gunzip_source::start(fd->get());
      if (!started) {
        if (started.error() == store_error(errc::unsupported)) {
          log_(log_level::error, "image store: gzip layer but no gzip program on this host");
          return started.error();
        }
        return layout_.fail("start gzip", started.error());
      }
      gz = std::move(*started);
      src = gz.get();
    }
    hashing_source hashed(*src);
    tar_reader tar(hashed);
    auto applied = applier.apply(tar);
    if (!applied) {
      const std::string why = "layer " + l.digest + " of " + digest + ": " +
                              applier.error_detail() +
                              (gz ? " (gzip: " + gz->diagnostics() + ")" : "");
      if (applied.error() == store_error(errc::corrupt)) return layout_.corrupt(why);
      log_(log_level::error, "image store: " + why);
      return applied.error();
    }
    auto diff = hashed.finish();
    if (!diff) {
      if (diff.error() == store_error(errc::corrupt)) {
        return layout_.corrupt("layer " + l.digest +
                               " does not decompress: " + (gz ? gz->diagnostics() : std::string()));
      }
      return layout_.fail("read layer " + l.digest, diff.error());
    }
    if ("sha256:" + *diff != m.diff_ids[i]) {
      log_(log_level::error, "image store: layer " + l.digest + " uncompressed to sha256:" + *diff +
                                 ", config says " + m.diff_ids[i]);
      return store_error(errc::digest_mismatch);
    }
  }
  // The temp dir was made 0700 so nobody sees it half-built; an image whose layers do not
  // name the root ("./", common in Docker-built layers) gets 0755 (finish() below applies a
  // mode a layer did give it): sandboxes run as other users must be able to enter it.
  if (::fchmod(tfd->get(), 0755) != 0) return layout_.fail("chmod rootfs/" + tmp, sys_error(errno));
  if (auto r = applier.finish(); !r) {
    return layout_.fail("finish rootfs of " + digest + ": " + applier.error_detail(), r.error());
  }
  const auto& st = applier.stats();
  log_(log_level::info, "image store: unpacked " + digest + ": " + std::to_string(st.entries) +
                            " entries, " + std::to_string(st.bytes) + " bytes, " +
                            std::to_string(st.skipped_special) + " special files skipped, " +
                            std::to_string(st.cleared_setid) + " setuid/setgid bits cleared");
  // Durable before it becomes visible: a torn cache would be served as if complete.
  (void)::syncfs(tfd->get());

  // Publish under the shared store lock, so a concurrent remove() of this image either
  // ran before (we see it gone and discard) or waits until we are done.
  auto lock = layout_.lock_store(/*exclusive=*/false);
  if (!lock) return lock.error();
  auto still = layout_.find_entry(digest);
  if (!still) return still.error();
  int r = ::renameat2(rootfs_.get(), tmp.c_str(), rootfs_.get(), hex.c_str(), RENAME_NOREPLACE);
  if (r != 0 && errno == EINVAL) {
    r = ::renameat(rootfs_.get(), tmp.c_str(), rootfs_.get(), hex.c_str());  // no NOREPLACE
  }
  if (r != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY) {
      // Another process unpacked it first; ours goes (guard), theirs is used.
      auto theirs = cached(hex);
      if (!theirs) return theirs.error();
      if (*theirs) return {};
    }
    return layout_.fail("rename rootfs into place", sys_error(errno));
  }
  guard.armed = false;
  (void)::fsync(rootfs_.get());
  return {};
}

// Deletes rootfs/<hex>: renamed aside first so it vanishes at once, then removed.
void rootfs_cache::remove(const std::string& hex) {
  if (!rootfs_) return;
  auto aside_name = temp_name(std::string(store_tmp_prefix) + "del-" + hex + "-", 6);
  if (!aside_name) {
    log_(log_level::warning, "image store: cannot remove rootfs/" + hex + ": no random name");
    return;
  }
  const std::string aside = std::move(*aside_name);
  if (::renameat(rootfs_.get(), hex.c_str(), rootfs_.get(), aside.c_str()) != 0) {
    if (errno != ENOENT) {
      log_(log_level::warning, "image store: cannot move rootfs/" + hex +
                                   " aside: " + std::string(std::strerror(errno)));
    }
    return;
  }
  // Held while deleting, so a concurrent stale-temp sweep leaves this one to us.
  auto held = open_dir_at(rootfs_.get(), aside);
  if (held) (void)::flock(held->get(), LOCK_EX | LOCK_NB);
  if (auto r = remove_tree_at(rootfs_.get(), aside); !r) {
    log_(log_level::warning, "image store: cannot remove rootfs/" + aside + " (still " +
                                 "mounted?): " + r.error().message());
  }
}

std::filesystem::path root_path_;
unique_fd root_;
unique_fd layout_;
unique_fd blobs_;
unique_fd rootfs_;  // may be empty in a read-only store without a cache
bool read_only_;
unpack_limits limits_;  ///< per image, all layers together
}  // namespace sandbox::detail
