#include "store/layer_apply.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>

namespace sandbox::detail {
namespace {

std::atomic<bool> g_openat2_disabled{false};

bool is_system_code(const boost::system::error_code& ec) {
  return ec.category() == boost::system::system_category() ||
         ec.category() == boost::system::generic_category();
}

// A member name for host logs: printable ASCII as is, anything else as \xNN, at most 256
// bytes shown.
std::string display(std::string_view raw) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw.substr(0, 256)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      s += static_cast<char>(c);
    } else {
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 0xf];
    }
  }
  if (raw.size() > 256) s += "...";
  return s;
}

}  // namespace

void set_openat2_disabled_for_testing(bool disabled) noexcept { g_openat2_disabled = disabled; }

std::string join_path(const std::vector<std::string>& comps, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n && i < comps.size(); ++i) {
    if (i) out += '/';
    out += comps[i];
  }
  return out;
}

result<std::vector<std::string>> split_member_path(std::string_view raw) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i <= raw.size()) {
    std::size_t j = raw.find('/', i);
    if (j == std::string_view::npos) j = raw.size();
    std::string_view comp = raw.substr(i, j - i);
    i = j + 1;
    if (comp.empty() || comp == ".") continue;
    if (comp == ".." || comp.size() > 255) return store_error(errc::corrupt);
    out.emplace_back(comp);
    if (out.size() > 256) return store_error(errc::corrupt);
  }
  return out;
}

result<unique_fd> open_in_root(int root_fd, const std::vector<std::string>& rel, int flags) {
  if (rel.empty()) {
    int fd = ::openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return sys_error(errno);
    return unique_fd(fd);
  }
  const std::string path = join_path(rel, rel.size());
  if (!g_openat2_disabled.load(std::memory_order_relaxed)) {
    open_how how{};
    how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
    for (int attempt = 0; attempt < 16; ++attempt) {
      long fd = ::syscall(SYS_openat2, root_fd, path.c_str(), &how, sizeof how);
      if (fd >= 0) return unique_fd(static_cast<int>(fd));
      // EAGAIN: the lookup raced with a rename or mount; the kernel asks us to retry.
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ENOSYS) break;  // old kernel: use the strict walk below
      return sys_error(errno);
    }
    if (errno != ENOSYS) return sys_error(errno);
  }
  // Fallback without openat2: walk one component at a time and refuse every symlink.
  int cur_fd = ::openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cur_fd < 0) return sys_error(errno);
  unique_fd cur(cur_fd);
  for (std::size_t i = 0; i < rel.size(); ++i) {
    const bool last = i + 1 == rel.size();
    int f =
        last ? (flags | O_NOFOLLOW | O_CLOEXEC) : (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fd = ::openat(cur.get(), rel[i].c_str(), f);
    if (fd < 0) return sys_error(errno);
    cur.reset(fd);
  }
  return cur;
}

boost::system::error_code layer_applier::corrupt(std::string why) {
  detail_ = std::move(why);
  return store_error(errc::corrupt);
}

boost::system::error_code layer_applier::io(std::string what, const boost::system::error_code& ec) {
  detail_ = std::move(what) + ": " + ec.message();
  return store_error(errc::io_error);
}

result<unique_fd> layer_applier::parent_dir(const std::vector<std::string>& comps, bool create) {
  const std::vector<std::string> parent(comps.begin(), comps.end() - 1);
  auto direct = open_in_root(root_fd_, parent, O_RDONLY | O_DIRECTORY);
  if (direct || !create || direct.error().value() != ENOENT) return direct;
  // Some parent is missing: walk down, creating what is absent. Each directory is created
  // with mkdirat() in the (in-root) directory the previous prefix resolved to.
  auto cur = open_in_root(root_fd_, {}, O_RDONLY | O_DIRECTORY);
  if (!cur) return cur;
  std::vector<std::string> prefix;
  for (const auto& comp : parent) {
    prefix.push_back(comp);
    auto next = open_in_root(root_fd_, prefix, O_RDONLY | O_DIRECTORY);
    if (!next && next.error().value() == ENOENT) {
      if (::mkdirat(cur->get(), comp.c_str(), 0700) == 0) {
        const std::string p = join_path(prefix, prefix.size());
        dirs_.try_emplace(p, dir_meta{});  // 0755 unless the layer names it later
        seen_.insert(p);
      } else if (errno != EEXIST) {
        return sys_error(errno);
      }
      next = open_in_root(root_fd_, prefix, O_RDONLY | O_DIRECTORY);
    }
    if (!next) return next;
    cur = std::move(next);
  }
  return cur;
}

result<void> layer_applier::remove_existing(int pfd, const std::string& name, bool keep_dir) {
  struct stat st {};
  if (::fstatat(pfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return {};
    return io("stat " + display(name), sys_error(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    if (keep_dir) return {};
    if (auto r = remove_tree_at(pfd, name); !r) return io("remove " + display(name), r.error());
    return {};
  }
  if (::unlinkat(pfd, name.c_str(), 0) != 0 && errno != ENOENT) {
    return io("unlink " + display(name), sys_error(errno));
  }
  return {};
}

result<void> layer_applier::whiteout(const std::vector<std::string>& comps) {
  ++stats_.whiteouts;
  const std::string& name = comps.back();
  auto pfd = parent_dir(comps, /*create=*/false);
  if (!pfd) {
    const int e = pfd.error().value();
    if (e == ENOENT || e == ENOTDIR) return {};  // nothing below to hide
    if (e == ELOOP || e == EXDEV) return corrupt("whiteout parent leaves the root");
    return io("open whiteout parent", pfd.error());
  }
  const std::string parent_path = join_path(comps, comps.size() - 1);
  auto child_path = [&](const std::string& n) {
    return parent_path.empty() ? n : parent_path + "/" + n;
  };
  if (name == ".wh..wh..opq") {
    // Opaque directory: hide everything lower layers put here; keep this layer's entries.
    auto names = list_dir_names(pfd->get());
    if (!names) return io("list opaque directory", names.error());
    for (const auto& n : *names) {
      if (seen_.count(child_path(n))) continue;
      if (auto r = remove_tree_at(pfd->get(), n); !r) return io("remove " + display(n), r.error());
    }
    return {};
  }
  if (name.rfind(".wh..wh.", 0) == 0) return {};  // aufs metadata: not part of the image
  const std::string target = name.substr(4);
  if (!is_plain_name(target)) return corrupt("bad whiteout name " + display(name));
  if (seen_.count(child_path(target))) return {};  // applies to lower layers only
  if (auto r = remove_tree_at(pfd->get(), target); !r) {
    return io("remove " + display(target), r.error());
  }
  return {};
}

result<void> layer_applier::write_file(tar_reader& tar, const tar_entry& e, int pfd,
                                       const std::string& name) {
  int fd = ::openat(pfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return io("create " + display(e.path), sys_error(errno));
  unique_fd out(fd);
  if (e.size > limits_.max_bytes || stats_.bytes + e.size > limits_.max_bytes) {
    return corrupt("the image exceeds the unpack limit of " + std::to_string(limits_.max_bytes) +
                   " bytes");
  }
  constexpr std::size_t chunk_size = 1 << 20;
  std::unique_ptr<char[]> buf(new char[chunk_size]);
  std::uint64_t left = e.size;
  while (left > 0) {
    auto r = tar.read_data(buf.get(), chunk_size);
    if (!r) {
      if (r.error() == store_error(errc::corrupt)) return corrupt(tar.error_detail());
      return io("read layer", r.error());
    }
    if (*r == 0) return corrupt("short member data");
    if (!write_all(fd, buf.get(), *r)) return io("write " + display(e.path), sys_error(errno));
    left -= *r;
  }
  if (set_owners_) {
    // Failures (ids not mapped in a user namespace) leave the file ours: harmless.
    (void)::fchown(fd, static_cast<uid_t>(e.uid), static_cast<gid_t>(e.gid));
  }
  std::uint32_t mode = e.mode & 07777;
  if (mode & 06000) {
    ++stats_.cleared_setid;
    mode &= ~06000U;
  }
  if (::fchmod(fd, mode) != 0) return io("chmod " + display(e.path), sys_error(errno));
  const timespec ts[2] = {{e.mtime, 0}, {e.mtime, 0}};
  (void)::futimens(fd, ts);
  ++stats_.files;
  stats_.bytes += e.size;
  return {};
}

result<void> layer_applier::apply_entry(tar_reader& tar, const tar_entry& e) {
  auto split = split_member_path(e.path);
  if (!split) return corrupt("member name escapes the root or is too long: " + display(e.path));
  const std::vector<std::string>& comps = *split;
  if (comps.empty()) {
    if (e.type != '5') return corrupt("non-directory member names the root");
    dir_meta m{e.mode & 01777U, e.uid, e.gid, e.mtime, true};
    dirs_[""] = m;
    return {};
  }
  const std::string& name = comps.back();
  const std::string path = join_path(comps, comps.size());
  if (name.rfind(".wh.", 0) == 0) return whiteout(comps);

  switch (e.type) {
    case '0':
    case '1':
    case '2':
    case '5':
      break;
    case '3':
    case '4':
    case '6':
      ++stats_.skipped_special;  // device nodes and FIFOs never enter a runtime image
      return {};
    default:
      return corrupt(std::string("unsupported tar member type '") + e.type + "' for " +
                     display(e.path));
  }

  auto pfd = parent_dir(comps, /*create=*/true);
  if (!pfd) {
    const int e2 = pfd.error().value();
    if (is_system_code(pfd.error()) &&
        (e2 == ENOENT || e2 == ENOTDIR || e2 == ELOOP || e2 == EXDEV || e2 == EEXIST)) {
      return corrupt("parent of " + display(e.path) + " is not a directory inside the root");
    }
    return io("open parent of " + display(e.path), pfd.error());
  }
  const int dir = pfd->get();

  switch (e.type) {
    case '5': {
      if (auto r = remove_existing(dir, name, /*keep_dir=*/true); !r) return r;
      if (::mkdirat(dir, name.c_str(), 0700) != 0 && errno != EEXIST) {
        return io("mkdir " + display(e.path), sys_error(errno));
      }
      dirs_[path] = dir_meta{e.mode & 01777U, e.uid, e.gid, e.mtime, true};
      if (e.mode & 06000) ++stats_.cleared_setid;
      break;
    }
    case '0': {
      if (auto r = remove_existing(dir, name, /*keep_dir=*/false); !r) return r;
      if (auto r = write_file(tar, e, dir, name); !r) return r;
      break;
    }
    case '2': {
      if (e.link.empty()) return corrupt("empty symlink target for " + display(e.path));
      if (auto r = remove_existing(dir, name, /*keep_dir=*/false); !r) return r;
      // The target is stored verbatim; it is only ever resolved inside the root.
      if (::symlinkat(e.link.c_str(), dir, name.c_str()) != 0) {
        return io("symlink " + display(e.path), sys_error(errno));
      }
      if (set_owners_) {
        (void)::fchownat(dir, name.c_str(), static_cast<uid_t>(e.uid), static_cast<gid_t>(e.gid),
                         AT_SYMLINK_NOFOLLOW);
      }
      const timespec ts[2] = {{e.mtime, 0}, {e.mtime, 0}};
      (void)::utimensat(dir, name.c_str(), ts, AT_SYMLINK_NOFOLLOW);
      break;
    }
    case '1': {
      auto target = split_member_path(e.link);
      if (!target || target->empty()) {
        return corrupt("hard link target escapes the root: " + display(e.link));
      }
      auto tdir = parent_dir(*target, /*create=*/false);
      if (!tdir) return corrupt("hard link target not inside the root: " + display(e.link));
      struct stat tst {};
      if (::fstatat(tdir->get(), target->back().c_str(), &tst, AT_SYMLINK_NOFOLLOW) != 0) {
        return corrupt("hard link target missing: " + display(e.link));
      }
      if (S_ISDIR(tst.st_mode)) return corrupt("hard link to a directory: " + display(e.link));
      struct stat cur {};
      if (::fstatat(dir, name.c_str(), &cur, AT_SYMLINK_NOFOLLOW) == 0 &&
          cur.st_dev == tst.st_dev && cur.st_ino == tst.st_ino) {
        break;  // already that file
      }
      if (auto r = remove_existing(dir, name, /*keep_dir=*/false); !r) return r;
      if (::linkat(tdir->get(), target->back().c_str(), dir, name.c_str(), 0) != 0) {
        return io("link " + display(e.path), sys_error(errno));
      }
      break;
    }
  }
  seen_.insert(path);
  return {};
}

result<void> layer_applier::apply(tar_reader& tar) {
  seen_.clear();
  tar_entry e;
  for (;;) {
    auto step = tar.next(e);
    if (!step) {
      if (step.error() == store_error(errc::corrupt)) return corrupt(tar.error_detail());
      return io("read layer", step.error());
    }
    if (*step == tar_step::end) return {};
    if (++stats_.entries > limits_.max_entries) {
      return corrupt("the image exceeds the unpack limit of " +
                     std::to_string(limits_.max_entries) + " entries");
    }
    try {
      if (auto r = apply_entry(tar, e); !r) return r;
    } catch (const std::bad_alloc&) {
      return io("apply layer", sys_error(ENOMEM));
    }
  }
}

result<void> layer_applier::finish() {
  // Deepest first (reverse byte order puts "a/b" before "a"), so making a directory
  // read-only never blocks fixing up the ones below it.
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
    const auto& [path, meta] = *it;
    auto comps = split_member_path(path);
    if (!comps) continue;
    auto fd = open_in_root(root_fd_, *comps, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (!fd) continue;  // replaced or whited out by a later layer
    if (set_owners_ && meta.owners) {
      (void)::fchown(fd->get(), static_cast<uid_t>(meta.uid), static_cast<gid_t>(meta.gid));
    }
    if (::fchmod(fd->get(), meta.mode & 01777U) != 0) {
      return io("chmod directory " + display(path), sys_error(errno));
    }
    if (meta.mtime >= 0) {
      const timespec ts[2] = {{meta.mtime, 0}, {meta.mtime, 0}};
      (void)::futimens(fd->get(), ts);
    }
  }
  return {};
}

}  // namespace sandbox::detail
