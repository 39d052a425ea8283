// The daemon itself (service/server.hpp).
#include "service/server.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "service/line_protocol.hpp"

namespace sandbox::service {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

/// How long a shutdown may take to cancel runs and write their answers before the daemon
/// stops anyway (the runtime's destructor then kills what is left, synchronously).
constexpr auto shutdown_grace = std::chrono::seconds(10);

}  // namespace

server::server(asio::io_context& io, service_context& ctx)
    : io_(io),
      ctx_(ctx),
      strand_(asio::make_strand(io)),
      acceptor_(strand_),
      signals_(strand_, SIGINT, SIGTERM, SIGHUP),
      retry_timer_(strand_),
      grace_timer_(strand_) {}

std::string server::listen(int fd) {
  error_code ec;
  acceptor_.assign(asio::local::stream_protocol(), fd, ec);
  if (ec) {
    ::close(fd);
    return "cannot watch the socket: " + ec.message();
  }
  return {};
}

void server::start(int stdio_in, int stdio_out) {
  stdio_ = stdio_in >= 0;
  wait_signal();
  if (stdio_) {
    auto c = std::make_shared<connection>(ctx_, io_, stdio_in, stdio_out, "stdio client",
                                          done_handler());
    conns_.insert(c);
    c->start();
  } else {
    wait_accept();
  }
}

void server::stop(std::string why) {
  asio::post(strand_, [this, why = std::move(why)] { on_stop(why); });
}

connection::done_handler server::done_handler() {
  return [this](std::shared_ptr<connection> c) { connection_done(std::move(c)); };
}

void server::connection_done(std::shared_ptr<connection> c) {
  asio::post(strand_, [this, c = std::move(c)] {
    conns_.erase(c);
    if ((stdio_ || stopping_) && conns_.empty()) finish();
  });
}

void server::wait_signal() {
  signals_.async_wait([this](const error_code& ec, int sig) {
    if (ec) return;
    if (stopping_) {
      ctx_.log(sandbox::log_level::warning,
               fmt::format("serve: signal {} again: stopping without waiting", sig));
      finish();
      return;
    }
    on_stop(fmt::format("signal {}", sig));
    wait_signal();  // a second signal stops at once
  });
}

void server::wait_accept() {
  acceptor_.async_wait(asio::socket_base::wait_read, [this](const error_code& ec) {
    if (ec || stopping_) return;
    accept_ready();
  });
}

void server::accept_ready() {
  for (;;) {
    int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // Out of descriptors or memory: try again later instead of spinning.
      ctx_.log(sandbox::log_level::warning,
               fmt::format("serve: accept4: {}; retrying in 200 ms", std::strerror(errno)));
      retry_timer_.expires_after(std::chrono::milliseconds(200));
      retry_timer_.async_wait([this](const error_code& ec) {
        if (!ec && !stopping_) wait_accept();
      });
      return;
    }
    adopt(fd);
  }
  wait_accept();
}

void server::adopt(int fd) {
  // The slot of a connection is free once it reported itself done (`connection_done`).
  if (conns_.size() >= ctx_.limits.max_connections) {
    std::string line = error_line(std::nullopt, "capacity", "too many connections");
    (void)::send(fd, line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(fd);
    ctx_.log(sandbox::log_level::warning, "serve: connection refused: too many connections");
    return;
  }
  std::string name = fmt::format("client {}", ++clients_);
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    name += fmt::format(" (pid {}, uid {})", cred.pid, cred.uid);
  }
  int out = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (out < 0) {
    ctx_.log(sandbox::log_level::warning,
             fmt::format("serve: fcntl(F_DUPFD_CLOEXEC): {}", std::strerror(errno)));
    ::close(fd);
    return;
  }
  try {
    auto c = std::make_shared<connection>(ctx_, io_, fd, out, name, done_handler());
    conns_.insert(c);
    ctx_.log(sandbox::log_level::info, "serve: " + name + " connected");
    c->start();
  } catch (const std::exception& e) {
    ctx_.log(sandbox::log_level::error, "serve: cannot serve " + name + ": " + e.what());
  }
}

void server::on_stop(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  ctx_.log(sandbox::log_level::warning,
           fmt::format("serve: stopping ({}); cancelling the runs of {} connection(s)", why,
                       conns_.size()));
  error_code ec;
  acceptor_.close(ec);
  retry_timer_.cancel();
  for (const auto& c : conns_) c->stop();
  if (conns_.empty()) {
    finish();
    return;
  }
  grace_timer_.expires_after(shutdown_grace);
  grace_timer_.async_wait([this](const error_code& e) {
    if (e) return;
    ctx_.log(sandbox::log_level::warning, "serve: shutdown grace period over; stopping now");
    finish();
  });
}

void server::finish() {
  if (finished_) return;
  finished_ = true;
  error_code ec;
  signals_.cancel(ec);
  grace_timer_.cancel();
  retry_timer_.cancel();
  acceptor_.close(ec);
  io_.stop();
}

}  // namespace sandbox::service
