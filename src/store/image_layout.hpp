// The image store's OCI layout (private to src/): `layout/index.json`, the manifests and
// configs it names, and the blobs under `layout/blobs/sha256/`.
//
// Every read of a blob is checked against its digest (and size); index.json is replaced
// atomically (temp file + rename), so readers never need the store's lock. The filesystem
// image store (image_store.cpp) is built on this and on the rootfs cache (rootfs_cache.hpp),
// which unpacks the layers this verifies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sandbox/error.hpp"
#include "store/store_io.hpp"
#include "sys/unique_fd.hpp"

namespace sandbox::detail {

/// Prefix of the store's temporary files and directories (blobs, index.json, unpacks).
inline constexpr std::string_view store_tmp_prefix = ".tmp-";
/// The store's lock file, `<root>/.lock` (see `image_layout::lock_store`).
inline constexpr std::string_view store_lock_name = ".lock";
/// Largest index.json read, the store's or an imported layout's, in bytes.
inline constexpr std::size_t max_index_bytes = 16 << 20;

/// One layer descriptor of a manifest.
struct layer_desc {
  std::string digest;
  std::uint64_t size = 0;  ///< compressed, in bytes
  bool gzip = false;       ///< tar+gzip, else plain tar
};

/// A parsed, validated manifest (and, once its config is loaded, the config's facts).
struct manifest_info {
  std::string config_digest;
  std::uint64_t config_size = 0;
  std::vector<layer_desc> layers;
  std::vector<std::string> diff_ids;  ///< from the config, once loaded
  std::string config_created;         ///< config "created", if any
  /// Sum of the layers' (compressed) sizes, in bytes.
  std::uint64_t layers_size() const {
    std::uint64_t s = 0;
    for (const auto& l : layers) s += l.size;
    return s;
  }
};

/// One manifest descriptor of index.json.
struct index_entry {
  std::size_t pos = 0;  ///< position in "manifests"
  std::string media_type;
  std::string digest;
  std::uint64_t size = 0;
  std::string runtime;  ///< empty: not one of ours
  bool current = false;
  std::string created;
};

/// Reading OCI JSON documents leniently in shape, strictly in type: a missing member or one
/// of the wrong type is "absent".
namespace layout_json {

/// Member `key` of `obj`, or nullptr (also when `obj` is not an object).
const nlohmann::json* member(const nlohmann::json& obj, std::string_view key);
/// String member `key` of `obj`, or nullopt.
std::optional<std::string> string_member(const nlohmann::json& obj, std::string_view key);
/// Non-negative integer member `key` of `obj`, or nullopt.
std::optional<std::uint64_t> size_member(const nlohmann::json& obj, std::string_view key);
/// Annotation `key` of descriptor `desc`, or "" when absent.
std::string annotation(const nlohmann::json& desc, std::string_view key);
/// Reads the fields every blob reference needs (mediaType, a valid digest, size); false when
/// one is missing or malformed (the outputs are then unchanged).
bool parse_descriptor(const nlohmann::json& d, std::string& media_type, std::string& digest,
                      std::uint64_t& size);
/// `j` as the store writes it: indented by 2, invalid UTF-8 replaced, ending in a newline.
std::string dump(const nlohmann::json& j);

}  // namespace layout_json

/// True when `ec` carries an errno (system or generic category).
bool is_system_error(const boost::system::error_code& ec) noexcept;

/**
 * The store's OCI layout: the lock, index.json and the blobs, opened once by descriptor.
 *
 * Errors are logged here (one line each, "image store: ...") and returned as sandbox codes:
 * `corrupt` for damage, `digest_mismatch`, `permission_denied`, or `io_error` for the rest.
 * Thread-safety: the const members may be called concurrently; writers (`copy_blob_in`,
 * `write_index`, `remove_blobs`) are serialized by the caller with `lock_store(true)`.
 */
class image_layout {
 public:
  using json = nlohmann::json;
  using error_code = boost::system::error_code;

  /// `root`, `layout` and `blobs` are the open directories `<root_path>`, `layout/` and
  /// `layout/blobs/sha256/`.
  image_layout(std::filesystem::path root_path, unique_fd root, unique_fd layout, unique_fd blobs,
               store_logger log);

  /// The store's root directory, as opened.
  const std::filesystem::path& root_path() const noexcept { return root_path_; }
  /// The store's host log.
  const store_logger& log() const noexcept { return log_; }

  /// Logs `why` and returns `corrupt`.
  error_code corrupt(const std::string& why) const;
  /// Logs that `what` failed with `ec`; returns `ec` when it is not an errno, else
  /// `permission_denied` or `io_error`.
  error_code fail(const std::string& what, const error_code& ec) const;
  /// A source layout (of an import) that lacks a file, or holds a link or special file where
  /// a file belongs: `corrupt`; other errors as `fail`.
  error_code bad_layout(const std::string& what, const error_code& ec) const;

  /// Takes the store's flock (`<root>/.lock`): exclusive for writers, shared while an unpack
  /// is published. Blocks.
  result<file_lock> lock_store(bool exclusive) const;

  /// Reads and validates index.json: the document and its manifest descriptors.
  result<std::pair<json, std::vector<index_entry>>> read_index() const;
  /// Replaces index.json with `doc`, atomically.
  result<void> write_index(const json& doc) const;
  /// The manifest entry of `digest` in index.json; `not_found` when there is none.
  result<index_entry> find_entry(std::string_view digest) const;
  /// Adds manifest `digest` for runtime `name` to `doc` (not current), unless it is there.
  static void add_entry(json& doc, std::string_view name, const std::string& digest,
                        std::uint64_t size, const std::string& created);
  /// Makes `digest` the current image of `name` in `doc` and every other image of `name`
  /// earlier (their ref.name gets the digest's first 12 hex digits).
  static void mark_current(json& doc, std::string_view name, const std::string& digest);

  /// Reads a small blob (manifest or config, at most 4 MiB) named by `digest` from the
  /// directory `dirfd`, checking its digest, then its size.
  result<std::string> read_verified_small(int dirfd, const std::string& digest,
                                          std::uint64_t size) const;
  /// Parses a manifest: schema 2, known media types only.
  result<manifest_info> parse_manifest(const std::string& bytes) const;
  /// Reads diff_ids (one per layer) and "created" from a config into `m`.
  result<void> parse_config(const std::string& bytes, manifest_info& m) const;
  /// Loads and verifies manifest `digest` (and its config when `with_config`) from the store.
  result<manifest_info> load_manifest(const std::string& digest, std::uint64_t size,
                                      bool with_config) const;
  /// Opens a store blob and hashes it; returns the descriptor rewound to offset 0.
  result<unique_fd> open_verified_blob(const std::string& digest, std::uint64_t size) const;
  /// Copies blob `digest` from a layout's `blobs/sha256/` directory `src_sha` into the store,
  /// verifying it on the way; a verified copy already in the store is kept.
  result<void> copy_blob_in(int src_sha, const std::string& digest, std::uint64_t size);
  /// Unlinks the store blobs named by `digests` (missing ones are fine; failures are logged).
  void remove_blobs(const std::set<std::string>& digests);
  /// Removes temp files of imports that died half-way (their writers no longer hold the
  /// flock) from the blobs and layout directories.
  void remove_stale_temps();

 private:
  std::filesystem::path root_path_;
  unique_fd root_;
  unique_fd layout_;
  unique_fd blobs_;
  store_logger log_;
};

}  // namespace sandbox::detail
