// The run's filesystem and network, assembled inside its own mount and net namespaces.
//
// The new root is a small tmpfs (read-only once built) holding:
//   /<entries of the image>  read-only, nosuid, nodev binds of the image's top-level
//                            directories and files; its symlinks copied as symlinks
//   /proc                    fresh procfs of the run's pid namespace, hidepid=invisible,
//                            kcore/keys/timer_list/sched_debug/sysrq-trigger/locks masked,
//                            /proc/sys read-only
//   /dev                     tmpfs with null, zero, full, random, urandom, tty bound from
//                            the host, fd/stdin/stdout/stderr symlinks, ptmx -> pts/ptmx;
//                            read-only
//   /dev/pts                 a devpts instance of the run's own (newinstance, at most
//                            `max_ptys`): its ptys only, never the host's or another run's
//   /dev/shm, /tmp, /home/sandbox  size- and inode-capped tmpfs (ENOSPC before OOM)
//   /sandbox/in-<random>     the inputs, read-only, noexec (/sandbox itself: mode 0111)
//   /sandbox/out             the output tmpfs (size-capped); the host keeps a descriptor of it
//   /sandbox/<source name>   the source, read-only
//   /etc/resolv.conf, /etc/hosts, /etc/hostname   replaced when the image has them as files
//   /etc/passwd, /etc/group  the image's with the run's own entry (wire/accounts.hpp), where
//                            the image has them as regular files under a real /etc
// Nothing else of the host is reachable: no host socket, no host /tmp, no /sys.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "helpers/init/init.hpp"
#include "sys/random.hpp"
#include "wire/accounts.hpp"

namespace sandbox::init {
namespace {

using detail::random_uuid;

constexpr unsigned long bind_ro_flags = MS_NOSUID | MS_NODEV;

/// How many ptys one run's devpts instance holds at most.
constexpr int max_ptys = 16;

// Flags of the mount holding `path` that a user namespace may not clear ("locked" flags);
// a read-only remount must repeat them or fail with EPERM.
unsigned long locked_flags(const char* path) {
  struct statvfs sv {};
  if (statvfs(path, &sv) < 0) return 0;
  unsigned long f = 0;
  if (sv.f_flag & ST_NOSUID) f |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV) f |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME) f |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME) f |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME) f |= MS_RELATIME;
  return f;
}

// Bind `src` on `dst` (which exists) and make that mount read-only with `flags` added.
int bind_readonly(const std::string& src, const std::string& dst, unsigned long flags) {
  if (mount(src.c_str(), dst.c_str(), nullptr, MS_BIND, nullptr) < 0) return -errno;
  unsigned long f = MS_REMOUNT | MS_BIND | MS_RDONLY | flags | locked_flags(src.c_str());
  if (mount(nullptr, dst.c_str(), nullptr, f, nullptr) < 0) return -errno;
  return 0;
}

int mount_tmpfs(const std::string& dst, unsigned long flags, std::uint64_t size_bytes,
                std::uint64_t inodes, const char* mode, const config& cfg, bool owned) {
  std::string opts = "size=" + std::to_string(size_bytes) + ",nr_inodes=" + std::to_string(inodes) +
                     ",mode=" + mode;
  if (owned) opts += ",uid=" + std::to_string(cfg.uid) + ",gid=" + std::to_string(cfg.gid);
  if (mount("tmpfs", dst.c_str(), "tmpfs", flags, opts.c_str()) < 0) return -errno;
  return 0;
}

int make_file(const std::string& path, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return -errno;
  close(fd);
  return 0;
}

int write_file(const std::string& path, std::string_view content) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return -errno;
  ssize_t n = write(fd, content.data(), content.size());
  int err = n == static_cast<ssize_t>(content.size()) ? 0 : -EIO;
  close(fd);
  return err;
}

bool ok(int rc, step s, failure* f) {
  if (rc < 0) {
    *f = {s, -rc};
    return false;
  }
  return true;
}

bool is_reserved(std::string_view name) {
  // Provided by us, never taken from the image.
  return name == "." || name == ".." || name == "proc" || name == "sys" || name == "dev" ||
         name == "tmp" || name == "run" || name == "home" || name == "sandbox" ||
         name == ".sandbox-etc";
}

// Mirrors the image's top level into the new root: directories and files as read-only
// binds, symlinks as symlinks (resolved later inside the new root, never on the host).
int mirror_image(const config& cfg, const std::string& root) {
  int dfd = open(cfg.rootfs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (dfd < 0) return -errno;
  DIR* d = fdopendir(dfd);
  if (d == nullptr) {
    close(dfd);
    return -errno;
  }
  int rc = 0;
  while (dirent* e = readdir(d)) {
    std::string_view name = e->d_name;
    if (is_reserved(name)) continue;
    struct stat st {};
    if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    std::string src = cfg.rootfs + "/" + e->d_name;
    std::string dst = root + "/" + e->d_name;
    if (S_ISDIR(st.st_mode)) {
      if (mkdir(dst.c_str(), 0755) < 0)
        rc = -errno;
      else
        rc = bind_readonly(src, dst, bind_ro_flags);
    } else if (S_ISREG(st.st_mode)) {
      rc = make_file(dst, 0644);
      if (rc == 0) rc = bind_readonly(src, dst, bind_ro_flags);
    } else if (S_ISLNK(st.st_mode)) {
      char target[4096];
      ssize_t n = readlinkat(dfd, e->d_name, target, sizeof target - 1);
      if (n < 0) {
        rc = -errno;
      } else {
        target[n] = '\0';
        if (symlink(target, dst.c_str()) < 0) rc = -errno;
      }
    }
    if (rc < 0) break;
  }
  closedir(d);
  return rc;
}

int setup_proc(const std::string& root) {
  std::string proc = root + "/proc";
  if (mkdir(proc.c_str(), 0555) < 0) return -errno;
  unsigned long f = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  if (mount("proc", proc.c_str(), "proc", f, "hidepid=invisible") < 0 &&
      mount("proc", proc.c_str(), "proc", f, "hidepid=2") < 0) {
    return -errno;
  }
  // Mask what an unprivileged program has no business reading or poking: kernel memory,
  // keys, timers, locks, and what helps an exploit or names the host (kernel symbols, build
  // configuration, loaded modules, the boot command line).
  for (const char* masked :
       {"kcore", "keys", "key-users", "timer_list", "sched_debug", "sysrq-trigger", "locks",
        "kallsyms", "config.gz", "modules", "cmdline", "latency_stats", "timer_stats"}) {
    std::string p = proc + "/" + masked;
    if (access(p.c_str(), F_OK) < 0) continue;
    if (mount("/dev/null", p.c_str(), nullptr, MS_BIND, nullptr) < 0) return -errno;
  }
  for (const char* ro : {"sys", "bus", "fs", "irq"}) {
    std::string p = proc + "/" + ro;
    if (access(p.c_str(), F_OK) < 0) continue;
    int rc = bind_readonly(p, p, MS_NOSUID | MS_NODEV | MS_NOEXEC);
    if (rc < 0) return rc;
  }
  return 0;
}

int setup_dev(const config& cfg, const std::string& root) {
  std::string dev = root + "/dev";
  if (mkdir(dev.c_str(), 0755) < 0) return -errno;
  int rc = mount_tmpfs(dev, MS_NOSUID | MS_NOEXEC, 64 * 1024, 64, "0755", cfg, false);
  if (rc < 0) return rc;
  // tty: the caller's controlling terminal, which the program has none of (ENXIO) unless it
  // makes one of its own pty (pty.fork, script): the host's never is (child.cpp, setsid). A
  // host without /dev/tty (some container hosts) gives the run none either.
  for (const char* node : {"null", "zero", "full", "random", "urandom", "tty"}) {
    std::string dst = dev + "/" + node;
    std::string src = std::string("/dev/") + node;
    if (node == std::string_view("tty") && access(src.c_str(), F_OK) < 0) continue;
    if ((rc = make_file(dst, 0666)) < 0) return rc;
    if (mount(src.c_str(), dst.c_str(), nullptr, MS_BIND, nullptr) < 0) return -errno;
    unsigned long f = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC | locked_flags(src.c_str());
    if (mount(nullptr, dst.c_str(), nullptr, f, nullptr) < 0) return -errno;
  }
  const std::pair<const char*, const char*> links[] = {{"fd", "/proc/self/fd"},
                                                       {"stdin", "/proc/self/fd/0"},
                                                       {"stdout", "/proc/self/fd/1"},
                                                       {"stderr", "/proc/self/fd/2"}};
  for (auto [name, target] : links) {
    if (symlink(target, (dev + "/" + name).c_str()) < 0) return -errno;
  }
  // A pseudo-terminal for programs that ask for one (openpty, pty.fork, script, pexpect):
  // a devpts instance of the run's own. `newinstance`: its ptys are numbered from 0 and no
  // pty of the host or of another run is in it or can be opened through it; nosuid, noexec;
  // `max`: a run holds at most `max_ptys` (the kernel's pool beyond the host's reserve is
  // shared by every instance). ptmxmode=0666: the run's uid opens ptmx; mode=0620: a slave
  // belongs to whoever opened its master. TIOCSTI and TIOCLINUX stay refused by the seccomp
  // table, on these terminals too.
  std::string pts = dev + "/pts";
  if (mkdir(pts.c_str(), 0755) < 0) return -errno;
  const std::string pts_opts =
      "newinstance,ptmxmode=0666,mode=0620,max=" + std::to_string(max_ptys);
  if (mount("devpts", pts.c_str(), "devpts", MS_NOSUID | MS_NOEXEC, pts_opts.c_str()) < 0) {
    return -errno;
  }
  if (symlink("pts/ptmx", (dev + "/ptmx").c_str()) < 0) return -errno;
  std::string shm = dev + "/shm";
  if (mkdir(shm.c_str(), 01777) < 0) return -errno;
  rc = mount_tmpfs(shm, MS_NOSUID | MS_NODEV | MS_NOEXEC, cfg.shm_bytes, cfg.tmpfs_inodes, "1777",
                   cfg, false);
  if (rc < 0) return rc;
  if (mount(nullptr, dev.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
            nullptr) < 0) {
    return -errno;
  }
  return 0;
}

// Replaces /etc/<name> with our own content when the image has it as a regular file.
int replace_etc_file(const config& cfg, const std::string& root, const char* name,
                     std::string_view content) {
  std::string image_file = cfg.rootfs + "/etc/" + name;
  struct stat st {};
  if (lstat(image_file.c_str(), &st) < 0 || !S_ISREG(st.st_mode)) return 0;
  std::string ours = root + "/.sandbox-etc/" + name;
  int rc = write_file(ours, content);
  if (rc < 0) return rc;
  return bind_readonly(ours, root + "/etc/" + name, MS_NOSUID | MS_NODEV | MS_NOEXEC);
}

// /etc/passwd and /etc/group: the image's own with the run's entry (wire/accounts.hpp), bound
// read-only over the image's. Read through a descriptor of the image's root without following
// any link (this runs before pivot_root, where a link would name a host file); an image
// without them as regular files under a real /etc gets none, as for the files above.
int write_account_files(const config& cfg, const std::string& root) {
  int rfd = open(cfg.rootfs.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (rfd < 0) return -errno;
  int rc = 0;
  for (const char* name : {"passwd", "group"}) {
    std::string image;
    rc = detail::read_image_etc_file(rfd, name, &image);
    if (rc == -ENOENT || rc == -ELOOP || rc == -ENOTDIR || rc == -EINVAL) {
      rc = 0;  // nothing to bind over
      continue;
    }
    if (rc < 0) break;
    const std::string content = name == std::string_view("passwd")
                                    ? detail::passwd_with_run_account(image, cfg.uid, cfg.gid)
                                    : detail::group_with_run_account(image, cfg.gid);
    const std::string ours = root + "/.sandbox-etc/" + name;
    if ((rc = write_file(ours, content)) < 0) break;
    rc = bind_readonly(ours, root + "/etc/" + name, MS_NOSUID | MS_NODEV | MS_NOEXEC);
    if (rc < 0) break;
  }
  close(rfd);
  return rc;
}

// The host's boot id (/proc/sys/kernel/random/boot_id) would identify the host and link
// runs to each other: each run sees a random one of its own, in the same UUID form.
int mask_boot_id(const std::string& root) {
  const std::string target = root + "/proc/sys/kernel/random/boot_id";
  if (access(target.c_str(), F_OK) < 0) return 0;
  const auto id = random_uuid();
  if (!id) return -EIO;
  const std::string ours = root + "/.sandbox-etc/boot_id";
  if (int rc = write_file(ours, *id + "\n"); rc < 0) return rc;
  return bind_readonly(ours, target, MS_NOSUID | MS_NODEV | MS_NOEXEC);
}

int bring_up_loopback() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -errno;
  ifreq ifr{};
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  int rc = 0;
  if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
    rc = -errno;
  } else if ((ifr.ifr_flags & IFF_UP) == 0) {  // an OCI runtime may have done it already
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) rc = -errno;
  }
  close(s);
  return rc;
}

// The DNS sink's socket: bound to 127.0.0.1:53 inside the run's network namespace, served by
// the host, which logs each name asked for and answers REFUSED.
int open_dns_socket() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return -errno;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(53);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
    int e = errno;
    close(s);
    return -e;
  }
  return s;
}

// Sets the access, modification and change times of everything under `dir` that lives on
// one of sandbox-init's own file systems (`ours`) to now. Never follows a link and never
// enters a bind mount of the image or the host (another device), so nothing outside the run
// is touched.
void touch_tree(const std::string& dir, const std::vector<dev_t>& ours, int depth) {
  auto is_ours = [&](dev_t d) { return std::find(ours.begin(), ours.end(), d) != ours.end(); };
  if (depth < 8) {
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string_view name = e->d_name;
        if (name == "." || name == "..") continue;
        std::string p = (dir == "/" ? std::string() : dir) + "/" + e->d_name;
        struct stat st {};
        if (lstat(p.c_str(), &st) < 0 || !is_ours(st.st_dev)) continue;
        if (S_ISDIR(st.st_mode)) {
          touch_tree(p, ours, depth + 1);
        } else {
          utimensat(AT_FDCWD, p.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
        }
      }
      closedir(d);
    }
  }
  utimensat(AT_FDCWD, dir.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

}  // namespace

bool refresh_times(failure* f) {
  struct ro_mount {
    const char* path;
    unsigned long flags;
  };
  const ro_mount ro[] = {{"/", MS_NOSUID | MS_NODEV}, {"/dev", MS_NOSUID | MS_NOEXEC}};
  std::vector<dev_t> ours;
  for (const char* p : {"/", "/dev", "/dev/shm", "/tmp", "/home/sandbox", "/sandbox/out"}) {
    struct stat st {};
    if (lstat(p, &st) == 0) ours.push_back(st.st_dev);
  }
  // The read-only mounts are writable only for the moment this takes (no program runs yet).
  bool writable = true;
  for (const auto& m : ro) {
    if (mount(nullptr, m.path, nullptr, MS_REMOUNT | MS_BIND | m.flags, nullptr) < 0)
      writable = false;
  }
  if (writable) {
    touch_tree("/", ours, 0);
    touch_tree("/sandbox/out", ours, 0);  // /sandbox itself cannot be listed
  }
  for (const auto& m : ro) {
    if (mount(nullptr, m.path, nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | m.flags, nullptr) < 0) {
      *f = {step::remount_readonly, errno};
      return false;
    }
  }
  return true;
}

bool setup_sandbox(const config& cfg, int* out_fd, int* dns_fd, failure* f) {
  const std::string& root = cfg.staging;
  int rc;
  // 1. Nothing we mount may propagate back to the host.
  if (!ok(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0 ? -errno : 0,
          step::mount_private, f)) {
    return false;
  }
  // 2. The new root: a small tmpfs, made read-only at the end.
  if (!ok(mount_tmpfs(root, MS_NOSUID | MS_NODEV, 1 << 20, 1024, "0755", cfg, false),
          step::root_tmpfs, f)) {
    return false;
  }
  // 3. The image, read-only.
  if (!ok(mirror_image(cfg, root), step::rootfs_bind, f)) return false;
  // 4. /proc and /dev.
  if (!ok(setup_proc(root), step::proc, f)) return false;
  if (!ok(setup_dev(cfg, root), step::dev, f)) return false;
  // 5. Writable, capped scratch space.
  std::string tmp = root + "/tmp";
  rc = mkdir(tmp.c_str(), 01777) < 0 ? -errno : 0;
  if (rc == 0) {
    rc =
        mount_tmpfs(tmp, MS_NOSUID | MS_NODEV, cfg.tmp_bytes, cfg.tmpfs_inodes, "1777", cfg, false);
  }
  std::string home = root + "/home";
  if (rc == 0) rc = mkdir(home.c_str(), 0755) < 0 ? -errno : 0;
  if (rc == 0) rc = mkdir((home + "/sandbox").c_str(), 0700) < 0 ? -errno : 0;
  if (rc == 0) {
    rc = mount_tmpfs(home + "/sandbox", MS_NOSUID | MS_NODEV, cfg.home_bytes, cfg.tmpfs_inodes,
                     "0700", cfg, true);
  }
  if (!ok(rc, step::tmpfs, f)) return false;
  // 6. /sandbox: inputs (read-only, random name), outputs (capped tmpfs), the source.
  std::string sb = root + "/sandbox";
  rc = mkdir(sb.c_str(), 0755) < 0 ? -errno : 0;
  std::string in = sb + "/" + cfg.input_name;
  if (rc == 0) rc = mkdir(in.c_str(), 0555) < 0 ? -errno : 0;
  if (rc == 0) rc = bind_readonly(cfg.inputs, in, MS_NOSUID | MS_NODEV | MS_NOEXEC);
  if (!ok(rc, step::inputs, f)) return false;
  std::string out = sb + "/out";
  rc = mkdir(out.c_str(), 0755) < 0 ? -errno : 0;
  if (rc == 0) {
    rc = mount_tmpfs(out, MS_NOSUID | MS_NODEV | MS_NOEXEC, cfg.out_bytes, cfg.out_inodes, "0755",
                     cfg, true);
  }
  if (rc == 0) {
    *out_fd = open(out.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (*out_fd < 0) rc = -errno;
  }
  if (!ok(rc, step::outputs, f)) return false;
  if (!cfg.source.empty()) {
    std::string src = sb + "/" + cfg.source_name;
    rc = make_file(src, 0444);
    if (rc == 0) rc = bind_readonly(cfg.source, src, MS_NOSUID | MS_NODEV | MS_NOEXEC);
    if (!ok(rc, step::source, f)) return false;
  }
  // /sandbox can be traversed but not listed: the inputs' random name is learned from
  // SANDBOX_INPUT_DIR, not by looking around.
  if (!ok(chmod(sb.c_str(), 0111) < 0 ? -errno : 0, step::inputs, f)) return false;
  // 7. Name service files: the resolver points at our DNS sink on the run's loopback; the
  //    run's uid and gid get passwd and group entries.
  rc = mkdir((root + "/.sandbox-etc").c_str(), 0755) < 0 ? -errno : 0;
  if (rc == 0) {
    rc = replace_etc_file(cfg, root, "resolv.conf",
                          "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n");
  }
  if (rc == 0) {
    rc = replace_etc_file(cfg, root, "hosts",
                          "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost\n");
  }
  if (rc == 0) rc = replace_etc_file(cfg, root, "hostname", "sandbox\n");
  if (rc == 0) rc = write_account_files(cfg, root);
  if (rc == 0) rc = mask_boot_id(root);
  if (!ok(rc, step::etc_files, f)) return false;
  // 8. Identity and network: hostname, loopback up (nothing else exists), the DNS sink.
  if (!ok(sethostname("sandbox", 7) < 0 ? -errno : 0, step::hostname, f)) return false;
  if (!ok(bring_up_loopback(), step::loopback, f)) return false;
  rc = open_dns_socket();
  if (!ok(rc, step::dns_socket, f)) return false;
  *dns_fd = rc;
  // 9. Enter the new root; the old one is detached and unreachable.
  rc = chdir(root.c_str()) < 0 ? -errno : 0;
  if (rc == 0 && syscall(SYS_pivot_root, ".", ".") < 0) rc = -errno;
  if (rc == 0 && umount2(".", MNT_DETACH) < 0) rc = -errno;
  if (rc == 0 && chdir("/") < 0) rc = -errno;
  if (!ok(rc, step::pivot_root, f)) return false;
  // 10. The root tmpfs itself becomes read-only.
  rc = mount(nullptr, "/", nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
             nullptr) < 0
           ? -errno
           : 0;
  return ok(rc, step::remount_readonly, f);
}

bool setup_oci_sandbox(const config& cfg, int* out_fd, int* dns_fd, failure* f) {
  (void)cfg;
  // The OCI runtime built the filesystem from our config.json (backends/oci/bundle.hpp) and
  // set the hostname; what is left needs the run's network namespace from inside.
  if (!ok(bring_up_loopback(), step::loopback, f)) return false;
  int rc = open_dns_socket();
  if (!ok(rc, step::dns_socket, f)) return false;
  *dns_fd = rc;
  *out_fd = open("/sandbox/out", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (*out_fd < 0) {
    *f = {step::outputs, errno};
    close(*dns_fd);
    return false;
  }
  return true;
}

}  // namespace sandbox::init
