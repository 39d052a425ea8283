// The host's end of the egress tunnel (net_relay.hpp). Single strand; every handler checks
// `stopped_` and its connection's `dead` first, so a close in between is never raced.
#include "backends/microvm/net_relay.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "wire/guest_protocol.hpp"

namespace sandbox::detail {
namespace {

namespace asio = boost::asio;
namespace gp = guest_protocol;
namespace ip = init_protocol;
using asio::ip::tcp;

constexpr std::size_t header_size = sizeof(ip::init_header);
constexpr std::size_t max_frame = header_size + gp::net_chunk;

std::string net_frame(gp::net_msg type, std::uint32_t id, std::int64_t b,
                      std::string_view payload) {
  std::string f;
  ip::append_frame(f, static_cast<std::uint32_t>(type), id, b, payload);
  return f;
}

class relay final : public net_relay, public std::enable_shared_from_this<relay> {
 public:
  relay(asio::strand<asio::any_io_executor> strand, int port_fd, socket_factory make_socket,
        tcp::endpoint proxy, fault_sink on_fault)
      : strand_(strand),
        port_(strand, port_fd),
        make_socket_(std::move(make_socket)),
        proxy_(proxy),
        on_fault_(std::move(on_fault)) {}

  void begin() {
    asio::post(strand_, [self = shared_from_this()] { self->read_port(); });
  }

  void stop() override {
    asio::post(strand_, [self = shared_from_this()] { self->shutdown(); });
  }
  std::size_t peak_buffered() const noexcept override { return peak_.load(); }
  std::size_t connections() const noexcept override { return live_.load(); }
  bool stopped() const noexcept override { return stopped_flag_.load(); }

 private:
  struct conn {
    explicit conn(asio::strand<asio::any_io_executor> s) : sock(s) {}
    std::uint32_t id = 0;
    tcp::socket sock;
    bool connected = false, dead = false;
    // guest → proxy
    std::deque<std::string> to_sock;
    std::size_t to_sock_bytes = 0;  // received from the guest, not yet acknowledged
    bool writing = false, guest_eof = false, shut = false;
    // proxy → guest
    std::array<char, gp::net_chunk> rbuf{};
    std::size_t unacked = 0;  // sent to the guest, not yet acknowledged by it
    bool reading = false, sock_eof = false;
    std::uint64_t ack_pending = 0;  // written into the socket, not yet acknowledged
    bool ack_queued = false;
  };
  using conn_ptr = std::shared_ptr<conn>;

  // --- the port, guest → host --------------------------------------------------------

  void read_port() {
    if (stopped_ || reading_port_) return;
    if (backlog_ > max_backlog) return;  // resumed by write_port once the guest drained it
    reading_port_ = true;
    port_.async_read_some(asio::buffer(chunk_),
                          [self = shared_from_this()](boost::system::error_code ec, std::size_t n) {
                            self->reading_port_ = false;
                            if (self->stopped_) return;
                            if (ec) return self->shutdown();  // the VMM is gone
                            self->in_.append(self->chunk_.data(), n);
                            self->parse();
                            self->note_buffered();
                            self->read_port();
                          });
  }

  void parse() {
    std::size_t off = 0;
    while (!stopped_ && in_.size() - off >= sizeof(std::uint32_t)) {
      std::uint32_t len;
      std::memcpy(&len, in_.data() + off, sizeof len);
      if (len < header_size || len > max_frame) {
        return fault(fmt::format("net frame of {} bytes (at most {})", len, max_frame));
      }
      if (in_.size() - off < sizeof len + len) break;
      ip::init_header h;
      std::memcpy(&h, in_.data() + off + sizeof len, sizeof h);
      std::string_view payload(in_.data() + off + sizeof len + sizeof h, len - sizeof h);
      on_frame(h, payload);
      off += sizeof len + len;
    }
    in_.erase(0, off);
  }

  void on_frame(const ip::init_header& h, std::string_view payload) {
    const auto type = static_cast<gp::net_msg>(static_cast<std::uint32_t>(h.type));
    const std::uint32_t id = h.a;
    if (type == gp::net_msg::open) {
      if (h.b != 0 || !payload.empty()) return fault("net open with a payload");
      if (id == 0 || id <= last_id_) {
        return fault(fmt::format("net connection id {} reused or out of order", id));
      }
      if (conns_.size() >= gp::net_max_connections) {
        return fault(fmt::format("more than {} net connections at once", gp::net_max_connections));
      }
      last_id_ = id;
      return open_conn(id);
    }
    if (type != gp::net_msg::data && type != gp::net_msg::eof && type != gp::net_msg::close &&
        type != gp::net_msg::ack) {
      return fault(fmt::format("unknown net frame type {}", static_cast<std::uint32_t>(h.type)));
    }
    if (id == 0 || id > last_id_) return fault(fmt::format("net frame for unopened id {}", id));
    auto it = conns_.find(id);
    if (it == conns_.end()) return;  // closed here already: crossed our close
    conn_ptr c = it->second;
    switch (type) {
      case gp::net_msg::data:
        if (c->guest_eof) return fault("net data after eof");
        if (payload.empty()) return fault("empty net data");
        if (c->to_sock_bytes + payload.size() > gp::net_window)
          return fault("net data past the window");
        c->to_sock_bytes += payload.size();
        buffered_ += payload.size();
        c->to_sock.emplace_back(payload);
        return write_sock(c);
      case gp::net_msg::eof:
        if (!payload.empty() || h.b != 0) return fault("net eof with a payload");
        if (c->guest_eof) return fault("net eof twice");
        c->guest_eof = true;
        return write_sock(c);
      case gp::net_msg::close:
        if (!payload.empty() || h.b != 0) return fault("net close with a payload");
        return drop(c, false);
      case gp::net_msg::ack:
        if (!payload.empty()) return fault("net ack with a payload");
        if (h.b <= 0 || static_cast<std::uint64_t>(h.b) > c->unacked) {
          return fault("net ack beyond what was sent");
        }
        c->unacked -= static_cast<std::size_t>(h.b);
        return read_sock(c);
      default:
        return;
    }
  }

  // --- one connection ----------------------------------------------------------------

  void open_conn(std::uint32_t id) {
    auto c = std::make_shared<conn>(strand_);
    c->id = id;
    conns_.emplace(id, c);
    live_ = conns_.size();
    std::string why;
    int fd = make_socket_(&why);
    boost::system::error_code ec;
    if (fd >= 0) c->sock.assign(tcp::v4(), fd, ec);
    if (fd < 0 || ec) {
      if (fd >= 0 && ec) ::close(fd);
      return drop(c, true);
    }
    c->sock.async_connect(proxy_, [self = shared_from_this(), c](boost::system::error_code ec) {
      if (self->stopped_ || c->dead) return;
      if (ec) return self->drop(c, true);
      c->connected = true;
      self->write_sock(c);
      self->read_sock(c);
    });
  }

  void write_sock(const conn_ptr& c) {
    if (stopped_ || c->dead || !c->connected || c->writing) return;
    if (c->to_sock.empty()) {
      if (c->guest_eof && !c->shut) {
        c->shut = true;
        boost::system::error_code ignored;
        c->sock.shutdown(tcp::socket::shutdown_send, ignored);
        maybe_done(c);
      }
      return;
    }
    c->writing = true;
    asio::async_write(c->sock, asio::buffer(c->to_sock.front()),
                      [self = shared_from_this(), c](boost::system::error_code ec, std::size_t n) {
                        c->writing = false;
                        if (self->stopped_ || c->dead) return;
                        if (ec) return self->drop(c, true);
                        c->to_sock.pop_front();
                        c->to_sock_bytes -= n;
                        self->buffered_ -= n;
                        c->ack_pending += n;
                        if (!c->ack_queued) {
                          c->ack_queued = true;
                          self->ack_q_.push_back(c);
                        }
                        self->write_port();
                        self->write_sock(c);
                      });
  }

  void read_sock(const conn_ptr& c) {
    if (stopped_ || c->dead || !c->connected || c->reading || c->sock_eof) return;
    const std::size_t room = gp::net_window - c->unacked;
    if (room == 0) return;  // resumed by the guest's ack
    c->reading = true;
    c->sock.async_read_some(
        asio::buffer(c->rbuf.data(), std::min<std::size_t>(room, c->rbuf.size())),
        [self = shared_from_this(), c](boost::system::error_code ec, std::size_t n) {
          c->reading = false;
          if (self->stopped_ || c->dead) return;
          if (n > 0) {
            c->unacked += n;
            self->queue(
                net_frame(gp::net_msg::data, c->id, 0, std::string_view(c->rbuf.data(), n)));
          }
          if (ec == asio::error::eof) {
            c->sock_eof = true;
            self->queue(net_frame(gp::net_msg::eof, c->id, 0, {}));
            return self->maybe_done(c);
          }
          if (ec) return self->drop(c, true);
          self->read_sock(c);
        });
  }

  // Both directions ended and everything was written: the connection is over.
  void maybe_done(const conn_ptr& c) {
    if (c->sock_eof && c->shut && c->to_sock.empty() && !c->writing) drop(c, true);
  }

  // Forgets `c` (closing its socket); tells the guest when `tell`.
  void drop(const conn_ptr& c, bool tell) {
    if (c->dead) return;
    c->dead = true;
    buffered_ -= c->to_sock_bytes;
    c->to_sock.clear();
    c->to_sock_bytes = 0;
    boost::system::error_code ignored;
    c->sock.close(ignored);
    conns_.erase(c->id);
    live_ = conns_.size();
    if (tell) queue(net_frame(gp::net_msg::close, c->id, 0, {}));
  }

  // --- the port, host → guest --------------------------------------------------------

  void queue(std::string f) {
    backlog_ += f.size();
    out_q_.push_back(std::move(f));
    note_buffered();
    write_port();
  }

  void write_port() {
    if (stopped_ || writing_port_) return;
    std::string batch;
    for (auto& c : ack_q_) {
      c->ack_queued = false;
      if (c->dead || c->ack_pending == 0) continue;
      batch += net_frame(gp::net_msg::ack, c->id, static_cast<std::int64_t>(c->ack_pending), {});
      c->ack_pending = 0;
    }
    ack_q_.clear();
    while (!out_q_.empty() && batch.size() < max_backlog) {
      backlog_ -= out_q_.front().size();
      batch += out_q_.front();
      out_q_.pop_front();
    }
    if (batch.empty()) return;
    writing_port_ = true;
    in_flight_ = batch.size();
    auto buf = std::make_shared<std::string>(std::move(batch));
    asio::async_write(port_, asio::buffer(*buf),
                      [self = shared_from_this(), buf](boost::system::error_code ec, std::size_t) {
                        self->writing_port_ = false;
                        self->in_flight_ = 0;
                        if (self->stopped_) return;
                        if (ec) return self->shutdown();
                        self->write_port();
                        self->read_port();  // resumes a read paused by the backlog
                      });
  }

  void note_buffered() {
    const std::size_t now = buffered_ + backlog_ + in_flight_ + in_.size();
    if (now > peak_.load()) peak_ = now;
  }

  void fault(std::string why) {
    if (stopped_) return;
    auto sink = std::move(on_fault_);
    shutdown();
    if (sink) sink(std::move(why));
  }

  void shutdown() {
    if (stopped_) return;
    stopped_ = true;
    stopped_flag_ = true;
    on_fault_ = nullptr;
    boost::system::error_code ignored;
    port_.close(ignored);
    auto all = std::move(conns_);
    conns_.clear();
    for (auto& [id, c] : all) {
      c->dead = true;
      c->sock.close(ignored);
    }
    live_ = 0;
    out_q_.clear();
    ack_q_.clear();
    buffered_ = backlog_ = 0;
  }

  asio::strand<asio::any_io_executor> strand_;
  asio::posix::stream_descriptor port_;
  socket_factory make_socket_;
  tcp::endpoint proxy_;
  fault_sink on_fault_;
  bool stopped_ = false, reading_port_ = false, writing_port_ = false;
  std::array<char, 65536> chunk_{};
  std::string in_;
  std::uint32_t last_id_ = 0;
  std::unordered_map<std::uint32_t, conn_ptr> conns_;
  std::deque<std::string> out_q_;
  std::deque<conn_ptr> ack_q_;
  std::size_t buffered_ = 0, backlog_ = 0, in_flight_ = 0;
  std::atomic<std::size_t> peak_{0}, live_{0};
  std::atomic<bool> stopped_flag_{false};
};

}  // namespace

std::shared_ptr<net_relay> net_relay::start(asio::strand<asio::any_io_executor> strand, int port_fd,
                                            socket_factory make_socket, tcp::endpoint proxy,
                                            fault_sink on_fault) {
  auto r =
      std::make_shared<relay>(strand, port_fd, std::move(make_socket), proxy, std::move(on_fault));
  r->begin();
  return r;
}

int socket_in_netns(int ns_fd, std::string* why) {
  int fd = -1, err = 0;
  const char* step = "";
  std::thread([&] {
    if (::setns(ns_fd, CLONE_NEWNET) != 0) {
      err = errno;
      step = "setns";
      return;
    }
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      step = "socket";
    }
  }).join();
  if (fd < 0 && why != nullptr)
    *why = fmt::format("{} in the run's netns: {}", step, std::strerror(err));
  return fd;
}

}  // namespace sandbox::detail
