// The daemon itself (private to the service room): the listening socket (or the one stdio
// connection), the signals, the set of connections and its cap, and the shutdown sequence.
// All of it lives on the server's own strand.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "service/connection.hpp"
#include "service/context.hpp"

namespace sandbox::service {

/// Accepts clients, holds their connections, and stops the daemon: on SIGINT, SIGTERM or
/// SIGHUP (or `stop`) it stops accepting, stops every connection (runs cancelled, sessions
/// closed, answers written) and stops the io_context once they are done or a grace period
/// has passed; a second signal stops at once. In stdio mode, the end of its one connection
/// stops it too.
class server {
 public:
  /// `ctx` outlives the server; so does `io`, which the server stops when it is done.
  server(boost::asio::io_context& io, service_context& ctx);
  server(const server&) = delete;
  server& operator=(const server&) = delete;

  /// Watches `fd`, a bound and listening unix socket (taken over: closed on failure too).
  /// Empty on success, else why not.
  std::string listen(int fd);
  /// Starts serving: signals, then accepting (socket mode) or the stdio connection on the
  /// pipes `stdio_in` / `stdio_out` (taken over). May throw (the stdio connection cannot
  /// be made).
  void start(int stdio_in = -1, int stdio_out = -1);
  /// Stops the daemon (thread-safe).
  void stop(std::string why);

 private:
  void wait_signal();
  void wait_accept();
  void accept_ready();
  /// Makes `fd` (an accepted client) a connection, or refuses it `capacity` past
  /// `max_connections`.
  void adopt(int fd);
  /// A connection is done (closed, nothing in flight): its slot is free. Thread-safe.
  void connection_done(std::shared_ptr<connection> c);
  connection::done_handler done_handler();
  void on_stop(const std::string& why);
  void finish();

  boost::asio::io_context& io_;
  service_context& ctx_;
  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer retry_timer_;
  boost::asio::steady_timer grace_timer_;
  std::set<std::shared_ptr<connection>> conns_;
  std::uint64_t clients_ = 0;
  bool stdio_ = false;
  bool stopping_ = false;
  bool finished_ = false;
};

}  // namespace sandbox::service
