// Internals of build_debian_image that tests exercise directly (private to src/).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "sandbox/image_store.hpp"

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

/// True for a Debian binary package name (Debian Policy 5.6.1: two or more of `a-z 0-9 + - .`,
/// starting with a letter or digit; at most 128 here).
bool is_debian_package_name(std::string_view name);

/// True for an npm package pinned to one exact version: `name@X.Y.Z` or
/// `@scope/name@X.Y.Z` (optional pre-release tag). Ranges, tags, URLs and paths are not.
bool is_pinned_npm_package(std::string_view spec);

/**
 * Turns debootstrap's and apt-get's output lines into `image_build_progress` reports.
 * debootstrap (plain mode, functions: `info`): "I: Retrieving NAME VERSION", "I: Validating
 * NAME VERSION", "I: Extracting NAME...", "I: Unpacking NAME...", "I: Configuring NAME..."; the
 * count of retrieved packages is the total for unpacking and configuring. apt-get: "N upgraded,
 * M newly installed, ..." gives the total; "Get:K URL SUITE/COMP ARCH NAME ...", dpkg's
 * "Unpacking NAME (...)" and "Setting up NAME (...)" count. Other lines are ignored.
 */
class image_build_progress_parser {
 public:
  explicit image_build_progress_parser(std::function<void(const image_build_progress&)> sink)
      : sink_(std::move(sink)) {}

  /// One line of debootstrap's output.
  void debootstrap_line(std::string_view line);
  /// One line of `apt-get install`'s output (dpkg's included).
  void apt_line(std::string_view line);

 private:
  void report(std::string_view phase, std::size_t& done, std::size_t total, std::string_view item);
  std::function<void(const image_build_progress&)> sink_;
  std::size_t retrieved_ = 0, validated_ = 0, extracted_ = 0, unpacked_ = 0, configured_ = 0;
  std::size_t apt_total_ = 0, apt_got_ = 0, apt_unpacked_ = 0, apt_set_up_ = 0;
};

}  // namespace sandbox::detail
