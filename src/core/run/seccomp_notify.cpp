#include "core/run/seccomp_notify.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "sys/pidfd.hpp"
#include "wire/seccomp_policy.hpp"

namespace sandbox::detail {
namespace {

constexpr std::uint32_t x32_bit = 0x40000000;

struct notif_sizes_t {
  std::size_t notif = sizeof(seccomp_notif);
  std::size_t resp = sizeof(seccomp_notif_resp);
};

const notif_sizes_t& notif_sizes() {
  static const notif_sizes_t sizes = [] {
    notif_sizes_t s;
    seccomp_notif_sizes k{};
    if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &k) == 0) {
      s.notif = std::max<std::size_t>(k.seccomp_notif, sizeof(seccomp_notif));
      s.resp = std::max<std::size_t>(k.seccomp_notif_resp, sizeof(seccomp_notif_resp));
    }
    return s;
  }();
  return sizes;
}

void respond(int fd, std::uint64_t id, int error, bool cont) {
  std::vector<std::uint8_t> buf(notif_sizes().resp, 0);
  auto* r = reinterpret_cast<seccomp_notif_resp*>(buf.data());
  r->id = id;
  r->error = cont ? 0 : -error;
  r->val = 0;
  r->flags = cont ? SECCOMP_USER_NOTIF_FLAG_CONTINUE : 0;
  ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, r);  // ENOENT: the target is gone; nothing to do
}

// Reads `len` bytes at `addr` of process `pid`. False when unreadable.
bool read_memory(int mem_fd, std::uint64_t addr, void* out, std::size_t len) {
  if (addr == 0 || len == 0) return false;
  ssize_t n = pread(mem_fd, out, len, static_cast<off_t>(addr));
  return n == static_cast<ssize_t>(len);
}

std::string format_address(const sockaddr_storage& ss, std::uint16_t* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
    *port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
    *port = ntohs(in6->sin6_port);
  }
  return buf;
}

// Socket type of the target's descriptor `fd` ("tcp", "udp" or "ip").
// "tcp" or "udp" from the socket's type, read through a copy of the descriptor; "ip" when it
// cannot be read. The copy is closed by `mem`'s closer thread (see close_later): our close
// may be the socket's last, and that one can block for as long as the program wants.
std::string socket_protocol(pid_t pid, int fd, notify_mem_cache& mem) {
  if (!mem.can_close_later()) return "ip";
  int pidfd = pidfd_open(pid);
  if (pidfd < 0) return "ip";
  int copy = pidfd_getfd(pidfd, fd);
  close(pidfd);
  if (copy < 0) return "ip";
  int type = 0;
  socklen_t len = sizeof type;
  std::string out = "ip";
  if (getsockopt(copy, SOL_SOCKET, SO_TYPE, &type, &len) == 0) {
    if (type == SOCK_STREAM)
      out = "tcp";
    else if (type == SOCK_DGRAM)
      out = "udp";
  }
  mem.close_later(copy);
  return out;
}

struct destination {
  sockaddr_storage addr{};
  std::size_t len = 0;
};

// Destinations named by the call (empty when it names none, e.g. a connected socket), read
// the way the kernel reads them — the host's view must be the kernel's, or an attempt goes
// unrecorded:
//  - connect's and sendto's address length is an `int` in the kernel (the register's upper
//    half is ignored); negative or over sizeof(sockaddr_storage) is EINVAL. msg_namelen is an
//    `int` too, and one over sizeof(sockaddr_storage) is cut to it.
//  - the kernel's UDP send path takes an AF_UNSPEC destination as AF_INET (udp_sendmsg); on
//    connect, AF_UNSPEC disconnects.
std::vector<destination> destinations(int mem_fd, const seccomp_data& d) {
  std::vector<destination> out;
  const bool is_send = d.nr != __NR_connect;
  auto read_sockaddr = [&](std::uint64_t addr, std::int32_t len) {
    if (len < 0) return;  // EINVAL
    destination dst;
    dst.len = std::min<std::size_t>(static_cast<std::size_t>(len), sizeof dst.addr);
    if (dst.len >= sizeof(sa_family_t) && read_memory(mem_fd, addr, &dst.addr, dst.len)) {
      if (is_send && dst.addr.ss_family == AF_UNSPEC && dst.len >= sizeof(sockaddr_in)) {
        dst.addr.ss_family = AF_INET;
      }
      out.push_back(dst);
    }
  };
  // connect/sendto: the length register as the kernel's int; over the storage size: EINVAL.
  auto register_len = [](std::uint64_t reg) {
    auto len = static_cast<std::int32_t>(static_cast<std::uint32_t>(reg));
    return len > static_cast<std::int32_t>(sizeof(sockaddr_storage)) ? -1 : len;
  };
  switch (d.nr) {
    case __NR_connect:
      read_sockaddr(d.args[1], register_len(d.args[2]));
      break;
    case __NR_sendto:
      read_sockaddr(d.args[4], register_len(d.args[5]));
      break;
    case __NR_sendmsg: {
      msghdr m{};
      if (read_memory(mem_fd, d.args[1], &m, sizeof m) && m.msg_name != nullptr) {
        read_sockaddr(reinterpret_cast<std::uint64_t>(m.msg_name),
                      static_cast<std::int32_t>(m.msg_namelen));
      }
      break;
    }
    case __NR_sendmmsg: {
      std::uint64_t n = std::min<std::uint64_t>(d.args[2], 1024);  // the kernel's UIO_MAXIOV cap
      for (std::uint64_t i = 0; i < n; ++i) {
        mmsghdr m{};
        if (!read_memory(mem_fd, d.args[1] + i * sizeof(mmsghdr), &m, sizeof m)) break;
        if (m.msg_hdr.msg_name != nullptr) {
          read_sockaddr(reinterpret_cast<std::uint64_t>(m.msg_hdr.msg_name),
                        static_cast<std::int32_t>(m.msg_hdr.msg_namelen));
        }
      }
      break;
    }
    default:
      break;
  }
  return out;
}

std::string violation_name(const seccomp_data& d) {
  if (d.arch == AUDIT_ARCH_X86_64 && (d.nr & x32_bit) != 0) {
    char* n = seccomp_syscall_resolve_num_arch(SCMP_ARCH_X32, d.nr);
    std::string s = std::string("x32:") + (n != nullptr ? n : std::to_string(d.nr).c_str());
    std::free(n);
    return s;
  }
  if (d.arch == AUDIT_ARCH_I386) {
    char* n = seccomp_syscall_resolve_num_arch(SCMP_ARCH_X86, d.nr);
    std::string s = std::string("i386:") + (n != nullptr ? n : std::to_string(d.nr).c_str());
    std::free(n);
    return s;
  }
  if (d.arch != AUDIT_ARCH_X86_64) return "foreign-abi:" + std::to_string(d.nr);
  char* n = seccomp_syscall_resolve_num_arch(SCMP_ARCH_X86_64, d.nr);
  std::string s = n != nullptr ? n : "syscall " + std::to_string(d.nr);
  std::free(n);
  return s;
}

}  // namespace

bool is_local_destination(const void* sa, std::size_t len) noexcept {
  if (len < sizeof(sa_family_t)) return true;  // nothing to connect to
  sa_family_t fam;
  std::memcpy(&fam, sa, sizeof fam);
  if (fam == AF_INET) {
    if (len < sizeof(sockaddr_in)) return true;  // the kernel rejects it (EINVAL)
    sockaddr_in in;
    std::memcpy(&in, sa, sizeof in);
    std::uint32_t a = ntohl(in.sin_addr.s_addr);
    return (a >> 24) == 127 || a == 0;
  }
  if (fam == AF_INET6) {
    // The kernel takes IPv6 addresses from 24 bytes on (SIN6_LEN_RFC2133: no scope id).
    constexpr std::size_t rfc2133_len = 24;
    if (len < rfc2133_len) return true;  // the kernel rejects it (EINVAL)
    sockaddr_in6 in6{};
    std::memcpy(&in6, sa, std::min(len, sizeof in6));
    const auto& b = in6.sin6_addr.s6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&in6.sin6_addr) || IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) {
      return true;
    }
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr))
      return b[12] == 127 || (b[12] | b[13] | b[14] | b[15]) == 0;
    return false;
  }
  // AF_UNIX (a private mount and network namespace: only the run's own sockets exist),
  // AF_NETLINK (the run's own namespace), AF_UNSPEC (disconnect).
  return true;
}

// The run's closer: one thread, started at its first descriptor, closing them in order. It
// may block in a close until the run's processes (a lingering socket's peers) are gone; the
// backlog is bounded, and past it no copies are taken (the record says "ip").
struct notify_mem_cache::closer {
  // Large enough that a closer thread the scheduler starts late (a loaded 2-core host) does not
  // turn a burst of ordinary attempts into "ip" records; small enough that a run whose closes
  // all block cannot take many of the host's descriptors.
  static constexpr std::size_t max_backlog = 64;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> fds;
  bool stop = false;
  bool started = false;

  void loop() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !fds.empty(); });
      if (fds.empty()) return;  // stopped and drained
      int fd = fds.front();
      lock.unlock();
      close(fd);  // may block: never on a thread that serves anything else
      lock.lock();
      fds.pop_front();
    }
  }
};

notify_mem_cache::~notify_mem_cache() { clear(); }

void notify_mem_cache::clear() noexcept {
  for (auto& e : entries_) close(e.fd);
  entries_.clear();
  if (closer_) {
    // The thread drains what is left and ends; it owns its state, so nothing waits for it.
    std::lock_guard lock(closer_->mu);
    closer_->stop = true;
    closer_->cv.notify_all();
  }
  closer_.reset();
}

bool notify_mem_cache::can_close_later() const {
  if (!closer_) return true;
  std::lock_guard lock(closer_->mu);
  return closer_->fds.size() < closer::max_backlog;
}

void notify_mem_cache::close_later(int fd) {
  if (!closer_) closer_ = std::make_shared<closer>();
  std::lock_guard lock(closer_->mu);
  closer_->fds.push_back(fd);
  if (!closer_->started) {
    try {
      std::thread([c = closer_] { c->loop(); }).detach();
      closer_->started = true;
    } catch (const std::system_error&) {
      // No thread to be had: drop the copy from the backlog and close it here (the rare
      // lingering last reference is then ours to wait on, as before).
      closer_->fds.pop_back();
      close(fd);
      return;
    }
  }
  closer_->cv.notify_one();
}

int notify_mem_cache::get(std::uint32_t pid, bool reopen) {
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].pid != pid) continue;
    entry e = entries_[i];
    entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
    if (reopen) {
      close(e.fd);
      break;
    }
    entries_.push_back(e);
    return e.fd;
  }
  std::string path = "/proc/" + std::to_string(pid) + "/mem";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  constexpr std::size_t capacity = 16;
  if (entries_.size() >= capacity) {
    close(entries_.front().fd);
    entries_.erase(entries_.begin());
  }
  entries_.push_back({pid, fd});
  return fd;
}

std::optional<notify_event> handle_notification(int listener_fd, notify_mem_cache& mem) {
  // RECV blocks until a notification is pending, whatever the descriptor's flags. The
  // listener also polls readable when every filter user has gone (POLLHUP) with nothing
  // pending: receiving then would block this thread for good. Only POLLIN — a pending
  // notification — lets RECV proceed; if its task is killed in between, the kernel has
  // already counted it, and RECV fails with ENOENT instead of waiting.
  pollfd p{listener_fd, POLLIN, 0};
  if (poll(&p, 1, 0) != 1 || (p.revents & POLLIN) == 0) return std::nullopt;
  std::vector<std::uint8_t> buf(notif_sizes().notif, 0);
  auto* n = reinterpret_cast<seccomp_notif*>(buf.data());
  if (ioctl(listener_fd, SECCOMP_IOCTL_NOTIF_RECV, n) < 0) return std::nullopt;
  const seccomp_data& d = n->data;

  if (!is_egress_syscall(d.nr, d.arch)) {
    notify_event ev;
    ev.what = notify_event::kind::violation;
    ev.syscall = violation_name(d);
    // No answer: the caller kills the run while the call is still blocked, so the program
    // never runs another instruction after a violation.
    return ev;
  }

  // The argument block itself is always readable in a live process: a failed read of it
  // means a stale cached descriptor (a recycled pid), so reopen once.
  int mem_fd = mem.get(n->pid);
  std::uint8_t probe;
  std::uint64_t probe_addr = d.nr == __NR_sendmsg || d.nr == __NR_sendmmsg ? d.args[1]
                             : d.nr == __NR_sendto                         ? d.args[4]
                                                                           : d.args[1];
  if (mem_fd >= 0 && probe_addr != 0 && !read_memory(mem_fd, probe_addr, &probe, 1)) {
    mem_fd = mem.get(n->pid, true);
  }
  std::vector<destination> dsts;
  if (mem_fd >= 0) dsts = destinations(mem_fd, d);
  // The pid may have been recycled between RECV and our reads: trust what we read only if
  // the notification is still pending.
  if (ioctl(listener_fd, SECCOMP_IOCTL_NOTIF_ID_VALID, &n->id) < 0) return std::nullopt;

  for (const auto& dst : dsts) {
    if (is_local_destination(&dst.addr, dst.len)) continue;
    notify_event ev;
    ev.what = notify_event::kind::egress;
    ev.attempt.address = format_address(dst.addr, &ev.attempt.port);
    ev.attempt.protocol =
        socket_protocol(static_cast<pid_t>(n->pid), static_cast<int>(d.args[0]), mem);
    ev.attempt.allowed = false;
    ev.attempt.reason = "network disabled";
    respond(listener_fd, n->id, ENETUNREACH, false);
    return ev;
  }
  if (mem_fd < 0) {
    // Could not inspect the call: refuse rather than let an unexamined send through.
    respond(listener_fd, n->id, EPERM, false);
    notify_event ev;
    ev.what = notify_event::kind::egress;
    ev.attempt.protocol = "ip";
    ev.attempt.reason = "uninspectable destination refused";
    return ev;
  }
  respond(listener_fd, n->id, 0, true);
  return notify_event{};
}

}  // namespace sandbox::detail
