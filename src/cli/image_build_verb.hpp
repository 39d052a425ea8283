// `image build`: shared by `sandboxctl image build` (image.cpp) and the set-up's image
// builder, sandbox-image-build (image_builder/main.cpp). It needs only the image store and
// build_debian_image (the store room and below), never the runtime.
#pragma once

#include <string>
#include <vector>

#include "sandbox/image_store.hpp"

namespace sandboxctl {

/// What `image build` makes: runtime `name` from Debian packages and pinned npm packages.
struct image_build_args {
  std::string name;                       ///< runtime name (python3, node, tools, ...)
  std::vector<std::string> packages;      ///< Debian packages; python3 and node have defaults
  std::vector<std::string> npm_packages;  ///< NAME@X.Y.Z or @SCOPE/NAME@X.Y.Z
  bool verbose = false;                   ///< debug log lines on stderr
  /// What a failure on stderr begins with: the command that was run.
  std::string command = "sandboxctl: image build";
};

/// Fills the default packages (python3 → python3, node → nodejs) and checks the arguments
/// before anything is opened. Throws `usage_error`: no name, no package for another
/// runtime, an npm package not pinned to one exact version.
void check_image_build(image_build_args& args);

/// Builds the image into `store` (build_debian_image: each step as an info line on stderr;
/// on a terminal also a status line with the package and counts) and prints its manifest
/// digest on stdout. Returns `exit_ok`, or `exit_fail` with the reason on stderr.
int build_image(sandbox::image_store& store, const image_build_args& args);

}  // namespace sandboxctl
