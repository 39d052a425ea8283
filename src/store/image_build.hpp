// Internals of build_debian_image that tests exercise directly (private to src/).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace sandbox::detail {

/**
 * The Debian mirror debootstrap should use for `suite`: the URI of the first source that is
 * of type `deb`, lists `suite` and the `main` component, and is http(s) or file, looking in
 * `<apt_dir>/sources.list`, then the `.list` and `.sources` files of
 * `<apt_dir>/sources.list.d/` in name order (one-line and deb822 formats; `Enabled: no` paragraphs
 * skipped). Falls back to `http://deb.debian.org/debian`. Never throws.
 */
std::string find_debian_mirror(std::string_view suite,
                               const std::filesystem::path& apt_dir = "/etc/apt");

/// True for an npm package pinned to one exact version: `name@X.Y.Z` or
/// `@scope/name@X.Y.Z` (optional pre-release tag). Ranges, tags, URLs and paths are not.
bool is_pinned_npm_package(std::string_view spec);

}  // namespace sandbox::detail
