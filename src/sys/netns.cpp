// A run's own network namespace (sys/netns.hpp).
#include "sys/netns.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

namespace sandbox::detail {

run_netns& run_netns::operator=(run_netns&& o) noexcept {
  if (this != &o) {
    if (ns_ >= 0) ::close(ns_);
    if (listener_ >= 0) ::close(listener_);
    ns_ = o.ns_;
    listener_ = o.listener_;
    o.ns_ = o.listener_ = -1;
  }
  return *this;
}

run_netns::~run_netns() {
  if (ns_ >= 0) ::close(ns_);
  if (listener_ >= 0) ::close(listener_);
}

result<run_netns> make_run_netns(std::uint16_t port, std::string* why) {
  int ns = -1, listener = -1, err = 0;
  const char* step = "";
  // A thread's network namespace is its own (unshare(2)): the work runs on a fresh thread
  // that ends right after, so no other host thread ever sees the new namespace.
  std::thread([&] {
    auto failed = [&](const char* s) {
      err = errno;
      step = s;
    };
    if (::unshare(CLONE_NEWNET) != 0) return failed("unshare(CLONE_NEWNET)");
    ns = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (ns < 0) return failed("open(/proc/thread-self/ns/net)");
    // 1. Loopback up: the only interface there is.
    int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return failed("socket(AF_INET, SOCK_DGRAM)");
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    const bool up = ::ioctl(s, SIOCGIFFLAGS, &ifr) == 0 &&
                    (ifr.ifr_flags |= IFF_UP, ::ioctl(s, SIOCSIFFLAGS, &ifr) == 0);
    if (!up) {
      failed("ioctl(SIOCSIFFLAGS, lo up)");
      ::close(s);
      return;
    }
    ::close(s);
    // 2. The listener, on the namespace's loopback.
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return failed("socket(AF_INET, SOCK_STREAM)");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return failed("bind(127.0.0.1)");
    if (::listen(listener, 64) != 0) return failed("listen");
  }).join();
  run_netns made(ns, listener);
  if (err != 0 || ns < 0 || listener < 0) {
    if (why != nullptr)
      *why = fmt::format("run network namespace: {}: {}", step, std::strerror(err));
    return boost::system::error_code(err != 0 ? err : EIO, boost::system::generic_category());
  }
  return made;
}

}  // namespace sandbox::detail
