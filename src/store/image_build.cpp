// build_debian_image: debootstrap → scrub → one tar layer → OCI layout → image store.
//
// Steps, in order, each with its reason:
//  1. Validate the spec (names become debootstrap arguments: nothing may look like an
//     option), require root (debootstrap chroots and mknods) and /usr/sbin/debootstrap.
//  2. Make a private work dir (0700): `<store root>/.build-<random>` by default, or a fresh
//     subdirectory of `spec.work_dir`. It is removed at the end, also on failure, after
//     detaching any mount debootstrap left inside it (so no host /proc or /dev is emptied).
//  3. debootstrap --variant=minbase <suite> <dir> <mirror>, spawned without a shell, with a
//     minimal environment and a 30-minute limit; its output goes to host logs. Release
//     files are checked against the host's Debian keyring (default). Then the packages:
//     `chroot <dir> apt-get update` and `apt-get install --no-install-recommends -- <pkgs>`
//     (apt checks them against the tree's keyring, which debootstrap verified).
//  4. Scrub what debootstrap copies from the host or leaves behind: /etc/resolv.conf and
//     /etc/hostname get harmless contents, apt caches and lists, logs, *-old backups, and
//     device nodes in /dev are removed. Every path is opened inside the tree without
//     following links out of it.
//  5. Pack the tree with GNU tar as one uncompressed layer: names sorted, numeric owners,
//     PAX format without atime/ctime, one filesystem, no xattrs/ACLs/SELinux labels.
//  6. Write config (architecture, os, rootfs.diff_ids, created) and manifest into an OCI
//     layout in the work dir and import it with `image_store::import_layout`, which verifies
//     every blob and makes the image current.
#include "store/image_build.hpp"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "protocol/sha256.hpp"
#include "sandbox/image_store.hpp"
#include "store/layer_apply.hpp"
#include "store/oci.hpp"
#include "store/store_io.hpp"
#include "sys/tool_process.hpp"

namespace sandbox {
namespace {

using boost::system::error_code;
using detail::store_error;
using detail::sys_error;
using detail::unique_fd;
using json = nlohmann::json;
namespace oci = detail::oci;

constexpr auto debootstrap_timeout = std::chrono::minutes(30);
constexpr auto tar_timeout = std::chrono::minutes(15);
constexpr std::string_view default_mirror = "http://deb.debian.org/debian";

}  // namespace

/// Debian Policy 5.6.1: at least two characters of lower-case letters, digits, `+`, `-` and
/// `.`, starting with a letter or digit (and at most 128 here).
bool detail::is_debian_package_name(std::string_view p) {
  if (p.size() < 2 || p.size() > 128) return false;
  auto lower_alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_alnum(p.front())) return false;
  return std::all_of(p.begin(), p.end(),
                     [&](char c) { return lower_alnum(c) || c == '+' || c == '-' || c == '.'; });
}

/// `name@X.Y.Z` or `@scope/name@X.Y.Z` (an exact version, optionally with a pre-release
/// tag): a pinned npm package. Ranges, tags, URLs, paths and git specs are refused.
bool detail::is_pinned_npm_package(std::string_view p) {
  if (p.size() < 7 || p.size() > 214) return false;
  const auto at = p.rfind('@');
  if (at == std::string_view::npos || at == 0) return false;
  std::string_view name = p.substr(0, at), version = p.substr(at + 1);
  auto name_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
  };
  auto plain = [&](std::string_view n) {
    return !n.empty() && n.front() != '.' && n.front() != '_' &&
           std::all_of(n.begin(), n.end(), name_char);
  };
  if (name.front() == '@') {
    const auto slash = name.find('/');
    if (slash == std::string_view::npos || !plain(name.substr(1, slash - 1)) ||
        !plain(name.substr(slash + 1))) {
      return false;
    }
  } else if (!plain(name)) {
    return false;
  }
  // X.Y.Z[-pre]: three numeric parts, then an optional [0-9A-Za-z.-] tag.
  int dots = 0;
  std::size_t i = 0;
  bool digit = false;
  for (; i < version.size() && version[i] != '-'; ++i) {
    if (version[i] == '.') {
      if (!digit) return false;
      ++dots;
      digit = false;
    } else if (version[i] >= '0' && version[i] <= '9') {
      digit = true;
    } else {
      return false;
    }
  }
  if (dots != 2 || !digit) return false;
  if (i < version.size()) {
    auto tag = version.substr(i + 1);
    if (tag.empty()) return false;
    for (char c : tag) {
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '-')) {
        return false;
      }
    }
  }
  return true;
}

namespace {

bool is_suite_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(s.front())) return false;
  return std::all_of(s.begin(), s.end(),
                     [&](char c) { return alnum(c) || c == '-' || c == '.' || c == '_'; });
}

bool is_mirror_url(std::string_view u) {
  if (u.size() > 2048) return false;
  if (!(u.rfind("http://", 0) == 0 || u.rfind("https://", 0) == 0 || u.rfind("file:/", 0) == 0)) {
    return false;
  }
  return std::none_of(u.begin(), u.end(),
                      [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; });
}

std::vector<std::string> words(std::string_view line) {
  std::vector<std::string> out;
  std::istringstream in{std::string(line)};
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool contains(const std::vector<std::string>& v, std::string_view x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// One-line format: "deb [options] uri suite component…".
std::string mirror_from_list(std::istream& in, std::string_view suite) {
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    auto w = words(line);
    if (w.size() < 4 || w[0] != "deb") continue;
    std::size_t i = 1;
    if (w[i].front() == '[') {
      while (i < w.size() && w[i].back() != ']') ++i;
      ++i;
    }
    if (i + 2 >= w.size()) continue;  // needs uri, suite and a component
    const std::string& uri = w[i];
    const std::string& s = w[i + 1];
    std::vector<std::string> comps(w.begin() + static_cast<long>(i) + 2, w.end());
    if (s == suite && contains(comps, "main") && is_mirror_url(uri)) return uri;
  }
  return {};
}

// deb822 format: paragraphs of "Field: value" with indented continuation lines.
std::string mirror_from_sources(std::istream& in, std::string_view suite) {
  std::map<std::string, std::string> para;
  std::string last;
  auto check = [&]() -> std::string {
    auto lower = [](std::string s) {
      std::transform(s.begin(), s.end(), s.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      return s;
    };
    auto types = words(para["types"]);
    auto uris = words(para["uris"]);
    auto suites = words(para["suites"]);
    auto comps = words(para["components"]);
    const auto enabled_words = words(lower(para["enabled"]));
    const std::string enabled = enabled_words.empty() ? "" : enabled_words.front();
    if (enabled == "no" || !contains(types, "deb") || !contains(suites, suite) ||
        !contains(comps, "main")) {
      return {};
    }
    for (const auto& u : uris) {
      if (is_mirror_url(u)) return u;
    }
    return {};
  };
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '#') continue;
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (auto m = check(); !m.empty()) return m;
      para.clear();
      last.clear();
      continue;
    }
    if ((line[0] == ' ' || line[0] == '\t') && !last.empty()) {
      para[last] += " " + line;
      continue;
    }
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    std::transform(key.begin(), key.end(), key.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    para[key] = line.substr(colon + 1);
    last = key;
  }
  return check();
}

// Unescapes a mountinfo path field ("\040" → ' ').
std::string unescape_mount_path(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() &&
        std::all_of(s.begin() + static_cast<long>(i) + 1, s.begin() + static_cast<long>(i) + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Lazily detaches every mount at or below `dir` (deepest first): debootstrap mounts /proc
// and /sys inside its target and may leave them behind when it fails.
void detach_mounts_below(const std::string& dir, const detail::store_logger& log) {
  std::ifstream in("/proc/self/mountinfo");
  std::vector<std::string> points;
  for (std::string line; std::getline(in, line);) {
    auto w = words(line);
    if (w.size() < 5) continue;
    std::string mp = unescape_mount_path(w[4]);
    if (mp == dir || mp.rfind(dir + "/", 0) == 0) points.push_back(mp);
  }
  std::sort(points.begin(), points.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  for (const auto& mp : points) {
    if (::umount2(mp.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) != 0) {
      log(log_level::warning,
          "image build: umount2(" + mp + ", MNT_DETACH): " + std::string(std::strerror(errno)));
    }
  }
}

// The path of an open descriptor (for mountinfo comparisons).
std::string fd_path(int fd) {
  char buf[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<std::size_t>(n));
}

std::string host_architecture() {
#if defined(__x86_64__)
  return "amd64";
#elif defined(__aarch64__)
  return "arm64";
#elif defined(__i386__)
  return "386";
#elif defined(__powerpc64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return "ppc64le";
#elif defined(__s390x__)
  return "s390x";
#elif defined(__riscv) && __riscv_xlen == 64
  return "riscv64";
#else
  return "unknown";
#endif
}

class builder {
 public:
  builder(image_store& store, const debian_image_spec& spec)
      : store_(store), spec_(spec), log_(spec.log), progress_(spec.progress) {}

  ~builder() { cleanup(); }

  result<std::string> run() {
    // 1. Inputs, privileges, tools.
    // Each refusal says which input it was (the caller sees only invalid_argument).
    auto refuse = [&](std::string what) {
      log_(log_level::error, "image build: " + what);
      return store_error(errc::invalid_argument);
    };
    if (!oci::is_valid_runtime_name(spec_.name)) {
      return refuse(
          "not a runtime name (1-64 of A-Z a-z 0-9 . _ -, starting with a letter "
          "or digit)");
    }
    if (!is_suite_name(spec_.suite)) return refuse("not a Debian suite name");
    if (!spec_.mirror.empty() && !is_mirror_url(spec_.mirror)) {
      return refuse("the mirror is not an http(s) or file URL");
    }
    for (const auto& p : spec_.packages) {
      if (!detail::is_debian_package_name(p)) return refuse("not a Debian package name");
    }
    for (const auto& p : spec_.npm_packages) {
      if (!detail::is_pinned_npm_package(p)) return refuse("an npm package is not pinned");
    }
    if (::geteuid() != 0) {
      log_(log_level::warning, "image build: debootstrap needs root");
      return store_error(errc::permission_denied);
    }
    const std::string debootstrap = detail::find_program({"/usr/sbin/debootstrap"});
    if (debootstrap.empty()) {
      log_(log_level::warning, "image build: /usr/sbin/debootstrap not found");
      return store_error(errc::unsupported);
    }
    const std::string tar = detail::find_program({"/usr/bin/tar", "/bin/tar"});
    if (tar.empty()) {
      log_(log_level::warning, "image build: GNU tar not found");
      return store_error(errc::unsupported);
    }
    const std::string mirror =
        spec_.mirror.empty() ? detail::find_debian_mirror(spec_.suite) : spec_.mirror;

    // 2. Work dir.
    if (auto r = make_work_dir(); !r) return r.error();

    // 3. debootstrap.
    const auto started = std::chrono::steady_clock::now();
    std::vector<std::string> argv = {debootstrap, "--variant=minbase"};
    const std::string target = work_path_ + "/rootfs";
    argv.insert(argv.end(), {spec_.suite, target, mirror});
    std::vector<std::string> env = detail::minimal_tool_env();
    env.push_back("DEBIAN_FRONTEND=noninteractive");
    env.push_back("HOME=/root");
    // A host that reaches its mirror through a proxy needs it passed on; nothing else is.
    for (const char* var : {"http_proxy", "https_proxy", "no_proxy"}) {
      if (const char* v = std::getenv(var)) env.push_back(std::string(var) + "=" + v);
    }
    log_(log_level::info, "image build: debootstrap " + spec_.suite + " from " + mirror);
    auto boot = detail::run_tool(argv, env, debootstrap_timeout, -1, 16 * 1024,
                                 line_sink(&detail::image_build_progress_parser::debootstrap_line));
    detach_mounts_below(target, log_);
    if (!boot) return fail("run debootstrap", boot.error());
    if (!boot->ok()) {
      log_(log_level::error, "image build: debootstrap failed (" + boot->describe() +
                                 "); last output:\n" + boot->output);
      return store_error(errc::io_error);
    }
    log_(log_level::debug, "image build: debootstrap output (tail):\n" + boot->output);

    // 3b. The packages, with apt inside the new tree. Not debootstrap's --include: that
    //     resolves dependencies itself and configures everything as "base" packages, which
    //     fails for larger sets (chromium's desktop dependencies); apt installs exactly the
    //     dependency closure without recommends, like any Debian system would.
    if (!spec_.packages.empty()) {
      const std::string chroot = detail::find_program({"/usr/sbin/chroot", "/usr/bin/chroot"});
      if (chroot.empty()) {
        log_(log_level::warning, "image build: chroot not found");
        return store_error(errc::unsupported);
      }
      std::vector<std::string> install = {chroot,  target,    "/usr/bin/apt-get",        "install",
                                          "--yes", "--quiet", "--no-install-recommends", "--"};
      install.insert(install.end(), spec_.packages.begin(), spec_.packages.end());
      for (const auto& step :
           {std::vector<std::string>{chroot, target, "/usr/bin/apt-get", "update", "--quiet"},
            install}) {
        log_(log_level::info, "image build: apt-get " + step[3] + " in the new tree");
        // Progress from the install's lines only (update's are index downloads).
        auto apt = detail::run_tool(step, env, debootstrap_timeout, -1, 16 * 1024,
                                    step[3] == "install"
                                        ? line_sink(&detail::image_build_progress_parser::apt_line)
                                        : detail::tool_line_sink{});
        detach_mounts_below(target, log_);
        if (!apt) return fail("run apt-get", apt.error());
        if (!apt->ok()) {
          log_(log_level::error, "image build: apt-get " + step[3] + " failed (" + apt->describe() +
                                     "); last output:\n" + apt->output);
          return store_error(errc::io_error);
        }
      }
    }

    // 3c. npm packages, installed by the host's npm into a staging prefix (nothing runs inside
    //     the image), then copied to /opt/npm of the tree.
    if (!spec_.npm_packages.empty()) {
      if (auto r = install_npm(target); !r) return r.error();
    }

    // 4. Scrub.
    auto tfd = detail::open_dir_at(work_fd_.get(), "rootfs");
    if (!tfd) return fail("open rootfs", tfd.error());
    if (auto r = scrub(tfd->get()); !r) return r.error();

    // 5. Pack.
    log_(log_level::info, "image build: packing the tree into one layer");
    step("packing");
    auto layout = make_layout_dirs();
    if (!layout) return layout.error();
    const std::string layer_tmp = work_path_ + "/layer.tar";
    auto packed =
        detail::run_tool({tar, "--create", "--file", layer_tmp, "--directory", target,
                          "--sort=name", "--numeric-owner", "--format=pax",
                          "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
                          "--one-file-system", "--no-xattrs", "--no-acls", "--no-selinux", "."},
                         detail::minimal_tool_env(), tar_timeout);
    if (!packed) return fail("run tar", packed.error());
    if (!packed->ok()) {
      log_(log_level::error,
           "image build: tar failed (" + packed->describe() + "):\n" + packed->output);
      return store_error(errc::io_error);
    }
    auto lfd = detail::open_regular_at(work_fd_.get(), "layer.tar");
    if (!lfd) return fail("open layer.tar", lfd.error());
    auto lhash = detail::hash_fd(lfd->get());
    if (!lhash) return fail("hash layer.tar", lhash.error());
    const std::string layer_digest = "sha256:" + lhash->first;
    const auto layer_size = lhash->second;
    if (::renameat(work_fd_.get(), "layer.tar", layout->blobs.get(), lhash->first.c_str()) != 0) {
      return fail("move layer into layout", sys_error(errno));
    }

    // 6. Config, manifest, index; import.
    const std::string created = detail::rfc3339_now();
    std::string created_by = "agent-sandbox build_debian_image: debootstrap --variant=minbase";
    created_by += " " + spec_.suite + " " + mirror;
    if (!spec_.packages.empty()) {
      created_by += "; apt-get install --no-install-recommends";
      for (const auto& p : spec_.packages) created_by += " " + p;
    }
    for (const auto& p : spec_.npm_packages) created_by += "; npm " + p;
    json config = {
        {"created", created},
        {"architecture", host_architecture()},
        {"os", "linux"},
        {"config",
         {{"Env", {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}}},
        {"rootfs", {{"type", "layers"}, {"diff_ids", {layer_digest}}}},
        {"history", {{{"created", created}, {"created_by", created_by}}}}};
    auto config_desc = put_blob(layout->blobs.get(), config.dump(), oci::media_config);
    if (!config_desc) return config_desc.error();
    json manifest = {
        {"schemaVersion", 2},
        {"mediaType", oci::media_manifest},
        {"config", *config_desc},
        {"layers",
         {{{"mediaType", oci::media_layer_tar}, {"digest", layer_digest}, {"size", layer_size}}}},
        {"annotations", {{std::string(oci::annotation_created), created}}}};
    auto manifest_desc = put_blob(layout->blobs.get(), manifest.dump(), oci::media_manifest);
    if (!manifest_desc) return manifest_desc.error();
    json index_desc = *manifest_desc;
    index_desc["annotations"] = {{std::string(oci::annotation_created), created},
                                 {std::string(oci::annotation_ref_name), spec_.name}};
    json index = {
        {"schemaVersion", 2}, {"mediaType", oci::media_index}, {"manifests", {index_desc}}};
    if (auto r = detail::replace_file_at(layout->dir.get(), "index.json", index.dump(), 0644); !r) {
      return fail("write index.json", r.error());
    }
    if (auto r = detail::replace_file_at(layout->dir.get(), "oci-layout",
                                         std::string(oci::layout_file_content), 0644);
        !r) {
      return fail("write oci-layout", r.error());
    }
    step("storing");
    auto digest = store_.import_layout(work_path_ + "/layout", spec_.name);
    if (!digest) return digest.error();
    const auto secs =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started)
            .count();
    log_(log_level::info, "image build: " + spec_.name + " is now " + *digest + " (" +
                              std::to_string(layer_size) + " bytes, " + std::to_string(secs) +
                              " s)");
    return digest;
  }

 private:
  // A tool_line_sink feeding `parse` of the progress parser (none without a progress sink).
  detail::tool_line_sink line_sink(
      void (detail::image_build_progress_parser::*parse)(std::string_view)) {
    if (!spec_.progress) return {};
    return [this, parse](std::string_view line) { (progress_.*parse)(line); };
  }

  // Reports a step that is not counted.
  void step(std::string_view phase) {
    if (!spec_.progress) return;
    try {
      spec_.progress(image_build_progress{.phase = phase});
    } catch (...) {
      // Display only: the build goes on.
    }
  }

  struct layout_dirs {
    unique_fd dir;
    unique_fd blobs;  // layout/blobs/sha256
  };

  error_code fail(const std::string& what, const error_code& ec) const {
    log_(log_level::error, "image build: " + what + ": " + ec.message());
    if (ec.category() == error_category()) return ec;
    if (ec.value() == ETIMEDOUT) return store_error(errc::io_error);
    auto mapped = detail::to_store_error(ec);
    return mapped == store_error(errc::permission_denied) ? mapped : store_error(errc::io_error);
  }

  // npm install --ignore-scripts into <work>/npm (its own HOME and cache), every package of
  // the lock checked for a registry `integrity` (npm verified each tarball against it), then
  // node_modules, package.json and package-lock.json copied to <target>/opt/npm.
  result<void> install_npm(const std::string& target) {
    const std::string npm = detail::find_program({"/usr/bin/npm", "/usr/local/bin/npm"});
    const std::string cp = detail::find_program({"/usr/bin/cp", "/bin/cp"});
    if (npm.empty() || cp.empty()) {
      log_(log_level::warning, "image build: npm (and cp) needed for npm packages");
      return store_error(errc::unsupported);
    }
    const std::string prefix = work_path_ + "/npm";
    for (const char* d : {"/npm", "/npm-home", "/npm-cache"}) {
      if (::mkdir((work_path_ + d).c_str(), 0700) != 0) return fail("mkdir npm", sys_error(errno));
    }
    {
      std::ofstream pj(prefix + "/package.json");
      pj << R"({"name":"agent-sandbox-image","version":"1.0.0","private":true})"
         << "\n";
      if (!pj) return fail("write package.json", store_error(errc::io_error));
    }
    std::vector<std::string> argv = {npm,         "install",          "--prefix",
                                     prefix,      "--ignore-scripts", "--no-audit",
                                     "--no-fund", "--save-exact",     "--package-lock=true",
                                     "--omit=dev"};
    argv.insert(argv.end(), spec_.npm_packages.begin(), spec_.npm_packages.end());
    std::vector<std::string> env = detail::minimal_tool_env();
    env.push_back("HOME=" + work_path_ + "/npm-home");
    env.push_back("npm_config_cache=" + work_path_ + "/npm-cache");
    env.push_back("npm_config_update_notifier=false");
    // The host's way to the registry (a proxy, a registry mirror, the CA that proxy's
    // certificates chain to) is passed on; nothing else of its environment or npm config
    // (`--prefix` also moves npm's global config into the staging prefix).
    for (const char* var : {"http_proxy", "https_proxy", "no_proxy", "npm_config_registry",
                            "npm_config_cafile", "NODE_EXTRA_CA_CERTS"}) {
      if (const char* v = std::getenv(var)) env.push_back(std::string(var) + "=" + v);
    }
    log_(log_level::info, "image build: npm install (scripts ignored)");
    step("npm install");
    auto inst = detail::run_tool(argv, env, debootstrap_timeout, -1, 16 * 1024);
    if (!inst) return fail("run npm", inst.error());
    if (!inst->ok()) {
      log_(log_level::error, "image build: npm install failed (" + inst->describe() +
                                 "); last output:\n" + inst->output);
      return store_error(errc::io_error);
    }
    // The lock: every installed package resolved from a registry with an integrity hash.
    try {
      std::ifstream lf(prefix + "/package-lock.json");
      auto lock = nlohmann::json::parse(lf);
      const auto& pkgs = lock.at("packages");
      std::size_t count = 0;
      for (const auto& [path, entry] : pkgs.items()) {
        if (path.empty() || entry.value("link", false)) continue;
        const std::string integrity = entry.value("integrity", "");
        // (`resolved` may be left out of locks by the host's npm config; when present it
        // must be https.)
        const std::string resolved = entry.value("resolved", "");
        if (integrity.rfind("sha512-", 0) != 0 ||
            (!resolved.empty() && resolved.rfind("https://", 0) != 0)) {
          log_(log_level::error,
               "image build: npm lock entry without a sha512 integrity or "
               "https source: " +
                   path);
          return store_error(errc::digest_mismatch);
        }
        ++count;
      }
      if (count == 0) {
        log_(log_level::error, "image build: npm installed nothing");
        return store_error(errc::io_error);
      }
      log_(log_level::info,
           "image build: npm lock checked (" + std::to_string(count) + " packages)");
    } catch (const std::exception& e) {
      log_(log_level::error, std::string("image build: npm lock unreadable: ") + e.what());
      return store_error(errc::io_error);
    }
    if (::mkdir((target + "/opt").c_str(), 0755) != 0 && errno != EEXIST) {
      return fail("mkdir /opt", sys_error(errno));
    }
    if (::mkdir((target + "/opt/npm").c_str(), 0755) != 0)
      return fail("mkdir /opt/npm", sys_error(errno));
    for (const char* what : {"/node_modules", "/package.json", "/package-lock.json"}) {
      auto c = detail::run_tool(
          {cp, "-R", "--no-preserve=ownership", prefix + what, target + "/opt/npm/"},
          detail::minimal_tool_env(), std::chrono::minutes(5));
      if (!c) return fail("run cp", c.error());
      if (!c->ok()) {
        log_(log_level::error, "image build: copying npm packages failed: " + c->output);
        return store_error(errc::io_error);
      }
    }
    return {};
  }

  result<void> make_work_dir() {
    std::filesystem::path base = spec_.work_dir;
    std::string prefix = "agent-sandbox-build-";
    if (base.empty()) {
      base = oci::store_root_of(store_);
      prefix = ".build-";
      if (base.empty()) base = "/var/tmp";
    }
    auto parent = detail::open_store_root(base, /*create=*/true, 0700);
    if (!parent) return fail("open work dir " + base.string(), parent.error());
    auto random_name = detail::temp_name(prefix, 8);
    if (!random_name) return fail("a random name for the work dir", random_name.error());
    const std::string name = std::move(*random_name);
    if (::mkdirat(parent->get(), name.c_str(), 0700) != 0) {
      return fail("mkdir " + (base / name).string(), sys_error(errno));
    }
    auto fd = detail::open_dir_at(parent->get(), name);
    if (!fd) return fail("open " + (base / name).string(), fd.error());
    parent_fd_ = std::move(*parent);
    work_name_ = name;
    work_fd_ = std::move(*fd);
    work_path_ = fd_path(work_fd_.get());
    if (work_path_.empty()) work_path_ = (base / name).string();
    return {};
  }

  void cleanup() {
    if (!work_fd_) return;
    detach_mounts_below(work_path_, log_);
    work_fd_.reset();
    if (auto r = detail::remove_tree_at(parent_fd_.get(), work_name_); !r) {
      log_(log_level::warning,
           "image build: cannot remove work dir " + work_path_ + ": " + r.error().message());
    }
  }

  result<layout_dirs> make_layout_dirs() {
    auto dir = detail::ensure_dir_at(work_fd_.get(), "layout", 0755);
    if (!dir) return fail("mkdir layout", dir.error());
    auto blobs = detail::ensure_dir_at(dir->get(), "blobs", 0755);
    if (!blobs) return fail("mkdir layout/blobs", blobs.error());
    auto sha = detail::ensure_dir_at(blobs->get(), "sha256", 0755);
    if (!sha) return fail("mkdir layout/blobs/sha256", sha.error());
    return layout_dirs{std::move(*dir), std::move(*sha)};
  }

  result<json> put_blob(int blobs, const std::string& bytes, std::string_view media_type) {
    const std::string hex = detail::sha256_hex(bytes);
    if (hex.empty()) return store_error(errc::io_error);
    if (auto r = detail::replace_file_at(blobs, hex, bytes, 0644); !r) {
      return fail("write blob", r.error());
    }
    return json{{"mediaType", media_type}, {"digest", "sha256:" + hex}, {"size", bytes.size()}};
  }

  // Opens directory `comps` inside the tree (links resolved inside it, never out of it).
  result<unique_fd> open_tree_dir(int root, std::vector<std::string> comps) {
    return detail::open_in_root(root, comps, O_RDONLY | O_DIRECTORY);
  }

  // Replaces file `name` in tree directory `comps` with `content` (a link there is removed,
  // not followed).
  result<void> write_tree_file(int root, const std::vector<std::string>& comps,
                               const std::string& name, std::string_view content) {
    auto dir = open_tree_dir(root, comps);
    if (!dir) return fail("open tree dir for " + name, dir.error());
    if (::unlinkat(dir->get(), name.c_str(), 0) != 0 && errno != ENOENT) {
      if (errno != EISDIR) return fail("unlink " + name, sys_error(errno));
      if (auto r = detail::remove_tree_at(dir->get(), name); !r)
        return fail("remove " + name, r.error());
    }
    int fd = ::openat(dir->get(), name.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return fail("create " + name, sys_error(errno));
    unique_fd out(fd);
    if (!detail::write_all(fd, content.data(), content.size())) {
      return fail("write " + name, sys_error(errno));
    }
    (void)::fchmod(fd, 0644);
    return {};
  }

  // Removes the entries of tree directory `comps` that `pick` selects (a missing directory
  // is fine). With `recurse_dirs`, subdirectories are descended and only their files go.
  template <class Pick>
  result<void> remove_in(int root, const std::vector<std::string>& comps, Pick pick,
                         bool recurse_dirs = false, int depth = 0) {
    auto dir = open_tree_dir(root, comps);
    if (!dir) {
      if (dir.error().value() == ENOENT || dir.error().value() == ENOTDIR) return {};
      return fail("open tree dir", dir.error());
    }
    auto names = detail::list_dir_names(dir->get());
    if (!names) return fail("list tree dir", names.error());
    for (const auto& n : *names) {
      struct stat st {};
      if (::fstatat(dir->get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (recurse_dirs && S_ISDIR(st.st_mode)) {
        if (depth > 32) continue;
        auto sub = comps;
        sub.push_back(n);
        if (auto r = remove_in(root, sub, pick, true, depth + 1); !r) return r;
        continue;
      }
      if (!pick(n, st)) continue;
      if (auto r = detail::remove_tree_at(dir->get(), n); !r) {
        return fail("remove " + n, r.error());
      }
    }
    return {};
  }

  result<void> scrub(int root) {
    // Host identity debootstrap copied in: replaced, not merely emptied, so a link planted
    // in the tree cannot redirect the write.
    if (auto r = write_tree_file(root, {"etc"}, "resolv.conf", "nameserver 127.0.0.1\n"); !r) {
      return r;
    }
    if (auto r = write_tree_file(root, {"etc"}, "hostname", "sandbox\n"); !r) return r;
    auto any = [](const std::string&, const struct stat&) { return true; };
    auto debs = [](const std::string& n, const struct stat& st) {
      return S_ISREG(st.st_mode) && n.size() > 4 && n.compare(n.size() - 4, 4, ".deb") == 0;
    };
    auto old = [](const std::string& n, const struct stat& st) {
      return S_ISREG(st.st_mode) && n.size() > 4 && n.compare(n.size() - 4, 4, "-old") == 0;
    };
    auto not_dir = [](const std::string&, const struct stat& st) { return !S_ISDIR(st.st_mode); };
    auto lists = [](const std::string& n, const struct stat&) {
      return n != "partial" && n != "lock";
    };
    const struct {
      std::vector<std::string> dir;
      bool (*pick)(const std::string&, const struct stat&);
      bool recurse;
    } steps[] = {
        {{"var", "cache", "apt", "archives"}, +debs, false},
        {{"var", "cache", "apt", "archives", "partial"}, +any, false},
        {{"var", "cache", "apt"},
         +[](const std::string& n, const struct stat& st) {
           return S_ISREG(st.st_mode) && n.size() > 4 && n.compare(n.size() - 4, 4, ".bin") == 0;
         },
         false},
        {{"var", "lib", "apt", "lists"}, +lists, false},
        {{"var", "lib", "apt", "lists", "partial"}, +any, false},
        {{"var", "log"}, +not_dir, true},
        {{"var", "cache", "debconf"}, +old, false},
        {{"var", "lib", "dpkg"}, +old, false},
        {{"dev"}, +any, false},
        {{"tmp"}, +any, false},
        {{"var", "tmp"}, +any, false},
    };
    for (const auto& s : steps) {
      if (auto r = remove_in(root, s.dir, s.pick, s.recurse); !r) return r;
    }
    return {};
  }

  image_store& store_;
  const debian_image_spec& spec_;
  detail::store_logger log_;
  detail::image_build_progress_parser progress_;
  unique_fd parent_fd_;
  unique_fd work_fd_;
  std::string work_name_;
  std::string work_path_;
};

}  // namespace

namespace detail {

namespace {

// The words of `line` split at spaces.
std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> w;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    if (j > i) w.push_back(line.substr(i, j - i));
    i = j;
  }
  return w;
}

// "NAME..." → "NAME"; "" when `w` does not end with "...".
std::string_view strip_ellipsis(std::string_view w) {
  if (w.size() <= 3 || w.substr(w.size() - 3) != "...") return {};
  return w.substr(0, w.size() - 3);
}

}  // namespace

void image_build_progress_parser::report(std::string_view phase, std::size_t& done,
                                         std::size_t total, std::string_view item) {
  ++done;
  if (!sink_) return;
  try {
    sink_(image_build_progress{
        .phase = phase, .done = done, .total = total >= done ? total : 0, .item = item});
  } catch (...) {
    sink_ = nullptr;  // a display that fails stops being fed; the build goes on
  }
}

void image_build_progress_parser::debootstrap_line(std::string_view line) {
  auto w = split_words(line);
  if (w.size() < 3 || w[0] != "I:") return;
  if (w.size() == 4 && w[1] == "Retrieving") {
    report("debootstrap: retrieving", retrieved_, 0, w[2]);
  } else if (w.size() == 4 && w[1] == "Validating") {
    report("debootstrap: validating", validated_, retrieved_, w[2]);
  } else if (w.size() == 3 && w[1] == "Extracting" && !strip_ellipsis(w[2]).empty()) {
    report("debootstrap: extracting", extracted_, 0, strip_ellipsis(w[2]));
  } else if (w.size() == 3 && w[1] == "Unpacking" && !strip_ellipsis(w[2]).empty()) {
    report("debootstrap: unpacking", unpacked_, retrieved_, strip_ellipsis(w[2]));
  } else if (w.size() == 3 && w[1] == "Configuring" && !strip_ellipsis(w[2]).empty()) {
    report("debootstrap: configuring", configured_, retrieved_, strip_ellipsis(w[2]));
  }
}

void image_build_progress_parser::apt_line(std::string_view line) {
  auto w = split_words(line);
  // "0 upgraded, 12 newly installed, 0 to remove and 0 not upgraded."
  if (w.size() >= 5 && w[1] == "upgraded," && w[3] == "newly" && w[4].rfind("installed", 0) == 0) {
    std::size_t n = 0;
    for (char c : w[2]) {
      if (c < '0' || c > '9' || n > 1'000'000) return;
      n = n * 10 + static_cast<std::size_t>(c - '0');
    }
    apt_total_ = n;
    return;
  }
  // "Get:3 http://deb.debian.org/debian bookworm/main amd64 libexpat1 amd64 2.5.0-1 [99.3 kB]"
  // (an index of `apt-get update`, "Get:2 URL bookworm/main amd64 Packages [8787 kB]", has
  // fewer words and no version).
  if (w.size() >= 8 && w[0].rfind("Get:", 0) == 0 && w[2].find('/') != std::string_view::npos &&
      w[4].rfind("[", 0) != 0 && w[6].rfind("[", 0) != 0) {
    report("apt-get: downloading", apt_got_, apt_total_, w[4]);
  } else if (w.size() >= 3 && w[0] == "Unpacking" && w[2].rfind("(", 0) == 0) {
    report("apt-get: unpacking", apt_unpacked_, apt_total_, w[1]);
  } else if (w.size() >= 4 && w[0] == "Setting" && w[1] == "up" && w[3].rfind("(", 0) == 0) {
    report("apt-get: setting up", apt_set_up_, apt_total_, w[2]);
  }
}

std::string find_debian_mirror(std::string_view suite, const std::filesystem::path& apt_dir) {
  try {
    {
      std::ifstream in(apt_dir / "sources.list");
      if (in) {
        if (auto m = mirror_from_list(in, suite); !m.empty()) return m;
      }
    }
    std::vector<std::filesystem::path> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(apt_dir / "sources.list.d", ec)) {
      const auto ext = e.path().extension();
      if (ext == ".list" || ext == ".sources") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      if (!in) continue;
      std::string m =
          f.extension() == ".list" ? mirror_from_list(in, suite) : mirror_from_sources(in, suite);
      if (!m.empty()) return m;
    }
  } catch (...) {
    // An unreadable apt configuration is not fatal: use the default mirror.
  }
  return std::string(default_mirror);
}

}  // namespace detail

result<std::string> build_debian_image(image_store& store, const debian_image_spec& spec) {
  detail::store_logger log(spec.log);
  try {
    builder b(store, spec);
    return b.run();
  } catch (const std::exception& e) {
    log(log_level::error, std::string("image build: unexpected exception: ") + e.what());
  } catch (...) {
    log(log_level::error, "image build: unexpected exception");
  }
  return store_error(errc::io_error);
}

}  // namespace sandbox
