// The control channel: the host's end of the socket between the run machine and
// sandbox-init (wire/init_protocol.hpp). One per run, used on the run's strand only.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/strand.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/init_protocol.hpp"

namespace sandbox::detail {

/**
 * The host ↔ sandbox-init channel, in one of two modes (the launcher's `stream_control`):
 * - packet mode: a SOCK_SEQPACKET socket, one message per packet, descriptors as SCM_RIGHTS;
 * - stream mode: a byte stream (runsc, a virtio-serial port): every packet is prefixed with
 *   its u32 length; what the host sends is queued and written as the socket takes it
 *   (bounded by the protocol: the configuration, `go`, a stdin window and its frames); what
 *   arrives is buffered until a whole packet is there. No descriptors travel.
 *
 * Everything received comes from inside the sandbox and is untrusted: a stream length out
 * of range is reported as `malformed` and reading stops.
 *
 * Thread-safety: strand only. Lifetime: every asynchronous wait holds the owner given to
 * `start` (a shared_ptr locked from its weak_ptr), so the run stays alive while the channel
 * has an operation pending — the run machine's "kept alive by its pending operations".
 */
class control_channel {
 public:
  using strand_type = boost::asio::strand<boost::asio::any_io_executor>;

  /// What the channel reports; each is called on the strand.
  struct handlers {
    /// One packet: its header, payload, and (packet mode) the descriptors that came with it.
    /// The handler takes the descriptors it wants (setting them to -1); the rest are closed.
    std::function<void(const init_protocol::init_header&, std::string_view, std::vector<int>& fds)>
        message;
    /// sandbox-init closed the channel (EOF or an error): it is gone.
    std::function<void()> closed;
    /// Stream mode: a length prefix out of range (a protocol violation).
    std::function<void()> malformed;
    /// True once the run is ending: the channel stops reading and stops flushing.
    std::function<bool()> stopped;
  };

  /// `stream`: the launcher's `stream_control`.
  control_channel(strand_type strand, bool stream);

  /// Takes the host's end of the socket (owned from here on), the owner every pending wait
  /// holds, and the handlers. Sending may start at once; reading starts with `start`.
  void assign(int fd, std::weak_ptr<void> owner, handlers h);

  /// Starts reading: every packet goes to `h.message` until `h.stopped()` or the channel
  /// closes.
  void start();

  /// Sends one whole packet (header + payload). Packet mode: sendmsg with `fds` as
  /// SCM_RIGHTS (at most 2), now. Stream mode: length-prefixed and queued behind what is
  /// still unsent (`fds` must be empty). Returns 0, or -1 with errno when the channel failed.
  int send_packet(std::string_view packet, std::span<const int> fds = {});

  /// One host → init packet of `type` with `a` and `payload`. A dead channel shows as its
  /// EOF on the read side, so failures are not returned.
  void send_frame(init_protocol::msg type, std::uint32_t a, std::string_view payload);

  /// Stream mode: queues bytes already framed (a guest agent's frames) and flushes. False
  /// when the channel failed.
  bool send_framed(std::string_view bytes);

  /// Stream mode: queues already-framed bytes without sending them yet (they go ahead of the
  /// next packet: a guest agent's `setup` before the configuration).
  void queue_framed(std::string_view bytes) { out_ += bytes; }

  /// True once sandbox-init closed the channel.
  bool closed() const noexcept { return closed_; }

  /// The stream mode flag given at construction.
  bool stream() const noexcept { return stream_; }

  /// Closes the socket (teardown); pending waits end aborted.
  void close();

 private:
  void read();
  void on_readable();
  void on_readable_stream();
  void report_closed();
  bool flush();

  boost::asio::posix::stream_descriptor sock_;
  bool stream_;
  std::weak_ptr<void> owner_;
  handlers h_;
  bool closed_ = false;
  std::string in_;            ///< stream mode: bytes received, not yet a whole packet
  std::string out_;           ///< stream mode: bytes not yet taken by the socket
  bool out_waiting_ = false;  ///< stream mode: a wait for room is pending
};

}  // namespace sandbox::detail
