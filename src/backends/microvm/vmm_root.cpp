// The VMM's prepared root (see vmm_root.hpp).
#include "backends/microvm/vmm_root.hpp"

#include <elf.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "protocol/sha256.hpp"
#include "store/publish.hpp"
#include "store/store_io.hpp"
#include "sys/tool_process.hpp"

namespace sandbox::detail {
namespace {

namespace fs = std::filesystem;

// PT_INTERP of a 64-bit ELF executable, or "" (not an ELF64, no interpreter, unreadable).
std::string elf_interpreter(const fs::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  Elf64_Ehdr eh{};
  if (::pread(fd, &eh, sizeof eh, 0) == static_cast<ssize_t>(sizeof eh) &&
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
      eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum < 256) {
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph{};
      if (::pread(fd, &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + i * sizeof ph)) !=
          static_cast<ssize_t>(sizeof ph)) {
        break;
      }
      if (ph.p_type != PT_INTERP) continue;
      if (ph.p_filesz < 2 || ph.p_filesz > 4096) break;
      std::string s(ph.p_filesz, '\0');
      if (::pread(fd, s.data(), s.size(), static_cast<off_t>(ph.p_offset)) ==
          static_cast<ssize_t>(s.size())) {
        s.resize(std::strlen(s.c_str()));
        if (!s.empty() && s[0] == '/') out = s;
      }
      break;
    }
  }
  ::close(fd);
  return out;
}

// Copies the host file `src` to `dst` (created exclusively), mode `mode`.
bool copy_file(const fs::path& src, const fs::path& dst, mode_t mode) {
  int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;
  int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (out < 0) {
    ::close(in);
    return false;
  }
  bool ok = true;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ok = false;
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::write(out, buf + off, static_cast<std::size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ok = false;
        break;
      }
      off += w;
    }
    if (!ok) break;
  }
  ok = ok && ::fchmod(out, mode) == 0 && ::fsync(out) == 0;  // (the manifest vouches for it)
  ::close(in);
  ::close(out);
  return ok;
}

// Recreates host path `path` (absolute) under `root`: every symbolic link on the way as the
// same link (so the loader's and QEMU's own lookups resolve there as on the host), every
// directory as an empty 0755 directory, the final file hard-linked or copied. Adds what it made to
// `made`.
bool replicate(const fs::path& root, const fs::path& path, std::set<std::string>* made,
               std::string* why, int depth = 0) {
  if (depth > 40) return *why = "too many symbolic links at " + path.string(), false;
  fs::path cur = "/";
  const fs::path norm = path.lexically_normal();
  for (auto it = std::next(norm.begin()); it != norm.end(); ++it) {
    cur /= *it;
    struct stat st {};
    if (::lstat(cur.c_str(), &st) < 0) return *why = "missing " + cur.string(), false;
    const fs::path in_root = root / cur.relative_path();
    const bool last = std::next(it) == norm.end();
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(cur, ec);
      if (ec) return *why = "cannot read link " + cur.string(), false;
      if (made->insert(cur.string()).second) {
        fs::create_symlink(target, in_root, ec);
        if (ec) return *why = "cannot link " + in_root.string(), false;
      }
      fs::path rest;
      for (auto r = std::next(it); r != norm.end(); ++r) rest /= *r;
      fs::path next = target.is_absolute() ? target : cur.parent_path() / target;
      if (!rest.empty()) next /= rest;  // (`/ ""` would add a trailing separator)
      return replicate(root, next.lexically_normal(), made, why, depth + 1);
    }
    if (S_ISDIR(st.st_mode)) {
      if (made->insert(cur.string()).second && ::mkdir(in_root.c_str(), 0755) < 0 &&
          errno != EEXIST) {
        return *why = fmt::format("mkdir {}: errno {}", in_root.string(), errno), false;
      }
      if (last) return true;
      continue;
    }
    if (!last || !S_ISREG(st.st_mode)) return *why = "not a regular file: " + cur.string(), false;
    // A hard link where the file system allows it (no second copy on disk; the host's own
    // root-owned file), else a copy; never a set-id file.
    if (made->insert(cur.string()).second &&
        !((st.st_mode & 06000) == 0 && st.st_uid == 0 &&
          ::link(cur.c_str(), in_root.c_str()) == 0) &&
        !copy_file(cur, in_root, st.st_mode & 0755)) {
      return *why = fmt::format("cannot copy {}: errno {}", cur.string(), errno), false;
    }
    return true;
  }
  return true;
}

// `<interpreter> --list <elf>`'s libraries, or a reason.
bool loader_list(const std::string& interp, const fs::path& elf, std::vector<std::string>* libs,
                 std::string* why) {
  auto r = run_tool({interp, "--list", elf.string()}, minimal_tool_env(), std::chrono::seconds(30));
  if (!r || !r->ok()) {
    return *why = "`" + interp + " --list " + elf.string() + "` failed" +
                  (r ? ": " + r->describe() : std::string()),
           false;
  }
  std::string missing;
  *libs = parse_loader_list(r->output, &missing);
  if (!missing.empty()) return *why = elf.string() + " needs " + missing + ": not found", false;
  return true;
}

// A published root is a directory holding `root/` (what the VMM sees) and `manifest`, beside
// it so the VMM never sees it: "<manifest_version> <sha256 of the key's input>\n", then
// list_tree's lines for `root/`.
constexpr const char* root_name = "root";
constexpr const char* manifest_name = "manifest";
constexpr std::string_view manifest_version = "vmm-root-manifest 1";

// Every entry below the directory open at `dfd`, one sorted line each:
// "d <path>", "l <path> <target>", "f <path> <size> <mode>" (paths relative, no leading /;
// anything else: "? <path>"). Never follows a link. nullopt when a directory cannot be read.
std::optional<std::string> list_tree(int dfd) {
  std::vector<std::string> lines;
  std::function<bool(int, const std::string&, int)> walk = [&](int dir, const std::string& prefix,
                                                               int depth) {
    if (depth > 64) return false;
    auto names = list_dir_names(dir);
    if (!names) return false;
    for (const auto& n : *names) {
      const std::string rel = prefix + n;
      struct stat st {};
      if (::fstatat(dir, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return false;
      if (S_ISDIR(st.st_mode)) {
        lines.push_back("d " + rel);
        auto sub = open_dir_at(dir, n);
        if (!sub || !walk(sub->get(), rel + "/", depth + 1)) return false;
      } else if (S_ISLNK(st.st_mode)) {
        std::string target(PATH_MAX, '\0');
        ssize_t len = ::readlinkat(dir, n.c_str(), target.data(), target.size());
        if (len < 0) return false;
        target.resize(static_cast<std::size_t>(len));
        lines.push_back("l " + rel + " " + target);
      } else if (S_ISREG(st.st_mode)) {
        lines.push_back(fmt::format("f {} {} {:o}", rel, st.st_size, st.st_mode & 07777));
      } else {
        lines.push_back("? " + rel);
      }
    }
    return true;
  };
  if (!walk(dfd, "", 0)) return std::nullopt;
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace

std::vector<std::string> parse_loader_list(const std::string& text, std::string* missing) {
  // "\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)", "\t/lib64/ld-linux-x86-64.so.2
  // (0x…)", "\tlinux-vdso.so.1 (0x…)", "\tlibfoo.so.1 => not found".
  std::vector<std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    auto b = line.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    line.erase(0, b);
    std::string path;
    if (auto arrow = line.find(" => "); arrow != std::string::npos) {
      path = line.substr(arrow + 4);
      if (path.rfind("not found", 0) == 0) {
        if (missing->empty()) *missing = line.substr(0, arrow);
        continue;
      }
    } else {
      path = line;
    }
    path = path.substr(0, path.find(" ("));
    if (!path.empty() && path[0] == '/') out.push_back(path);
  }
  return out;
}

std::variant<vmm_root, std::string> prepare_vmm_root(const fs::path& state,
                                                     const fs::path& binary) {
  const fs::path exe = fs::absolute(binary).lexically_normal();
  const std::string interp = elf_interpreter(exe);
  if (interp.empty()) return exe.string() + " is not a 64-bit ELF executable with an interpreter";
  std::vector<fs::path> files = {exe, interp};
  std::vector<std::string> libs;
  std::string why;
  if (!loader_list(interp, exe, &libs, &why)) return why;
  files.insert(files.end(), libs.begin(), libs.end());
  // The TCG accelerator is a module in distribution builds (--enable-modules), found by QEMU
  // at <prefix>/lib/<multiarch>/qemu (its CONFIG_QEMU_MODDIR, also tried relative to the
  // executable).
  const fs::path prefix = exe.parent_path().parent_path();
  std::error_code ec;
  std::vector<fs::path> module_dirs = {prefix / "lib" / "qemu", prefix / "lib64" / "qemu"};
  for (const auto& e : fs::directory_iterator(prefix / "lib", ec)) {
    module_dirs.push_back(e.path() / "qemu");
  }
  for (const auto& dir : module_dirs) {
    const fs::path mod = dir / "accel-tcg-x86_64.so";
    struct stat st {};
    if (::stat(mod.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (!loader_list(interp, mod, &libs, &why)) return why;
    files.push_back(mod);
    files.insert(files.end(), libs.begin(), libs.end());
  }
  const fs::path firmware = prefix / "share" / "qemu" / "bios-microvm.bin";
  if (::access(firmware.c_str(), R_OK) != 0) return firmware.string() + " is missing";
  files.push_back(firmware);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());

  // The key: what would be copied, as the host has it now.
  // (Version 2: published roots with a manifest. Older versions' roots keep their own keys,
  // so a root a live VMM of an older version uses is never judged wrong and replaced.)
  std::string id = "vmm-root 2\n";
  for (const auto& f : files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) return f.string() + " is missing";
    id += fmt::format("{} {} {} {} {}.{}\n", f.string(), st.st_dev, st.st_ino, st.st_size,
                      st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  }
  const fs::path base = state / "vmm-root";
  fs::create_directories(base, ec);
  if (ec) return "cannot create " + base.string();
  ::chmod(base.c_str(), 0711);
  auto base_fd = open_dir_at(AT_FDCWD, base.string());
  if (!base_fd) return "cannot open " + base.string() + ": " + base_fd.error().message();
  const std::string key = sha256_hex(id).substr(0, 24);
  vmm_root root{base / key / root_name, exe.string(), {}};

  // Every process starting the level shares the root, so it is published (store/publish.hpp):
  // built under a unique temporary name, its manifest written last, renamed into place; one
  // whose tree is not its manifest's (or without one: a partial build) is rebuilt and
  // exchanged, never used.
  const std::string header = fmt::format("{} {}\n", manifest_version, sha256_hex(id));
  auto built = publish_dir_at(
      base_fd->get(), key, 0755,
      [&](int dfd, const std::string& tmp_name) -> result<void> {
        const fs::path tmp = base / tmp_name / root_name;
        if (::mkdirat(dfd, root_name, 0755) != 0 || ::chmod(tmp.c_str(), 0755) != 0) {
          why = fmt::format("mkdir {}: errno {}", tmp.string(), errno);
          return make_error_code(errc::io_error);
        }
        std::set<std::string> made;
        for (const auto& f : files) {
          if (!replicate(tmp, f, &made, &why)) return make_error_code(errc::io_error);
        }
        // Mount points: /proc (a procfs of the VMM's own pid namespace), /dev/null and
        // /dev/kvm (bind targets; /dev/kvm only bound when KVM is used).
        for (const char* d : {"/proc", "/dev"}) {
          if (made.insert(d).second && ::mkdir((tmp / (d + 1)).c_str(), 0755) < 0) {
            why = fmt::format("mkdir {}: errno {}", (tmp / (d + 1)).string(), errno);
            return make_error_code(errc::io_error);
          }
        }
        for (const char* f : {"dev/null", "dev/kvm"}) {
          int fd = ::open((tmp / f).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
          if (fd < 0) {
            why = fmt::format("creating {}: errno {}", (tmp / f).string(), errno);
            return make_error_code(errc::io_error);
          }
          ::close(fd);
        }
        auto rfd = open_dir_at(dfd, root_name);
        if (!rfd) return rfd.error();
        auto listing = list_tree(rfd->get());
        if (!listing) return make_error_code(errc::io_error);
        // Written last, fsync'd: a root with its manifest is complete.
        return replace_file_at(dfd, manifest_name, header + *listing, 0444);
      },
      [&](int dfd) {
        auto rfd = open_dir_at(dfd, root_name);
        if (!rfd) return false;
        auto listing = list_tree(rfd->get());
        auto manifest = read_file_at(dfd, manifest_name, 16 << 20);
        return listing && manifest && *manifest == header + *listing;
      });
  if (!built) {
    return "preparing the VMM root " + root.dir.string() + ": " +
           (why.empty() ? built.error().message() : why);
  }
  std::error_code e;
  for (auto it = fs::recursive_directory_iterator(root.dir, e);
       !e && it != fs::recursive_directory_iterator(); it.increment(e)) {
    root.entries.push_back("/" + it->path().lexically_relative(root.dir).string());
  }
  std::sort(root.entries.begin(), root.entries.end());
  return root;
}

}  // namespace sandbox::detail
