// sandbox-image-build: `sandboxctl image build` alone, for the set-up (tools/setup.sh). It
// links only the rooms the image store needs (store, protocol, wire, sys), so it is ready
// after about a third of the library's compile: the set-up builds the runtime images with it
// (debootstrap and dpkg: one core, minutes) while the rest of the tree compiles, instead of
// after `sandboxctl`, which needs all of it. Not installed; users build images with
// `sandboxctl image build`, which runs the same code (cli/image_build_verb.hpp).
//
//   sandbox-image-build NAME --image-dir DIR [--package P]... [--npm P]... [-v]
//   sandbox-image-build --current NAME --image-dir DIR
//
// Exit status: 0 built (its manifest digest on stdout) or, with --current, the current
// image's digest printed; 1 the build failed, or no current image (the reason on stderr);
// 2 usage errors.
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/cli_util.hpp"
#include "cli/image_build_verb.hpp"
#include "sandbox/image_store.hpp"

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  using namespace sandboxctl;
  image_build_args b{.command = "sandbox-image-build"};
  std::string image_dir;
  bool current = false;
  po::options_description d("usage: sandbox-image-build NAME --image-dir DIR [options]");
  d.add_options()("help,h", "this help")("image-dir", po::value(&image_dir),
                                         "image store directory (required)")(
      "package", po::value(&b.packages), "Debian package (repeatable)")(
      "npm", po::value(&b.npm_packages),
      "npm package pinned to an exact version (NAME@X.Y.Z), installed with scripts disabled "
      "into /opt/npm of the image (repeatable)")(
      "current", po::bool_switch(&current),
      "print the digest of NAME's current image instead (exit 1 when there is none)")(
      "verbose,v", po::bool_switch(&b.verbose), "debug log lines on stderr")(
      "name", po::value(&b.name), "runtime name");
  po::positional_options_description pos;
  pos.add("name", 1);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(d).positional(pos).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << d << "\n";
      return exit_ok;
    }
    if (image_dir.empty()) throw usage_error("--image-dir is required");
    if (current && b.name.empty()) throw usage_error("--current: NAME missing");
    if (!current) check_image_build(b);
    auto store = sandbox::open_image_store(
        {.root = std::filesystem::absolute(image_dir), .read_only = current});
    if (!store) {
      std::cerr << "sandbox-image-build: cannot open the image store: " << store.error().message()
                << "\n";
      return exit_fail;
    }
    if (current) {
      auto digest = (*store)->current_digest(b.name);
      if (!digest) {
        std::cerr << "sandbox-image-build: " << quote_name(b.name) << ": "
                  << digest.error().message() << "\n";
        return exit_fail;
      }
      std::cout << *digest << "\n";
      return exit_ok;
    }
    return build_image(**store, b);
  } catch (const po::error& e) {
    std::cerr << "sandbox-image-build: " << e.what() << " (see --help)\n";
    return exit_usage;
  } catch (const usage_error& e) {
    std::cerr << "sandbox-image-build: " << e.what() << " (see --help)\n";
    return exit_usage;
  } catch (const std::exception& e) {
    std::cerr << "sandbox-image-build: " << e.what() << "\n";
    return exit_fail;
  }
}
