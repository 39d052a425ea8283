// The host's end of a microvm network run's egress tunnel (private to src/): the "sandbox.net"
// virtio-serial port, carrying `guest_protocol::net_msg` frames (wire/guest_protocol.hpp,
// "The egress tunnel"). Each connection the guest opens becomes a TCP connection to the run's
// egress proxy, made from a socket the launcher creates inside the run's network namespace;
// bytes are relayed both ways under the protocol's per-connection windows.
//
// Everything from the port is hostile: every frame is checked (type, length, id, order,
// window, count) and the first bad one is reported to `on_fault` once, after which the relay
// stops (closing the port and every connection). Memory is bounded whatever the guest does:
// at most `net_max_connections` connections, each holding at most `net_window` bytes on its
// way to the proxy; frames for the guest are queued up to `max_backlog` bytes, past which the
// relay stops reading the port until the guest drains them (a guest that never reads its
// port stalls only itself).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace sandbox::detail {

class net_relay {
 public:
  /// Makes a new, unconnected TCP socket (IPv4, O_NONBLOCK | O_CLOEXEC) where the proxy's
  /// listener can be reached (the run's network namespace); -1 with `*why` on failure (the
  /// guest's connection is then closed, not the run).
  using socket_factory = std::function<int(std::string* why)>;
  /// A protocol fault of the guest: a short reason for the host log (no guest bytes).
  using fault_sink = std::function<void(std::string)>;

  /// Most bytes of frames queued for the guest before the relay stops reading the port.
  static constexpr std::size_t max_backlog = 256 * 1024;

  /// Serves `port_fd` (owned from here; a connected stream socket) on `strand` until `stop()`
  /// or the port's end (the VMM exited). Connections go to `proxy` through sockets from
  /// `make_socket`. `on_fault` runs on the strand, at most once.
  static std::shared_ptr<net_relay> start(boost::asio::strand<boost::asio::any_io_executor> strand,
                                          int port_fd, socket_factory make_socket,
                                          boost::asio::ip::tcp::endpoint proxy,
                                          fault_sink on_fault);

  virtual ~net_relay() = default;
  /// Closes the port and every connection; no `on_fault` after. Idempotent; any thread.
  virtual void stop() = 0;
  /// The most bytes the relay held at once (data on its way to the proxy plus frames queued
  /// for the guest). Any thread. For tests of the bounds.
  virtual std::size_t peak_buffered() const noexcept = 0;
  /// Connections open now. Any thread.
  virtual std::size_t connections() const noexcept = 0;
  /// True once stopped (by stop(), a fault or the port's end). Any thread.
  virtual bool stopped() const noexcept = 0;
};

/// A new TCP socket (AF_INET, SOCK_STREAM, non-blocking, close-on-exec) inside the network
/// namespace `ns_fd`, made on a short-lived thread of its own (setns(2)) so no other thread of
/// the host changes namespace. -1 with `*why` on failure.
int socket_in_netns(int ns_fd, std::string* why);

}  // namespace sandbox::detail
