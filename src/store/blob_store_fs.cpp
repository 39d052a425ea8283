// The filesystem blob store: `<root>/tenants/<tenant>/<64 hex>`.
//
// Safety rules this file keeps:
//  - No path is resolved through a link: the root, `tenants` and each tenant directory are
//    opened with O_DIRECTORY|O_NOFOLLOW and everything else is an *at() call relative to
//    those descriptors. A symlink planted for a tenant directory or blob fails the call
//    (`io_error`, logged) instead of being followed.
//  - Writers stream into a `.tmp-<random>` file in the tenant directory (O_EXCL|O_NOFOLLOW),
//    fsync it, and rename it into place, so readers never see a partial blob.
//  - A per-tenant lock file (`.lock`, flock) is held around "measure usage, check quota,
//    rename", so the quota stays exact with writers in several threads and processes.
//  - Readers verify the digest of what they read (`digest_mismatch`).
//  - Pins are empty files `<root>/pins/<tenant>/<64 hex>/<holder>`. `pin`, `put` (also when
//    the content is already stored: it then refreshes the blob's mtime, the GC's clock) and
//    `collect_garbage` all hold the tenant's `.lock`, so a collection never removes a blob
//    that a concurrent `put` has just returned or a concurrent `pin` has just pinned.
//  - Directories are 0700 and blobs 0600: only the host process reads the store; it copies
//    inputs into sandboxes, a sandbox never opens the store.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <new>
#include <string>

#include "protocol/sha256.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/ticket.hpp"
#include "store/blob_retention.hpp"
#include "store/store_io.hpp"

namespace sandbox {
namespace {

using boost::system::error_code;
using detail::store_error;
using detail::sys_error;
using detail::unique_fd;

constexpr std::string_view tmp_prefix = ".tmp-";
const std::string lock_name = ".lock";
// A blob writer holds its temp file's flock from the moment it exists until it is renamed
// or removed (create_temp_file_at), so an unlocked temp file is a dead writer's at any age.
constexpr long stale_temp_age_s = 0;
constexpr std::size_t chunk_size = 1 << 20;

// Removes, in every tenant directory under `tenants`, the temp files no live writer holds.
void remove_dead_writers_temps(int tenants, const detail::store_logger& log) noexcept {
  auto names = detail::list_dir_names(tenants);
  if (!names) return;
  for (const auto& n : *names) {
    if (!is_valid_tenant(n)) continue;
    auto t = detail::open_dir_at(tenants, n);
    if (!t) continue;
    detail::remove_stale_temps(t->get(), tmp_prefix, stale_temp_age_s, log);
  }
}

class fs_blob_store final : public blob_store {
 public:
  fs_blob_store(unique_fd root, unique_fd tenants, std::uint64_t quota, detail::store_logger log)
      : root_(std::move(root)), tenants_(std::move(tenants)), quota_(quota), log_(std::move(log)) {}

  result<std::string> put(std::string_view tenant, std::string_view bytes) override {
    return guard([&]() -> result<std::string> {
      if (!is_valid_tenant(tenant)) return store_error(errc::invalid_argument);
      if (bytes.size() > quota_) return store_error(errc::quota_exceeded);
      const std::string hex = detail::sha256_hex(bytes);
      if (hex.empty()) return store_error(errc::io_error);
      auto tdir = open_tenant(tenant, /*create=*/true);
      if (!tdir) return tdir.error();
      // Same content already stored intact: a no-op (compared byte for byte, so a damaged
      // copy is rewritten below rather than trusted), except that the blob's mtime is
      // refreshed under the tenant lock, so a collection running now keeps it for its grace
      // period. If a collection removed it first, it is written again below.
      if (holds_exactly(tdir->get(), hex, bytes)) {
        auto lock = detail::file_lock::acquire(tdir->get(), lock_name, true, true);
        if (!lock) return fail("lock tenant", tenant, lock.error());
        if (::utimensat(tdir->get(), hex.c_str(), nullptr, AT_SYMLINK_NOFOLLOW) == 0) {
          return "sha256:" + hex;
        }
        if (errno != ENOENT) return fail("touch blob", tenant, sys_error(errno));
      }
      // Cheap early refusal before writing anything; the exact check is under the lock.
      auto used = scan_usage(tdir->get(), tenant);
      if (!used) return used.error();
      if (*used + bytes.size() > quota_ && !exists_with_size(tdir->get(), hex, bytes.size())) {
        return store_error(errc::quota_exceeded);
      }
      auto tmp = detail::create_temp_file_at(tdir->get(), tmp_prefix);
      if (!tmp) return fail("create temp blob", tenant, tmp.error());
      temp_guard cleanup{tdir->get(), tmp->second};
      if (!detail::write_all(tmp->first.get(), bytes.data(), bytes.size())) {
        return fail("write temp blob", tenant, sys_error(errno));
      }
      return commit(tdir->get(), tenant, tmp->first.get(), cleanup, hex, bytes.size());
    });
  }

  result<std::string> put_fd(std::string_view tenant, int fd, std::uint64_t max_bytes) override {
    return guard([&]() -> result<std::string> {
      if (!is_valid_tenant(tenant) || fd < 0) return store_error(errc::invalid_argument);
      auto tdir = open_tenant(tenant, /*create=*/true);
      if (!tdir) return tdir.error();
      auto tmp = detail::create_temp_file_at(tdir->get(), tmp_prefix);
      if (!tmp) return fail("create temp blob", tenant, tmp.error());
      temp_guard cleanup{tdir->get(), tmp->second};
      std::unique_ptr<char[]> buf(new char[chunk_size]);
      detail::sha256 h;
      std::uint64_t total = 0;
      for (;;) {
        auto r = detail::read_full(fd, buf.get(), chunk_size);
        if (!r) {
          if (r.error().value() == EBADF) return store_error(errc::invalid_argument);
          return fail("read input fd", tenant, r.error());
        }
        if (*r == 0) break;
        total += *r;
        // Refuse as soon as the input is over a cap: nothing is stored, and we stop reading
        // rather than copying an unbounded stream to disk.
        if (total > max_bytes) return store_error(errc::too_large);
        if (total > quota_) return store_error(errc::quota_exceeded);
        h.update(buf.get(), *r);
        if (!detail::write_all(tmp->first.get(), buf.get(), *r)) {
          return fail("write temp blob", tenant, sys_error(errno));
        }
      }
      std::string hex = h.hex_digest();
      if (hex.empty()) return store_error(errc::io_error);
      return commit(tdir->get(), tenant, tmp->first.get(), cleanup, hex, total);
    });
  }

  result<std::string> get(std::string_view tenant, std::string_view id) const override {
    return guard([&]() -> result<std::string> {
      auto fd = open_blob(tenant, id);
      if (!fd) return fd.error();
      std::string out;
      struct stat st {};
      if (::fstat(fd->get(), &st) == 0 && st.st_size > 0) {
        out.reserve(static_cast<std::size_t>(st.st_size));
      }
      char buf[65536];
      detail::sha256 h;
      for (;;) {
        auto r = detail::read_full(fd->get(), buf, sizeof buf);
        if (!r) return fail("read blob", tenant, r.error());
        if (*r == 0) break;
        h.update(buf, *r);
        out.append(buf, *r);
      }
      if (auto c = check_digest(h, id, tenant); !c) return c.error();
      return out;
    });
  }

  result<std::uint64_t> copy_to(std::string_view tenant, std::string_view id, int dirfd,
                                const std::string& name) const override {
    return guard([&]() -> result<std::uint64_t> {
      if (dirfd < 0 || !detail::is_plain_name(name)) return store_error(errc::invalid_argument);
      auto fd = open_blob(tenant, id);
      if (!fd) return fd.error();
      int out =
          ::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444);
      if (out < 0) {
        int e = errno;
        if (e == EEXIST) return store_error(errc::already_exists);
        if (e == EBADF || e == ENOTDIR) return store_error(errc::invalid_argument);
        return fail("create copy target", tenant, sys_error(e));
      }
      unique_fd out_fd(out);
      temp_guard cleanup{dirfd, name};  // never leave a partial or unverified copy behind
      (void)::fchmod(out, 0444);        // the mode must not depend on the caller's umask
      std::unique_ptr<char[]> buf(new char[chunk_size]);
      detail::sha256 h;
      std::uint64_t total = 0;
      for (;;) {
        auto r = detail::read_full(fd->get(), buf.get(), chunk_size);
        if (!r) return fail("read blob", tenant, r.error());
        if (*r == 0) break;
        h.update(buf.get(), *r);
        if (!detail::write_all(out, buf.get(), *r)) {
          return fail("write copy", tenant, sys_error(errno));
        }
        total += *r;
      }
      if (auto c = check_digest(h, id, tenant); !c) return c.error();
      cleanup.keep();
      return total;
    });
  }

  result<std::uint64_t> size(std::string_view tenant, std::string_view id) const override {
    return guard([&]() -> result<std::uint64_t> {
      auto fd = open_blob(tenant, id);
      if (!fd) return fd.error();
      struct stat st {};
      if (::fstat(fd->get(), &st) != 0) return fail("fstat blob", tenant, sys_error(errno));
      return static_cast<std::uint64_t>(st.st_size);
    });
  }

  result<void> remove(std::string_view tenant, std::string_view id) override {
    return guard([&]() -> result<void> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id)) {
        return store_error(errc::invalid_argument);
      }
      auto tdir = open_tenant(tenant, /*create=*/false);
      if (!tdir) return tdir.error();
      auto lock = detail::file_lock::acquire(tdir->get(), lock_name, true, true);
      if (!lock) return fail("lock tenant", tenant, lock.error());
      const std::string hex(id.substr(7));
      struct stat st {};
      if (::fstatat(tdir->get(), hex.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return store_error(errc::not_found);
        return fail("stat blob", tenant, sys_error(errno));
      }
      if (S_ISDIR(st.st_mode)) return fail("remove blob", tenant, sys_error(EISDIR));
      if (::unlinkat(tdir->get(), hex.c_str(), 0) != 0) {
        if (errno == ENOENT) return store_error(errc::not_found);
        return fail("unlink blob", tenant, sys_error(errno));
      }
      (void)::fsync(tdir->get());
      // Its pins go with it (a later put of the same content starts unpinned).
      if (auto pdir = open_pin_tenant(tenant, false)) {
        (void)detail::remove_tree_at(pdir->get(), hex);
      }
      return {};
    });
  }

  result<void> pin(std::string_view tenant, std::string_view id, std::string_view holder) override {
    return guard([&]() -> result<void> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id) || !is_valid_pin_holder(holder)) {
        return store_error(errc::invalid_argument);
      }
      auto tdir = open_tenant(tenant, /*create=*/false);
      if (!tdir) return tdir.error();
      auto lock = detail::file_lock::acquire(tdir->get(), lock_name, true, true);
      if (!lock) return fail("lock tenant", tenant, lock.error());
      const std::string hex(id.substr(7));
      struct stat st {};
      if (::fstatat(tdir->get(), hex.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(st.st_mode)) {
        return store_error(errc::not_found);
      }
      auto pdir = open_pin_tenant(tenant, true);
      if (!pdir) return pdir.error();
      auto bdir = detail::ensure_dir_at(pdir->get(), hex, 0700);
      if (!bdir) return fail("create pin directory", tenant, bdir.error());
      const std::string name(holder);
      const int fd =
          ::openat(bdir->get(), name.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0) return fail("create pin", tenant, sys_error(errno));
      ::close(fd);
      (void)::fsync(bdir->get());
      return {};
    });
  }

  result<void> unpin(std::string_view tenant, std::string_view id,
                     std::string_view holder) override {
    return guard([&]() -> result<void> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id) || !is_valid_pin_holder(holder)) {
        return store_error(errc::invalid_argument);
      }
      auto pdir = open_pin_tenant(tenant, false);
      if (!pdir)
        return pdir.error() == store_error(errc::not_found) ? result<void>{}
                                                            : result<void>{pdir.error()};
      const std::string hex(id.substr(7));
      auto bdir = detail::open_dir_at(pdir->get(), hex);
      if (!bdir) {
        if (bdir.error().value() == ENOENT) return {};
        return fail("open pin directory", tenant, bdir.error());
      }
      const std::string name(holder);
      if (::unlinkat(bdir->get(), name.c_str(), 0) != 0 && errno != ENOENT) {
        return fail("remove pin", tenant, sys_error(errno));
      }
      (void)::unlinkat(pdir->get(), hex.c_str(), AT_REMOVEDIR);  // ENOTEMPTY: other holders
      return {};
    });
  }

  result<std::vector<std::string>> pins(std::string_view tenant,
                                        std::string_view id) const override {
    return guard([&]() -> result<std::vector<std::string>> {
      if (!is_valid_tenant(tenant) || !is_valid_blob_id(id)) {
        return store_error(errc::invalid_argument);
      }
      std::vector<std::string> out;
      auto pdir = open_pin_tenant(tenant, false);
      if (!pdir) {
        if (pdir.error() == store_error(errc::not_found)) return out;
        return pdir.error();
      }
      return holders(pdir->get(), std::string(id.substr(7)), tenant);
    });
  }

  result<gc_report> collect_garbage(const gc_options& options) override {
    return guard([&]() -> result<gc_report> {
      std::vector<std::string> names = options.tenants;
      for (const auto& t : names) {
        if (!is_valid_tenant(t)) return store_error(errc::invalid_argument);
      }
      if (names.empty()) {
        auto all = tenants();
        if (!all) return all.error();
        names = std::move(*all);
      }
      gc_report report;
      for (const auto& t : names) {
        if (auto r = collect_tenant(t, options, report); !r) return r.error();
      }
      return report;
    });
  }

  result<std::vector<std::string>> tenants() const override {
    return guard([&]() -> result<std::vector<std::string>> {
      auto names = detail::list_dir_names(tenants_.get());
      if (!names) return fail("list tenants", "*", names.error());
      std::vector<std::string> out;
      for (auto& n : *names) {
        if (is_valid_tenant(n)) out.push_back(std::move(n));
      }
      std::sort(out.begin(), out.end());
      return out;
    });
  }

  result<std::vector<std::string>> list(std::string_view tenant) const override {
    return guard([&]() -> result<std::vector<std::string>> {
      if (!is_valid_tenant(tenant)) return store_error(errc::invalid_argument);
      std::vector<std::string> ids;
      auto tdir = open_tenant(tenant, /*create=*/false);
      if (!tdir) {
        if (tdir.error() == store_error(errc::not_found)) return ids;
        return tdir.error();
      }
      auto names = detail::list_dir_names(tdir->get());
      if (!names) return fail("list tenant", tenant, names.error());
      for (const auto& n : *names) {
        if (!detail::is_hex64(n)) continue;
        struct stat st {};
        if (::fstatat(tdir->get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISREG(st.st_mode)) ids.push_back("sha256:" + n);
      }
      return ids;
    });
  }

  result<std::uint64_t> usage(std::string_view tenant) const override {
    return guard([&]() -> result<std::uint64_t> {
      if (!is_valid_tenant(tenant)) return store_error(errc::invalid_argument);
      auto tdir = open_tenant(tenant, /*create=*/false);
      if (!tdir) {
        if (tdir.error() == store_error(errc::not_found)) return std::uint64_t{0};
        return tdir.error();
      }
      return scan_usage(tdir->get(), tenant);
    });
  }

 private:
  // Unlinks a file by name on scope exit unless `keep()` was called.
  struct temp_guard {
    int dirfd;
    std::string name;
    bool armed = true;
    void keep() { armed = false; }
    ~temp_guard() {
      if (armed) (void)::unlinkat(dirfd, name.c_str(), 0);
    }
  };

  // Runs `fn`, turning any escaping exception into `io_error`: expected failures are codes.
  template <class Fn>
  auto guard(Fn&& fn) const -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::bad_alloc&) {
      log_(log_level::error, "blob store: out of memory");
    } catch (const std::exception& e) {
      log_(log_level::error, std::string("blob store: unexpected exception: ") + e.what());
    } catch (...) {
      log_(log_level::error, "blob store: unexpected exception");
    }
    return store_error(errc::io_error);
  }

  // Logs a host failure and returns the code for the caller.
  error_code fail(std::string_view what, std::string_view tenant, const error_code& ec) const {
    error_code mapped = detail::to_store_error(ec);
    if (mapped == store_error(errc::not_found) || mapped == store_error(errc::already_exists)) {
      mapped = store_error(errc::io_error);  // an unexpected ENOENT/EEXIST is a host problem
    }
    std::string line = "blob store: ";
    line.append(what).append(" (tenant ").append(tenant).append("): ").append(ec.message());
    log_(log_level::warning, line);
    return mapped;
  }

  // Opens the tenant's directory without following links; `create` makes it first (0700).
  result<unique_fd> open_tenant(std::string_view tenant, bool create) const {
    const std::string name(tenant);
    auto fd = create ? detail::ensure_dir_at(tenants_.get(), name, 0700)
                     : detail::open_dir_at(tenants_.get(), name);
    if (fd) return fd;
    if (fd.error().value() == ENOENT && !create) return store_error(errc::not_found);
    // ELOOP / ENOTDIR: something that is not our directory sits there (a planted link).
    return fail("open tenant directory", tenant, fd.error());
  }

  // Validates the tenant and id, then opens the blob read-only (never through a link).
  result<unique_fd> open_blob(std::string_view tenant, std::string_view id) const {
    if (!is_valid_tenant(tenant) || !is_valid_blob_id(id)) {
      return store_error(errc::invalid_argument);
    }
    auto tdir = open_tenant(tenant, /*create=*/false);
    if (!tdir) return tdir.error();
    auto fd = detail::open_regular_at(tdir->get(), std::string(id.substr(7)));
    if (fd) return fd;
    // Another tenant's blob and a missing one look the same: both are simply absent here.
    if (fd.error().value() == ENOENT) return store_error(errc::not_found);
    return fail("open blob", tenant, fd.error());
  }

  result<void> check_digest(detail::sha256& h, std::string_view id, std::string_view tenant) const {
    std::string hex = h.hex_digest();
    if (hex.empty()) return store_error(errc::io_error);
    if (hex != id.substr(7)) {
      std::string line = "blob store: digest mismatch for ";
      line.append(id).append(" (tenant ").append(tenant).append("): content hashes to sha256:");
      line.append(hex);
      log_(log_level::error, line);
      return store_error(errc::digest_mismatch);
    }
    return {};
  }

  bool exists_with_size(int tdir, const std::string& hex, std::uint64_t size) const {
    struct stat st {};
    return ::fstatat(tdir, hex.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
           static_cast<std::uint64_t>(st.st_size) == size;
  }

  // True when blob `hex` exists as a regular file whose content equals `bytes`.
  bool holds_exactly(int tdir, const std::string& hex, std::string_view bytes) const {
    auto fd = detail::open_regular_at(tdir, hex);
    if (!fd) return false;
    struct stat st {};
    if (::fstat(fd->get(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != bytes.size()) {
      return false;
    }
    char buf[65536];
    std::size_t off = 0;
    for (;;) {
      auto r = detail::read_full(fd->get(), buf, sizeof buf);
      if (!r) return false;
      if (*r == 0) break;
      if (off + *r > bytes.size() || bytes.compare(off, *r, std::string_view(buf, *r)) != 0) {
        return false;
      }
      off += *r;
    }
    return off == bytes.size();
  }

  // Sum of the sizes of the tenant's blobs (regular files named by 64 hex digits).
  result<std::uint64_t> scan_usage(int tdir, std::string_view tenant) const {
    auto names = detail::list_dir_names(tdir);
    if (!names) return fail("list tenant", tenant, names.error());
    std::uint64_t sum = 0;
    for (const auto& n : *names) {
      if (!detail::is_hex64(n)) continue;
      struct stat st {};
      if (::fstatat(tdir, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISREG(st.st_mode)) sum += static_cast<std::uint64_t>(st.st_size);
    }
    return sum;
  }

  // Makes the fully written temp file the blob `hex`: fsync, then under the tenant lock
  // check the quota exactly and rename into place. Storing existing content again replaces
  // the file with the fresh, verified copy (repairing a damaged one) and counts once.
  result<std::string> commit(int tdir, std::string_view tenant, int tmp_fd, temp_guard& tmp,
                             const std::string& hex, std::uint64_t size) const {
    if (::fsync(tmp_fd) != 0) return fail("fsync temp blob", tenant, sys_error(errno));
    auto lock = detail::file_lock::acquire(tdir, lock_name, true, true);
    if (!lock) return fail("lock tenant", tenant, lock.error());
    detail::remove_stale_temps(tdir, tmp_prefix, stale_temp_age_s, log_);
    auto used = scan_usage(tdir, tenant);
    if (!used) return used.error();
    std::uint64_t existing = 0;
    struct stat st {};
    if (::fstatat(tdir, hex.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
      existing = static_cast<std::uint64_t>(st.st_size);
    }
    if (*used - existing + size > quota_) return store_error(errc::quota_exceeded);
    if (::renameat(tdir, tmp.name.c_str(), tdir, hex.c_str()) != 0) {
      return fail("rename blob into place", tenant, sys_error(errno));
    }
    tmp.keep();
    (void)::fsync(tdir);
    return "sha256:" + hex;
  }

  // `<root>/pins/<tenant>`; `create` makes both levels (0700). Absent: `not_found`.
  result<unique_fd> open_pin_tenant(std::string_view tenant, bool create) const {
    auto pins = create ? detail::ensure_dir_at(root_.get(), "pins", 0700)
                       : detail::open_dir_at(root_.get(), "pins");
    if (!pins) {
      if (pins.error().value() == ENOENT && !create) return store_error(errc::not_found);
      return fail("open pins directory", tenant, pins.error());
    }
    const std::string name(tenant);
    auto fd = create ? detail::ensure_dir_at(pins->get(), name, 0700)
                     : detail::open_dir_at(pins->get(), name);
    if (fd) return fd;
    if (fd.error().value() == ENOENT && !create) return store_error(errc::not_found);
    return fail("open tenant pins directory", tenant, fd.error());
  }

  // The holders pinning blob `hex`, sorted (a missing directory: none).
  result<std::vector<std::string>> holders(int pdir, const std::string& hex,
                                           std::string_view tenant) const {
    std::vector<std::string> out;
    auto bdir = detail::open_dir_at(pdir, hex);
    if (!bdir) {
      if (bdir.error().value() == ENOENT) return out;
      return fail("open pin directory", tenant, bdir.error());
    }
    auto names = detail::list_dir_names(bdir->get());
    if (!names) return fail("list pins", tenant, names.error());
    for (auto& n : *names) {
      if (is_valid_pin_holder(n)) out.push_back(std::move(n));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // One tenant's collection, under its lock (puts and pins of the tenant wait meanwhile).
  result<void> collect_tenant(const std::string& tenant, const gc_options& options,
                              gc_report& report) {
    auto tdir = open_tenant(tenant, /*create=*/false);
    if (!tdir)
      return tdir.error() == store_error(errc::not_found) ? result<void>{}
                                                          : result<void>{tdir.error()};
    auto lock = detail::file_lock::acquire(tdir->get(), lock_name, true, true);
    if (!lock) return fail("lock tenant", tenant, lock.error());
    auto pdir = open_pin_tenant(tenant, false);
    if (!pdir && pdir.error() != store_error(errc::not_found)) return pdir.error();
    auto names = detail::list_dir_names(tdir->get());
    if (!names) return fail("list tenant", tenant, names.error());
    std::vector<detail::gc_candidate> blobs;
    for (const auto& n : *names) {
      if (!detail::is_hex64(n)) continue;
      struct stat st {};
      if (::fstatat(tdir->get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(st.st_mode)) {
        continue;
      }
      bool pinned = false;
      if (pdir) {
        auto h = holders(pdir->get(), n, tenant);
        if (!h) return h.error();
        pinned = !h->empty();
      }
      const auto mtime = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::seconds(st.st_mtim.tv_sec) +
              std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
      blobs.push_back({n, static_cast<std::uint64_t>(st.st_size), mtime, pinned});
    }
    const auto now = std::chrono::system_clock::now();
    for (std::size_t i : detail::select_garbage(blobs, options, now, report)) {
      if (!options.dry_run && ::unlinkat(tdir->get(), blobs[i].hex.c_str(), 0) != 0 &&
          errno != ENOENT) {
        return fail("unlink blob", tenant, sys_error(errno));
      }
      report.removed.push_back({tenant, "sha256:" + blobs[i].hex, blobs[i].bytes});
      report.bytes_removed += blobs[i].bytes;
    }
    if (!options.dry_run) (void)::fsync(tdir->get());
    return {};
  }

  unique_fd root_;     // kept open: the store's identity does not change if the path does
  unique_fd tenants_;  // `<root>/tenants`, opened O_NOFOLLOW
  std::uint64_t quota_;
  detail::store_logger log_;
};

}  // namespace

result<std::shared_ptr<blob_store>> open_fs_blob_store(const fs_blob_store_options& options) {
  detail::store_logger log(options.log);
  try {
    if (options.root.empty() || !options.root.is_absolute()) {
      return store_error(errc::invalid_argument);
    }
    auto root = detail::open_store_root(options.root, /*create=*/true, 0700);
    if (!root) {
      if (root.error() == store_error(errc::invalid_argument)) return root.error();
      log(log_level::error,
          "blob store: open root " + options.root.string() + ": " + root.error().message());
      auto mapped = detail::to_store_error(root.error());
      return mapped == store_error(errc::permission_denied) ? mapped : store_error(errc::io_error);
    }
    auto tenants = detail::ensure_dir_at(root->get(), "tenants", 0700);
    if (!tenants) {
      log(log_level::error,
          "blob store: open " + options.root.string() + "/tenants: " + tenants.error().message());
      auto mapped = detail::to_store_error(tenants.error());
      return mapped == store_error(errc::permission_denied) ? mapped : store_error(errc::io_error);
    }
    // Temp files of writers that died (a daemon killed mid-run) are removed now, not only
    // when their tenant next stores a blob.
    remove_dead_writers_temps(tenants->get(), log);
    return std::shared_ptr<blob_store>(std::make_shared<fs_blob_store>(
        std::move(*root), std::move(*tenants), options.quota_bytes_per_tenant, log));
  } catch (...) {
    log(log_level::error, "blob store: out of memory opening the store");
    return store_error(errc::io_error);
  }
}

}  // namespace sandbox
