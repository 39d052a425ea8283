#include "core/run/control_channel.hpp"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

namespace sandbox::detail {

namespace asio = boost::asio;
namespace ip = init_protocol;

control_channel::control_channel(strand_type strand, bool stream)
    : sock_(std::move(strand)), stream_(stream) {}

void control_channel::assign(int fd, std::weak_ptr<void> owner, handlers h) {
  sock_.assign(fd);
  owner_ = std::move(owner);
  h_ = std::move(h);
}

void control_channel::start() { read(); }

void control_channel::close() {
  boost::system::error_code ignored;
  sock_.close(ignored);
}

void control_channel::read() {
  sock_.async_wait(asio::posix::descriptor_base::wait_read,
                   [this, keep = owner_.lock()](boost::system::error_code ec) {
                     if (ec) return;
                     if (stream_) return on_readable_stream();
                     on_readable();
                   });
}

void control_channel::report_closed() {
  closed_ = true;
  if (h_.closed) h_.closed();
}

// Stream mode: whatever arrived is appended to `in_`, whole packets are taken off the front.
// A length out of range is a protocol violation by sandbox-init: reading stops there.
void control_channel::on_readable_stream() {
  char chunk[8192];
  for (;;) {
    ssize_t n = ::recv(sock_.native_handle(), chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    if (n <= 0) return report_closed();
    in_.append(chunk, static_cast<std::size_t>(n));
    while (in_.size() >= sizeof(std::uint32_t)) {
      std::uint32_t len;
      std::memcpy(&len, in_.data(), sizeof len);
      if (len < sizeof(ip::init_header) || len > ip::max_packet) {
        if (h_.malformed) h_.malformed();
        return;
      }
      if (in_.size() < sizeof len + len) break;
      ip::init_header h;
      std::memcpy(&h, in_.data() + sizeof len, sizeof h);
      std::string payload = in_.substr(sizeof len + sizeof h, len - sizeof h);
      in_.erase(0, sizeof len + len);
      std::vector<int> none;
      h_.message(h, payload, none);
      if (h_.stopped()) return;
    }
  }
  if (!h_.stopped()) read();
}

void control_channel::on_readable() {
  for (;;) {
    std::string buf(4096, '\0');
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{buf.data(), buf.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    ssize_t n = ::recvmsg(sock_.native_handle(), &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    std::vector<int> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          fds.push_back(fd);
        }
      }
    }
    if (n <= 0) {  // sandbox-init closed the channel: it is gone
      for (int fd : fds) ::close(fd);
      return report_closed();
    }
    if (static_cast<std::size_t>(n) < sizeof(ip::init_header)) {
      for (int fd : fds) ::close(fd);
      continue;
    }
    ip::init_header h;
    std::memcpy(&h, buf.data(), sizeof h);
    h_.message(h, std::string_view(buf.data() + sizeof h, static_cast<std::size_t>(n) - sizeof h),
               fds);
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  if (!h_.stopped()) read();
}

int control_channel::send_packet(std::string_view packet, std::span<const int> fds) {
  if (stream_) {
    // Length-prefixed, queued whole behind what is still unsent (a session's stdin chunks
    // follow `go` on the same stream), sent as the socket takes it.
    std::uint32_t len = static_cast<std::uint32_t>(packet.size());
    out_.append(reinterpret_cast<const char*>(&len), sizeof len);
    out_ += packet;
    return flush() ? 0 : -1;
  }
  iovec iov{const_cast<char*>(packet.data()), packet.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 2)];
  if (!fds.empty()) {
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(sock_.native_handle(), &m, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

void control_channel::send_frame(ip::msg type, std::uint32_t a, std::string_view payload) {
  ip::init_header h{type, a, 0};
  std::string packet(reinterpret_cast<const char*>(&h), sizeof h);
  packet.append(payload);
  (void)send_packet(packet);
}

bool control_channel::send_framed(std::string_view bytes) {
  out_ += bytes;
  return flush();
}

// Sends what the socket takes of `out_` now and waits for room for the rest. False when the
// channel failed (sandbox-init is gone).
bool control_channel::flush() {
  while (!out_.empty()) {
    ssize_t n =
        ::send(sock_.native_handle(), out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!out_waiting_) {
        out_waiting_ = true;
        sock_.async_wait(asio::posix::descriptor_base::wait_write,
                         [this, keep = owner_.lock()](boost::system::error_code ec) {
                           out_waiting_ = false;
                           if (!ec && !h_.stopped()) (void)flush();
                         });
      }
      return true;
    }
    if (n <= 0) {
      out_.clear();
      return false;
    }
    out_.erase(0, static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace sandbox::detail
