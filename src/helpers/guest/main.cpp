// sandbox-guest: PID 1 of a microvm run's guest (the guest agent). See wire/guest_protocol.hpp
// for the channel and docs/architecture.md ("microvm level") for the whole run.
//
// The agent plays, inside the VM, the part runsc plays for the gvisor level: it starts
// sandbox-init in stream mode and relays its control channel. Unlike under runsc, sandbox-init
// runs in its process mode here (a real Linux kernel, the agent is root): it builds the run's
// namespaces and filesystem itself (helpers/init/mounts.cpp), from the image disk and the
// guest workspace the agent prepared — the same code as the process level's.
//
// Order of events (each step's reason beside it):
//  1. Leave the initramfs: a fresh tmpfs becomes "/" (MS_MOVE + chroot, as switch_root does),
//     because pivot_root(2) — which sandbox-init needs — refuses the initramfs as the root.
//  2. /dev, /proc, /sys; the kernel store's modules (virtio transport, console, block, erofs),
//     in the order of /modules/order.
//  3. The virtio-serial ports by name; `agent_ready` on the control port.
//  4. `setup` from the host: the image disk (/dev/vda, erofs) mounted read-only, cgroup2 with
//     one run cgroup holding the limits (memory.swap.max = 0, memory.oom.group = 1), the
//     guest workspace (a size-capped tmpfs: in/, the source file, the staging mount point).
//  5. sandbox-init, cloned into new pid, mount, net, ipc and uts namespaces and put into the
//     run cgroup before it reads anything; its stdin is a socketpair the agent relays to the
//     control port, its stdout/stderr are pipes the agent relays to the stdout/stderr ports
//     (stream_relay: counted, so the host can tell that it received every byte).
//  6. Relay: file_* frames from the host are written into the workspace (names, sizes and
//     count checked here too), `go` is forwarded only with no file open. On sandbox-init's
//     `quiet`: the output files (no link followed, regular files only, capped) go to the host
//     as file_* frames, the entries left out as file_dropped frames, then `usage`, then
//     `quiet` — but only once both output pipes reached EOF (every writer is gone, so the
//     byte counts in `usage` are final).
//  7. The control port closing (the host ended the run or died) powers the VM off at once.
// Single-threaded, statically linked, no exceptions; nothing here trusts the host's frames
// more than it must (a malformed one ends the VM).
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sys/io.hpp"
#include "wire/guest_protocol.hpp"
#include "wire/utf8.hpp"

namespace {

namespace ip = sandbox::detail::init_protocol;
namespace gp = sandbox::detail::guest_protocol;
using gp::agent_step;
using sandbox::detail::write_all;

constexpr const char* new_root_dir = "/newroot";
constexpr const char* image_dir = "/run/image";  // the image disk, read-only
constexpr const char* ws_dir = "/run/ws";        // the guest workspace (tmpfs)
constexpr const char* run_cgroup_dir = "/sys/fs/cgroup/run";
constexpr std::size_t max_frame = ip::max_packet;

int g_ctl = -1;  // the control port

[[noreturn]] void power_off() {
  sync();
  reboot(RB_POWER_OFF);
  _exit(1);  // PID 1 exiting panics the kernel, which (panic=-1, -no-reboot) also ends the VM
}

bool send_frame(int fd, std::uint32_t type, std::uint32_t a, std::int64_t b,
                std::string_view payload) {
  std::string f;
  ip::append_frame(f, type, a, b, payload);
  return write_all(fd, f.data(), f.size());
}

bool send_agent(gp::msg type, std::uint32_t a, std::int64_t b, std::string_view payload) {
  return send_frame(g_ctl, static_cast<std::uint32_t>(type), a, b, payload);
}

// Reports a failed step to the host (host log only) and powers off.
[[noreturn]] void fail(agent_step step, int err, std::string_view what) {
  if (g_ctl >= 0) send_agent(gp::msg::agent_failed, static_cast<std::uint32_t>(step), err, what);
  fprintf(stderr, "sandbox-guest: %.*s failed: %s\n", static_cast<int>(what.size()), what.data(),
          strerror(err));
  power_off();
}

std::string read_small_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[4096];
  std::string out;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > (1 << 20)) break;
  }
  close(fd);
  return out;
}

bool write_file(const std::string& path, std::string_view content) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write_all(fd, content.data(), content.size());
  close(fd);
  return ok;
}

std::uint64_t to_u64(std::string_view v) {
  std::uint64_t out = 0;
  std::from_chars(v.data(), v.data() + v.size(), out);
  return out;
}

bool copy_file(const char* from, const std::string& to, mode_t mode) {
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;
  int out = open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (out < 0) {
    close(in);
    return false;
  }
  char buf[65536];
  bool ok = true;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0 || !write_all(out, buf, static_cast<std::size_t>(n))) {
      ok = false;
      break;
    }
  }
  close(in);
  close(out);
  return ok;
}

// 1. A tmpfs root holding what the guest needs after the switch: sandbox-init and the modules.
void leave_initramfs() {
  mkdir(new_root_dir, 0755);
  if (mount("newroot", new_root_dir, "tmpfs", MS_NOSUID, "mode=0755,size=64m") < 0) {
    fail(agent_step::mounts, errno, "tmpfs root");
  }
  std::string r = new_root_dir;
  for (const char* d : {"/dev", "/proc", "/sys", "/run", "/modules", "/tmp"})
    mkdir((r + d).c_str(), 0755);
  if (!copy_file("/sandbox-init", r + "/sandbox-init", 0555))
    fail(agent_step::mounts, errno, "copy sandbox-init");
  std::string order = read_small_file("/modules/order");
  if (!copy_file("/modules/order", r + "/modules/order", 0444))
    fail(agent_step::modules, errno, "modules/order");
  std::string_view rest = order;
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    std::string name(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (name.empty() || name.find('/') != std::string::npos) continue;
    if (!copy_file(("/modules/" + name).c_str(), r + "/modules/" + name, 0444)) {
      fail(agent_step::modules, errno, "copy module " + name);
    }
  }
  if (chdir(new_root_dir) < 0 || mount(".", "/", nullptr, MS_MOVE, nullptr) < 0 ||
      chroot(".") < 0 || chdir("/") < 0) {
    fail(agent_step::mounts, errno, "switch root");
  }
}

// 2. Modules, in order (a module already built in or loaded is fine).
void load_modules() {
  std::string order = read_small_file("/modules/order");
  std::string_view rest = order;
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    std::string name(rest.substr(0, nl));
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (name.empty()) continue;
    int fd = open(("/modules/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(agent_step::modules, errno, "open module " + name);
    if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST) {
      fail(agent_step::modules, errno, "finit_module " + name);
    }
    close(fd);
  }
}

// 3. /dev/vportNpM of the port named `name`, opened with `flags`; waits up to ~5 s for the
//    device to appear (udev does not exist here: devtmpfs makes the node).
int open_port(const char* name, int flags) {
  for (int attempt = 0; attempt < 500; ++attempt) {
    DIR* d = opendir("/sys/class/virtio-ports");
    if (d != nullptr) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string n =
            read_small_file(std::string("/sys/class/virtio-ports/") + e->d_name + "/name");
        while (!n.empty() && (n.back() == '\n' || n.back() == '\0')) n.pop_back();
        if (n != name) continue;
        std::string dev = std::string("/dev/") + e->d_name;
        int fd = open(dev.c_str(), flags | O_CLOEXEC);
        if (fd >= 0) {
          closedir(d);
          return fd;
        }
      }
      closedir(d);
    }
    usleep(10000);
  }
  return -1;
}

// Frames from a byte stream: whatever arrived is appended, whole frames are taken off.
struct frame_reader {
  std::string buf;
  // One whole frame, or false (need more). `*bad` on a length out of range.
  bool next(ip::init_header* h, std::string* payload, bool* bad) {
    if (buf.size() < sizeof(std::uint32_t)) return false;
    std::uint32_t len;
    memcpy(&len, buf.data(), sizeof len);
    if (len < sizeof(ip::init_header) || len > max_frame) {
      *bad = true;
      return false;
    }
    if (buf.size() < sizeof len + len) return false;
    memcpy(h, buf.data() + sizeof len, sizeof *h);
    payload->assign(buf, sizeof len + sizeof *h, len - sizeof *h);
    buf.erase(0, sizeof len + len);
    return true;
  }
  // Reads what is there; false on EOF or error.
  bool fill(int fd) {
    char chunk[65536];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;
    buf.append(chunk, static_cast<std::size_t>(n));
    return true;
  }
  // Blocks until one whole frame is there.
  bool read_one(int fd, ip::init_header* h, std::string* payload) {
    bool bad = false;
    while (!next(h, payload, &bad)) {
      if (bad || !fill(fd)) return false;
    }
    return true;
  }
};

// 5a. One output stream of the program: its pipe (read end, non-blocking) relayed to its
//     virtio-serial port (non-blocking). At most `relay_buffer_bytes` bytes wait in the agent: the
//     pipe is read only while there is room, so a host that reads slowly throttles the
//     program (its pipe fills and its write blocks) as the port itself did. `count` is every
//     byte read from the pipe — what the program wrote — reported to the host in `usage`
//     (stdout_bytes, stderr_bytes) once the pipe reached EOF.
constexpr std::size_t relay_buffer_bytes = 256 * 1024;

struct stream_relay {
  int pipe = -1;  // read end; -1 after EOF
  int port = -1;
  std::string buf;
  std::size_t sent = 0;  // bytes of `buf` already written to the port
  std::uint64_t count = 0;

  bool at_eof() const { return pipe < 0; }
  short pipe_events() const { return pipe >= 0 && buf.size() < relay_buffer_bytes ? POLLIN : 0; }
  short port_events() const { return sent < buf.size() ? POLLOUT : 0; }
  // Reads what the pipe holds (up to the buffer's room); EOF or an error closes it.
  void read_pipe() {
    while (pipe >= 0 && buf.size() < relay_buffer_bytes) {
      char chunk[65536];
      const std::size_t room = std::min(sizeof chunk, relay_buffer_bytes - buf.size());
      ssize_t n = read(pipe, chunk, room);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      if (n <= 0) {
        close(pipe);
        pipe = -1;
        return;
      }
      buf.append(chunk, static_cast<std::size_t>(n));
      count += static_cast<std::uint64_t>(n);
    }
  }
  // Writes what the port takes now. A port error (the host is gone) discards the bytes: the
  // control port closing ends the VM anyway.
  void write_port() {
    while (sent < buf.size()) {
      ssize_t n = write(port, buf.data() + sent, buf.size() - sent);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      if (n <= 0) {
        sent = buf.size();
        break;
      }
      sent += static_cast<std::size_t>(n);
    }
    if (sent == buf.size()) {
      buf.clear();
      sent = 0;
    } else if (sent >= relay_buffer_bytes / 2) {
      buf.erase(0, sent);
      sent = 0;
    }
  }
};

struct setup_values {
  std::uint64_t memory_bytes = 0, pids = 0, cpu_quota_us = 0, cpu_period_us = 100000;
  std::uint64_t ws_bytes = 64ULL << 20;  // the guest workspace: source + inputs
  std::uint64_t out_files = 16, out_bytes = 8ULL << 20;
  std::uint64_t in_files = 64;
  std::string source_name = "main.py";
  bool network = false;  // the egress tunnel (guest_protocol.hpp)
};

bool valid_component(std::string_view c) {
  if (c.empty() || c.size() > 255 || c == "." || c == "..") return false;
  for (char ch : c) {
    if (ch == '/' || ch == '\0') return false;
  }
  return true;
}

// 4a. The image disk: read-only erofs at /run/image.
void mount_image() {
  mkdir("/run/image", 0755);
  for (int attempt = 0; attempt < 500; ++attempt) {
    if (access("/dev/vda", F_OK) == 0) break;
    usleep(10000);
  }
  if (mount("/dev/vda", image_dir, "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, nullptr) < 0) {
    fail(agent_step::image_disk, errno, "mount /dev/vda (erofs)");
  }
}

// 4b. cgroup2 only, one run cgroup with the limits.
void make_cgroup(const setup_values& s) {
  if (mount("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) <
      0) {
    fail(agent_step::cgroup, errno, "mount cgroup2");
  }
  if (!write_file("/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids +cpu")) {
    fail(agent_step::cgroup, errno, "cgroup.subtree_control");
  }
  if (mkdir(run_cgroup_dir, 0755) < 0) fail(agent_step::cgroup, errno, "mkdir run cgroup");
  std::string c = run_cgroup_dir;
  auto put = [&](const char* file, const std::string& v) {
    if (!write_file(c + "/" + file, v)) fail(agent_step::cgroup, errno, file);
  };
  put("memory.max", std::to_string(s.memory_bytes));
  put("memory.swap.max", "0");
  put("memory.oom.group", "1");
  put("pids.max", std::to_string(s.pids));
  if (s.cpu_quota_us > 0) {
    put("cpu.max", std::to_string(s.cpu_quota_us) + " " + std::to_string(s.cpu_period_us));
  }
}

// 4c. The guest workspace: in/, the (empty) source file, the staging mount point.
void make_workspace(const setup_values& s) {
  mkdir(ws_dir, 0755);
  std::string opts = "mode=0755,size=" + std::to_string(s.ws_bytes) + ",nr_inodes=4096";
  if (mount("ws", ws_dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts.c_str()) < 0) {
    fail(agent_step::mounts, errno, "workspace tmpfs");
  }
  std::string w = ws_dir;
  if (mkdir((w + "/in").c_str(), 0555) < 0 || mkdir((w + "/root").c_str(), 0755) < 0) {
    fail(agent_step::mounts, errno, "workspace dirs");
  }
  int fd = open((w + "/source").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
  if (fd < 0) fail(agent_step::mounts, errno, "source file");
  close(fd);
}

// 6a. Files from the host, before `go`.
struct file_sink {
  int fd = -1;
  std::uint64_t declared = 0, written = 0, count = 0;
  const setup_values* s = nullptr;

  // Returns false (with `*why`) on anything malformed.
  bool open_file(std::string_view name, std::uint32_t mode, std::int64_t size, std::string* why) {
    if (fd >= 0) return *why = "file_open while a file is open", false;
    if (size < 0 || static_cast<std::uint64_t>(size) > s->ws_bytes)
      return *why = "file size", false;
    if ((mode & ~0700U) != 0) return *why = "file mode", false;
    std::string path;
    if (name == "source") {
      path = std::string(ws_dir) + "/source";  // the already-bound source file, same inode
      fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
    } else if (name.substr(0, 3) == "in/" && valid_component(name.substr(3))) {
      if (++count > s->in_files) return *why = "too many files", false;
      path = std::string(ws_dir) + "/in/" + std::string(name.substr(3));
      fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444);
    } else {
      return *why = "file name", false;
    }
    if (fd < 0) return *why = "open " + std::string(name) + ": " + strerror(errno), false;
    declared = static_cast<std::uint64_t>(size);
    written = 0;
    return true;
  }
  bool data(std::string_view bytes, std::string* why) {
    if (fd < 0) return *why = "file_data without an open file", false;
    if (written + bytes.size() > declared) return *why = "file longer than declared", false;
    if (!write_all(fd, bytes.data(), bytes.size())) return *why = strerror(errno), false;
    written += bytes.size();
    return true;
  }
  bool close_file(std::string* why) {
    if (fd < 0) return *why = "file_close without an open file", false;
    close(fd);
    fd = -1;
    if (written != declared) return *why = "file shorter than declared", false;
    return true;
  }
};

// 6b. The output files, after `quiet`: top-level regular files of the output directory,
//     opened without following any link, at most `out_files` files and `out_bytes` bytes.
//     Every other entry is reported as `file_dropped` with the reason the host levels'
//     collector (core/run/collector.cpp) would give, judged in its order: the name, the type
//     without following (a symlink, FIFO, socket, device or directory is never opened), then the
//     count cap, then the byte cap on the size from the stat (a sparse 1 TiB file is never
//     read); a file that is no longer a regular file when opened, or that the agent cannot
//     read, is `not_regular_file`. A bad name (detail::is_display_safe_name, the collector's own
//     test) is `bad_name` before anything else, so it never uses up the count cap. Names
//     are visited in byte order, the smallest `gp::max_dropped` of them (the collector's
//     scan limit); an entry that vanished since the scan is not listed.
void send_dropped(const std::string& name, gp::dropped why) {
  send_agent(gp::msg::file_dropped, static_cast<std::uint32_t>(why), 0, name);
}

void send_outputs(int out_dir, const setup_values& s) {
  if (out_dir < 0) return;
  int scan = openat(out_dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (scan < 0) return;
  DIR* d = fdopendir(scan);
  if (d == nullptr) {
    close(scan);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    if (valid_component(e->d_name)) names.emplace_back(e->d_name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  if (names.size() > gp::max_dropped) names.resize(gp::max_dropped);
  std::uint64_t files = 0, total = 0;
  for (const auto& name : names) {
    if (!sandbox::detail::is_display_safe_name(name)) {
      send_dropped(name, gp::dropped::bad_name);
      continue;
    }
    struct stat st {};
    if (fstatat(out_dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno != ENOENT) send_dropped(name, gp::dropped::not_regular_file);
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      send_dropped(name, gp::dropped::not_regular_file);
      continue;
    }
    if (files >= s.out_files) {
      send_dropped(name, gp::dropped::count_limit);
      continue;
    }
    if (st.st_size < 0 || total + static_cast<std::uint64_t>(st.st_size) > s.out_bytes) {
      send_dropped(name, gp::dropped::bytes_limit);
      continue;
    }
    open_how how{};
    how.flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
    int fd = static_cast<int>(syscall(SYS_openat2, out_dir, name.c_str(), &how, sizeof how));
    if (fd < 0) {
      if (errno != ENOENT) send_dropped(name, gp::dropped::not_regular_file);
      continue;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      send_dropped(name, gp::dropped::not_regular_file);
      continue;
    }
    if (total + static_cast<std::uint64_t>(st.st_size) > s.out_bytes) {
      close(fd);
      send_dropped(name, gp::dropped::bytes_limit);
      continue;
    }
    std::string content;
    content.reserve(static_cast<std::size_t>(st.st_size));
    char buf[65536];
    bool read_failed = false;
    for (;;) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) read_failed = true;
      if (n <= 0) break;
      content.append(buf, static_cast<std::size_t>(n));
      if (content.size() > static_cast<std::size_t>(st.st_size)) break;  // grew: cut below
    }
    close(fd);
    if (read_failed) {
      send_dropped(name, gp::dropped::not_regular_file);
      continue;
    }
    if (content.size() > static_cast<std::size_t>(st.st_size))
      content.resize(static_cast<std::size_t>(st.st_size));
    ++files;
    total += content.size();
    send_agent(gp::msg::file_open, st.st_mode & 0700, static_cast<std::int64_t>(content.size()),
               name);
    const std::size_t chunk = max_frame - sizeof(ip::init_header);
    for (std::size_t off = 0; off < content.size(); off += chunk) {
      send_agent(gp::msg::file_data, 0, 0, std::string_view(content).substr(off, chunk));
    }
    send_agent(gp::msg::file_close, 0, 0, {});
  }
}

// 6d. A network run's egress tunnel (wire/guest_protocol.hpp, "The egress tunnel"): the
//     listener on 127.0.0.1:<egress_proxy_port> inside the run's network namespace, each
//     accepted connection relayed over the "sandbox.net" port under the per-connection
//     windows. The port and every socket are non-blocking; nothing here waits on one
//     connection, and what it holds is bounded by the windows (the host's data included:
//     a connection whose host frames break the rules is closed).
struct guest_net {
  struct conn {
    int fd = -1;
    std::string to_sock;        // host data not yet written (at most net_window)
    std::uint32_t unacked = 0;  // bytes sent to the host, not yet acknowledged
    std::uint64_t ack_pending = 0;
    bool sock_eof = false;  // read EOF from the socket, eof sent
    bool host_eof = false, shut = false;
  };
  int port = -1, listener = -1;
  std::uint32_t next_id = 1;
  std::vector<std::pair<std::uint32_t, conn>> conns;  // at most net_max_connections
  frame_reader in;
  std::string out;  // frames for the host, not yet written

  void frame(gp::net_msg t, std::uint32_t id, std::int64_t b, std::string_view payload) {
    ip::append_frame(out, static_cast<std::uint32_t>(t), id, b, payload);
  }
  conn* find(std::uint32_t id) {
    for (auto& [i, c] : conns) {
      if (i == id) return &c;
    }
    return nullptr;
  }
  void drop(std::uint32_t id, bool tell) {
    for (std::size_t k = 0; k < conns.size(); ++k) {
      if (conns[k].first != id) continue;
      close(conns[k].second.fd);
      conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(k));
      if (tell) frame(gp::net_msg::close, id, 0, {});
      return;
    }
  }
  void maybe_done(std::uint32_t id, conn& c) {
    if (c.sock_eof && c.host_eof && c.shut && c.to_sock.empty()) drop(id, true);
  }
  // Adds this relay's descriptors to `fds` (their order is this struct's business).
  void poll_fds(std::vector<pollfd>& fds) {
    if (port < 0) return;
    fds.push_back({port, static_cast<short>(POLLIN | (out.empty() ? 0 : POLLOUT)), 0});
    // (A descriptor without interest is -1: a socket reporting POLLHUP would spin the loop.)
    const bool room = conns.size() < gp::net_max_connections;
    fds.push_back({room ? listener : -1, room ? short{POLLIN} : short{0}, 0});
    for (auto& [id, c] : conns) {
      short ev = 0;
      if (!c.sock_eof && c.unacked < gp::net_window) ev |= POLLIN;
      if (!c.to_sock.empty()) ev |= POLLOUT;
      fds.push_back({ev != 0 ? c.fd : -1, ev, 0});
    }
  }
  void on_host_frame(const ip::init_header& h, std::string_view payload) {
    const auto t = static_cast<gp::net_msg>(static_cast<std::uint32_t>(h.type));
    conn* c = find(h.a);
    if (c == nullptr) return;  // closed here already (crossed our close)
    switch (t) {
      case gp::net_msg::data:
        if (c->host_eof || c->to_sock.size() + payload.size() > gp::net_window)
          return drop(h.a, true);
        c->to_sock.append(payload);
        break;
      case gp::net_msg::eof:
        c->host_eof = true;
        if (c->to_sock.empty() && !c->shut) {
          shutdown(c->fd, SHUT_WR);
          c->shut = true;
        }
        maybe_done(h.a, *c);
        break;
      case gp::net_msg::close:
        drop(h.a, false);
        break;
      case gp::net_msg::ack:
        if (h.b <= 0 || static_cast<std::uint64_t>(h.b) > c->unacked) return drop(h.a, true);
        c->unacked -= static_cast<std::uint32_t>(h.b);
        break;
      default:
        break;
    }
  }
  // Handles the events of the descriptors poll_fds added at `fds[base...]`.
  void handle(const pollfd* fds, std::size_t count) {
    if (port < 0 || count < 2) return;
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      if (!in.fill(port)) return close_all();
      ip::init_header h{};
      std::string payload;
      bool bad = false;
      while (in.next(&h, &payload, &bad)) on_host_frame(h, payload);
      if (bad) return close_all();
    }
    // Sockets: the ones polled (conns may have changed above: match by descriptor).
    for (std::size_t k = 2; k < count; ++k) {
      if (fds[k].revents == 0) continue;
      std::uint32_t id = 0;
      conn* c = nullptr;
      for (auto& [i, cc] : conns) {
        if (cc.fd == fds[k].fd) {
          id = i;
          c = &cc;
        }
      }
      if (c == nullptr) continue;
      if (fds[k].revents & POLLERR) {  // reset: the host's end goes too
        drop(id, true);
        continue;
      }
      if ((fds[k].revents & POLLOUT) && !c->to_sock.empty()) {
        ssize_t n = send(c->fd, c->to_sock.data(), c->to_sock.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          drop(id, true);
          continue;
        }
        if (n > 0) {
          c->to_sock.erase(0, static_cast<std::size_t>(n));
          c->ack_pending += static_cast<std::uint64_t>(n);
          if (c->to_sock.empty() && c->host_eof && !c->shut) {
            shutdown(c->fd, SHUT_WR);
            c->shut = true;
          }
        }
      }
      if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) && !c->sock_eof &&
          c->unacked < gp::net_window) {
        char buf[gp::net_chunk];
        std::size_t room = std::min<std::size_t>(sizeof buf, gp::net_window - c->unacked);
        ssize_t n = recv(c->fd, buf, room, MSG_DONTWAIT);
        if (n > 0) {
          frame(gp::net_msg::data, id, 0, std::string_view(buf, static_cast<std::size_t>(n)));
          c->unacked += static_cast<std::uint32_t>(n);
        } else if (n == 0) {
          c->sock_eof = true;
          frame(gp::net_msg::eof, id, 0, {});
        } else if (errno != EAGAIN && errno != EINTR) {
          drop(id, true);
          continue;
        }
      }
      maybe_done(id, *c);
    }
    // New connections.
    if ((fds[1].revents & POLLIN) && conns.size() < gp::net_max_connections) {
      int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        std::uint32_t id = next_id++;
        conn c;
        c.fd = fd;
        conns.emplace_back(id, std::move(c));
        frame(gp::net_msg::open, id, 0, {});
      }
    }
    // Acks, one per connection at most, then whatever the port takes now.
    for (auto& [id, c] : conns) {
      if (c.ack_pending == 0) continue;
      frame(gp::net_msg::ack, id, static_cast<std::int64_t>(c.ack_pending), {});
      c.ack_pending = 0;
    }
    flush();
  }
  void flush() {
    while (port >= 0 && !out.empty()) {
      ssize_t n = write(port, out.data(), out.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // EAGAIN: the next POLLOUT
      out.erase(0, static_cast<std::size_t>(n));
    }
  }
  // The port is gone (the host closed it): every connection goes with it.
  void close_all() {
    for (auto& [id, c] : conns) close(c.fd);
    conns.clear();
    close(port);
    close(listener);
    port = listener = -1;
  }
};

// 5'. The tunnel's listener: made inside sandbox-init's network namespace (the agent joins it
//     for the moment it takes, then returns to its own), loopback brought up first (its
//     127.0.0.1 appears only then; sandbox-init's own bring-up later finds it up).
int make_net_listener(long init_pid) {
  int self_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  int run_ns =
      open(("/proc/" + std::to_string(init_pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC);
  if (self_ns < 0 || run_ns < 0 || setns(run_ns, CLONE_NEWNET) < 0) {
    fail(agent_step::start_init, errno, "join the run's network namespace");
  }
  close(run_ns);
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr{};
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
    fail(agent_step::start_init, errno, "loopback flags");
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) fail(agent_step::start_init, errno, "loopback up");
  close(s);
  int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(ip::egress_proxy_port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 || listen(l, 64) < 0) {
    fail(agent_step::start_init, errno, "egress listener");
  }
  if (setns(self_ns, CLONE_NEWNET) < 0)
    fail(agent_step::start_init, errno, "leave the run's netns");
  close(self_ns);
  return l;
}

// 6c. The guest cgroup's figures. memory.peak does not exist before Linux 6.5 (the cloud
//     kernel is 6.1): the agent then reports the largest memory.current it sampled.
// The run cgroup's CPU time so far (cpu.stat usage_usec), µs; 0 when unreadable.
std::uint64_t cgroup_cpu_usec() {
  std::string cpu = read_small_file(std::string(run_cgroup_dir) + "/cpu.stat");
  auto at = cpu.find("usage_usec ");
  return at == std::string::npos ? 0 : to_u64(std::string_view(cpu).substr(at + 11));
}

// `cpu_at_start`: the run cgroup's CPU time when the program started (sandbox-init's
// `started`). sandbox-init is in the run cgroup from before it reads its configuration, and
// its setup (namespaces, mounts, pivot_root) is emulated under TCG: seconds of CPU that are
// not the program's. The host levels' setup costs milliseconds, so they report the cgroup's
// whole figure; here the program's share is what came after `started`.
void send_usage(std::uint64_t sampled_peak, std::uint64_t cpu_at_start, const stream_relay& out,
                const stream_relay& err) {
  std::string c = run_cgroup_dir;
  ip::config_writer w;
  std::uint64_t peak = sampled_peak;
  if (auto p = read_small_file(c + "/memory.peak"); !p.empty()) peak = std::max(peak, to_u64(p));
  w.add("memory_peak_bytes", peak);
  if (const std::uint64_t cpu = cgroup_cpu_usec(); cpu > 0) {
    w.add("cpu_usec", cpu > cpu_at_start ? cpu - cpu_at_start : 0);
  }
  std::string ev = read_small_file(c + "/memory.events");
  if (auto at = ev.find("oom_kill "); at != std::string::npos) {
    w.add("oom_kills", to_u64(std::string_view(ev).substr(at + 9)));
  }
  if (auto p = read_small_file(c + "/pids.peak"); !p.empty()) w.add("pids_peak", to_u64(p));
  w.add("stdout_bytes", out.count);
  w.add("stderr_bytes", err.count);
  send_agent(gp::msg::usage, 0, 0, w.bytes());
}

}  // namespace

int main() {
  // Console output (ttyS0) is for the host log only.
  setvbuf(stderr, nullptr, _IONBF, 0);
  signal(SIGPIPE, SIG_IGN);

  // 1-2. Leave the initramfs, mount the kernel's file systems, load the modules.
  leave_initramfs();
  if (mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, nullptr) < 0)
    fail(agent_step::mounts, errno, "devtmpfs");
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    fail(agent_step::mounts, errno, "proc");
  if (mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    fail(agent_step::mounts, errno, "sysfs");
  load_modules();
  // Every allocation succeeds and the run cgroup's limit decides (as on the host levels):
  // with the default heuristic a request larger than the guest's RAM would fail with ENOMEM
  // instead of ending the run as `oom`.
  write_file("/proc/sys/vm/overcommit_memory", "1");

  // 3. Ports, then agent_ready.
  g_ctl = open_port(gp::ctl_port, O_RDWR);
  if (g_ctl < 0) fail(agent_step::ports, errno, "control port");
  int out_port = open_port(gp::stdout_port, O_WRONLY | O_NONBLOCK);
  int err_port = open_port(gp::stderr_port, O_WRONLY | O_NONBLOCK);
  if (out_port < 0 || err_port < 0) fail(agent_step::ports, errno, "stdout/stderr ports");
  {
    utsname u{};
    uname(&u);
    ip::config_writer w;
    w.add("kernel", u.release);
    if (!send_agent(gp::msg::agent_ready, gp::version, 0, w.bytes())) power_off();
  }

  // 4. setup.
  frame_reader host;
  ip::init_header h{};
  std::string payload;
  if (!host.read_one(g_ctl, &h, &payload)) power_off();
  if (h.type != static_cast<ip::msg>(gp::msg::setup))
    fail(agent_step::setup_message, EINVAL, "expected setup");
  setup_values s;
  for (auto [k, v] : ip::parse_config(payload)) {
    if (k == "memory_bytes")
      s.memory_bytes = to_u64(v);
    else if (k == "pids")
      s.pids = to_u64(v);
    else if (k == "cpu_quota_us")
      s.cpu_quota_us = to_u64(v);
    else if (k == "cpu_period_us")
      s.cpu_period_us = to_u64(v);
    else if (k == "ws_bytes")
      s.ws_bytes = to_u64(v);
    else if (k == "out_files")
      s.out_files = to_u64(v);
    else if (k == "out_bytes")
      s.out_bytes = to_u64(v);
    else if (k == "in_files")
      s.in_files = to_u64(v);
    else if (k == "network")
      s.network = v == "1";
  }
  if (s.memory_bytes == 0 || s.pids == 0) fail(agent_step::setup_message, EINVAL, "setup limits");
  guest_net net;
  if (s.network) {
    net.port = open_port(gp::net_port, O_RDWR | O_NONBLOCK);
    if (net.port < 0) fail(agent_step::ports, errno, "net port");
  }
  mkdir("/run", 0755);
  mount_image();
  make_cgroup(s);
  make_workspace(s);

  // 5. sandbox-init: its control channel is a socketpair (stream mode), PID 1 of new
  //    namespaces, in the run cgroup before it reads its configuration.
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
    fail(agent_step::start_init, errno, "socketpair");
  // The program's stdout/stderr: pipes the agent relays (5a). sandbox-init hands them to the
  // program and then lets go of them, so EOF on both means every process of the run is gone.
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0)
    fail(agent_step::start_init, errno, "stdout/stderr pipes");
  int self_exec = open("/sandbox-init", O_PATH | O_CLOEXEC);  // the self-test's probe
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  long pid = syscall(
      SYS_clone, SIGCHLD | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS,
      nullptr, nullptr, nullptr, nullptr);
  if (pid < 0) fail(agent_step::start_init, errno, "clone");
  if (pid == 0) {
    sigprocmask(SIG_UNBLOCK, &chld, nullptr);
    if (dup2(sp[1], 0) < 0 || dup2(out_pipe[1], 1) < 0 || dup2(err_pipe[1], 2) < 0) _exit(127);
    if (self_exec >= 0 && dup2(self_exec, ip::self_exec_fd) < 0) _exit(127);
    char arg0[] = "sandbox-init";
    char arg1[] = "--control-stdin";
    char* argv[] = {arg0, arg1, nullptr};
    char* envp[] = {nullptr};
    execve("/sandbox-init", argv, envp);
    _exit(127);
  }
  close(sp[1]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  stream_relay out_relay, err_relay;
  out_relay.pipe = out_pipe[0];
  out_relay.port = out_port;
  err_relay.pipe = err_pipe[0];
  err_relay.port = err_port;
  for (int fd : {out_pipe[0], err_pipe[0]}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (self_exec >= 0) close(self_exec);
  if (!write_file(std::string(run_cgroup_dir) + "/cgroup.procs", std::to_string(pid))) {
    kill(static_cast<pid_t>(pid), SIGKILL);
    fail(agent_step::start_init, errno, "cgroup.procs");
  }
  const int init = sp[0];
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  // Before sandbox-init gets its configuration, so long before the program can connect.
  if (s.network) net.listener = make_net_listener(pid);

  // 6. Relay.
  frame_reader from_init;
  file_sink files;
  files.s = &s;
  int out_dir = -1;
  std::uint64_t peak = 0;
  bool program_started = false;    // sandbox-init's `started` relayed
  std::uint64_t cpu_at_start = 0;  // the run cgroup's CPU at sandbox-init's `started`
  std::string why;
  bool init_gone = false;
  bool finish_requested = false, quiet_sent = false;
  // The end of the run is reported (outputs, usage with the stream counts, quiet) once the
  // run's processes are gone — sandbox-init's `quiet`, or its exit after `finish` — and both
  // output pipes reached EOF. EOF is near then (no writer is left); should a pipe stay open
  // anyway, the run cgroup is killed after report_wait_ms and the report goes out after another
  // report_wait_ms with the counts read so far (the host checks them against what it received).
  constexpr long report_wait_ms = 5000;
  bool report_pending = false, report_killed = false;
  long report_since = 0, last_sample = -1000;
  auto now_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
  };
  auto request_report = [&] {
    if (report_pending || quiet_sent) return;
    report_pending = true;
    report_since = now_ms();
  };
  auto maybe_report = [&] {
    if (!report_pending || quiet_sent) return;
    const bool eof = out_relay.at_eof() && err_relay.at_eof();
    const long waited = now_ms() - report_since;
    if (!eof && waited >= report_wait_ms && !report_killed) {
      report_killed = true;
      write_file(std::string(run_cgroup_dir) + "/cgroup.kill", "1");
    }
    if (!eof && waited < 2 * report_wait_ms) return;
    quiet_sent = true;
    send_outputs(out_dir, s);
    send_usage(peak, cpu_at_start, out_relay, err_relay);
    if (!send_frame(g_ctl, static_cast<std::uint32_t>(ip::msg::quiet), 0, 0, {})) power_off();
  };
  // Frames from the host already read (the configuration may have come with `setup`).
  auto drain_host = [&] {
    bool bad = false;
    while (host.next(&h, &payload, &bad)) {
      auto t = static_cast<std::uint32_t>(h.type);
      bool ok = true;
      if (t == static_cast<std::uint32_t>(gp::msg::file_open)) {
        ok = files.open_file(payload, h.a, h.b, &why);
      } else if (t == static_cast<std::uint32_t>(gp::msg::file_data)) {
        ok = files.data(payload, &why);
      } else if (t == static_cast<std::uint32_t>(gp::msg::file_close)) {
        ok = files.close_file(&why);
      } else if (t == static_cast<std::uint32_t>(gp::msg::finish)) {
        // The host's deadline or exit grace: every process of the run dies now (sandbox-init
        // too); the outputs go out once sandbox-init's channel closes (below).
        finish_requested = true;
        if (!write_file(std::string(run_cgroup_dir) + "/cgroup.kill", "1")) {
          ok = false;
          why = "cgroup.kill";
        }
      } else if (t >= 100) {
        ok = false;
        why = "unexpected agent message";
      } else {
        if (h.type == ip::msg::go && files.fd >= 0) {
          ok = false;
          why = "go while a file is open";
        } else {
          ok = send_frame(init, t, h.a, h.b, payload);
          if (!ok) why = "relay to sandbox-init";
        }
      }
      if (!ok) fail(agent_step::files, EINVAL, why);
    }
    if (bad) fail(agent_step::files, EINVAL, "malformed frame from the host");
  };
  drain_host();
  std::vector<pollfd> fds;
  for (;;) {
    // A descriptor without interest is left out (-1): a pipe whose writers are gone reports
    // POLLHUP whatever is asked, which would spin the loop while the buffer is full.
    auto want = [](int fd, short events) { return pollfd{events != 0 ? fd : -1, events, 0}; };
    fds.assign({{g_ctl, POLLIN, 0},
                {init, init_gone ? short{0} : short{POLLIN}, 0},
                {sfd, POLLIN, 0},
                want(out_relay.pipe, out_relay.pipe_events()),
                want(err_relay.pipe, err_relay.pipe_events()),
                want(out_relay.port, out_relay.port_events()),
                want(err_relay.port, err_relay.port_events())});
    constexpr std::size_t net_fds = 7;  // the egress tunnel's descriptors follow
    net.poll_fds(fds);
    // Until the program starts nothing here needs a tick (a warm-pool VM waits here for its
    // run: an idle guest then costs the host nothing but its timer interrupts); from then on
    // the memory sample and the report's bounds do.
    int n =
        poll(fds.data(), fds.size(), program_started || finish_requested || init_gone ? 50 : -1);
    if (n < 0 && errno != EINTR) power_off();
    if (n > 0) net.handle(fds.data() + net_fds, fds.size() - net_fds);
    // 5a. The streams first: non-blocking, each only as far as the pipe and the port allow.
    for (stream_relay* r : {&out_relay, &err_relay}) {
      r->read_pipe();
      r->write_port();
    }
    // The memory sample at most every 20 ms: a relayed flood wakes this loop far more often.
    if (const long t = now_ms(); t - last_sample >= 20) {
      last_sample = t;
      if (auto cur = read_small_file(std::string(run_cgroup_dir) + "/memory.current");
          !cur.empty()) {
        peak = std::max(peak, to_u64(cur));
      }
    }
    if (fds[2].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {
      }
      int st;
      while (waitpid(-1, &st, WNOHANG) > 0) {
      }
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      // 7. The control port closing ends the VM.
      if (!host.fill(g_ctl)) power_off();
      drain_host();
    }
    if (!init_gone && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (!from_init.fill(init)) {
        init_gone = true;  // sandbox-init exited (it reported why); the host ends the VM
        // Killed on the host's request: the outputs (the held output dir outlives the run's
        // mount namespace), usage, and the quiet sandbox-init could not send, once the
        // pipes drained (maybe_report).
        if (finish_requested) request_report();
        maybe_report();
        continue;
      }
      bool bad = false;
      while (from_init.next(&h, &payload, &bad)) {
        if (h.type == ip::msg::ready && out_dir < 0) {
          // The run's output dir, held from before the program starts (sandbox-init is
          // alive until the host ends the run; its root is the run's root).
          std::string p = "/proc/" + std::to_string(pid) + "/root/sandbox/out";
          out_dir = open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
          if (out_dir < 0) fail(agent_step::outputs, errno, "open the output dir");
        }
        if (h.type == ip::msg::started && !program_started) {
          program_started = true;
          cpu_at_start = cgroup_cpu_usec();
        }
        if (h.type == ip::msg::quiet) {
          request_report();  // sent by maybe_report, with the outputs and usage before it
          continue;
        }
        if (!send_frame(g_ctl, static_cast<std::uint32_t>(h.type), h.a, h.b, payload)) power_off();
      }
      if (bad) init_gone = true;
    }
    maybe_report();
  }
}
