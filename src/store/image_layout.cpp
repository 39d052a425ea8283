// The image store's OCI layout (image_layout.hpp): index.json, manifests, configs and
// verified blobs.
#include "store/image_layout.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "protocol/sha256.hpp"
#include "protocol/text_util.hpp"
#include "sandbox/protocol.hpp"
#include "store/oci.hpp"

namespace sandbox::detail {

namespace {

using json = nlohmann::json;
using boost::system::error_code;
using namespace layout_json;

const std::string lock_name(store_lock_name);
constexpr std::size_t max_small_blob = 4 << 20;  // manifests and configs

}  // namespace

namespace layout_json {

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

}  // namespace layout_json

bool is_system_error(const error_code& ec) noexcept {
  return ec.category() == boost::system::system_category() ||
         ec.category() == boost::system::generic_category();
}

image_layout::image_layout(std::filesystem::path root_path, unique_fd root, unique_fd layout,
                           unique_fd blobs, store_logger log)
    : root_path_(std::move(root_path)),
      root_(std::move(root)),
      layout_(std::move(layout)),
      blobs_(std::move(blobs)),
      log_(std::move(log)) {}

error_code image_layout::corrupt(const std::string& why) const {
  log_(log_level::error, "image store: " + why);
  return store_error(errc::corrupt);
}

error_code image_layout::fail(const std::string& what, const error_code& ec) const {
  log_(log_level::error, "image store: " + what + ": " + ec.message());
  if (!is_system_error(ec)) return ec;
  auto mapped = to_store_error(ec);
  return mapped == store_error(errc::permission_denied) ? mapped : store_error(errc::io_error);
}

// A source layout that lacks a file, or holds a link or special file where a file belongs.
error_code image_layout::bad_layout(const std::string& what, const error_code& ec) const {
  if (is_system_error(ec) &&
      (ec.value() == ENOENT || ec.value() == ELOOP || ec.value() == ENOTDIR ||
       ec.value() == EINVAL || ec.value() == EFBIG)) {
    return corrupt("import: " + what + ": " + ec.message());
  }
  return fail("import: " + what, ec);
}

result<file_lock> image_layout::lock_store(bool exclusive) const {
  auto lock = file_lock::acquire(root_.get(), lock_name, exclusive, true);
  if (!lock) return fail("lock " + (root_path_ / lock_name).string(), lock.error());
  return lock;
}

// Reads and validates index.json: the document and its manifest descriptors.
result<std::pair<json, std::vector<index_entry>>> image_layout::read_index() const {
  auto text = read_file_at(layout_.get(), "index.json", max_index_bytes);
  if (!text) {
    if (is_system_error(text.error()) && text.error().value() != EACCES &&
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

result<void> image_layout::write_index(const json& doc) const {
  auto r = replace_file_at(layout_.get(), "index.json", dump(doc), 0644);
  if (!r) return fail("write layout/index.json", r.error());
  return {};
}

result<index_entry> image_layout::find_entry(std::string_view digest) const {
  auto idx = read_index();
  if (!idx) return idx.error();
  for (auto& e : idx->second) {
    if (e.digest == digest && e.media_type == oci::media_manifest) return e;
  }
  return store_error(errc::not_found);
}

void image_layout::add_entry(json& doc, std::string_view name, const std::string& digest,
                             std::uint64_t size, const std::string& created) {
  json& ms = doc["manifests"];
  for (auto& d : ms) {
    if (annotation(d, oci::annotation_runtime) == name &&
        string_member(d, "digest").value_or("") == digest) {
      return;  // already there for this runtime: keep its annotations
    }
  }
  json d = {
      {"mediaType", oci::media_manifest},
      {"digest", digest},
      {"size", size},
      {"annotations",
       {{std::string(oci::annotation_runtime), name},
        {std::string(oci::annotation_current), "false"},
        {std::string(oci::annotation_created), created},
        {std::string(oci::annotation_ref_name), std::string(name) + "-" + digest.substr(7, 12)}}}};
  ms.push_back(std::move(d));
}

// Makes `digest` the current image of `name` and every other image of `name` earlier.
void image_layout::mark_current(json& doc, std::string_view name, const std::string& digest) {
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
result<std::string> image_layout::read_verified_small(int dirfd, const std::string& digest,
                                                      std::uint64_t size) const {
  if (size > max_small_blob) return corrupt("blob " + digest + " is too large for its type");
  auto bytes = read_file_at(dirfd, digest.substr(7), max_small_blob);
  if (!bytes) {
    if (is_system_error(bytes.error()) &&
        (bytes.error().value() == ENOENT || bytes.error().value() == ELOOP ||
         bytes.error().value() == EINVAL || bytes.error().value() == EFBIG)) {
      return corrupt("blob " + digest +
                     " missing or not a regular file: " + bytes.error().message());
    }
    return fail("read blob " + digest, bytes.error());
  }
  if ("sha256:" + sha256_hex(*bytes) != digest) {
    log_(log_level::error, "image store: digest mismatch for blob " + digest);
    return store_error(errc::digest_mismatch);
  }
  if (bytes->size() != size) return corrupt("blob " + digest + " has the wrong size");
  return bytes;
}

// Parses a manifest: schema 2, known media types only.
result<manifest_info> image_layout::parse_manifest(const std::string& bytes) const {
  json m = json::parse(bytes, nullptr, false);
  if (m.is_discarded() || !m.is_object()) return corrupt("manifest is not JSON");
  auto schema = size_member(m, "schemaVersion");
  if (!schema || *schema != 2) return corrupt("manifest schemaVersion is not 2");
  if (auto mt = string_member(m, "mediaType"); mt && *mt != oci::media_manifest) {
    return corrupt("manifest has media type " + quote_for_message(*mt));
  }
  manifest_info info;
  const json* config = member(m, "config");
  std::string mt;
  if (config == nullptr || !parse_descriptor(*config, mt, info.config_digest, info.config_size)) {
    return corrupt("manifest has no valid config descriptor");
  }
  if (mt != oci::media_config) return corrupt("unknown config media type " + quote_for_message(mt));
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
      return corrupt("unknown layer media type " + quote_for_message(mt));
    }
    info.layers.push_back(std::move(d));
  }
  return info;
}

// Reads diff_ids (and "created") from a config into `m`.
result<void> image_layout::parse_config(const std::string& bytes, manifest_info& m) const {
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
result<manifest_info> image_layout::load_manifest(const std::string& digest, std::uint64_t size,
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
result<unique_fd> image_layout::open_verified_blob(const std::string& digest,
                                                   std::uint64_t size) const {
  auto fd = open_regular_at(blobs_.get(), digest.substr(7));
  if (!fd) {
    if (is_system_error(fd.error()) &&
        (fd.error().value() == ENOENT || fd.error().value() == ELOOP ||
         fd.error().value() == EINVAL)) {
      return corrupt("blob " + digest + " missing or not a regular file");
    }
    return fail("open blob " + digest, fd.error());
  }
  auto h = hash_fd(fd->get());
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
result<void> image_layout::copy_blob_in(int src_sha, const std::string& digest,
                                        std::uint64_t size) {
  const std::string hex = digest.substr(7);
  if (auto existing = open_regular_at(blobs_.get(), hex)) {
    auto h = hash_fd(existing->get());
    if (h && h->first == hex && h->second == size) return {};
  }
  auto in = open_regular_at(src_sha, hex);
  if (!in) return bad_layout("blob " + digest, in.error());
  auto tmp = create_temp_file_at(blobs_.get(), store_tmp_prefix);
  if (!tmp) return fail("create temp blob", tmp.error());
  struct unlink_guard {
    int dir;
    std::string name;
    bool armed = true;
    ~unlink_guard() {
      if (armed) (void)::unlinkat(dir, name.c_str(), 0);
    }
  } guard{blobs_.get(), tmp->second};
  constexpr std::size_t chunk_size = 1 << 20;
  std::unique_ptr<char[]> buf(new char[chunk_size]);
  sha256 h;
  std::uint64_t total = 0;
  for (;;) {
    auto r = read_full(in->get(), buf.get(), chunk_size);
    if (!r) return fail("read blob " + digest, r.error());
    if (*r == 0) break;
    total += *r;
    if (total > size) return corrupt("blob " + digest + " is larger than its descriptor");
    h.update(buf.get(), *r);
    if (!write_all(tmp->first.get(), buf.get(), *r)) {
      return fail("write blob " + digest, sys_error(errno));
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

void image_layout::remove_blobs(const std::set<std::string>& digests) {
  for (const auto& c : digests) {
    if (::unlinkat(blobs_.get(), c.substr(7).c_str(), 0) != 0 && errno != ENOENT) {
      log_(log_level::warning,
           "image store: unlink blob " + c + ": " + std::string(std::strerror(errno)));
    }
  }
}

void image_layout::remove_stale_temps() {
  detail::remove_stale_temps(blobs_.get(), store_tmp_prefix, 600, log_);
  detail::remove_stale_temps(layout_.get(), store_tmp_prefix, 600, log_);
}

}  // namespace sandbox::detail
