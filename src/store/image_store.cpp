// The filesystem image store: the public `image_store` on an OCI layout (image_layout.hpp)
// and a cache of unpacked images (rootfs_cache.hpp).
//
//   <root>/.lock                      flock: held exclusively by writers (import, set_current,
//                                     remove) and shared while an unpack is published
//   <root>/layout/oci-layout          {"imageLayoutVersion":"1.0.0"}
//   <root>/layout/index.json          every image (annotations: see oci.hpp)
//   <root>/layout/blobs/sha256/<hex>  manifests, configs, layers (0644)
//   <root>/rootfs/<hex>/              unpacked image, keyed by manifest digest
//   <root>/rootfs/.tmp-<hex>-<rand>/  an unpack in progress (flock'ed by its writer)
//
// Directories are 0755 and blobs 0644 so an unprivileged host can open the store read-only.
// Every read of a blob is checked against its digest; index.json is replaced atomically
// (temp file + rename), so readers never need the lock.
#include "sandbox/image_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "protocol/text_util.hpp"
#include "sandbox/protocol.hpp"
#include "store/image_layout.hpp"
#include "store/oci.hpp"
#include "store/rootfs_cache.hpp"
#include "store/store_io.hpp"

namespace sandbox {
namespace detail::oci {

bool is_valid_runtime_name(std::string_view t) noexcept {
  if (t.empty() || t.size() > 64) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(t.front())) return false;
  for (char c : t) {
    if (!alnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace detail::oci

namespace {

using boost::system::error_code;
using detail::store_error;
using detail::sys_error;
using detail::unique_fd;

// A time as OCI annotations and configs write it (RFC 3339 date-time, e.g.
// 2026-11-30T01:02:03Z or with fraction and offset): digits and separators only, so that
// nothing a layout writes there reaches a terminal as anything else.
bool is_rfc3339(std::string_view t) {
  static const std::regex re(
      R"([0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2}))");
  return t.size() <= 40 && std::regex_match(t.begin(), t.end(), re);
}

using json = nlohmann::json;
namespace oci = detail::oci;

using namespace detail::layout_json;
using detail::index_entry;
using detail::manifest_info;

using detail::max_index_bytes;
const std::string lock_name(detail::store_lock_name);

class fs_image_store final : public image_store {
 public:
  fs_image_store(std::filesystem::path root_path, unique_fd root, unique_fd layout, unique_fd blobs,
                 unique_fd rootfs, bool read_only, detail::store_logger log)
      : layout_(std::move(root_path), std::move(root), std::move(layout), std::move(blobs), log),
        cache_(layout_, std::move(rootfs)),
        read_only_(read_only),
        log_(std::move(log)) {}

  const std::filesystem::path& root_path() const { return layout_.root_path(); }

  /// Reads and validates index.json (used once at open).
  result<void> check_index() const {
    auto idx = layout_.read_index();
    if (!idx) return idx.error();
    return {};
  }

  result<std::vector<image_info>> list() const override {
    return guard([&]() -> result<std::vector<image_info>> {
      auto idx = layout_.read_index();
      if (!idx) return idx.error();
      std::vector<image_info> out;
      for (const auto& e : idx->second) {
        if (e.runtime.empty()) continue;
        image_info info{.name = e.runtime,
                        .digest = e.digest,
                        .current = e.current,
                        .size_bytes = 0,
                        .created = e.created};
        auto m = layout_.load_manifest(e.digest, e.size, /*with_config=*/false);
        if (m) {
          info.size_bytes = m->layers_size();
        } else {
          log_(log_level::warning,
               "image store: list: image " + e.digest + " is unreadable: " + m.error().message());
        }
        out.push_back(std::move(info));
      }
      return out;
    });
  }

  result<std::string> current_digest(std::string_view name) const override {
    return guard([&]() -> result<std::string> {
      if (!oci::is_valid_runtime_name(name)) return store_error(errc::invalid_argument);
      auto idx = layout_.read_index();
      if (!idx) return idx.error();
      for (const auto& e : idx->second) {
        if (e.current && e.runtime == name) return e.digest;
      }
      return store_error(errc::not_found);
    });
  }

  result<std::filesystem::path> rootfs(std::string_view digest) override {
    return guard([&]() -> result<std::filesystem::path> {
      if (!is_valid_blob_id(digest)) return store_error(errc::invalid_argument);
      auto entry = layout_.find_entry(digest);
      if (!entry) return entry.error();
      // Cheap path: hash manifest and config only; the layers were checked when unpacked.
      auto m = layout_.load_manifest(std::string(digest), entry->size, /*with_config=*/true);
      if (!m) return m.error();
      const std::string hex(digest.substr(7));
      const std::filesystem::path path = layout_.root_path() / "rootfs" / hex;
      if (auto cached = cache_.cached(hex); !cached) {
        return cached.error();
      } else if (*cached) {
        return path;
      }
      if (read_only_) {
        log_(log_level::warning, "image store: " + std::string(digest) +
                                     " is not unpacked and the store is "
                                     "read-only; unpack it once as the store's owner (rootfs())");
        return store_error(errc::permission_denied);
      }
      if (auto r = cache_.unpack_once(std::string(digest), *m); !r) return r.error();
      return path;
    });
  }

  result<void> verify(std::string_view digest) const override {
    return guard([&]() -> result<void> {
      if (!is_valid_blob_id(digest)) return store_error(errc::invalid_argument);
      auto entry = layout_.find_entry(digest);
      if (!entry) return entry.error();
      auto m = layout_.load_manifest(std::string(digest), entry->size, /*with_config=*/true);
      if (!m) return m.error();
      for (const auto& l : m->layers) {
        auto fd = layout_.open_verified_blob(l.digest, l.size);
        if (!fd) return fd.error();
      }
      return {};
    });
  }

  // Imports, then unpacks (which applies and checks every layer) before the image becomes
  // current: a layout whose layers cannot be applied never replaces a working image.
  result<std::string> import_layout(const std::filesystem::path& layout_dir, std::string_view name,
                                    std::string_view ref) override {
    auto before = list();
    auto digests = import_entries(layout_dir, name, ref);
    if (!digests) return digests.error();
    // Every imported image is unpacked, not just the one made current: any of them can be
    // made current later (`set_current`), and must work then.
    for (const auto& digest : *digests) {
      if (auto root = rootfs(digest); !root) {
        for (const auto& d : *digests) {
          bool was_there = false;
          if (before) {
            for (const auto& i : *before) was_there |= i.digest == d;
          }
          if (!was_there) (void)remove(d);
        }
        log_(log_level::error,
             "image store: import of " + digest + " refused: its layers cannot be unpacked");
        return root.error();
      }
    }
    const std::string& digest = digests->back();
    if (auto cur = set_current(name, digest); !cur) return cur.error();
    log_(log_level::info, "image store: imported " + digest + " as current " + std::string(name));
    return digest;
  }

 private:
  // The digests imported, in index order (the last becomes current).
  result<std::vector<std::string>> import_entries(const std::filesystem::path& layout_dir,
                                                  std::string_view name, std::string_view ref) {
    return guard([&]() -> result<std::vector<std::string>> {
      if (read_only_) return store_error(errc::permission_denied);
      if (!oci::is_valid_runtime_name(name) || layout_dir.empty()) {
        return store_error(errc::invalid_argument);
      }
      // The operator names the layout directory; inside it nothing is followed.
      int sfd = ::open(layout_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (sfd < 0) {
        if (errno == ENOENT) return store_error(errc::not_found);
        return layout_.fail("open layout " + layout_dir.string(), sys_error(errno));
      }
      unique_fd src(sfd);
      auto layout_file = detail::read_file_at(src.get(), "oci-layout", 64 * 1024);
      if (!layout_file) return layout_.bad_layout("cannot read oci-layout", layout_file.error());
      json lf = json::parse(*layout_file, nullptr, false);
      auto version = string_member(lf, "imageLayoutVersion");
      if (!version || version->rfind("1.", 0) != 0) {
        return layout_.corrupt("import: unsupported oci-layout version");
      }
      auto index_text = detail::read_file_at(src.get(), "index.json", max_index_bytes);
      if (!index_text) return layout_.bad_layout("cannot read index.json", index_text.error());
      json index = json::parse(*index_text, nullptr, false);
      const json* manifests = member(index, "manifests");
      if (index.is_discarded() || manifests == nullptr || !manifests->is_array()) {
        return layout_.corrupt("import: index.json is not an image index");
      }
      auto src_blobs = detail::open_dir_at(src.get(), "blobs");
      if (!src_blobs) return layout_.bad_layout("cannot open blobs/", src_blobs.error());
      auto src_sha = detail::open_dir_at(src_blobs->get(), "sha256");
      if (!src_sha) return layout_.bad_layout("cannot open blobs/sha256/", src_sha.error());

      struct selected {
        std::string digest;
        std::uint64_t size;
        std::string created;
      };
      std::vector<selected> chosen;
      for (const auto& d : *manifests) {
        std::string mt, dg;
        std::uint64_t sz = 0;
        if (!parse_descriptor(d, mt, dg, sz))
          return layout_.corrupt("import: bad manifest descriptor");
        if (!ref.empty() && annotation(d, oci::annotation_ref_name) != ref) continue;
        if (mt == oci::media_index)
          return layout_.corrupt("import: nested image indexes are unsupported");
        if (mt != oci::media_manifest)
          return layout_.corrupt("import: unknown media type " + detail::quote_for_message(mt));
        chosen.push_back({dg, sz, annotation(d, oci::annotation_created)});
      }
      if (chosen.empty()) {
        log_(log_level::warning, "image store: import: no manifest in " + layout_dir.string() +
                                     (ref.empty() ? "" : " with ref " + std::string(ref)));
        return store_error(errc::not_found);
      }

      auto lock = layout_.lock_store(/*exclusive=*/true);
      if (!lock) return lock.error();
      // Temp files of imports that died half-way (their writers no longer hold the flock).
      layout_.remove_stale_temps();
      auto idx = layout_.read_index();
      if (!idx) return idx.error();
      json doc = std::move(idx->first);
      for (auto& c : chosen) {
        // Manifest and config first (small, verified in memory), then copy every blob in.
        auto mbytes = layout_.read_verified_small(src_sha->get(), c.digest, c.size);
        if (!mbytes) return mbytes.error();
        auto m = layout_.parse_manifest(*mbytes);
        if (!m) return m.error();
        auto cbytes = layout_.read_verified_small(src_sha->get(), m->config_digest, m->config_size);
        if (!cbytes) return cbytes.error();
        if (auto r = layout_.parse_config(*cbytes, *m); !r) return r.error();
        for (const auto& l : m->layers) {
          if (auto r = layout_.copy_blob_in(src_sha->get(), l.digest, l.size); !r) return r.error();
        }
        if (auto r = layout_.copy_blob_in(src_sha->get(), m->config_digest, m->config_size); !r) {
          return r.error();
        }
        if (auto r = layout_.copy_blob_in(src_sha->get(), c.digest, c.size); !r) return r.error();
        // Shown by `image ls`: only a well-formed RFC 3339 time is kept from the layout.
        if (!is_rfc3339(c.created)) c.created = m->config_created;
        if (!is_rfc3339(c.created)) c.created = detail::rfc3339_now();
        detail::image_layout::add_entry(doc, name, c.digest, c.size, c.created);
      }
      if (auto w = layout_.write_index(doc); !w) return sys_error(errno);
      std::vector<std::string> out;
      for (const auto& c : chosen) out.push_back(c.digest);
      return out;
    });
  }

 public:
  result<void> set_current(std::string_view name, std::string_view digest) override {
    return guard([&]() -> result<void> {
      if (read_only_) return store_error(errc::permission_denied);
      if (!oci::is_valid_runtime_name(name) || !is_valid_blob_id(digest)) {
        return store_error(errc::invalid_argument);
      }
      auto lock = layout_.lock_store(/*exclusive=*/true);
      if (!lock) return lock.error();
      auto idx = layout_.read_index();
      if (!idx) return idx.error();
      bool found = false;
      for (const auto& e : idx->second) found |= (e.runtime == name && e.digest == digest);
      if (!found) return store_error(errc::not_found);
      json doc = std::move(idx->first);
      detail::image_layout::mark_current(doc, name, std::string(digest));
      return layout_.write_index(doc);
    });
  }

  result<void> remove(std::string_view digest) override {
    return guard([&]() -> result<void> {
      if (read_only_) return store_error(errc::permission_denied);
      if (!is_valid_blob_id(digest)) return store_error(errc::invalid_argument);
      auto lock = layout_.lock_store(/*exclusive=*/true);
      if (!lock) return lock.error();
      auto idx = layout_.read_index();
      if (!idx) return idx.error();
      bool found = false;
      for (const auto& e : idx->second) {
        if (e.digest != digest) continue;
        found = true;
        if (e.current) return store_error(errc::busy);
      }
      if (!found) return store_error(errc::not_found);
      // Sandboxes using the image (runs, warm-pool instances) hold a shared lock on its
      // unpacked root: then it is `busy`. Held exclusively from here, so none starts on it.
      auto in_use = cache_.lock_unused(std::string(digest.substr(7)));
      if (!in_use) return in_use.error();
      // Which blobs the removed image uses (if its manifest is still readable).
      std::set<std::string> candidates{std::string(digest)};
      std::uint64_t msize = 0;
      for (const auto& e : idx->second) {
        if (e.digest == digest) msize = e.size;
      }
      if (auto m = layout_.load_manifest(std::string(digest), msize, /*with_config=*/false)) {
        candidates.insert(m->config_digest);
        for (const auto& l : m->layers) candidates.insert(l.digest);
      }
      json doc = std::move(idx->first);
      json& ms = doc["manifests"];
      json kept = json::array();
      std::vector<index_entry> remaining;
      for (const auto& e : idx->second) {
        if (e.digest == digest) continue;
        kept.push_back(ms[e.pos]);
        remaining.push_back(e);
      }
      ms = std::move(kept);
      if (auto w = layout_.write_index(doc); !w) return sys_error(errno);

      // Blobs still used by other images stay. If any other manifest cannot be read we do
      // not know what it uses, so nothing is deleted (logged; `verify` finds the damage).
      bool gc = true;
      for (const auto& e : remaining) {
        candidates.erase(e.digest);
        auto m = layout_.load_manifest(e.digest, e.size, /*with_config=*/false);
        if (!m) {
          gc = false;
          break;
        }
        candidates.erase(m->config_digest);
        for (const auto& l : m->layers) candidates.erase(l.digest);
      }
      if (gc) {
        layout_.remove_blobs(candidates);
      } else {
        log_(log_level::warning, "image store: remove " + std::string(digest) +
                                     ": another image is unreadable; blobs kept");
      }
      cache_.remove(std::string(digest.substr(7)));
      return {};
    });
  }

 private:
  template <class Fn>
  auto guard(Fn&& fn) const -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::bad_alloc&) {
      log_(log_level::error, "image store: out of memory");
    } catch (const std::exception& e) {
      log_(log_level::error, std::string("image store: unexpected exception: ") + e.what());
    } catch (...) {
      log_(log_level::error, "image store: unexpected exception");
    }
    return store_error(errc::io_error);
  }

  detail::image_layout layout_;
  detail::rootfs_cache cache_;
  bool read_only_;
  detail::store_logger log_;

 public:
  void set_unpack_limits(detail::unpack_limits l) noexcept { cache_.set_limits(l); }
};

// Creates (writable) or opens (read-only) the store's directories and files.
result<std::shared_ptr<image_store>> open_store(const image_store_options& options,
                                                const detail::store_logger& log) {
  auto fail = [&](const std::string& what, const error_code& ec) -> error_code {
    log(log_level::error, "image store: " + what + ": " + ec.message());
    if (!detail::is_system_error(ec)) return ec;
    if (ec.value() == ENOENT && options.read_only) return store_error(errc::not_found);
    if (ec.value() == ELOOP || ec.value() == ENOTDIR) return store_error(errc::corrupt);
    auto mapped = detail::to_store_error(ec);
    return mapped == store_error(errc::permission_denied) ? mapped : store_error(errc::io_error);
  };
  const bool rw = !options.read_only;
  auto root = detail::open_store_root(options.root, rw, 0755);
  if (!root) {
    if (root.error() == store_error(errc::invalid_argument)) return root.error();
    return fail("open " + options.root.string(), root.error());
  }
  auto dir = [&](int parent, const std::string& name) {
    return rw ? detail::ensure_dir_at(parent, name, 0755) : detail::open_dir_at(parent, name);
  };
  auto layout = dir(root->get(), "layout");
  if (!layout) return fail("open layout/", layout.error());
  auto blobs_parent = dir(layout->get(), "blobs");
  if (!blobs_parent) return fail("open layout/blobs/", blobs_parent.error());
  auto blobs = dir(blobs_parent->get(), "sha256");
  if (!blobs) return fail("open layout/blobs/sha256/", blobs.error());
  auto rootfs = dir(root->get(), "rootfs");
  unique_fd rootfs_fd;
  if (rootfs) {
    rootfs_fd = std::move(*rootfs);
  } else if (rw || rootfs.error().value() != ENOENT) {
    return fail("open rootfs/", rootfs.error());
  }
  if (rw) {
    auto lock = detail::file_lock::acquire(root->get(), lock_name, true, true);
    if (!lock) return fail("lock the store", lock.error());
    struct stat st {};
    if (::fstatat(layout->get(), "oci-layout", &st, AT_SYMLINK_NOFOLLOW) != 0) {
      auto r = detail::replace_file_at(layout->get(), "oci-layout",
                                       std::string(oci::layout_file_content) + "\n", 0644);
      if (!r) return fail("write layout/oci-layout", r.error());
    }
    if (::fstatat(layout->get(), "index.json", &st, AT_SYMLINK_NOFOLLOW) != 0) {
      json empty = {
          {"schemaVersion", 2}, {"mediaType", oci::media_index}, {"manifests", json::array()}};
      auto r = detail::replace_file_at(layout->get(), "index.json", dump(empty), 0644);
      if (!r) return fail("write layout/index.json", r.error());
    }
  }
  std::filesystem::path path = options.root.lexically_normal();
  if (!path.has_filename() && path != path.root_path()) path = path.parent_path();
  auto store = std::make_shared<fs_image_store>(path, std::move(*root), std::move(*layout),
                                                std::move(*blobs), std::move(rootfs_fd),
                                                options.read_only, log);
  store->set_unpack_limits(
      {.max_bytes = options.max_unpacked_bytes, .max_entries = options.max_unpacked_entries});
  // A bad index.json is reported now rather than at the first call.
  if (auto idx = store->check_index(); !idx) return idx.error();
  return std::shared_ptr<image_store>(std::move(store));
}

}  // namespace

namespace detail::oci {

std::filesystem::path store_root_of(const image_store& store) {
  if (const auto* fs = dynamic_cast<const fs_image_store*>(&store)) return fs->root_path();
  return {};
}

}  // namespace detail::oci

result<std::shared_ptr<image_store>> open_image_store(const image_store_options& options) {
  detail::store_logger log(options.log);
  try {
    if (options.root.empty() || !options.root.is_absolute()) {
      return store_error(errc::invalid_argument);
    }
    return open_store(options, log);
  } catch (const std::exception& e) {
    log(log_level::error, std::string("image store: open: ") + e.what());
  } catch (...) {
    log(log_level::error, "image store: open: unexpected exception");
  }
  return store_error(errc::io_error);
}

}  // namespace sandbox
