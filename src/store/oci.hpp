// OCI image-spec v1.1 names the image store and image builder share (private to src/).
//
// Annotations the store writes on each manifest descriptor in `layout/index.json`:
//   io.agent-sandbox.runtime           runtime name the image serves, e.g. "python3"
//   io.agent-sandbox.current           "true" for the image that runs for that name now,
//                                      "false" for earlier ones kept for rollback
//   org.opencontainers.image.created   RFC 3339 time the image was built or imported
//   org.opencontainers.image.ref.name  "<runtime>" on the current image, "<runtime>-<12 hex
//                                      of the digest>" on earlier ones, so OCI tools
//                                      (skopeo, umoci) can address them
// The store's own logic reads only the first three; ref.name is for humans and tools.
#pragma once

#include <filesystem>
#include <string_view>

#include "sandbox/image_store.hpp"

namespace sandbox::detail::oci {

inline constexpr std::string_view media_index = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view media_manifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view media_config = "application/vnd.oci.image.config.v1+json";
inline constexpr std::string_view media_layer_tar = "application/vnd.oci.image.layer.v1.tar";
inline constexpr std::string_view media_layer_tar_gzip =
    "application/vnd.oci.image.layer.v1.tar+gzip";

inline constexpr std::string_view annotation_runtime = "io.agent-sandbox.runtime";
inline constexpr std::string_view annotation_current = "io.agent-sandbox.current";
inline constexpr std::string_view annotation_created = "org.opencontainers.image.created";
inline constexpr std::string_view annotation_ref_name = "org.opencontainers.image.ref.name";

/// `{"imageLayoutVersion":"1.0.0"}`, the content of a layout's `oci-layout` file.
inline constexpr std::string_view layout_file_content = "{\"imageLayoutVersion\":\"1.0.0\"}";

/// True for a runtime name: 1..64 characters from `[A-Za-z0-9._-]`, starting with a letter
/// or digit (it appears in annotations and host logs, never in paths).
bool is_valid_runtime_name(std::string_view name) noexcept;

/// The root directory of `store` when it is the filesystem image store; empty otherwise.
std::filesystem::path store_root_of(const image_store& store);

}  // namespace sandbox::detail::oci
