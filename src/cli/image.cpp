// `sandboxctl image`: the image store (build, import, ls, current, use, verify, rm).
#include <filesystem>
#include <iostream>

#include "cli/cli_util.hpp"
#include "cli/image_build_verb.hpp"
#include "cli/verbs.hpp"

namespace sandboxctl {

int cmd_image(const std::vector<std::string>& args) {
  common_flags c;
  std::string verb, a1, a2, ref;
  std::vector<std::string> packages, npm_packages;
  auto d = common_options(c);
  d.add_options()("verb", po::value(&verb))("a1", po::value(&a1))("a2", po::value(&a2))(
      "ref", po::value(&ref), "import only manifests with this ref name")(
      "package", po::value(&packages), "Debian package for `image build` (repeatable)")(
      "npm", po::value(&npm_packages),
      "npm package pinned to an exact version (NAME@X.Y.Z) for `image build`, installed "
      "with scripts disabled into /opt/npm of the image (repeatable)");
  po::positional_options_description pos;
  pos.add("verb", 1).add("a1", 1).add("a2", 1);
  parse(args, d, pos);
  auto fail = [](const char* what, const boost::system::error_code& ec) {
    std::cerr << "sandboxctl: image " << what << ": " << ec.message() << "\n";
    return exit_fail;
  };
  if (verb == "build") {
    image_build_args b{
        .name = a1, .packages = packages, .npm_packages = npm_packages, .verbose = c.verbose};
    check_image_build(b);
    return build_image(*open_images(c), b);
  }
  if (verb == "import") {
    if (a1.empty() || a2.empty()) throw usage_error("image import: LAYOUT_DIR and NAME needed");
    auto store = open_images(c);
    auto digest = store->import_layout(std::filesystem::absolute(a1), a2, ref);
    if (!digest) return fail("import", digest.error());
    std::cout << *digest << "\n";
    return exit_ok;
  }
  if (verb == "ls") {
    auto list = open_images(c, true)->list();
    if (!list) return fail("ls", list.error());
    for (const auto& i : *list) {
      std::cout << fmt::format("{:<10} {} {:>10} {} {}\n", i.name, i.digest, i.size_bytes,
                               i.created, i.current ? "current" : "");
    }
    return exit_ok;
  }
  if (verb == "current") {
    if (a1.empty()) throw usage_error("image current: NAME missing");
    auto d2 = open_images(c, true)->current_digest(a1);
    if (!d2) return fail("current", d2.error());
    std::cout << *d2 << "\n";
    return exit_ok;
  }
  if (verb == "use") {
    if (a1.empty() || a2.empty()) throw usage_error("image use: NAME and DIGEST needed");
    auto r = open_images(c)->set_current(a1, a2);
    if (!r) return fail("use", r.error());
    return exit_ok;
  }
  if (verb == "verify") {
    if (a1.empty()) throw usage_error("image verify: DIGEST or NAME missing");
    auto store = open_images(c, true);
    std::string digest = a1;
    if (a1.rfind("sha256:", 0) != 0) {
      auto cur = store->current_digest(a1);
      if (!cur) return fail("verify", cur.error());
      digest = *cur;
    }
    auto r = store->verify(digest);
    if (!r) return fail("verify", r.error());
    std::cout << digest << ": ok\n";
    return exit_ok;
  }
  if (verb == "rm") {
    auto r = open_images(c)->remove(a1);
    if (!r) return fail("rm", r.error());
    return exit_ok;
  }
  throw usage_error("image: expected build, import, ls, current, use, verify or rm");
}

}  // namespace sandboxctl
