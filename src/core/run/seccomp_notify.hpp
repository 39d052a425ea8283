// Host side of seccomp user notification (private to src/; seccomp_unotify(2)).
//
// The host receives each notified call of a run, decides, and answers:
//  - egress calls (connect, sendto with an address, sendmsg, sendmmsg): the destination is
//    read from the process's memory (/proc/<pid>/mem, then the notification id is re-checked
//    so a recycled pid can't fool us). Loopback, unix and netlink destinations continue
//    untouched; anything else is recorded as an egress attempt and refused with ENETUNREACH
//    (the run's network namespace has no route anyway: the record is evidence, not the
//    barrier);
//  - every other notified call is a violation (seccomp_policy.hpp): recorded by name and
//    left unanswered; the caller kills the run while the call is still blocked, so the
//    program never executes another instruction after it.
// A hostile program can race the memory we read (TOCTOU); that can only hide an attempt from
// the record, never open a route. Documented in docs/security.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sandbox/protocol.hpp"

namespace sandbox::detail {

/// What one notification turned out to be.
struct notify_event {
  enum class kind : std::uint8_t { none, egress, violation } what = kind::none;
  egress_attempt attempt;  ///< for egress
  std::string syscall;     ///< for violation: e.g. "ptrace", "i386:execve", "x32:connect"
};

/// Open /proc/<pid>/mem descriptors of a run's processes, reused across notifications
/// (opening one per call is most of the host's cost). Small; closes what it evicts. A cached
/// descriptor of a process that died only fails to read (it never reads another process's
/// memory), and is then reopened.
class notify_mem_cache {
 public:
  notify_mem_cache() = default;
  notify_mem_cache(const notify_mem_cache&) = delete;
  notify_mem_cache& operator=(const notify_mem_cache&) = delete;
  ~notify_mem_cache();
  /// The descriptor for `pid`, opening it if needed (or reopening when `reopen`); -1 on error.
  int get(std::uint32_t pid, bool reopen = false);
  /// Closes every descriptor (the run is over).
  void clear() noexcept;

  /// Closes `fd`, a copy of one of the run's sockets, on the run's own closer thread, never on
  /// the caller's: if the program dropped its references meanwhile, ours is the last, and a
  /// socket the program set to linger blocks its last close (tcp_close waits out SO_LINGER)
  /// for as long as the run keeps its peer alive. Call only when can_close_later() said so
  /// (the caller is the only one adding, so that still holds).
  void close_later(int fd);
  /// True while the closer's backlog is below its bound; past it, take no copies.
  bool can_close_later() const;

 private:
  struct entry {
    std::uint32_t pid;
    int fd;
  };
  struct closer;  ///< shared with its thread, which outlives clear() until its closes return
  std::vector<entry> entries_;  ///< most recently used last
  std::shared_ptr<closer> closer_;
};

/// Receives one pending notification from `listener_fd` (call when it is readable), answers
/// it (egress) or leaves it unanswered (violation), and returns what it was. Returns nullopt
/// when nothing was pending or the target died meanwhile (ENOENT). Never blocks longer than
/// the one ioctl.
std::optional<notify_event> handle_notification(int listener_fd, notify_mem_cache& mem);

/// True for addresses that stay inside the run's own network namespace: 127.0.0.0/8,
/// 0.0.0.0, ::1, ::, and their IPv4-mapped forms. `sa` points at `len` bytes of a sockaddr;
/// lengths the kernel would reject (under 16 bytes for IPv4, under 24 for IPv6) are local
/// (nothing is sent).
bool is_local_destination(const void* sa, std::size_t len) noexcept;

}  // namespace sandbox::detail
