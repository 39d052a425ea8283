// A network namespace of a run's own, made on the host (private to src/).
//
// For launchers whose sandbox cannot hand descriptors to the host (gVisor's stream mode): the
// host makes the namespace, with loopback up and the egress proxy's socket already listening
// on 127.0.0.1:<port> in it, and starts the runtime inside it (spawn_request::netns_fd).
// Nothing else is ever added to it: no interface but loopback, no route out.
#pragma once

#include <cstdint>
#include <string>

#include "sandbox/error.hpp"

namespace sandbox::detail {

/// A new network namespace and a listening socket in it. Both descriptors are O_CLOEXEC and
/// owned by the holder (closed on destruction; movable, not copyable).
class run_netns {
 public:
  run_netns() = default;
  run_netns(int ns, int listener) : ns_(ns), listener_(listener) {}
  run_netns(run_netns&& o) noexcept : ns_(o.ns_), listener_(o.listener_) {
    o.ns_ = o.listener_ = -1;
  }
  run_netns& operator=(run_netns&& o) noexcept;
  run_netns(const run_netns&) = delete;
  run_netns& operator=(const run_netns&) = delete;
  ~run_netns();

  int ns_fd() const noexcept { return ns_; }  ///< the namespace (for setns(2))
  /// Releases the listening socket to the caller (-1 once released).
  int release_listener() noexcept {
    int l = listener_;
    listener_ = -1;
    return l;
  }

 private:
  int ns_ = -1;
  int listener_ = -1;
};

/**
 * Makes a network namespace (unshare(2) CLONE_NEWNET on a short-lived thread of its own, so
 * no other thread of the host changes namespace), brings its loopback up (SIOCSIFFLAGS) and
 * binds a TCP socket listening on 127.0.0.1:`port` (backlog 64) in it. Needs CAP_SYS_ADMIN
 * (root). On failure: the errno as a generic-category error, `*why` naming the step.
 */
result<run_netns> make_run_netns(std::uint16_t port, std::string* why);

}  // namespace sandbox::detail
