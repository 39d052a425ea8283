// `image build` (image_build_verb.hpp).
#include "cli/image_build_verb.hpp"

#include <fmt/format.h>

#include <functional>
#include <iostream>

#include "cli/cli_util.hpp"
#include "cli/progress.hpp"
#include "store/image_build.hpp"
#include "store/oci.hpp"

namespace sandboxctl {

void check_image_build(image_build_args& args) {
  if (args.name.empty()) throw usage_error("image build: NAME missing");
  if (!sandbox::detail::oci::is_valid_runtime_name(args.name)) {
    throw usage_error(fmt::format(
        "image build: {}: not a runtime name (1-64 of A-Z a-z 0-9 . _ -, starting with a "
        "letter or digit)",
        quote_name(args.name)));
  }
  for (const auto& p : args.packages) {
    if (!sandbox::detail::is_debian_package_name(p)) {
      throw usage_error(fmt::format(
          "image build: --package {}: not a Debian package name (a-z 0-9 + - ., two or more)",
          quote_name(p)));
    }
  }
  if (args.packages.empty()) {
    if (args.name == "python3")
      args.packages = {"python3"};
    else if (args.name == "node")
      args.packages = {"nodejs"};
    else
      throw usage_error("image build: give --package for a runtime other than python3/node");
  }
  for (const auto& n : args.npm_packages) {
    if (!sandbox::detail::is_pinned_npm_package(n)) {
      throw usage_error(
          fmt::format("image build: --npm {}: not an npm package pinned to one exact version "
                      "(NAME@X.Y.Z or @SCOPE/NAME@X.Y.Z)",
                      quote_name(n)));
    }
  }
}

int build_image(sandbox::image_store& store, const image_build_args& args) {
  // Each step on stderr as it starts (a first build takes minutes): the info lines; on a
  // terminal also a status line with the package in hand and the counts.
  tty_progress status;
  std::function<void(const sandbox::image_build_progress&)> progress;
  if (status.active()) {
    progress = [&status, name = args.name](const sandbox::image_build_progress& p) {
      std::string line = fmt::format("image {}: {}", name, p.phase);
      if (p.done > 0)
        line += p.total > 0 ? fmt::format(" {}/{}", p.done, p.total) : fmt::format(" {}", p.done);
      if (!p.item.empty()) line += fmt::format(" ({})", p.item);
      status.show(line);
    };
  }
  auto digest = sandbox::build_debian_image(
      store, {.name = args.name,
              .packages = args.packages,
              .npm_packages = args.npm_packages,
              .log = status.wrap(sandbox::make_stderr_log_sink(
                  args.verbose ? sandbox::log_level::debug : sandbox::log_level::info)),
              .progress = progress});
  status.clear();
  if (!digest) {
    std::cerr << args.command << ": " << digest.error().message() << "\n";
    return exit_fail;
  }
  std::cout << *digest << "\n";
  return exit_ok;
}

}  // namespace sandboxctl
