// The filesystem image store.
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
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "core/layer_apply.hpp"
#include "core/oci.hpp"
#include "core/sha256.hpp"
#include "core/store_io.hpp"
#include "core/text_util.hpp"
#include "core/tar_reader.hpp"
#include "core/tool_process.hpp"
#include "sandbox/protocol.hpp"

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

namespace {
// A time as OCI annotations and configs write it (RFC 3339 date-time, e.g.
// 2026-11-30T01:02:03Z or with fraction and offset): digits and separators only, so that
// nothing a layout writes there reaches a terminal as anything else.
bool is_rfc3339(std::string_view t) {
  static const std::regex re(
      R"([0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2}))");
  return t.size() <= 40 && std::regex_match(t.begin(), t.end(), re);
}
}  // namespace
using json = nlohmann::json;
namespace oci = detail::oci;

const std::string kLockName = ".lock";
constexpr std::string_view kTmpPrefix = ".tmp-";
constexpr std::size_t kMaxIndexBytes = 16 << 20;
constexpr std::size_t kMaxSmallBlob = 4 << 20;  // manifests and configs
constexpr long kStaleTempAgeS = 60;

bool is_system(const error_code& ec) {
  return ec.category() == boost::system::system_category() ||
         ec.category() == boost::system::generic_category();
}

// Parsed, validated manifest.
struct layer_desc {
  std::string digest;
  std::uint64_t size = 0;
  bool gzip = false;
};
struct manifest_info {
  std::string config_digest;
  std::uint64_t config_size = 0;
  std::vector<layer_desc> layers;
  std::vector<std::string> diff_ids;  // from the config, once loaded
  std::string config_created;         // config "created", if any
  std::uint64_t layers_size() const {
    std::uint64_t s = 0;
    for (const auto& l : layers) s += l.size;
    return s;
  }
};

// One manifest descriptor of index.json.
struct index_entry {
  std::size_t pos = 0;  // position in "manifests"
  std::string media_type;
  std::string digest;
  std::uint64_t size = 0;
  std::string runtime;  // empty: not one of ours
  bool current = false;
  std::string created;
};

const json* member(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

std::optional<std::string> string_member(const json& obj, std::string_view key) {
  const json* v = member(obj, key);
  if (v == nullptr || !v->is_string()) return std::nullopt;
  return v->get<std::string>();
}

std::optional<std::uint64_t> size_member(const json& obj, std::string_view key) {
  const json* v = member(obj, key);
  if (v == nullptr || !v->is_number_unsigned()) {
    if (v != nullptr && v->is_number_integer() && v->get<std::int64_t>() >= 0) {
      return static_cast<std::uint64_t>(v->get<std::int64_t>());
    }
    return std::nullopt;
  }
  return v->get<std::uint64_t>();
}

std::string annotation(const json& desc, std::string_view key) {
  const json* a = member(desc, "annotations");
  if (a == nullptr) return {};
  return string_member(*a, key).value_or(std::string{});
}

// Checks the descriptor fields every blob reference needs.
bool parse_descriptor(const json& d, std::string& media_type, std::string& digest,
                      std::uint64_t& size) {
  auto mt = string_member(d, "mediaType");
  auto dg = string_member(d, "digest");
  auto sz = size_member(d, "size");
  if (!mt || !dg || !sz || !is_valid_blob_id(*dg)) return false;
  media_type = std::move(*mt);
  digest = std::move(*dg);
  size = *sz;
  return true;
}

std::string dump(const json& j) {
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

class fs_image_store final : public image_store {
 public:
  fs_image_store(std::filesystem::path root_path, unique_fd root, unique_fd layout, unique_fd blobs,
                 unique_fd rootfs, bool read_only, detail::store_logger log)
      : root_path_(std::move(root_path)),
        root_(std::move(root)),
        layout_(std::move(layout)),
        blobs_(std::move(blobs)),
        rootfs_(std::move(rootfs)),
        read_only_(read_only),
        log_(std::move(log)) {}

  const std::filesystem::path& root_path() const { return root_path_; }

  /// Reads and validates index.json (used once at open).
  result<void> check_index() const {
    auto idx = read_index();
    if (!idx) return idx.error();
    return {};
  }

  result<std::vector<image_info>> list() const override {
    return guard([&]() -> result<std::vector<image_info>> {
      auto idx = read_index();
      if (!idx) return idx.error();
      std::vector<image_info> out;
      for (const auto& e : idx->second) {
        if (e.runtime.empty()) continue;
        image_info info{.name = e.runtime,
                        .digest = e.digest,
                        .current = e.current,
                        .size_bytes = 0,
                        .created = e.created};
        auto m = load_manifest(e.digest, e.size, /*with_config=*/false);
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
      auto idx = read_index();
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
      auto entry = find_entry(digest);
      if (!entry) return entry.error();
      // Cheap path: hash manifest and config only; the layers were checked when unpacked.
      auto m = load_manifest(std::string(digest), entry->size, /*with_config=*/true);
      if (!m) return m.error();
      const std::string hex(digest.substr(7));
      const std::filesystem::path path = root_path_ / "rootfs" / hex;
      if (auto cached = cached_rootfs(hex); !cached) {
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
      // One unpack per image in this process; other processes race through rename below.
      std::shared_ptr<std::mutex> mu;
      {
        std::lock_guard lock(unpack_mu_);
        auto& slot = unpacking_[hex];
        if (!slot) slot = std::make_shared<std::mutex>();
        mu = slot;
      }
      std::lock_guard one(*mu);
      if (auto cached = cached_rootfs(hex); !cached) {
        return cached.error();
      } else if (*cached) {
        return path;
      }
      if (auto r = unpack(std::string(digest), *m); !r) return r.error();
      return path;
    });
  }

  result<void> verify(std::string_view digest) const override {
    return guard([&]() -> result<void> {
      if (!is_valid_blob_id(digest)) return store_error(errc::invalid_argument);
      auto entry = find_entry(digest);
      if (!entry) return entry.error();
      auto m = load_manifest(std::string(digest), entry->size, /*with_config=*/true);
      if (!m) return m.error();
      for (const auto& l : m->layers) {
        auto fd = open_verified_blob(l.digest, l.size);
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
        return fail("open layout " + layout_dir.string(), sys_error(errno));
      }
      unique_fd src(sfd);
      auto layout_file = detail::read_file_at(src.get(), "oci-layout", 64 * 1024);
      if (!layout_file) return bad_layout("cannot read oci-layout", layout_file.error());
      json lf = json::parse(*layout_file, nullptr, false);
      auto version = string_member(lf, "imageLayoutVersion");
      if (!version || version->rfind("1.", 0) != 0) {
        return corrupt("import: unsupported oci-layout version");
      }
      auto index_text = detail::read_file_at(src.get(), "index.json", kMaxIndexBytes);
      if (!index_text) return bad_layout("cannot read index.json", index_text.error());
      json index = json::parse(*index_text, nullptr, false);
      const json* manifests = member(index, "manifests");
      if (index.is_discarded() || manifests == nullptr || !manifests->is_array()) {
        return corrupt("import: index.json is not an image index");
      }
      auto src_blobs = detail::open_dir_at(src.get(), "blobs");
      if (!src_blobs) return bad_layout("cannot open blobs/", src_blobs.error());
      auto src_sha = detail::open_dir_at(src_blobs->get(), "sha256");
      if (!src_sha) return bad_layout("cannot open blobs/sha256/", src_sha.error());

      struct selected {
        std::string digest;
        std::uint64_t size;
        std::string created;
      };
      std::vector<selected> chosen;
      for (const auto& d : *manifests) {
        std::string mt, dg;
        std::uint64_t sz = 0;
        if (!parse_descriptor(d, mt, dg, sz)) return corrupt("import: bad manifest descriptor");
        if (!ref.empty() && annotation(d, oci::annotation_ref_name) != ref) continue;
        if (mt == oci::media_index) return corrupt("import: nested image indexes are unsupported");
        if (mt != oci::media_manifest) return corrupt("import: unknown media type " + detail::quote_for_message(mt));
        chosen.push_back({dg, sz, annotation(d, oci::annotation_created)});
      }
      if (chosen.empty()) {
        log_(log_level::warning, "image store: import: no manifest in " + layout_dir.string() +
                                     (ref.empty() ? "" : " with ref " + std::string(ref)));
        return store_error(errc::not_found);
      }

      auto lock = lock_store(/*exclusive=*/true);
      if (!lock) return lock.error();
      // Temp files of imports that died half-way (their writers no longer hold the flock).
      detail::remove_stale_temps(blobs_.get(), kTmpPrefix, 600, log_);
      detail::remove_stale_temps(layout_.get(), kTmpPrefix, 600, log_);
      auto idx = read_index();
      if (!idx) return idx.error();
      json doc = std::move(idx->first);
      for (auto& c : chosen) {
        // Manifest and config first (small, verified in memory), then copy every blob in.
        auto mbytes = read_verified_small(src_sha->get(), c.digest, c.size);
        if (!mbytes) return mbytes.error();
        auto m = parse_manifest(*mbytes);
        if (!m) return m.error();
        auto cbytes = read_verified_small(src_sha->get(), m->config_digest, m->config_size);
        if (!cbytes) return cbytes.error();
        if (auto r = parse_config(*cbytes, *m); !r) return r.error();
        for (const auto& l : m->layers) {
          if (auto r = copy_blob_in(src_sha->get(), l.digest, l.size); !r) return r.error();
        }
        if (auto r = copy_blob_in(src_sha->get(), m->config_digest, m->config_size); !r) {
          return r.error();
        }
        if (auto r = copy_blob_in(src_sha->get(), c.digest, c.size); !r) return r.error();
        // Shown by `image ls`: only a well-formed RFC 3339 time is kept from the layout.
        if (!is_rfc3339(c.created)) c.created = m->config_created;
        if (!is_rfc3339(c.created)) c.created = detail::rfc3339_now();
        add_entry(doc, name, c.digest, c.size, c.created);
      }
      if (auto w = write_index(doc); !w) return w.error();
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
      auto lock = lock_store(/*exclusive=*/true);
      if (!lock) return lock.error();
      auto idx = read_index();
      if (!idx) return idx.error();
      bool found = false;
      for (const auto& e : idx->second) found |= (e.runtime == name && e.digest == digest);
      if (!found) return store_error(errc::not_found);
      json doc = std::move(idx->first);
      mark_current(doc, name, std::string(digest));
      return write_index(doc);
    });
  }

  result<void> remove(std::string_view digest) override {
    return guard([&]() -> result<void> {
      if (read_only_) return store_error(errc::permission_denied);
      if (!is_valid_blob_id(digest)) return store_error(errc::invalid_argument);
      auto lock = lock_store(/*exclusive=*/true);
      if (!lock) return lock.error();
      auto idx = read_index();
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
      unique_fd in_use;
      if (rootfs_) {
        if (auto held = detail::open_dir_at(rootfs_.get(), std::string(digest.substr(7)))) {
          if (::flock(held->get(), LOCK_EX | LOCK_NB) != 0) {
            return store_error(errno == EWOULDBLOCK ? errc::busy : errc::io_error);
          }
          in_use = std::move(*held);
        }
      }
      // Which blobs the removed image uses (if its manifest is still readable).
      std::set<std::string> candidates{std::string(digest)};
      std::uint64_t msize = 0;
      for (const auto& e : idx->second) {
        if (e.digest == digest) msize = e.size;
      }
      if (auto m = load_manifest(std::string(digest), msize, /*with_config=*/false)) {
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
      if (auto w = write_index(doc); !w) return w.error();

      // Blobs still used by other images stay. If any other manifest cannot be read we do
      // not know what it uses, so nothing is deleted (logged; `verify` finds the damage).
      bool gc = true;
      for (const auto& e : remaining) {
        candidates.erase(e.digest);
        auto m = load_manifest(e.digest, e.size, /*with_config=*/false);
        if (!m) {
          gc = false;
          break;
        }
        candidates.erase(m->config_digest);
        for (const auto& l : m->layers) candidates.erase(l.digest);
      }
      if (gc) {
        for (const auto& c : candidates) {
          if (::unlinkat(blobs_.get(), c.substr(7).c_str(), 0) != 0 && errno != ENOENT) {
            log_(log_level::warning,
                 "image store: unlink blob " + c + ": " + std::string(std::strerror(errno)));
          }
        }
      } else {
        log_(log_level::warning, "image store: remove " + std::string(digest) +
                                     ": another image is unreadable; blobs kept");
      }
      remove_cache(std::string(digest.substr(7)));
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

  error_code corrupt(const std::string& why) const {
    log_(log_level::error, "image store: " + why);
    return store_error(errc::corrupt);
  }

  error_code fail(const std::string& what, const error_code& ec) const {
    log_(log_level::error, "image store: " + what + ": " + ec.message());
    if (!is_system(ec)) return ec;
    auto mapped = detail::to_store_error(ec);
    return mapped == store_error(errc::permission_denied) ? mapped : store_error(errc::io_error);
  }

  // A source layout that lacks a file, or holds a link or special file where a file belongs.
  error_code bad_layout(const std::string& what, const error_code& ec) const {
    if (is_system(ec) && (ec.value() == ENOENT || ec.value() == ELOOP || ec.value() == ENOTDIR ||
                          ec.value() == EINVAL || ec.value() == EFBIG)) {
      return corrupt("import: " + what + ": " + ec.message());
    }
    return fail("import: " + what, ec);
  }

  result<detail::file_lock> lock_store(bool exclusive) const {
    auto lock = detail::file_lock::acquire(root_.get(), kLockName, exclusive, true);
    if (!lock) return fail("lock " + (root_path_ / kLockName).string(), lock.error());
    return lock;
  }

  // Reads and validates index.json: the document and its manifest descriptors.
  result<std::pair<json, std::vector<index_entry>>> read_index() const {
    auto text = detail::read_file_at(layout_.get(), "index.json", kMaxIndexBytes);
    if (!text) {
      if (is_system(text.error()) && text.error().value() != EACCES &&
          text.error().value() != EPERM) {
        return corrupt("layout/index.json unreadable: " + text.error().message());
      }
      return fail("read layout/index.json", text.error());
    }
    json doc = json::parse(*text, nullptr, false);
    const json* ms = member(doc, "manifests");
    auto schema = size_member(doc, "schemaVersion");
    if (doc.is_discarded() || ms == nullptr || !ms->is_array() || !schema || *schema != 2) {
      return corrupt("layout/index.json is not an OCI image index");
    }
    std::vector<index_entry> entries;
    for (std::size_t i = 0; i < ms->size(); ++i) {
      const json& d = (*ms)[i];
      index_entry e;
      e.pos = i;
      if (!parse_descriptor(d, e.media_type, e.digest, e.size)) {
        return corrupt("layout/index.json holds a bad descriptor");
      }
      if (e.media_type == oci::media_manifest) {
        e.runtime = annotation(d, oci::annotation_runtime);
        if (!e.runtime.empty() && !oci::is_valid_runtime_name(e.runtime)) {
          return corrupt("layout/index.json holds a bad runtime name");
        }
        e.current = annotation(d, oci::annotation_current) == "true";
        e.created = annotation(d, oci::annotation_created);
      }
      entries.push_back(std::move(e));
    }
    return std::make_pair(std::move(doc), std::move(entries));
  }

  result<void> write_index(const json& doc) const {
    auto r = detail::replace_file_at(layout_.get(), "index.json", dump(doc), 0644);
    if (!r) return fail("write layout/index.json", r.error());
    return {};
  }

  result<index_entry> find_entry(std::string_view digest) const {
    auto idx = read_index();
    if (!idx) return idx.error();
    for (auto& e : idx->second) {
      if (e.digest == digest && e.media_type == oci::media_manifest) return e;
    }
    return store_error(errc::not_found);
  }

  static void add_entry(json& doc, std::string_view name, const std::string& digest,
                        std::uint64_t size, const std::string& created) {
    json& ms = doc["manifests"];
    for (auto& d : ms) {
      if (annotation(d, oci::annotation_runtime) == name &&
          string_member(d, "digest").value_or("") == digest) {
        return;  // already there for this runtime: keep its annotations
      }
    }
    json d = {{"mediaType", oci::media_manifest},
              {"digest", digest},
              {"size", size},
              {"annotations",
               {{std::string(oci::annotation_runtime), name},
                {std::string(oci::annotation_current), "false"},
                {std::string(oci::annotation_created), created},
                {std::string(oci::annotation_ref_name),
                 std::string(name) + "-" + digest.substr(7, 12)}}}};
    ms.push_back(std::move(d));
  }

  // Makes `digest` the current image of `name` and every other image of `name` earlier.
  static void mark_current(json& doc, std::string_view name, const std::string& digest) {
    for (auto& d : doc["manifests"]) {
      if (annotation(d, oci::annotation_runtime) != name) continue;
      const std::string dg = string_member(d, "digest").value_or("");
      const bool cur = dg == digest;
      json& a = d["annotations"];
      a[std::string(oci::annotation_current)] = cur ? "true" : "false";
      a[std::string(oci::annotation_ref_name)] =
          cur ? std::string(name) : std::string(name) + "-" + dg.substr(7, 12);
    }
  }

  // Reads a small blob (manifest/config) from `dirfd` and checks digest, then size.
  result<std::string> read_verified_small(int dirfd, const std::string& digest,
                                          std::uint64_t size) const {
    if (size > kMaxSmallBlob) return corrupt("blob " + digest + " is too large for its type");
    auto bytes = detail::read_file_at(dirfd, digest.substr(7), kMaxSmallBlob);
    if (!bytes) {
      if (is_system(bytes.error()) &&
          (bytes.error().value() == ENOENT || bytes.error().value() == ELOOP ||
           bytes.error().value() == EINVAL || bytes.error().value() == EFBIG)) {
        return corrupt("blob " + digest +
                       " missing or not a regular file: " + bytes.error().message());
      }
      return fail("read blob " + digest, bytes.error());
    }
    if ("sha256:" + detail::sha256_hex(*bytes) != digest) {
      log_(log_level::error, "image store: digest mismatch for blob " + digest);
      return store_error(errc::digest_mismatch);
    }
    if (bytes->size() != size) return corrupt("blob " + digest + " has the wrong size");
    return bytes;
  }

  // Parses a manifest: schema 2, known media types only.
  result<manifest_info> parse_manifest(const std::string& bytes) const {
    json m = json::parse(bytes, nullptr, false);
    if (m.is_discarded() || !m.is_object()) return corrupt("manifest is not JSON");
    auto schema = size_member(m, "schemaVersion");
    if (!schema || *schema != 2) return corrupt("manifest schemaVersion is not 2");
    if (auto mt = string_member(m, "mediaType"); mt && *mt != oci::media_manifest) {
      return corrupt("manifest has media type " + detail::quote_for_message(*mt));
    }
    manifest_info info;
    const json* config = member(m, "config");
    std::string mt;
    if (config == nullptr || !parse_descriptor(*config, mt, info.config_digest, info.config_size)) {
      return corrupt("manifest has no valid config descriptor");
    }
    if (mt != oci::media_config) return corrupt("unknown config media type " + detail::quote_for_message(mt));
    const json* layers = member(m, "layers");
    if (layers == nullptr || !layers->is_array()) return corrupt("manifest has no layers");
    for (const auto& l : *layers) {
      layer_desc d;
      if (!parse_descriptor(l, mt, d.digest, d.size)) return corrupt("bad layer descriptor");
      if (mt == oci::media_layer_tar) {
        d.gzip = false;
      } else if (mt == oci::media_layer_tar_gzip) {
        d.gzip = true;
      } else {
        return corrupt("unknown layer media type " + detail::quote_for_message(mt));
      }
      info.layers.push_back(std::move(d));
    }
    return info;
  }

  // Reads diff_ids (and "created") from a config into `m`.
  result<void> parse_config(const std::string& bytes, manifest_info& m) const {
    json c = json::parse(bytes, nullptr, false);
    if (c.is_discarded() || !c.is_object()) return corrupt("config is not JSON");
    const json* rootfs = member(c, "rootfs");
    const json* ids = rootfs ? member(*rootfs, "diff_ids") : nullptr;
    if (ids == nullptr || !ids->is_array() || string_member(*rootfs, "type") != "layers") {
      return corrupt("config has no rootfs.diff_ids");
    }
    m.diff_ids.clear();
    for (const auto& id : *ids) {
      if (!id.is_string() || !is_valid_blob_id(id.get<std::string>())) {
        return corrupt("config has a bad diff_id");
      }
      m.diff_ids.push_back(id.get<std::string>());
    }
    if (m.diff_ids.size() != m.layers.size()) {
      return corrupt("config lists " + std::to_string(m.diff_ids.size()) + " diff_ids for " +
                     std::to_string(m.layers.size()) + " layers");
    }
    m.config_created = string_member(c, "created").value_or("");
    return {};
  }

  // Loads and verifies the manifest `digest` (and its config when asked) from the store.
  result<manifest_info> load_manifest(const std::string& digest, std::uint64_t size,
                                      bool with_config) const {
    auto mbytes = read_verified_small(blobs_.get(), digest, size);
    if (!mbytes) return mbytes.error();
    auto m = parse_manifest(*mbytes);
    if (!m || !with_config) return m;
    auto cbytes = read_verified_small(blobs_.get(), m->config_digest, m->config_size);
    if (!cbytes) return cbytes.error();
    if (auto r = parse_config(*cbytes, *m); !r) return r.error();
    return m;
  }

  // Opens a store blob and hashes it; returns the descriptor rewound to offset 0.
  result<unique_fd> open_verified_blob(const std::string& digest, std::uint64_t size) const {
    auto fd = detail::open_regular_at(blobs_.get(), digest.substr(7));
    if (!fd) {
      if (is_system(fd.error()) && (fd.error().value() == ENOENT || fd.error().value() == ELOOP ||
                                    fd.error().value() == EINVAL)) {
        return corrupt("blob " + digest + " missing or not a regular file");
      }
      return fail("open blob " + digest, fd.error());
    }
    auto h = detail::hash_fd(fd->get());
    if (!h) return fail("read blob " + digest, h.error());
    if ("sha256:" + h->first != digest) {
      log_(log_level::error, "image store: digest mismatch for blob " + digest);
      return store_error(errc::digest_mismatch);
    }
    if (h->second != size) return corrupt("blob " + digest + " has the wrong size");
    if (::lseek(fd->get(), 0, SEEK_SET) != 0) return fail("rewind blob", sys_error(errno));
    return fd;
  }

  // Copies blob `digest` from the layout directory `src_sha` into the store, verifying it;
  // a verified copy already in the store is kept.
  result<void> copy_blob_in(int src_sha, const std::string& digest, std::uint64_t size) {
    const std::string hex = digest.substr(7);
    if (auto existing = detail::open_regular_at(blobs_.get(), hex)) {
      auto h = detail::hash_fd(existing->get());
      if (h && h->first == hex && h->second == size) return {};
    }
    auto in = detail::open_regular_at(src_sha, hex);
    if (!in) return bad_layout("blob " + digest, in.error());
    auto tmp = detail::create_temp_file_at(blobs_.get(), kTmpPrefix);
    if (!tmp) return fail("create temp blob", tmp.error());
    struct unlink_guard {
      int dir;
      std::string name;
      bool armed = true;
      ~unlink_guard() {
        if (armed) (void)::unlinkat(dir, name.c_str(), 0);
      }
    } guard{blobs_.get(), tmp->second};
    constexpr std::size_t kChunk = 1 << 20;
    std::unique_ptr<char[]> buf(new char[kChunk]);
    detail::sha256 h;
    std::uint64_t total = 0;
    for (;;) {
      auto r = detail::read_full(in->get(), buf.get(), kChunk);
      if (!r) return fail("read blob " + digest, r.error());
      if (*r == 0) break;
      total += *r;
      if (total > size) return corrupt("blob " + digest + " is larger than its descriptor");
      h.update(buf.get(), *r);
      if (auto w = detail::write_all(tmp->first.get(), buf.get(), *r); !w) {
        return fail("write blob " + digest, w.error());
      }
    }
    if ("sha256:" + h.hex_digest() != digest) {
      log_(log_level::error, "image store: import: digest mismatch for blob " + digest);
      return store_error(errc::digest_mismatch);
    }
    if (total != size) return corrupt("blob " + digest + " is smaller than its descriptor");
    if (::fchmod(tmp->first.get(), 0644) != 0 || ::fsync(tmp->first.get()) != 0) {
      return fail("finish blob " + digest, sys_error(errno));
    }
    if (::renameat(blobs_.get(), tmp->second.c_str(), blobs_.get(), hex.c_str()) != 0) {
      return fail("rename blob " + digest, sys_error(errno));
    }
    guard.armed = false;
    (void)::fsync(blobs_.get());
    return {};
  }

  // true: rootfs/<hex> is an unpacked image. A non-directory there is damage (`corrupt`).
  result<bool> cached_rootfs(const std::string& hex) const {
    if (!rootfs_) return false;
    struct stat st {};
    if (::fstatat(rootfs_.get(), hex.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return false;
      return result<bool>(boost::system::in_place_error,
                          fail("stat rootfs cache", sys_error(errno)));
    }
    if (!S_ISDIR(st.st_mode)) {
      return result<bool>(boost::system::in_place_error,
                          corrupt("rootfs/" + hex + " is not a directory"));
    }
    return true;
  }

  // Applies the layers of a verified manifest into rootfs/.tmp-<hex>-<rand>, then renames
  // that to rootfs/<hex>. Any failure removes the temp directory.
  result<void> unpack(const std::string& digest, const manifest_info& m) {
    const std::string hex = digest.substr(7);
    detail::remove_stale_temps(rootfs_.get(), kTmpPrefix, kStaleTempAgeS, log_);
    const std::string tmp = std::string(kTmpPrefix) + hex + "-" + detail::random_hex(6);
    if (::mkdirat(rootfs_.get(), tmp.c_str(), 0700) != 0) {
      return fail("mkdir rootfs/" + tmp, sys_error(errno));
    }
    struct tree_guard {
      int dir;
      std::string name;
      const detail::store_logger& log;
      bool armed = true;
      ~tree_guard() {
        if (!armed) return;
        if (auto r = detail::remove_tree_at(dir, name); !r) {
          log(log_level::warning,
              "image store: cannot remove rootfs/" + name + ": " + r.error().message());
        }
      }
    } guard{rootfs_.get(), tmp, log_};
    auto tfd = detail::open_dir_at(rootfs_.get(), tmp);
    if (!tfd) return fail("open rootfs/" + tmp, tfd.error());
    (void)::flock(tfd->get(), LOCK_EX | LOCK_NB);  // alive: stale-temp cleanup keeps out

    detail::layer_applier applier(tfd->get(), ::geteuid() == 0, unpack_limits_);
    for (std::size_t i = 0; i < m.layers.size(); ++i) {
      const layer_desc& l = m.layers[i];
      auto fd = open_verified_blob(l.digest, l.size);
      if (!fd) return fd.error();
      std::unique_ptr<detail::byte_source> raw;
      std::unique_ptr<detail::gunzip_source> gz;
      detail::fd_source plain(fd->get());
      detail::byte_source* src = &plain;
      if (l.gzip) {
        auto started = detail::gunzip_source::start(fd->get());
        if (!started) {
          if (started.error() == store_error(errc::unsupported)) {
            log_(log_level::error, "image store: gzip layer but no gzip program on this host");
            return started.error();
          }
          return fail("start gzip", started.error());
        }
        gz = std::move(*started);
        src = gz.get();
      }
      detail::hashing_source hashed(*src);
      detail::tar_reader tar(hashed);
      auto applied = applier.apply(tar);
      if (!applied) {
        const std::string why = "layer " + l.digest + " of " + digest + ": " +
                                applier.error_detail() +
                                (gz ? " (gzip: " + gz->diagnostics() + ")" : "");
        if (applied.error() == store_error(errc::corrupt)) return corrupt(why);
        log_(log_level::error, "image store: " + why);
        return applied.error();
      }
      auto diff = hashed.finish();
      if (!diff) {
        if (diff.error() == store_error(errc::corrupt)) {
          return corrupt("layer " + l.digest +
                         " does not decompress: " + (gz ? gz->diagnostics() : std::string()));
        }
        return fail("read layer " + l.digest, diff.error());
      }
      if ("sha256:" + *diff != m.diff_ids[i]) {
        log_(log_level::error, "image store: layer " + l.digest + " uncompressed to sha256:" +
                                   *diff + ", config says " + m.diff_ids[i]);
        return store_error(errc::digest_mismatch);
      }
    }
    // The temp dir was made 0700 so nobody sees it half-built; an image whose layers do not
    // name the root ("./", common in Docker-built layers) gets 0755 (finish() below applies a
    // mode a layer did give it): sandboxes run as other users must be able to enter it.
    if (::fchmod(tfd->get(), 0755) != 0) return fail("chmod rootfs/" + tmp, sys_error(errno));
    if (auto r = applier.finish(); !r) {
      return fail("finish rootfs of " + digest + ": " + applier.error_detail(), r.error());
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
    auto lock = lock_store(/*exclusive=*/false);
    if (!lock) return lock.error();
    auto still = find_entry(digest);
    if (!still) return still.error();
    int r = ::renameat2(rootfs_.get(), tmp.c_str(), rootfs_.get(), hex.c_str(), RENAME_NOREPLACE);
    if (r != 0 && errno == EINVAL) {
      r = ::renameat(rootfs_.get(), tmp.c_str(), rootfs_.get(), hex.c_str());  // no NOREPLACE
    }
    if (r != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY) {
        // Another process unpacked it first; ours goes (guard), theirs is used.
        auto cached = cached_rootfs(hex);
        if (!cached) return cached.error();
        if (*cached) return {};
      }
      return fail("rename rootfs into place", sys_error(errno));
    }
    guard.armed = false;
    (void)::fsync(rootfs_.get());
    return {};
  }

  // Deletes rootfs/<hex>: renamed aside first so it vanishes at once, then removed.
  void remove_cache(const std::string& hex) {
    if (!rootfs_) return;
    const std::string aside = std::string(kTmpPrefix) + "del-" + hex + "-" + detail::random_hex(6);
    if (::renameat(rootfs_.get(), hex.c_str(), rootfs_.get(), aside.c_str()) != 0) {
      if (errno != ENOENT) {
        log_(log_level::warning, "image store: cannot move rootfs/" + hex +
                                     " aside: " + std::string(std::strerror(errno)));
      }
      return;
    }
    // Held while deleting, so a concurrent stale-temp sweep leaves this one to us.
    auto held = detail::open_dir_at(rootfs_.get(), aside);
    if (held) (void)::flock(held->get(), LOCK_EX | LOCK_NB);
    if (auto r = detail::remove_tree_at(rootfs_.get(), aside); !r) {
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
  detail::unpack_limits unpack_limits_;  ///< per image, all layers together

 public:
  void set_unpack_limits(detail::unpack_limits l) noexcept { unpack_limits_ = l; }

 private:
  detail::store_logger log_;
  std::mutex unpack_mu_;
  std::map<std::string, std::shared_ptr<std::mutex>> unpacking_;
};

// Creates (writable) or opens (read-only) the store's directories and files.
result<std::shared_ptr<image_store>> open_store(const image_store_options& options,
                                                const detail::store_logger& log) {
  auto fail = [&](const std::string& what, const error_code& ec) -> error_code {
    log(log_level::error, "image store: " + what + ": " + ec.message());
    if (!is_system(ec)) return ec;
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
    auto lock = detail::file_lock::acquire(root->get(), kLockName, true, true);
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
  store->set_unpack_limits({.max_bytes = options.max_unpacked_bytes,
                            .max_entries = options.max_unpacked_entries});
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
