// OCI bundles for the `container` (crun, runc) and `gvisor` (runsc) levels. See bundle.hpp for
// the layout and the shape of config.json, and runtime-spec v1.0.2 (config.md,
// config-linux.md) for the fields.
#include "backends/oci/bundle.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/run/workspace.hpp"
#include "embedded/node_proxy_preload.hpp"
#include "protocol/text_util.hpp"
#include "store/store_io.hpp"
#include "sys/random.hpp"
#include "wire/accounts.hpp"
#include "wire/init_protocol.hpp"
#include "wire/seccomp_policy.hpp"

namespace sandbox::detail::oci {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------
// Names and texts
// ---------------------------------------------------------------------------------------

/// What sandbox-init needs before it starts the program (it drops them all in the child).
constexpr std::array<std::string_view, 4> init_capabilities = {
    "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE"};

/// Namespaces every run gets (no user namespace: see bundle.hpp).
constexpr std::array<std::string_view, 6> run_namespaces = {"pid", "network", "ipc",
                                                            "uts", "mount",   "cgroup"};
/// Of those, the ones `check_config` insists on: without them the run shares the host's.
constexpr std::array<std::string_view, 5> required_namespaces = {"pid", "network", "ipc", "uts",
                                                                 "mount"};

/// Top-level names of the image that are never mirrored: we provide them ourselves.
constexpr std::array<std::string_view, 11> reserved_names = {
    ".",   "..",   "proc",    "sys",           "dev",         "tmp",
    "run", "home", "sandbox", ".sandbox-init", ".sandbox-etc"};

/// The bundle's empty, mode 0 file bound over device nodes gVisor adds to /dev by itself.
constexpr std::string_view no_device_file = "no-device";

/// /etc files replaced with our own content, when the image has them as regular files.
struct etc_file {
  std::string_view name;
  std::string_view content;
};
constexpr std::array<etc_file, 3> etc_files = {{
    {"resolv.conf", "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"},
    {"hosts", "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n"},
    {"hostname", "sandbox\n"},
}};

constexpr std::string_view boot_id_path = "/proc/sys/kernel/random/boot_id";

/// /etc files generated per run from the image's own: the image's entries and the run's
/// (wire/accounts.hpp), where the image has them as regular files under a real /etc.
constexpr std::array<std::string_view, 2> account_files = {"passwd", "group"};

/// The run's own devpts instance at /dev/pts (crun, runc; runsc mounts its own, inside the
/// sandbox's kernel): as the process level's (helpers/init/mounts.cpp), nosuid, noexec, a new
/// instance holding at most 16 ptys, ptmx openable by the run's uid. The runtime points
/// /dev/ptmx at pts/ptmx.
constexpr std::array<std::string_view, 6> opts_devpts = {
    "nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "max=16"};

/// What a program has no business reading or poking in /proc (as the process backend masks).
constexpr std::array<std::string_view, 15> masked_paths = {
    "/proc/kcore",       "/proc/keys",          "/proc/key-users", "/proc/timer_list",
    "/proc/sched_debug", "/proc/sysrq-trigger", "/proc/locks",     "/proc/kallsyms",
    "/proc/config.gz",   "/proc/modules",       "/proc/cmdline",   "/proc/latency_stats",
    "/proc/timer_stats", "/proc/acpi",          "/proc/scsi"};
constexpr std::array<std::string_view, 5> readonly_paths = {"/proc/sys", "/proc/bus", "/proc/fs",
                                                            "/proc/irq", "/proc/asound"};

// Bind options. Plain "bind", never "rbind": nothing mounted below an allowed path on the host
// may come along. No propagation option: the runtimes make the rootfs private or slave.
constexpr std::array<std::string_view, 4> opts_image = {"bind", "ro", "nosuid", "nodev"};
constexpr std::array<std::string_view, 5> opts_data_ro = {"bind", "ro", "nosuid", "nodev",
                                                          "noexec"};
constexpr std::array<std::string_view, 5> opts_output = {"bind", "rw", "nosuid", "nodev", "noexec"};
constexpr std::array<std::string_view, 4> opts_init = {"bind", "ro", "nosuid", "nodev"};

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

boost::system::error_code refuse(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return make_error_code(errc::invalid_argument);
}

boost::system::error_code io_failure(std::string* why, std::string reason) {
  if (why != nullptr) *why = std::move(reason);
  return make_error_code(errc::io_error);
}

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

template <std::size_t N>
bool contains(const std::array<std::string_view, N>& set, std::string_view s) {
  return std::find(set.begin(), set.end(), s) != set.end();
}

/// Why `s` is not a clean absolute path (absolute, no empty, "." or ".." component, no
/// trailing '/', no NUL, valid UTF-8), or nullptr when it is one.
const char* path_problem(std::string_view s) {
  if (s.empty() || s.front() != '/') return "is not absolute";
  if (s.find('\0') != std::string_view::npos) return "contains a NUL byte";
  if (utf8_error_offset(s) != std::string_view::npos) return "is not valid UTF-8";
  if (s == "/") return nullptr;
  if (s.back() == '/') return "ends with '/'";
  std::size_t start = 1;
  while (start <= s.size()) {
    std::size_t end = s.find('/', start);
    if (end == std::string_view::npos) end = s.size();
    std::string_view c = s.substr(start, end - start);
    if (c.empty()) return "has an empty component";
    if (c == ".") return "has a '.' component";
    if (c == "..") return "has a '..' component";
    start = end + 1;
  }
  return nullptr;
}

/// True when clean absolute path `inner` is `outer` or below it, compared component-wise
/// ("/a/b-evil" is not below "/a/b").
bool is_within(std::string_view inner, std::string_view outer) {
  if (outer == "/") return true;
  if (inner.size() < outer.size() || inner.compare(0, outer.size(), outer) != 0) return false;
  return inner.size() == outer.size() || inner[outer.size()] == '/';
}

/// True when `inner` is strictly below `outer`.
bool is_below(std::string_view inner, std::string_view outer) {
  return inner != outer && is_within(inner, outer);
}

/// Lexical normal form of an absolute path: empty and "." components dropped, no trailing
/// '/'. Empty when `s` is relative or has a ".." component (which is refused, not resolved).
std::optional<std::string> normalize(std::string_view s) {
  if (s.empty() || s.front() != '/' || s.find('\0') != std::string_view::npos) return {};
  std::string out;
  std::size_t start = 0;
  while (start < s.size()) {
    std::size_t end = s.find('/', start);
    if (end == std::string_view::npos) end = s.size();
    std::string_view c = s.substr(start, end - start);
    if (c == "..") return {};
    if (!c.empty() && c != ".") {
      out += '/';
      out += c;
    }
    start = end + 1;
  }
  if (out.empty()) out = "/";
  return out;
}

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// ---------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------

std::optional<boost::system::error_code> validate(const bundle_params& p, std::string* why) {
  const std::string& id = p.container_id;
  auto id_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  };
  if (id.empty() || id.size() > 64 || id.front() == '-' ||
      !std::all_of(id.begin(), id.end(), id_char)) {
    return refuse(why,
                  "container_id " + quote_for_message(id) + " must match [a-z0-9][a-z0-9-]{0,63}");
  }
  if (p.input_name.size() != 19 || p.input_name.compare(0, 3, "in-") != 0 ||
      !is_lower_hex(std::string_view(p.input_name).substr(3))) {
    return refuse(why, "input_name " + quote_for_message(p.input_name) +
                           " must be \"in-\" and 16 lowercase hex digits");
  }
  const std::string& sn = p.source_name;
  if (sn.empty() || sn.size() > 255 || sn.find('/') != std::string::npos ||
      sn.find('\0') != std::string::npos || sn == "." || sn == ".." ||
      utf8_error_offset(sn) != std::string_view::npos) {
    return refuse(why, "source_name " + quote_for_message(sn) +
                           " must be 1..255 bytes of UTF-8 without '/' or NUL, not \".\" or "
                           "\"..\"");
  }
  if (sn == "out" || sn == p.input_name) {
    return refuse(
        why, "source_name " + quote_for_message(sn) + " collides with another entry of /sandbox");
  }
  const std::pair<const char*, const fs::path*> paths[] = {
      {"image_root", &p.image_root}, {"workspace", &p.workspace},
      {"inputs", &p.inputs},         {"source", &p.source},
      {"output_dir", &p.output_dir}, {"init_executable", &p.init_executable}};
  for (auto [name, path] : paths) {
    if (const char* problem = path_problem(path->native())) {
      return refuse(why,
                    fmt::format("{} {} {}", name, quote_for_message(path->native(), 200), problem));
    }
  }
  const std::string& ws = p.workspace.native();
  const std::string& image = p.image_root.native();
  if (ws == "/") return refuse(why, "workspace must not be \"/\"");
  if (image == "/") return refuse(why, "image_root must not be \"/\"");
  if (is_within(ws, image) || is_within(image, ws)) {
    return refuse(why, "image_root and workspace must not contain each other");
  }
  const std::string bundle_dir = ws + "/bundle";
  const std::pair<const char*, const fs::path*> inside[] = {
      {"inputs", &p.inputs}, {"source", &p.source}, {"output_dir", &p.output_dir}};
  for (auto [name, path] : inside) {
    if (!is_below(path->native(), ws)) {
      return refuse(why, fmt::format("{} {} is not inside the workspace", name,
                                     quote_for_message(path->native(), 200)));
    }
    if (is_within(path->native(), bundle_dir)) {
      return refuse(why, fmt::format("{} {} is inside the bundle directory", name,
                                     quote_for_message(path->native(), 200)));
    }
  }
  if (is_within(p.init_executable.native(), bundle_dir)) {
    return refuse(why, "init_executable is inside the bundle directory");
  }
  if (p.cgroups_path == "/" || path_problem(p.cgroups_path) != nullptr) {
    return refuse(why, "cgroups_path " + quote_for_message(p.cgroups_path, 200) +
                           " must be a clean absolute path other than \"/\"");
  }
  if (p.runtime_network_namespace && p.kind != runtime_kind::runsc) {
    // crun and runc would run the container in the host's network namespace.
    return refuse(why, "runtime_network_namespace is for runsc only");
  }
  if (p.uid == 0 || p.gid == 0) {
    // No user namespace: uid 0 in the container is root on the host.
    return refuse(why, "uid and gid must not be 0");
  }
  constexpr auto int64_max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  const std::pair<const char*, std::uint64_t> sizes[] = {{"memory_bytes", p.memory_bytes},
                                                         {"max_pids", p.max_pids},
                                                         {"tmp_bytes", p.tmp_bytes},
                                                         {"home_bytes", p.home_bytes},
                                                         {"shm_bytes", p.shm_bytes},
                                                         {"tmpfs_inodes", p.tmpfs_inodes},
                                                         {"nofile", p.nofile},
                                                         {"fsize_bytes", p.fsize_bytes}};
  for (auto [name, value] : sizes) {
    if (value == 0) return refuse(why, fmt::format("{} must be > 0", name));
    if (value > int64_max) return refuse(why, fmt::format("{} is too large", name));
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------
// The image's top level
// ---------------------------------------------------------------------------------------

enum class entry_kind { directory, file, symlink };

struct image_entry {
  std::string name;
  entry_kind kind;
  std::string target;  ///< for symlinks
};

struct image_view {
  std::vector<image_entry> entries;          ///< sorted by name
  std::array<bool, etc_files.size()> etc{};  ///< /etc/<etc_files[i]> is a regular file
  /// /etc/<account_files[i]>'s content, where it is a regular file under a real /etc.
  std::array<std::optional<std::string>, account_files.size()> accounts{};
};

/// Reads the image root's top level with lstat semantics (never following a link).
result<image_view> read_image(const fs::path& root, std::string* why) {
  unique_fd dfd(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dfd) return io_failure(why, fmt::format("open {}: {}", root.native(), errno_text(errno)));
  int listing = dup(dfd.get());
  DIR* d = listing < 0 ? nullptr : fdopendir(listing);
  if (d == nullptr) {
    int e = errno;
    if (listing >= 0) close(listing);
    return io_failure(why, fmt::format("opendir {}: {}", root.native(), errno_text(e)));
  }
  image_view img;
  bool etc_is_dir = false;
  errno = 0;
  while (dirent* e = readdir(d)) {
    std::string_view name = e->d_name;
    // A name config.json cannot carry (JSON strings are UTF-8) gets no mount point.
    if (contains(reserved_names, name) || utf8_error_offset(name) != std::string_view::npos) {
      continue;
    }
    struct stat st {};
    if (fstatat(dfd.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
      int err = errno;
      closedir(d);
      return io_failure(why, fmt::format("lstat {}/{}: {}", root.native(), name, errno_text(err)));
    }
    if (S_ISDIR(st.st_mode)) {
      img.entries.push_back({std::string(name), entry_kind::directory, {}});
      if (name == "etc") etc_is_dir = true;
    } else if (S_ISREG(st.st_mode)) {
      img.entries.push_back({std::string(name), entry_kind::file, {}});
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(4096, '\0');
      ssize_t n = readlinkat(dfd.get(), e->d_name, target.data(), target.size());
      if (n < 0 || static_cast<std::size_t>(n) >= target.size()) {
        int err = n < 0 ? errno : ENAMETOOLONG;
        closedir(d);
        return io_failure(why,
                          fmt::format("readlink {}/{}: {}", root.native(), name, errno_text(err)));
      }
      target.resize(static_cast<std::size_t>(n));
      img.entries.push_back({std::string(name), entry_kind::symlink, std::move(target)});
    }
    // FIFOs, sockets and devices: skipped (never a mount source).
    errno = 0;
  }
  int read_err = errno;
  closedir(d);
  if (read_err != 0) {
    return io_failure(why, fmt::format("readdir {}: {}", root.native(), errno_text(read_err)));
  }
  std::sort(img.entries.begin(), img.entries.end(),
            [](const image_entry& a, const image_entry& b) { return a.name < b.name; });
  if (etc_is_dir) {
    // Only real files under a real /etc: a bind onto a symlink would be resolved by the
    // runtime, and where it points is the image's choice.
    for (std::size_t i = 0; i < etc_files.size(); ++i) {
      std::string rel = fmt::format("etc/{}", etc_files[i].name);
      struct stat st {};
      img.etc[i] =
          fstatat(dfd.get(), rel.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
    }
    // passwd and group are read (by the host): never through a link, which could name one of
    // the host's own files.
    for (std::size_t i = 0; i < account_files.size(); ++i) {
      const std::string name(account_files[i]);
      std::string content;
      const int rc = read_image_etc_file(dfd.get(), name.c_str(), &content);
      if (rc == 0) {
        img.accounts[i] = std::move(content);
      } else if (rc != -ENOENT && rc != -ELOOP && rc != -ENOTDIR && rc != -EINVAL) {
        return io_failure(why,
                          fmt::format("read {}/etc/{}: {}", root.native(), name, errno_text(-rc)));
      }
    }
  }
  return img;
}

// ---------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------

template <std::size_t N>
json bind_mount(const std::string& destination, const std::string& source,
                const std::array<std::string_view, N>& options) {
  json opts = json::array();
  for (auto o : options) opts.push_back(o);
  return {{"destination", destination}, {"type", "bind"}, {"source", source}, {"options", opts}};
}

json tmpfs_mount(const std::string& destination, std::vector<std::string> options) {
  return {{"destination", destination},
          {"type", "tmpfs"},
          {"source", "tmpfs"},
          {"options", std::move(options)}};
}

json build_config(const bundle_params& p, const image_view& img) {
  const std::string bundle_dir = p.workspace.native() + "/bundle";
  const std::string files_dir = bundle_dir + "/files";
  const std::string inodes = fmt::format("nr_inodes={}", p.tmpfs_inodes);

  json mounts = json::array();
  // 1. The image's top level, read-only (its symlinks are in the skeleton already).
  for (const auto& e : img.entries) {
    if (e.kind == entry_kind::symlink) continue;
    mounts.push_back(bind_mount("/" + e.name, p.image_root.native() + "/" + e.name, opts_image));
  }
  // 2. /proc of the run's pid namespace; then the run's own boot id over the host's, which
  //    would name the host and link runs to each other. runc refuses any bind below /proc
  //    but a few lxcfs files, so there the file is masked (read as empty) instead.
  //    hidepid=2 ("invisible"): the program sees only its own processes, never sandbox-init
  //    (PID 1, root). gVisor's procfs has no such option; there sandbox-init is
  //    non-dumpable and the runtime's own kernel stands between.
  json proc_options = json::array({"nosuid", "noexec", "nodev"});
  if (p.kind != runtime_kind::runsc) proc_options.push_back("hidepid=2");
  mounts.push_back(
      {{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}, {"options", proc_options}});
  if (p.kind != runtime_kind::runc) {
    mounts.push_back(bind_mount(std::string(boot_id_path), files_dir + "/boot_id", opts_data_ro));
  }
  // 3. /dev: a small tmpfs; the runtime adds its default device nodes (null, zero, full,
  //    random, urandom, tty) and the device cgroup allows only those.
  mounts.push_back(
      tmpfs_mount("/dev", {"nosuid", "noexec", "strictatime", "mode=755", "size=65536"}));
  //    /dev/pts: the run's own devpts instance (`opts_devpts`). runsc always adds its own,
  //    a devpts of the sandbox's kernel, which no other sandbox and not the host shares.
  if (p.kind != runtime_kind::runsc) {
    json opts = json::array();
    for (auto o : opts_devpts) opts.push_back(o);
    mounts.push_back(
        {{"destination", "/dev/pts"}, {"type", "devpts"}, {"source", "devpts"}, {"options", opts}});
  }
  // gVisor also fills its /dev with /dev/fuse and /dev/net/tun and mounts its own sysfs at
  // /sys, whatever config.json says; none is of use to a snippet and each is more of the
  // Sentry to reach: an empty read-only tmpfs over /dev/net and /sys, and over /dev/fuse
  // (a file) a root-owned empty file of mode 0 (`no_device_file`), which is no device and
  // which the program cannot open. (Its devpts stays: ptys for programs that ask.)
  if (p.kind == runtime_kind::runsc) {
    const std::vector<std::string> empty_ro = {"ro",        "nosuid",       "noexec",  "nodev",
                                               "size=4096", "nr_inodes=16", "mode=755"};
    mounts.push_back(tmpfs_mount("/dev/net", empty_ro));
    mounts.push_back(
        bind_mount("/dev/fuse", files_dir + "/" + std::string(no_device_file), opts_data_ro));
    mounts.push_back(tmpfs_mount("/sys", empty_ro));
  }
  // 4. Writable scratch space, capped in bytes and inodes (ENOSPC before the memory limit).
  mounts.push_back(tmpfs_mount(
      "/dev/shm",
      {"nosuid", "noexec", "nodev", fmt::format("size={}", p.shm_bytes), inodes, "mode=1777"}));
  mounts.push_back(tmpfs_mount(
      "/tmp", {"nosuid", "nodev", fmt::format("size={}", p.tmp_bytes), inodes, "mode=1777"}));
  mounts.push_back(tmpfs_mount(
      "/home/sandbox", {"nosuid", "nodev", fmt::format("size={}", p.home_bytes), inodes,
                        "mode=0700", fmt::format("uid={}", p.uid), fmt::format("gid={}", p.gid)}));
  // 5. /sandbox: the inputs (read-only, random name), the output dir, the source.
  mounts.push_back(bind_mount("/sandbox/" + p.input_name, p.inputs.native(), opts_data_ro));
  mounts.push_back(bind_mount("/sandbox/out", p.output_dir.native(), opts_output));
  mounts.push_back(bind_mount("/sandbox/" + p.source_name, p.source.native(), opts_data_ro));
  // 6. Name service files, over the image's own (only where it has them as regular files).
  for (std::size_t i = 0; i < etc_files.size(); ++i) {
    if (!img.etc[i]) continue;
    std::string name(etc_files[i].name);
    mounts.push_back(bind_mount("/etc/" + name, files_dir + "/" + name, opts_data_ro));
  }
  for (std::size_t i = 0; i < account_files.size(); ++i) {
    if (!img.accounts[i]) continue;
    std::string name(account_files[i]);
    mounts.push_back(bind_mount("/etc/" + name, files_dir + "/" + name, opts_data_ro));
  }
  // 7. sandbox-init, the container's first process.
  mounts.push_back(bind_mount("/.sandbox-init", p.init_executable.native(), opts_init));
  // 8. The bundle's files, for what runs need besides /etc: the Node proxy preload
  //    (`node_proxy_preload_path`).
  mounts.push_back(bind_mount("/.sandbox-etc", files_dir, opts_data_ro));

  json caps = json::array();
  for (auto c : init_capabilities) caps.push_back(c);
  json namespaces = json::array();
  for (auto n : run_namespaces) {
    if (n == "network" && p.runtime_network_namespace) continue;  // the runtime's own (see hpp)
    namespaces.push_back({{"type", n}});
  }
  json masked = json::array();
  for (auto m : masked_paths) masked.push_back(m);
  if (p.kind == runtime_kind::runc) masked.push_back(boot_id_path);
  json readonly = json::array();
  for (auto r : readonly_paths) readonly.push_back(r);

  const json deny_all = {{"allow", false}, {"access", "rwm"}};
  json resources = {
      {"memory", {{"limit", static_cast<std::int64_t>(p.memory_bytes)}}},
      {"pids", {{"limit", static_cast<std::int64_t>(p.max_pids)}}},
      {"devices", json::array({deny_all})},
  };
  if (p.cpu_millicores > 0) {
    // quota/period = cores: 1000 millicores = 100000 µs per 100000 µs.
    resources["cpu"] = {{"quota", static_cast<std::int64_t>(p.cpu_millicores) * 100},
                        {"period", 100000}};
  }

  auto rlimit = [](const char* type, std::uint64_t value) {
    return json{{"type", type}, {"hard", value}, {"soft", value}};
  };
  return {
      {"ociVersion", "1.0.2"},
      {"root", {{"path", bundle_dir + "/rootfs"}, {"readonly", true}}},
      {"hostname", "sandbox"},
      {"mounts", std::move(mounts)},
      {"process",
       {{"terminal", false},
        {"user", {{"uid", 0}, {"gid", 0}}},
        // runsc passes no descriptor but stdio: there the control channel is stdin.
        {"args", p.kind == runtime_kind::runsc
                     ? json::array({"/.sandbox-init", init_protocol::control_stdin_arg})
                     : json::array({"/.sandbox-init"})},
        {"env", json::array()},
        {"cwd", "/"},
        {"capabilities",
         {{"bounding", caps},
          {"effective", caps},
          {"permitted", caps},
          {"inheritable", json::array()},
          {"ambient", json::array()}}},
        {"rlimits", json::array({rlimit("RLIMIT_NOFILE", p.nofile),
                                 rlimit("RLIMIT_FSIZE", p.fsize_bytes), rlimit("RLIMIT_CORE", 0)})},
        {"noNewPrivileges", true}}},
      {"linux",
       {{"namespaces", std::move(namespaces)},
        {"cgroupsPath", p.cgroups_path},
        {"resources", std::move(resources)},
        {"maskedPaths", std::move(masked)},
        {"readonlyPaths", std::move(readonly)},
        {"seccomp", seccomp_section(p.kind)}}},
  };
}

// ---------------------------------------------------------------------------------------
// Seccomp
// ---------------------------------------------------------------------------------------

// The table is wire/seccomp_policy's; what each runtime enforces of it is
// `seccomp_action_for`'s. Here it is only written in OCI's form.

const char* oci_op(seccomp_op op) {
  switch (op) {
    case seccomp_op::ne:
      return "SCMP_CMP_NE";
    case seccomp_op::eq:
      return "SCMP_CMP_EQ";
    case seccomp_op::gt:
      return "SCMP_CMP_GT";
    case seccomp_op::masked_eq:
      return "SCMP_CMP_MASKED_EQ";
  }
  return "";
}

/// One rule of the table as one OCI rule (OCI ANDs a rule's `args`, so each alternative of a
/// row is a rule of its own). For SCMP_CMP_MASKED_EQ, `value` is the mask and `valueTwo` the
/// datum (libseccomp's datum_a / datum_b).
json oci_rule(const char* syscall, const seccomp_rule& rule, seccomp_action action) {
  json r = {{"names", json::array({syscall})}};
  if (action.kind == seccomp_action_kind::errno_value) {
    r["action"] = "SCMP_ACT_ERRNO";
    r["errnoRet"] = action.errno_value;
  } else {
    // Never asked for (seccomp_action_for): without a listenerPath the runtime refuses it.
    r["action"] = "SCMP_ACT_NOTIFY";
  }
  if (rule.check_count > 0) {
    json args = json::array();
    for (const auto& c : rule.args()) {
      args.push_back({{"index", c.index},
                      {"value", c.value},
                      {"valueTwo", c.value_two},
                      {"op", oci_op(c.op)}});
    }
    r["args"] = std::move(args);
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// check_config
// ---------------------------------------------------------------------------------------

bool has_option(const json& options, std::string_view o) {
  if (!options.is_array()) return false;
  return std::any_of(options.begin(), options.end(),
                     [&](const json& v) { return v.is_string() && v.get<std::string>() == o; });
}

/// Why host path `source` (clean) may not be a bind source below allowed root `root` (clean,
/// `source` within it), or empty. Every component from `root` down is lstat'ed: none may be
/// a symlink (the runtime would follow it), and the source itself must be a directory or a
/// regular file (not a socket, FIFO or device).
std::string check_source_on_host(const std::string& source, const std::string& root) {
  std::string path = root;
  std::size_t pos = root == "/" ? 0 : root.size();
  while (true) {
    struct stat st {};
    if (lstat(path.c_str(), &st) < 0) {
      return fmt::format("{}: {}", path, errno_text(errno));
    }
    if (S_ISLNK(st.st_mode)) return fmt::format("{} is a symlink", path);
    if (pos >= source.size()) {
      if (S_ISSOCK(st.st_mode)) return fmt::format("{} is a socket", path);
      if (S_ISFIFO(st.st_mode)) return fmt::format("{} is a FIFO", path);
      if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) return fmt::format("{} is a device", path);
      if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        return fmt::format("{} is not a directory or regular file", path);
      }
      return {};
    }
    std::size_t next = source.find('/', pos + 1);
    if (next == std::string::npos) next = source.size();
    path = source.substr(0, next);
    pos = next;
  }
}

std::string check_capabilities(const json& process) {
  if (!process.contains("capabilities")) return {};
  const json& caps = process["capabilities"];
  if (!caps.is_object()) return "process.capabilities is not an object";
  for (auto it = caps.begin(); it != caps.end(); ++it) {
    const std::string& set = it.key();
    if (!it->is_array()) return fmt::format("process.capabilities.{} is not an array", set);
    bool must_be_empty = set == "inheritable" || set == "ambient";
    for (const json& c : *it) {
      if (!c.is_string()) return fmt::format("process.capabilities.{} has a non-string", set);
      const std::string& name = c.get_ref<const std::string&>();
      if (must_be_empty || !contains(init_capabilities, name)) {
        return fmt::format("process.capabilities.{} grants {}", set, name);
      }
    }
  }
  return {};
}

std::string check_mount(const json& m, std::size_t i, const std::vector<std::string>& allowed) {
  const std::string at = fmt::format("mounts[{}]", i);
  if (!m.is_object()) return at + " is not an object";
  if (!m.contains("destination") || !m["destination"].is_string()) {
    return at + ".destination is missing";
  }
  const std::string& dest = m["destination"].get_ref<const std::string&>();
  auto dest_norm = normalize(dest);
  if (!dest_norm) return fmt::format("{}.destination {} is not absolute or has '..'", at, dest);
  if (*dest_norm == "/") return fmt::format("{}.destination is the root", at);
  const json options = m.contains("options") ? m["options"] : json::array();
  if (!options.is_array()) return at + ".options is not an array";
  for (const json& o : options) {
    if (!o.is_string()) return at + ".options has a non-string";
    const std::string& s = o.get_ref<const std::string&>();
    // rbind would carry whatever is mounted below the source on the host; suid/dev would
    // undo nosuid/nodev; shared propagation would leak mounts back to the host.
    if (s == "rbind" || s == "suid" || s == "dev" || s == "shared" || s == "rshared") {
      return fmt::format("{}.options has {}", at, s);
    }
  }
  std::string type;
  if (m.contains("type")) {
    if (!m["type"].is_string()) return at + ".type is not a string";
    type = m["type"].get<std::string>();
  }
  bool is_bind = type == "bind" || has_option(options, "bind");
  if (!is_bind) {
    if (type == "tmpfs") return {};
    if (type == "devpts") {
      // Only a private instance at /dev/pts: without newinstance (on old kernels) it would
      // be the host's, with every host pty in it.
      if (*dest_norm != "/dev/pts") return fmt::format("{} mounts devpts at {}", at, dest);
      for (auto required : {"newinstance", "nosuid", "noexec"}) {
        if (!has_option(options, required)) {
          return fmt::format("{} mounts devpts without {}", at, required);
        }
      }
      return {};
    }
    if (type == "proc") {
      if (*dest_norm != "/proc") return fmt::format("{} mounts proc at {}", at, dest);
      return {};
    }
    return fmt::format("{}.type {} is not bind, proc, tmpfs or devpts", at,
                       type.empty() ? std::string("(none)") : type);
  }
  if (!has_option(options, "nosuid") || !has_option(options, "nodev")) {
    return at + " is a bind without nosuid and nodev";
  }
  if (!m.contains("source") || !m["source"].is_string()) return at + ".source is missing";
  const std::string& source = m["source"].get_ref<const std::string&>();
  auto norm = normalize(source);
  if (!norm) return fmt::format("{}.source {} is not absolute or has '..'", at, source);
  for (const auto& root : allowed) {
    if (!is_within(*norm, root)) continue;
    if (std::string problem = check_source_on_host(*norm, root); !problem.empty()) {
      return fmt::format("{}.source {} is refused: {}", at, source, problem);
    }
    return {};
  }
  return fmt::format("{}.source {} is outside the allowed paths", at, source);
}

// ---------------------------------------------------------------------------------------
// write_bundle
// ---------------------------------------------------------------------------------------

/// Creates directory `name` under `dfd` with exactly `mode` (umask aside).
int make_dir(int dfd, const char* name, mode_t mode) {
  if (mkdirat(dfd, name, 0700) < 0) return errno;
  unique_fd fd(openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd || fchmod(fd.get(), mode) < 0) return errno;
  return 0;
}

/// Creates file `name` under `dfd` (which must not exist) holding `content`, mode `mode`.
int make_file(int dfd, const char* name, mode_t mode, std::string_view content = {}) {
  unique_fd fd(openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return errno;
  std::size_t off = 0;
  while (off < content.size()) {
    ssize_t n = write(fd.get(), content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    off += static_cast<std::size_t>(n);
  }
  if (fchmod(fd.get(), mode) < 0) return errno;
  return 0;
}

/// Builds the bundle's directories and files (everything but config.json) under `bundle_fd`.
/// Returns an empty string, or what failed.
std::string build_tree(int bundle_fd, const bundle_params& p, const image_view& img) {
  const std::string bundle_dir = p.workspace.native() + "/bundle";
  auto failed = [](std::string_view what, const std::string& path, int e) {
    return fmt::format("{} {}: {}", what, path, errno_text(e));
  };
  // 1. The root skeleton: mount points only; the runtime mounts everything else onto it.
  const std::string root = bundle_dir + "/rootfs";
  if (int e = make_dir(bundle_fd, "rootfs", 0755)) return failed("mkdir", root, e);
  unique_fd rfd(openat(bundle_fd, "rootfs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!rfd) return failed("open", root, errno);
  for (const auto& entry : img.entries) {
    const char* name = entry.name.c_str();
    int e = 0;
    switch (entry.kind) {
      case entry_kind::directory:
        e = make_dir(rfd.get(), name, 0755);
        break;
      case entry_kind::file:
        e = make_file(rfd.get(), name, 0644);
        break;
      case entry_kind::symlink:
        e = symlinkat(entry.target.c_str(), rfd.get(), name) < 0 ? errno : 0;
        break;
    }
    if (e != 0) return failed("create", root + "/" + entry.name, e);
  }
  // Our own mount points. A tmpfs mount point has the tmpfs root's mode (runc passes the
  // mount point's mode to the tmpfs ahead of ours).
  const std::pair<const char*, mode_t> dirs[] = {
      {"proc", 0555}, {"dev", 0755}, {"tmp", 01777}, {"home", 0755}, {"sandbox", 0755}};
  for (auto [name, mode] : dirs) {
    if (int e = make_dir(rfd.get(), name, mode)) return failed("mkdir", root + "/" + name, e);
  }
  if (p.kind == runtime_kind::runsc) {  // the empty /sys over gVisor's own (build_config)
    if (int e = make_dir(rfd.get(), "sys", 0555)) return failed("mkdir", root + "/sys", e);
  }
  if (int e = make_dir(rfd.get(), "home/sandbox", 0700)) {
    return failed("mkdir", root + "/home/sandbox", e);
  }
  if (int e = make_file(rfd.get(), ".sandbox-init", 0555)) {
    return failed("create", root + "/.sandbox-init", e);
  }
  if (int e = make_dir(rfd.get(), ".sandbox-etc", 0755)) {
    return failed("mkdir", root + "/.sandbox-etc", e);
  }
  {
    unique_fd sfd(openat(rfd.get(), "sandbox", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sfd) return failed("open", root + "/sandbox", errno);
    int e = make_dir(sfd.get(), p.input_name.c_str(), 0555);
    if (e != 0) return failed("mkdir", root + "/sandbox/" + p.input_name, e);
    if ((e = make_dir(sfd.get(), "out", 0755)) != 0) {
      return failed("mkdir", root + "/sandbox/out", e);
    }
    if ((e = make_file(sfd.get(), p.source_name.c_str(), 0444)) != 0) {
      return failed("create", root + "/sandbox/" + p.source_name, e);
    }
    // /sandbox can be traversed but not listed: the inputs' random name is learned from
    // SANDBOX_INPUT_DIR, not by looking around.
    if (fchmod(sfd.get(), 0111) < 0) return failed("chmod", root + "/sandbox", errno);
  }
  // 2. The bundle's own files, bound read-only into the run.
  const std::string files = bundle_dir + "/files";
  if (int e = make_dir(bundle_fd, "files", 0755)) return failed("mkdir", files, e);
  unique_fd ffd(openat(bundle_fd, "files", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!ffd) return failed("open", files, errno);
  for (const auto& f : etc_files) {
    std::string name(f.name);
    if (int e = make_file(ffd.get(), name.c_str(), 0444, f.content)) {
      return failed("create", files + "/" + name, e);
    }
  }
  for (std::size_t i = 0; i < account_files.size(); ++i) {
    if (!img.accounts[i]) continue;
    const std::string name(account_files[i]);
    const std::string content = name == "passwd"
                                    ? passwd_with_run_account(*img.accounts[i], p.uid, p.gid)
                                    : group_with_run_account(*img.accounts[i], p.gid);
    if (int e = make_file(ffd.get(), name.c_str(), 0444, content)) {
      return failed("create", files + "/" + name, e);
    }
  }
  if (int e = make_file(ffd.get(), "node-proxy.cjs", 0444, node_proxy_preload())) {
    return failed("create", files + "/node-proxy.cjs", e);
  }
  if (p.kind == runtime_kind::runsc) {
    const std::string name(no_device_file);
    if (int e = make_file(ffd.get(), name.c_str(), 0))
      return failed("create", files + "/" + name, e);
  }
  const auto boot_id = random_uuid();
  if (!boot_id) return failed("getrandom for", files + "/boot_id", errno);
  if (int e = make_file(ffd.get(), "boot_id", 0444, *boot_id + "\n")) {
    return failed("create", files + "/boot_id", e);
  }
  return {};
}

}  // namespace

std::string_view node_proxy_preload() noexcept { return embedded::node_proxy_preload(); }

nlohmann::json seccomp_section(runtime_kind kind) {
  const auto enforcer =
      kind == runtime_kind::runsc ? seccomp_enforcer::oci_gvisor : seccomp_enforcer::oci_stacked;
  json syscalls = json::array();
  for (const auto& row : seccomp_table()) {
    for (const auto& rule : row.rules) {
      const auto action = seccomp_action_for(row, rule, enforcer);
      if (action.kind != seccomp_action_kind::none) {
        syscalls.push_back(oci_rule(row.syscall, rule, action));
      }
    }
  }
  // crun/runc: the i386 and x32 ABIs are listed (default allow) so that their calls reach
  // sandbox-init's filter, which sends every non-native call to the host as a violation. Left
  // out, they would hit this filter's bad-architecture action (an errno), which takes
  // precedence over user notification and hides the attempt from the host. gVisor runs
  // neither ABI at all.
  json arches = json::array({"SCMP_ARCH_X86_64"});
  if (kind != runtime_kind::runsc) {
    arches.push_back("SCMP_ARCH_X86");
    arches.push_back("SCMP_ARCH_X32");
  }
  return {{"defaultAction", "SCMP_ACT_ALLOW"},
          {"architectures", std::move(arches)},
          {"syscalls", std::move(syscalls)}};
}

result<nlohmann::json> make_config(const bundle_params& p, std::string* why) {
  if (auto err = validate(p, why)) return *err;
  auto img = read_image(p.image_root, why);
  if (!img) return img.error();
  return build_config(p, *img);
}

std::string check_config(const nlohmann::json& config,
                         const std::vector<std::filesystem::path>& allowed,
                         bool runtime_network_namespace) {
  if (!config.is_object()) return "the document is not an object";
  if (config.contains("hooks")) return "hooks are not allowed";
  // The allowed roots, in normal form; "/" and relative paths allow nothing.
  std::vector<std::string> roots;
  for (const auto& a : allowed) {
    auto n = normalize(a.native());
    if (n && *n != "/") roots.push_back(std::move(*n));
  }
  // root
  if (!config.contains("root") || !config["root"].is_object()) return "root is missing";
  const json& root = config["root"];
  if (!root.contains("readonly") || root["readonly"] != true) return "root.readonly is not true";
  if (!root.contains("path") || !root["path"].is_string()) return "root.path is missing";
  const std::string& root_path = root["path"].get_ref<const std::string&>();
  if (path_problem(root_path) != nullptr || !root_path.ends_with("/bundle/rootfs")) {
    return fmt::format("root.path {} is not a clean absolute <workspace>/bundle/rootfs", root_path);
  }
  struct stat st {};
  if (lstat(root_path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return fmt::format("root.path {} is not a directory", root_path);
  }
  // process
  if (!config.contains("process") || !config["process"].is_object()) return "process is missing";
  const json& process = config["process"];
  if (process.contains("terminal") && process["terminal"] != false) {
    return "process.terminal is set";
  }
  if (!process.contains("noNewPrivileges") || process["noNewPrivileges"] != true) {
    return "process.noNewPrivileges is not true";
  }
  if (std::string bad = check_capabilities(process); !bad.empty()) return bad;
  // mounts
  if (config.contains("mounts")) {
    const json& mounts = config["mounts"];
    if (!mounts.is_array()) return "mounts is not an array";
    for (std::size_t i = 0; i < mounts.size(); ++i) {
      if (std::string bad = check_mount(mounts[i], i, roots); !bad.empty()) return bad;
    }
  }
  // linux
  if (!config.contains("linux") || !config["linux"].is_object()) return "linux is missing";
  const json& lx = config["linux"];
  if (lx.contains("sysctl")) return "linux.sysctl is not allowed";
  if (lx.contains("devices") && !lx["devices"].empty()) {
    return "linux.devices is not allowed";
  }
  if (lx.contains("rootfsPropagation")) {
    const json& prop = lx["rootfsPropagation"];
    if (prop == "shared" || prop == "rshared") return "linux.rootfsPropagation is shared";
  }
  if (!lx.contains("namespaces") || !lx["namespaces"].is_array()) {
    return "linux.namespaces is missing";
  }
  std::vector<std::string> types;
  for (std::size_t i = 0; i < lx["namespaces"].size(); ++i) {
    const json& ns = lx["namespaces"][i];
    if (!ns.is_object() || !ns.contains("type") || !ns["type"].is_string()) {
      return fmt::format("linux.namespaces[{}] has no type", i);
    }
    if (ns.contains("path")) {
      return fmt::format("linux.namespaces[{}] joins an existing namespace", i);
    }
    types.push_back(ns["type"].get<std::string>());
  }
  for (auto t : required_namespaces) {
    if (t == "network" && runtime_network_namespace) continue;
    if (std::find(types.begin(), types.end(), t) == types.end()) {
      return fmt::format("linux.namespaces lacks {}", t);
    }
  }
  if (lx.contains("resources") && lx["resources"].contains("devices")) {
    for (const json& d : lx["resources"]["devices"]) {
      if (d.contains("allow") && d["allow"] != false) {
        return "linux.resources.devices allows a device";
      }
    }
  }
  return {};
}

result<bundle> write_bundle(const bundle_params& p, std::string* why) {
  if (auto err = validate(p, why)) return *err;
  auto img = read_image(p.image_root, why);
  if (!img) return img.error();

  bundle b;
  b.dir = p.workspace / "bundle";
  b.config_path = b.dir / "config.json";
  // The bundle directory is ours only once mkdir succeeds: an existing one is left alone.
  if (mkdir(b.dir.c_str(), 0700) < 0) {
    return io_failure(why, fmt::format("mkdir {}: {}", b.dir.native(), errno_text(errno)));
  }
  auto fail = [&](boost::system::error_code ec, std::string reason) {
    remove_bundle(b.dir);
    if (why != nullptr) *why = std::move(reason);
    return ec;
  };
  unique_fd bfd(open(b.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!bfd) {
    int e = errno;
    return fail(make_error_code(errc::io_error),
                fmt::format("open {}: {}", b.dir.native(), errno_text(e)));
  }
  // The runtimes run as root; the run itself never sees this directory.
  if (fchmod(bfd.get(), 0711) < 0) {
    int e = errno;
    return fail(make_error_code(errc::io_error),
                fmt::format("chmod {}: {}", b.dir.native(), errno_text(e)));
  }
  if (std::string failed = build_tree(bfd.get(), p, *img); !failed.empty()) {
    return fail(make_error_code(errc::io_error), std::move(failed));
  }
  b.config = build_config(p, *img);
  // Prove the closed set of host paths on what will be written, with the files in place (a
  // symlinked or socket input, source or init executable is refused here).
  const std::vector<fs::path> allowed = {p.image_root, p.inputs,        p.source,
                                         p.output_dir, b.dir / "files", p.init_executable};
  if (std::string bad = check_config(b.config, allowed, p.runtime_network_namespace);
      !bad.empty()) {
    return fail(make_error_code(errc::invalid_argument), "generated config.json refused: " + bad);
  }
  if (int e = make_file(bfd.get(), "config.json", 0600, b.config.dump(2) + "\n")) {
    return fail(make_error_code(errc::io_error),
                fmt::format("create {}: {}", b.config_path.native(), errno_text(e)));
  }
  return b;
}

void remove_bundle(const std::filesystem::path& dir) noexcept {
  unique_fd root(open((dir / "rootfs").c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (root && fstatat(root.get(), "sandbox", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISDIR(st.st_mode)) {
    fchmodat(root.get(), "sandbox", 0700, 0);
  }
  remove_tree(dir);
}

}  // namespace sandbox::detail::oci
